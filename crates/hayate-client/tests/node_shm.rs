//! Peer mode over shared memory (nodes on one host): one copy of each message in the
//! publisher's ring for any number of local nodes, messages larger than a slot, a reader
//! process killed with SIGKILL (the writer carries on, nothing is left mapped), and a ring
//! that a hostile process corrupts (an error, not a crash). The killed reader is this test
//! binary run again with `HAYATE_NODE_CHILD` set (the `child` test does nothing otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use hayate_client::peer::{Node, NodeOptions, ShmMode, ShmOptions};
use hayate_client::{Qos, SubscribeOptions, Subscription};

use hayate_shm::doorbell::Doorbell;
use hayate_shm::segment::Segment;
use hayate_shm::{SharedRing, SharedWriter, announce};

mod common;
use common::{WAIT, key, take, within};

fn opts(peers: &[&Node]) -> NodeOptions {
    NodeOptions {
        peers: peers.iter().map(|p| p.local_addr().to_string()).collect(),
        shm: ShmOptions {
            mode: ShmMode::Require,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_copy_in_the_ring_reaches_every_local_node() {
    // Small slots: a 200 KiB message takes several.
    let a = Node::start(NodeOptions {
        shm: ShmOptions {
            mode: ShmMode::Require,
            slots: 64,
            slot_bytes: 16 * 1024,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    })
    .await
    .unwrap();
    let mut readers = Vec::new();
    for _ in 0..3 {
        let n = Node::start(opts(&[&a])).await.unwrap();
        within(n.wait_peers(1, WAIT)).await.unwrap();
        readers.push(n);
    }
    within(a.wait_peers(3, WAIT)).await.unwrap();
    let mut subs = Vec::new();
    let mut group = Vec::new();
    for n in &readers {
        subs.push(n.subscribe("s/*").await.unwrap());
        group.push(n.queue_subscribe("s/*", "workers").await.unwrap());
    }
    let count = 500u32;
    let big: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
    within(async {
        for i in 0..count {
            a.publish(&key("s/x"), i.to_be_bytes().to_vec())
                .await
                .unwrap();
        }
        a.publish(&key("s/big"), big.clone()).await.unwrap();
    })
    .await;
    let want: Vec<Vec<u8>> = (0..count).map(|i| i.to_be_bytes().to_vec()).collect();
    for s in &mut subs {
        let got = take(s, count as usize + 1).await;
        assert_eq!(got[..count as usize], want[..], "in order, every one");
        assert_eq!(got[count as usize], big, "the large message, whole");
    }
    // The queue group: each message to exactly one member, among the three nodes.
    let mut per_member = Vec::new();
    let mut all = Vec::new();
    for g in &mut group {
        let mut got = Vec::new();
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), g.next()).await {
            got.push(m.payload.to_vec());
        }
        per_member.push(got.len());
        all.extend(got);
    }
    assert_eq!(all.len(), count as usize + 1, "per member {per_member:?}");
    assert!(per_member.iter().all(|n| *n > 0), "{per_member:?}");
    // One copy in the ring per message, whatever the number of nodes reading it.
    assert_eq!(
        a.stats().shm_sent.load(Ordering::Relaxed),
        u64::from(count) + 1
    );
    for n in &readers {
        assert_eq!(
            n.stats().shm_received.load(Ordering::Relaxed),
            u64::from(count) + 1
        );
    }
}

/// The node process killed in the test below: links to the node at `HAYATE_NODE_CHILD`,
/// subscribes to `k/*` with room for one batch, never reads, says `READY <id>` and waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    let Ok(addr) = std::env::var("HAYATE_NODE_CHILD") else {
        return;
    };
    let n = Node::start(NodeOptions {
        peers: vec![addr],
        subscription_capacity: 1,
        max_block: Duration::from_secs(600),
        shm: ShmOptions {
            mode: ShmMode::Require,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    })
    .await
    .unwrap();
    n.wait_peers(1, WAIT).await.unwrap();
    let _sub = n.subscribe("k/*").await.unwrap();
    println!("READY {:016x}", n.id());
    tokio::time::sleep(Duration::from_secs(600)).await;
}

/// A child process killed when the test ends, whichever way.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `child` node process, linked to `a`, and its id once it is ready.
async fn spawn_child(a: &Node) -> (KillOnDrop, String) {
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("HAYATE_NODE_CHILD", a.local_addr().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    let child_id = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(out).lines();
        loop {
            let l = lines.next().expect("child ended").unwrap();
            // The harness writes "test child ... " before it, on the same line.
            if let Some((_, id)) = l.split_once("READY ") {
                return id.trim().to_string();
            }
        }
    });
    (child, within(child_id).await.unwrap())
}

