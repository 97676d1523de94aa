//! The delivery ledger against a simple model: random operations under random policies,
//! in virtual time; after every operation the same ids, outcomes (which item is
//! dead-lettered, and why), order, counts and bytes, and nothing lost or duplicated.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hayate_flow::Ledger;
use hayate_flow::ledger::{Claim, FlightInfo, Outcome, Policy, Reason, Returned, Settle};
use proptest::prelude::*;

/// Picks a delivery id: mostly one the model holds (in flight or retired), sometimes any.
#[derive(Debug, Clone, Copy)]
struct Sel(u16);

#[derive(Debug, Clone, Copy)]
enum How {
    Ack,
    Requeue,
    RequeueAfter(u64),
    Reject,
}

#[derive(Debug, Clone)]
enum Op {
    Push(u8, usize),
    PushFront(u8, usize),
    /// Priority, size, deliveries so far, delay (ms) if delayed.
    PushDelivered(u8, usize, u32, Option<u64>),
    Ready,
    Claim(u64),
    Ack(Sel),
    AckThrough(Sel),
    TakeThrough(Sel),
    Settle(Sel, How),
    ReleaseOwner(u64),
    Advance(u64),
    Promote,
    SetStage(Sel, u8),
    Retire(Sel),
    TakeAll,
    Window(usize),
    Restore(u8, usize),
    ExpireReady,
    PopReady,
    DropReadyIf,
}

fn sel() -> impl Strategy<Value = Sel> {
    any::<u16>().prop_map(Sel)
}

fn how() -> impl Strategy<Value = How> {
    prop_oneof![
        Just(How::Ack),
        Just(How::Requeue),
        (0u64..40).prop_map(How::RequeueAfter),
        Just(How::Reject),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..3, 0usize..100).prop_map(|(p, s)| Op::Push(p, s)),
        1 => (0u8..3, 0usize..100).prop_map(|(p, s)| Op::PushFront(p, s)),
        2 => (0u8..3, 0usize..100, 0u32..5, prop::option::of(0u64..40))
            .prop_map(|(p, s, n, d)| Op::PushDelivered(p, s, n, d)),
        3 => Just(Op::Ready),
        4 => (0u64..3).prop_map(Op::Claim),
        3 => sel().prop_map(Op::Ack),
        1 => sel().prop_map(Op::AckThrough),
        1 => sel().prop_map(Op::TakeThrough),
        5 => (sel(), how()).prop_map(|(s, h)| Op::Settle(s, h)),
        1 => (0u64..3).prop_map(Op::ReleaseOwner),
        2 => (0u64..30).prop_map(Op::Advance),
        1 => Just(Op::Promote),
        1 => (sel(), 0u8..2).prop_map(|(s, v)| Op::SetStage(s, v)),
        1 => sel().prop_map(Op::Retire),
        1 => Just(Op::TakeAll),
        1 => (0usize..6).prop_map(Op::Window),
        1 => (0u8..2, 0usize..100).prop_map(|(st, s)| Op::Restore(st, s)),
        1 => Just(Op::ExpireReady),
        1 => Just(Op::PopReady),
        1 => Just(Op::DropReadyIf),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        prop::option::of(10u64..50),
        0u32..4,
        prop::option::of(0u32..3),
    )
        .prop_map(|(w, max_deliveries, max_returns)| Policy {
            ack_wait: w.map(Duration::from_millis),
            max_deliveries,
            max_returns,
        })
}

/// What a retired item becomes (`retire`'s strip).
const STRIPPED: u32 = 1 << 31;

#[derive(Debug, Clone, Copy)]
struct MEntry {
    v: u32,
    size: usize,
    seq: u64,
    prio: u8,
    deliveries: u32,
    returns: u32,
}

#[derive(Debug, Clone, Copy)]
struct MFlight {
    e: MEntry,
    owner: u64,
    deadline: Option<Instant>,
    stage: u8,
}

