use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hayate_amqp::FieldTable;
use hayate_core::sync::lock;
use hayate_core::{Key, Message};
use hayate_log::{Entry, FsyncPolicy};

use super::defs::JOURNAL_FOLD_BYTES;
use super::entries::REWRITE_BYTES;
use super::log::COMPACT_SLACK;
use super::recovery::Recovered;
use super::{
    BindingDef, EdgeDef, ExchangeDef, QueueDef, Store, table_hex, table_of_hex, vhost_dir,
};
use hayate_broker::queue::{QItem, Via};

/// A directory of its own, removed when dropped.
struct TmpDir(PathBuf);
impl TmpDir {
    fn path(&self) -> &Path {
        &self.0
    }
}
impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn tempdir() -> TmpDir {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("hayate-amqp-store-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    TmpDir(d)
}

fn qmsg(key: &str, body: &str, persistent: bool) -> QItem {
    let mut msg = Message::new(Key::new(key).unwrap(), Bytes::from(body.to_string()));
    if persistent {
        msg.headers = Some(vec![("persistent".into(), Bytes::from_static(b"true"))]);
    }
    msg.correlation_id = Some(Bytes::from_static(b"c-1"));
    QItem {
        msg,
        via: Via {
            source: Bytes::from_static(b"amq.topic"),
            subject: Bytes::from_static(b"a.b"),
        },
        redelivered: false,
        expires: None,
        priority: 3,
        stored: None,
        returns: 0,
    }
}

fn def(id: u64) -> QueueDef {
    QueueDef {
        id,
        auto_delete: false,
        arguments: table_hex(&FieldTable::default()),
        bindings: vec![BindingDef {
            exchange: "amq.topic".into(),
            key: "a.*".into(),
            arguments: table_hex(&FieldTable::default()),
        }],
    }
}

#[test]
fn messages_not_settled_come_back_in_order_and_settled_ones_do_not() {
    let dir = tempdir();
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert!(rec.queues.is_empty());
    let q1 = s.new_queue_id();
    let q2 = s.new_queue_id();
    s.put_queue("one", def(q1)).unwrap();
    s.put_queue("two", def(q2)).unwrap();
    let mut offsets = Vec::new();
    for i in 0..10 {
        offsets.push(s.append(q1, &qmsg("a/b", &format!("m{i}"), true)).unwrap());
    }
    let o2 = s.append(q2, &qmsg("a/c", "other", true)).unwrap();
    s.settle(offsets[0]);
    s.settle(offsets[4]);
    s.settle(o2);
    s.flush();
    s.settle(offsets[9]); // not flushed: comes back (at least once)
    std::mem::forget(s); // as if killed: no last flush
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let one = &rec.queues.iter().find(|q| q.0 == "one").unwrap().2;
    let bodies: Vec<_> = one.iter().map(|m| m.msg.payload.clone()).collect();
    let want: Vec<Bytes> = [1, 2, 3, 5, 6, 7, 8, 9]
        .iter()
        .map(|i| Bytes::from(format!("m{i}")))
        .collect();
    assert_eq!(bodies, want);
    let m = &one[0];
    assert!(m.redelivered);
    assert_eq!(m.priority, 3);
    assert_eq!(&m.via.subject[..], b"a.b");
    assert_eq!(&m.via.source[..], b"amq.topic");
    assert_eq!(m.msg.correlation_id.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(m.msg.key.as_str(), "a/b");
    assert!(
        rec.queues
            .iter()
            .find(|q| q.0 == "two")
            .unwrap()
            .2
            .is_empty()
    );
    assert_eq!(s.held(), 8);
    assert_eq!(rec.queues[0].1.bindings, def(q1).bindings);
}

#[test]
fn a_deleted_queue_leaves_nothing_and_a_new_one_of_its_name_starts_empty() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let q1 = s.new_queue_id();
    s.put_queue("q", def(q1)).unwrap();
    s.append(q1, &qmsg("q", "old", true)).unwrap();
    s.remove_queue("q", q1).unwrap();
    let q2 = s.new_queue_id();
    s.put_queue("q", def(q2)).unwrap();
    s.append(q2, &qmsg("q", "new", true)).unwrap();
    drop(s);
    let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(rec.queues.len(), 1);
    let (name, d, msgs) = &rec.queues[0];
    assert_eq!((name.as_str(), d.id), ("q", q2));
    assert_eq!(msgs.len(), 1);
    assert_eq!(&msgs[0].msg.payload[..], b"new");
}

#[test]
fn exchanges_and_bindings_are_kept_and_an_exchange_takes_its_bindings_along() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let x = ExchangeDef {
        kind: "topic".into(),
        auto_delete: false,
        internal: false,
    };
    s.put_exchange("dx", x.clone()).unwrap();
    s.put_exchange("gone", x.clone()).unwrap();
    let id = s.new_queue_id();
    s.put_queue("q", def(id)).unwrap();
    let mut b = def(id).bindings;
    b.push(BindingDef {
        exchange: "gone".into(),
        key: "k".into(),
        arguments: table_hex(&FieldTable::default()),
    });
    s.set_bindings("q", id, b).unwrap();
    let edge = |s: &str, d: &str, k: &str| EdgeDef {
        source: s.into(),
        destination: d.into(),
        key: k.into(),
        arguments: table_hex(&FieldTable::default()),
    };
    s.put_edge(edge("amq.topic", "dx", "a.#")).unwrap();
    s.put_edge(edge("amq.topic", "dx", "b.#")).unwrap();
    s.put_edge(edge("amq.topic", "dx", "a.#")).unwrap(); // the same again: one
    s.put_edge(edge("gone", "dx", "k")).unwrap();
    s.put_edge(edge("dx", "gone", "k")).unwrap();
    s.remove_edge(edge("amq.topic", "dx", "b.#")).unwrap();
    s.remove_exchange("gone").unwrap();
    drop(s);
    let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(rec.exchanges, vec![("dx".to_string(), x)]);
    assert_eq!(rec.queues[0].1.bindings, def(id).bindings);
    assert_eq!(rec.edges, vec![edge("amq.topic", "dx", "a.#")]);
}

