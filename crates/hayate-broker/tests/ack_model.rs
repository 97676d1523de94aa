//! The ack tracker against a simple model: random operations, same observable results.

use std::collections::VecDeque;

use hayate_broker::AckTracker;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Push(u32, usize),
    PushFront(u32, usize),
    Ready,
    Ack(u64),
    AckThrough(u64),
    Nack(u64),
    TakeAll,
    Window(usize),
    Restore(u32, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u32>(), 0usize..100).prop_map(|(v, s)| Op::Push(v, s)),
        1 => (any::<u32>(), 0usize..100).prop_map(|(v, s)| Op::PushFront(v, s)),
        4 => Just(Op::Ready),
        3 => (0u64..40).prop_map(Op::Ack),
        1 => (0u64..40).prop_map(Op::AckThrough),
        1 => (0u64..40).prop_map(Op::Nack),
        1 => Just(Op::TakeAll),
        1 => (0usize..6).prop_map(Op::Window),
        1 => (any::<u32>(), 0usize..100).prop_map(|(v, s)| Op::Restore(v, s)),
    ]
}

/// The model: a list of (id, item, size) in flight in id order, and a pending queue.
#[derive(Default)]
struct Model {
    next: u64,
    window: usize,
    inflight: Vec<(u64, u32, usize)>,
    pending: VecDeque<(u32, usize)>,
}

impl Model {
    fn bytes(&self) -> usize {
        self.inflight.iter().map(|e| e.2).sum::<usize>()
            + self.pending.iter().map(|e| e.1).sum::<usize>()
    }
    fn remove(&mut self, id: u64) -> Option<u32> {
        let i = self.inflight.iter().position(|e| e.0 == id)?;
        Some(self.inflight.remove(i).1)
    }
}

proptest! {
    #[test]
    fn tracker_matches_model(window in 1usize..5, ops in proptest::collection::vec(op(), 0..200)) {
        let mut t = AckTracker::new(window);
        let mut m = Model { next: 1, window, ..Model::default() };
        for op in ops {
            match op {
                Op::Push(v, s) => { t.push(v, s); m.pending.push_back((v, s)); }
                Op::PushFront(v, s) => { t.push_front(v, s); m.pending.push_front((v, s)); }
                Op::Ready => {
                    let got = t.next_ready().map(|(id, &v)| (id, v));
                    let want = if m.inflight.len() < m.window {
                        m.pending.pop_front().map(|(v, s)| {
                            let id = m.next;
                            m.next += 1;
                            m.inflight.push((id, v, s));
                            (id, v)
                        })
                    } else {
                        None
                    };
                    prop_assert_eq!(got, want);
                }
                Op::Ack(id) => prop_assert_eq!(t.ack(id), m.remove(id)),
                Op::Nack(id) => prop_assert_eq!(t.nack(id), m.remove(id)),
                Op::AckThrough(id) => {
                    let before = m.inflight.len();
                    m.inflight.retain(|e| e.0 > id);
                    prop_assert_eq!(t.ack_through(id), before - m.inflight.len());
                }
                Op::TakeAll => {
                    let mut want: Vec<u32> = m.inflight.drain(..).map(|e| e.1).collect();
                    want.extend(m.pending.drain(..).map(|e| e.0));
                    prop_assert_eq!(t.take_all(), want);
                }
                Op::Window(w) => { t.set_window(w); m.window = w.max(1); }
                Op::Restore(v, s) => {
                    let id = t.insert_in_flight(v, s);
                    prop_assert_eq!(id, m.next);
                    m.next += 1;
                    m.inflight.push((id, v, s));
                    prop_assert_eq!(t.get(id), Some(&v));
                }
            }
            prop_assert_eq!(t.held_bytes(), m.bytes());
            prop_assert_eq!(t.in_flight_len(), m.inflight.len());
            prop_assert_eq!(t.pending_len(), m.pending.len());
            let ids: Vec<u64> = t.inflight().map(|(id, _)| id).collect();
            let mids: Vec<u64> = m.inflight.iter().map(|e| e.0).collect();
            prop_assert_eq!(ids, mids);
        }
    }
}