/// The model: plain lists, sorted when read.
struct Model {
    policy: Policy,
    window: usize,
    next_id: u64,
    next_seq: u64,
    front_seq: u64,
    next_v: u32,
    ready: Vec<MEntry>,
    inflight: BTreeMap<u64, MFlight>,
    retired: BTreeMap<u64, u32>,
    delayed: Vec<(Instant, MEntry)>,
    /// Items out of the ledger: acknowledged, taken, dead-lettered (with why), retired.
    out: Vec<u32>,
    dead: Vec<(u32, Reason)>,
}

impl Model {
    fn new(window: usize, policy: Policy) -> Model {
        Model {
            policy,
            window: window.max(1),
            next_id: 1,
            next_seq: 1 << 63,
            front_seq: 1 << 63,
            next_v: 0,
            ready: Vec::new(),
            inflight: BTreeMap::new(),
            retired: BTreeMap::new(),
            delayed: Vec::new(),
            out: Vec::new(),
            dead: Vec::new(),
        }
    }

    fn entry(&mut self, size: usize, seq: u64, prio: u8) -> MEntry {
        self.next_v += 1;
        MEntry {
            v: self.next_v,
            size,
            seq,
            prio,
            deliveries: 0,
            returns: 0,
        }
    }

    /// Ready entries in delivery order.
    fn ordered(&self) -> Vec<MEntry> {
        let mut r = self.ready.clone();
        r.sort_by_key(|e| (std::cmp::Reverse(e.prio), e.seq));
        r
    }

    fn pop_best(&mut self) -> Option<MEntry> {
        let best = self.ordered().first().copied()?;
        self.ready.retain(|e| e.seq != best.seq);
        Some(best)
    }

    fn fly(&mut self, mut e: MEntry, owner: u64, deadline: Option<Instant>, stage: u8) -> u64 {
        e.deliveries += 1;
        let id = self.next_id;
        self.next_id += 1;
        let f = MFlight {
            e,
            owner,
            deadline,
            stage,
        };
        self.inflight.insert(id, f);
        id
    }

    fn give_back(&mut self, mut e: MEntry) -> Result<(), (u32, Reason)> {
        e.returns += 1;
        if self.policy.max_returns.is_some_and(|m| e.returns > m) {
            self.dead.push((e.v, Reason::DeliveryLimit));
            return Err((e.v, Reason::DeliveryLimit));
        }
        self.ready.push(e);
        Ok(())
    }

    fn give_back_all(&mut self, ids: Vec<u64>) -> (usize, Vec<(u32, Reason)>) {
        let mut requeued = 0;
        let mut dead = Vec::new();
        for id in ids {
            let f = self.inflight.remove(&id).unwrap();
            match self.give_back(f.e) {
                Ok(()) => requeued += 1,
                Err(d) => dead.push(d),
            }
        }
        (requeued, dead)
    }

    /// Removes `id` as an acknowledgement does.
    fn remove(&mut self, id: u64) -> Option<u32> {
        if let Some(f) = self.inflight.remove(&id) {
            self.out.push(f.e.v);
            return Some(f.e.v);
        }
        self.retired.remove(&id)
    }

    fn pick(&self, s: Sel) -> u64 {
        let ids: Vec<u64> = self
            .inflight
            .keys()
            .chain(self.retired.keys())
            .copied()
            .collect();
        if s.0.is_multiple_of(5) || ids.is_empty() {
            u64::from(s.0 / 5 % 64)
        } else {
            ids[usize::from(s.0) % ids.len()]
        }
    }

    fn bytes(&self) -> usize {
        self.ready.iter().map(|e| e.size).sum::<usize>()
            + self.inflight.values().map(|f| f.e.size).sum::<usize>()
            + self.delayed.iter().map(|d| d.1.size).sum::<usize>()
    }

