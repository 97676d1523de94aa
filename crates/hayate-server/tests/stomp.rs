//! STOMP end to end over raw frames (our codec as the client): queues with backlog and
//! redelivery, transactions, temp-queue request/reply, receipts, errors, heart-beats and
//! routing to and from the native protocol. stomp.py covers the same list in tests/interop.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{start, start_default, within};
use hayate_client::{Client, Key};
use hayate_stomp::{Command, Frame, Item, Limits, Version, decode, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Stomp {
    s: TcpStream,
    buf: BytesMut,
}

impl Stomp {
    async fn connect(addr: &str) -> Stomp {
        Stomp::connect_with(addr, &[]).await
    }

    async fn connect_with(addr: &str, extra: &[(&str, &str)]) -> Stomp {
        let mut c = Stomp {
            s: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        };
        let mut f = Frame::new(Command::Connect)
            .header("accept-version", "1.2")
            .header("host", "test");
        for (k, v) in extra {
            f = f.header(k, v);
        }
        c.send(f).await;
        let r = c.next().await.expect("CONNECTED");
        assert_eq!(r.command, Command::Connected, "{r:?}");
        assert_eq!(r.get("version"), Some("1.2"));
        c
    }

    async fn send(&mut self, f: Frame) {
        let mut b = BytesMut::new();
        encode(&f, Version::V1_2, &mut b);
        self.s.write_all(&b).await.unwrap();
    }

    /// The next frame (heart-beats skipped), `None` at end of stream.
    async fn next(&mut self) -> Option<Frame> {
        within(10, async {
            loop {
                match decode(&mut self.buf, Version::V1_2, &Limits::default()).unwrap() {
                    Some(Item::Frame(f)) => return Some(f),
                    Some(Item::HeartBeat) => continue,
                    None => {}
                }
                if self.s.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                    return None;
                }
            }
        })
        .await
    }

    /// Sends `f` with a receipt and waits for the RECEIPT: everything before it was handled.
    async fn sync(&mut self, f: Frame) {
        self.send(f.header("receipt", "sync")).await;
        let r = self.next().await.expect("RECEIPT");
        assert_eq!(r.command, Command::Receipt, "{r:?}");
        assert_eq!(r.get("receipt-id"), Some("sync"));
    }

    async fn subscribe(&mut self, id: &str, dest: &str, ack: &str) {
        self.sync(
            Frame::new(Command::Subscribe)
                .header("id", id)
                .header("destination", dest)
                .header("ack", ack),
        )
        .await;
    }

    async fn publish(&mut self, dest: &str, body: &str) {
        self.send(
            Frame::new(Command::Send)
                .header("destination", dest)
                .body(body.to_string()),
        )
        .await;
    }

    /// Nothing arrives within `ms` milliseconds.
    async fn quiet(&mut self, ms: u64) {
        let r = tokio::time::timeout(Duration::from_millis(ms), self.next()).await;
        assert!(r.is_err(), "unexpected frame: {r:?}");
    }
}

fn body(f: &Frame) -> &str {
    std::str::from_utf8(&f.body).unwrap()
}

#[tokio::test]
async fn queue_keeps_messages_until_a_consumer_and_redelivers_nacks() {
    let b = start_default().await;
    let mut p = Stomp::connect(&b.stomp).await;
    // Sent before any consumer: they wait in the queue.
    p.publish("/queue/jobs", "j1").await;
    p.sync(
        Frame::new(Command::Send)
            .header("destination", "/queue/jobs")
            .body("j2"),
    )
    .await;

    let mut a = Stomp::connect(&b.stomp).await;
    a.send(
        Frame::new(Command::Subscribe)
            .header("id", "s")
            .header("destination", "/queue/jobs")
            .header("ack", "client-individual"),
    )
    .await;
    let m1 = a.next().await.unwrap();
    let m2 = a.next().await.unwrap();
    assert_eq!((body(&m1), body(&m2)), ("j1", "j2"));
    assert_eq!(m1.get("destination"), Some("/queue/jobs"));

    // A second consumer; a NACK from the first sends the message to it.
    let mut c = Stomp::connect(&b.stomp).await;
    c.subscribe("s", "/queue/jobs", "client-individual").await;
    a.sync(Frame::new(Command::Nack).header("id", m1.get("ack").unwrap()))
        .await;
    let again = c.next().await.unwrap();
    assert_eq!(body(&again), "j1");
    // j2 is unacknowledged when its consumer goes away: it goes to the other one.
    drop(a);
    let again = c.next().await.unwrap();
    assert_eq!(body(&again), "j2");
    c.sync(Frame::new(Command::Ack).header("id", again.get("ack").unwrap()))
        .await;
}

