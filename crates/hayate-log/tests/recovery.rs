//! Crashes, damaged files and failing storage: what survives, what is cut, and that the log
//! never returns a record that was not appended.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use hayate_log::{
    CrashMode, Entry, Error, FaultyStorage, FsyncPolicy, Log, LogConfig, ReadLimit, Record,
};
use proptest::prelude::*;

fn cfg(fsync: FsyncPolicy) -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 200,
        fsync,
        ..LogConfig::default()
    }
}

fn val(i: u64) -> Vec<u8> {
    format!("{i}:{}", "v".repeat((i * 7 % 90) as usize)).into_bytes()
}

fn entry(v: &[u8]) -> Entry<'_> {
    Entry {
        timestamp: 1,
        key: b"key",
        headers: b"",
        value: v,
    }
}

fn append_n(log: &Log, from: u64, n: u64) {
    for i in from..from + n {
        assert_eq!(log.append(&entry(&val(i))).unwrap(), i);
    }
}

fn all(log: &Log) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = log.start_offset();
    let limit = ReadLimit {
        confirmed_only: false,
        ..ReadLimit::default()
    };
    loop {
        let b = log.read(at, limit).unwrap();
        if b.records.is_empty() {
            return out;
        }
        at = b.next;
        out.extend(b.records);
    }
}

fn assert_prefix(records: &[Record], n: u64) {
    assert_eq!(records.len() as u64, n);
    for (i, r) in records.iter().enumerate() {
        assert_eq!((r.offset, &r.value[..]), (i as u64, &val(i as u64)[..]));
    }
}

fn last_log(s: &FaultyStorage) -> String {
    s.names()
        .into_iter()
        .rfind(|n| n.ends_with(".log"))
        .unwrap()
}

#[test]
fn a_torn_tail_is_cut_at_the_last_whole_record() {
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 100);
    drop(log);
    let name = last_log(&s);
    let mut bytes = s.contents(&name).unwrap();
    let len = bytes.len();
    bytes.truncate(len - 5); // the last record loses its end
    s.set_contents(&name, bytes);
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
    let rep = log.recovery().clone();
    assert!(
        rep.truncated_bytes > 0 && rep.repairs.iter().any(|r| r.contains("torn")),
        "{rep:?}"
    );
    assert_prefix(&all(&log), 99);
    append_n(&log, 99, 5); // the offset of the lost record is used again
    assert_prefix(&all(&log), 104);
}

#[test]
fn garbage_and_zeroed_tails_are_cut() {
    for tail in [
        vec![0u8; 300],
        b"\x20\x00\x00\x00garbage garbage garbage garbage".to_vec(),
        vec![0xff; 9],
    ] {
        let s = FaultyStorage::new();
        let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
        append_n(&log, 0, 100);
        drop(log);
        let name = last_log(&s);
        let mut bytes = s.contents(&name).unwrap();
        let good = bytes.len();
        bytes.extend_from_slice(&tail);
        s.set_contents(&name, bytes);
        let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
        assert_eq!(
            log.recovery().truncated_bytes,
            tail.len() as u64,
            "{:?}",
            log.recovery()
        );
        assert_eq!(s.contents(&name).unwrap().len(), good);
        assert_prefix(&all(&log), 100);
    }
}

