//! The replay rule: the journal from a checkpoint's offset on, applied over what the
//! checkpoint read (each session and the retained messages read at its own moment after
//! that offset), gives the state at the end of the journal.

use super::checkpoint::{load, snapshot_of};
use super::legacy::{MAGIC, MAGIC_V1, NO_JOURNAL, parse};
use super::*;
use proptest::prelude::*;

/// One change, as the live code makes it (a session's state is its `out`).
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// The client's session becomes persistent (`begin_persist`).
    Persist(usize),
    /// It stops being persistent (expiry 0 on a new connection, or DISCONNECT).
    Unpersist(usize),
    /// A clean start: the old session ends (dropped), a new one starts, not persistent.
    Clean(usize),
    Sub(usize, u32, u8),
    Unsub(usize, u32),
    Incoming(usize, u16, bool),
    Queue(usize),
    /// Sent (or back to waiting with 0, or released) the n-th delivery held.
    Pid(usize, usize, u16, bool),
    Ack(usize, usize),
    Retain(u8, u8),
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    let c = 0..3usize;
    prop_oneof![
        c.clone().prop_map(Op::Persist),
        c.clone().prop_map(Op::Unpersist),
        c.clone().prop_map(Op::Clean),
        (c.clone(), 1..4u32, 0..2u8).prop_map(|(c, s, q)| Op::Sub(c, s, q)),
        (c.clone(), 1..4u32).prop_map(|(c, s)| Op::Unsub(c, s)),
        (c.clone(), 1..4u16, any::<bool>()).prop_map(|(c, p, a)| Op::Incoming(c, p, a)),
        c.clone().prop_map(Op::Queue),
        c.clone().prop_map(Op::Queue),
        (c.clone(), 0..4usize, 0..4u16, any::<bool>()).prop_map(|(c, i, p, r)| Op::Pid(c, i, p, r)),
        (c.clone(), 0..4usize).prop_map(|(c, i)| Op::Ack(c, i)),
        (0..3u8, 0..3u8).prop_map(|(k, v)| Op::Retain(k, v)),
    ]
}

/// A live session state (an `out`), with an identity.
#[derive(Debug, Clone)]
pub(super) struct Out {
    pub(super) id: u64,
    pub(super) sgen: Option<u64>,
    pub(super) s: SavedSession,
}

/// Everything live at one moment.
#[derive(Debug, Clone)]
pub(super) struct World {
    pub(super) outs: Vec<Out>,
    pub(super) retained: HashMap<Key, Message>,
    pub(super) next_sgen: u64,
    pub(super) next_out: u64,
    pub(super) next_qid: u64,
}

pub(crate) fn sub(filter: &str, qos: u8) -> SubInfo {
    SubInfo {
        filter: filter.into(),
        qos: QoS::from_u8(qos).unwrap(),
        no_local: false,
        retain_as_published: false,
        retain_handling: RetainHandling::SendAtSubscribe,
        id: None,
        skip_dollar: false,
    }
}

pub(super) fn empty(sgen: u64) -> SavedSession {
    SavedSession::new(sgen, ProtocolVersion::V5, 60)
}