#[tokio::test]
async fn queue_consumers_share_the_work() {
    let b = start_default().await;
    let mut a = Stomp::connect(&b.stomp).await;
    a.subscribe("1", "/queue/share", "auto").await;
    let mut c = Stomp::connect(&b.stomp).await;
    c.subscribe("1", "/queue/share", "auto").await;
    let mut p = Stomp::connect(&b.stomp).await;
    for i in 0..10 {
        p.publish("/queue/share", &i.to_string()).await;
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(body(&a.next().await.unwrap()).to_string());
        got.push(body(&c.next().await.unwrap()).to_string());
    }
    got.sort_by_key(|s| s.parse::<u32>().unwrap());
    assert_eq!(got, (0..10).map(|i| i.to_string()).collect::<Vec<_>>());
}

#[tokio::test]
async fn transactions_take_effect_at_commit_only() {
    let b = start_default().await;
    let mut s = Stomp::connect(&b.stomp).await;
    s.subscribe("t", "/topic/tx/*", "auto").await;
    let mut p = Stomp::connect(&b.stomp).await;
    p.send(Frame::new(Command::Begin).header("transaction", "t1"))
        .await;
    p.send(
        Frame::new(Command::Send)
            .header("destination", "/topic/tx/a")
            .header("transaction", "t1")
            .body("in t1"),
    )
    .await;
    p.send(Frame::new(Command::Begin).header("transaction", "t2"))
        .await;
    p.send(
        Frame::new(Command::Send)
            .header("destination", "/topic/tx/a")
            .header("transaction", "t2")
            .body("in t2"),
    )
    .await;
    p.sync(Frame::new(Command::Abort).header("transaction", "t2"))
        .await;
    s.quiet(200).await;
    p.sync(Frame::new(Command::Commit).header("transaction", "t1"))
        .await;
    assert_eq!(body(&s.next().await.unwrap()), "in t1");
    s.quiet(200).await;

    // An unknown transaction is an error, and the connection closes.
    p.send(Frame::new(Command::Commit).header("transaction", "nope"))
        .await;
    let e = p.next().await.unwrap();
    assert_eq!(e.command, Command::Error);
    assert_eq!(e.get("message"), Some("unknown transaction"));
    assert!(p.next().await.is_none());
}

#[tokio::test]
async fn temp_queue_request_reply_reaches_only_the_requester() {
    let b = start_default().await;
    let mut server = Stomp::connect(&b.stomp).await;
    server.subscribe("svc", "/queue/svc", "auto").await;
    let mut r1 = Stomp::connect(&b.stomp).await;
    let mut r2 = Stomp::connect(&b.stomp).await;
    for (r, n) in [(&mut r1, "1"), (&mut r2, "2")] {
        r.send(
            Frame::new(Command::Send)
                .header("destination", "/queue/svc")
                .header("reply-to", "/temp-queue/answers")
                .header("correlation-id", n)
                .body(n.to_string()),
        )
        .await;
    }
    for _ in 0..2 {
        let req = server.next().await.unwrap();
        let to = req.get("reply-to").unwrap().to_string();
        assert!(to.starts_with("/queue/_inbox/"), "{to}");
        server.publish(&to, &format!("{}+1", body(&req))).await;
    }
    for (r, n) in [(&mut r1, "1"), (&mut r2, "2")] {
        let m = r.next().await.unwrap();
        assert_eq!(body(&m), format!("{n}+1"));
        assert_eq!(m.get("subscription"), Some("/temp-queue/answers"));
        r.quiet(100).await;
    }
}

