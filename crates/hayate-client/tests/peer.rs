//! Peer-to-peer serving: a `PeerServer` answers ordinary clients that connect to it directly
//! (no broker), the RPC layer on top of it (`rpc::serve_peer`), and bad input.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hayate_client::peer::PeerServer;
use hayate_client::rpc::{self, RpcError, Target, Version};
use hayate_client::{Client, Key, Message};
use hayate_native::{ErrorCode, Frame, decode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(5);

async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("the test took too long")
}

/// A peer serving `svc/**`: the reply is the payload with `+1` appended, or, for a payload
/// that is a number of milliseconds prefixed with `sleep:`, that payload after the sleep.
/// Counts the messages it handles.
async fn adder() -> (PeerServer, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let server = PeerServer::bind("127.0.0.1:0", &["svc/**"], move |m: Message| {
        s.fetch_add(1, Ordering::SeqCst);
        async move {
            let to = m.reply_to.clone()?;
            let text = String::from_utf8_lossy(&m.payload).into_owned();
            if let Some(ms) = text.strip_prefix("sleep:") {
                tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
            }
            let mut r = Message::new(to, format!("{text}+1"));
            r.correlation_id = m.correlation_id.clone();
            Some(r)
        }
    })
    .await
    .unwrap();
    (server, seen)
}

#[tokio::test]
async fn a_client_calls_a_peer_directly() {
    let (server, seen) = adder().await;
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    within(10, async {
        let k = Key::new("svc/add").unwrap();
        for i in 0..100 {
            let r = c.request(&k, i.to_string(), T).await.unwrap();
            assert_eq!(r.payload, Bytes::from(format!("{i}+1")));
        }
        // A key the peer does not serve reaches nobody: the request times out.
        let other = Key::new("elsewhere/x").unwrap();
        assert!(
            c.request(&other, "x", Duration::from_millis(200))
                .await
                .is_err()
        );
        // A publish without reply-to reaches the handler and gets no answer.
        c.publish(&k, "cast").await.unwrap();
        c.flush().await.unwrap();
        let r = c.request(&k, "last", T).await.unwrap();
        assert_eq!(&r.payload[..], b"last+1");
        assert_eq!(seen.load(Ordering::SeqCst), 102);
    })
    .await;
    c.close().await.unwrap();
    server.close().await;
}

#[tokio::test]
async fn requests_on_one_connection_are_handled_concurrently() {
    let (server, _) = adder().await;
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    let k = Key::new("svc/slow").unwrap();
    within(10, async {
        let start = Instant::now();
        let calls = [400u64, 10, 200, 300].map(|ms| {
            let c = c.clone();
            let k = k.clone();
            tokio::spawn(async move { c.request(&k, format!("sleep:{ms}"), T).await })
        });
        let mut got = Vec::new();
        for (i, h) in calls.into_iter().enumerate() {
            got.push((i, h.await.unwrap().unwrap().payload));
        }
        let took = start.elapsed();
        assert_eq!(got[0].1, Bytes::from("sleep:400+1"));
        assert_eq!(got[1].1, Bytes::from("sleep:10+1"));
        assert_eq!(got[3].1, Bytes::from("sleep:300+1"));
        // One after another they would take 910 ms.
        assert!(took < Duration::from_millis(800), "took {took:?}");
    })
    .await;
    server.close().await;
}

fn frame(f: &Frame) -> Vec<u8> {
    let mut b = BytesMut::new();
    hayate_native::encode(f, &mut b);
    b.to_vec()
}

/// Reads frames until the peer closes; returns them.
async fn read_all(s: &mut tokio::net::TcpStream) -> Vec<Frame> {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    loop {
        while let Some(f) = decode(&mut buf, 1 << 20).unwrap() {
            out.push(f);
        }
        if s.read_buf(&mut buf).await.unwrap() == 0 {
            return out;
        }
    }
}

