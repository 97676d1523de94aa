//! Streams in the engine: capture on publish, confirms, reopening, definitions, deletion.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use common::{expr, key, msg, open};
use hayate_broker::{Batch, Broker, BrokerConfig, StreamConfig, StreamError, stream::codec};
use hayate_core::Qos;
use hayate_log::ReadLimit;

fn data_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hayate-streams-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn broker(dir: &std::path::Path) -> Broker {
    let b = Broker::new(BrokerConfig {
        data_dir: Some(dir.to_path_buf()),
        // As the server sets it for the STOMP front-end's durable queues.
        shared_consumers: vec!["stomp-".into()],
        ..BrokerConfig::default()
    });
    b.open_streams().unwrap();
    b
}

fn stored_payloads(b: &Broker, name: &str) -> Vec<(u64, String, String)> {
    let s = b.stream(name).unwrap();
    let log = s.log();
    let mut at = log.start_offset();
    let mut out = Vec::new();
    loop {
        let batch = log
            .read(
                at,
                ReadLimit {
                    confirmed_only: false,
                    ..ReadLimit::default()
                },
            )
            .unwrap();
        if batch.records.is_empty() {
            return out;
        }
        for r in &batch.records {
            let m = codec::decode(r).unwrap();
            out.push((
                r.offset,
                m.key.as_str().to_owned(),
                String::from_utf8(m.payload.to_vec()).unwrap(),
            ));
        }
        at = batch.next;
    }
}