/// A writer `a` (a ring of `slots`, and a `max_block` far longer than any test: only the
/// death of a reader can release it), a reader node `c` subscribed to `k/*`, and the
/// `child` reader process with its id, all linked.
async fn writer_reader_and_child(slots: usize) -> (Node, Node, Subscription, KillOnDrop, String) {
    let a = Node::start(NodeOptions {
        max_block: Duration::from_secs(600),
        shm: ShmOptions {
            mode: ShmMode::Require,
            slots,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    })
    .await
    .unwrap();
    let c = Node::start(opts(&[&a])).await.unwrap();
    within(c.wait_peers(1, WAIT)).await.unwrap();
    let on_c = c.subscribe("k/*").await.unwrap();
    let (child, child_id) = spawn_child(&a).await;
    within(a.wait_peers(2, WAIT)).await.unwrap();
    (a, c, on_c, child, child_id)
}

/// Mappings and descriptors of this process that name a memfd of node `id`.
fn held_segments(id: &str) -> usize {
    let name = format!("hayate-peer-{id}");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps.lines().filter(|l| l.contains(&name)).count();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().contains(&name))
        .count();
    mapped + fds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_killed_with_sigkill_neither_holds_the_writer_nor_leaves_its_segment() {
    // A small ring: the child holds the writer once it is full.
    let (a, _c, mut on_c, mut child, child_id) = writer_reader_and_child(16).await;
    assert!(
        held_segments(&child_id) > 0,
        "this process reads the child's ring"
    );

    // The child reads one batch and stops: the ring (16 slots) fills and the publisher waits.
    let n = 2_000u32;
    let reading = tokio::spawn(async move { take(&mut on_c, n as usize).await });
    let publisher = {
        let a = a.clone();
        tokio::spawn(async move {
            for i in 0..n {
                a.publish(&key("k/x"), i.to_be_bytes().to_vec())
                    .await
                    .unwrap();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !publisher.is_finished(),
        "the publisher waits for the child"
    );
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    within(publisher).await.unwrap();
    let got = within(reading).await.unwrap();
    assert_eq!(
        got,
        (0..n).map(|i| i.to_be_bytes().to_vec()).collect::<Vec<_>>(),
        "the other reader got every message, in order"
    );
    // Nothing of the dead node stays mapped or open here.
    within(async {
        while held_segments(&child_id) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(a.stats().slow_consumers.load(Ordering::Relaxed), 0);
}

/// A handshake answer as received: its descriptors and text, or why none came.
type Answer = Result<(Vec<std::os::fd::OwnedFd>, Vec<u8>), announce::ReceiveError>;

/// What a hostile process does: connects to node `to`'s socket and offers it a ring of 8
/// slots of `slot` bytes in the name of node `from` (and `arena`, when given, with the word
/// `arena`). The socket, the ring, and the answer as received.
fn hostile_offer(
    to: u64,
    from: u64,
    slot: usize,
    arena: Option<std::os::fd::BorrowedFd<'_>>,
) -> (UnixStream, SharedRing, Answer) {
    let name = format!("hayate-peer/{to:016x}");
    let sock = UnixStream::connect_addr(&UnixAddr::from_abstract_name(name).unwrap()).unwrap();
    let words = hayate_shm::region_words(8, slot);
    let ring = SharedRing::init(Segment::create("evil", words * 8).unwrap(), 8, slot).unwrap();
    let bell = Doorbell::new().unwrap();
    let mut fds = vec![ring.segment().fd(), bell.ringer()];
    let mut offer = format!("HAYATE-SHM/3 OFFER {from:016x} {to:016x}");
    if let Some(fd) = arena {
        fds.push(fd);
        offer.push_str(" arena");
    }
    announce::send_fds(&sock, &fds, offer.as_bytes()).unwrap();
    let answer = announce::receive_any(&sock);
    (sock, ring, answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_ring_is_an_error_for_that_ring_only() {
    let b = Node::start(opts(&[])).await.unwrap();
    let x = Node::start(opts(&[&b])).await.unwrap();
    within(b.wait_peers(1, WAIT)).await.unwrap();
    let mut sub = b.subscribe("c/*").await.unwrap();
    // A hostile process offers b a ring in x's name (x is linked to b), then writes into it
    // what no writer produces: a ring message for every reader (mask all ones) whose flag
    // byte (its last) has bits no writer sets.
    let (b_id, x_id) = (b.id(), x.id());
    let sock = tokio::task::spawn_blocking(move || {
        let (sock, ring, answer) = hostile_offer(b_id, x_id, 64, None);
        let (mut fds, answer) = answer.unwrap();
        assert!(answer.starts_with(b"HAYATE-SHM/3 OK "), "{answer:?}");
        assert_eq!(fds.len(), 1);
        let b_bell = Doorbell::from_fd(fds.pop().unwrap()).unwrap();
        let mut w = SharedWriter::new(ring.clone());
        w.publish(b"\x00garbage that is no frame\xff\xff\xff\xff\xff\xff\xff\xff\x80")
            .unwrap();
        b_bell.ring();
        (sock, ring)
    });
    let (_sock, _ring) = within(sock).await.unwrap();
    within(async {
        while b.stats().shm_corrupt.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // b carries on: x's own ring still delivers.
    x.publish(&key("c/1"), "after").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"after".to_vec()]);
}

/// The ring is one for all local nodes, but a node passes over, unread, what is for the
/// others (replies to other callers, say): only the node a message is for reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_passes_over_what_is_for_other_nodes() {
    let (a, b, c) = linked_to_one().await;
    let mut on_b = b.subscribe("r/b").await.unwrap();
    let mut on_c = c.subscribe("r/c").await.unwrap();
    // Small and larger than a slot (64 KiB: several chunks, each passed over).
    for i in 0..100u32 {
        a.publish(&key("r/b"), i.to_be_bytes().to_vec())
            .await
            .unwrap();
    }
    a.publish(&key("r/b"), vec![5u8; 200 * 1024]).await.unwrap();
    a.publish(&key("r/c"), "for c").await.unwrap();
    a.flush().await.unwrap();
    assert_eq!(take(&mut on_b, 101).await.len(), 101);
    assert_eq!(take(&mut on_c, 1).await, vec![b"for c".to_vec()]);
    assert_eq!(b.stats().shm_received.load(Ordering::Relaxed), 101);
    assert_eq!(
        c.stats().shm_received.load(Ordering::Relaxed),
        1,
        "c read only its own message"
    );
    assert_eq!(c.stats().shm_corrupt.load(Ordering::Relaxed), 0);
    assert_eq!(c.stats().shm_lost.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_one_reader_accepts_is_skipped_by_that_reader_only() {
    let a = Node::start(NodeOptions {
        shm: ShmOptions {
            mode: ShmMode::Require,
            slot_bytes: 4096,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    })
    .await
    .unwrap();
    let small = Node::start(NodeOptions {
        max_payload: 1024,
        ..opts(&[&a])
    })
    .await
    .unwrap();
    let big = Node::start(opts(&[&a])).await.unwrap();
    within(a.wait_peers(2, WAIT)).await.unwrap();
    let mut on_small = small.subscribe("m/*").await.unwrap();
    let mut on_big = big.subscribe("m/*").await.unwrap();
    a.publish(&key("m/1"), "before").await.unwrap();
    a.publish(&key("m/1"), vec![7u8; 64 * 1024]).await.unwrap();
    a.publish(&key("m/1"), "after").await.unwrap();
    a.flush().await.unwrap();
    let got = take(&mut on_small, 2).await;
    let lens: Vec<usize> = got.iter().map(Vec::len).collect();
    assert_eq!(lens, [6, 5], "before and after, not the large one");
    let got = take(&mut on_big, 3).await;
    assert!(got[1] == vec![7u8; 64 * 1024], "the large one, whole");
    assert_eq!(small.stats().shm_too_large.load(Ordering::Relaxed), 1);
    assert_eq!(small.stats().shm_corrupt.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_cancelled_half_written_loses_that_message_only() {
    // A ring of 4 slots of 1 KiB: a 16 KiB message takes 17 chunks.
    let a = Node::start(NodeOptions {
        shm: ShmOptions {
            mode: ShmMode::Require,
            slots: 4,
            slot_bytes: 1024,
            // No arena: the message cut is one in chunks.
            arena_bytes: 0,
            ..ShmOptions::default()
        },
        ..NodeOptions::default()
    })
    .await
    .unwrap();
    let b = Node::start(NodeOptions {
        subscription_capacity: 1,
        ..opts(&[&a])
    })
    .await
    .unwrap();
    within(a.wait_peers(1, WAIT)).await.unwrap();
    let mut sub = b.subscribe("h/*").await.unwrap();
    // The first fills b's subscription; b's ring reader then holds the second, waiting for
    // room, and reads no further.
    a.publish(&key("h/1"), "one").await.unwrap();
    a.flush().await.unwrap();
    a.publish(&key("h/1"), "two").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The ring fills in the middle of this one; its caller gives up.
    let cut = tokio::time::timeout(
        Duration::from_millis(300),
        a.publish(&key("h/1"), vec![1u8; 16 * 1024]),
    )
    .await;
    assert!(
        cut.is_err(),
        "the publish waited for room, and was cancelled"
    );
    let reading = tokio::spawn(async move { take(&mut sub, 3).await });
    a.publish(&key("h/1"), "three").await.unwrap();
    let got = within(reading).await.unwrap();
    assert_eq!(got, [&b"one"[..], b"two", b"three"]);
    assert_eq!(b.stats().shm_corrupt.load(Ordering::Relaxed), 0);
    assert_eq!(b.stats().shm_lost.load(Ordering::Relaxed), 1);
}

/// Two nodes on shared memory, `b` linked to `a`, each seeing the other.
async fn linked_pair() -> (Node, Node) {
    linked_pair_with(ShmOptions::default().arena_bytes).await
}

/// Three nodes on shared memory, `b` and `c` linked to `a`, which sees both.
async fn linked_to_one() -> (Node, Node, Node) {
    let a = Node::start(opts(&[])).await.unwrap();
    let b = Node::start(opts(&[&a])).await.unwrap();
    let c = Node::start(opts(&[&a])).await.unwrap();
    within(a.wait_peers(2, WAIT)).await.unwrap();
    (a, b, c)
}

/// Two linked nodes whose arenas have `arena_bytes` (0: none, every message through the
/// ring).
async fn linked_pair_with(arena_bytes: usize) -> (Node, Node) {
    let with = |o: NodeOptions| NodeOptions {
        shm: ShmOptions {
            arena_bytes,
            ..o.shm
        },
        ..o
    };
    let a = Node::start(with(opts(&[]))).await.unwrap();
    let b = Node::start(with(opts(&[&a]))).await.unwrap();
    within(b.wait_peers(1, WAIT)).await.unwrap();
    within(a.wait_peers(1, WAIT)).await.unwrap();
    (a, b)
}

/// `a` publishes `payload` on `k` back to back while a task of the runtime's workers (as an
/// application's would be: the test's own future is not on one) takes `count` messages of
/// that length from `sub` on `b`; then the publisher stops. `b`'s ring stays good.
async fn taken_while_published_back_to_back(
    (a, b): (&Node, &Node),
    mut sub: Subscription,
    k: &str,
    payload: Vec<u8>,
    count: usize,
) {
    within(b.flush()).await.unwrap();
    within(a.flush()).await.unwrap();
    let len = payload.len();
    let publisher = {
        let (a, k, data) = (a.clone(), key(k), bytes::Bytes::from(payload));
        tokio::spawn(async move { while a.publish(&k, data.clone()).await.is_ok() {} })
    };
    let subscriber = tokio::spawn(async move {
        for _ in 0..count {
            let m = sub.next().await.expect("the subscription ends");
            assert_eq!(m.payload.len(), len);
        }
    });
    within(subscriber).await.unwrap();
    publisher.abort();
    assert_eq!(b.stats().shm_corrupt.load(Ordering::Relaxed), 0);
}

/// A publisher that keeps the ring full (1 MiB messages back to back, 65 slots each) and a
/// subscriber task on another node in the same process, on a runtime of two workers: the
/// subscriber keeps receiving. (Before: the ring's reader never waited while the ring had
/// more, reading bursts of up to 16 MiB, and the subscriber it woke sat in its worker's
/// LIFO slot, which no other worker takes: it got one ring's worth, 60 messages, then
/// nothing while the reader went on reading. Bursts end at 1 MiB now, and the ring then
/// runs dry often enough here that this passes even without the reader's yield: the next
/// test is the one that needs it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_kept_full_still_lets_its_subscribers_run() {
    // No arena: every message through the ring, in chunks.
    let (a, b) = linked_pair_with(0).await;
    let sub = b.subscribe("full/x").await.unwrap();
    // Several rings' worth (a ring holds 60 of them).
    taken_while_published_back_to_back((&a, &b), sub, "full/x", vec![0x5a; 1 << 20], 300).await;
}

/// A ring reader slower than its writer: 200 other subscriptions on the reading node (every
/// message is handed to each) and small messages, all `drop`, so the writer never waits and
/// the ring never runs dry. The subscription a task takes from still gets its messages:
/// the reader lets it run after each burst. (Without that it ran only once its queue was
/// full, and a `drop` queue that is full never makes the reader wait: it got nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_slower_than_its_writer_still_lets_its_subscribers_run() {
    let (a, b) = linked_pair().await;
    let dropping = || SubscribeOptions {
        group: None,
        qos: Qos::BEST_EFFORT_DROP,
    };
    let mut others = Vec::new();
    for _ in 0..200 {
        others.push(b.subscribe_with("slow/*", dropping()).await.unwrap());
    }
    let sub = b.subscribe_with("slow/x", dropping()).await.unwrap();
    taken_while_published_back_to_back((&a, &b), sub, "slow/x", vec![7; 100], 2000).await;
    drop(others);
}

/// A payload of `len` bytes that says which message it is.
fn numbered(i: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|j| (j % 253) as u8 ^ i as u8).collect();
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

/// Messages larger than a slot go into the writer's arena once and every local node reads
/// them in place: each node gets every one whole and in order, the ring carries only
/// references, and the subscriber's payload is not a copy (its bytes are in the shared
/// mapping, not on this process's heap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_are_read_in_place_by_every_local_node() {
    let a = Node::start(opts(&[])).await.unwrap();
    let (b, c) = (
        Node::start(opts(&[&a])).await.unwrap(),
        Node::start(opts(&[&a])).await.unwrap(),
    );
    within(a.wait_peers(2, WAIT)).await.unwrap();
    let mut subs = vec![
        b.subscribe("big/*").await.unwrap(),
        c.subscribe("big/*").await.unwrap(),
    ];
    within(b.flush()).await.unwrap();
    within(c.flush()).await.unwrap();
    within(a.flush()).await.unwrap();
    let count = 40u32;
    for i in 0..count {
        within(a.publish(&key("big/x"), numbered(i, 100_000)))
            .await
            .unwrap();
        for s in &mut subs {
            let m = within(s.next()).await.unwrap();
            assert!(
                m.payload[..] == numbered(i, 100_000)[..],
                "message {i} differs"
            );
        }
    }
    assert_eq!(
        a.stats().shm_refs_sent.load(Ordering::Relaxed),
        u64::from(count)
    );
    for n in [&b, &c] {
        assert_eq!(
            n.stats().shm_refs_read.load(Ordering::Relaxed),
            u64::from(count)
        );
        assert_eq!(n.stats().shm_corrupt.load(Ordering::Relaxed), 0);
    }
    // Small messages still go through the ring, copied.
    a.publish(&key("big/small"), "small").await.unwrap();
    for s in &mut subs {
        assert_eq!(take(s, 1).await, vec![b"small".to_vec()]);
    }
    assert_eq!(
        a.stats().shm_refs_sent.load(Ordering::Relaxed),
        u64::from(count)
    );
}

/// `a` publishes the numbered messages `range` one at a time, each taken by every `subs`.
async fn publish_and_take(
    a: &Node,
    range: std::ops::Range<u32>,
    len: usize,
    subs: &mut [&mut Subscription],
) {
    for i in range {
        within(a.publish(&key("keep/x"), numbered(i, len)))
            .await
            .unwrap();
        for s in subs.iter_mut() {
            let m = within(s.next()).await.unwrap();
            assert!(m.payload[..] == numbered(i, len)[..], "message {i} changed");
        }
    }
}

/// A message a subscriber keeps is never written over while it keeps it, however much is
/// published after it (here twice the arena): later messages go round it (or, past the
/// node's quota of the arena, through the ring), all arrive whole, and the kept one is
/// still its bytes, also once its node has closed (its process lives on, holding it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_kept_in_place_is_never_written_over() {
    let (a, b, c) = linked_to_one().await;
    let mut sb = b.subscribe("keep/*").await.unwrap();
    let mut sc = c.subscribe("keep/*").await.unwrap();
    within(b.flush()).await.unwrap();
    within(c.flush()).await.unwrap();
    within(a.flush()).await.unwrap();
    let len = 256 * 1024;
    a.publish(&key("keep/x"), numbered(0, len)).await.unwrap();
    let kept = within(sb.next()).await.unwrap();
    let kept_c = within(sc.next()).await.unwrap();
    assert_eq!(a.stats().shm_refs_sent.load(Ordering::Relaxed), 1);
    let arena = ShmOptions::default().arena_bytes;
    let n = (2 * arena / len) as u32;
    publish_and_take(&a, 1..1 + n, len, &mut [&mut sb, &mut sc]).await;
    assert!(
        kept.payload[..] == numbered(0, len)[..],
        "b's kept message changed"
    );
    assert!(
        kept_c.payload[..] == numbered(0, len)[..],
        "c's kept message changed"
    );
    // Holes, not a wall: the arena kept serving around the kept entry.
    let refs = a.stats().shm_refs_sent.load(Ordering::Relaxed);
    assert!(refs > u64::from(n) / 2, "{refs} of {n} by reference");
    // b closes, still holding its message (not its subscription); c drops its own.
    drop(kept_c);
    drop(sb);
    b.close().await;
    publish_and_take(&a, 1 + n..1 + 2 * n, len, &mut [&mut sc]).await;
    assert!(
        kept.payload[..] == numbered(0, len)[..],
        "b's kept message changed after its node closed"
    );
    assert_eq!(c.stats().shm_corrupt.load(Ordering::Relaxed), 0);
}

/// A hostile process offers a node an arena in the name of a node linked to it. One that
/// other processes could still write (not sealed against writing) is refused with the
/// whole offer. With a sealed one, a good reference (the format of docs/shm.md) delivers
/// its message; a reference outside the arena, one whose number no reader could count to
/// (`u64::MAX`: no overflow in the release table), and the reference flag on a chunk that
/// does not start a message each make that ring corrupt: an error for that ring only, the
/// node carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_arena_or_reference_is_refused() {
    use hayate_shm::arena::ArenaWriter;
    let b = Node::start(opts(&[])).await.unwrap();
    let x = Node::start(opts(&[&b])).await.unwrap();
    within(b.wait_peers(1, WAIT)).await.unwrap();
    let mut sub = b.subscribe("h/*").await.unwrap();
    let b_id = b.id();
    let offer = move |x_id: u64, sealed: bool| {
        let writable = Segment::create("evil-arena", 4096).unwrap();
        let arena = ArenaWriter::create("evil-arena", 4096).unwrap();
        let arena_fd = if sealed { arena.fd() } else { writable.fd() };
        let (sock, ring, answer) = hostile_offer(b_id, x_id, 256, Some(arena_fd));
        (sock, ring, arena, answer)
    };
    // Writable by others: refused, no answer.
    let x_id = x.id();
    let (_s, _r, _a, answer) = within(tokio::task::spawn_blocking(move || offer(x_id, false)))
        .await
        .unwrap();
    assert!(answer.is_err(), "{answer:?}");
    let reference = |at: u64, len: u64, tag: u64, n: u64, flag: u8| {
        let mut m = Vec::new();
        for v in [at, len, tag, n] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(&u64::MAX.to_le_bytes()); // for every reader
        m.push(flag);
        m
    };
    // A PUB frame on h/1, put at word 0 of each hostile arena.
    let mut frame = bytes::BytesMut::new();
    hayate_native::encode_pub_head(
        &hayate_client::Message::new(key("h/1"), bytes::Bytes::from_static(b"in place")),
        &mut frame,
    );
    frame.extend_from_slice(b"in place");
    let len = frame.len() as u64;
    const REF: u8 = 2 | 4; // FIRST | REF
    // The first chunk (FIRST | MORE) of a 300-byte frame, for every reader.
    let first_of_two = || {
        let mut m = 300u32.to_be_bytes().to_vec();
        m.extend_from_slice(b"abc");
        m.extend_from_slice(&u64::MAX.to_le_bytes());
        m.push(2 | 1);
        m
    };
    // Each case in the name of a node of its own (a corrupt ring ends that attachment).
    let cases: [(&str, Vec<Vec<u8>>); 3] = [
        (
            "outside the arena",
            vec![reference(1 << 40, 64, 77, 1, REF)],
        ),
        (
            "number u64::MAX",
            vec![reference(0, len, 77, u64::MAX, REF)],
        ),
        (
            "the reference flag on a chunk that starts nothing",
            vec![first_of_two(), reference(0, len, 77, 1, 4 | 1)],
        ),
    ];
    let mut others = Vec::new();
    for (i, (what, bad)) in cases.into_iter().enumerate() {
        let xi = Node::start(opts(&[&b])).await.unwrap();
        within(b.wait_peers(2 + i, WAIT)).await.unwrap();
        let xi_id = xi.id();
        let (sock, ring, arena, answer) =
            within(tokio::task::spawn_blocking(move || offer(xi_id, true)))
                .await
                .unwrap();
        let (mut fds, answer) = answer.unwrap();
        assert_eq!(answer, b"HAYATE-SHM/3 OK 0 hold".to_vec());
        assert_eq!(fds.len(), 2);
        let _table = fds.pop().unwrap();
        let b_bell = Doorbell::from_fd(fds.pop().unwrap()).unwrap();
        arena.put(0, 77, [&frame[..]]);
        let mut w = SharedWriter::new(ring.clone());
        if i == 0 {
            // A good one first: delivered in place.
            w.publish(&reference(0, len, 77, 0, REF)).unwrap();
            b_bell.ring();
            assert_eq!(take(&mut sub, 1).await, vec![b"in place".to_vec()]);
            assert_eq!(b.stats().shm_refs_read.load(Ordering::Relaxed), 1);
        }
        let corrupt = b.stats().shm_corrupt.load(Ordering::Relaxed);
        for m in &bad {
            w.publish(m).unwrap();
        }
        b_bell.ring();
        within(async {
            while b.stats().shm_corrupt.load(Ordering::Relaxed) == corrupt {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        // The node carries on: the real node's messages arrive.
        xi.publish(&key("h/2"), "after").await.unwrap();
        assert_eq!(
            take(&mut sub, 1).await,
            vec![b"after".to_vec()],
            "after {what}"
        );
        others.push((xi, sock, arena));
    }
    x.publish(&key("h/3"), "x too").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"x too".to_vec()]);
}

/// A reader process killed with SIGKILL while it holds messages in place (its subscriber
/// never reads: its queue and its ring reader keep what they took) frees them: once its
/// attachment ends and its process is gone, nothing of the writer's arena stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_killed_holding_messages_in_place_frees_them() {
    let (a, _c, mut on_c, mut child, _) =
        writer_reader_and_child(ShmOptions::default().slots).await;
    within(a.flush()).await.unwrap();
    let len = 128 * 1024;
    for i in 0..4 {
        a.publish(&key("k/x"), numbered(i, len)).await.unwrap();
        let m = within(on_c.next()).await.unwrap();
        assert!(m.payload[..] == numbered(i, len)[..], "message {i} differs");
    }
    assert_eq!(a.stats().shm_refs_sent.load(Ordering::Relaxed), 4);
    // c is done with all four; the child holds what it took.
    let held = within(a.shm_arena_held()).await.unwrap();
    assert!(held.0 >= 1, "the child holds some: {held:?}");
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    within(async {
        while within(a.shm_arena_held()).await.unwrap().0 > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A node that closes while its ring reader waits for room in one of its `block`
/// subscriptions (full, never read, still alive) stops reading at once: its reader ends and
/// lets go of the other node's ring, instead of waiting out `max_block` (600 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_closes_stops_waiting_for_its_full_subscriptions() {
    let a = Node::start(opts(&[])).await.unwrap();
    let b = Node::start(NodeOptions {
        subscription_capacity: 1,
        max_block: Duration::from_secs(600),
        ..opts(&[&a])
    })
    .await
    .unwrap();
    within(a.wait_peers(1, WAIT)).await.unwrap();
    let _full = b.subscribe("f/*").await.unwrap();
    within(b.flush()).await.unwrap();
    within(a.flush()).await.unwrap();
    let a_id = format!("{:016x}", a.id());
    let mapped = held_segments(&a_id);
    // One message fills the subscription (handed over: `flush`), the next holds b's ring
    // reader.
    a.publish(&key("f/x"), "one").await.unwrap();
    within(a.flush()).await.unwrap();
    a.publish(&key("f/x"), "two").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.close().await;
    within(async {
        while held_segments(&a_id) >= mapped {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}