#[tokio::test]
async fn bad_input_gets_an_error_and_a_close_and_the_peer_carries_on() {
    let (server, _) = adder().await;
    let addr = server.local_addr();
    within(10, async {
        // Not the protocol at all.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let frames = read_all(&mut s).await;
        assert!(
            matches!(frames.last(), Some(Frame::Err { .. })),
            "{frames:?}"
        );
        // A valid frame, but not HELLO first.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&frame(&Frame::Ping(7))).await.unwrap();
        let frames = read_all(&mut s).await;
        match frames.as_slice() {
            [Frame::Err { code, message }] => {
                assert_eq!(*code, ErrorCode::Protocol);
                assert!(message.contains("HELLO"), "{message}");
            }
            other => panic!("expected one ERR, got {other:?}"),
        }
        // A frame only a server may send, after a good handshake.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let hello = Frame::Hello(hayate_native::Hello {
            version: hayate_native::PROTOCOL_VERSION,
            flags: 0,
            name: "raw".into(),
            auth: Bytes::new(),
        });
        let lost = Frame::Lost { sid: 1, count: 1 };
        s.write_all(&[frame(&hello), frame(&lost)].concat())
            .await
            .unwrap();
        let frames = read_all(&mut s).await;
        assert!(
            matches!(frames.first(), Some(Frame::Welcome(_))),
            "{frames:?}"
        );
        assert!(
            matches!(frames.last(), Some(Frame::Err { .. })),
            "{frames:?}"
        );
        // The listener still serves.
        let c = Client::connect(&addr.to_string()).await.unwrap();
        let r = c
            .request(&Key::new("svc/a").unwrap(), "1", T)
            .await
            .unwrap();
        assert_eq!(&r.payload[..], b"1+1");
    })
    .await;
    server.close().await;
}

#[tokio::test]
async fn closing_the_peer_ends_its_connections() {
    let (server, _) = adder().await;
    let addr = server.local_addr().to_string();
    let c = Client::connect(&addr).await.unwrap();
    within(10, async {
        server.close().await;
        while !c.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(Client::connect(&addr).await.is_err());
    })
    .await;
}

#[tokio::test]
async fn rpc_over_a_direct_connection() {
    let spec = Target::new("calc").server("p1").version(Version::new(1, 2));
    let casts = Arc::new(AtomicUsize::new(0));
    let n = casts.clone();
    let server = rpc::serve_peer("127.0.0.1:0", &spec, move |method: String, p: Bytes| {
        let n = n.clone();
        async move {
            match method.as_str() {
                "echo" => Ok(p),
                "count" => {
                    n.fetch_add(1, Ordering::SeqCst);
                    Ok(Bytes::new())
                }
                other => Err(format!("unknown method {other}")),
            }
        }
    })
    .await
    .unwrap();
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    within(10, async {
        let t = Target::new("calc");
        assert_eq!(&c.call(&t, "echo", "hi", T).await.unwrap()[..], b"hi");
        let named = Target::new("calc").server("p1");
        assert_eq!(&c.call(&named, "echo", "n", T).await.unwrap()[..], b"n");
        match c.call(&t, "nope", "", T).await {
            Err(RpcError::Remote { message }) => assert_eq!(message, "unknown method nope"),
            other => panic!("expected a remote error, got {other:?}"),
        }
        match c
            .call(&t.clone().version(Version::new(1, 3)), "echo", "", T)
            .await
        {
            Err(RpcError::UnsupportedVersion { requested, server }) => {
                assert_eq!(requested, Version::new(1, 3));
                assert_eq!(server, Version::new(1, 2));
            }
            other => panic!("expected unsupported version, got {other:?}"),
        }
        assert!(matches!(
            c.call(&t.clone().namespace("ns"), "echo", "", T).await,
            Err(RpcError::NamespaceMismatch { .. })
        ));
        c.cast(&t, "count", "").await.unwrap();
        c.fanout(&t, "count", "").await.unwrap();
        c.flush().await.unwrap();
        // The calls above are answered in order after the casts were handled.
        c.call(&t, "echo", "", T).await.unwrap();
        assert_eq!(casts.load(Ordering::SeqCst), 2);
    })
    .await;
    server.close().await;
}

