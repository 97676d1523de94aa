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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes};
use hayate_core::{Key, Message};
use hayate_mqtt::{ProtocolVersion, QoS, RetainHandling, shared_subscription};

use super::Mqtt;
use super::delivery::{Persist, Queued, Stage, SubInfo};
use super::translate::{broker_qos, filter_to_expr, guarantee, qos_of};
use hayate_core::sync::lock;

pub(crate) mod checkpoint;
pub(crate) mod codec;
pub(crate) mod legacy;
pub(crate) use checkpoint::Records;
pub(crate) use codec::rec;
use codec::*;
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
#[derive(Debug, Default, Clone)]
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
mod crash_tests;
#[cfg(test)]
mod migrate_tests;
#[cfg(test)]
pub(crate) mod tests;