#[tokio::test]
async fn stomp_and_native_clients_see_each_other() {
    let b = start_default().await;
    let native = Client::connect(&b.addr).await.unwrap();
    let mut ns = native.subscribe("x/**").await.unwrap();
    native.flush().await.unwrap();
    let mut s = Stomp::connect(&b.stomp).await;
    s.subscribe("x", "/topic/x/*", "auto").await;
    s.send(
        Frame::new(Command::Send)
            .header("destination", "/topic/x/from-stomp")
            .header("content-type", "text/plain")
            .body("hi native"),
    )
    .await;
    let m = within(10, ns.next()).await.unwrap();
    assert_eq!(
        (m.key.as_str(), &m.payload[..]),
        ("x/from-stomp", &b"hi native"[..])
    );
    // STOMP's own message comes back to it too (fan-out), with its header.
    let own = s.next().await.unwrap();
    assert_eq!(own.get("content-type"), Some("text/plain"));

    native
        .publish(&Key::new("x/from-native").unwrap(), "hi stomp")
        .await
        .unwrap();
    native.flush().await.unwrap();
    let m = s.next().await.unwrap();
    assert_eq!(
        (m.get("destination"), body(&m)),
        (Some("/topic/x/from-native"), "hi stomp")
    );

    // A native request answered over STOMP: the reply-to is the native inbox.
    let mut svc = Stomp::connect(&b.stomp).await;
    svc.subscribe("svc", "/topic/svc/echo", "auto").await;
    let req = tokio::spawn(async move {
        native
            .request(
                &Key::new("svc/echo").unwrap(),
                "ping",
                Duration::from_secs(5),
            )
            .await
    });
    let m = svc.next().await.unwrap();
    let to = m.get("reply-to").unwrap().to_string();
    svc.publish(&to, "pong").await;
    let reply = within(10, req).await.unwrap().unwrap();
    assert_eq!(&reply.payload[..], b"pong");
}