    fn settle(&mut self, id: u64, how: How, now: Instant) -> Outcome<u32> {
        let Some(f) = self.inflight.remove(&id) else {
            return match self.retired.remove(&id) {
                Some(v) => Outcome::Done(v),
                None => Outcome::Unknown,
            };
        };
        match how {
            How::Ack => {
                self.out.push(f.e.v);
                Outcome::Done(f.e.v)
            }
            How::Reject => {
                self.dead.push((f.e.v, Reason::Rejected));
                Outcome::DeadLetter(f.e.v, Reason::Rejected)
            }
            How::Requeue => match self.give_back(f.e) {
                Ok(()) => Outcome::Requeued,
                Err((v, r)) => Outcome::DeadLetter(v, r),
            },
            How::RequeueAfter(ms) => {
                let mut e = f.e;
                e.returns += 1;
                if self.policy.max_returns.is_some_and(|m| e.returns > m) {
                    self.dead.push((e.v, Reason::DeliveryLimit));
                    return Outcome::DeadLetter(e.v, Reason::DeliveryLimit);
                }
                self.delayed.push((now + Duration::from_millis(ms), e));
                Outcome::Delayed
            }
        }
    }
}

fn returned(r: Returned<u32>) -> (usize, Vec<(u32, Reason)>) {
    (r.requeued, r.dead)
}

