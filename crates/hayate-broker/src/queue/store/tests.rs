//! The queue store through a [`FaultyRoot`] (its log and the meta log on one disk, crashed
//! together).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hayate_core::sync::lock;
use hayate_core::{Key, Message};
use hayate_log::{CrashMode, Entry, FaultyRoot, FsyncPolicy};

use super::log::COMPACT_SLACK;
use super::{Recovered, Store, dir_of, settled};
use crate::meta::Meta;
use crate::queue::{QItem, Via};

pub(super) fn qmsg(key: &str, body: &str) -> QItem {
    let mut msg = Message::new(Key::new(key).unwrap(), Bytes::from(body.to_string()));
    msg.headers = Some(vec![("persistent".into(), Bytes::from_static(b"true"))]);
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

/// A store of namespace `""` on `root` (no fsync of its log), with its meta log.
pub(super) fn open_on(root: &FaultyRoot, max: usize) -> (Arc<Store>, Recovered) {
    let meta = Arc::new(Meta::open(root).unwrap());
    Store::open(root, meta, "", FsyncPolicy::Never, max).unwrap()
}

fn open(root: &FaultyRoot) -> (Arc<Store>, Recovered) {
    open_on(root, 1 << 20)
}

/// `s` with queue `name` (its number).
fn with_queue(s: &Store, name: &str) -> u64 {
    let q = s.new_queue_id();
    s.put_queue(name, q, b"def").unwrap();
    q
}

/// What a restart after `mode` finds, `s` flushed first or not.
pub(super) fn crash(root: &FaultyRoot, s: Arc<Store>, flush: bool, mode: CrashMode) -> FaultyRoot {
    if flush {
        s.flush();
        s.meta.flush();
    }
    let after = root.crash(mode);
    drop(s);
    after
}

/// `s` flushed and what it handed the meta log synced.
fn flush_durably(s: &Store) {
    s.flush();
    s.meta.flush();
    let end = s.meta.log().end_offset();
    s.meta.wait(end.saturating_sub(1)).unwrap();
}

fn bodies(rec: &Recovered, queue: &str) -> Vec<String> {
    rec.queues
        .iter()
        .find(|q| q.name == queue)
        .map(|q| {
            q.items
                .iter()
                .map(|m| {
                    let p = &m.msg.payload;
                    String::from_utf8_lossy(&p[..8.min(p.len())]).into_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn messages_not_settled_come_back_in_order_and_settled_ones_do_not() {
    let root = FaultyRoot::new();
    let (s, rec) = open(&root);
    assert!(rec.queues.is_empty());
    let (q1, q2) = (with_queue(&s, "one"), with_queue(&s, "two"));
    let offsets: Vec<u64> = (0..10)
        .map(|i| s.append(q1, &qmsg("a/b", &format!("m{i}"))).unwrap())
        .collect();
    let o2 = s.append(q2, &qmsg("a/c", "other")).unwrap();
    s.settle(offsets[0]);
    s.settle(offsets[4]);
    s.settle(o2);
    s.flush();
    s.meta.flush();
    s.settle(offsets[9]); // not flushed: comes back (at least once)
    let root = crash(&root, s, false, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(
        bodies(&rec, "one"),
        ["m1", "m2", "m3", "m5", "m6", "m7", "m8", "m9"]
    );
    let m = &rec.queues[0].items[0];
    assert!(m.redelivered);
    assert_eq!(m.priority, 3);
    assert_eq!(
        (&m.via.source[..], &m.via.subject[..]),
        (&b"amq.topic"[..], &b"a.b"[..])
    );
    assert_eq!(m.msg.correlation_id.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(m.msg.key.as_str(), "a/b");
    assert!(bodies(&rec, "two").is_empty());
    assert_eq!(s.held(), 8);
    assert_eq!(&rec.queues[0].def[..], b"def");
}

#[test]
fn a_deleted_queue_leaves_nothing_and_a_new_one_of_its_name_starts_empty() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q1 = with_queue(&s, "q");
    s.append(q1, &qmsg("q", "old")).unwrap();
    s.remove_queue("q", q1).unwrap();
    let q2 = with_queue(&s, "q");
    s.remove_queue("q", q1).unwrap(); // the first one's delete again: not the second
    s.append(q2, &qmsg("q", "new")).unwrap();
    let root = crash(&root, s, false, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(rec.queues.len(), 1);
    assert_eq!((rec.queues[0].name.as_str(), rec.queues[0].id), ("q", q2));
    assert_eq!(bodies(&rec, "q"), ["new"]);
    assert!(s.new_queue_id() > q2, "numbers are never given twice");
}

#[test]
fn definitions_are_kept_by_key_and_survive_a_power_loss_once_answered() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let put = |k: &str, v: &[u8]| s.put_defs(&[(k.to_string(), v.to_vec())]).unwrap();
    put("exchange/dx", b"topic");
    put("exchange/gone", b"topic");
    put("edge/a%2Fb/dx", b"1");
    put("exchange/gone", b"");
    assert!(s.put_defs(&[("queue/x".into(), vec![1])]).is_err());
    let q = with_queue(&s, "a/q");
    s.set_queue("a/q", q, b"bound").unwrap();
    s.set_queue("a/q", q + 7, b"not this one").unwrap();
    s.set_queue("never", q, b"nor this").unwrap();
    // Synced before each call returned: a power loss keeps them all.
    let root = crash(&root, s, false, CrashMode::PowerLoss);
    let (_, rec) = open(&root);
    let defs: Vec<(&str, &[u8])> = rec.defs.iter().map(|(k, v)| (k.as_str(), &v[..])).collect();
    assert_eq!(
        defs,
        [("edge/a%2Fb/dx", &b"1"[..]), ("exchange/dx", b"topic")]
    );
    assert_eq!(rec.queues.len(), 1);
    assert_eq!(
        (rec.queues[0].name.as_str(), &rec.queues[0].def[..]),
        ("a/q", &b"bound"[..])
    );
}

#[test]
fn segments_nobody_needs_are_removed_and_the_settlement_stays_small() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let id = with_queue(&s, "q");
    let body = "x".repeat(64 << 10);
    // 48 MiB: three segments of 16 MiB; every other one settled, then all but the last.
    let offsets: Vec<u64> = (0..768)
        .map(|_| s.append(id, &qmsg("q", &body)).unwrap())
        .collect();
    for o in offsets[..767].iter().step_by(2) {
        s.settle(*o);
    }
    s.flush();
    for o in offsets[1..767].iter().step_by(2) {
        s.settle(*o);
    }
    s.flush();
    assert!(s.log.start_offset() > 0, "old segments removed");
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(rec.queues[0].items.len(), 1);
    assert_eq!(rec.queues[0].items[0].stored, Some(767));
    let v = s.meta.get(&settled::settled_key("")).unwrap();
    assert_eq!(settled::decode_settled(&v).unwrap(), (767, vec![]));
    assert!(v.len() < 64, "rewritten whole at open: {} B", v.len());
}

#[test]
fn a_message_held_long_does_not_keep_the_log_from_shrinking() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let (q, other) = (with_queue(&s, "held"), with_queue(&s, "busy"));
    let pad = "x".repeat(64 << 10);
    // Three messages a consumer keeps unacknowledged, stored between 200 MiB of others
    // that are acknowledged as they go.
    s.append(q, &qmsg("q", &format!("aaaaaaaa{pad}"))).unwrap();
    let mut most = 0;
    let mut moved_b = None;
    for i in 0..3200 {
        let o = s.append(other, &qmsg("o", &pad)).unwrap();
        s.settle(o);
        if i == 1000 {
            moved_b = Some(s.append(q, &qmsg("q", &format!("bbbbbbbb{pad}"))).unwrap());
        }
        if i == 2000 {
            s.append(q, &qmsg("q", &format!("cccccccc{pad}"))).unwrap();
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
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(bodies(&rec, "held"), ["aaaaaaaa", "cccccccc"]);
    assert!(bodies(&rec, "busy").is_empty());
    assert_eq!(s.held(), 2);
}

#[test]
fn a_move_cut_short_by_a_crash_leaves_one_copy_in_its_place() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    let a = s.append(q, &qmsg("q", "aaaaaaaa")).unwrap();
    s.append(q, &qmsg("q", "bbbbbbbb")).unwrap();
    // Moved once for good (the original settled) and then half moved again (the copy
    // written, the crash before the first copy was settled).
    let (c1, bytes) = s.copy_to_end(a).unwrap();
    lock(&s.st).moved_to(a, c1, bytes);
    s.flush();
    s.meta.flush();
    s.copy_to_end(c1).unwrap();
    s.log.sync().unwrap();
    let root = crash(&root, s, false, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    // Once, and before `b`, which was stored after it.
    assert_eq!(bodies(&rec, "q"), ["aaaaaaaa", "bbbbbbbb"]);
    assert_eq!(s.held(), 2);
}

#[test]
fn return_counts_survive_a_crash_and_go_with_their_message() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    let a = s.append(q, &qmsg("q", "aaaaaaaa")).unwrap();
    let b = s.append(q, &qmsg("q", "bbbbbbbb")).unwrap();
    let c = s.append(q, &qmsg("q", "cccccccc")).unwrap();
    s.note_return(a, 1);
    s.note_return(a, 2);
    s.note_return(b, 1);
    s.settle(b); // settled: its count goes with it
    // Moved (as a compaction does), then given back: the count follows its id.
    let (moved, bytes) = s.copy_to_end(c).unwrap();
    lock(&s.st).moved_to(c, moved, bytes);
    s.note_return(c, 5);
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    let got: Vec<_> = rec.queues[0]
        .items
        .iter()
        .map(|m| (m.stored, m.returns))
        .collect();
    assert_eq!(got, [(Some(a), 2), (Some(c), 5)]);
    // Ids stay what they were: settling `c` by its id after the restart works.
    s.settle(c);
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(bodies(&rec, "q"), ["aaaaaaaa"]);
    let counts = settled::decode_returns(&s.meta.get(&settled::returns_key("")).unwrap());
    assert_eq!(counts.unwrap().len(), 1);
}

#[test]
fn a_message_returned_without_end_keeps_the_returns_record_small() {
    // A consumer that nacks with requeue in a tight loop (no delivery limit).
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    let a = s.append(q, &qmsg("q", "aaaaaaaa")).unwrap();
    let mut most = 0;
    for n in 1..=30_000u32 {
        s.note_return(a, n);
        if n % 10 == 0 {
            s.flush();
            s.meta.flush();
            most = most.max(s.meta.get(&settled::returns_key("")).unwrap().len());
        }
    }
    assert!(most <= 2 * (64 << 10) + 64, "returns grew to {most} B");
    assert!(
        s.meta.log().stats().bytes < 8 << 20,
        "the meta log is compacted"
    );
    let root = crash(&root, s, false, CrashMode::ProcessKill);
    let (_, rec) = open(&root);
    assert_eq!(rec.queues[0].items[0].returns, 30_000);
}

#[test]
fn a_move_that_fails_leaves_no_copy_to_come_back() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    let a = s.append(q, &qmsg("q", "aaaaaaaa")).unwrap();
    s.append(q, &qmsg("q", "bbbbbbbb")).unwrap();
    let pad = "x".repeat(64 << 10);
    for _ in 0..800 {
        let o = s.append(q, &qmsg("o", &pad)).unwrap();
        s.settle(o);
    }
    // The disk fills while the two are moved: `a`'s copy is written, `b`'s is not.
    root.disk().fail_writes_after(200);
    s.flush();
    root.disk().clear_write_faults();
    assert!(s.log.start_offset() <= a, "nothing moved for good");
    // `a` is acknowledged: neither it nor the copy the failed move wrote comes back.
    s.settle(a);
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(bodies(&rec, "q"), ["bbbbbbbb"]);
    assert_eq!(s.held(), 1);
}

#[test]
fn the_largest_record_taken_can_still_be_moved() {
    let root = FaultyRoot::new();
    let (s, _) = open_on(&root, 1 << 10);
    let q = s.new_queue_id();
    let o = s.append(q, &qmsg("q", "x")).unwrap();
    let overhead = lock(&s.st).live_bytes as usize - 1;
    s.settle(o);
    let body = "y".repeat(s.max_record - overhead);
    let big = s.append(q, &qmsg("q", &body)).unwrap();
    assert!(
        s.copy_to_end(big).is_ok(),
        "a moved head is larger: room is kept for it"
    );
    assert!(matches!(
        s.append(q, &qmsg("q", &format!("{body}z"))),
        Err(hayate_log::Error::RecordTooLarge { .. })
    ));
}

#[test]
fn a_power_loss_right_after_a_move_keeps_the_message() {
    // A message durable before it is moved stays durable: the copy is synced before the
    // original is settled. (No fsync policy here, so that only the explicit syncs, the
    // test's and the moves', make anything durable.)
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    // Held (a consumer that does not acknowledge), then 40 MiB acknowledged as they go.
    s.append(q, &qmsg("q", "held-one")).unwrap();
    let pad = "x".repeat(64 << 10);
    for _ in 0..640 {
        let o = s.append(q, &qmsg("o", &pad)).unwrap();
        s.settle(o);
    }
    s.log.sync().unwrap(); // as confirms under `always` wait for
    flush_durably(&s); // moves `held-one`, removes the segments before it
    assert!(s.log.start_offset() > 0, "moved and removed");
    let root = crash(&root, s, false, CrashMode::PowerLoss);
    let (s, rec) = open(&root);
    assert_eq!(bodies(&rec, "q"), ["held-one"]);
    assert_eq!(s.held(), 1);
}

#[test]
fn a_torn_settlement_and_a_garbage_record_are_survived() {
    for seed in 0..8 {
        let root = FaultyRoot::new();
        let (s, _) = open(&root);
        let id = with_queue(&s, "q");
        let a = s.append(id, &qmsg("q", "a")).unwrap();
        // A record of another format: skipped with a warning.
        let junk = Entry {
            timestamp: 0,
            key: b"q",
            headers: &[9, 9, 9],
            value: b"junk",
        };
        s.log.append(&junk).unwrap();
        let b = s.append(id, &qmsg("q", "b")).unwrap();
        s.log.sync().unwrap();
        s.settle(a);
        // The settlement's record is torn by the power loss (the meta log's writer had
        // not synced it yet): `a` comes back, at least once; `b` is there.
        let root = crash(&root, s, true, CrashMode::TornPowerLoss { seed });
        let (_, rec) = open(&root);
        let got: Vec<_> = rec.queues[0].items.iter().map(|m| m.stored).collect();
        assert!(
            got == [Some(b)] || got == [Some(a), Some(b)],
            "seed {seed}: {got:?}"
        );
    }
}

#[test]
fn a_settled_range_beyond_the_end_is_cut_before_new_records_take_its_offsets() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let q = with_queue(&s, "q");
    // Ten records never synced, settled, and the settlement synced (the meta log syncs).
    for i in 0..10 {
        let o = s.append(q, &qmsg("q", &format!("lost-{i}"))).unwrap();
        s.settle(o);
    }
    flush_durably(&s);
    let root = crash(&root, s, false, CrashMode::PowerLoss);
    let (s, rec) = open(&root);
    assert_eq!(s.log.end_offset(), 0, "the records were lost");
    assert!(bodies(&rec, "q").is_empty());
    // New records take offsets 0..3: a settlement of 0..10 would hide them.
    for i in 0..3 {
        s.append(q, &qmsg("q", &format!("new-{i}"))).unwrap();
    }
    s.log.sync().unwrap();
    let root = crash(&root, s, false, CrashMode::PowerLoss);
    let (_, rec) = open(&root);
    assert_eq!(bodies(&rec, "q"), ["new-0", "new-1", "new-2"]);
}

#[test]
fn definitions_churned_keep_the_meta_log_small() {
    let root = FaultyRoot::new();
    let (s, _) = open(&root);
    let mut kept = Vec::new();
    for i in 0..3000 {
        let name = format!("q{i}");
        let id = with_queue(&s, &name);
        s.set_queue(&name, id, format!("bound-{i}").as_bytes())
            .unwrap();
        if i % 3 == 0 {
            kept.push((name, id));
        } else {
            s.remove_queue(&name, id).unwrap();
        }
    }
    let bytes = s.meta.log().stats().bytes;
    assert!(bytes < 4 << 20, "meta log {bytes} B after 9,000 changes");
    let root = crash(&root, s, true, CrashMode::ProcessKill);
    let (s, rec) = open(&root);
    assert_eq!(rec.queues.len(), kept.len());
    for (n, id) in &kept {
        assert!(
            rec.queues.iter().any(|q| &q.name == n && q.id == *id),
            "{n}"
        );
    }
    // Numbers go on from the highest given.
    assert!(s.new_queue_id() > 3000);
}

#[test]
fn a_full_disk_and_a_failed_fsync_reach_the_publisher() {
    let root = FaultyRoot::new();
    let meta = Arc::new(Meta::open(&root).unwrap());
    let (s, _) = Store::open(&root, meta, "", FsyncPolicy::Always, 1 << 20).unwrap();
    let id = with_queue(&s, "q");
    // A failed fsync: the append is written, but its confirm resolves with the error
    // (the publisher gets basic.nack), and the log refuses later appends.
    root.disk().fail_syncs(1);
    let o = s.append(id, &qmsg("q", "a")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let waited = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), s.confirmed(o).unwrap()).await
    });
    assert!(waited.expect("the confirm resolves").is_err());
    assert!(s.append(id, &qmsg("q", "b")).is_err());
    assert_eq!(s.held(), 1, "a refused append is not held");
    // A full disk on a fresh store: the append fails, nothing is held.
    let root2 = FaultyRoot::new();
    let (s2, _) = open(&root2);
    let id2 = s2.new_queue_id();
    root2.disk().fail_writes_after(0);
    assert!(s2.append(id2, &qmsg("q", "c")).is_err());
    assert_eq!(s2.held(), 0);
    root2.disk().clear_write_faults();
}

#[test]
fn namespaces_have_directories_of_their_own() {
    assert_eq!(dir_of(""), "queues/default");
    assert_eq!(dir_of("a/b c%"), "queues/ns-a%2Fb%20c%25");
    assert_ne!(dir_of("default"), dir_of(""));
    let long = "v".repeat(300);
    assert!(dir_of(&long).len() < 140);
    assert_ne!(dir_of(&long), dir_of(&format!("{long}w")));
    // Two namespaces, one meta log: each reads its own.
    let root = FaultyRoot::new();
    let meta = Arc::new(Meta::open(&root).unwrap());
    let (a, _) = Store::open(&root, meta.clone(), "", FsyncPolicy::Never, 1 << 20).unwrap();
    let (b, _) = Store::open(&root, meta.clone(), "dev", FsyncPolicy::Never, 1 << 20).unwrap();
    let qa = with_queue(&a, "q");
    let qb = with_queue(&b, "q");
    a.append(qa, &qmsg("q", "in-a")).unwrap();
    b.append(qb, &qmsg("q", "in-b")).unwrap();
    drop((a, b));
    let (_, ra) = Store::open(&root, meta.clone(), "", FsyncPolicy::Never, 1 << 20).unwrap();
    let (_, rb) = Store::open(&root, meta, "dev", FsyncPolicy::Never, 1 << 20).unwrap();
    assert_eq!(
        (bodies(&ra, "q"), bodies(&rb, "q")),
        (vec!["in-a".to_string()], vec!["in-b".to_string()])
    );
}