#[tokio::test]
async fn captured_messages_are_stored_before_live_delivery_and_confirmed() {
    let dir = data_dir("capture");
    let b = broker(&dir);
    let mut cfg = StreamConfig::new("orders", &["orders/**"]);
    cfg.fsync = "always".into();
    let (_, created) = b.create_stream(cfg.clone()).unwrap();
    assert!(created);
    assert!(
        !b.create_stream(cfg.clone()).unwrap().1,
        "same definition: idempotent"
    );
    let (mut sub, log) = open(&b);
    sub.subscribe(1, expr("orders/**"), None, Qos::default())
        .unwrap();
    let (mut publisher, _) = open(&b);

    let (n, stored) = publisher
        .publish_stored(Batch::One(&msg("orders/eu/1", "a")))
        .await;
    assert_eq!(n, 1);
    assert_eq!(
        stored.confirmed().await.unwrap(),
        Some(("orders".to_owned(), 0))
    );
    let payloads = [Bytes::from_static(b"b"), Bytes::from_static(b"c")];
    let (_, stored) = publisher
        .publish_stored(Batch::Plain {
            key: &key("orders/us/2"),
            payloads: &payloads,
        })
        .await;
    assert_eq!(
        stored.confirmed().await.unwrap(),
        Some(("orders".to_owned(), 1))
    );
    // Not captured: delivered live only, and the confirm says so.
    let (_, stored) = publisher
        .publish_stored(Batch::One(&msg("other/x", "z")))
        .await;
    assert!(stored.is_empty());
    assert_eq!(stored.confirmed().await.unwrap(), None);
    publisher.flush();
    assert_eq!(log.payloads(), vec!["a", "b", "c"]);
    assert_eq!(
        stored_payloads(&b, "orders"),
        vec![
            (0, "orders/eu/1".into(), "a".into()),
            (1, "orders/us/2".into(), "b".into()),
            (2, "orders/us/2".into(), "c".into())
        ]
    );
    assert_eq!(b.stats().stored.load(Ordering::Relaxed), 3);
    let info = b.stream("orders").unwrap().info();
    assert_eq!(
        (info.first, info.next, info.records, info.confirmed),
        (0, 3, 3, 3)
    );

    // A full message keeps its metadata through the stream.
    let mut m = msg("orders/eu/9", "meta");
    m.reply_to = Some(key("_inbox/7/1"));
    m.correlation_id = Some(Bytes::from_static(b"cid"));
    m.headers = Some(vec![("h".into(), Bytes::from_static(b"v"))]);
    publisher.publish(Batch::One(&m)).await;
    let s = b.stream("orders").unwrap();
    let r = s
        .log()
        .read(
            3,
            ReadLimit {
                confirmed_only: false,
                ..ReadLimit::default()
            },
        )
        .unwrap();
    assert_eq!(codec::decode(&r.records[0]).unwrap(), m);

    // Reopening the broker finds the stream and its records.
    drop((sub, publisher, s));
    drop(b);
    let b = broker(&dir);
    assert_eq!(b.streams().len(), 1);
    assert_eq!(stored_payloads(&b, "orders").len(), 4);
    let (mut p, _) = open(&b);
    let (_, stored) = p
        .publish_stored(Batch::One(&msg("orders/x", "after")))
        .await;
    assert_eq!(
        stored.confirmed().await.unwrap(),
        Some(("orders".to_owned(), 4))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn two_streams_may_capture_one_key_and_each_keeps_it() {
    let dir = data_dir("two");
    let b = broker(&dir);
    b.create_stream(StreamConfig::new("all", &["**"])).unwrap();
    b.create_stream(StreamConfig::new("a", &["a/*", "c"]))
        .unwrap();
    let (mut p, _) = open(&b);
    for k in ["a/1", "b/1", "c", "a/2/3"] {
        p.publish(Batch::One(&msg(k, k))).await;
    }
    let keys = |n| {
        stored_payloads(&b, n)
            .into_iter()
            .map(|(_, k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(keys("all"), vec!["a/1", "b/1", "c", "a/2/3"]);
    assert_eq!(keys("a"), vec!["a/1", "c"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn definitions_are_checked_and_deletion_removes_files_and_capture() {
    let dir = data_dir("defs");
    let b = broker(&dir);
    for (name, capture, fsync) in [
        ("", vec!["a"], "always"),
        ("has space", vec!["a"], "always"),
        ("x", vec![], "always"),
        ("x", vec!["a//b"], "always"),
        ("x", vec!["a"], "sometimes"),
        ("x", vec!["a"], "interval=0"),
    ] {
        let mut c = StreamConfig::new(name, &capture);
        c.fsync = fsync.into();
        assert!(
            matches!(b.create_stream(c), Err(StreamError::Invalid(_))),
            "{name:?} {capture:?} {fsync}"
        );
    }
    b.create_stream(StreamConfig::new("s", &["k"])).unwrap();
    let mut other = StreamConfig::new("s", &["k2"]);
    other.fsync = "never".into();
    assert!(matches!(
        b.create_stream(other),
        Err(StreamError::Exists(_))
    ));
    assert!(
        b.meta().unwrap().get("stream/s").is_some(),
        "the definition is a record of the meta log"
    );
    assert!(dir.join("streams/s").is_dir());
    let (mut p, _) = open(&b);
    p.publish(Batch::One(&msg("k", "1"))).await;
    let old = b.stream("s").unwrap();
    b.delete_stream("s").unwrap();
    assert!(!dir.join("streams/s").exists());
    assert!(matches!(
        b.delete_stream("s"),
        Err(StreamError::NotFound(_))
    ));
    let (_, stored) = p.publish_stored(Batch::One(&msg("k", "2"))).await;
    assert!(stored.is_empty(), "a deleted stream captures nothing");
    let mut scratch = Vec::new();
    assert!(
        old.append(Batch::One(&msg("k", "3")), &mut scratch)
            .is_err(),
        "a stale handle cannot append"
    );
    // No data directory: streams are refused with a clear error.
    let none = Broker::default();
    assert!(matches!(
        none.create_stream(StreamConfig::new("s", &["k"])),
        Err(StreamError::NoDataDir)
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn purge_empties_a_stream_and_offsets_go_on() {
    let dir = data_dir("purge");
    let b = broker(&dir);
    let mut c = StreamConfig::new("p", &["p/**"]);
    c.fsync = "never".into();
    b.create_stream(c).unwrap();
    let (mut s, _) = open(&b);
    for i in 0..10 {
        s.publish(Batch::One(&msg("p/x", format!("{i}")))).await;
    }
    let removed = b.purge_stream("p").unwrap();
    assert_eq!(removed.records, 10);
    let info = b.stream("p").unwrap().info();
    assert_eq!((info.first, info.next, info.records), (10, 10, 0));
    let (_, stored) = s.publish_stored(Batch::One(&msg("p/x", "after"))).await;
    assert_eq!(
        stored.confirmed().await.unwrap(),
        Some(("p".to_owned(), 10))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn stream_and_consumer_counts_are_capped() {
    let dir = data_dir("caps");
    let b = Broker::new(BrokerConfig {
        data_dir: Some(dir.clone()),
        max_streams: 2,
        max_consumers: 1,
        ..BrokerConfig::default()
    });
    b.create_stream(StreamConfig::new("a", &["a"])).unwrap();
    b.create_stream(StreamConfig::new("b", &["b"])).unwrap();
    assert!(matches!(
        b.create_stream(StreamConfig::new("c", &["c"])),
        Err(StreamError::Invalid(_))
    ));
    assert!(
        !b.create_stream(StreamConfig::new("a", &["a"])).unwrap().1,
        "an existing one is found"
    );
    b.create_consumer(hayate_broker::ConsumerConfig::new("a", "x"))
        .unwrap();
    assert!(
        b.create_consumer(hayate_broker::ConsumerConfig::new("a", "y"))
            .is_err()
    );
    b.delete_stream("b").unwrap();
    b.create_stream(StreamConfig::new("c", &["c"])).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A consumer saved before creators were recorded (an owner, no creator) still counts
/// against its owner's `max_consumers_per_user`: alice, at her limit with such consumers,
/// cannot create more.
#[tokio::test]
async fn consumers_saved_without_a_creator_count_against_their_owner() {
    let dir = data_dir("legacy-creator");
    let b = Broker::new(BrokerConfig {
        data_dir: Some(dir.clone()),
        max_consumers_per_user: 2,
        ..BrokerConfig::default()
    });
    b.create_stream(StreamConfig::new("a", &["a"])).unwrap();
    for name in ["old1", "old2"] {
        let mut c = hayate_broker::ConsumerConfig::new("a", name);
        c.owner = Some("alice".into());
        b.create_consumer(c).unwrap();
    }
    let mut c = hayate_broker::ConsumerConfig::new("a", "new");
    c.owner = Some("alice".into());
    c.creator = Some("alice".into());
    let e = b.create_consumer(c.clone()).map(|_| ()).unwrap_err();
    assert!(
        e.to_string().contains("user alice has created 2 consumers"),
        "{e}"
    );
    // bob is not held back by them.
    c.owner = Some("bob".into());
    c.creator = Some("bob".into());
    b.create_consumer(c).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A definition without `fsync` (the wire type, hayate-native's) gets the log's default
/// policy.
#[test]
fn a_definitions_default_fsync_is_the_logs_default() {
    assert_eq!(
        StreamConfig::new("a", &["a/**"]).fsync,
        hayate_log::FsyncPolicy::default().to_string()
    );
    let c: StreamConfig = serde_json::from_str(r#"{"name": "a", "capture": ["a/**"]}"#).unwrap();
    assert_eq!(c.fsync, hayate_log::FsyncPolicy::default().to_string());
}

/// Owners through the API: bob's request cannot delete, purge or redefine alice's stream
/// or consumer; a stream of the configuration (no owner) that a user re-made through the
/// API still opens as the configuration defines it on the next start (the owner is not
/// part of the comparison); the `stomp-` consumers made through the API have no owner.
#[test]
fn owners_are_checked_by_the_api_and_do_not_break_a_restart() {
    use hayate_broker::stream::api::handle;
    let d = data_dir("owners");
    let b = broker(&d);
    let body = |v: serde_json::Value| serde_json::to_vec(&v).unwrap();
    let add = body(serde_json::json!({"name": "orders", "capture": ["o/**"]}));
    let r = handle(&b, "$hayate/api/stream/add", &add, Some("alice"));
    assert!(r.ok, "{r:?}");
    assert_eq!(
        b.stream("orders").unwrap().config().owner.as_deref(),
        Some("alice")
    );
    let name = body(serde_json::json!({"name": "orders"}));
    for op in ["rm", "purge", "add"] {
        let req = if op == "add" { &add } else { &name };
        let r = handle(&b, &format!("$hayate/api/stream/{op}"), req, Some("bob"));
        assert!(!r.ok);
        assert_eq!(
            r.error.as_deref(),
            Some("stream orders belongs to user alice"),
            "{op}"
        );
    }
    let c = body(serde_json::json!({"stream": "orders", "name": "billing"}));
    assert!(handle(&b, "$hayate/api/consumer/add", &c, Some("alice")).ok);
    let r = handle(&b, "$hayate/api/consumer/rm", &c, Some("bob"));
    assert_eq!(
        r.error.as_deref(),
        Some("consumer orders/billing belongs to user alice")
    );
    let s = body(serde_json::json!({"stream": "orders", "name": "stomp-jobs"}));
    assert!(handle(&b, "$hayate/api/consumer/add", &s, Some("bob")).ok);
    let sc = b.stream("orders").unwrap().consumer("stomp-jobs").unwrap();
    assert_eq!(
        sc.config().owner,
        None,
        "a STOMP queue's consumer is shared"
    );
    assert!(handle(&b, "$hayate/api/stream/rm", &name, Some("alice")).ok);

    // A stream of the configuration, deleted and re-made by bob through the API.
    let cfg = StreamConfig::new("conf", &["c/**"]);
    b.create_stream(cfg.clone()).unwrap();
    let conf = body(serde_json::json!({"name": "conf"}));
    assert!(handle(&b, "$hayate/api/stream/rm", &conf, Some("bob")).ok);
    let again = body(serde_json::json!({"name": "conf", "capture": ["c/**"]}));
    assert!(handle(&b, "$hayate/api/stream/add", &again, Some("bob")).ok);
    drop(b);
    let b = broker(&d);
    let (s, created) = b.create_stream(cfg).unwrap();
    assert!(!created);
    assert_eq!(s.config().owner.as_deref(), Some("bob"));
    drop(b);
    let _ = std::fs::remove_dir_all(&d);
}

/// A durable consumer's deliveries in the engine: what is given back goes out again before
/// new records, in offset order; giving back a superseded delivery changes nothing; an ack
/// of any delivery settles the offset (one waiting to go out again is then dropped); the
/// counts of deliveries survive a restart.
#[tokio::test]
async fn given_back_offsets_come_first_and_counts_survive_a_restart() {
    use std::time::Duration;
    let dir = data_dir("ledger");
    let b = broker(&dir);
    b.create_stream(StreamConfig::new("q", &["q/*"])).unwrap();
    b.create_consumer(hayate_broker::ConsumerConfig::new("q", "c"))
        .unwrap();
    let s = b.stream("q").unwrap();
    let mut scratch = Vec::new();
    for i in 0..5 {
        let r = s
            .append(Batch::One(&msg("q/x", format!("{i}"))), &mut scratch)
            .unwrap();
        s.log()
            .wait_confirmed(r.end - 1, Duration::from_secs(10))
            .unwrap();
    }
    let c = s.consumer("c").unwrap();
    assert_eq!(c.claim_next(), Some((0, 1)));
    assert_eq!(c.claim_next(), Some((1, 1)));
    assert_eq!(c.claim_next(), Some((2, 1)));
    c.give_back(2, 1, Duration::ZERO);
    c.give_back(0, 1, Duration::ZERO);
    c.give_back(0, 1, Duration::ZERO); // not in flight any more: nothing
    assert_eq!(c.claim_next(), Some((0, 2)));
    assert_eq!(c.claim_next(), Some((2, 2)));
    c.give_back(0, 1, Duration::ZERO); // superseded by delivery 2: nothing
    assert_eq!(c.claim_next(), Some((3, 1)));
    c.ack(1);
    c.give_back(2, 2, Duration::ZERO);
    c.ack(2); // a late ack of the delivery given back
    let i = c.info();
    assert_eq!((i.floor, i.in_flight, i.waiting), (0, 2, 1), "{i:?}");
    assert_eq!(c.claim_next(), Some((4, 1)), "2 is done: dropped");
    c.persist_now().unwrap();
    drop((c, s));
    drop(b);
    // Everything not done is ready again, in offset order, its count kept.
    let b = broker(&dir);
    let c = b.stream("q").unwrap().consumer("c").unwrap();
    assert_eq!(c.claim_next(), Some((0, 3)));
    assert_eq!(c.claim_next(), Some((3, 2)));
    assert_eq!(c.claim_next(), Some((4, 2)));
    assert_eq!(c.claim_next(), None);
    assert_eq!(c.info().floor, 0);
    drop(c);
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}
