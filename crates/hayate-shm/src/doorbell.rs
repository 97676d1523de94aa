//! Wake-ups between processes: a pair of connected Unix datagram sockets. The waiting side
//! makes the pair ([`Doorbell::new`]), waits on one end and hands the other
//! ([`Doorbell::ringer`]) to the other side over the Unix socket with the segment; the other
//! side rings it ([`Doorbell::from_fd`], [`Doorbell::ring`]). A reader that finds its ring
//! empty flags itself asleep in the ring ([`crate::Reader::prepare_sleep`]) and waits for its
//! doorbell; the writer rings the doorbells of the sleepers after it publishes
//! ([`crate::Writer::sleepers`]). The same the other way for a writer that waits for a
//! reliable reader.
//!
//! Why sockets and not an eventfd (or a pipe): the other process holds the same open file,
//! so it can clear `O_NONBLOCK` on it, and an eventfd it filled to its maximum (or emptied
//! under us) would then block our `write` (or `read`) for good, on a thread of the runtime.
//! A socket takes `MSG_DONTWAIT` with each call: whatever the other side does to the file,
//! ringing and draining never block. A full socket buffer means the other side has unread
//! rings already: it is awake, and the ring is dropped.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType, recv, send, socketpair,
};

/// One end of a doorbell: the waiting end with the ringing end still here to hand over
/// ([`Doorbell::new`]), or a ringing end received ([`Doorbell::from_fd`]).
#[derive(Debug)]
pub struct Doorbell {
    /// The waiting end (what [`AsFd`] gives, for the reactor), or the ringing end received.
    fd: OwnedFd,
    /// The ringing end, to hand to the other side (a doorbell made here).
    ringer: Option<OwnedFd>,
}

impl Doorbell {
    /// A new doorbell: this side waits on it; [`Doorbell::ringer`] goes to the side that
    /// rings it.
    pub fn new() -> io::Result<Doorbell> {
        let (a, b) = socketpair(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        Ok(Doorbell {
            fd: a,
            ringer: Some(b),
        })
    }

    /// The ringing end of a doorbell another process sent: checked to be a Unix datagram
    /// socket (so a ring is one small datagram to the process that made it, never bytes on
    /// some other kind of file).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Doorbell> {
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let ty = rustix::net::sockopt::socket_type(&fd)
            .map_err(|e| bad(format!("a doorbell is not a socket: {e}")))?;
        let domain = rustix::net::sockopt::socket_domain(&fd)
            .map_err(|e| bad(format!("a doorbell is not a socket: {e}")))?;
        if ty != SocketType::DGRAM || domain != AddressFamily::UNIX {
            return Err(bad(format!(
                "a doorbell is a {ty:?} socket of family {domain:?}, not a Unix datagram socket"
            )));
        }
        Ok(Doorbell { fd, ringer: None })
    }

    /// The end to hand to the side that rings (a doorbell made here), else this one.
    pub fn ringer(&self) -> BorrowedFd<'_> {
        self.ringer.as_ref().unwrap_or(&self.fd).as_fd()
    }

    /// Rings: the waiting side's next wait returns at once. Never blocks.
    pub fn ring(&self) {
        // Fails with EAGAIN when the waiting side has rings it has not taken yet (it is
        // awake), or when it is gone: either way there is nobody to wake.
        let _ = send(
            self.ringer(),
            &[1u8],
            SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
        );
    }

    /// Takes the rings so far (the waiting end); `true` if there were any. Never blocks,
    /// and stops after a bounded number (a side that rings without pause gets the rest on
    /// the next wait).
    pub fn drain(&self) -> bool {
        let mut b = [0u8; 64];
        let mut any = false;
        for _ in 0..64 {
            match recv(&self.fd, &mut b, RecvFlags::DONTWAIT) {
                Ok(_) => any = true,
                Err(_) => break,
            }
        }
        any
    }
}

impl From<Doorbell> for OwnedFd {
    /// The waiting end (or the ringing end of one received).
    fn from(d: Doorbell) -> OwnedFd {
        d.fd
    }
}

impl AsFd for Doorbell {
    /// The waiting end (or the ringing end of one received).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_reach_the_waiting_end_and_never_block() {
        let d = Doorbell::new().unwrap();
        let r = Doorbell::from_fd(d.ringer().try_clone_to_owned().unwrap()).unwrap();
        assert!(!d.drain());
        r.ring();
        assert!(d.drain());
        assert!(!d.drain());
        // Thousands of rings nobody takes: the buffer fills and rings are dropped, without
        // blocking, even with the file made blocking (as a hostile peer could).
        rustix::io::ioctl_fionbio(r.ringer(), false).unwrap();
        rustix::io::ioctl_fionbio(&d, false).unwrap();
        for _ in 0..100_000 {
            r.ring();
        }
        assert!(d.drain());
        let mut n = 0;
        while d.drain() {
            n += 1;
        }
        assert!(n > 0);
        assert!(!d.drain());
        // Ringing a doorbell made here wakes its own waiting end.
        d.ring();
        assert!(d.drain());
    }

    #[test]
    fn only_unix_datagram_sockets_are_doorbells() {
        let (a, _b) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        assert!(Doorbell::from_fd(a).is_err());
        let e = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert!(Doorbell::from_fd(e).is_err());
    }
}
