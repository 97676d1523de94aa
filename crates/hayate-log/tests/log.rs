//! Appends, reads, rolls, indexes, time lookups, reopening, retention and group commit, on the
//! fault-injecting storage and on the real file system.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use hayate_log::{
    Entry, FaultyStorage, FsyncPolicy, Log, LogConfig, ReadLimit, Record, Retention, Storage,
};

fn small(fsync: FsyncPolicy) -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        fsync,
        ..LogConfig::default()
    }
}

fn value(i: u64) -> Vec<u8> {
    format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes()
}

fn append_n(log: &Log, from: u64, n: u64) {
    for i in from..from + n {
        let v = value(i);
        let off = log
            .append(&Entry {
                timestamp: 1000 + i as i64,
                key: b"k/1",
                headers: b"h",
                value: &v,
            })
            .unwrap();
        assert_eq!(off, i);
    }
}

fn read_all(log: &Log, from: u64) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = from;
    let limit = ReadLimit {
        max_bytes: 700,
        max_records: 7,
        confirmed_only: false,
    };
    loop {
        let b = log.read(at, limit).unwrap();
        if b.records.is_empty() {
            assert_eq!(at, log.end_offset(), "an empty batch only at the end");
            return out;
        }
        assert_eq!(b.records[0].offset, at);
        at = b.next;
        out.extend(b.records);
    }
}

fn check(records: &[Record], from: u64, to: u64) {
    assert_eq!(records.len() as u64, to - from);
    for (r, i) in records.iter().zip(from..to) {
        assert_eq!(r.offset, i);
        assert_eq!(r.timestamp, 1000 + i as i64);
        assert_eq!(&r.key[..], b"k/1");
        assert_eq!(&r.headers[..], b"h");
        assert_eq!(r.value, value(i));
    }
}

#[test]
fn appends_roll_into_segments_and_read_back_from_any_offset() {
    let storage = Arc::new(FaultyStorage::new());
    let log = Log::open(storage.clone(), small(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 500);
    let st = log.stats();
    assert!(st.segments > 5, "{st:?}");
    assert_eq!((st.start, st.end, st.confirmed), (0, 500, 500));
    check(&read_all(&log, 0), 0, 500);
    for from in [1, 37, 99, 250, 498, 499] {
        check(&read_all(&log, from), from, 500);
    }
    assert!(
        log.read(500, ReadLimit::default())
            .unwrap()
            .records
            .is_empty()
    );
    assert!(log.read(501, ReadLimit::default()).is_err());
    // Sealed segments have index files; the active one does not.
    let names = storage.names();
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".idx")).count(),
        st.segments - 1,
        "{names:?}"
    );
}

#[test]
fn a_record_larger_than_a_segment_gets_one_of_its_own_and_limits_are_enforced() {
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 3);
    let big = vec![7u8; 10_000];
    let off = log
        .append(&Entry {
            timestamp: 5,
            key: b"",
            headers: b"",
            value: &big,
        })
        .unwrap();
    assert_eq!(off, 3);
    let b = log
        .read(
            3,
            ReadLimit {
                max_bytes: 10,
                max_records: 10,
                confirmed_only: true,
            },
        )
        .unwrap();
    assert_eq!(
        b.records.len(),
        1,
        "the first record is returned whatever its size"
    );
    assert_eq!(b.records[0].value.len(), 10_000);
    let huge = vec![0u8; LogConfig::default().max_record_bytes];
    let cfg = LogConfig {
        fsync: FsyncPolicy::Never,
        ..LogConfig::default()
    };
    let log2 = Log::open(Arc::new(FaultyStorage::new()), cfg).unwrap();
    assert!(matches!(
        log2.append(&Entry {
            timestamp: 0,
            key: b"",
            headers: b"",
            value: &huge
        }),
        Err(hayate_log::Error::RecordTooLarge { .. })
    ));
    assert_eq!(log2.end_offset(), 0);
}

#[test]
fn batches_split_at_segment_boundaries_with_consecutive_offsets() {
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Never)).unwrap();
    let values: Vec<Vec<u8>> = (0..300).map(value).collect();
    let entries: Vec<Entry<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Entry {
            timestamp: 1000 + i as i64,
            key: b"k/1",
            headers: b"h",
            value: v,
        })
        .collect();
    assert_eq!(log.append_batch(&entries).unwrap(), 0..300);
    assert_eq!(log.append_batch(&entries[..10]).unwrap(), 300..310);
    assert!(log.stats().segments > 3);
    let all = read_all(&log, 0);
    check(&all[..300], 0, 300);
    for (i, r) in all[300..].iter().enumerate() {
        assert_eq!((r.offset, &r.value[..]), (300 + i as u64, &values[i][..]));
    }
}

