//! Streams over the native protocol: publish confirms, the stream and consumer API, durable
//! consumers (acks, NACK with delay, ack timeout, work queue, disconnect, dead letters,
//! scheduled delivery, restart).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{start, within};
use hayate_client::streams::{ConsumerConfig, Start, StreamConfig};
use hayate_client::{Client, ConfirmOutcome, Error, Key, Message};
use hayate_server::Config;

fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn data_dir(name: &str) -> (Config, Dir) {
    let d = std::env::temp_dir().join(format!("hayate-srv-streams-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let mut c = Config::default();
    c.server.data_dir = d.to_string_lossy().into_owned();
    (c, Dir(d))
}

fn stream(name: &str, capture: &str, fsync: &str) -> StreamConfig {
    let mut s = StreamConfig::new(name, &[capture]);
    s.fsync = fsync.into();
    s
}

async fn publish_n(c: &Client, k: &str, n: u32) -> Vec<u64> {
    let mut offsets = Vec::new();
    for i in 0..n {
        match c
            .publish_confirmed(&Message::new(key(k), i.to_string()))
            .await
            .unwrap()
        {
            ConfirmOutcome::Stored { offset, .. } => offsets.push(offset),
            other => panic!("{other:?}"),
        }
    }
    offsets
}

#[tokio::test]
async fn confirms_and_the_stream_api() {
    let (config, _d) = data_dir("api");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let api = c.streams();
    let (info, created) = api
        .add(&stream("orders", "orders/**", "always"))
        .await
        .unwrap();
    assert!(created);
    assert_eq!((info.first, info.next), (0, 0));
    assert!(
        !api.add(&stream("orders", "orders/**", "always"))
            .await
            .unwrap()
            .1
    );
    assert!(matches!(
        api.add(&stream("orders", "x", "always")).await,
        Err(Error::Api(_))
    ));
    assert!(matches!(
        api.add(&stream("bad name", "x", "always")).await,
        Err(Error::Api(_))
    ));
    assert!(matches!(
        api.add(&stream("ok", "a//b", "always")).await,
        Err(Error::Api(_))
    ));
    assert_eq!(publish_n(&c, "orders/eu/1", 5).await, vec![0, 1, 2, 3, 4]);
    let other = c
        .publish_confirmed(&Message::new(key("other/x"), "z"))
        .await
        .unwrap();
    assert_eq!(other, ConfirmOutcome::NotCaptured);
    api.add(&stream("fast", "fast/*", "interval=50"))
        .await
        .unwrap();
    assert_eq!(publish_n(&c, "fast/x", 3).await, vec![0, 1, 2]);
    let names: Vec<String> = api
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.config.name)
        .collect();
    assert_eq!(names, vec!["fast", "orders"]);
    let info = api.info("orders").await.unwrap();
    assert_eq!((info.records, info.confirmed), (5, 5));
    assert_eq!(api.purge("orders").await.unwrap().records, 5);
    assert_eq!(
        publish_n(&c, "orders/x", 1).await,
        vec![5],
        "offsets go on after a purge"
    );
    api.remove("orders").await.unwrap();
    assert!(matches!(api.info("orders").await, Err(Error::Api(_))));
    assert_eq!(
        c.publish_confirmed(&Message::new(key("orders/x"), "z"))
            .await
            .unwrap(),
        ConfirmOutcome::NotCaptured
    );
    // Unknown API operations get an error reply, not silence.
    let r = c
        .request(
            &key("$hayate/api/stream/nope"),
            "{}",
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&r.payload).contains("unknown stream operation"));
}

async fn consumer(c: &Client, cfg: ConsumerConfig) {
    c.streams().consumer_add(&cfg).await.unwrap();
}

#[tokio::test]
async fn a_durable_consumer_delivers_each_message_and_acks_free_them() {
    let (config, _d) = data_dir("consume");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("jobs", "jobs/**", "interval=20"))
        .await
        .unwrap();
    publish_n(&c, "jobs/a", 100).await;
    let mut cfg = ConsumerConfig::new("jobs", "workers");
    cfg.filter = Some("jobs/*".into());
    consumer(&c, cfg).await;
    let mut sub = c.consume("jobs", "workers").await.unwrap();
    within(20, async {
        for i in 0..100u64 {
            let m = sub.next().await.unwrap();
            assert_eq!(m.attrs.stream_offset, Some(i));
            assert_eq!((m.attrs.deliveries, m.attrs.redelivered), (1, false));
            assert_eq!(m.payload, Bytes::from(i.to_string()));
            c.ack(&m).unwrap();
        }
    })
    .await;
    // New messages arrive as they are published.
    publish_n(&c, "jobs/b", 1).await;
    let m = within(10, sub.next()).await.unwrap();
    assert_eq!(m.attrs.stream_offset, Some(100));
    c.ack(&m).unwrap();
    c.flush().await.unwrap();
    let t = Instant::now();
    loop {
        let v = c.streams().consumer_info("jobs", "workers").await.unwrap();
        if v.state.floor == 101 {
            assert_eq!(v.state.in_flight, 0);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A filter skips what it does not match.
    publish_n(&c, "jobs/deep/x", 1).await;
    publish_n(&c, "jobs/c", 1).await;
    let m = within(10, sub.next()).await.unwrap();
    assert_eq!(
        (m.key.as_str(), m.attrs.stream_offset),
        ("jobs/c", Some(102))
    );
    // CONSUME of an unknown consumer is refused (ERR 10 closes the connection).
    let bad = Client::connect(&b.addr).await.unwrap();
    let mut s = bad.consume("jobs", "nobody").await.unwrap();
    assert!(within(10, s.next()).await.is_none());
    assert!(
        matches!(bad.last_error(), Some(Error::Server { .. })),
        "{:?}",
        bad.last_error()
    );
}

#[tokio::test]
async fn nack_with_a_delay_and_ack_timeout_redeliver_on_time() {
    let (config, _d) = data_dir("nack");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("s", "s/*", "always"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("s", "c");
    cfg.ack_wait_ms = 300;
    consumer(&c, cfg).await;
    let mut sub = c.consume("s", "c").await.unwrap();
    publish_n(&c, "s/x", 1).await;
    let m = within(10, sub.next()).await.unwrap();
    // NACK with 200 ms: not before, and on time.
    let t = Instant::now();
    c.nack_after(&m, Duration::from_millis(200)).unwrap();
    let m = within(10, sub.next()).await.unwrap();
    let late = t.elapsed();
    assert!(
        late >= Duration::from_millis(200),
        "redelivered early: {late:?}"
    );
    assert!(
        late < Duration::from_millis(200 + 150),
        "redelivered late: {late:?}"
    );
    assert_eq!((m.attrs.deliveries, m.attrs.redelivered), (2, true));
    // Not acknowledged within ack_wait (300 ms): delivered again.
    let t = Instant::now();
    let m = within(10, sub.next()).await.unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_millis(300 + 300),
        "{waited:?}"
    );
    assert_eq!(m.attrs.deliveries, 3);
    c.ack(&m).unwrap();
    c.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(700), sub.next())
            .await
            .is_err(),
        "acknowledged: no more"
    );
}

