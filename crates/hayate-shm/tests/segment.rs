//! Segments: a ring written through one mapping is read through another of the same memfd
//! (what a reader process gets from the descriptor it is sent); a memfd that could still be
//! resized is refused; nothing is left behind once the segment is gone.

#![cfg(not(loom))]
#![allow(clippy::unwrap_used)]

use std::os::fd::AsFd;

use hayate_shm::segment::{Segment, SegmentError};
use hayate_shm::{Reader, Ring, Writer, region_words};

fn memfds_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.to_string_lossy().contains(&format!("memfd:{name}")))
        .count()
}

#[test]
fn two_mappings_of_one_segment_share_the_ring() {
    let words = region_words(16, 256);
    let seg = Segment::create("hayate-test-ring", words * 8).unwrap();
    let ring = Ring::init(seg.words(), 16, 256).unwrap();
    let mut w = Writer::new(ring);
    // The reader's side: its own mapping, from a copy of the descriptor.
    let theirs = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
    let mut r = Reader::new(Ring::attach(theirs.words()).unwrap());
    let mut out = Vec::new();
    for i in 0..40u32 {
        let p = format!("message {i}").into_bytes();
        w.publish(&p).unwrap();
        assert_eq!(r.read(&mut out), Ok(Some(u64::from(i))));
        assert_eq!(out, p);
    }
}

#[test]
fn an_unsealed_memfd_is_refused() {
    let fd =
        rustix::fs::memfd_create("hayate-test-unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    assert!(matches!(Segment::open(fd), Err(SegmentError::NotSealed)));
    // Sealed, but empty.
    let fd = rustix::fs::memfd_create(
        "hayate-test-empty",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    rustix::fs::fcntl_add_seals(
        &fd,
        rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW | rustix::fs::SealFlags::SEAL,
    )
    .unwrap();
    assert!(matches!(Segment::open(fd), Err(SegmentError::Size(0))));
    // A sealed segment cannot be shrunk under its readers.
    let seg = Segment::create("hayate-test-sealed", 4096).unwrap();
    assert!(rustix::fs::ftruncate(seg.fd().as_fd(), 8).is_err());
}

#[test]
fn nothing_is_left_behind() {
    let name = format!("hayate-test-gone-{}", std::process::id());
    let seg = Segment::create(&name, 1 << 16).unwrap();
    let other = Segment::open(seg.fd().try_clone_to_owned().unwrap()).unwrap();
    assert_eq!(memfds_named(&name), 2);
    drop(seg);
    drop(other);
    assert_eq!(memfds_named(&name), 0);
    // Not a file anywhere: nothing in /dev/shm to clean up after a crash.
    let in_dev_shm = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().contains(&name))
        })
        .unwrap_or(false);
    assert!(!in_dev_shm);
}

#[test]
fn announcements_carry_one_segment_and_refuse_anything_else() {
    use hayate_shm::announce::{ReceiveError, receive, send};
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let (a, b) = UnixStream::pair().unwrap();
    let seg = Segment::create("hayate-test-announce", 4096).unwrap();
    send(&a, &seg, b"hello").unwrap();
    let (got, msg) = receive(&b).unwrap();
    assert_eq!(msg, b"hello");
    assert_eq!(got.words().len(), 512);
    // Bytes without a descriptor.
    (&a).write_all(&[5, 0, b'h', b'e', b'l', b'l', b'o'])
        .unwrap();
    assert!(matches!(receive(&b), Err(ReceiveError::Descriptors(0))));
    // A length prefix that does not match.
    send(&a, &seg, b"x").unwrap();
    let (c, d) = UnixStream::pair().unwrap();
    drop(c);
    assert!(matches!(receive(&d), Err(ReceiveError::Io(_))));
    assert!(receive(&b).is_ok());
    // Empty or oversized messages are not sent.
    assert!(send(&a, &seg, b"").is_err());
    assert!(send(&a, &seg, &[0; 5000]).is_err());
}
