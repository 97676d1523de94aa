//! Persistent MQTT sessions and retained messages on disk: the checkpoint file
//! (`mqtt.state`), the records of the journal ([`super::journal`]), and the state they make
//! together ([`Saved`]).
//!
//! # Checkpoint and journal
//! A checkpoint writes the whole state, rewritten whole (to a temporary file, synced, then
//! renamed over the old one, the directory synced), at start, every `mqtt.autosave_secs`,
//! when the journal has grown past [`CHECKPOINT_AT`] (or twice the last checkpoint), and at
//! shutdown. It records the journal offset `P` read before the state was read: every change
//! whose record is below `P` was made before and is in the file; changes from `P` on may or
//! may not be, and replaying their records is harmless either way (see [`Saved::apply`]).
//! At start: read the file, replay the journal from `P`, restore, checkpoint (so a replay
//! never spans two runs of the broker), remove the journal segments below the new `P`.
//!
//! # Identities
//! Each persistent session has a *generation*, unique in the data directory (`next_sgen` in
//! the file), given when the session becomes persistent; records name a session by it. Each
//! QoS 1/2 delivery of a session has a number (`qid`) unique in its generation. Replaying
//! is idempotent because of them: opening a generation already there, queueing a `qid`
//! already there, acknowledging a `qid` not there, ending a generation not there: no-ops.
//!
//! # Formats
//! Integers are big-endian; strings and byte strings are a `u32` length and the bytes;
//! expiry instants are wall-clock milliseconds since the Unix epoch (`u64::MAX`: none).
//! - File: `HAYATE-MQTT 2\n`, `u64` P (`u64::MAX`: the file alone is the state, written
//!   with no journal: nothing is replayed), `u64` next generation, then records: `R` a retained
//!   message, `S` a session (client id, generation, protocol level, expiry interval,
//!   subscriptions, unreleased inbound QoS 2 packet ids, deliveries with their `qid`,
//!   packet id (0: waiting) and stage). Version 1 files (`HAYATE-MQTT 1\n`, no journal)
//!   are still read.
//! - Journal records (the value of a log record): a tag byte and fields, see [`rec`].
//!
//! # Bad entries
//! A message whose key or reply-to is not a valid key (a control character, which builds
//! before issue 44's fix let in from MQTT topics) costs that message, with a warning: it is
//! read to its end (every field has its length) and left out, a retained message or one
//! delivery of a session, and the rest of the checkpoint or journal record is used. Any
//! other undecodable content is corruption: the checkpoint is moved aside, a journal record
//! skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes};
use hayate_core::{Key, Message};
use hayate_mqtt::{ProtocolVersion, QoS, RetainHandling, shared_subscription};

use super::Mqtt;
use super::delivery::{Persist, Queued, Stage, SubInfo};
use super::translate::{broker_qos, filter_to_expr, guarantee, qos_of};
use hayate_core::sync::lock;

mod codec;
pub(crate) use codec::rec;
use codec::*;

const MAGIC_V1: &[u8] = b"HAYATE-MQTT 1\n";
const MAGIC: &[u8] = b"HAYATE-MQTT 2\n";
pub(crate) const FILE: &str = "mqtt.state";
/// The journal offset of a checkpoint that is the whole state on its own (taken with no
/// journal, or with a journal that could not be reopened): nothing is replayed over it.
pub(crate) const NO_JOURNAL: u64 = u64::MAX;
/// A checkpoint is taken once the journal grew by this much (or by twice the size of the
/// last checkpoint, if larger) since the last one.
pub(crate) const CHECKPOINT_AT: u64 = 64 << 20;

/// Why a saved state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The file could not be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file is not a state file of a known version, or is truncated.
    #[error("corrupt state file: {0}")]
    Corrupt(&'static str),
}

// ----- the state -----

/// A delivery of a session: waiting (`pid` 0) or in flight.
#[derive(Debug, Clone)]
pub(crate) struct SavedItem {
    pub(crate) q: Queued,
    pub(crate) pid: u16,
    pub(crate) released: bool,
}