#[tokio::test]
async fn members_share_the_work_and_a_disconnect_hands_unacked_messages_to_another() {
    let (config, _d) = data_dir("work");
    let b = start(config).await;
    let admin = Client::connect(&b.addr).await.unwrap();
    admin
        .streams()
        .add(&stream("w", "w/*", "interval=10"))
        .await
        .unwrap();
    consumer(&admin, ConsumerConfig::new("w", "pool")).await;
    let a = Client::connect(&b.addr).await.unwrap();
    let bb = Client::connect(&b.addr).await.unwrap();
    let mut sa = a.consume("w", "pool").await.unwrap();
    let mut sb = bb.consume("w", "pool").await.unwrap();
    a.flush().await.unwrap();
    bb.flush().await.unwrap();
    publish_n(&admin, "w/x", 200).await;
    // A takes some and never acknowledges them, then goes away.
    let mut held = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while held.len() < 10 {
            held.push(sa.next().await.unwrap().attrs.stream_offset.unwrap());
        }
    })
    .await;
    if r.is_err() {
        let v = admin.streams().consumer_info("w", "pool").await.unwrap();
        panic!("A got {held:?}; consumer {v:?}");
    }
    drop(sa);
    a.close().await.unwrap();
    // B acknowledges everything it gets; it must get every offset, A's included.
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    within(30, async {
        while seen.len() < 200 {
            let m = sb.next().await.unwrap();
            *seen.entry(m.attrs.stream_offset.unwrap()).or_default() += 1;
            bb.ack(&m).unwrap();
        }
    })
    .await;
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..200).collect::<Vec<_>>()
    );
    for o in held {
        assert!(seen.contains_key(&o), "A's unacknowledged {o} reached B");
    }
}

#[tokio::test]
async fn max_deliver_moves_a_message_to_the_dead_letter_stream() {
    let (config, _d) = data_dir("dlq");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("in", "in/*", "always"))
        .await
        .unwrap();
    c.streams()
        .add(&stream("dlq", "dead-letters/never", "always"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("in", "c");
    cfg.max_deliver = 2;
    cfg.dead_letter = Some("dlq".into());
    consumer(&c, cfg).await;
    let mut dcfg = ConsumerConfig::new("dlq", "inspect");
    dcfg.start = Start::First;
    consumer(&c, dcfg).await;
    let mut sub = c.consume("in", "c").await.unwrap();
    publish_n(&c, "in/x", 2).await;
    let mut deliveries = 0;
    within(10, async {
        loop {
            let m = sub.next().await.unwrap();
            if m.attrs.stream_offset == Some(1) {
                c.ack(&m).unwrap();
                continue;
            }
            deliveries += 1;
            c.nack(&m).unwrap();
            if deliveries == 2 {
                break;
            }
        }
    })
    .await;
    let mut dead = c.consume("dlq", "inspect").await.unwrap();
    let d = within(10, dead.next()).await.unwrap();
    let h: BTreeMap<String, String> = d
        .headers
        .clone()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.to_vec()).unwrap()))
        .collect();
    assert_eq!(h["hayate-dead-reason"], "max_deliver");
    assert_eq!(h["hayate-dead-stream"], "in");
    assert_eq!(h["hayate-dead-offset"], "0");
    assert_eq!(h["hayate-dead-deliveries"], "2");
    assert_eq!((d.key.as_str(), &d.payload[..]), ("in/x", &b"0"[..]));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err(),
        "not delivered a third time"
    );
}

/// A broker with users `alice` and `bob`, each allowed to publish, subscribe and serve on
/// their own keys only (`alice/**`, `bob/**`) and to call the stream API, and a
/// config-file stream `shared` (no owner) capturing `alice/shared/**`.
fn two_users(name: &str) -> (Config, Dir) {
    use hayate_server::config::{Permissions, UserConfig};
    let (mut c, d) = data_dir(name);
    for (u, pw) in [("alice", "alice-pw"), ("bob", "bob-pw")] {
        let mut user = UserConfig::with_password(pw).unwrap();
        let own = vec![format!("{u}/**")];
        user.permissions = Permissions {
            publish: Some(own.clone()),
            subscribe: Some(own.clone()),
            call: Some(vec![own[0].clone(), "$hayate/api/**".into()]),
            ..Permissions::default()
        };
        c.auth.users.insert(u.into(), user);
    }
    c.stream
        .push(StreamConfig::new("shared", &["alice/shared/**"]));
    (c, d)
}

