//! The crash model of the MQTT log, through [`FaultyRoot`]: changes journaled as the live code
//! journals them (the model of `tests`), acknowledgements that wait for [`Journal::durable`]
//! (SUBACK, PUBACK, PUBCOMP and the rest), checkpoints taken at random moments (some cut by a
//! full disk part-way through their batch), then a process kill, a power loss or a torn
//! power loss; the broker's start (read the log, checkpoint what it read) and a second run
//! of changes, a second crash, a second start, then a clean restart. After each start the
//! state must be the state after some prefix of the journal records of that run that holds
//! every acknowledged one: nothing acknowledged lost, nothing invented, no partial checkpoint
//! read.

use std::sync::Arc;

use hayate_log::{CrashMode, FaultyRoot, FsyncPolicy};
use proptest::prelude::*;

use super::checkpoint::snapshot_of;
use super::tests::*;
use super::*;
use crate::journal::Journal;

/// What follows a change.
#[derive(Debug, Clone)]
enum Then {
    Nothing,
    /// An acknowledgement: waits until everything journaled so far is durable.
    Ack,
    Checkpoint,
    /// A checkpoint whose batch finds the disk full after this many bytes (then the crash).
    CutCheckpoint(u16),
    /// A checkpoint whose sync fails (then the crash: a torn power loss keeps part of it).
    UnsyncedCheckpoint,
}

fn then() -> impl Strategy<Value = Then> {
    prop_oneof![
        4 => Just(Then::Nothing),
        4 => Just(Then::Ack),
        1 => Just(Then::Checkpoint),
        1 => (0..600u16).prop_map(Then::CutCheckpoint),
        1 => Just(Then::UnsyncedCheckpoint),
    ]
}

fn crash_mode() -> impl Strategy<Value = CrashMode> {
    prop_oneof![
        Just(CrashMode::ProcessKill),
        Just(CrashMode::PowerLoss),
        any::<u64>().prop_map(|seed| CrashMode::TornPowerLoss { seed }),
    ]
}

/// The world as `saved` says (the sessions of clients `c0`..`c2`), new `out`s numbered from
/// `next_out`.
fn world_of(saved: &Saved, next_out: u64, next_qid: u64) -> World {
    World {
        outs: (0..3)
            .map(|c| {
                let id = next_out + c as u64;
                match saved.sessions.get(&format!("c{c}")) {
                    Some(s) => Out {
                        id,
                        sgen: Some(s.sgen),
                        s: s.clone(),
                    },
                    None => Out {
                        id,
                        sgen: None,
                        s: empty(0),
                    },
                }
            })
            .collect(),
        retained: saved.retained.clone(),
        next_sgen: saved.next_sgen,
        next_out: next_out + 3,
        next_qid,
    }
}

/// The persistent part of `w`.
fn saved_of(w: &World) -> Saved {
    let mut s = Saved {
        next_sgen: w.next_sgen,
        ..Saved::default()
    };
    for (c, o) in w.outs.iter().enumerate() {
        if let Some(g) = o.sgen {
            let mut st = o.s.clone();
            st.sgen = g;
            s.insert(format!("c{c}"), st);
        }
    }
    for m in w.retained.values() {
        s.set_retained(m.clone());
    }
    s
}

fn open(root: &FaultyRoot) -> Journal {
    Journal::open(Arc::new(root.clone()), FsyncPolicy::Always).unwrap()
}

/// Checkpoints `saved` as the broker does (number `number`).
fn checkpoint(j: &Journal, saved: &Saved, number: u64) -> Result<(), String> {
    let p = j.mark()?;
    j.write_checkpoint(&snapshot_of(saved, number, p))?;
    j.checkpointed(p);
    Ok(())
}