/// Applies `op` to the world and returns its journal records (pushed under the same
/// lock as the change: together).
pub(super) fn step(w: &mut World, op: &Op) -> Vec<Vec<u8>> {
    let mut recs = Vec::new();
    let mut push = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = Vec::new();
        f(&mut b);
        recs.push(b);
    };
    match *op {
        Op::Persist(c) => {
            let o = &mut w.outs[c];
            if o.sgen.is_none() {
                let g = w.next_sgen;
                w.next_sgen += 1;
                o.sgen = Some(g);
                o.s.sgen = g;
                let client = format!("c{c}");
                push(&|b| rec::open(b, &client, g, ProtocolVersion::V5, 60));
                for (sid, s) in &o.s.subs {
                    push(&|b| rec::sub(b, g, *sid, s));
                }
                for p in &o.s.incoming {
                    push(&|b| rec::incoming(b, g, *p, true));
                }
                for (qid, it) in &o.s.items {
                    push(&|b| rec::queue(b, g, *qid, &it.q));
                    push(&|b| rec::pid(b, g, *qid, it.pid, it.released));
                }
            }
        }
        Op::Unpersist(c) => {
            if let Some(g) = w.outs[c].sgen.take() {
                push(&|b| rec::end(b, g));
            }
        }
        Op::Clean(c) => {
            if let Some(g) = w.outs[c].sgen.take() {
                push(&|b| rec::end(b, g));
            }
            w.outs[c] = Out {
                id: w.next_out,
                sgen: None,
                s: empty(0),
            };
            w.next_out += 1;
        }
        Op::Sub(c, sid, q) => {
            let o = &mut w.outs[c];
            let info = sub(&format!("t/{sid}/{q}"), q);
            if let Some(g) = o.sgen {
                push(&|b| rec::sub(b, g, sid, &info));
            }
            o.s.subs.insert(sid, info);
        }
        Op::Unsub(c, sid) => {
            let o = &mut w.outs[c];
            if o.s.subs.remove(&sid).is_some()
                && let Some(g) = o.sgen
            {
                push(&|b| rec::unsub(b, g, sid));
            }
        }
        Op::Incoming(c, pid, add) => {
            let o = &mut w.outs[c];
            let changed = if add {
                o.s.incoming.insert(pid)
            } else {
                o.s.incoming.remove(&pid)
            };
            if changed && let Some(g) = o.sgen {
                push(&|b| rec::incoming(b, g, pid, add));
            }
        }
        Op::Queue(c) => {
            let qid = w.next_qid;
            w.next_qid += 1;
            let o = &mut w.outs[c];
            let q = Queued {
                msg: Message::new(Key::new("t/q").unwrap(), format!("m{qid}")),
                qos: QoS::AtLeastOnce,
                retain: false,
                sub_id: None,
            };
            if let Some(g) = o.sgen {
                push(&|b| rec::queue(b, g, qid, &q));
            }
            o.s.items.insert(
                qid,
                SavedItem {
                    q,
                    pid: 0,
                    released: false,
                },
            );
        }
        Op::Pid(c, n, pid, released) => {
            let o = &mut w.outs[c];
            if let Some((&qid, it)) = o.s.items.iter_mut().nth(n) {
                it.pid = pid;
                it.released = released;
                if let Some(g) = o.sgen {
                    push(&|b| rec::pid(b, g, qid, pid, released));
                }
            }
        }
        Op::Ack(c, n) => {
            let o = &mut w.outs[c];
            if let Some(&qid) = o.s.items.keys().nth(n) {
                o.s.items.remove(&qid);
                if let Some(g) = o.sgen {
                    push(&|b| rec::ack(b, g, qid));
                }
            }
        }
        Op::Retain(k, v) => {
            let payload = if v == 0 {
                String::new()
            } else {
                format!("v{v}")
            };
            let mut m = Message::new(Key::new(&format!("r/{k}")).unwrap(), payload);
            m.attrs.retain = true;
            if m.payload.is_empty() {
                w.retained.remove(&m.key);
            } else {
                w.retained.insert(m.key.clone(), m.clone());
            }
            push(&|b| rec::retained(b, &m));
        }
    }
    recs
}

pub(super) type SessionView = (
    u64,
    Vec<(u32, String)>,
    Vec<u16>,
    Vec<(u64, Bytes, u16, bool)>,
);
pub(super) type View = (BTreeMap<String, SessionView>, BTreeMap<String, Bytes>);

pub(super) fn session_view(s: &SavedSession) -> SessionView {
    (
        s.sgen,
        s.subs.iter().map(|(k, v)| (*k, v.filter.clone())).collect(),
        s.incoming.iter().copied().collect(),
        s.items
            .iter()
            .map(|(q, it)| (*q, it.q.msg.payload.clone(), it.pid, it.released))
            .collect(),
    )
}