async fn login(addr: &str, user: &str) -> Client {
    let o = hayate_client::ConnectOptions::default().password(user, format!("{user}-pw"));
    Client::connect_with(addr, o).await.unwrap()
}

fn api_error<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Api(e)) => e,
        other => panic!("expected an API refusal, got {other:?}"),
    }
}

/// bob (rules on `bob/**` only) cannot add a consumer to alice's stream, whatever filter he
/// gives it (a filter on his own keys once let him add 1,021 and lock alice out at the
/// per-stream limit); alice still can.
#[tokio::test]
async fn another_user_cannot_add_a_consumer_to_a_stream() {
    let (config, _d) = two_users("foreign-consumer");
    let b = start(config).await;
    let alice = login(&b.addr, "alice").await;
    let bob = login(&b.addr, "bob").await;
    alice
        .streams()
        .add(&stream("alice-s", "alice/**", "never"))
        .await
        .unwrap();
    for filter in [None, Some("bob/x"), Some("bob/**")] {
        let mut cfg = ConsumerConfig::new("alice-s", "spy");
        cfg.filter = filter.map(Into::into);
        let e = api_error(bob.streams().consumer_add(&cfg).await);
        assert!(
            e.contains("not authorized to serve on alice/**"),
            "{filter:?}: {e}"
        );
    }
    // Nor as a `stomp-` consumer (unowned), nor on the unowned config-file stream.
    let e = api_error(
        bob.streams()
            .consumer_add(&ConsumerConfig::new("alice-s", "stomp-bob"))
            .await,
    );
    assert!(e.contains("not authorized to serve"), "{e}");
    let mut cfg = ConsumerConfig::new("shared", "spy");
    cfg.filter = Some("bob/x".into());
    let e = api_error(bob.streams().consumer_add(&cfg).await);
    assert!(
        e.contains("not authorized to serve on alice/shared/**"),
        "{e}"
    );
    let views = alice.streams().consumer_list("alice-s").await.unwrap();
    assert!(views.is_empty(), "{views:?}");
    alice
        .streams()
        .consumer_add(&ConsumerConfig::new("alice-s", "mine"))
        .await
        .unwrap();
}