/// A persistent session as saved.
#[derive(Debug, Clone)]
pub(crate) struct SavedSession {
    pub(crate) sgen: u64,
    pub(crate) version: ProtocolVersion,
    pub(crate) expiry: u32,
    pub(crate) subs: BTreeMap<u32, SubInfo>,
    pub(crate) incoming: BTreeSet<u16>,
    pub(crate) items: BTreeMap<u64, SavedItem>,
    /// The user who owns the client id (journal `W`, checkpoint `W`).
    pub(crate) owner: Option<String>,
}

impl SavedSession {
    fn new(sgen: u64, version: ProtocolVersion, expiry: u32) -> SavedSession {
        SavedSession {
            sgen,
            version,
            expiry,
            subs: BTreeMap::new(),
            incoming: BTreeSet::new(),
            items: BTreeMap::new(),
            owner: None,
        }
    }
}

/// Persistent sessions and retained messages, as read from a checkpoint and the journal.
#[derive(Debug, Default)]
pub(crate) struct Saved {
    /// The journal offset the checkpoint covers up to.
    pub(crate) replay_from: u64,
    /// The next session generation to give.
    pub(crate) next_sgen: u64,
    /// By client identifier.
    pub(crate) sessions: HashMap<String, SavedSession>,
    by_gen: HashMap<u64, String>,
    pub(crate) retained: HashMap<Key, Message>,
}

impl Saved {
    fn insert(&mut self, client: String, s: SavedSession) {
        self.next_sgen = self.next_sgen.max(s.sgen + 1);
        self.by_gen.insert(s.sgen, client.clone());
        if let Some(old) = self.sessions.insert(client, s) {
            self.by_gen.remove(&old.sgen);
        }
    }

    fn session(&mut self, sgen: u64) -> Option<&mut SavedSession> {
        let client = self.by_gen.get(&sgen)?;
        self.sessions.get_mut(client)
    }

    fn set_retained(&mut self, m: Message) {
        if m.payload.is_empty() {
            self.retained.remove(&m.key);
        } else {
            self.retained.insert(m.key.clone(), m);
        }
    }

    /// Applies one journal record. Idempotent in the sense of the module documentation: the
    /// records from the checkpoint's offset on, applied in order over the checkpoint, give
    /// the state at the end of the journal whichever of their changes the checkpoint has.
    pub(crate) fn apply(&mut self, rec: &[u8]) -> Result<(), PersistError> {
        let mut r = Reader(Bytes::copy_from_slice(rec));
        match r.u8()? {
            b'O' => {
                let client = r.string()?;
                let sgen = r.u64()?;
                let (version, expiry) = (r.version()?, r.u32()?);
                self.next_sgen = self.next_sgen.max(sgen + 1);
                let newer = self.sessions.get(&client).is_some_and(|s| s.sgen >= sgen);
                if !newer {
                    self.insert(client, SavedSession::new(sgen, version, expiry));
                }
            }
            b'M' => {
                let sgen = r.u64()?;
                let (version, expiry) = (r.version()?, r.u32()?);
                if let Some(s) = self.session(sgen) {
                    s.version = version;
                    s.expiry = expiry;
                }
            }
            b'W' => {
                let sgen = r.u64()?;
                let user = r.string()?;
                if let Some(s) = self.session(sgen) {
                    s.owner = Some(user);
                }
            }
            b'E' => {
                let sgen = r.u64()?;
                if let Some(client) = self.by_gen.remove(&sgen) {
                    self.sessions.remove(&client);
                }
            }
            b'S' => {
                let sgen = r.u64()?;
                let (sid, info) = r.sub()?;
                if let Some(s) = self.session(sgen) {
                    s.subs.insert(sid, info);
                }
            }
            b'U' => {
                let (sgen, sid) = (r.u64()?, r.u32()?);
                if let Some(s) = self.session(sgen) {
                    s.subs.remove(&sid);
                }
            }
            b'I' => {
                let (sgen, pid, add) = (r.u64()?, r.u16()?, r.u8()? == 1);
                if let Some(s) = self.session(sgen) {
                    if add {
                        s.incoming.insert(pid);
                    } else {
                        s.incoming.remove(&pid);
                    }
                }
            }
            b'Q' => {
                let (sgen, qid) = (r.u64()?, r.u64()?);
                let q = r.queued()?;
                if let Some(q) = q
                    && let Some(s) = self.session(sgen)
                {
                    s.items.entry(qid).or_insert(SavedItem {
                        q,
                        pid: 0,
                        released: false,
                    });
                }
            }
            b'P' => {
                let (sgen, qid, pid, released) = (r.u64()?, r.u64()?, r.u16()?, r.u8()? == 1);
                if let Some(s) = self.session(sgen)
                    && let Some(it) = s.items.get_mut(&qid)
                {
                    it.pid = pid;
                    it.released = released;
                }
            }
            b'A' => {
                let (sgen, qid) = (r.u64()?, r.u64()?);
                if let Some(s) = self.session(sgen) {
                    s.items.remove(&qid);
                }
            }
            b'R' => {
                if let Some(m) = r.message()? {
                    self.set_retained(m);
                }
            }
            _ => return Err(PersistError::Corrupt("unknown journal record")),
        }
        if r.0.has_remaining() {
            return Err(PersistError::Corrupt("trailing bytes in a journal record"));
        }
        Ok(())
    }
}

