//! The transports' tests, on the in-memory transport.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::*;

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count::default());
    (c.clone(), Waker::from(c))
}

fn woken(c: &Count) -> usize {
    c.0.load(Ordering::SeqCst)
}

fn would_block(r: io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

#[tokio::test]
async fn memory_carries_bytes_both_ways() {
    let ((mut r, w), mut peer) = memory(64);
    assert_eq!(w.name(), "memory");
    write_all(&*w, Bytes::from_static(b"to the peer"))
        .await
        .unwrap();
    assert_eq!(peer.buffered(), 11);
    let mut got = [0u8; 11];
    peer.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"to the peer");
    assert_eq!(peer.buffered(), 0);

    peer.write_all(b"to the server").await.unwrap();
    let mut buf = BytesMut::new();
    while buf.len() < 13 {
        assert!(read_some(&mut r, &mut buf, None, None).await.unwrap() > 0);
    }
    assert_eq!(&buf[..], b"to the server");
}

#[test]
fn memory_write_blocks_when_full_and_wakes_when_the_peer_reads() {
    let ((_r, w), mut peer) = memory(8);
    // Partial across slices: the first fits, the second only in part.
    let n = w
        .try_write_vectored(&[IoSlice::new(b"abcde"), IoSlice::new(b"fghij")])
        .unwrap();
    assert_eq!(n, 8);
    assert!(would_block(w.try_write_vectored(&[IoSlice::new(b"ij")])));

    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert!(w.poll_write_ready(&mut cx).is_pending());
    assert!(w.poll_write_ready(&mut cx).is_pending());
    assert_eq!(woken(&count), 0);

    // The peer reads 3 bytes: room for 3, and the writer is woken once.
    let mut three = [0u8; 3];
    let mut rb = tokio::io::ReadBuf::new(&mut three);
    assert!(matches!(
        Pin::new(&mut peer).poll_read(&mut cx, &mut rb),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(rb.filled(), b"abc");
    assert_eq!(woken(&count), 1);
    assert!(matches!(w.poll_write_ready(&mut cx), Poll::Ready(Ok(()))));
    assert_eq!(w.try_write_vectored(&[IoSlice::new(b"ijkl")]).unwrap(), 3);
    assert!(would_block(w.try_write_vectored(&[IoSlice::new(b"l")])));

    // Everything arrives in order.
    let mut rest = [0u8; 16];
    let mut rb = tokio::io::ReadBuf::new(&mut rest);
    assert!(Pin::new(&mut peer).poll_read(&mut cx, &mut rb).is_ready());
    assert_eq!(rb.filled(), b"defghijk");
    // Empty now: the peer waits, and a write wakes it.
    let mut rb = tokio::io::ReadBuf::new(&mut rest);
    let (rcount, rwaker) = counting();
    let mut rcx = Context::from_waker(&rwaker);
    assert!(
        Pin::new(&mut peer)
            .poll_read(&mut rcx, &mut rb)
            .is_pending()
    );
    assert_eq!(w.try_write_vectored(&[IoSlice::new(b"l")]).unwrap(), 1);
    assert_eq!(woken(&rcount), 1);
}

#[tokio::test]
async fn memory_shutdown_is_the_end_of_the_stream_after_what_was_written() {
    let ((_r, w), mut peer) = memory(16);
    write_all(&*w, Bytes::from_static(b"last words"))
        .await
        .unwrap();
    assert!(!peer.is_shut_down());
    w.shutdown();
    assert!(peer.is_shut_down());
    let mut got = Vec::new();
    peer.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last words");
    // Writing after shutdown fails, as on a socket.
    let e = w.try_write_vectored(&[IoSlice::new(b"x")]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
}

#[tokio::test]
async fn memory_dropped_writer_wakes_a_waiting_peer_with_the_end_of_the_stream() {
    let ((_r, w), mut peer) = memory(16);
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let mut b = [0u8; 4];
    let mut rb = tokio::io::ReadBuf::new(&mut b);
    assert!(Pin::new(&mut peer).poll_read(&mut cx, &mut rb).is_pending());
    drop(w);
    assert_eq!(woken(&count), 1);
    assert_eq!(peer.read(&mut b).await.unwrap(), 0);
}

#[test]
fn memory_peer_gone_wakes_the_writer_and_breaks_the_pipe() {
    let ((_r, w), peer) = memory(4);
    assert_eq!(w.try_write_vectored(&[IoSlice::new(b"full")]).unwrap(), 4);
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    assert!(w.poll_write_ready(&mut cx).is_pending());
    drop(peer);
    assert_eq!(woken(&count), 1);
    assert!(w.poll_write_ready(&mut cx).is_ready());
    let e = w.try_write_vectored(&[IoSlice::new(b"x")]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    let mut q = VecDeque::from([Bytes::from_static(b"x")]);
    assert!(write_some(&*w, &mut q).is_err());
}

#[tokio::test]
async fn memory_peer_writes_wait_for_the_session_to_read() {
    let ((mut r, _w), mut peer) = memory(4);
    let (count, waker) = counting();
    let mut cx = Context::from_waker(&waker);
    let p = Pin::new(&mut peer);
    assert!(matches!(
        p.poll_write(&mut cx, b"abcdef"),
        Poll::Ready(Ok(4))
    ));
    assert!(Pin::new(&mut peer).poll_write(&mut cx, b"ef").is_pending());
    let mut buf = BytesMut::new();
    assert_eq!(read_some(&mut r, &mut buf, Some(2), None).await.unwrap(), 2);
    assert_eq!(woken(&count), 1);
    assert!(matches!(
        Pin::new(&mut peer).poll_write(&mut cx, b"ef"),
        Poll::Ready(Ok(2))
    ));
    // The peer's shutdown is the session's end of stream, after the buffered bytes.
    peer.shutdown().await.unwrap();
    while read_some(&mut r, &mut buf, None, None).await.unwrap() > 0 {}
    assert_eq!(&buf[..], b"abcdef");
}

#[tokio::test]
async fn write_chunks_moves_a_large_payload_through_a_small_buffer() {
    let ((_r, w), mut peer) = memory(7);
    let chunks: VecDeque<Bytes> = (0..50u8)
        .map(|i| Bytes::from(vec![i; 200 + usize::from(i)]))
        .collect();
    let want: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let writer = tokio::spawn({
        let w = w.clone();
        let mut q = chunks;
        async move {
            write_chunks(&*w, &mut q).await.unwrap();
            w.shutdown();
        }
    });
    drop(w);
    let mut got = Vec::new();
    peer.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "bytes arrive whole and in order");
}