/// Applies `op` to both; compares what they return.
fn step(
    t: &mut Ledger<u32>,
    m: &mut Model,
    op: Op,
    base: Instant,
    ms: &mut u64,
) -> Result<(), TestCaseError> {
    let now = base + Duration::from_millis(*ms);
    match op {
        Op::Push(p, s) => {
            let seq = m.next_seq;
            m.next_seq += 1;
            let e = m.entry(s, seq, p);
            prop_assert_eq!(t.push(e.v, s, p), seq);
            m.ready.push(e);
        }
        Op::PushFront(p, s) => {
            m.front_seq -= 1;
            let e = m.entry(s, m.front_seq, p);
            prop_assert_eq!(t.push_front(e.v, s, p), e.seq);
            m.ready.push(e);
        }
        Op::PushDelivered(p, s, n, delay) => {
            let seq = m.next_seq;
            m.next_seq += 1;
            let mut e = m.entry(s, seq, p);
            e.deliveries = n;
            let at = delay.map(|d| now + Duration::from_millis(d));
            prop_assert_eq!(t.push_delivered(e.v, s, p, n, at), seq);
            match at {
                Some(at) => m.delayed.push((at, e)),
                None => m.ready.push(e),
            }
        }
        Op::Ready => {
            let got = t.next_ready().map(|(id, &v)| (id, v));
            let want = if m.inflight.len() < m.window {
                m.pop_best().map(|e| (m.fly(e, 0, None, 0), e.v))
            } else {
                None
            };
            prop_assert_eq!(got, want);
        }
        Op::Claim(owner) => {
            let got = t.claim(owner, now).map(|c| match c {
                Claim::Deliver {
                    id,
                    item,
                    deliveries,
                    returns,
                } => Ok((id, *item, deliveries, returns)),
                Claim::DeadLetter(v, r) => Err((v, r)),
            });
            let want = m.pop_best().map(|e| {
                let max = m.policy.max_deliveries;
                if max > 0 && e.deliveries >= max {
                    m.dead.push((e.v, Reason::MaxDeliver));
                    return Err((e.v, Reason::MaxDeliver));
                }
                let deadline = m.policy.ack_wait.map(|w| now + w);
                let id = m.fly(e, owner, deadline, 0);
                Ok((id, e.v, e.deliveries + 1, e.returns))
            });
            prop_assert_eq!(got, want);
        }
        Op::Ack(s) => {
            let id = m.pick(s);
            prop_assert_eq!(t.ack(id), m.remove(id));
        }
        Op::AckThrough(s) => {
            let id = m.pick(s);
            let ids: Vec<u64> = m.inflight.range(..=id).map(|(&k, _)| k).collect();
            let n = ids.len() + m.retired.range(..=id).count();
            for k in ids {
                m.remove(k);
            }
            m.retired.retain(|&k, _| k > id);
            prop_assert_eq!(t.ack_through(id), n);
        }
        Op::TakeThrough(s) => {
            let id = m.pick(s);
            let mut ids: Vec<u64> = m
                .inflight
                .range(..=id)
                .filter(|(_, f)| f.e.v.is_multiple_of(2))
                .map(|(&k, _)| k)
                .collect();
            ids.extend(
                m.retired
                    .range(..=id)
                    .filter(|(_, v)| v.is_multiple_of(2))
                    .map(|(&k, _)| k),
            );
            ids.sort_unstable();
            let want: Vec<u32> = ids.into_iter().filter_map(|k| m.remove(k)).collect();
            prop_assert_eq!(t.take_through(id, |v| v.is_multiple_of(2)), want);
        }
        Op::Settle(s, h) => {
            let id = m.pick(s);
            let verb = match h {
                How::Ack => Settle::Ack,
                How::Requeue => Settle::Requeue,
                How::RequeueAfter(d) => Settle::RequeueAfter(Duration::from_millis(d)),
                How::Reject => Settle::Reject,
            };
            prop_assert_eq!(t.settle(id, verb, now), m.settle(id, h, now));
        }
        Op::ReleaseOwner(o) => {
            let ids: Vec<u64> = m
                .inflight
                .iter()
                .filter(|(_, f)| f.owner == o)
                .map(|(&k, _)| k)
                .collect();
            prop_assert_eq!(returned(t.release_owner(o)), m.give_back_all(ids));
        }
        Op::Advance(d) => {
            *ms += d;
            let now = base + Duration::from_millis(*ms);
            let ids: Vec<u64> = m
                .inflight
                .iter()
                .filter(|(_, f)| f.deadline.is_some_and(|at| at <= now))
                .map(|(&k, _)| k)
                .collect();
            prop_assert_eq!(returned(t.expire(now)), m.give_back_all(ids));
        }
        Op::Promote => {
            let (due, rest): (Vec<_>, Vec<_>) = m.delayed.iter().partition(|d| d.0 <= now);
            m.delayed = rest;
            m.ready.extend(due.iter().map(|d| d.1));
            prop_assert_eq!(t.promote(now), due.len());
        }
        Op::SetStage(s, v) => {
            let id = m.pick(s);
            let want = match m.inflight.get_mut(&id) {
                Some(f) => {
                    f.stage = v;
                    true
                }
                None => false,
            };
            prop_assert_eq!(t.set_stage(id, v), want);
        }
        Op::Retire(s) => {
            let id = m.pick(s);
            let want = match m.inflight.remove(&id) {
                Some(f) => {
                    m.out.push(f.e.v);
                    m.retired.insert(id, f.e.v | STRIPPED);
                    while m.retired.len() > m.window {
                        m.retired.pop_first();
                    }
                    true
                }
                None => false,
            };
            prop_assert_eq!(t.retire(id, |v| *v |= STRIPPED), want);
        }
        Op::TakeAll => {
            let mut want: Vec<u32> = m.inflight.values().map(|f| f.e.v).collect();
            want.extend(m.ordered().iter().map(|e| e.v));
            m.delayed.sort_by_key(|d| (d.0, d.1.seq));
            want.extend(m.delayed.iter().map(|d| d.1.v));
            m.inflight.clear();
            m.ready.clear();
            m.delayed.clear();
            m.retired.clear();
            m.out.extend(&want);
            prop_assert_eq!(t.take_all(), want);
        }
        Op::Window(w) => {
            t.set_window(w);
            m.window = w.max(1);
        }
        Op::Restore(stage, s) => {
            let seq = m.next_seq;
            m.next_seq += 1;
            let e = m.entry(s, seq, 0);
            let id = m.fly(e, 0, None, stage);
            prop_assert_eq!(t.insert_in_flight(e.v, s, stage), id);
        }
        Op::ExpireReady => {
            let mut want = Vec::new();
            let mut prios: Vec<u8> = m.ready.iter().map(|e| e.prio).collect();
            prios.sort_unstable_by(|a, b| b.cmp(a));
            prios.dedup();
            for p in prios {
                let mut level: Vec<MEntry> =
                    m.ready.iter().filter(|e| e.prio == p).copied().collect();
                level.sort_by_key(|e| e.seq);
                for e in level.iter().take_while(|e| e.v.is_multiple_of(3)) {
                    want.push(e.v);
                    m.ready.retain(|x| x.seq != e.seq);
                    m.dead.push((e.v, Reason::Expired));
                }
            }
            prop_assert_eq!(t.expire_ready(|v| v.is_multiple_of(3)), want);
        }
        Op::PopReady => {
            let want = m.pop_best().map(|e| e.v);
            m.out.extend(want);
            prop_assert_eq!(t.pop_ready(), want);
        }
        Op::DropReadyIf => {
            let before = m.ready.len();
            let dropped: Vec<u32> = m
                .ready
                .iter()
                .filter(|e| e.v.is_multiple_of(4))
                .map(|e| e.v)
                .collect();
            m.out.extend(&dropped);
            m.ready.retain(|e| !e.v.is_multiple_of(4));
            prop_assert_eq!(
                t.drop_ready_if(|v| v.is_multiple_of(4)),
                before - m.ready.len()
            );
        }
    }
    Ok(())
}