// ----- the checkpoint file -----

/// The state of `mqtt` now, as the bytes of a checkpoint covering the journal up to
/// `replay_from`; with the number of sessions and retained messages in it.
pub(crate) fn snapshot(mqtt: &Mqtt, replay_from: u64, next_sgen: u64) -> (Vec<u8>, usize, usize) {
    let mut b = Vec::new();
    b.put_slice(MAGIC);
    b.put_u64(replay_from);
    b.put_u64(next_sgen);
    let mut retained = 0;
    // `$SYS` messages are the broker's own, regenerated after a restart.
    for m in lock(&mqtt.retained)
        .all()
        .filter(|m| !super::is_sys(m.key.as_str()))
    {
        b.put_u8(b'R');
        put_message(&mut b, m);
        retained += 1;
    }
    let mut sessions = 0;
    for out in mqtt.session_states() {
        let st = lock(&out);
        let Some(p) = st.persist() else { continue };
        sessions += 1;
        b.put_u8(b'S');
        put_bytes(&mut b, p.client.as_bytes());
        b.put_u64(p.sgen);
        b.put_u8(p.version.level());
        b.put_u32(p.expiry);
        b.put_u32(st.subs.len() as u32);
        for (sid, s) in &st.subs {
            put_sub(&mut b, *sid, s);
        }
        b.put_u32(st.incoming.len() as u32);
        for pid in &st.incoming {
            b.put_u16(*pid);
        }
        let n = st.inflight().count() + st.pending().count();
        b.put_u32(n as u32);
        for (f, stage) in st.inflight() {
            b.put_u64(f.qid);
            b.put_u16(f.pid);
            b.put_u8(u8::from(stage == Stage::Released));
            put_queued(&mut b, &f.item);
        }
        for f in st.pending() {
            b.put_u64(f.qid);
            b.put_u16(0);
            b.put_u8(0);
            put_queued(&mut b, &f.item);
        }
        // `W` client, user: the session's owner (read by this version on; an older one
        // refuses a checkpoint with it).
        if let Some(o) = &p.owner {
            b.put_u8(b'W');
            put_bytes(&mut b, p.client.as_bytes());
            put_bytes(&mut b, o.as_bytes());
        }
    }
    (b, sessions, retained)
}

/// Writes `bytes` as the checkpoint file in `dir`, durably (temporary file, fsync, rename,
/// fsync of the directory).
pub(crate) fn write_file(dir: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    std::fs::create_dir_all(dir)?;
    hayate_log::storage::write_atomically(dir, FILE, bytes)?;
    Ok(())
}