/// bob cannot name alice's stream (nor an unowned one capturing her keys) as his consumer's
/// dead-letter stream: his messages once went into her stream and to her consumer.
#[tokio::test]
async fn another_user_cannot_dead_letter_into_a_stream() {
    let (config, _d) = two_users("foreign-dlq");
    let b = start(config).await;
    let alice = login(&b.addr, "alice").await;
    let bob = login(&b.addr, "bob").await;
    alice
        .streams()
        .add(&stream("alice-s", "alice/**", "never"))
        .await
        .unwrap();
    bob.streams()
        .add(&stream("bob-s", "bob/**", "never"))
        .await
        .unwrap();
    bob.streams()
        .add(&stream("bob-dlq", "bob/dead/never", "never"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("bob-s", "c");
    cfg.max_deliver = 1;
    cfg.dead_letter = Some("alice-s".into());
    let e = api_error(bob.streams().consumer_add(&cfg).await);
    assert!(
        e.contains("dead-letter stream alice-s belongs to user alice"),
        "{e}"
    );
    cfg.dead_letter = Some("shared".into());
    let e = api_error(bob.streams().consumer_add(&cfg).await);
    assert!(
        e.contains("not authorized to publish on alice/shared/**"),
        "{e}"
    );
    // His own dead-letter stream is fine.
    cfg.dead_letter = Some("bob-dlq".into());
    bob.streams().consumer_add(&cfg).await.unwrap();
    assert_eq!(alice.streams().info("alice-s").await.unwrap().records, 0);
}

/// A stream keeps only what its creator may publish: bob cannot capture `**` (and with
/// fsync `always` slow everyone's publishing, count and purge their messages) nor
/// `alice/**`; he cannot count or purge alice's streams, nor purge an unowned stream of
/// her keys; `ls` shows him only what he may see.
#[tokio::test]
async fn a_user_cannot_capture_count_or_purge_what_it_may_not_publish() {
    let (config, _d) = two_users("foreign-capture");
    let b = start(config).await;
    let alice = login(&b.addr, "alice").await;
    let bob = login(&b.addr, "bob").await;
    for (name, capture) in [("all", "**"), ("hers", "alice/**"), ("wide", "*/x")] {
        let e = api_error(bob.streams().add(&stream(name, capture, "always")).await);
        assert!(
            e.contains(&format!("not authorized to publish on {capture}")),
            "{capture}: {e}"
        );
    }
    let mut two = StreamConfig::new("two", &["bob/a/**", "alice/a/**"]);
    two.fsync = "never".into();
    let e = api_error(bob.streams().add(&two).await);
    assert!(e.contains("not authorized to publish on alice/a/**"), "{e}");
    bob.streams()
        .add(&stream("bob-s", "bob/**", "never"))
        .await
        .unwrap();
    alice
        .streams()
        .add(&stream("alice-s", "alice/**", "never"))
        .await
        .unwrap();
    publish_n(&alice, "alice/shared/x", 3).await;
    let e = api_error(bob.streams().info("alice-s").await);
    assert!(e.contains("not authorized"), "{e}");
    let e = api_error(bob.streams().purge("alice-s").await);
    assert!(e.contains("belongs to user alice"), "{e}");
    let e = api_error(bob.streams().purge("shared").await);
    assert!(
        e.contains("not authorized to publish on alice/shared/**"),
        "{e}"
    );
    let e = api_error(bob.streams().remove("shared").await);
    assert!(
        e.contains("not authorized to publish on alice/shared/**"),
        "{e}"
    );
    let e = api_error(bob.streams().consumer_list("alice-s").await);
    assert!(e.contains("not authorized"), "{e}");
    let names: Vec<String> = bob
        .streams()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.config.name)
        .collect();
    assert_eq!(names, vec!["bob-s"]);
    assert_eq!(alice.streams().info("alice-s").await.unwrap().records, 3);
    assert_eq!(alice.streams().info("shared").await.unwrap().records, 3);
    assert_eq!(alice.streams().list().await.unwrap().len(), 2);
}

/// One user owns at most `limits.max_streams_per_user` streams and creates at most
/// `limits.max_consumers_per_user` consumers (unowned `stomp-` ones included); another user
/// is not held back by it. (bob alone once took all 256 streams.)
#[tokio::test]
async fn per_user_stream_and_consumer_limits() {
    let (mut config, _d) = two_users("per-user");
    config.limits.max_streams_per_user = 2;
    config.limits.max_consumers_per_user = 3;
    let b = start(config).await;
    let alice = login(&b.addr, "alice").await;
    let bob = login(&b.addr, "bob").await;
    for i in 0..2 {
        bob.streams()
            .add(&stream(
                &format!("bob-{i}"),
                &format!("bob/{i}/**"),
                "never",
            ))
            .await
            .unwrap();
    }
    let e = api_error(
        bob.streams()
            .add(&stream("bob-2", "bob/2/**", "never"))
            .await,
    );
    assert!(e.contains("limits.max_streams_per_user"), "{e}");
    // Deleting one makes room again; another user has room of her own.
    bob.streams().remove("bob-1").await.unwrap();
    bob.streams()
        .add(&stream("bob-2", "bob/2/**", "never"))
        .await
        .unwrap();
    alice
        .streams()
        .add(&stream("alice-s", "alice/**", "never"))
        .await
        .unwrap();
    for name in ["c0", "c1", "stomp-q"] {
        bob.streams()
            .consumer_add(&ConsumerConfig::new("bob-0", name))
            .await
            .unwrap();
    }
    let e = api_error(
        bob.streams()
            .consumer_add(&ConsumerConfig::new("bob-2", "c3"))
            .await,
    );
    assert!(e.contains("limits.max_consumers_per_user"), "{e}");
    // Adding one that exists with the same definition is no new consumer.
    bob.streams()
        .consumer_add(&ConsumerConfig::new("bob-0", "c0"))
        .await
        .unwrap();
    alice
        .streams()
        .consumer_add(&ConsumerConfig::new("alice-s", "c0"))
        .await
        .unwrap();
}

/// Nacks every message `sub` gets until the consumer `stream`/`name` counts a dead-letter
/// cycle; fails if a stream of `streams` grows past its bound meanwhile (the loop went
/// round more than once). Returns the consumer's state.
async fn nack_until_cycle(
    c: &Client,
    sub: &mut hayate_client::Subscription,
    stream: &str,
    name: &str,
    bounds: &[(&str, u64)],
) -> hayate_client::streams::ConsumerInfo {
    within(20, async {
        loop {
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(20), sub.next()).await {
                c.nack(&m).unwrap();
            }
            for (s, most) in bounds {
                let n = c.streams().info(s).await.unwrap().next;
                assert!(
                    n <= *most,
                    "stream {s} grew to {n} records (at most {most})"
                );
            }
            let v = c.streams().consumer_info(stream, name).await.unwrap();
            if v.state.dead_letter_cycles > 0 {
                return v.state;
            }
        }
    })
    .await
}

