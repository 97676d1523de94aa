//! The client's RPC layer end to end through a real broker: call, round-robin, named
//! servers, cast, fan-out, version and namespace negotiation, remote errors, timeouts, and
//! the wire convention of docs/rpc.md spoken by hand.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{TestBroker, start_default, within};
use hayate_client::rpc::{RpcError, RpcServer, Target, Version};
use hayate_client::{Client, Key, Message};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(5);

/// A server of `spec` on its own connection whose handler answers `echo` with the payload,
/// `whoami` with its server name and `fail` with an error, rejects other methods, and
/// reports every request it handles on the returned channel as `(method, payload)`.
async fn start_server(
    b: &TestBroker,
    spec: Target,
) -> (Client, RpcServer, mpsc::UnboundedReceiver<(String, Bytes)>) {
    let c = Client::connect(&b.addr).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let name = spec.server.clone().unwrap();
    let server = c
        .serve(&spec, move |method: String, payload: Bytes| {
            let tx = tx.clone();
            let name = name.clone();
            async move {
                let _ = tx.send((method.clone(), payload.clone()));
                match method.as_str() {
                    "echo" => Ok(payload),
                    "whoami" => Ok(Bytes::from(name)),
                    "fail" => Err(format!("boom: {}", String::from_utf8_lossy(&payload))),
                    other => Err(format!("unknown method {other}")),
                }
            }
        })
        .await
        .unwrap();
    (c, server, rx)
}

/// Everything `rx` holds once `server`'s connection has processed what was sent before.
async fn drain(
    server: &Client,
    rx: &mut mpsc::UnboundedReceiver<(String, Bytes)>,
) -> Vec<(String, Bytes)> {
    server.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut v = Vec::new();
    while let Ok(x) = rx.try_recv() {
        v.push(x);
    }
    v
}