#[tokio::test]
async fn a_pipelining_caller_is_held_to_the_in_flight_limit() {
    use hayate_client::peer::PeerOptions;
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (n, m) = (now.clone(), most.clone());
    let options = PeerOptions {
        max_in_flight: 3,
        ..PeerOptions::default()
    };
    let server = PeerServer::bind_with("127.0.0.1:0", &["svc/**"], options, move |req: Message| {
        let (n, m) = (n.clone(), m.clone());
        async move {
            let running = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(running, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            n.fetch_sub(1, Ordering::SeqCst);
            let mut r = Message::new(req.reply_to.clone()?, req.payload.clone());
            r.correlation_id = req.correlation_id.clone();
            Some(r)
        }
    })
    .await
    .unwrap();
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    within(20, async {
        let k = Key::new("svc/x").unwrap();
        let calls: Vec<_> = (0..30)
            .map(|i| {
                let (c, k) = (c.clone(), k.clone());
                tokio::spawn(async move { c.request(&k, i.to_string(), T).await })
            })
            .collect();
        for (i, h) in calls.into_iter().enumerate() {
            assert_eq!(
                h.await.unwrap().unwrap().payload,
                Bytes::from(i.to_string())
            );
        }
    })
    .await;
    let most = most.load(Ordering::SeqCst);
    assert!(
        (2..=3).contains(&most),
        "at most {most} requests were handled at once"
    );
    server.close().await;
}

/// HELLO, then SUB of an inbox `_inbox/x/*` as sid 1, as one byte string.
fn hello_and_inbox() -> Vec<u8> {
    let hello = Frame::Hello(hayate_native::Hello {
        version: hayate_native::PROTOCOL_VERSION,
        flags: 0,
        name: "raw".into(),
        auth: Bytes::new(),
    });
    let sub = Frame::Sub(hayate_native::Sub {
        sid: 1,
        qos: hayate_client::Qos::default(),
        group: None,
        expr: hayate_client::KeyExpr::new("_inbox/x/*").unwrap(),
    });
    [frame(&hello), frame(&sub)].concat()
}

fn request(n: u32) -> Vec<u8> {
    let mut m = Message::new(Key::new("svc/add").unwrap(), n.to_string());
    m.reply_to = Some(Key::new(&format!("_inbox/x/{n}")).unwrap());
    frame(&Frame::Pub(m))
}

#[tokio::test]
async fn requests_held_at_the_limit_are_answered_without_more_input() {
    use hayate_client::peer::PeerOptions;
    // One request at a time, an immediate handler, and five requests (and a batch of casts)
    // in one write: everything already received must be answered although nothing more
    // arrives.
    let casts = Arc::new(AtomicUsize::new(0));
    let n = casts.clone();
    let options = PeerOptions {
        max_in_flight: 1,
        ..PeerOptions::default()
    };
    let server = PeerServer::bind_with("127.0.0.1:0", &["svc/**"], options, move |m: Message| {
        let n = n.clone();
        async move {
            let Some(to) = m.reply_to.clone() else {
                n.fetch_add(1, Ordering::SeqCst);
                return None;
            };
            Some(Message::new(to, m.payload.clone()))
        }
    })
    .await
    .unwrap();
    within(10, async {
        let mut s = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        let batch = Frame::PubBatch {
            key: Key::new("svc/cast").unwrap(),
            payloads: (0..50).map(|i| Bytes::from(format!("{i}"))).collect(),
        };
        let mut bytes = hello_and_inbox();
        for i in 0..5 {
            bytes.extend(request(i));
        }
        bytes.extend(frame(&batch));
        bytes.extend(request(5));
        bytes.extend(frame(&Frame::Ping(9)));
        s.write_all(&bytes).await.unwrap();
        let mut buf = BytesMut::new();
        let mut replies = Vec::new();
        loop {
            while let Some(f) = decode(&mut buf, 1 << 20).unwrap() {
                match f {
                    Frame::Msg { sid: 1, msg } => replies.push(msg.payload),
                    Frame::Pong(9) => {
                        let want: Vec<Bytes> = (0..6).map(|i| Bytes::from(i.to_string())).collect();
                        assert_eq!(replies, want);
                        assert_eq!(casts.load(Ordering::SeqCst), 50);
                        return;
                    }
                    Frame::Welcome(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "closed early");
        }
    })
    .await;
    server.close().await;
}

#[tokio::test]
async fn a_subscription_id_in_use_is_refused() {
    let (server, _) = adder().await;
    within(10, async {
        let mut s = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        let mut bytes = hello_and_inbox();
        let sub = Frame::Sub(hayate_native::Sub {
            sid: 1,
            qos: hayate_client::Qos::default(),
            group: None,
            expr: hayate_client::KeyExpr::new("other/**").unwrap(),
        });
        bytes.extend(frame(&sub));
        s.write_all(&bytes).await.unwrap();
        let frames = read_all(&mut s).await;
        match frames.last() {
            Some(Frame::Err { code, .. }) => assert_eq!(*code, ErrorCode::BadSubscription),
            other => panic!("expected ERR, got {other:?} in {frames:?}"),
        }
    })
    .await;
    server.close().await;
}

#[tokio::test]
async fn close_does_not_wait_forever_for_a_stuck_handler() {
    use hayate_client::peer::PeerOptions;
    let options = PeerOptions {
        drain_timeout: Duration::from_millis(200),
        ..PeerOptions::default()
    };
    let server = PeerServer::bind_with("127.0.0.1:0", &["svc/**"], options, |_m: Message| {
        futures::future::pending::<Option<Message>>()
    })
    .await
    .unwrap();
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    let k = Key::new("svc/stuck").unwrap();
    let call = tokio::spawn(async move { c.request(&k, "x", T).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    within(5, server.close()).await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert!(call.await.unwrap().is_err());
}

#[tokio::test]
async fn a_caller_that_never_reads_its_replies_is_held_and_others_carry_on() {
    use hayate_client::peer::PeerOptions;
    // Each reply is 64 KiB; the hog sends requests and never reads. The peer keeps at most
    // its output budget of replies (4 MiB) and then stops reading the hog's requests, so the
    // hog's writes stop being taken; another caller is answered meanwhile; close ends it all
    // within the drain timeout (and the linger).
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let options = PeerOptions {
        drain_timeout: Duration::from_millis(300),
        ..PeerOptions::default()
    };
    let server = PeerServer::bind_with("127.0.0.1:0", &["svc/**"], options, move |m: Message| {
        h.fetch_add(1, Ordering::SeqCst);
        async move { Some(Message::new(m.reply_to.clone()?, vec![7u8; 64 * 1024])) }
    })
    .await
    .unwrap();
    let mut hog = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let mut bytes = hello_and_inbox();
    for i in 0..100 {
        bytes.extend(request(i));
    }
    hog.write_all(&bytes).await.unwrap();
    // Keep sending requests until the peer stops taking them (a write that does not finish).
    let mut sent = 100u32;
    loop {
        let more: Vec<u8> = (0..1000).flat_map(|i| request(sent + i)).collect();
        match tokio::time::timeout(Duration::from_secs(2), hog.write_all(&more)).await {
            Ok(r) => {
                r.unwrap();
                sent += 1000;
                assert!(sent < 2_000_000, "the peer never stopped reading the hog");
            }
            Err(_) => break,
        }
    }
    let held = handled.load(Ordering::SeqCst);
    eprintln!("the peer stopped reading the hog after {held} requests");
    // Budget (4 MiB) / 64 KiB = 64 replies queued, plus what the kernel buffers took and the
    // requests in one read: far below what was sent.
    assert!(
        held < 2_000,
        "handled {held} requests of a caller that never reads"
    );
    // Another caller is served meanwhile.
    let c = Client::connect(&server.local_addr().to_string())
        .await
        .unwrap();
    let k = Key::new("svc/other").unwrap();
    let r = within(5, c.request(&k, "x", T)).await.unwrap();
    assert_eq!(r.payload.len(), 64 * 1024);
    let start = Instant::now();
    within(10, server.close()).await;
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    drop(hog);
}

#[tokio::test]
async fn silent_and_half_hello_connections_are_refused_at_the_handshake_timeout() {
    use hayate_client::peer::PeerOptions;
    // 200 connections that send nothing, and one that sends half a HELLO and stops: each
    // gets ERR (protocol) and a close at the handshake timeout; a real caller is served
    // meanwhile, and close is not held up by them.
    let options = PeerOptions {
        handshake_timeout: Duration::from_millis(300),
        ..PeerOptions::default()
    };
    let server = PeerServer::bind_with(
        "127.0.0.1:0",
        &["svc/**"],
        options,
        |m: Message| async move { Some(Message::new(m.reply_to.clone()?, "ok")) },
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    let hello = hello_and_inbox();
    half.write_all(&hello[..5]).await.unwrap();

    let c = Client::connect(&addr.to_string()).await.unwrap();
    let r = within(5, c.request(&Key::new("svc/x").unwrap(), "q", T))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"ok");

    let start = Instant::now();
    for s in silent.iter_mut().chain([&mut half]) {
        let frames = within(5, read_all(s)).await;
        match frames.last() {
            Some(Frame::Err { code, .. }) => assert_eq!(*code, ErrorCode::Protocol),
            other => panic!("expected ERR, got {other:?}"),
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // The real caller is still served after the others were refused.
    let r = within(5, c.request(&Key::new("svc/y").unwrap(), "q", T))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"ok");
    let start = Instant::now();
    within(10, server.close()).await;
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
}