#[tokio::test]
async fn malformed_frames_get_an_error_and_a_close() {
    let b = start_default().await;
    let mut s = Stomp::connect(&b.stomp).await;
    s.s.write_all(b"BOGUS\n\n\0").await.unwrap();
    let e = s.next().await.unwrap();
    assert_eq!(e.command, Command::Error);
    assert!(e.get("message").is_some());
    assert!(s.next().await.is_none());

    // A frame before CONNECT.
    let mut raw = TcpStream::connect(&b.stomp).await.unwrap();
    raw.write_all(b"SEND\ndestination:/topic/a\n\nx\0")
        .await
        .unwrap();
    let mut out = Vec::new();
    within(10, raw.read_to_end(&mut out)).await.unwrap();
    assert!(
        out.starts_with(b"ERROR\n"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );

    // Others carry on.
    let mut ok = Stomp::connect(&b.stomp).await;
    ok.subscribe("1", "/topic/ok", "auto").await;
    ok.publish("/topic/ok", "fine").await;
    assert_eq!(body(&ok.next().await.unwrap()), "fine");
}

#[tokio::test]
async fn silent_client_is_dropped_after_twice_its_heart_beat() {
    let mut config = hayate_server::Config::default();
    config.stomp.heart_beat_ms = 200;
    let b = start(config).await;
    let mut s = Stomp::connect_with(&b.stomp, &[("heart-beat", "200,0")]).await;
    let started = std::time::Instant::now();
    let e = s.next().await.unwrap();
    assert_eq!(e.command, Command::Error);
    assert_eq!(e.get("message"), Some("heart-beat timeout"));
    assert!(s.next().await.is_none());
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn bad_credentials_are_refused() {
    let mut config = hayate_server::Config::default();
    config.auth.allow_anonymous = Some(false);
    config.auth.users.insert(
        "alice".into(),
        hayate_server::config::UserConfig::with_password("secret").unwrap(),
    );
    let b = start(config).await;
    let _ok = Stomp::connect_with(&b.stomp, &[("login", "alice"), ("passcode", "secret")]).await;
    let mut raw = TcpStream::connect(&b.stomp).await.unwrap();
    raw.write_all(b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:wrong\n\n\0")
        .await
        .unwrap();
    let mut out = Vec::new();
    within(10, raw.read_to_end(&mut out)).await.unwrap();
    assert!(
        out.starts_with(b"ERROR\n"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}

/// Transactions are bounded per connection: at most 64 open, and what they hold at most
/// 64 MiB (within the memory budget); past either, an ERROR and a close (before: no bound,
/// and the buffered bodies were not charged to the budget).
#[tokio::test]
async fn transactions_are_bounded() {
    let b = start_default().await;
    let mut p = Stomp::connect(&b.stomp).await;
    for i in 0..64 {
        p.send(Frame::new(Command::Begin).header("transaction", &format!("t{i}")))
            .await;
    }
    p.sync(Frame::new(Command::Abort).header("transaction", "t0"))
        .await;
    p.send(Frame::new(Command::Begin).header("transaction", "again"))
        .await;
    p.send(Frame::new(Command::Begin).header("transaction", "one-too-many"))
        .await;
    let e = p.next().await.unwrap();
    assert_eq!(e.command, Command::Error, "{e:?}");
    assert_eq!(e.get("message"), Some("too many transactions"));
    assert!(p.next().await.is_none());

    let mut p = Stomp::connect(&b.stomp).await;
    p.send(Frame::new(Command::Begin).header("transaction", "big"))
        .await;
    let mb = "x".repeat(1 << 20);
    let mut error = None;
    for _ in 0..80 {
        p.send(
            Frame::new(Command::Send)
                .header("destination", "/topic/tx/big")
                .header("transaction", "big")
                .body(mb.clone()),
        )
        .await;
        if let Ok(f) = tokio::time::timeout(Duration::from_millis(1), p.next()).await {
            error = f;
            break;
        }
    }
    let e = match error {
        Some(e) => e,
        None => p.next().await.expect("an ERROR"),
    };
    assert_eq!(e.command, Command::Error, "{e:?}");
    assert_eq!(e.get("message"), Some("transaction too large"));
    b.shutdown().await;
}

/// A `/queue/` is declared only by a publish or a subscription the user is allowed: a
/// refused SEND or SUBSCRIBE leaves no queue behind (before, the queue was declared first,
/// for good, and the permission checked after).
#[tokio::test]
async fn refused_sends_and_subscriptions_declare_no_queue() {
    use hayate_server::config::{Permissions, UserConfig};
    let mut config = hayate_server::Config::default();
    config.auth.allow_anonymous = Some(false);
    let mut eve = UserConfig::with_password("pw").unwrap();
    eve.permissions = Permissions {
        publish: Some(vec!["mine/**".into()]),
        serve: Some(vec!["mine/**".into()]),
        ..Permissions::default()
    };
    config.auth.users.insert("eve".into(), eve);
    let b = start(config).await;
    let login = [("login", "eve"), ("passcode", "pw")];
    let mut c = Stomp::connect_with(&b.stomp, &login).await;
    c.publish("/queue/theirs", "x").await;
    let e = c.next().await.unwrap();
    assert_eq!(e.get("message"), Some("access refused"), "{e:?}");
    let mut c = Stomp::connect_with(&b.stomp, &login).await;
    c.send(
        Frame::new(Command::Subscribe)
            .header("id", "1")
            .header("destination", "/queue/other"),
    )
    .await;
    let e = c.next().await.unwrap();
    assert_eq!(e.get("message"), Some("access refused"), "{e:?}");
    let mut c = Stomp::connect_with(&b.stomp, &login).await;
    c.sync(
        Frame::new(Command::Send)
            .header("destination", "/queue/mine/q")
            .body("ok"),
    )
    .await;
    let names: Vec<String> = b.broker.queues().into_iter().map(|q| q.name).collect();
    assert!(names.iter().any(|n| n.contains("mine/q")), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.contains("theirs") || n.contains("other")),
        "{names:?}"
    );
    b.shutdown().await;
}

/// A configured user may consume from `/queue/<name>`, in-memory or durable (a stream
/// captures it), exactly when its `serve` rule (or `subscribe`, when `serve` is set nowhere)
/// allows the queue's key; one whose rules do not gets an ERROR. Before, every configured
/// user was refused every `/queue/` ("not authorized to serve"), even one without rules:
/// the guard each configured user's subscription gets was taken for a refusal.
#[tokio::test]
async fn configured_users_consume_queues_their_rules_allow() {
    use hayate_server::config::{Permissions, UserConfig};
    let d = std::env::temp_dir().join(format!("hayate-srv-stomp-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let mut config = hayate_server::Config::default();
    config.server.data_dir = d.to_string_lossy().into_owned();
    let mut s = hayate_broker::StreamConfig::new("durable", &["durable/**"]);
    s.fsync = "never".into();
    config.stream.push(s);
    config.auth.allow_anonymous = Some(false);
    let user = |p: Permissions| {
        let mut u = UserConfig::with_password("pw").unwrap();
        u.permissions = p;
        u
    };
    // alice serves jobs/** and durable/**; bob has a subscribe rule only (serve takes it),
    // on bob/**; carol has no rules at all.
    config.auth.users.insert(
        "alice".into(),
        user(Permissions {
            serve: Some(vec!["jobs/**".into(), "durable/**".into()]),
            ..Permissions::default()
        }),
    );
    config.auth.users.insert(
        "bob".into(),
        user(Permissions {
            subscribe: Some(vec!["bob/**".into()]),
            ..Permissions::default()
        }),
    );
    config
        .auth
        .users
        .insert("carol".into(), user(Permissions::default()));
    let b = start(config).await;
    let login = |u: &'static str| [("login", u), ("passcode", "pw")];

    let mut carol = Stomp::connect_with(&b.stomp, &login("carol")).await;
    let mut alice = Stomp::connect_with(&b.stomp, &login("alice")).await;
    alice
        .subscribe("mem", "/queue/jobs/x", "client-individual")
        .await;
    alice
        .subscribe("dur", "/queue/durable/q", "client-individual")
        .await;
    for (dest, body_text) in [("/queue/jobs/x", "job"), ("/queue/durable/q", "kept")] {
        carol
            .sync(
                Frame::new(Command::Send)
                    .header("destination", dest)
                    .body(body_text.to_string()),
            )
            .await;
        let m = alice.next().await.expect("a MESSAGE");
        assert_eq!(m.command, Command::Message, "{m:?}");
        assert_eq!(body(&m), body_text);
        assert_eq!(m.get("destination"), Some(dest));
        alice
            .send(Frame::new(Command::Ack).header("id", m.get("ack").unwrap()))
            .await;
    }

    // bob may not serve either queue: an ERROR and a close, each time.
    for dest in ["/queue/jobs/x", "/queue/durable/q"] {
        let mut bob = Stomp::connect_with(&b.stomp, &login("bob")).await;
        bob.send(
            Frame::new(Command::Subscribe)
                .header("id", "1")
                .header("destination", dest),
        )
        .await;
        let e = bob.next().await.expect("an ERROR");
        assert_eq!(e.command, Command::Error, "{dest}: {e:?}");
        assert_eq!(e.get("message"), Some("access refused"), "{e:?}");
        assert!(bob.next().await.is_none(), "{dest}: not closed");
    }
    // ... but his own queue is his to serve.
    let mut bob = Stomp::connect_with(&b.stomp, &login("bob")).await;
    bob.subscribe("own", "/queue/bob/work", "auto").await;
    carol.publish("/queue/bob/work", "for bob").await;
    let m = bob.next().await.expect("a MESSAGE");
    assert_eq!(body(&m), "for bob", "{m:?}");

    // A user without rules may consume any queue.
    carol.subscribe("free", "/queue/free/y", "auto").await;
    alice.publish("/queue/free/y", "free").await;
    let m = carol.next().await.expect("a MESSAGE");
    assert_eq!(body(&m), "free", "{m:?}");
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// The consumers a STOMP SUBSCRIBE makes for durable queues count against the user's
/// `limits.max_consumers_per_user`, as those made through the stream API do. Before, they
/// were counted only by the per-stream limit: a user allowed to serve some keys of another
/// user's stream could fill all its `limits.max_consumers` places by subscribing to distinct
/// queue names (each makes `stomp-<name>`), and lock its owner out of `consumer/add`.
#[tokio::test]
async fn durable_queue_consumers_count_against_their_makers_limit() {
    use hayate_server::config::{Permissions, UserConfig};
    let d = std::env::temp_dir().join(format!("hayate-srv-stomp-limit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let mut config = hayate_server::Config::default();
    config.server.data_dir = d.to_string_lossy().into_owned();
    config.limits.max_consumers_per_user = 2;
    let mut s = hayate_broker::StreamConfig::new("shared", &["shared/**"]);
    s.fsync = "never".into();
    config.stream.push(s);
    config.auth.allow_anonymous = Some(false);
    let mut bob = UserConfig::with_password("pw").unwrap();
    bob.permissions = Permissions {
        serve: Some(vec!["shared/bob/**".into()]),
        ..Permissions::default()
    };
    config.auth.users.insert("bob".into(), bob);
    let b = start(config).await;
    let mut bob = Stomp::connect_with(&b.stomp, &[("login", "bob"), ("passcode", "pw")]).await;
    bob.subscribe("1", "/queue/shared/bob/1", "client-individual")
        .await;
    bob.subscribe("2", "/queue/shared/bob/2", "client-individual")
        .await;
    bob.send(
        Frame::new(Command::Subscribe)
            .header("id", "3")
            .header("destination", "/queue/shared/bob/3")
            .header("ack", "client-individual"),
    )
    .await;
    let e = bob.next().await.expect("an ERROR");
    assert_eq!(e.command, Command::Error, "{e:?}");
    assert!(body(&e).contains("max_consumers_per_user"), "{e:?}");
    // Joining a queue whose consumer exists makes none: still allowed.
    let mut again = Stomp::connect_with(&b.stomp, &[("login", "bob"), ("passcode", "pw")]).await;
    again
        .subscribe("1", "/queue/shared/bob/1", "client-individual")
        .await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}