#[tokio::test]
async fn call_round_trip_and_remote_errors() {
    let b = start_default().await;
    let (_sc, _s, _rx) = start_server(&b, Target::new("calc").server("s1")).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let t = Target::new("calc");
    within(10, async {
        let r = c.call(&t, "echo", "hello", T).await.unwrap();
        assert_eq!(&r[..], b"hello");
        // Large-ish and empty payloads.
        let big = Bytes::from(vec![7u8; 200_000]);
        assert_eq!(c.call(&t, "echo", big.clone(), T).await.unwrap(), big);
        assert!(c.call(&t, "echo", "", T).await.unwrap().is_empty());
        match c.call(&t, "fail", "x1", T).await {
            Err(RpcError::Remote { message }) => assert_eq!(message, "boom: x1"),
            other => panic!("expected a remote error, got {other:?}"),
        }
        match c.call(&t, "nope", "", T).await {
            Err(RpcError::Remote { message }) => assert_eq!(message, "unknown method nope"),
            other => panic!("expected a remote error, got {other:?}"),
        }
        // Concurrent calls on one connection get their own replies.
        let mut tasks = Vec::new();
        for i in 0..50u32 {
            let c = c.clone();
            let t = t.clone();
            tasks.push(tokio::spawn(async move {
                let r = c.call(&t, "echo", i.to_string(), T).await.unwrap();
                assert_eq!(r, i.to_string());
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
}

#[tokio::test]
async fn calls_round_robin_across_servers_and_reach_a_named_server() {
    let b = start_default().await;
    let (_c1, _s1, _) = start_server(&b, Target::new("rr").server("a")).await;
    let (_c2, _s2, _) = start_server(&b, Target::new("rr").server("b")).await;
    let c = Client::connect(&b.addr).await.unwrap();
    within(20, async {
        let mut who = Vec::new();
        for _ in 0..20 {
            let r = c.call(&Target::new("rr"), "whoami", "", T).await.unwrap();
            who.push(String::from_utf8(r.to_vec()).unwrap());
        }
        let a = who.iter().filter(|w| *w == "a").count();
        let bn = who.iter().filter(|w| *w == "b").count();
        assert_eq!(a + bn, 20, "{who:?}");
        assert_eq!((a, bn), (10, 10), "not round-robin: {who:?}");
        // A named server gets every call addressed to it.
        for name in ["b", "a", "b"] {
            for _ in 0..5 {
                let r = c
                    .call(&Target::new("rr").server(name), "whoami", "", T)
                    .await
                    .unwrap();
                assert_eq!(r, name);
            }
        }
        // A name nobody serves: no reply.
        assert!(matches!(
            c.call(
                &Target::new("rr").server("zz"),
                "whoami",
                "",
                Duration::from_millis(200)
            )
            .await,
            Err(RpcError::Timeout)
        ));
    })
    .await;
}

#[tokio::test]
async fn cast_reaches_one_server_and_fanout_reaches_every_server() {
    let b = start_default().await;
    let mut servers = Vec::new();
    for name in ["a", "b", "c"] {
        servers.push(start_server(&b, Target::new("fan").server(name)).await);
    }
    let c = Client::connect(&b.addr).await.unwrap();
    within(20, async {
        // A cast to the topic is handled by exactly one server.
        c.cast(&Target::new("fan"), "echo", "cast-1").await.unwrap();
        c.flush().await.unwrap();
        let mut got = Vec::new();
        for (sc, _, rx) in &mut servers {
            got.push(drain(sc, rx).await);
        }
        let total: usize = got.iter().map(Vec::len).sum();
        assert_eq!(total, 1, "{got:?}");
        let (m, p) = got.iter().flatten().next().unwrap();
        assert_eq!((m.as_str(), &p[..]), ("echo", &b"cast-1"[..]));
        // A cast to a named server is handled by that one.
        c.cast(&Target::new("fan").server("c"), "whoami", "cast-2")
            .await
            .unwrap();
        c.flush().await.unwrap();
        for (i, (sc, _, rx)) in servers.iter_mut().enumerate() {
            let got = drain(sc, rx).await;
            if i == 2 {
                assert_eq!(got.len(), 1, "{got:?}");
                assert_eq!(got[0].1, "cast-2");
            } else {
                assert!(got.is_empty(), "server {i} got {got:?}");
            }
        }
        // A fan-out is handled once by every server, whatever `server` says.
        c.fanout(&Target::new("fan").server("a"), "echo", "all")
            .await
            .unwrap();
        c.flush().await.unwrap();
        for (i, (sc, _, rx)) in servers.iter_mut().enumerate() {
            let got = drain(sc, rx).await;
            assert_eq!(got.len(), 1, "server {i} got {got:?}");
            assert_eq!((got[0].0.as_str(), &got[0].1[..]), ("echo", &b"all"[..]));
        }
    })
    .await;
}

#[tokio::test]
async fn versions_are_negotiated() {
    let b = start_default().await;
    let spec = Target::new("v").server("s").version(Version::new(1, 3));
    let (sc, _s, mut rx) = start_server(&b, spec).await;
    let c = Client::connect(&b.addr).await.unwrap();
    within(10, async {
        for ok in [Version::new(1, 0), Version::new(1, 3)] {
            let t = Target::new("v").version(ok);
            assert_eq!(c.call(&t, "echo", "x", T).await.unwrap(), "x");
        }
        for (bad, text) in [
            (
                Version::new(1, 4),
                "unsupported version 1.4; server speaks 1.3",
            ),
            (
                Version::new(2, 1),
                "unsupported version 2.1; server speaks 1.3",
            ),
            (
                Version::new(0, 9),
                "unsupported version 0.9; server speaks 1.3",
            ),
        ] {
            let t = Target::new("v").version(bad);
            let e = c.call(&t, "echo", "x", T).await.unwrap_err();
            match &e {
                RpcError::UnsupportedVersion { requested, server } => {
                    assert_eq!((*requested, *server), (bad, Version::new(1, 3)));
                }
                other => panic!("expected UnsupportedVersion, got {other:?}"),
            }
            assert_eq!(e.to_string(), text);
        }
        // The handler saw only the two compatible calls; an incompatible cast is dropped.
        c.cast(&Target::new("v").version(Version::new(2, 0)), "echo", "c")
            .await
            .unwrap();
        c.flush().await.unwrap();
        let seen = drain(&sc, &mut rx).await;
        assert_eq!(seen.len(), 2, "{seen:?}");
    })
    .await;
}

#[tokio::test]
async fn namespaces_must_match() {
    let b = start_default().await;
    let (_c1, _s1, _) = start_server(&b, Target::new("ns").server("a").namespace("alpha")).await;
    let (_c2, _s2, _) = start_server(&b, Target::new("plain").server("p")).await;
    let c = Client::connect(&b.addr).await.unwrap();
    within(10, async {
        let ok = Target::new("ns").namespace("alpha");
        assert_eq!(c.call(&ok, "echo", "1", T).await.unwrap(), "1");
        for (t, req) in [
            (Target::new("ns").namespace("beta"), Some("beta")),
            (Target::new("ns"), None),
        ] {
            match c.call(&t, "echo", "1", T).await {
                Err(RpcError::NamespaceMismatch { requested, server }) => {
                    assert_eq!(requested.as_deref(), req);
                    assert_eq!(server.as_deref(), Some("alpha"));
                }
                other => panic!("expected NamespaceMismatch, got {other:?}"),
            }
        }
        assert_eq!(
            c.call(&Target::new("plain"), "echo", "2", T).await.unwrap(),
            "2"
        );
        match c
            .call(&Target::new("plain").namespace("alpha"), "echo", "2", T)
            .await
        {
            Err(RpcError::NamespaceMismatch { requested, server }) => {
                assert_eq!(requested.as_deref(), Some("alpha"));
                assert_eq!(server, None);
            }
            other => panic!("expected NamespaceMismatch, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn timeouts_without_a_server_and_after_the_server_stops() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let t = Target::new("gone");
    within(10, async {
        let start = std::time::Instant::now();
        let r = c.call(&t, "echo", "x", Duration::from_millis(200)).await;
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
        assert!(start.elapsed() >= Duration::from_millis(200));
        // A server answers while it runs...
        let (_sc, server, _) = start_server(&b, Target::new("gone").server("s")).await;
        assert_eq!(c.call(&t, "echo", "x", T).await.unwrap(), "x");
        // ...and not once closed.
        server.close().await;
        let r = c.call(&t, "echo", "x", Duration::from_millis(200)).await;
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
        // Dropping the handle stops serving too.
        let (sc, server, _) = start_server(&b, Target::new("gone").server("s")).await;
        assert_eq!(c.call(&t, "echo", "y", T).await.unwrap(), "y");
        drop(server);
        sc.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        sc.flush().await.unwrap();
        let r = c.call(&t, "echo", "y", Duration::from_millis(200)).await;
        assert!(matches!(r, Err(RpcError::Timeout)), "{r:?}");
    })
    .await;
}

#[tokio::test]
async fn invalid_targets_are_refused_locally() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    for t in [
        Target::new("a/b"),
        Target::new(""),
        Target::new("*"),
        Target::new("t").server("x/y"),
    ] {
        assert!(
            matches!(
                c.call(&t, "m", "", T).await,
                Err(RpcError::InvalidTarget(_))
            ),
            "{t:?}"
        );
    }
    assert!(matches!(
        c.serve(&Target::new("t"), |_m: String, p: Bytes| async move {
            Ok::<_, String>(p)
        })
        .await,
        Err(RpcError::InvalidTarget(_))
    ));
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a [u8]> {
    m.headers
        .as_ref()?
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| &v[..])
}

/// docs/rpc.md spoken by hand: a plain request to an RPC server, and an RPC call answered
/// by a plain subscriber.
#[tokio::test]
async fn the_wire_convention_is_as_documented() {
    let b = start_default().await;
    let (_sc, _s, _) = start_server(
        &b,
        Target::new("wire")
            .server("w")
            .namespace("n")
            .version(Version::new(3, 2)),
    )
    .await;
    let raw = Client::connect(&b.addr).await.unwrap();
    let mut replies = raw.subscribe("raw/replies").await.unwrap();
    raw.flush().await.unwrap();
    let send = |key: &str, headers: Vec<(&str, &str)>, payload: &'static str| {
        let mut m = Message::new(Key::new(key).unwrap(), payload);
        m.reply_to = Some(Key::new("raw/replies").unwrap());
        m.correlation_id = Some(Bytes::from_static(b"corr-1"));
        m.headers = Some(
            headers
                .into_iter()
                .map(|(n, v)| (n.to_string(), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
        );
        let raw = raw.clone();
        async move { raw.publish_message(&m).await.unwrap() }
    };
    within(10, async {
        send(
            "rpc/wire",
            vec![
                ("rpc-method", "echo"),
                ("rpc-version", "3.1"),
                ("rpc-namespace", "n"),
            ],
            "p1",
        )
        .await;
        let r = replies.next().await.unwrap();
        assert_eq!(header(&r, "rpc-status"), Some(&b"ok"[..]));
        assert_eq!(r.correlation_id.as_deref(), Some(&b"corr-1"[..]));
        assert_eq!(&r.payload[..], b"p1");

        send(
            "rpc/wire/server/w",
            vec![
                ("rpc-method", "echo"),
                ("rpc-version", "3.3"),
                ("rpc-namespace", "n"),
            ],
            "p2",
        )
        .await;
        let r = replies.next().await.unwrap();
        assert_eq!(header(&r, "rpc-status"), Some(&b"error"[..]));
        assert_eq!(header(&r, "rpc-error"), Some(&b"unsupported-version"[..]));
        assert_eq!(header(&r, "rpc-version"), Some(&b"3.2"[..]));
        assert_eq!(
            &r.payload[..],
            b"unsupported version 3.3; server speaks 3.2"
        );

        send("rpc/wire", vec![("rpc-method", "echo")], "p3").await;
        let r = replies.next().await.unwrap();
        assert_eq!(header(&r, "rpc-error"), Some(&b"unsupported-version"[..]));

        send("rpc/wire", vec![("rpc-version", "3.0")], "p4").await;
        let r = replies.next().await.unwrap();
        assert_eq!(header(&r, "rpc-error"), Some(&b"bad-request"[..]));

        send(
            "rpc/wire",
            vec![
                ("rpc-method", "fail"),
                ("rpc-version", "3.0"),
                ("rpc-namespace", "n"),
            ],
            "p5",
        )
        .await;
        let r = replies.next().await.unwrap();
        assert_eq!(header(&r, "rpc-status"), Some(&b"error"[..]));
        assert_eq!(header(&r, "rpc-error"), Some(&b"remote"[..]));
        assert_eq!(&r.payload[..], b"boom: p5");
    })
    .await;

    // A hand-written server: a plain queue subscriber on rpc/<topic> answering with
    // rpc-status headers.
    let hand = Client::connect(&b.addr).await.unwrap();
    let mut reqs = hand.queue_subscribe("rpc/hand", "rpc/hand").await.unwrap();
    hand.flush().await.unwrap();
    let h2 = hand.clone();
    tokio::spawn(async move {
        while let Some(m) = reqs.next().await {
            let method = header(&m, "rpc-method").unwrap().to_vec();
            let version = header(&m, "rpc-version").unwrap().to_vec();
            let mut r = Message::new(m.reply_to.clone().unwrap(), m.payload.clone());
            r.correlation_id = m.correlation_id.clone();
            r.headers = Some(if method == b"echo" {
                assert_eq!(version, b"1.0");
                vec![("rpc-status".into(), Bytes::from_static(b"ok"))]
            } else {
                vec![
                    ("rpc-status".into(), Bytes::from_static(b"error")),
                    ("rpc-error".into(), Bytes::from_static(b"remote")),
                ]
            });
            h2.publish_message(&r).await.unwrap();
        }
    });
    let c = Client::connect(&b.addr).await.unwrap();
    within(10, async {
        let t = Target::new("hand");
        assert_eq!(c.call(&t, "echo", "hi", T).await.unwrap(), "hi");
        match c.call(&t, "other", "why", T).await {
            Err(RpcError::Remote { message }) => assert_eq!(message, "why"),
            other => panic!("expected a remote error, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn a_server_answers_through_the_broker_and_directly() {
    use hayate_client::rpc::ServeOptions;
    let b = start_default().await;
    let sc = Client::connect(&b.addr).await.unwrap();
    let spec = Target::new("both").server("s1");
    let server = sc
        .serve_with(
            &spec,
            ServeOptions {
                direct: Some("127.0.0.1:0".into()),
            },
            |_m: String, p: Bytes| async move { Ok::<_, String>(p) },
        )
        .await
        .unwrap();
    let direct = server.direct_addr().expect("a direct listener");
    let via_broker = Client::connect(&b.addr).await.unwrap();
    let peer = Client::connect(&direct.to_string()).await.unwrap();
    within(10, async {
        let t = Target::new("both");
        assert_eq!(&via_broker.call(&t, "m", "b", T).await.unwrap()[..], b"b");
        assert_eq!(&peer.call(&t, "m", "d", T).await.unwrap()[..], b"d");
        server.close().await;
        // Both ways are closed.
        assert!(matches!(
            via_broker
                .call(&t, "m", "b", Duration::from_millis(300))
                .await,
            Err(RpcError::Timeout) | Err(RpcError::Client(_))
        ));
        while !peer.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}