/// A consumer dead-lettering into its own stream dead-letters a message once; the second
/// time it comes round it is dropped and counted (it once made 198 records of one message
/// in 20 s, and kept growing).
#[tokio::test]
async fn a_self_dead_letter_loop_stops_after_one_pass() {
    let (config, _d) = data_dir("dl-self");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("loop", "loop/**", "never"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("loop", "c");
    cfg.max_deliver = 1;
    cfg.dead_letter = Some("loop".into());
    consumer(&c, cfg).await;
    let mut sub = c.consume("loop", "c").await.unwrap();
    publish_n(&c, "loop/x", 1).await;
    let st = nack_until_cycle(&c, &mut sub, "loop", "c", &[("loop", 2)]).await;
    assert_eq!(
        (
            st.dead_lettered,
            st.dead_letter_cycles,
            st.dead_letter_dropped
        ),
        (1, 1, 0)
    );
    let info = c.streams().info("loop").await.unwrap();
    assert_eq!((info.next, st.floor), (2, 2), "{info:?} {st:?}");
}

/// Two streams dead-lettering into each other pass a message back once: it is dropped when
/// it comes back to the stream it was first dead-lettered out of.
#[tokio::test]
async fn a_two_stream_dead_letter_ping_pong_stops_after_one_pass() {
    let (config, _d) = data_dir("dl-pingpong");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    for s in ["ping", "pong"] {
        c.streams()
            .add(&stream(s, &format!("{s}/**"), "never"))
            .await
            .unwrap();
    }
    for (s, other) in [("ping", "pong"), ("pong", "ping")] {
        let mut cfg = ConsumerConfig::new(s, "c");
        cfg.max_deliver = 1;
        cfg.dead_letter = Some(other.into());
        consumer(&c, cfg).await;
    }
    let mut ping = c.consume("ping", "c").await.unwrap();
    // pong's member, on a connection of its own, nacks what it gets.
    let c2 = Client::connect(&b.addr).await.unwrap();
    let mut pong = c2.consume("pong", "c").await.unwrap();
    publish_n(&c, "ping/x", 1).await;
    let pong_task = tokio::spawn(async move {
        while let Some(m) = pong.next().await {
            c2.nack(&m).unwrap();
        }
    });
    let st = nack_until_cycle(&c, &mut ping, "ping", "c", &[("ping", 2), ("pong", 1)]).await;
    pong_task.abort();
    assert_eq!((st.dead_lettered, st.dead_letter_cycles), (1, 1));
    let p = c.streams().consumer_info("pong", "c").await.unwrap().state;
    assert_eq!((p.dead_lettered, p.dead_letter_cycles), (1, 0));
    assert_eq!(c.streams().info("ping").await.unwrap().next, 2);
    assert_eq!(c.streams().info("pong").await.unwrap().next, 1);
    // The message that came back lists both streams it was dead-lettered out of.
    let mut cfg = ConsumerConfig::new("ping", "inspect");
    cfg.start = Start::Offset(1);
    consumer(&c, cfg).await;
    let mut sub = c.consume("ping", "inspect").await.unwrap();
    let m = within(10, sub.next()).await.unwrap();
    let from: Vec<&[u8]> = m
        .headers
        .iter()
        .flatten()
        .filter(|(k, _)| k == "hayate-dead-stream")
        .map(|(_, v)| &v[..])
        .collect();
    assert_eq!(from, vec![&b"ping"[..], &b"pong"[..]]);
}

#[tokio::test]
async fn a_delayed_message_is_not_delivered_early_and_arrives_on_time() {
    let (config, _d) = data_dir("delay");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("d", "d/*", "interval=10"))
        .await
        .unwrap();
    consumer(&c, ConsumerConfig::new("d", "c")).await;
    let mut sub = c.consume("d", "c").await.unwrap();
    // Steady load beside the delayed messages: undelayed ones keep flowing.
    let mut lateness = Vec::new();
    for (i, delay) in [150u64, 250, 350, 200, 300].iter().enumerate() {
        let mut m = Message::new(key("d/x"), format!("delayed-{i}"));
        m.headers = Some(vec![(
            "hayate-delay".into(),
            Bytes::from(delay.to_string()),
        )]);
        let sent = Instant::now();
        c.publish_confirmed(&m).await.unwrap();
        publish_n(&c, "d/plain", 20).await;
        let due = sent + Duration::from_millis(*delay);
        within(10, async {
            loop {
                let got = sub.next().await.unwrap();
                c.ack(&got).unwrap();
                if got.payload.starts_with(b"delayed") {
                    let now = Instant::now();
                    assert!(
                        now + Duration::from_millis(2) >= due,
                        "delivered {:?} early",
                        due - now
                    );
                    lateness.push(now.saturating_duration_since(due));
                    break;
                }
            }
        })
        .await;
    }
    lateness.sort();
    eprintln!("delayed delivery lateness: {lateness:?}");
    assert!(
        lateness[2] < Duration::from_millis(50),
        "median lateness {:?}",
        lateness[2]
    );
    assert!(
        lateness[4] < Duration::from_millis(250),
        "worst lateness {:?}",
        lateness[4]
    );
}

#[tokio::test]
async fn a_restart_keeps_positions_and_redelivers_what_was_in_flight() {
    let (config, _d) = data_dir("restart");
    let mut acked = Vec::new();
    {
        let b = start(config.clone()).await;
        let c = Client::connect(&b.addr).await.unwrap();
        c.streams()
            .add(&stream("r", "r/*", "always"))
            .await
            .unwrap();
        consumer(&c, ConsumerConfig::new("r", "c")).await;
        publish_n(&c, "r/x", 10).await;
        let mut sub = c.consume("r", "c").await.unwrap();
        within(10, async {
            for _ in 0..5 {
                let m = sub.next().await.unwrap();
                let o = m.attrs.stream_offset.unwrap();
                if o % 2 == 0 {
                    c.ack(&m).unwrap();
                    acked.push(o);
                }
            }
        })
        .await;
        c.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(sub);
        c.close().await.unwrap();
        b.shutdown().await;
    }
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let v = c.streams().consumer_info("r", "c").await.unwrap();
    assert_eq!(v.state.floor, 1, "{v:?}");
    let mut sub = c.consume("r", "c").await.unwrap();
    let mut got = Vec::new();
    within(10, async {
        while got.len() < 7 {
            let m = sub.next().await.unwrap();
            got.push(m.attrs.stream_offset.unwrap());
            c.ack(&m).unwrap();
        }
    })
    .await;
    got.sort_unstable();
    assert_eq!(
        got,
        vec![1, 3, 5, 6, 7, 8, 9],
        "acknowledged {acked:?} are not delivered again"
    );
}

