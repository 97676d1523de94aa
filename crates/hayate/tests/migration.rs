//! Migration: the data directory written by the release before issue 45 changes the durable
//! format (`tests/fixtures/data-844fe42/`, made by `scripts/make-data-fixture`; its
//! `MANIFEST.md` lists what is in it) opens with this tree's broker and keeps every stream
//! record (headers included) and every durable consumer's position. The MQTT, STOMP and AMQP
//! parts of the same directory are checked by `tests/interop/test_migration.py`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use hayate_client::streams::ConsumerConfig;
use hayate_client::{Client, Message};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/data-844fe42");
/// The same clients' work, the broker killed with SIGKILL instead of stopped
/// (`scripts/make-data-fixture --kill`): positions as last written.
const FIXTURE_KILLED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/data-844fe42-kill"
);

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else if e.file_name() != "MANIFEST.md" {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A stream delivery as `(offset, key, payload, deliveries)`.
fn seen(m: &Message) -> (u64, String, String, u32) {
    (
        m.attrs.stream_offset.expect("a stream delivery"),
        m.key.as_str().to_owned(),
        String::from_utf8_lossy(&m.payload).into_owned(),
        m.attrs.deliveries,
    )
}

/// Joins `stream`/`consumer`, takes `n` deliveries and then whatever comes within 500 ms,
/// acknowledges them all and leaves.
async fn consume(c: &Client, stream: &str, consumer: &str, n: usize) -> Vec<Message> {
    let mut sub = c.consume(stream, consumer).await.unwrap();
    let mut got = Vec::new();
    while got.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap_or_else(|_| panic!("{stream}/{consumer}: {} of {n} deliveries", got.len()))
            .expect("the subscription ended");
        got.push(m);
    }
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        got.push(m);
    }
    for m in &got {
        c.ack(m).unwrap();
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_data_directory_keeps_streams_and_consumer_positions() {
    keeps_streams_and_positions(FIXTURE, "stopped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_killed_release_data_directory_keeps_streams_and_consumer_positions() {
    keeps_streams_and_positions(FIXTURE_KILLED, "killed").await;
}

async fn keeps_streams_and_positions(fixture: &str, tag: &str) {
    assert!(
        Path::new(fixture).join("streams").is_dir(),
        "no fixture at {fixture} (scripts/make-data-fixture makes it)"
    );
    let dir = std::env::temp_dir().join(format!("hayate-migration-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(Path::new(fixture), &dir);
    let mut args: Vec<&OsStr> = common::NATIVE_ONLY.iter().map(OsStr::new).collect();
    args.extend(["--admin", "off", "--data"].map(OsStr::new));
    args.push(dir.as_os_str());
    let broker = common::Broker::start(&args, false);
    let c = Client::connect(&broker.native).await.unwrap();

    // Every stream with its offsets and records.
    for name in ["orders", "sensors", "queues"] {
        let info = c.streams().info(name).await.unwrap();
        assert_eq!((info.first, info.next, info.records), (0, 6, 6), "{name}");
    }

    // Every consumer where it was: floor (all below done) and next (never delivered from).
    let mut positions = Vec::new();
    for stream in ["orders", "sensors", "queues"] {
        for v in c.streams().consumer_list(stream).await.unwrap() {
            positions.push((
                format!("{stream}/{}", v.config.name),
                v.state.floor,
                v.state.next,
                v.state.done_above_floor,
            ));
        }
    }
    positions.sort();
    assert_eq!(
        positions,
        [
            ("orders/billing".to_owned(), 2, 4, 1),
            ("queues/stomp-jobs".to_owned(), 1, 4, 1),
            ("sensors/archive".to_owned(), 6, 6, 0),
            ("sensors/dash".to_owned(), 3, 5, 0),
        ]
    );

    // The records, keys, payloads and headers, read by a new consumer from the first.
    c.streams()
        .consumer_add(&ConsumerConfig::new("orders", "migration-all"))
        .await
        .unwrap();
    let got = consume(&c, "orders", "migration-all", 6).await;
    let headers: Vec<Vec<(String, String)>> = got
        .iter()
        .map(|m| {
            m.headers
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect()
        })
        .collect();
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        got.iter().map(seen).collect::<Vec<_>>(),
        [
            (0, "orders/eu/1", "order-1", 1),
            (1, "orders/eu/2", "order-2", 1),
            (2, "orders/us/3", "order-3", 1),
            (3, "orders/us/4", "order-4", 1),
            (4, "orders/eu/5", "order-5", 1),
            (5, "orders/asia/6", "{\"id\":6}", 1),
        ]
        .map(|(o, k, p, d)| (o, k.to_owned(), p.to_owned(), d))
    );
    assert_eq!(
        headers,
        [
            vec![],
            h(&[("customer", "alice"), ("priority", "high")]),
            vec![],
            h(&[("customer", "bob")]),
            vec![],
            h(&[("content-type", "application/json")]),
        ]
    );

    // billing: 2 was delivered and not acknowledged (its second delivery now), 3 was
    // acknowledged, 4 and 5 never delivered.
    let got = consume(&c, "orders", "billing", 3).await;
    assert_eq!(
        got.iter()
            .map(|m| (seen(m).0, seen(m).3, m.attrs.redelivered))
            .collect::<Vec<_>>(),
        [(2, 2, true), (4, 1, false), (5, 1, false)]
    );
    // dash (from offset 1): 1 and 2 acknowledged, 3 and 4 delivered once, 5 never.
    let got = consume(&c, "sensors", "dash", 3).await;
    assert_eq!(
        got.iter().map(seen).collect::<Vec<_>>(),
        [
            (3, "sensors/h1".to_owned(), "55".to_owned(), 2),
            (4, "sensors/t2".to_owned(), "21.5".to_owned(), 2),
            (5, "sensors/t1".to_owned(), "19.5".to_owned(), 1),
        ]
    );
    // archive: made after the last record.
    assert!(consume(&c, "sensors", "archive", 0).await.is_empty());

    c.close().await.unwrap();
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
