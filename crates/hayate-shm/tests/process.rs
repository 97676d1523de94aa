//! Across processes: a reader process gets the segment's descriptor over a Unix socket
//! (`SCM_RIGHTS`), maps it and reads what the writer publishes; a reader killed with SIGKILL
//! disturbs neither the writer nor the other readers. The reader is this test binary run
//! again with `HAYATE_SHM_CHILD` set (the `child` test does nothing otherwise).

#![cfg(not(loom))]
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hayate_shm::segment::Segment;
use hayate_shm::{Reader, Ring, Writer, announce, region_words};

const N: u64 = 500;

fn payload(i: u64) -> Vec<u8> {
    format!("message {i} {}", i * 7919).into_bytes()
}

/// The reader process: attach, say "ready", read N messages, print how many matched.
#[test]
fn child() {
    let Ok(path) = std::env::var("HAYATE_SHM_CHILD") else {
        return;
    };
    let mut sock = UnixStream::connect(path).unwrap();
    let (seg, msg) = announce::receive(&sock).unwrap();
    assert_eq!(msg, b"ring 64 x 64");
    let mut r = Reader::new(Ring::attach(seg.words()).unwrap());
    sock.write_all(b"R").unwrap();
    if std::env::var("HAYATE_SHM_CHILD_HANG").is_ok() {
        std::thread::sleep(Duration::from_secs(60));
    }
    let (mut ok, mut lost) = (0u64, 0u64);
    let mut out = Vec::new();
    let until = Instant::now() + Duration::from_secs(20);
    while ok + lost < N && Instant::now() < until {
        match r.read(&mut out) {
            Ok(Some(i)) => {
                assert_eq!(out, payload(i));
                ok += 1;
            }
            Ok(None) => std::thread::yield_now(),
            Err(hayate_shm::ReadError::Lost(k)) => lost += k,
            Err(e) => panic!("{e}"),
        }
    }
    println!("RESULT ok={ok} lost={lost}");
}

fn spawn_child(path: &std::path::Path, hang: bool) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("HAYATE_SHM_CHILD", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if hang {
        c.env("HAYATE_SHM_CHILD_HANG", "1");
    }
    c.spawn().unwrap()
}

#[test]
fn reader_processes_share_the_writers_segment_and_a_killed_one_harms_nobody() {
    let dir = std::env::temp_dir().join(format!("hayate-shm-proc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sock");
    let listener = UnixListener::bind(&path).unwrap();

    let seg = Segment::create("hayate-test-proc", region_words(64, 64) * 8).unwrap();
    let ring = Ring::init(seg.words(), 64, 64).unwrap();
    let mut w = Writer::new(ring);

    // Two readers that read, one that attaches and then hangs until it is killed.
    let mut children = vec![
        spawn_child(&path, false),
        spawn_child(&path, false),
        spawn_child(&path, true),
    ];
    let mut socks = Vec::new();
    for _ in 0..children.len() {
        let (mut s, _) = listener.accept().unwrap();
        announce::send(&s, &seg, b"ring 64 x 64").unwrap();
        let mut ready = [0u8; 1];
        s.read_exact(&mut ready).unwrap();
        socks.push(s);
    }
    let hanging = children.pop().unwrap();
    let mut hanging = hanging;
    hanging.kill().unwrap();
    hanging.wait().unwrap();

    // Publish at a pace the readers keep up with (64 slots).
    for i in 0..N {
        w.publish(&payload(i)).unwrap();
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // (The harness prints "test child ... " on the same line.)
        let at = text
            .find("RESULT ok=")
            .unwrap_or_else(|| panic!("no result from a reader: {text}"));
        let line = text[at..].lines().next().unwrap_or_default();
        // Every message read or reported lost, none torn (the child asserts the bytes).
        let ok: u64 = line["RESULT ok=".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(ok > 0, "{line}");
        assert!(line.ends_with(&format!("lost={}", N - ok)), "{line}");
        assert!(out.status.success());
    }
    drop(socks);
    let _ = std::fs::remove_dir_all(&dir);
}