#[test]
fn offset_for_time_finds_the_first_record_at_or_after_a_time() {
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 400); // timestamps 1000..1400
    for (ts, want) in [
        (i64::MIN, 0),
        (0, 0),
        (1000, 0),
        (1001, 1),
        (1250, 250),
        (1399, 399),
        (1400, 400),
    ] {
        assert_eq!(log.offset_for_time(ts).unwrap(), want, "ts {ts}");
    }
    // Out-of-order timestamps: the first record at or after the time, in offset order.
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Never)).unwrap();
    for (i, ts) in [50, 10, 60, 20, 70].iter().enumerate() {
        assert_eq!(
            log.append(&Entry {
                timestamp: *ts,
                key: b"",
                headers: b"",
                value: b""
            })
            .unwrap(),
            i as u64
        );
    }
    assert_eq!(log.offset_for_time(15).unwrap(), 0);
    assert_eq!(log.offset_for_time(55).unwrap(), 2);
    assert_eq!(log.offset_for_time(65).unwrap(), 4);
    assert_eq!(log.offset_for_time(71).unwrap(), 5);
}

#[test]
fn reopening_keeps_every_record_and_goes_on_from_the_end() {
    let storage: Arc<FaultyStorage> = Arc::new(FaultyStorage::new());
    for policy in [
        FsyncPolicy::Never,
        FsyncPolicy::Always,
        FsyncPolicy::Interval(Duration::from_millis(5)),
    ] {
        let storage = Arc::new(FaultyStorage::new());
        let log = Log::open(storage.clone(), small(policy)).unwrap();
        append_n(&log, 0, 200);
        log.close().unwrap();
        let log = Log::open(storage.clone(), small(policy)).unwrap();
        let rep = log.recovery().clone();
        assert_eq!(rep.truncated_bytes, 0, "{policy}: {rep:?}");
        assert_eq!(
            rep.scanned, 1,
            "{policy}: only the active segment is scanned: {rep:?}"
        );
        append_n(&log, 200, 50);
        check(&read_all(&log, 0), 0, 250);
    }
    drop(storage);
}