#[test]
fn segments_nobody_needs_are_removed_and_acks_shrink() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let id = s.new_queue_id();
    s.put_queue("q", def(id)).unwrap();
    let body = "x".repeat(64 << 10);
    // 48 MiB: three segments of 16 MiB.
    let offsets: Vec<u64> = (0..768)
        .map(|_| s.append(id, &qmsg("q", &body, true)).unwrap())
        .collect();
    for o in &offsets[..767] {
        s.settle(*o);
    }
    s.flush();
    assert!(s.log.start_offset() > 0, "old segments removed");
    drop(s);
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(rec.queues[0].2.len(), 1);
    assert_eq!(rec.queues[0].2[0].stored, Some(767));
    let acks = std::fs::metadata(dir.path().join("acks")).unwrap().len();
    assert!(
        acks / 8 < 767 - s.log.start_offset() + 1,
        "acks rewritten: {acks}"
    );
}

/// A store in `dir` (no fsync) with one durable queue, `q`: the store and its number.
fn store_with_queue(dir: &TmpDir) -> (Arc<Store>, u64) {
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let q = s.new_queue_id();
    s.put_queue("q", def(q)).unwrap();
    (s, q)
}

/// A store in `dir` (no fsync) whose log is on `disk` (faults, crashes).
fn open_faulty(dir: &TmpDir, disk: &Arc<hayate_log::FaultyStorage>) -> (Arc<Store>, Recovered) {
    Store::open_with(
        dir.path(),
        Some(disk.clone() as Arc<dyn hayate_log::Storage>),
        FsyncPolicy::Never,
        1 << 20,
    )
    .unwrap()
}

