//! Handing a segment to a reader: its descriptor goes over a Unix socket (`SCM_RIGHTS`),
//! with a short message (what the segment is: a stream name, the ring's geometry...) that is
//! the caller's business. Blocking calls on a connected `std` Unix stream; the transport will
//! make them on its own sockets.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
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
    if message.is_empty() || message.len() > MAX_ANNOUNCE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an announcement is 1 to 4096 bytes",
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [segment.fd()];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("no room for the descriptor"));
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
    /// No descriptor came with the message, or more than one.
    #[error("announcement: expected one descriptor, got {0}")]
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
    let mut buf = vec![0u8; 2 + MAX_ANNOUNCE];
    // Room for a few descriptors, so that extra ones are received (and closed) rather than
    // left in the kernel's queue.
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
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
    if fds.len() != 1 {
        return Err(ReceiveError::Descriptors(fds.len()));
    }
    if got.bytes < 2 {
        return Err(ReceiveError::Malformed);
    }
    let len = usize::from(u16::from_le_bytes([buf[0], buf[1]]));
    if len == 0 || len > MAX_ANNOUNCE || got.bytes != 2 + len {
        return Err(ReceiveError::Malformed);
    }
    let fd = fds.pop().ok_or(ReceiveError::Descriptors(0))?;
    let segment = Segment::open(fd)?;
    buf.truncate(2 + len);
    buf.drain(..2);
    Ok((segment, buf))
}