/// Reads the checkpoint file in `dir` (an empty state if there is none).
pub(crate) fn read_file(dir: &Path) -> Result<Saved, PersistError> {
    let data = match std::fs::read(dir.join(FILE)) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Saved {
                next_sgen: 1,
                ..Saved::default()
            });
        }
        Err(e) => return Err(e.into()),
    };
    parse(Bytes::from(data))
}

/// Parses a checkpoint file's bytes.
pub(crate) fn parse(data: Bytes) -> Result<Saved, PersistError> {
    let mut saved = Saved {
        next_sgen: 1,
        ..Saved::default()
    };
    let v1 = if data.starts_with(MAGIC) {
        false
    } else if data.starts_with(MAGIC_V1) {
        true
    } else {
        return Err(PersistError::Corrupt("not a Hayate MQTT state file"));
    };
    let mut r = Reader(data.slice(MAGIC.len()..));
    if !v1 {
        saved.replay_from = r.u64()?;
        saved.next_sgen = r.u64()?.max(1);
    }
    let now = Instant::now();
    while r.0.has_remaining() {
        match r.u8()? {
            b'R' => {
                if let Some(m) = r.message_at(v1.then_some(now))? {
                    saved.set_retained(m);
                }
            }
            b'S' => {
                let (client, s) = if v1 {
                    let sgen = saved.next_sgen;
                    r.session_v1(sgen, now)?
                } else {
                    r.session()?
                };
                saved.insert(client, s);
            }
            b'W' if !v1 => {
                let client = r.string()?;
                let user = r.string()?;
                if let Some(s) = saved.sessions.get_mut(&client) {
                    s.owner = Some(user);
                }
            }
            _ => return Err(PersistError::Corrupt("unknown record")),
        }
    }
    Ok(saved)
}

/// Makes `saved` live in `mqtt`: retained messages, and sessions parked as if their clients
/// had just disconnected. Nothing is journaled; the sessions are persistent with their
/// saved generation. Returns (sessions, retained messages).
pub(crate) fn restore(mqtt: &Mqtt, saved: Saved) -> (usize, usize) {
    let retained = saved.retained.len();
    {
        let mut r = lock(&mqtt.retained);
        let refused = saved.retained.values().filter(|m| !r.restore(m)).count();
        if refused > 0 {
            tracing::warn!(
                refused,
                "retained messages past mqtt.max_retained_bytes not restored"
            );
        }
    }
    let sessions = saved.sessions.len();
    for (client, s) in saved.sessions {
        let mut ms = mqtt.new_session();
        for (sid, info) in s.subs {
            let (group, plain) = match shared_subscription(&info.filter) {
                Some(sh) => (Some(sh.group.to_string()), sh.filter.to_string()),
                None => (None, info.filter.clone()),
            };
            let Ok(expr) = filter_to_expr(&plain) else {
                tracing::warn!(client, filter = info.filter, "mqtt: saved filter not valid");
                continue;
            };
            let (filter, qos) = (info.filter.clone(), info.qos);
            lock(&ms.out).subs.insert(sid, info);
            if ms
                .session
                .subscribe(sid, expr, group.as_deref(), broker_qos(qos))
                .is_ok()
            {
                ms.subs.bind(filter, sid);
            }
        }
        {
            let mut st = lock(&ms.out);
            st.incoming = s.incoming.into_iter().collect();
            for (qid, it) in s.items {
                if it.pid != 0 {
                    let stage = if it.released {
                        Stage::Released
                    } else {
                        Stage::Sent
                    };
                    st.restore_inflight(qid, it.pid, it.q, stage);
                } else {
                    st.restore_pending(qid, it.q);
                }
            }
        }
        // The restored session is offline: no connection takes its output yet.
        let out = ms.out.clone();
        ms.session.outbox().detach(|| lock(&out).go_offline());
        let owner: Option<std::sync::Arc<str>> = s.owner.as_deref().map(Into::into);
        lock(&ms.out).resume_persist(Persist {
            journal: mqtt.journal().cloned(),
            client: client.as_str().into(),
            sgen: s.sgen,
            version: s.version,
            expiry: s.expiry,
            owner: owner.clone(),
        });
        mqtt.park_restored(client, ms, s.expiry, owner);
    }
    (sessions, retained)
}