#[test]
fn missing_or_damaged_indexes_are_rebuilt_and_damage_in_a_sealed_segment_drops_what_follows() {
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 300);
    log.close().unwrap();
    let idx: Vec<String> = s
        .names()
        .into_iter()
        .filter(|n| n.ends_with(".idx"))
        .collect();
    assert!(idx.len() >= 4);
    // One index gone, one damaged.
    Storage::remove(&s, &idx[0]).unwrap();
    let mut b = s.contents(&idx[1]).unwrap();
    b[20] ^= 1;
    s.set_contents(&idx[1], b);
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    let rep = log.recovery().clone();
    assert_eq!(rep.rebuilt_indexes, 2, "{rep:?}");
    assert_prefix(&all(&log), 300);
    log.close().unwrap();
    assert_eq!(
        s.names().iter().filter(|n| n.ends_with(".idx")).count(),
        idx.len(),
        "indexes written again"
    );

    // A flipped byte inside a sealed segment whose index is gone: the segment is cut there
    // and every later segment is removed (they would follow a hole).
    let logs: Vec<String> = s
        .names()
        .into_iter()
        .filter(|n| n.ends_with(".log"))
        .collect();
    let victim = &logs[1];
    Storage::remove(&s, &victim.replace(".log", ".idx")).unwrap();
    let mut b = s.contents(victim).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x10;
    s.set_contents(victim, b);
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    let rep = log.recovery().clone();
    assert_eq!(rep.dropped_segments, logs.len() - 2, "{rep:?}");
    let kept = all(&log);
    assert!(kept.len() < 300 && kept.len() > 10);
    assert_prefix(&kept, kept.len() as u64);
    assert_eq!(log.end_offset(), kept.len() as u64);
}

use hayate_log::Storage;

#[test]
fn a_hole_left_by_an_interrupted_retention_drops_what_precedes_it() {
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 300);
    log.close().unwrap();
    let logs: Vec<String> = s
        .names()
        .into_iter()
        .filter(|n| n.ends_with(".log"))
        .collect();
    assert!(logs.len() >= 4);
    // The second segment's removal reached the disk, the first one's did not.
    Storage::remove(&s, &logs[1]).unwrap();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    let rep = log.recovery().clone();
    assert_eq!(rep.dropped_segments, 1, "{rep:?}");
    let base: u64 = logs[2].trim_end_matches(".log").parse().unwrap();
    assert_eq!((log.start_offset(), log.end_offset()), (base, 300));
    let kept = all(&log);
    assert_eq!(kept.len() as u64, 300 - base);
    for r in &kept {
        assert_eq!(&r.value[..], &val(r.offset)[..]);
    }
}

#[test]
fn a_full_disk_fails_the_append_leaves_no_partial_record_and_the_log_goes_on() {
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 10);
    s.fail_writes_after(20); // the next record's write stops part-way
    let v = val(10);
    let err = log.append(&entry(&v)).unwrap_err();
    assert!(matches!(err, Error::Io { op: "append", .. }), "{err}");
    assert_eq!(log.end_offset(), 10);
    s.clear_write_faults();
    append_n(&log, 10, 10);
    assert_prefix(&all(&log), 20);
    drop(log);
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Never)).unwrap();
    assert_eq!(log.recovery().truncated_bytes, 0);
    assert_prefix(&all(&log), 20);
}

#[test]
fn short_writes_are_completed() {
    let s = FaultyStorage::new();
    s.short_writes(true);
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 100);
    assert!(s.writes() > 200);
    drop(log);
    s.short_writes(false);
    assert_prefix(
        &all(&Log::open(Arc::new(s), cfg(FsyncPolicy::Always)).unwrap()),
        100,
    );
}

#[test]
fn a_failed_fsync_poisons_the_log_fails_waiters_and_reopening_recovers() {
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 5);
    assert!(log.wait_confirmed(4, Duration::from_secs(5)).unwrap());
    s.fail_syncs(1);
    let off = log.append(&entry(&val(5))).unwrap();
    let err = log.wait_confirmed(off, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::Poisoned(_)), "{err}");
    assert!(matches!(log.append(&entry(b"x")), Err(Error::Poisoned(_))));
    assert!(matches!(log.sync(), Err(Error::Poisoned(_))));
    assert_eq!(
        log.confirmed_offset(),
        5,
        "the record whose sync failed is never confirmed"
    );
    // Reads still work; closing reports the poison.
    assert_eq!(all(&log).len(), 6);
    assert!(log.close().is_err());
    // After a power loss only the confirmed records are certain; after reopening the log
    // writes again.
    let after = s.crash(CrashMode::PowerLoss);
    let log = Log::open(Arc::new(after), cfg(FsyncPolicy::Always)).unwrap();
    let kept = all(&log);
    assert!(kept.len() >= 5);
    assert_prefix(&kept, kept.len() as u64);
    log.append(&entry(b"again")).unwrap();
}

