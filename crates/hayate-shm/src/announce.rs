//! Handing a segment to a reader: its descriptor goes over a Unix socket (`SCM_RIGHTS`),
//! with a short message (what the segment is: a stream name, the ring's geometry...) that is
//! the caller's business. Blocking calls on a connected `std` Unix stream; the transport will
//! make them on its own sockets.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::segment::{Segment, SegmentError};

/// The longest message that travels with a segment.
pub const MAX_ANNOUNCE: usize = 4096;

/// Sends `segment`'s descriptor and `message` (at most [`MAX_ANNOUNCE`] bytes) in one
/// datagram-like write: the receiver gets both or neither.
pub fn send(sock: &UnixStream, segment: &Segment, message: &[u8]) -> io::Result<()> {
    send_fds(sock, &[segment.fd()], message)
}

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Sends `fds` (0 to [`MAX_FDS`]) and `message` (1 to [`MAX_ANNOUNCE`] bytes) in one write.
pub fn send_fds(sock: &impl AsFd, fds: &[BorrowedFd<'_>], message: &[u8]) -> io::Result<()> {
    if message.is_empty() || message.len() > MAX_ANNOUNCE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an announcement is 1 to 4096 bytes",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an announcement carries at most 4 descriptors",
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("no room for the descriptors"));
    }
    let mut len = [0u8; 2];
    len.copy_from_slice(&(message.len() as u16).to_le_bytes());
    let iov = [IoSlice::new(&len), IoSlice::new(message)];
    let n = rustix::net::sendmsg(sock.as_fd(), &iov, &mut control, SendFlags::NOSIGNAL)?;
    if n != 2 + message.len() {
        // A stream socket took part of it: the announcement is broken; so is the socket.
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "announcement cut short",
        ));
    }
    Ok(())
}

/// Why an announcement could not be received.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// Reading the socket failed, or it closed.
    #[error("announcement: {0}")]
    Io(#[from] io::Error),
    /// Not as many descriptors came with the message as expected.
    #[error("announcement: unexpected number of descriptors ({0})")]
    Descriptors(usize),
    /// The message's length prefix is out of range or the message is cut short.
    #[error("announcement: malformed message")]
    Malformed,
    /// The descriptor is not a usable segment.
    #[error(transparent)]
    Segment(#[from] SegmentError),
}

/// Receives one announcement: the segment (mapped, after its checks) and its message.
pub fn receive(sock: &UnixStream) -> Result<(Segment, Vec<u8>), ReceiveError> {
    let (mut fds, message) = receive_fds(sock, 1)?;
    let fd = fds.pop().ok_or(ReceiveError::Descriptors(0))?;
    Ok((Segment::open(fd)?, message))
}

/// Receives one message with exactly `want` descriptors (1 to [`MAX_FDS`]; extra ones are
/// received and closed, not left queued).
pub fn receive_fds(
    sock: &UnixStream,
    want: usize,
) -> Result<(Vec<OwnedFd>, Vec<u8>), ReceiveError> {
    let (fds, message) = receive_any(sock)?;
    if fds.len() != want {
        return Err(ReceiveError::Descriptors(fds.len()));
    }
    Ok((fds, message))
}

/// Receives one message with the descriptors it carries (at most [`MAX_FDS`]; more is an
/// error, and they are closed).
pub fn receive_any(sock: &impl AsFd) -> Result<(Vec<OwnedFd>, Vec<u8>), ReceiveError> {
    let mut buf = vec![0u8; 2 + MAX_ANNOUNCE];
    // Room for more descriptors than any message carries, so that extra ones are received
    // (and closed) rather than left in the kernel's queue.
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2 * MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        rustix::net::recvmsg(
            sock.as_fd(),
            &mut iov,
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    if got.bytes == 0 && fds.is_empty() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    if fds.len() > MAX_FDS {
        return Err(ReceiveError::Descriptors(fds.len()));
    }
    if got.bytes < 2 {
        return Err(ReceiveError::Malformed);
    }
    let len = usize::from(u16::from_le_bytes([buf[0], buf[1]]));
    if len == 0 || len > MAX_ANNOUNCE || got.bytes != 2 + len {
        return Err(ReceiveError::Malformed);
    }
    buf.truncate(2 + len);
    buf.drain(..2);
    Ok((fds, buf))
}

/// Whether the process at the other end of `sock` runs as this process's user (a segment is
/// only exchanged between processes of one user).
pub fn same_user(sock: &UnixStream) -> io::Result<bool> {
    let cred = rustix::net::sockopt::socket_peercred(sock.as_fd())?;
    Ok(cred.uid == rustix::process::getuid())
}

/// The process at the other end of a Unix socket, watched through a pidfd (Linux 5.3):
/// whether it has exited, whatever its pid becomes later (a pid is reused, a pidfd names one
/// process). The pid is the one `SO_PEERCRED` gives, of the process that connected: had it
/// exited and its pid been taken again in the moment before this looks, the watch would
/// follow the other process (holding longer what waits for the exit, never shorter).
#[derive(Debug)]
pub struct PeerProcess(OwnedFd);

impl PeerProcess {
    /// Watches the process at the other end of `sock`.
    pub fn of(sock: &UnixStream) -> io::Result<PeerProcess> {
        let cred = rustix::net::sockopt::socket_peercred(sock.as_fd())?;
        let fd = rustix::process::pidfd_open(cred.pid, rustix::process::PidfdFlags::empty())?;
        Ok(PeerProcess(fd))
    }

    /// Watches the process `pid` (one the caller started, or itself: for tests).
    pub fn pid(pid: u32) -> io::Result<PeerProcess> {
        let pid = rustix::process::Pid::from_raw(pid as i32)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0"))?;
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
        Ok(PeerProcess(fd))
    }

    /// Whether the process has exited (its pidfd is readable); without waiting.
    pub fn exited(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.0,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;

    #[test]
    fn a_watched_process_is_seen_exit() {
        assert!(!PeerProcess::pid(std::process::id()).unwrap().exited());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let watch = PeerProcess::pid(child.id()).unwrap();
        assert!(!watch.exited());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(watch.exited());
        // The other end of a socket pair is this process.
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(!PeerProcess::of(&a).unwrap().exited());
    }
}