/// One run: the start (read, checkpoint), then `ops`; returns what the start read, the
/// journal records of the run and how many of them were acknowledged.
fn run(root: &FaultyRoot, ops: &[(Op, Then)], next_out: u64) -> (Saved, Vec<Vec<u8>>, usize) {
    let j = open(root);
    let loaded = j.load().unwrap();
    let base = loaded.saved;
    let mut number = loaded.next_number;
    checkpoint(&j, &base, number).unwrap();
    number += 1;
    let mut w = world_of(&base, next_out, 1_000_000 * next_out);
    let (mut records, mut acked) = (Vec::new(), 0);
    for (op, then) in ops {
        for r in step(&mut w, op) {
            j.push(|b| b.extend_from_slice(&r));
            records.push(r);
        }
        match then {
            Then::Nothing => {}
            Then::Ack => {
                if futures::executor::block_on(j.durable().wait()).is_ok() {
                    acked = records.len();
                }
            }
            Then::Checkpoint => {
                if checkpoint(&j, &saved_of(&w), number).is_ok() {
                    // Everything journaled before is in it, and synced.
                    acked = records.len();
                }
                number += 1;
            }
            Then::CutCheckpoint(_) | Then::UnsyncedCheckpoint => {
                // Everything before acknowledged (so written: the fault hits the
                // checkpoint's batch).
                if futures::executor::block_on(j.durable().wait()).is_ok() {
                    acked = records.len();
                }
                match then {
                    Then::CutCheckpoint(bytes) => root.disk().fail_writes_after(u64::from(*bytes)),
                    _ => root.disk().fail_syncs(2),
                }
                let _ = checkpoint(&j, &saved_of(&w), number);
                break;
            }
        }
    }
    (base, records, acked)
}

/// Whether `got` is the state after `base` and a prefix of `records` holding the first
/// `acked`.
fn is_a_prefix(got: &Saved, base: &Saved, records: &[Vec<u8>], acked: usize) -> bool {
    let target = view_of_saved(got);
    let mut s = base.clone();
    if acked == 0 && view_of_saved(&s) == target {
        return true;
    }
    for (i, r) in records.iter().enumerate() {
        s.apply(r).unwrap();
        if i + 1 >= acked && view_of_saved(&s) == target {
            return true;
        }
    }
    false
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn what_was_acknowledged_survives_crashes_and_checkpoints(
        first in proptest::collection::vec((op(), then()), 1..40),
        second in proptest::collection::vec((op(), then()), 1..40),
        crashes in proptest::collection::vec(crash_mode(), 2),
    ) {
        let root = FaultyRoot::new();
        let (_, records, acked) = run(&root, &first, 0);
        let root = root.crash(crashes[0]);
        let j = open(&root);
        let got = j.load().unwrap();
        prop_assert!(got.skipped == 0);
        let after_first = got.saved;
        drop(j);
        // The second run starts from what the first left.
        let (base2, records2, acked2) = run(&root, &second, 10);
        prop_assert_eq!(view_of_saved(&base2), view_of_saved(&after_first));
        let root = root.crash(crashes[1]);
        let j = open(&root);
        let got2 = j.load().unwrap();
        prop_assert!(got2.skipped == 0);
        prop_assert!(
            is_a_prefix(&got2.saved, &base2, &records2, acked2),
            "second crash ({:?}): {:?} is no prefix of the run's {} records holding the {} acknowledged",
            crashes[1], view_of_saved(&got2.saved), records2.len(), acked2
        );
        // A clean restart reads the same again.
        checkpoint(&j, &got2.saved, got2.next_number).unwrap();
        drop(j);
        let again = open(&root).load().unwrap();
        prop_assert_eq!(view_of_saved(&again.saved), view_of_saved(&got2.saved));
        // The first crash, checked against its own run.
        let empty = Saved { next_sgen: 1, ..Saved::default() };
        prop_assert!(
            is_a_prefix(&after_first, &empty, &records, acked),
            "first crash ({:?}): {:?}", crashes[0], view_of_saved(&after_first)
        );
    }
}