#[test]
fn a_crash_right_after_a_segment_was_created_loses_nothing_confirmed() {
    // Roll many times with always; crash (power loss) at each step; every confirmed record
    // survives and nothing else appears.
    let s = FaultyStorage::new();
    let log = Log::open(Arc::new(s.clone()), cfg(FsyncPolicy::Always)).unwrap();
    for i in 0..200u64 {
        log.append(&entry(&val(i))).unwrap();
        let confirmed = log.confirmed_offset();
        if i % 13 == 0 {
            let after = s.crash(CrashMode::TornPowerLoss { seed: i + 1 });
            let l2 = Log::open(Arc::new(after), cfg(FsyncPolicy::Never)).unwrap();
            let kept = all(&l2);
            assert!(
                kept.len() as u64 >= confirmed,
                "step {i}: {} < {confirmed}",
                kept.len()
            );
            assert_prefix(&kept, kept.len() as u64);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<u16>),
    Sync,
    Crash(u8, u64),
    Retain(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::collection::vec(0u16..600, 1..20).prop_map(Op::Append),
        1 => Just(Op::Sync),
        2 => (0u8..3, any::<u64>()).prop_map(|(m, s)| Op::Crash(m, s)),
        1 => (0u64..400).prop_map(Op::Retain),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A model of what must survive: after a process kill, every record appended; after a
    /// power loss (torn or not), every record confirmed under `always`; never a record that
    /// was not appended, never a record out of place.
    #[test]
    fn crashes_keep_what_the_policy_promises(ops in proptest::collection::vec(op(), 1..40)) {
        let mut s = FaultyStorage::new();
        let config = cfg(FsyncPolicy::Always);
        let mut log = Log::open(Arc::new(s.clone()), config).unwrap();
        let mut model: Vec<Vec<u8>> = Vec::new(); // index = offset
        let mut start = 0u64;
        for op in ops {
            match op {
                Op::Append(sizes) => {
                    let values: Vec<Vec<u8>> = sizes.iter().enumerate()
                        .map(|(i, n)| { let mut v = vec![(model.len() + i) as u8; *n as usize]; v.extend_from_slice(&(model.len() + i).to_le_bytes()); v })
                        .collect();
                    let entries: Vec<Entry<'_>> = values.iter().map(|v| entry(v)).collect();
                    let r = log.append_batch(&entries).unwrap();
                    prop_assert_eq!(r.start, model.len() as u64);
                    model.extend(values);
                }
                Op::Sync => { log.sync().unwrap(); }
                Op::Retain(upto) => { log.delete_before(upto).unwrap(); start = log.start_offset(); }
                Op::Crash(mode, seed) => {
                    let confirmed = log.confirmed_offset();
                    let mode = match mode { 0 => CrashMode::ProcessKill, 1 => CrashMode::PowerLoss, _ => CrashMode::TornPowerLoss { seed } };
                    let must = if mode == CrashMode::ProcessKill { model.len() as u64 } else { confirmed };
                    let after = s.crash(mode);
                    std::mem::forget(log); // a crash runs no destructor
                    s = after;
                    log = Log::open(Arc::new(s.clone()), config).unwrap();
                    let end = log.end_offset();
                    prop_assert!(end >= must, "{:?}: end {} < promised {}", mode, end, must);
                    prop_assert!(end <= model.len() as u64);
                    model.truncate(end as usize);
                    start = log.start_offset();
                }
            }
            let got = all(&log);
            prop_assert_eq!(got.len() as u64, model.len() as u64 - start);
            for r in &got {
                prop_assert_eq!(&r.value[..], &model[r.offset as usize][..]);
            }
        }
    }
}
