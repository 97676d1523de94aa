//! A crash model of the queue store: queues declared and deleted, messages published (some
//! with a confirm: synced), acknowledged and given back, flushes, and crashes of the whole
//! disk (process kill, power loss, torn power loss) with a restart. After every restart:
//! every confirmed message not acknowledged is back (once), nothing never published is,
//! nothing of a deleted queue is, and every declaration answered is there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hayate_log::{CrashMode, FaultyRoot};
use proptest::prelude::*;

use super::Store;
use super::tests::{open_on, qmsg};

#[derive(Debug, Clone)]
enum Op {
    Declare(usize),
    Delete(usize),
    Publish(usize, bool),
    Ack(usize),
    Nack(usize),
    Flush,
    Crash(u8, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..3usize).prop_map(Op::Declare),
        1 => (0..3usize).prop_map(Op::Delete),
        6 => (0..3usize, any::<bool>()).prop_map(|(q, c)| Op::Publish(q, c)),
        3 => any::<usize>().prop_map(Op::Ack),
        2 => any::<usize>().prop_map(Op::Nack),
        2 => Just(Op::Flush),
        1 => (0..3u8, any::<u64>()).prop_map(|(m, s)| Op::Crash(m, s)),
    ]
}

/// A message the model knows of: its queue (slot), body, id in the store, confirmed,
/// acknowledged, returns.
#[derive(Debug, Clone)]
struct Msg {
    slot: usize,
    body: String,
    id: u64,
    confirmed: bool,
    acked: bool,
    returns: u32,
}

struct Model {
    root: FaultyRoot,
    store: Arc<Store>,
    /// Each slot's queue number while declared.
    queues: [Option<u64>; 3],
    msgs: Vec<Msg>,
    /// Bodies ever published, by slot.
    published: HashMap<usize, Vec<String>>,
    n: u64,
}

fn name(slot: usize) -> String {
    format!("q{slot}")
}

impl Model {
    fn apply(&mut self, op: Op) {
        let s = &self.store;
        match op {
            Op::Declare(q) if self.queues[q].is_none() => {
                let id = s.new_queue_id();
                s.put_queue(&name(q), id, b"d").unwrap();
                self.queues[q] = Some(id);
            }
            Op::Delete(q) => {
                if let Some(id) = self.queues[q].take() {
                    for m in self.msgs.iter().filter(|m| m.slot == q && !m.acked) {
                        s.settle(m.id);
                    }
                    self.msgs.retain(|m| m.slot != q);
                    s.remove_queue(&name(q), id).unwrap();
                }
            }
            Op::Publish(q, confirm) => {
                let Some(id) = self.queues[q] else { return };
                self.n += 1;
                let body = format!("m{}", self.n);
                let o = s.append(id, &qmsg("q", &body)).unwrap();
                if confirm {
                    s.log.sync().unwrap();
                }
                self.published.entry(q).or_default().push(body.clone());
                self.msgs.push(Msg {
                    slot: q,
                    body,
                    id: o,
                    confirmed: confirm,
                    acked: false,
                    returns: 0,
                });
            }
            Op::Ack(i) | Op::Nack(i) if !self.msgs.is_empty() => {
                let k = i % self.msgs.len();
                let m = &mut self.msgs[k];
                if matches!(op, Op::Ack(_)) {
                    s.settle(m.id);
                    m.acked = true;
                } else if !m.acked {
                    m.returns += 1;
                    s.note_return(m.id, m.returns);
                }
                if m.acked {
                    self.msgs.remove(k);
                }
            }
            Op::Flush => {
                // As the store's task, then the meta log's writer, do (its fsync awaited).
                s.flush();
                s.meta.flush();
                let end = s.meta.log().end_offset();
                s.meta.wait(end.saturating_sub(1)).unwrap();
            }
            Op::Crash(mode, seed) => self.restart(match mode {
                0 => CrashMode::ProcessKill,
                1 => CrashMode::PowerLoss,
                _ => CrashMode::TornPowerLoss { seed },
            }),
            _ => {}
        }
    }

    fn restart(&mut self, mode: CrashMode) {
        // The old store's last flush (when dropped) reaches the crashed disk only.
        let root = self.root.crash(mode);
        let (store, rec) = open_on(&root, 1 << 20);
        self.store = store;
        self.root = root;
        let mut back: BTreeMap<u64, (usize, String, u32)> = BTreeMap::new();
        for q in &rec.queues {
            let slot = (0..3)
                .find(|s| name(*s) == q.name)
                .expect("a queue of the model");
            assert_eq!(
                self.queues[slot],
                Some(q.id),
                "{}: the queue declared",
                q.name
            );
            for m in &q.items {
                let body = String::from_utf8(m.msg.payload.to_vec()).unwrap();
                assert!(
                    self.published[&slot].contains(&body),
                    "{body}: never published"
                );
                back.insert(m.stored.unwrap(), (slot, body, m.returns));
            }
        }
        for (slot, q) in self.queues.iter().enumerate() {
            if q.is_some() {
                assert!(
                    rec.queues.iter().any(|r| r.name == name(slot)),
                    "q{slot} lost"
                );
            }
        }
        for m in &self.msgs {
            if m.confirmed && !m.acked {
                let got = back.get(&m.id).unwrap_or_else(|| panic!("{} lost", m.body));
                assert_eq!((got.0, &got.1), (m.slot, &m.body));
                assert!(got.2 <= m.returns);
            }
        }
        // What came back is what the model holds now (each message once).
        let before: HashMap<u64, Msg> = self.msgs.drain(..).map(|m| (m.id, m)).collect();
        for (id, (slot, body, returns)) in back {
            let confirmed = before.get(&id).is_some_and(|m| m.confirmed);
            self.msgs.push(Msg {
                slot,
                body,
                id,
                confirmed,
                acked: false,
                returns,
            });
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn confirmed_messages_and_answered_declarations_survive_every_crash(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        let root = FaultyRoot::new();
        let store = open_on(&root, 1 << 20).0;
        let mut m = Model {
            root,
            store,
            queues: [None; 3],
            msgs: Vec::new(),
            published: HashMap::new(),
            n: 0,
        };
        for op in ops {
            m.apply(op);
        }
        m.restart(CrashMode::PowerLoss);
    }
}