fn bodies(rec: &Recovered, queue: &str) -> Vec<String> {
    rec.queues
        .iter()
        .find(|q| q.0 == queue)
        .map(|q| {
            q.2.iter()
                .map(|m| {
                    String::from_utf8_lossy(&m.msg.payload[..8.min(m.msg.payload.len())])
                        .into_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_message_held_long_does_not_keep_the_log_from_shrinking() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let (q, other) = (s.new_queue_id(), s.new_queue_id());
    s.put_queue("held", def(q)).unwrap();
    s.put_queue("busy", def(other)).unwrap();
    let pad = "x".repeat(64 << 10);
    // Three messages a consumer keeps unacknowledged, stored between 200 MiB of others
    // that are acknowledged as they go.
    s.append(q, &qmsg("q", &format!("aaaaaaaa{pad}"), true))
        .unwrap();
    let mut most = 0;
    let mut moved_b = None;
    for i in 0..3200 {
        let o = s.append(other, &qmsg("o", &pad, true)).unwrap();
        s.settle(o);
        if i == 1000 {
            moved_b = Some(
                s.append(q, &qmsg("q", &format!("bbbbbbbb{pad}"), true))
                    .unwrap(),
            );
        }
        if i == 2000 {
            s.append(q, &qmsg("q", &format!("cccccccc{pad}"), true))
                .unwrap();
        }
        if i % 64 == 0 {
            s.flush();
            let bytes = s.log.stats().bytes;
            most = most.max(bytes);
            let held = lock(&s.st).live_bytes;
            assert!(
                bytes <= 2 * held + COMPACT_SLACK + (16 << 20) + (4 << 20),
                "log {bytes} B for {held} B held"
            );
        }
    }
    assert!(most < 64 << 20, "the log peaked at {most} B");
    // `a` and `b` were moved (their first segments are gone): their ids still settle.
    assert!(s.log.start_offset() > moved_b.unwrap());
    s.settle(moved_b.unwrap());
    s.flush();
    std::mem::forget(s); // as if killed
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(bodies(&rec, "held"), ["aaaaaaaa", "cccccccc"]);
    assert!(bodies(&rec, "busy").is_empty());
    assert_eq!(s.held(), 2);
}

#[test]
fn a_move_cut_short_by_a_crash_leaves_one_copy_in_its_place() {
    let dir = tempdir();
    let (s, q) = store_with_queue(&dir);
    let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
    s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
    // Moved once for good (the original settled) and then half moved again (the copy
    // written, the crash before the first copy was settled).
    let (c1, _) = s.copy_to_end(a).unwrap();
    s.settle(a);
    s.flush();
    s.copy_to_end(c1).unwrap();
    s.log.sync().unwrap();
    std::mem::forget(s);
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    // Once, and before `b`, which was stored after it.
    assert_eq!(bodies(&rec, "q"), ["aaaaaaaa", "bbbbbbbb"]);
    assert_eq!(s.held(), 2);
}

#[test]
fn return_counts_survive_a_crash_and_go_with_their_message() {
    let dir = tempdir();
    let (s, q) = store_with_queue(&dir);
    let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
    let b = s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
    let c = s.append(q, &qmsg("q", "cccccccc", true)).unwrap();
    s.note_return(a, 1);
    s.note_return(a, 2);
    s.note_return(b, 1);
    s.settle(b); // settled: its count goes with it
    // Moved (as a compaction does), then given back: the count follows its id.
    let (moved, bytes) = s.copy_to_end(c).unwrap();
    lock(&s.st).moved_to(c, moved, bytes);
    s.note_return(c, 5);
    s.flush();
    std::mem::forget(s);
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let msgs = &rec.queues[0].2;
    let got: Vec<_> = msgs.iter().map(|m| (m.stored, m.returns)).collect();
    assert_eq!(got, [(Some(a), 2), (Some(c), 5)]);
    // Ids stay what they were: settling `c` by its id after the restart works.
    s.settle(c);
    s.flush();
    drop(s);
    let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(bodies(&rec, "q"), ["aaaaaaaa"]);
    assert_eq!(
        std::fs::metadata(dir.path().join("returns")).unwrap().len(),
        12
    );
}

#[test]
fn a_message_returned_without_end_keeps_the_returns_file_small() {
    // A consumer that nacks with requeue in a tight loop (no delivery limit).
    let dir = tempdir();
    let (s, q) = store_with_queue(&dir);
    let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
    let path = dir.path().join("returns");
    let mut most = 0;
    for n in 1..=300_000u32 {
        s.note_return(a, n);
        if n % 1000 == 0 {
            s.flush();
            most = most.max(std::fs::metadata(&path).unwrap().len());
        }
    }
    assert!(
        most <= (REWRITE_BYTES + 12 * 1000),
        "returns grew to {most} B"
    );
    std::mem::forget(s);
    let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(rec.queues[0].2[0].returns, 300_000);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 12);
}

#[test]
fn a_move_that_fails_leaves_no_copy_to_come_back() {
    let dir = tempdir();
    let disk = Arc::new(hayate_log::FaultyStorage::new());
    let (s, _) = open_faulty(&dir, &disk);
    let q = s.new_queue_id();
    s.put_queue("q", def(q)).unwrap();
    let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
    s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
    let pad = "x".repeat(64 << 10);
    for _ in 0..800 {
        let o = s.append(q, &qmsg("o", &pad, true)).unwrap();
        s.settle(o);
    }
    // The disk fills while the two are moved: `a`'s copy is written, `b`'s is not.
    disk.fail_writes_after(200);
    s.flush();
    disk.clear_write_faults();
    assert!(s.log.start_offset() <= a, "nothing moved for good");
    // `a` is acknowledged: neither it nor the copy the failed move wrote comes back.
    s.settle(a);
    s.flush();
    std::mem::forget(s);
    let disk = Arc::new(disk.crash(hayate_log::CrashMode::ProcessKill));
    let (s, rec) = open_faulty(&dir, &disk);
    assert_eq!(bodies(&rec, "q"), ["bbbbbbbb"]);
    assert_eq!(s.held(), 1);
}

#[test]
fn the_largest_record_taken_can_still_be_moved() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 10).unwrap();
    let q = s.new_queue_id();
    let o = s.append(q, &qmsg("q", "x", true)).unwrap();
    let overhead = lock(&s.st).live_bytes as usize - 1;
    s.settle(o);
    let body = "y".repeat(s.max_record - overhead);
    let big = s.append(q, &qmsg("q", &body, true)).unwrap();
    assert!(
        s.copy_to_end(big).is_ok(),
        "a moved head is larger: room is kept for it"
    );
    let over = format!("{body}z");
    assert!(matches!(
        s.append(q, &qmsg("q", &over, true)),
        Err(hayate_log::Error::RecordTooLarge { .. })
    ));
}

#[test]
fn a_power_loss_right_after_a_move_keeps_the_message() {
    // A message durable before it is moved stays durable: the copy is synced before the
    // original is settled. (No fsync policy here, so that only the explicit syncs, the
    // test's and the moves', make anything durable.)
    let dir = tempdir();
    let disk = Arc::new(hayate_log::FaultyStorage::new());
    let (s, _) = open_faulty(&dir, &disk);
    let q = s.new_queue_id();
    s.put_queue("q", def(q)).unwrap();
    // Held (a consumer that does not acknowledge), then 40 MiB acknowledged as they go.
    s.append(q, &qmsg("q", "held-one", true)).unwrap();
    let pad = "x".repeat(64 << 10);
    for _ in 0..640 {
        let o = s.append(q, &qmsg("o", &pad, true)).unwrap();
        s.settle(o);
    }
    s.log.sync().unwrap(); // as confirms under `always` wait for
    s.flush(); // moves `held-one` and removes the segments before it
    assert!(s.log.start_offset() > 0, "moved and removed");
    std::mem::forget(s);
    let disk = Arc::new(disk.crash(hayate_log::CrashMode::PowerLoss));
    let (s, rec) = open_faulty(&dir, &disk);
    assert_eq!(bodies(&rec, "q"), ["held-one"]);
    assert_eq!(s.held(), 1);
}

#[test]
fn a_torn_ack_and_a_garbage_record_are_survived() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let id = s.new_queue_id();
    s.put_queue("q", def(id)).unwrap();
    let a = s.append(id, &qmsg("q", "a", true)).unwrap();
    // A record of another format: skipped with a warning.
    s.log
        .append(&Entry {
            timestamp: 0,
            key: b"q",
            headers: &[9, 9, 9],
            value: b"junk",
        })
        .unwrap();
    let b = s.append(id, &qmsg("q", "b", true)).unwrap();
    s.settle(a);
    s.flush();
    drop(s);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("acks"))
        .unwrap();
    f.write_all(&[0, 0, 0]).unwrap(); // torn
    drop(f);
    let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let msgs = &rec.queues[0].2;
    assert_eq!(msgs.len(), 1);
    assert_eq!(msgs[0].stored, Some(b));
}