/// Everything observable agrees, and every item pushed is in exactly one place.
fn check(t: &Ledger<u32>, m: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.held_bytes(), m.bytes());
    prop_assert_eq!(t.in_flight_len(), m.inflight.len());
    prop_assert_eq!(t.ready_len(), m.ready.len());
    prop_assert_eq!(t.delayed_len(), m.delayed.len());
    prop_assert_eq!(t.len(), m.inflight.len() + m.ready.len() + m.delayed.len());
    let ready: Vec<u32> = t.ready().copied().collect();
    let want: Vec<u32> = m.ordered().iter().map(|e| e.v).collect();
    prop_assert_eq!(ready, want);
    let flights: Vec<(u64, u32, FlightInfo)> = t
        .inflight()
        .map(|(id, &v)| (id, v, t.flight(id).unwrap()))
        .collect();
    let want: Vec<(u64, u32, FlightInfo)> = m
        .inflight
        .iter()
        .map(|(&id, f)| {
            let info = FlightInfo {
                owner: f.owner,
                deadline: f.deadline,
                stage: f.stage,
                priority: f.e.prio,
                deliveries: f.e.deliveries,
                returns: f.e.returns,
            };
            (id, f.e.v, info)
        })
        .collect();
    prop_assert_eq!(flights, want);
    for (&id, &v) in &m.retired {
        prop_assert_eq!(t.get(id), Some(&v));
    }
    let mut delayed = m.delayed.clone();
    delayed.sort_by_key(|d| (d.0, d.1.seq));
    let got: Vec<(Instant, u32)> = t.delayed().map(|(at, &v)| (at, v)).collect();
    let want: Vec<(Instant, u32)> = delayed.iter().map(|d| (d.0, d.1.v)).collect();
    prop_assert_eq!(got, want);
    // Delivery counts of everything held: in flight, ready, delayed.
    let got: Vec<(u32, u32)> = t.deliveries().map(|(&v, n)| (v, n)).collect();
    let want: Vec<(u32, u32)> = m
        .inflight
        .values()
        .map(|f| (f.e.v, f.e.deliveries))
        .chain(m.ordered().iter().map(|e| (e.v, e.deliveries)))
        .chain(delayed.iter().map(|d| (d.1.v, d.1.deliveries)))
        .collect();
    prop_assert_eq!(got, want);
    let due = m
        .inflight
        .values()
        .filter_map(|f| f.deadline)
        .chain(m.delayed.iter().map(|d| d.0))
        .min();
    prop_assert_eq!(t.next_due(), due);
    // Nothing lost, nothing duplicated.
    let mut all: Vec<u32> = m.ready.iter().map(|e| e.v).collect();
    all.extend(m.inflight.values().map(|f| f.e.v));
    all.extend(m.delayed.iter().map(|d| d.1.v));
    all.extend(&m.out);
    all.extend(m.dead.iter().map(|d| d.0));
    all.sort_unstable();
    prop_assert_eq!(all, (1..=m.next_v).collect::<Vec<u32>>());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn ledger_matches_model(
        window in 1usize..5,
        policy in policy(),
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let base = Instant::now();
        let mut ms = 0;
        let mut t = Ledger::with_policy(window, policy);
        let mut m = Model::new(window, policy);
        for op in ops {
            step(&mut t, &mut m, op, base, &mut ms)?;
            check(&t, &m)?;
        }
    }
}

