//! The meta log: stream and consumer definitions and consumer positions as its records,
//! the migration of the files of format 1, and what survives a process kill and a power loss
//! (through `FaultyRoot`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::msg;
use hayate_broker::meta::record::{self, Position};
use hayate_broker::meta::{COMPACT_SLACK, Meta};
use hayate_broker::{Batch, Broker, BrokerConfig, ConsumerConfig, StreamConfig};
use hayate_log::{CrashMode, FaultyRoot, FsRoot, Root};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../hayate/tests/fixtures/data-844fe42/streams"
);

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hayate-meta-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn on_disk(dir: &Path) -> Broker {
    let b = Broker::new(BrokerConfig {
        data_dir: Some(dir.to_path_buf()),
        ..BrokerConfig::default()
    });
    b.open_streams().unwrap();
    b
}

fn on_root(root: &FaultyRoot) -> Broker {
    let b = Broker::new(BrokerConfig {
        data: Some(Arc::new(root.clone())),
        ..BrokerConfig::default()
    });
    b.open_streams().unwrap();
    b
}

/// `(floor, next, in flight + waiting)` of each consumer, by `stream/consumer`.
fn positions(b: &Broker) -> Vec<(String, u64, u64, u64)> {
    let mut v = Vec::new();
    for s in b.streams() {
        for c in s.consumer_list() {
            let i = c.info();
            v.push((
                format!("{}/{}", s.name(), c.config().name),
                i.floor,
                i.next,
                i.in_flight + i.waiting,
            ));
        }
    }
    v
}

/// The fixture's positions (its MANIFEST.md): after a restart what was delivered and not
/// acknowledged is waiting.
fn fixture_positions() -> Vec<(String, u64, u64, u64)> {
    [
        ("orders/billing", 2, 4, 1),
        ("queues/stomp-jobs", 1, 4, 2),
        ("sensors/archive", 6, 6, 0),
        ("sensors/dash", 3, 5, 2),
    ]
    .into_iter()
    .map(|(n, f, x, w)| (n.to_owned(), f, x, w))
    .collect()
}