#[test]
fn definitions_are_a_journal_folded_into_a_snapshot() {
    let dir = tempdir();
    let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    // Many changes: each is a line, and the log is folded as it grows, so the bytes
    // written stay proportional to the changes, not to changes x definitions.
    let mut kept = Vec::new();
    for i in 0..3000 {
        let id = s.new_queue_id();
        let name = format!("q{i}");
        s.put_queue(&name, def(id)).unwrap();
        if i % 3 == 0 {
            kept.push((name, id));
        } else {
            s.remove_queue(&name, id).unwrap();
        }
        if i % 500 == 0 {
            s.flush();
        }
    }
    s.flush();
    let log = std::fs::metadata(dir.path().join("definitions.log"))
        .unwrap()
        .len();
    let snap = std::fs::metadata(dir.path().join("definitions.json"))
        .unwrap()
        .len();
    assert!(
        log < 2 * JOURNAL_FOLD_BYTES.max(snap),
        "log {log}, snapshot {snap}"
    );
    std::mem::forget(s);
    // A line torn by a crash at the end is left out; the rest is read.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("definitions.log"))
        .unwrap();
    f.write_all(b"{\"op\":\"remove_queue\",\"na").unwrap();
    drop(f);
    let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
    let names: Vec<&str> = rec.queues.iter().map(|q| q.0.as_str()).collect();
    assert_eq!(names.len(), kept.len());
    for (n, id) in &kept {
        assert!(rec.queues.iter().any(|q| &q.0 == n && q.1.id == *id), "{n}");
    }
    // Numbers go on from the highest given.
    assert!(s.new_queue_id() > kept.last().unwrap().1);
    drop(s);
    // Garbage before the last line is an error, not a silent loss.
    std::fs::write(
        dir.path().join("definitions.log"),
        b"garbage\n{\"op\":\"remove_exchange\",\"name\":\"x\"}\n",
    )
    .unwrap();
    assert!(Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).is_err());
}