pub(super) fn view_of_saved(s: &Saved) -> View {
    (
        s.sessions
            .iter()
            .map(|(c, s)| (c.clone(), session_view(s)))
            .collect(),
        s.retained
            .iter()
            .map(|(k, m)| (k.as_str().to_owned(), m.payload.clone()))
            .collect(),
    )
}

pub(super) fn view_of_world(w: &World) -> View {
    (
        w.outs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.sgen.is_some())
            .map(|(c, o)| (format!("c{c}"), session_view(&o.s)))
            .collect(),
        w.retained
            .iter()
            .map(|(k, m)| (k.as_str().to_owned(), m.payload.clone()))
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn replay_over_any_checkpoint_gives_the_final_state(
        ops in proptest::collection::vec(op(), 1..60),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 11),
    ) {
        let mut w = World {
            outs: (0..3).map(|i| Out { id: i, sgen: None, s: empty(0) }).collect(),
            retained: HashMap::new(),
            next_sgen: 1,
            next_out: 3,
            next_qid: 1,
        };
        // worlds[i]: after ops[..i]; starts[i]: records before ops[i].
        let mut worlds = vec![w.clone()];
        let mut records: Vec<Vec<u8>> = Vec::new();
        let mut starts = vec![0];
        for o in &ops {
            records.extend(step(&mut w, o));
            worlds.push(w.clone());
            starts.push(records.len());
        }
        let n = ops.len() + 1;
        // The checkpoint: P at a moment, the registry listed later, each session read
        // later still (its own moment), the retained messages at their own moment.
        let p = cuts[0].index(n);
        let reg = p + cuts[1].index(n - p);
        let ret = p + cuts[2].index(n - p);
        let mut snap = Saved {
            replay_from: starts[p] as u64,
            next_sgen: worlds[p].next_sgen,
            ..Saved::default()
        };
        for (c, listed) in worlds[reg].outs.iter().enumerate() {
            let at = reg + cuts[3 + c].index(n - reg);
            let now = &worlds[at].outs[c];
            // Read through the `out` the registry listed: a replaced one has ended.
            if now.id == listed.id && let Some(g) = now.sgen {
                let mut s = now.s.clone();
                s.sgen = g;
                snap.insert(format!("c{c}"), s);
            }
        }
        for m in worlds[ret].retained.values() {
            snap.set_retained(m.clone());
        }
        // The log: the journal records, an older checkpoint (the world at `p0`, written
        // at `q0`) before P, this checkpoint written after its last read, and maybe a
        // checkpoint cut short at the end (a crash); or this one cut short at the end,
        // the older one then the base.
        let last_read = (0..3)
            .map(|c| reg + cuts[3 + c].index(n - reg))
            .chain([ret])
            .max()
            .unwrap_or(reg);
        let p0 = cuts[6].index(p + 1);
        let q0 = p0 + cuts[7].index(p + 1 - p0);
        let q = last_read + cuts[8].index(n - last_read);
        // 0: nothing cut, 1: a later checkpoint cut at the end, 2: this one cut.
        let torn = cuts[9].index(3);
        let mut old = Saved {
            next_sgen: worlds[p0].next_sgen,
            ..Saved::default()
        };
        for (c, o) in worlds[p0].outs.iter().enumerate() {
            if let Some(g) = o.sgen {
                let mut s = o.s.clone();
                s.sgen = g;
                old.insert(format!("c{c}"), s);
            }
        }
        for m in worlds[p0].retained.values() {
            old.set_retained(m.clone());
        }
        // A checkpoint's records; `cut`: only a part of them, its `K` never.
        let block = |log: &mut Vec<Vec<u8>>, saved: &Saved, number, p: usize, cut: bool| {
            let recs = snapshot_of(saved, number, p as u64);
            let n = recs.ends.len();
            let keep = if cut { 1 + cuts[10].index(n - 1) } else { n };
            let mut start = 0;
            for &end in recs.ends.iter().take(keep) {
                log.push(recs.bytes[start..end].to_vec());
                start = end;
            }
        };
        let mut log: Vec<Vec<u8>> = Vec::new();
        let (mut p0_log, mut p_log) = (0, 0);
        for i in 0..=records.len() {
            if i == starts[p0] {
                p0_log = log.len();
            }
            if i == starts[q0] {
                block(&mut log, &old, 1, p0_log, false);
            }
            if i == starts[p] {
                p_log = log.len();
            }
            if i == starts[q] && torn != 2 {
                block(&mut log, &snap, 2, p_log, false);
            }
            if let Some(r) = records.get(i) {
                log.push(r.clone());
            }
        }
                match torn {
            1 => {
                let at = log.len();
                block(&mut log, &old, 3, at, true);
            }
            2 => block(&mut log, &snap, 2, p_log, true),
            _ => {}
        }
        let loaded = load(&log[..]).unwrap();
        prop_assert!(loaded.complete);
        prop_assert_eq!(loaded.skipped, 0);
        prop_assert_eq!(loaded.next_number, if torn == 1 { 4 } else { 3 });
        prop_assert_eq!(view_of_saved(&loaded.saved), view_of_world(&w));
        prop_assert!(loaded.saved.next_sgen >= w.next_sgen);
    }
}

