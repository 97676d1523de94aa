//! Peer mode: nodes exchange pub/sub, queue groups and request/reply with no broker; drop
//! and block subscriptions; a node that goes away; hostile input on a node's listener.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use hayate_client::peer::{Node, NodeOptions};
use hayate_client::{Client, Key, Qos, SubscribeOptions};
use hayate_native::{Frame, Hello, PROTOCOL_VERSION, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::{WAIT, key, take, within};

/// Node settings for these tests: nodes in one process share a host, so their links use
/// shared memory (`ShmMode::Auto`); `HAYATE_TEST_SHM=off` runs the same tests over TCP
/// (scripts/test-all runs both).
fn opts() -> NodeOptions {
    let mut o = NodeOptions::default();
    if let Ok(m) = std::env::var("HAYATE_TEST_SHM") {
        o.shm.mode = m.parse().expect("HAYATE_TEST_SHM: off, auto or require");
    }
    o
}

async fn node(peers: &[&Node]) -> Node {
    let n = Node::start(NodeOptions {
        peers: peers.iter().map(|p| p.local_addr().to_string()).collect(),
        ..opts()
    })
    .await
    .unwrap();
    within(n.wait_peers(peers.len(), WAIT)).await.unwrap();
    n
}

/// A node started with `o` and linked to `a`, both ways.
async fn linked_to(a: &Node, o: NodeOptions) -> Node {
    let b = Node::start(NodeOptions {
        peers: vec![a.local_addr().to_string()],
        ..o
    })
    .await
    .unwrap();
    within(b.wait_peers(1, WAIT)).await.unwrap();
    within(a.wait_peers(1, WAIT)).await.unwrap();
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_exchange_messages_both_ways_without_a_broker() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    within(a.wait_peers(1, WAIT)).await.unwrap();
    let mut on_b = b.subscribe("t/**").await.unwrap();
    let mut on_a = a.subscribe("t/*").await.unwrap();
    for i in 0..200u32 {
        a.publish(&key("t/x"), i.to_be_bytes().to_vec())
            .await
            .unwrap();
    }
    for i in 0..50u32 {
        b.publish(&key("t/y"), format!("b{i}")).await.unwrap();
    }
    // b/deep matches only b's `t/**`.
    b.publish(&key("t/deep/z"), "deep").await.unwrap();
    let got_b = take(&mut on_b, 251).await;
    let from_a: Vec<_> = got_b
        .iter()
        .filter(|p| p.len() == 4 && p[..] != b"deep"[..])
        .cloned()
        .collect();
    let from_b: Vec<_> = got_b.iter().filter(|p| p[0] == b'b').cloned().collect();
    // In order per publisher.
    assert_eq!(
        from_a,
        (0..200u32)
            .map(|i| i.to_be_bytes().to_vec())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        from_b,
        (0..50u32)
            .map(|i| format!("b{i}").into_bytes())
            .collect::<Vec<_>>()
    );
    assert!(got_b.contains(&b"deep".to_vec()));
    // a receives its own 200 (local) and b's 50, not b's deep key.
    let got_a = take(&mut on_a, 250).await;
    assert_eq!(got_a.len(), 250);
    a.flush().await.unwrap();
    b.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), on_a.next())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_groups_span_nodes_and_deliver_each_message_once() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    let c = node(&[&a, &b]).await;
    within(a.wait_peers(2, WAIT)).await.unwrap();
    within(b.wait_peers(2, WAIT)).await.unwrap();
    let mut members = vec![
        b.queue_subscribe("job/*", "workers").await.unwrap(),
        b.queue_subscribe("job/*", "workers").await.unwrap(),
        c.queue_subscribe("job/*", "workers").await.unwrap(),
        a.queue_subscribe("job/*", "workers").await.unwrap(),
    ];
    let mut watcher = b.subscribe("job/*").await.unwrap();
    // Members read as they go (a `block` member that is not read holds the publisher).
    let readers: Vec<_> = members
        .drain(..)
        .map(|mut m| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Ok(Some(msg)) =
                    tokio::time::timeout(Duration::from_millis(500), m.next()).await
                {
                    got.push(msg.payload.to_vec());
                }
                got
            })
        })
        .collect();
    let n = 400u32;
    for i in 0..n {
        a.publish(&key("job/1"), i.to_be_bytes().to_vec())
            .await
            .unwrap();
    }
    a.flush().await.unwrap();
    assert_eq!(take(&mut watcher, n as usize).await.len(), n as usize);
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut per_member = Vec::new();
    for r in readers {
        let got = r.await.unwrap();
        per_member.push(got.len());
        for p in got {
            *seen.entry(p).or_default() += 1;
        }
    }
    assert_eq!(
        seen.len(),
        n as usize,
        "every job delivered: {per_member:?}"
    );
    assert!(seen.values().all(|&c| c == 1), "each job once");
    assert!(
        per_member.iter().all(|&k| k > 0),
        "round robin reaches everyone: {per_member:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_reply_between_nodes_and_to_a_group_of_servers() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    let c = node(&[&a, &b]).await;
    within(a.wait_peers(2, WAIT)).await.unwrap();
    for (n, name) in [(&b, "b"), (&c, "c")] {
        let mut sub = n.queue_subscribe("svc/echo", "echo").await.unwrap();
        let n = n.clone();
        tokio::spawn(async move {
            while let Some(req) = sub.next().await {
                let mut p = req.payload.to_vec();
                p.extend_from_slice(name.as_bytes());
                n.reply(&req, p).await.unwrap();
            }
        });
    }
    let mut by = HashMap::new();
    for i in 0..60u32 {
        let r = a
            .request(&key("svc/echo"), i.to_string(), WAIT)
            .await
            .unwrap();
        let s = String::from_utf8(r.payload.to_vec()).unwrap();
        let (num, who) = s.split_at(s.len() - 1);
        assert_eq!(num, i.to_string());
        *by.entry(who.to_string()).or_insert(0) += 1;
    }
    assert_eq!(by.len(), 2, "both servers answered: {by:?}");
    // No server for this key: a timeout, not a hang.
    let e = a
        .request(&key("svc/none"), "x", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, hayate_client::Error::Timeout), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interest_made_before_the_link_reaches_the_late_node() {
    // b subscribes before it knows a; a links to b afterwards.
    let b = Node::start(opts()).await.unwrap();
    let mut sub = b.subscribe("late/*").await.unwrap();
    let a = node(&[&b]).await;
    a.publish(&key("late/1"), "hello").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"hello".to_vec()]);
    // Dropping the subscription is announced: a stops sending (a new one still works).
    drop(sub);
    let mut other = b.subscribe("late/2").await.unwrap();
    a.publish(&key("late/1"), "nobody").await.unwrap();
    a.publish(&key("late/2"), "x").await.unwrap();
    assert_eq!(take(&mut other, 1).await, vec![b"x".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_subscriptions_lose_and_count_instead_of_holding_the_publisher() {
    let a = node(&[]).await;
    let b = linked_to(
        &a,
        NodeOptions {
            subscription_capacity: 2,
            ..opts()
        },
    )
    .await;
    let mut sub = b
        .subscribe_with(
            "d/*",
            SubscribeOptions {
                group: None,
                qos: Qos::BEST_EFFORT_DROP,
            },
        )
        .await
        .unwrap();
    let n = 20_000u64;
    within(async {
        for _ in 0..n {
            a.publish(&key("d/1"), vec![0u8; 512]).await.unwrap();
        }
        a.flush().await.unwrap();
    })
    .await;
    let mut got = 0u64;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
        got += 1;
    }
    let lost = sub.lost();
    let on_links = a.stats().dropped_on_links.load(Ordering::Relaxed);
    // Through shared memory (the nodes share a host), b's ring reader does not hold a back
    // when all b's subscriptions are `drop`: what a overwrote before b read it is counted
    // there.
    let in_ring = b.stats().shm_lost.load(Ordering::Relaxed);
    assert!(lost + on_links + in_ring > 0, "something had to be dropped");
    assert_eq!(
        got + lost + on_links + in_ring,
        n,
        "got {got} lost {lost} dropped on links {on_links} lost in the ring {in_ring}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_subscriber_that_never_reads_is_cut_after_max_block() {
    let a = node(&[]).await;
    let b = linked_to(
        &a,
        NodeOptions {
            subscription_capacity: 2,
            max_block: Duration::from_millis(300),
            ..opts()
        },
    )
    .await;
    let stuck = b.subscribe("s/*").await.unwrap();
    let mut fine = b.subscribe("ok").await.unwrap();
    // The publisher is held, then carries on once b has cut its slow subscriber.
    within(async {
        for _ in 0..20_000 {
            a.publish(&key("s/1"), vec![0u8; 1024]).await.unwrap();
        }
    })
    .await;
    a.publish(&key("ok"), "still here").await.unwrap();
    assert_eq!(take(&mut fine, 1).await, vec![b"still here".to_vec()]);
    assert_eq!(b.stats().slow_consumers.load(Ordering::Relaxed), 1);
    drop(stuck);
}

/// A subscription that never reads holds at most `subscription_bytes` of payload (plus
/// one batch), whatever the number of messages: large `drop` messages past it are lost and
/// counted, from a publisher on another node (over a link or shared memory) and on the same
/// node alike. Taken afterwards, what was kept arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_never_reads_holds_at_most_subscription_bytes() {
    const MIB: usize = 1024 * 1024;
    const N: u64 = 48;
    let a = node(&[]).await;
    let b = linked_to(
        &a,
        NodeOptions {
            subscription_bytes: 4 * MIB,
            ..opts()
        },
    )
    .await;
    let drop_qos = SubscribeOptions {
        group: None,
        qos: Qos::BEST_EFFORT_DROP,
    };
    for (from, what) in [(&a, "another node"), (&b, "the same node")] {
        let mut sub = b.subscribe_with("big/*", drop_qos.clone()).await.unwrap();
        let (shm_lost0, links0) = (
            b.stats().shm_lost.load(Ordering::Relaxed),
            from.stats().dropped_on_links.load(Ordering::Relaxed),
        );
        within(async {
            for i in 0..N {
                from.publish(&key("big/1"), vec![i as u8; MIB])
                    .await
                    .unwrap();
            }
            from.flush().await.unwrap();
        })
        .await;
        // Settled: nothing more arrives at b.
        let mut last = (u64::MAX, usize::MAX);
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = (sub.lost(), sub.pending_bytes());
            if now == last {
                break;
            }
            last = now;
        }
        let pending = sub.pending_bytes();
        assert!(
            pending <= 5 * MIB,
            "{what}: {pending} bytes queued for a subscription bounded to 4 MiB"
        );
        let mut got = 0u64;
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
            assert_eq!(m.payload.len(), MIB, "{what}");
            assert!(m.payload.iter().all(|x| *x == m.payload[0]), "{what}");
            got += 1;
        }
        assert_eq!(sub.pending_bytes(), 0, "{what}");
        let lost = sub.lost()
            + (b.stats().shm_lost.load(Ordering::Relaxed) - shm_lost0)
            + (from.stats().dropped_on_links.load(Ordering::Relaxed) - links0);
        assert!(got <= 5, "{what}: {got} messages of 1 MiB were held");
        assert_eq!(got + lost, N, "{what}: got {got}, lost {lost}");
    }
}