#[test]
fn the_real_file_system_works_the_same() {
    let dir = std::env::temp_dir().join(format!("hayate-log-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let log = Log::open_dir(&dir, small(FsyncPolicy::Always)).unwrap();
        append_n(&log, 0, 300);
        assert!(log.wait_confirmed(299, Duration::from_secs(10)).unwrap());
        log.close().unwrap();
        let log = Log::open_dir(&dir, small(FsyncPolicy::Always)).unwrap();
        check(&read_all(&log, 0), 0, 300);
        assert_eq!(log.offset_for_time(1123).unwrap(), 123);
        let n = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(
            n,
            log.stats().segments * 2 - 1,
            "a .log per segment and an .idx per sealed one"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn confirmation_follows_the_policy() {
    // never and interval: confirmed once written; interval syncs in the background.
    let s = Arc::new(FaultyStorage::new());
    let log = Log::open(
        s.clone(),
        small(FsyncPolicy::Interval(Duration::from_millis(20))),
    )
    .unwrap();
    append_n(&log, 0, 10);
    assert_eq!(log.confirmed_offset(), 10);
    let t = std::time::Instant::now();
    while log.synced_offset() < 10 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "interval sync never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // always: confirmed only once synced.
    let s = Arc::new(FaultyStorage::new());
    let log = Log::open(s.clone(), small(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 10);
    assert!(log.wait_confirmed(9, Duration::from_secs(5)).unwrap());
    assert!(log.synced_offset() >= 10);
    assert!(s.syncs() > 0);
}

#[test]
fn group_commit_shares_fsyncs_between_concurrent_appenders() {
    let s = Arc::new(FaultyStorage::new());
    let log = Arc::new(
        Log::open(
            s.clone(),
            LogConfig {
                fsync: FsyncPolicy::Always,
                ..LogConfig::default()
            },
        )
        .unwrap(),
    );
    let before = s.syncs();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..250u32 {
                    let v = (t * 1000 + i).to_le_bytes();
                    let off = log
                        .append(&Entry {
                            timestamp: 0,
                            key: b"g",
                            headers: b"",
                            value: &v,
                        })
                        .unwrap();
                    // Each appender waits for its own confirm, as a publisher does.
                    assert!(log.wait_confirmed(off, Duration::from_secs(10)).unwrap());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let syncs = s.syncs() - before;
    assert_eq!(log.confirmed_offset(), 2000);
    assert!(
        syncs < 2000,
        "{syncs} fsyncs for 2000 confirmed appends: no sharing"
    );
    eprintln!("group commit: 2000 confirmed appends from 8 threads took {syncs} fsyncs");
    let got: std::collections::HashSet<Vec<u8>> = read_all(&log, 0)
        .into_iter()
        .map(|r| r.value.to_vec())
        .collect();
    assert_eq!(got.len(), 2000);
}

#[test]
fn the_confirmed_future_resolves_on_any_executor() {
    use std::future::Future;
    use std::task::{Context, Poll, Wake, Waker};
    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Always)).unwrap();
    let off = log
        .append(&Entry {
            timestamp: 0,
            key: b"",
            headers: b"",
            value: b"x",
        })
        .unwrap();
    let flag = Arc::new(Flag(false.into()));
    let waker = Waker::from(flag.clone());
    let mut fut = std::pin::pin!(log.confirmed(off));
    let t = std::time::Instant::now();
    loop {
        match fut.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(r) => break r.unwrap(),
            Poll::Pending => {
                while !flag.0.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    assert!(t.elapsed() < Duration::from_secs(5), "never woken");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

#[test]
fn retention_removes_whole_old_segments_by_age_bytes_and_count() {
    let retention = |r: Retention| LogConfig {
        retention: r,
        ..small(FsyncPolicy::Never)
    };
    // count
    let log = Log::open(
        Arc::new(FaultyStorage::new()),
        retention(Retention {
            max_records: Some(100),
            ..Default::default()
        }),
    )
    .unwrap();
    append_n(&log, 0, 500);
    let rm = log.apply_retention(0).unwrap();
    let st = log.stats();
    assert!(rm.segments > 0 && st.end - st.start >= 100, "{rm:?} {st:?}");
    assert!(
        st.end - st.start < 100 + 100,
        "kept at most about a segment more: {st:?}"
    );
    check(&read_all(&log, st.start), st.start, 500);
    assert!(matches!(
        log.read(0, ReadLimit::default()),
        Err(hayate_log::Error::OffsetOutOfRange { .. })
    ));
    // bytes
    let log = Log::open(
        Arc::new(FaultyStorage::new()),
        retention(Retention {
            max_bytes: Some(8192),
            ..Default::default()
        }),
    )
    .unwrap();
    append_n(&log, 0, 500);
    log.apply_retention(0).unwrap();
    let st = log.stats();
    assert!(st.bytes >= 8192 && st.bytes < 8192 + 4096 + 200, "{st:?}");
    // age: timestamps are 1000 + offset
    let log = Log::open(
        Arc::new(FaultyStorage::new()),
        retention(Retention {
            max_age: Some(Duration::from_millis(100)),
            ..Default::default()
        }),
    )
    .unwrap();
    append_n(&log, 0, 500);
    log.apply_retention(1000 + 500 + 100).unwrap();
    let st = log.stats();
    assert!(st.start > 300, "{st:?}");
    assert_eq!(
        log.apply_retention(0).unwrap().segments,
        0,
        "nothing is old at time 0"
    );
    // delete_before and purge
    let log = Log::open(Arc::new(FaultyStorage::new()), small(FsyncPolicy::Never)).unwrap();
    append_n(&log, 0, 500);
    log.delete_before(250).unwrap();
    let st = log.stats();
    assert!(st.start <= 250 && st.start > 100, "{st:?}");
    let rm = log.purge().unwrap();
    assert_eq!(rm.records, 500 - st.start);
    let st = log.stats();
    assert_eq!((st.start, st.end, st.segments), (500, 500, 1));
    append_n(&log, 500, 3);
    check(&read_all(&log, 500), 500, 503);
}

#[test]
fn a_purged_log_reopens_at_the_same_offset() {
    let s: Arc<FaultyStorage> = Arc::new(FaultyStorage::new());
    let log = Log::open(s.clone(), small(FsyncPolicy::Always)).unwrap();
    append_n(&log, 0, 100);
    log.purge().unwrap();
    log.close().unwrap();
    let log = Log::open(s.clone() as Arc<dyn Storage>, small(FsyncPolicy::Always)).unwrap();
    assert_eq!((log.start_offset(), log.end_offset()), (100, 100));
}

/// Records from 64 KiB up are mapped rather than copied on the real file system: mixed sizes
/// around the threshold read back the same from every offset, under every limit, from sealed
/// and active segments, and a mapped record stays readable after its segment is purged.
#[test]
fn large_records_read_through_mappings_are_the_records_written() {
    let dir = std::env::temp_dir().join(format!("hayate-log-map-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = LogConfig {
        segment_bytes: 1 << 20,
        index_interval_bytes: 4096,
        fsync: FsyncPolicy::Never,
        ..LogConfig::default()
    };
    let sizes = [
        10usize,
        (64 << 10) - 40,
        (64 << 10) - 33, // the record is just under 64 KiB with its overhead
        (64 << 10) - 32, // and just at it
        70_000,
        200,
        300_000,
        1,
        (1 << 20) + 5, // larger than a segment: one of its own
        5_000,
        65_536,
        65_536,
        9,
    ];
    let body = |i: usize, n: usize| -> Vec<u8> {
        (0..n).map(|j| (j as u64 * 31 + i as u64) as u8).collect()
    };
    let log = Log::open_dir(&dir, cfg).unwrap();
    for round in 0..3 {
        for (i, &n) in sizes.iter().enumerate() {
            let v = body(round * 100 + i, n);
            log.append(&Entry {
                timestamp: 1,
                key: b"k",
                headers: b"",
                value: &v,
            })
            .unwrap();
        }
    }
    assert!(log.stats().segments > 3, "{:?}", log.stats());
    let want: Vec<Vec<u8>> = (0..3)
        .flat_map(|round| {
            sizes
                .iter()
                .enumerate()
                .map(move |(i, &n)| (round * 100 + i, n))
        })
        .map(|(i, n)| body(i, n))
        .collect();
    for (max_bytes, max_records) in [
        (1usize, 1usize),
        (100_000, 3),
        (1 << 20, 1000),
        (usize::MAX, 2),
    ] {
        let limit = ReadLimit {
            max_bytes,
            max_records,
            confirmed_only: false,
        };
        for from in 0..want.len() as u64 {
            let mut at = from;
            while at < log.end_offset() {
                let b = log.read(at, limit).unwrap();
                assert!(!b.records.is_empty() && b.records.len() <= max_records);
                for r in &b.records {
                    assert_eq!(r.offset, at);
                    assert_eq!(r.value, want[at as usize], "offset {at} limit {limit:?}");
                    at += 1;
                }
                assert_eq!(b.next, at);
            }
        }
    }
    let held = log
        .read(
            4,
            ReadLimit {
                max_bytes: 1,
                max_records: 1,
                confirmed_only: false,
            },
        )
        .unwrap();
    log.purge().unwrap();
    assert_eq!(held.records[0].value, want[4]);
    log.close().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A discarded log (its stream deleted) touches no file again, even when a new log is created
/// in the same directory while the old one is still held: no index, no segment, no removal.
#[test]
fn a_discarded_log_leaves_a_recreated_directory_alone() {
    for fsync in [FsyncPolicy::Never, FsyncPolicy::Always] {
        let dir = std::env::temp_dir().join(format!(
            "hayate-log-discard-{}-{fsync:?}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let old = Log::open_dir(&dir, small(fsync)).unwrap();
        append_n(&old, 0, 40); // several segments, the last .idx maybe still pending
        old.discard();
        std::fs::remove_dir_all(&dir).unwrap();
        let new = Log::open_dir(&dir, small(fsync)).unwrap();
        append_n(&new, 0, 3);
        let before: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let appended = old.append(&Entry {
            timestamp: 1,
            key: b"k",
            headers: b"",
            value: b"v",
        });
        let purged = old.purge();
        old.apply_retention(i64::MAX).unwrap();
        drop(old);
        let after: std::collections::BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(before, after, "{fsync:?}");
        assert!(matches!(appended, Err(hayate_log::Error::Closed)));
        assert!(purged.is_err());
        check(&read_all(&new, 0), 0, 3);
        new.close().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