#[test]
fn version_1_files_are_read() {
    let mut b = Vec::new();
    b.put_slice(MAGIC_V1);
    let mut m = Message::new(Key::new("a/b").unwrap(), "kept");
    m.attrs.retain = true;
    b.put_u8(b'R');
    put_message(&mut b, &m);
    b.put_u8(b'S');
    put_bytes(&mut b, b"client");
    b.put_u8(5);
    b.put_u32(60);
    b.put_u32(1);
    put_sub(&mut b, 1, &sub("x/#", 1));
    b.put_u32(0);
    // One in flight (pid 3), one waiting.
    let q = Queued {
        msg: Message::new(Key::new("x/1").unwrap(), "one"),
        qos: QoS::AtLeastOnce,
        retain: false,
        sub_id: None,
    };
    b.put_u32(1);
    b.put_u16(3);
    b.put_u8(0);
    put_queued(&mut b, &q);
    b.put_u32(1);
    put_queued(&mut b, &q);
    let s = parse(Bytes::from(b)).unwrap();
    assert_eq!(s.retained.len(), 1);
    let c = &s.sessions["client"];
    assert_eq!(c.subs.len(), 1);
    assert_eq!(
        c.items.values().map(|i| i.pid).collect::<Vec<_>>(),
        vec![3, 0]
    );
    assert!(s.next_sgen > c.sgen);
}

/// A message on `key` (bytes, so that it may be no valid key), as `put_message` writes
/// one: no reply-to, correlation or headers, QoS 1, no expiry.
fn raw_message(b: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
    put_bytes(b, key);
    put_bytes(b, payload);
    b.put_slice(&[0, 0, 0, 0, 0, 0, 1, 0, 0]);
    b.put_u64(u64::MAX);
}

/// A delivery on `key` as `put_queued` writes one (QoS 1, not retained, no id).
fn raw_queued(b: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
    raw_message(b, key, payload);
    b.put_slice(&[1, 0, 0, 0, 0, 0]);
}