/// The next delivery through the window, as (id, item).
fn next(t: &mut Ledger<i32>) -> Option<(u64, i32)> {
    t.next_ready().map(|(id, &v)| (id, v))
}

/// A ledger with a window of 2 and `n` items of 10 bytes pushed, the first two sent.
fn two_sent(n: i32) -> Ledger<i32> {
    let mut t = Ledger::new(2);
    for i in 0..n {
        t.push(i, 10, 0);
    }
    assert_eq!(next(&mut t), Some((1, 0)));
    assert_eq!(next(&mut t), Some((2, 1)));
    assert_eq!(t.next_ready(), None, "the window is full");
    t
}

#[test]
fn window_and_acks() {
    let mut t = two_sent(4);
    assert_eq!(t.held_bytes(), 40);
    assert_eq!(t.ack(1), Some(0));
    assert_eq!(t.ack(1), None);
    assert_eq!(next(&mut t), Some((3, 2)));
    assert_eq!(t.ack(2), Some(1));
    t.push_front(1, 10, 0);
    assert_eq!(next(&mut t), Some((4, 1)));
    assert_eq!(t.ack_through(4), 2);
    assert_eq!(t.held_bytes(), 10);
    assert_eq!(t.take_all(), vec![3]);
    assert!(t.is_empty());
    assert_eq!(t.held_bytes(), 0);
}

#[test]
fn a_requeued_delivery_goes_back_to_its_place_and_priorities_come_first() {
    let now = Instant::now();
    let mut t = Ledger::new(1);
    for i in 0..4 {
        t.push(i, 1, 0);
    }
    t.push(9, 1, 5);
    let mut ids = Vec::new();
    for want in [9, 0, 1] {
        match t.claim(7, now) {
            Some(Claim::Deliver { id, item, .. }) => {
                assert_eq!(*item, want);
                ids.push(id);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(t.settle(ids[2], Settle::Requeue, now), Outcome::Requeued);
    let r = t.release_owner(7);
    assert_eq!((r.requeued, r.dead.len()), (2, 0));
    assert_eq!(t.ready().copied().collect::<Vec<_>>(), vec![9, 0, 1, 2, 3]);
}

#[test]
fn a_retired_delivery_leaves_the_window_and_a_late_ack_still_finds_it() {
    let mut t = two_sent(3);
    assert!(t.retire(1, |v| *v += 100));
    assert!(!t.retire(1, |_| {}), "retired once");
    assert_eq!((t.in_flight_len(), t.held_bytes()), (1, 20));
    assert_eq!(next(&mut t), Some((3, 2)));
    // A late ack of the retired id finds it (stripped as asked).
    assert_eq!(t.get(1), Some(&100));
    assert_eq!(t.ack(1), Some(100));
    assert_eq!(t.ack(1), None);
    // A cumulative ack covers retired ones too, in id order.
    assert!(t.retire(3, |_| {}));
    assert_eq!(t.take_through(3, |_| true), vec![1, 2]);
    // Ready ones superseded before they went out are dropped.
    t.push(7, 10, 0);
    t.push(8, 10, 0);
    assert_eq!(t.drop_ready_if(|&v| v == 7), 1);
    assert_eq!((t.ready_len(), t.held_bytes()), (1, 10));
    // At most `window` retired ones are kept, the oldest forgotten first.
    let mut t = Ledger::new(2);
    for i in 0..4 {
        t.push(i, 1, 0);
        let (id, _) = t.next_ready().unwrap();
        assert!(t.retire(id, |_| {}));
    }
    assert_eq!(
        (t.get(1), t.get(2), t.get(3), t.get(4)),
        (None, None, Some(&2), Some(&3))
    );
    assert_eq!(
        t.take_all(),
        Vec::<i32>::new(),
        "retired ones are not given back"
    );
    assert_eq!(t.ack(4), None);
}