#[cfg(test)]
mod tests {
    //! The replay rule: the journal from a checkpoint's offset on, applied over what the
    //! checkpoint read (each session and the retained messages read at its own moment after
    //! that offset), gives the state at the end of the journal.

    use super::*;
    use proptest::prelude::*;

    /// One change, as the live code makes it (a session's state is its `out`).
    #[derive(Debug, Clone)]
    enum Op {
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

    fn op() -> impl Strategy<Value = Op> {
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
            (c.clone(), 0..4usize, 0..4u16, any::<bool>())
                .prop_map(|(c, i, p, r)| Op::Pid(c, i, p, r)),
            (c.clone(), 0..4usize).prop_map(|(c, i)| Op::Ack(c, i)),
            (0..3u8, 0..3u8).prop_map(|(k, v)| Op::Retain(k, v)),
        ]
    }

    /// A live session state (an `out`), with an identity.
    #[derive(Debug, Clone)]
    struct Out {
        id: u64,
        sgen: Option<u64>,
        s: SavedSession,
    }

    /// Everything live at one moment.
    #[derive(Debug, Clone)]
    struct World {
        outs: Vec<Out>,
        retained: HashMap<Key, Message>,
        next_sgen: u64,
        next_out: u64,
        next_qid: u64,
    }

    fn sub(filter: &str, qos: u8) -> SubInfo {
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

    fn empty(sgen: u64) -> SavedSession {
        SavedSession::new(sgen, ProtocolVersion::V5, 60)
    }

    /// Applies `op` to the world and returns its journal records (pushed under the same
    /// lock as the change: together).
    fn step(w: &mut World, op: &Op) -> Vec<Vec<u8>> {
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

    type SessionView = (
        u64,
        Vec<(u32, String)>,
        Vec<u16>,
        Vec<(u64, Bytes, u16, bool)>,
    );
    type View = (BTreeMap<String, SessionView>, BTreeMap<String, Bytes>);

    fn session_view(s: &SavedSession) -> SessionView {
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

    fn view_of_saved(s: &Saved) -> View {
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

    fn view_of_world(w: &World) -> View {
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
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 6),
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
            // Through the file format too.
            let mut bytes = Vec::new();
            bytes.put_slice(MAGIC);
            bytes.put_u64(snap.replay_from);
            bytes.put_u64(snap.next_sgen);
            for m in snap.retained.values() {
                bytes.put_u8(b'R');
                put_message(&mut bytes, m);
            }
            for (c, s) in &snap.sessions {
                bytes.put_u8(b'S');
                put_bytes(&mut bytes, c.as_bytes());
                bytes.put_u64(s.sgen);
                bytes.put_u8(s.version.level());
                bytes.put_u32(s.expiry);
                bytes.put_u32(s.subs.len() as u32);
                for (sid, i) in &s.subs {
                    put_sub(&mut bytes, *sid, i);
                }
                bytes.put_u32(s.incoming.len() as u32);
                for pid in &s.incoming {
                    bytes.put_u16(*pid);
                }
                bytes.put_u32(s.items.len() as u32);
                for (qid, it) in &s.items {
                    bytes.put_u64(*qid);
                    bytes.put_u16(it.pid);
                    bytes.put_u8(u8::from(it.released));
                    put_queued(&mut bytes, &it.q);
                }
            }
            let mut saved = parse(Bytes::from(bytes)).unwrap();
            prop_assert_eq!(view_of_saved(&saved), view_of_saved(&snap));
            for r in &records[saved.replay_from as usize..] {
                saved.apply(r).unwrap();
            }
            prop_assert_eq!(view_of_saved(&saved), view_of_world(&w));
            prop_assert!(saved.next_sgen >= w.next_sgen);
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
}