/// Issue 44: one entry whose key no key may be (a control character let in by an older
/// broker, or an edit) costs that entry, with a warning: not the file, so not every
/// persistent session. Each place a key is read: a retained message's key, a queued
/// delivery's key and its reply-to, in the checkpoint (both versions) and the journal.
#[test]
fn an_entry_with_a_bad_key_is_skipped_not_the_state() {
    for v1 in [false, true] {
        let mut b = Vec::new();
        b.put_slice(if v1 { MAGIC_V1 } else { MAGIC });
        if !v1 {
            b.put_u64(NO_JOURNAL);
            b.put_u64(10);
        }
        b.put_u8(b'R');
        raw_message(&mut b, b"x\x01", b"bad");
        b.put_u8(b'R');
        raw_message(&mut b, b"r/good", b"kept");
        for (n, client) in ["alice", "bob"].into_iter().enumerate() {
            b.put_u8(b'S');
            put_bytes(&mut b, client.as_bytes());
            if !v1 {
                b.put_u64(n as u64 + 1);
            }
            b.put_u8(5);
            b.put_u32(60);
            b.put_u32(1);
            put_sub(&mut b, 1, &sub("t/#", 1));
            b.put_u32(0);
            // Deliveries: good, bad key, bad reply-to, good.
            let mut items: [Vec<u8>; 4] = Default::default();
            raw_queued(&mut items[0], b"t/1", b"one");
            raw_queued(&mut items[1], b"t/\x7f", b"bad");
            let m = &mut items[2];
            put_bytes(m, b"t/r");
            put_bytes(m, b"bad reply-to");
            m.put_u8(1);
            put_bytes(m, b"r\n");
            m.put_slice(&[0, 0, 0, 0, 0, 1, 0, 0]);
            m.put_u64(u64::MAX);
            m.put_slice(&[1, 0, 0, 0, 0, 0]);
            raw_queued(&mut items[3], b"t/2", b"two");
            if v1 {
                // One in flight (pid 7), the rest waiting.
                b.put_u32(1);
                b.put_u16(7);
                b.put_u8(0);
                b.put_slice(&items[0]);
                b.put_u32(3);
                for it in &items[1..] {
                    b.put_slice(it);
                }
            } else {
                b.put_u32(4);
                for (qid, it) in items.iter().enumerate() {
                    b.put_u64(qid as u64 + 1);
                    b.put_u16(if qid == 0 { 7 } else { 0 });
                    b.put_u8(0);
                    b.put_slice(it);
                }
            }
        }
        let s = parse(Bytes::from(b)).unwrap_or_else(|e| panic!("v1 {v1}: {e}"));
        let retained: Vec<&str> = s.retained.keys().map(Key::as_str).collect();
        assert_eq!(retained, ["r/good"], "v1 {v1}");
        for client in ["alice", "bob"] {
            let c = &s.sessions[client];
            assert_eq!(c.subs.len(), 1, "v1 {v1}");
            let items: Vec<(&str, u16)> = c
                .items
                .values()
                .map(|i| (i.q.msg.key.as_str(), i.pid))
                .collect();
            assert_eq!(items, [("t/1", 7), ("t/2", 0)], "v1 {v1} {client}");
        }
    }

    // The journal: a retained message and a delivery with a bad key are records applied
    // as no change (not errors); the good ones next to them apply.
    let mut s = Saved::default();
    let mut rec = Vec::new();
    rec::open(&mut rec, "carol", 1, ProtocolVersion::V5, 60);
    s.apply(&rec).unwrap();
    for (key, qid) in [(&b"q\x01"[..], 1u64), (b"q/ok", 2)] {
        let mut rec = vec![b'Q'];
        rec.put_u64(1);
        rec.put_u64(qid);
        raw_queued(&mut rec, key, b"p");
        s.apply(&rec).unwrap();
    }
    for key in [&b"r\r"[..], b"r/ok"] {
        let mut rec = vec![b'R'];
        raw_message(&mut rec, key, b"p");
        s.apply(&rec).unwrap();
    }
    let items: Vec<&str> = s.sessions["carol"]
        .items
        .values()
        .map(|i| i.q.msg.key.as_str())
        .collect();
    assert_eq!(items, ["q/ok"]);
    let retained: Vec<&str> = s.retained.keys().map(Key::as_str).collect();
    assert_eq!(retained, ["r/ok"]);
}

#[test]
fn garbage_records_are_errors_not_panics() {
    let mut s = Saved::default();
    for bad in [
        &b""[..],
        b"Z",
        b"Q\x00",
        b"O\x00\x00\x00\x09ab",
        b"A\x00\x00\x00\x00\x00\x00\x00\x01",
    ] {
        assert!(s.apply(bad).is_err(), "{bad:?}");
    }
    assert!(parse(Bytes::from_static(b"HAYATE-MQTT 2\n\x00")).is_err());
    assert!(parse(Bytes::from_static(b"nonsense")).is_err());
}