#[tokio::test]
async fn a_member_acking_in_batches_larger_than_its_outbox_budget_gets_everything() {
    // The outbox holds 64 KiB; the client acknowledges every 64 messages of 4 KiB (256 KiB):
    // held deliveries must not count against the budget, or both sides wait for each other.
    let (mut config, _d) = data_dir("batchack");
    config.limits.outbox_bytes = 64 * 1024;
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("big", "big/*", "never"))
        .await
        .unwrap();
    let payload = Bytes::from(vec![7u8; 4096]);
    for _ in 0..1000 {
        c.publish(&key("big/x"), payload.clone()).await.unwrap();
    }
    c.flush().await.unwrap();
    let mut cfg = ConsumerConfig::new("big", "c");
    cfg.max_in_flight = 200;
    consumer(&c, cfg).await;
    let r = Client::connect(&b.addr).await.unwrap();
    let mut sub = r.consume("big", "c").await.unwrap();
    within(20, async {
        for i in 1..=1000u64 {
            let m = sub.next().await.unwrap();
            assert_eq!(m.attrs.stream_offset, Some(i - 1));
            if i % 64 == 0 || i == 1000 {
                r.ack_through(&m).unwrap();
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_default_ttl_skips_old_messages_and_work_queue_retention_frees_what_consumers_finished() {
    let (config, _d) = data_dir("ttl");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut s = stream("t", "t/*", "interval=10");
    // 1 s: long enough that t/new (published below) is still fresh when the consumer
    // reads it on a loaded machine (150 ms made this test flaky under load).
    s.default_ttl_ms = Some(1000);
    c.streams().add(&s).await.unwrap();
    publish_n(&c, "t/old", 3).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // A message's own TTL (header), shorter than the stream's.
    let mut short = Message::new(key("t/short"), "x");
    short.headers = Some(vec![("hayate-ttl".into(), Bytes::from_static(b"1"))]);
    c.publish_confirmed(&short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    publish_n(&c, "t/new", 1).await;
    consumer(&c, ConsumerConfig::new("t", "c")).await;
    let mut sub = c.consume("t", "c").await.unwrap();
    let m = within(10, sub.next()).await.unwrap();
    assert_eq!(
        (m.key.as_str(), m.attrs.stream_offset),
        ("t/new", Some(4)),
        "expired ones skipped"
    );

    // Work queue: small segments, two consumers; segments go once both are past them.
    let mut w = stream("wq", "wq/*", "never");
    w.segment_bytes = Some(1 << 20);
    w.work_queue = true;
    c.streams().add(&w).await.unwrap();
    consumer(&c, ConsumerConfig::new("wq", "a")).await;
    consumer(&c, ConsumerConfig::new("wq", "b")).await;
    let payload = Bytes::from(vec![1u8; 40_000]);
    for _ in 0..100 {
        c.publish(&key("wq/x"), payload.clone()).await.unwrap();
    }
    c.flush().await.unwrap();
    let drain = |name: &'static str| {
        let addr = b.addr.clone();
        async move {
            let r = Client::connect(&addr).await.unwrap();
            let mut sub = r.consume("wq", name).await.unwrap();
            for _ in 0..100 {
                let m = sub.next().await.unwrap();
                r.ack(&m).unwrap();
            }
            r.flush().await.unwrap();
            r
        }
    };
    let _a = within(10, drain("a")).await;
    b.broker.apply_retention();
    assert_eq!(
        c.streams().info("wq").await.unwrap().first,
        0,
        "b has read nothing: all kept"
    );
    let _b = within(10, drain("b")).await;
    let t = Instant::now();
    loop {
        b.broker.apply_retention();
        let info = c.streams().info("wq").await.unwrap();
        if info.first > 50 {
            assert_eq!(info.next, 100);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A publisher that floods PUB_CONFIRM and never reads its CONFIRMs is held back (the broker
/// stops reading it once its own output is over the outbox budget) instead of growing the
/// broker's memory; others carry on meanwhile.
#[tokio::test]
async fn a_confirm_flooder_that_never_reads_is_held_back() {
    use hayate_native::{Frame, Hello, PROTOCOL_VERSION, encode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut config, _d) = data_dir("flood");
    config.limits.outbox_bytes = 256 * 1024;
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams().add(&stream("f", "f/*", "never")).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(&b.addr).await.unwrap();
    let mut out = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
            name: "flood".into(),
            auth: Default::default(),
        }),
        &mut out,
    );
    s.write_all(&out).await.unwrap();
    let mut welcome = [0u8; 256];
    let _ = s.read(&mut welcome).await.unwrap();
    // 1,000 frames per write; a CONFIRM is ~40 bytes, so 2,000 writes would queue ~80 MB.
    let mut chunk = BytesMut::new();
    for i in 0..1000u64 {
        encode(
            &Frame::PubConfirm {
                id: i,
                msg: Message::new(key("f/x"), vec![0u8; 16]),
            },
            &mut chunk,
        );
    }
    let mut writes = 0;
    let stalled = loop {
        match tokio::time::timeout(Duration::from_secs(2), s.write_all(&chunk)).await {
            Ok(Ok(())) => writes += 1,
            Ok(Err(e)) => panic!("write failed: {e}"),
            Err(_) => break true,
        }
        if writes == 2000 {
            break false;
        }
    };
    assert!(
        stalled,
        "the broker read {writes}k PUB_CONFIRMs from a client that reads nothing"
    );
    // Everybody else carries on.
    let other = Client::connect(&b.addr).await.unwrap();
    let r = other
        .publish_confirmed(&Message::new(key("f/y"), "ok"))
        .await
        .unwrap();
    assert!(matches!(r, ConfirmOutcome::Stored { .. }), "{r:?}");
    drop(s);
}

/// A member at max_in_flight over a backlog must wait, not spin (on this single-threaded
/// runtime a spin would freeze the broker), and a client that never acknowledges holds no
/// more than max_in_flight, however often the ack wait runs out: it gets those messages
/// again and again (each redelivery supersedes the delivery before), never new ones.
#[tokio::test]
async fn a_full_member_waits_and_a_non_acking_client_holds_at_most_max_in_flight() {
    let (config, _d) = data_dir("full");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("bl", "bl/*", "never"))
        .await
        .unwrap();
    for _ in 0..1000 {
        c.publish(&key("bl/x"), "m").await.unwrap();
    }
    c.flush().await.unwrap();
    let mut cfg = ConsumerConfig::new("bl", "slow");
    cfg.max_in_flight = 5;
    cfg.ack_wait_ms = 150;
    consumer(&c, cfg).await;
    let r = Client::connect(&b.addr).await.unwrap();
    let mut sub = r.consume("bl", "slow").await.unwrap();
    let mut got: BTreeMap<u64, u32> = BTreeMap::new();
    let until = Instant::now() + Duration::from_secs(1);
    while let Ok(Some(m)) = tokio::time::timeout_at(until.into(), sub.next()).await {
        let n = got.entry(m.attrs.stream_offset.unwrap()).or_default();
        *n = (*n).max(m.attrs.deliveries);
    }
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2, 3, 4],
        "a client that never acknowledges gets max_in_flight messages, and no others"
    );
    assert!(
        got.values().all(|&n| n >= 2),
        "each delivered again when its ack wait ran out: {got:?}"
    );
    // The broker still answers (nothing spins).
    let info = within(5, c.streams().consumer_info("bl", "slow"))
        .await
        .unwrap();
    assert!(info.state.in_flight + info.state.waiting <= 5, "{info:?}");
}

/// A consumer whose saved position is beyond the end of its log (the log lost its tail in a
/// crash and gives those offsets to new records) is moved back: new records are delivered.
#[tokio::test]
async fn a_position_beyond_the_end_of_the_log_is_moved_back() {
    let (config, d) = data_dir("beyond");
    {
        let b = start(config.clone()).await;
        let c = Client::connect(&b.addr).await.unwrap();
        c.streams()
            .add(&stream("be", "be/*", "always"))
            .await
            .unwrap();
        consumer(&c, ConsumerConfig::new("be", "c")).await;
        publish_n(&c, "be/x", 3).await;
        c.close().await.unwrap();
        b.shutdown().await;
    }
    // Forge the crash: the consumer had seen offsets the log no longer has.
    {
        use hayate_broker::meta::{Meta, record};
        let meta = Meta::open(&hayate_log::FsRoot(d.0.clone())).unwrap();
        let pos = record::Position {
            floor: 50,
            next: 50,
            ..record::Position::default()
        };
        meta.put_durable(&[(&record::pos_key("be", "c"), &pos.encode())])
            .unwrap();
    }
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    publish_n(&c, "be/new", 1).await;
    let mut sub = c.consume("be", "c").await.unwrap();
    let m = within(10, sub.next()).await.unwrap();
    assert_eq!((m.key.as_str(), m.attrs.stream_offset), ("be/new", Some(3)));
}

/// Each CONSUME starts a task: one connection may hold at most 256 (ERR 10 and a close
/// beyond); others carry on.
#[tokio::test]
async fn consume_memberships_per_connection_are_capped() {
    let (config, _d) = data_dir("capm");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams().add(&stream("m", "m/*", "never")).await.unwrap();
    consumer(&c, ConsumerConfig::new("m", "c")).await;
    let greedy = Client::connect(&b.addr).await.unwrap();
    let mut subs = Vec::new();
    for _ in 0..257 {
        subs.push(greedy.consume("m", "c").await.unwrap());
    }
    assert!(
        within(10, greedy.flush()).await.is_err(),
        "the 257th CONSUME ends the connection"
    );
    assert!(
        matches!(greedy.last_error(), Some(Error::Server { .. })),
        "{:?}",
        greedy.last_error()
    );
    publish_n(&c, "m/x", 1).await;
    let mut sub = c.consume("m", "c").await.unwrap();
    assert_eq!(
        within(10, sub.next()).await.unwrap().attrs.stream_offset,
        Some(0)
    );
}

/// A client that never acknowledges `n` messages gets every one of them again each time its
/// ack wait runs out, however many are in flight: each arrives at least 4 times (3
/// redeliveries) within the watchdog. (Redeliveries once filled the session's window and its
/// member's cap with the superseded deliveries: with 500 in flight each came twice, then
/// never again.)
async fn ack_wait_redelivers_all(
    name: &str,
    n: u32,
    ack_wait_ms: u64,
    max_in_flight: Option<u32>,
    max_unacked: u32,
) {
    let (mut config, _d) = data_dir(name);
    config.limits.max_unacked = max_unacked;
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream(name, &format!("{name}/*"), "never"))
        .await
        .unwrap();
    let k = key(&format!("{name}/x"));
    for i in 0..n {
        c.publish(&k, i.to_string()).await.unwrap();
    }
    c.flush().await.unwrap();
    let mut cfg = ConsumerConfig::new(name, "c");
    cfg.ack_wait_ms = ack_wait_ms;
    if let Some(m) = max_in_flight {
        cfg.max_in_flight = m;
    }
    consumer(&c, cfg).await;
    let r = Client::connect(&b.addr).await.unwrap();
    let mut sub = r.consume(name, "c").await.unwrap();
    // The most deliveries seen of each offset; how many offsets have reached 4.
    let mut most: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    let mut enough = 0;
    let t = Instant::now();
    let until = t + Duration::from_millis(ack_wait_ms * 4) + Duration::from_secs(60);
    while enough < n as usize {
        match tokio::time::timeout_at(until.into(), sub.next()).await {
            Ok(Some(m)) => {
                let o = m.attrs.stream_offset.unwrap();
                assert!(o < u64::from(n), "{o}");
                assert_eq!(m.payload, Bytes::from(o.to_string()));
                let e = most.entry(o).or_default();
                if m.attrs.deliveries > *e {
                    if *e < 4 && m.attrs.deliveries >= 4 {
                        enough += 1;
                    }
                    *e = m.attrs.deliveries;
                }
            }
            other => {
                let info = c.streams().consumer_info(name, "c").await.unwrap();
                let mut by_count: BTreeMap<u32, usize> = BTreeMap::new();
                for d in most.values() {
                    *by_count.entry(*d).or_default() += 1;
                }
                panic!(
                    "{enough} of {n} offsets delivered 4 times ({other:?}); offsets by \
                     deliveries seen {by_count:?}; consumer {info:?}"
                );
            }
        }
    }
    let info = c.streams().consumer_info(name, "c").await.unwrap();
    assert!(
        info.state.in_flight + info.state.waiting <= u64::from(n),
        "{info:?}"
    );
    eprintln!(
        "{name}: {n} offsets delivered 4 times each in {:?}",
        t.elapsed()
    );
}

/// An ACK of a delivery that a redelivery superseded (the ack wait ran out while the client
/// was still working on it) still settles the message: it is not delivered again.
#[tokio::test]
async fn an_ack_of_a_superseded_delivery_still_settles_the_message() {
    let (config, _d) = data_dir("late");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("late", "late/*", "never"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("late", "c");
    // Long enough that the ACK below lands before a third delivery on a loaded machine
    // (with 200 ms, an ACK that took longer let a third delivery through: a flake).
    cfg.ack_wait_ms = 1_000;
    consumer(&c, cfg).await;
    let mut sub = c.consume("late", "c").await.unwrap();
    publish_n(&c, "late/x", 1).await;
    let first = within(10, sub.next()).await.unwrap();
    let second = within(10, sub.next()).await.unwrap();
    assert_eq!(
        (first.attrs.deliveries, second.attrs.deliveries),
        (1, 2),
        "delivered again after its ack wait"
    );
    c.ack(&first).unwrap();
    c.flush().await.unwrap();
    let t = Instant::now();
    loop {
        let v = c.streams().consumer_info("late", "c").await.unwrap();
        if v.state.floor == 1 {
            assert_eq!(v.state.in_flight, 0, "{v:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(500), sub.next())
            .await
            .is_err(),
        "acknowledged (through its first delivery): not delivered again"
    );
}

#[tokio::test]
async fn ack_wait_redelivers_500_unacknowledged_messages_again_and_again() {
    // As found: the default max_in_flight (1,000) and window (1,024).
    ack_wait_redelivers_all("aw500", 500, 100, None, 1024).await;
    // At the member's cap (max_in_flight = what it holds).
    ack_wait_redelivers_all("aw500cap", 500, 100, Some(500), 1024).await;
}

#[tokio::test]
async fn ack_wait_redelivers_10000_unacknowledged_messages_again_and_again() {
    // An ack wait long enough for a debug build to deliver 10,000 within it, on a busy
    // machine (deliveries due again go before new ones: a member that cannot send them all
    // within the ack wait sends redeliveries only).
    ack_wait_redelivers_all("aw10k", 10_000, 3_000, Some(10_000), 10_000).await;
}

/// CPU time the calling thread has used so far, in clock ticks (Linux; `None` elsewhere).
/// The test's runtime is single-threaded: the broker's tasks (members included) run on it.
fn thread_cpu_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, whole line).
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A NACK storm (every delivery NACKed at once, with no delay, again and again) costs one
/// redelivery per NACK: the consumer holds no more than its max_in_flight, the counts of
/// deliveries go on, and once the client stops nothing is left spinning.
#[tokio::test]
async fn a_nack_storm_neither_spins_nor_grows() {
    let (config, _d) = data_dir("nackstorm");
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    c.streams()
        .add(&stream("ns", "ns/*", "never"))
        .await
        .unwrap();
    let mut cfg = ConsumerConfig::new("ns", "c");
    cfg.max_in_flight = 4;
    consumer(&c, cfg).await;
    publish_n(&c, "ns/x", 8).await;
    let mut sub = c.consume("ns", "c").await.unwrap();
    let mut most: BTreeMap<u64, u32> = BTreeMap::new();
    within(60, async {
        for _ in 0..4000 {
            let m = sub.next().await.unwrap();
            let n = most.entry(m.attrs.stream_offset.unwrap()).or_default();
            assert!(m.attrs.deliveries > *n, "counts go on: {m:?}");
            *n = m.attrs.deliveries;
            c.nack(&m).unwrap();
        }
    })
    .await;
    // What is given back goes out again before new records, and no more than
    // max_in_flight messages are held.
    assert!(most.keys().all(|&o| o < 4), "{most:?}");
    assert_eq!(most.values().sum::<u32>(), 4000, "{most:?}");
    let info = within(5, c.streams().consumer_info("ns", "c"))
        .await
        .unwrap();
    assert!(info.state.in_flight + info.state.waiting <= 4, "{info:?}");
    // The client stops: what it last NACKed arrives once more, then nothing moves.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {}
    if let Some(before) = thread_cpu_ticks() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let used = thread_cpu_ticks().unwrap() - before;
        assert!(used < 20, "{used} ticks of CPU in 1 s of quiet");
    }
    let info = within(5, c.streams().consumer_info("ns", "c"))
        .await
        .unwrap();
    assert_eq!(info.state.waiting, 0, "{info:?}");
    assert!(info.state.in_flight <= 4, "{info:?}");
}
