//! Wake-ups between processes: an eventfd, handed to the other side over the Unix socket
//! with the segment. A reader that finds its ring empty flags itself asleep in the ring
//! ([`crate::Reader::prepare_sleep`]) and waits for its doorbell; the writer rings the
//! doorbells of the sleepers after it publishes ([`crate::Writer::sleepers`]). The same the
//! other way for a writer that waits for a reliable reader.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{EventfdFlags, eventfd};

/// An eventfd, non-blocking.
#[derive(Debug)]
pub struct Doorbell(OwnedFd);

impl Doorbell {
    /// A new doorbell.
    pub fn new() -> io::Result<Doorbell> {
        Ok(Doorbell(eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?))
    }

    /// A doorbell another process sent: checked to be an eventfd (reading a counter of 8
    /// bytes), and made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if path.to_str() != Some("anon_inode:[eventfd]") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("not an eventfd: {}", path.display()),
            ));
        }
        rustix::io::ioctl_fionbio(&fd, true)?;
        Ok(Doorbell(fd))
    }

    /// Rings: the other side's next wait returns at once.
    pub fn ring(&self) {
        // Fails only when the counter would overflow (it is far from it: every wait drains
        // it), or with EAGAIN for the same reason: either way the other side is awake.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Takes the rings so far; `true` if there were any.
    pub fn drain(&self) -> bool {
        let mut b = [0u8; 8];
        matches!(rustix::io::read(&self.0, &mut b), Ok(8))
    }
}

impl From<Doorbell> for OwnedFd {
    fn from(d: Doorbell) -> OwnedFd {
        d.0
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