#[test]
fn a_full_disk_and_a_failed_fsync_reach_the_publisher() {
    let dir = tempdir();
    let disk = Arc::new(hayate_log::FaultyStorage::new());
    let (s, _) = Store::open_with(
        dir.path(),
        Some(disk.clone() as Arc<dyn hayate_log::Storage>),
        FsyncPolicy::Always,
        1 << 20,
    )
    .unwrap();
    let id = s.new_queue_id();
    s.put_queue("q", def(id)).unwrap();
    // A failed fsync: the append is written, but its confirm resolves with the error
    // (the publisher gets basic.nack), and the log refuses later appends.
    disk.fail_syncs(1);
    let o = s.append(id, &qmsg("q", "a", true)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let waited = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), s.confirmed(o).unwrap()).await
    });
    assert!(waited.expect("the confirm resolves").is_err());
    assert!(s.append(id, &qmsg("q", "b", true)).is_err());
    assert_eq!(s.held(), 1, "a refused append is not held");
    // A full disk on a fresh store: the append fails, nothing is held.
    let dir2 = tempdir();
    let disk2 = Arc::new(hayate_log::FaultyStorage::new());
    let (s2, _) = Store::open_with(
        dir2.path(),
        Some(disk2.clone() as Arc<dyn hayate_log::Storage>),
        FsyncPolicy::Never,
        1 << 20,
    )
    .unwrap();
    let id2 = s2.new_queue_id();
    disk2.fail_writes_after(0);
    assert!(s2.append(id2, &qmsg("q", "c", true)).is_err());
    assert_eq!(s2.held(), 0);
    disk2.clear_write_faults();
}

#[test]
fn hex_tables_round_trip_and_vhost_dirs_are_file_names() {
    let mut t = FieldTable::default();
    t.insert("x-max-length", hayate_amqp::FieldValue::I32(5));
    assert_eq!(table_of_hex(&table_hex(&t)).unwrap(), t);
    assert!(table_of_hex("zz").is_err());
    assert!(table_of_hex("000000").is_err());
    assert_eq!(vhost_dir("/"), "default");
    assert_eq!(vhost_dir("a/b c%"), "vhost-a%2Fb%20c%25");
    assert_ne!(vhost_dir("default"), vhost_dir("/"));
}