/// A `block` subscription that never reads holds its publisher once `subscription_bytes`
/// are queued (not after `subscription_capacity` batches of any size), then is cut after
/// `max_block`; the publisher carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_subscriber_of_large_messages_holds_its_publisher_within_subscription_bytes() {
    const MIB: usize = 1024 * 1024;
    let a = node(&[]).await;
    let b = linked_to(
        &a,
        NodeOptions {
            subscription_bytes: 4 * MIB,
            max_block: Duration::from_millis(500),
            ..opts()
        },
    )
    .await;
    let stuck = b.subscribe("big/*").await.unwrap();
    let mut fine = b.subscribe("ok").await.unwrap();
    let publisher = {
        let a = a.clone();
        tokio::spawn(async move {
            for _ in 0..64 {
                a.publish(&key("big/1"), vec![7u8; MIB]).await.unwrap();
            }
        })
    };
    // Until b cuts it (or the publisher, held, finishes), b queues no more than the bound.
    let mut most = 0;
    within(async {
        while !publisher.is_finished() || b.stats().slow_consumers.load(Ordering::Relaxed) == 0 {
            most = most.max(stuck.pending_bytes());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    within(publisher).await.unwrap();
    assert!(most > 0, "nothing was queued");
    assert!(most <= 5 * MIB, "{most} bytes queued for a 4 MiB bound");
    assert_eq!(b.stats().slow_consumers.load(Ordering::Relaxed), 1);
    a.publish(&key("ok"), "still here").await.unwrap();
    assert_eq!(take(&mut fine, 1).await, vec![b"still here".to_vec()]);
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_goes_away_is_forgotten_and_the_others_carry_on() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    let c = node(&[&a, &b]).await;
    within(a.wait_peers(2, WAIT)).await.unwrap();
    let mut on_c = c.subscribe("k").await.unwrap();
    let _on_b = b.subscribe("k").await.unwrap();
    b.close().await;
    drop(b);
    within(async {
        while a.peers().len() != 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    a.publish(&key("k"), "after").await.unwrap();
    assert_eq!(take(&mut on_c, 1).await, vec![b"after".to_vec()]);
}

/// Reads until the node closes the connection; returns the ERR it sent, if any.
async fn err_then_close(s: &mut TcpStream) -> Option<String> {
    let mut buf = BytesMut::new();
    let mut err = None;
    within(async {
        loop {
            while let Ok(Some(f)) = decode(&mut buf, 1 << 20) {
                if let Frame::Err { message, .. } = f {
                    err = Some(message);
                }
            }
            match s.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    err
}

fn hello(name: &str) -> BytesMut {
    let mut b = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
            name: name.into(),
            auth: hayate_native::HelloAuth::Anonymous.encode(),
        }),
        &mut b,
    );
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_closes_that_connection_only() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    let mut sub = b.subscribe("h").await.unwrap();
    let addr = b.local_addr();

    // Garbage instead of HELLO.
    let mut g = TcpStream::connect(addr).await.unwrap();
    g.write_all(&[0xff; 64]).await.unwrap();
    assert!(err_then_close(&mut g).await.is_some());

    // A "node" announcing nonsense interest.
    let mut f = TcpStream::connect(addr).await.unwrap();
    f.write_all(&hello("hayate-peer/1 00000000000000aa 127.0.0.1:1"))
        .await
        .unwrap();
    let mut p = BytesMut::new();
    encode(
        &Frame::Pub(hayate_client::Message::new(
            Key::new(hayate_client::peer::node::INTEREST_KEY).unwrap(),
            vec![1u8, 9, 0, 0, 0, 0],
        )),
        &mut p,
    );
    f.write_all(&p).await.unwrap();
    let e = err_then_close(&mut f).await.expect("an ERR");
    assert!(e.contains("interest"), "{e}");

    // A plain client may publish to a node, not subscribe.
    let plain = Client::connect(&addr.to_string()).await.unwrap();
    plain.publish(&key("h"), "from a client").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"from a client".to_vec()]);
    let _s = plain.subscribe("h").await.unwrap();
    within(async {
        while !plain.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // An oversized length prefix.
    let mut o = TcpStream::connect(addr).await.unwrap();
    o.write_all(&hello("x")).await.unwrap();
    o.write_all(&[0x7f, 0xff, 0xff, 0xff, 0x01]).await.unwrap();
    assert!(err_then_close(&mut o).await.is_some());

    // A silent connection is cut after the handshake timeout; meanwhile, all is well.
    a.publish(&key("h"), "still fine").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"still fine".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dropped_without_close_ends_its_links() {
    let a = node(&[]).await;
    let b = node(&[&a]).await;
    within(a.wait_peers(1, WAIT)).await.unwrap();
    drop(b);
    within(async {
        while !a.peers().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // a's own static peer list naming a itself is harmless.
    a.link(&a.local_addr().to_string()).await.unwrap();
    assert!(a.peers().is_empty());
}

/// A node whose listener has small limits, linked to `a`.
async fn small_node(a: &Node) -> Node {
    let n = Node::start(NodeOptions {
        peers: vec![a.local_addr().to_string()],
        max_connections: 8,
        memory_budget: 1 << 20,
        max_block: Duration::from_millis(300),
        handshake_timeout: Duration::from_millis(300),
        ..opts()
    })
    .await
    .unwrap();
    within(n.wait_peers(1, WAIT)).await.unwrap();
    within(a.wait_peers(1, WAIT)).await.unwrap();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_and_links_carry_on() {
    let a = node(&[]).await;
    let b = small_node(&a).await;
    let mut sub = b.subscribe("many").await.unwrap();
    // One connection is a's link; 7 more fit, the rest are closed at once.
    let mut held = Vec::new();
    for _ in 0..7 {
        let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
        s.write_all(&hello("x")).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..10 {
        let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
        let mut one = [0u8; 1];
        let n = within(s.read(&mut one)).await.unwrap_or(0);
        assert_eq!(n, 0, "a connection past max_connections is closed");
    }
    a.publish(&key("many"), "through").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"through".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_frames_past_the_memory_budget_get_server_busy() {
    let a = node(&[]).await;
    let b = small_node(&a).await;
    let mut sub = b.subscribe("m").await.unwrap();
    // Four connections each announce a 4 MiB PUB and send 900 KiB of it: past the free
    // 256 KiB each they draw on the 1 MiB budget, which cannot hold them all.
    let mut hogs = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(b.local_addr()).await.unwrap();
        s.write_all(&hello("hog")).await.unwrap();
        let mut f = BytesMut::new();
        encode(
            &Frame::Pub(hayate_client::Message::new(key("m"), vec![7u8; 4 << 20])),
            &mut f,
        );
        let part = f.split_to(900 * 1024);
        let _ = tokio::time::timeout(Duration::from_secs(2), s.write_all(&part)).await;
        hogs.push(s);
    }
    // Those the budget could not hold are cut after max_block; the others wait for the
    // rest of their frame (so each is given 2 s, not until it closes).
    let mut busy = 0;
    for s in &mut hogs {
        if let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(2), err_then_close(s)).await
            && e.contains("memory budget")
        {
            busy += 1;
        }
    }
    assert!(
        busy >= 1,
        "at least one half-sent frame is cut with SERVER_BUSY"
    );
    a.publish(&key("m"), "still served").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"still served".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handshakes_and_clients_that_never_read_do_not_hold_the_node() {
    let a = node(&[]).await;
    let b = small_node(&a).await;
    let mut sub = b.subscribe("r").await.unwrap();
    // No HELLO: an ERR after the handshake timeout, then closed.
    let mut silent = TcpStream::connect(b.local_addr()).await.unwrap();
    let e = err_then_close(&mut silent).await.expect("an ERR");
    assert!(e.contains("HELLO"), "{e}");
    // A client that sends PINGs and never reads a PONG: once its unread answers pass the
    // connection's output budget the node stops reading it; the node itself carries on.
    let mut deaf = TcpStream::connect(b.local_addr()).await.unwrap();
    deaf.write_all(&hello("deaf")).await.unwrap();
    let mut pings = BytesMut::new();
    for t in 0..20_000u64 {
        encode(&Frame::Ping(t), &mut pings);
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), deaf.write_all(&pings)).await;
    a.publish(&key("r"), "unaffected").await.unwrap();
    assert_eq!(take(&mut sub, 1).await, vec![b"unaffected".to_vec()]);
    drop(deaf);
}

/// A task publishing in a loop, here to a key nobody subscribes to (a publish that waits on
/// nothing), still gives the runtime's other tasks their turn: on a runtime of one thread
/// the timer below fires and the loop can be aborted. (Watched from another thread: a
/// publisher that never yielded would hold this runtime for ever.)
#[test]
fn a_publisher_in_a_loop_lets_other_tasks_run() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let n = Node::start(opts()).await.unwrap();
            let publisher = {
                let n = n.clone();
                tokio::spawn(async move {
                    let k = key("nobody/listens");
                    loop {
                        n.publish(&k, &b"x"[..]).await.unwrap();
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            publisher.abort();
            assert!(publisher.await.unwrap_err().is_cancelled());
        });
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(WAIT)
        .expect("the publishing task held the runtime");
}