#[test]
fn the_release_files_are_migrated_once_and_moved_aside() {
    let dir = temp("migrate");
    copy_dir(Path::new(FIXTURE), &dir.join("streams"));
    let end = {
        let b = on_disk(&dir);
        assert_eq!(positions(&b), fixture_positions());
        assert_eq!(b.stream("orders").unwrap().info().next, 6);
        let meta = b.meta().unwrap();
        assert!(meta.get(record::FORMAT_KEY).is_some());
        meta.log().end_offset()
    };
    for name in ["orders", "sensors", "queues"] {
        let s = dir.join("streams").join(name);
        assert!(!s.join("stream.json").exists(), "{name}");
        assert!(!s.join("consumers").exists(), "{name}");
        assert!(
            dir.join("legacy-1/streams")
                .join(name)
                .join("stream.json")
                .is_file()
        );
    }
    assert!(
        dir.join("legacy-1/streams/sensors/consumers/dash.json")
            .is_file()
    );
    // Restarted twice: no second migration, the same positions, nothing appended.
    for _ in 0..2 {
        let b = on_disk(&dir);
        assert_eq!(positions(&b), fixture_positions());
        assert_eq!(b.meta().unwrap().log().end_offset(), end);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_migration_cut_short_is_done_again_and_a_move_cut_short_is_finished() {
    let dir = temp("torn");
    copy_dir(Path::new(FIXTURE), &dir.join("streams"));
    {
        // A crash part-way: some records written, no `format`.
        let meta = Meta::open(&FsRoot(dir.clone())).unwrap();
        let bogus = Position {
            floor: 5,
            next: 5,
            ..Position::default()
        };
        meta.put_durable(&[
            (&record::stream_key("orders"), b"{}"),
            (&record::pos_key("orders", "billing"), &bogus.encode()),
        ])
        .unwrap();
    }
    {
        let b = on_disk(&dir);
        assert_eq!(positions(&b), fixture_positions());
    }
    // A crash after `format` was durable, in the middle of moving the files.
    let legacy = dir.join("legacy-1/streams/orders");
    std::fs::copy(
        legacy.join("stream.json"),
        dir.join("streams/orders/stream.json"),
    )
    .unwrap();
    let b = on_disk(&dir);
    assert_eq!(positions(&b), fixture_positions());
    assert!(!dir.join("streams/orders/stream.json").exists());
    assert!(legacy.join("stream.json").is_file());
    drop(b);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Publishes `n` messages on `k` into `s` and waits until they are confirmed.
fn fill(b: &Broker, s: &str, k: &str, n: usize) {
    let s = b.stream(s).unwrap();
    let mut scratch = Vec::new();
    for i in 0..n {
        let r = s
            .append(Batch::One(&msg(k, format!("{i}"))), &mut scratch)
            .unwrap();
        s.log()
            .wait_confirmed(r.end - 1, Duration::from_secs(10))
            .unwrap();
    }
}

fn take(b: &Broker, s: &str, c: &str, n: usize) -> Vec<u64> {
    let c = b.stream(s).unwrap().consumer(c).unwrap();
    (0..n)
        .map_while(|_| c.claim_next().map(|(o, _)| o))
        .collect()
}

fn ack(b: &Broker, s: &str, c: &str, offsets: impl IntoIterator<Item = u64>) {
    let c = b.stream(s).unwrap().consumer(c).unwrap();
    for o in offsets {
        c.ack(o);
    }
    c.persist_now().unwrap();
}

fn floor(b: &Broker, s: &str, c: &str) -> u64 {
    b.stream(s).unwrap().consumer(c).unwrap().info().floor
}

fn setup(root: &FaultyRoot, fsync: &str) -> Broker {
    let b = on_root(root);
    let mut sc = StreamConfig::new("s", &["s/**"]);
    sc.fsync = fsync.into();
    b.create_stream(sc).unwrap();
    b.create_consumer(ConsumerConfig::new("s", "c")).unwrap();
    b.create_consumer(ConsumerConfig::new("s", "gone")).unwrap();
    b.delete_consumer("s", "gone").unwrap();
    fill(&b, "s", "s/x", 20);
    assert_eq!(take(&b, "s", "c", 10), (0..10).collect::<Vec<_>>());
    ack(&b, "s", "c", 0..6);
    b.meta().unwrap().log().sync().unwrap();
    b
}

#[test]
fn definitions_and_positions_survive_a_process_kill_and_a_power_loss() {
    for mode in [
        CrashMode::ProcessKill,
        CrashMode::PowerLoss,
        CrashMode::TornPowerLoss { seed: 7 },
        CrashMode::TornPowerLoss { seed: 99 },
    ] {
        let root = FaultyRoot::new();
        let b = setup(&root, "always");
        // Acknowledged after the last sync: kept by a process kill, perhaps by a power loss.
        ack(&b, "s", "c", 6..8);
        let after = on_root(&root.crash(mode));
        let s = after.stream("s").expect("the stream's definition survives");
        assert!(
            s.consumer("gone").is_none(),
            "{mode:?}: a deleted consumer stays deleted"
        );
        assert_eq!(s.info().next, 20, "{mode:?}: confirmed records survive");
        let f = floor(&after, "s", "c");
        match mode {
            CrashMode::ProcessKill => assert_eq!(f, 8),
            _ => assert!((6..=8).contains(&f), "{mode:?}: floor {f}"),
        }
        // Everything not acknowledged comes again, from the floor.
        let again = take(&after, "s", "c", 20);
        assert_eq!(again.first(), Some(&f), "{mode:?}");
        assert_eq!(again.len() as u64, 20 - f, "{mode:?}");
        drop(b);
    }
}

/// A stream that syncs `never` loses its tail in a power loss while the meta log (`always`)
/// keeps a position beyond it: the position is moved back to the end and saved so before
/// anything is appended, so the offsets the new records take are delivered.
#[test]
fn a_position_beyond_a_stream_that_lost_its_tail_is_moved_back_and_saved() {
    let root = FaultyRoot::new();
    let b = setup(&root, "never");
    let lost = root.crash(CrashMode::PowerLoss);
    drop(b);
    let after = on_root(&lost);
    let end = after.stream("s").unwrap().info().next;
    assert!(end < 6, "the stream lost its unsynced records ({end})");
    assert_eq!(floor(&after, "s", "c"), end);
    // New records take the lost offsets; the process dies before the consumer saves
    // anything: the position it finds is the one moved back, not the one beyond the end.
    fill(&after, "s", "s/new", 3);
    let killed = lost.crash(CrashMode::ProcessKill);
    drop(after);
    let b = on_root(&killed);
    assert_eq!(take(&b, "s", "c", 10), (end..end + 3).collect::<Vec<_>>());
}

#[test]
fn the_meta_log_is_compacted_and_keeps_the_last_value_of_each_key() {
    let root = FaultyRoot::new();
    let meta = Meta::open(&root).unwrap();
    let big = vec![7u8; 4096];
    for i in 0..1000u32 {
        meta.put(&[("pos/s/c", &i.to_be_bytes()), ("pad", &big)])
            .unwrap();
    }
    meta.put(&[("pad", &[])]).unwrap();
    let held = meta.log().stats().bytes;
    assert!(
        held < 2 * COMPACT_SLACK + (1 << 20),
        "compacted: {held} bytes"
    );
    meta.log().sync().unwrap();
    drop(meta);
    let meta = Meta::open(&root.crash(CrashMode::PowerLoss)).unwrap();
    assert_eq!(meta.get("pos/s/c").unwrap().as_ref(), 999u32.to_be_bytes());
    assert!(meta.get("pad").is_none());
    assert_eq!(meta.scan("").len(), 1);
}

#[test]
fn staged_positions_are_appended_by_the_writer_within_its_period() {
    let root = FaultyRoot::new();
    let meta = Meta::open(&root).unwrap();
    let end = meta.log().end_offset();
    for i in 0..50u32 {
        meta.stage("pos/s/c".into(), i.to_be_bytes().to_vec());
    }
    std::thread::sleep(hayate_broker::meta::FLUSH_EVERY * 3);
    assert!(
        meta.log().end_offset() - end <= 2,
        "batched: {} records",
        meta.log().end_offset() - end
    );
    assert_eq!(meta.get("pos/s/c").unwrap().as_ref(), 49u32.to_be_bytes());
    let _ = Root::list(&root, "").unwrap();
}
