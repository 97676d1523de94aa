//! The outbound half of an MQTT session: deliveries from the broker become PUBLISH packets.
//!
//! [`MqttDeliveries`] is the session's delivery state: its subscriptions' options, the topic
//! aliases of the current connection, and its QoS 1 and 2 deliveries. Those are held by the
//! broker's [`Ledger`] (the window of deliveries in flight, the messages waiting behind
//! it or while the client is offline, the bytes they hold, and each delivery's QoS 2 stage
//! in the ledger's stage byte, [`Stage`]); MQTT keeps beside it only what is its own: packet
//! id <-> delivery id and the inbound QoS 2 packet ids not yet released. It lives as
//! long as the MQTT session (across reconnections) and is shared by
//! - [`MqttEncoder`], the session outbox's [`Encoder`](hayate_broker::Encoder): publishers'
//!   tasks call it under the outbox lock for every delivery;
//! - the connection's reader, which hands it acknowledgements through
//!   [`Outbox::push_reply_unbudgeted`](hayate_broker::Outbox::push_reply_unbudgeted) (so
//!   also under the outbox lock: lock order outbox, then this state; never the other way).
//!
//! # Layout
//! - this module: `MqttDeliveries` and what it holds (subscription options, QoS 1 and 2
//!   deliveries and their stages, packet ids): delivering, the window, acknowledgements,
//!   going online and offline;
//! - `link`: the attached connection's parameters (`Link`, topic aliases) and writing
//!   packets for it: PUBLISH (`MqttDeliveries` calls it) and control packets
//!   (`put_packet`);
//! - `encoder`: `MqttEncoder`, the outbox's encoder, and `HeldCounter`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hayate_broker::ledger::Settle;
use hayate_broker::{Ledger, OutBuf, footprint};
use hayate_core::{Key, Message};
use hayate_io::memory::{Charge, Memory};
use hayate_mqtt::{Ack, Packet, ProtocolVersion, PublishProperties, QoS, RetainHandling};

use super::journal::Journal;
use super::persist::rec;
use super::sys::HeldTotals;
use super::translate::qos_of;

/// The delivery state, shared between the encoder and the connection.
pub(crate) type SharedDeliveries = Arc<Mutex<MqttDeliveries>>;

mod encoder;
mod link;

pub(crate) use encoder::{HeldCounter, MqttEncoder};
pub(crate) use link::{Link, put_packet};
use link::{write_publish, write_queued};

/// One MQTT subscription's options (keyed by its broker subscription id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubInfo {
    /// The filter as subscribed (with `$share/group/` for a shared subscription).
    pub(crate) filter: String,
    /// The granted QoS.
    pub(crate) qos: QoS,
    pub(crate) no_local: bool,
    pub(crate) retain_as_published: bool,
    pub(crate) retain_handling: RetainHandling,
    /// The subscription identifier (5.0).
    pub(crate) id: Option<u32>,
    /// The filter starts with a wildcard: it must not match `$` topics (MQTT 4.7.2).
    pub(crate) skip_dollar: bool,
}

/// A QoS 1 or 2 delivery, waiting or in flight.
#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub(crate) msg: Message,
    pub(crate) qos: QoS,
    pub(crate) retain: bool,
    pub(crate) sub_id: Option<u32>,
}

/// Where a delivery in flight stands: the ledger's stage byte (the journal's `P` record and
/// the checkpoint keep it as their `released` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Stage {
    /// PUBLISH sent; waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    Sent = 0,
    /// PUBREL sent; waiting for PUBCOMP (QoS 2).
    Released = 1,
}

impl Stage {
    /// The stage of a ledger's stage byte (anything but 0 is released).
    pub(crate) fn of(byte: u8) -> Stage {
        if byte == 0 {
            Stage::Sent
        } else {
            Stage::Released
        }
    }

    /// The ledger's stage byte.
    pub(crate) fn byte(self) -> u8 {
        self as u8
    }
}

/// A QoS 1 or 2 delivery in the ledger: its number in the session (journal records name
/// it) and its packet id (0 while it waits); its stage is the ledger's.
#[derive(Debug, Clone)]
pub(crate) struct Inflight {
    pub(crate) qid: u64,
    pub(crate) pid: u16,
    pub(crate) item: Queued,
}

/// What makes a session persistent: its identity on disk, and the journal its changes go to
/// (`None` when the journal is off: then only checkpoints save it).
#[derive(Debug, Clone)]
pub(crate) struct Persist {
    pub(crate) journal: Option<Arc<Journal>>,
    pub(crate) client: Arc<str>,
    /// The session's generation (see `persist`).
    pub(crate) sgen: u64,
    pub(crate) version: ProtocolVersion,
    /// Session expiry interval, seconds (> 0).
    pub(crate) expiry: u32,
    /// The user whose client id this is (when users are configured), kept with the session
    /// so that ownership survives a restart.
    pub(crate) owner: Option<Arc<str>>,
}

/// Appends a journal record if `persist` says the session is persistent (`f` gets the buffer
/// and the session's generation). A function of the field, not of the state: `fill` calls it
/// while it holds the link.
fn journal_to(persist: &Option<Persist>, f: impl FnOnce(&mut Vec<u8>, u64)) {
    if let Some(p) = persist
        && let Some(j) = &p.journal
    {
        j.push(|b| f(b, p.sgen));
    }
}

/// The delivery state of one MQTT session.
#[derive(Debug)]
pub(crate) struct MqttDeliveries {
    /// The broker session id (deliveries from it are "local").
    pub(crate) session_id: u64,
    /// Subscriptions by broker subscription id.
    pub(crate) subs: HashMap<u32, SubInfo>,
    link: Option<Link>,
    next_pid: u16,
    /// QoS 1 and 2 deliveries: in flight (window) and waiting, with the bytes they hold.
    tracker: Ledger<Inflight>,
    /// Packet id -> delivery id of the deliveries in flight.
    pids: HashMap<u16, u64>,
    /// Most messages held (0: no limit).
    max_queued: usize,
    /// Most bytes held in flight and waiting (0: no limit).
    max_queued_bytes: usize,
    /// The tracker's held bytes (payload and key of the deliveries in flight and waiting),
    /// copied after every change for the encoder, which reports it to the outbox's budget
    /// without taking this state's lock.
    held: Arc<AtomicUsize>,
    /// A connection is attached (held bytes count against the budget only then).
    online: Arc<AtomicBool>,
    /// The held bytes' share of the broker-wide memory budget (online or not).
    charge: Charge,
    /// The front-end's totals of held deliveries, and this session's share in them.
    totals: Arc<HeldTotals>,
    counted: (u64, u64),
    max_inflight: u16,
    /// Packet ids of inbound QoS 2 PUBLISHes received and not yet released (PUBREL).
    pub(crate) incoming: HashSet<u16>,
    /// QoS 1 and 2 messages dropped because the queue was full.
    pub(crate) dropped: u64,
    /// PUBLISH packets sent.
    pub(crate) sent: u64,
    empty: PublishProperties,
    /// Set while the session is persistent: every change below is journaled.
    persist: Option<Persist>,
    /// The number of the next QoS 1/2 delivery.
    next_qid: u64,
}

impl Drop for MqttDeliveries {
    fn drop(&mut self) {
        // The session is gone: what it held is no longer held.
        self.count_held((0, 0));
    }
}

/// What a held delivery counts against the budgets (`mqtt.max_queued_bytes`, the outbox's,
/// the held bytes of `$SYS` and `/metrics`): its key and payload, and its properties
/// (reply-to, correlation data, user properties) with their allocations.
fn held_size(q: &Queued) -> usize {
    q.msg.payload.len() + q.msg.key.as_bytes().len() + footprint::properties(&q.msg)
}

/// What each held delivery costs the process beyond [`held_size`], charged to the memory
/// budget besides the tracker's own storage (`Ledger::storage_bytes`: its ring and map
/// slots, one `Inflight` each): the allocations of its key and payload, which
/// `Message::compact` copies for an offline session
/// ([`footprint::KEY_AND_PAYLOAD`]), and, in flight, its packet id's entry in `pids` (a
/// `(u16, u64)` and a control byte in a hash table at most 7/8 full, or twice that just
/// after it grew: 40 bytes).
const ITEM_COST: usize = footprint::KEY_AND_PAYLOAD + 40;

/// A packet id not in use by a delivery in flight, after the last one given.
fn alloc_pid(next: &mut u16, in_use: &HashMap<u16, u64>) -> u16 {
    loop {
        let p = *next;
        *next = next.checked_add(1).unwrap_or(1);
        if !in_use.contains_key(&p) {
            return p;
        }
    }
}

impl MqttDeliveries {
    pub(crate) fn new(
        session_id: u64,
        max_queued: usize,
        max_queued_bytes: usize,
        max_inflight: u16,
        memory: &Arc<Memory>,
        totals: &Arc<HeldTotals>,
    ) -> MqttDeliveries {
        MqttDeliveries {
            session_id,
            subs: HashMap::new(),
            link: None,
            next_pid: 1,
            tracker: Ledger::new(usize::from(max_inflight)),
            pids: HashMap::new(),
            max_queued,
            max_queued_bytes,
            held: Arc::new(AtomicUsize::new(0)),
            online: Arc::new(AtomicBool::new(false)),
            charge: Charge::exact(memory),
            totals: totals.clone(),
            counted: (0, 0),
            max_inflight,
            incoming: HashSet::new(),
            dropped: 0,
            sent: 0,
            empty: PublishProperties::default(),
            persist: None,
            next_qid: 1,
        }
    }

    /// Appends a journal record if the session is persistent (`f` gets the buffer and the
    /// session's generation).
    fn journal(&self, f: impl FnOnce(&mut Vec<u8>, u64)) {
        journal_to(&self.persist, f);
    }

    /// The session's persistence, if it is persistent.
    pub(crate) fn persist(&self) -> Option<&Persist> {
        self.persist.as_ref()
    }

    /// Makes the session persistent as `p` says: journals its whole state under the new
    /// generation `p.sgen` (an `O` record, then its subscriptions, unreleased packet ids
    /// and deliveries).
    pub(crate) fn begin_persist(&mut self, p: Persist) {
        if let Some(j) = &p.journal {
            let sgen = p.sgen;
            j.push(|b| rec::open(b, &p.client, sgen, p.version, p.expiry));
            if let Some(o) = &p.owner {
                j.push(|b| rec::owner(b, sgen, o));
            }
            for (sid, s) in &self.subs {
                j.push(|b| rec::sub(b, sgen, *sid, s));
            }
            for pid in &self.incoming {
                j.push(|b| rec::incoming(b, sgen, *pid, true));
            }
            for (_, f, stage) in self.tracker.inflight_staged() {
                j.push(|b| rec::queue(b, sgen, f.qid, &f.item));
                j.push(|b| rec::pid(b, sgen, f.qid, f.pid, Stage::of(stage) == Stage::Released));
            }
            for f in self.tracker.ready() {
                j.push(|b| rec::queue(b, sgen, f.qid, &f.item));
            }
        }
        self.persist = Some(p);
    }

    /// A restored session's persistence (nothing journaled: the journal has it already).
    pub(crate) fn resume_persist(&mut self, p: Persist) {
        self.persist = Some(p);
    }

    /// The persistent session's protocol version or expiry interval changed.
    pub(crate) fn update_persist(&mut self, version: ProtocolVersion, expiry: u32) {
        if let Some(p) = &mut self.persist
            && (p.version != version || p.expiry != expiry)
        {
            p.version = version;
            p.expiry = expiry;
            if let Some(j) = &p.journal {
                j.push(|b| rec::meta(b, p.sgen, version, expiry));
            }
        }
    }

    /// The session is no longer persistent (it ended, or goes on with expiry 0).
    pub(crate) fn end_persist(&mut self) {
        if let Some(p) = self.persist.take()
            && let Some(j) = &p.journal
        {
            j.push(|b| rec::end(b, p.sgen));
        }
    }

    /// Sets the options of subscription `sid`; returns the previous ones.
    pub(crate) fn set_sub(&mut self, sid: u32, info: SubInfo) -> Option<SubInfo> {
        self.journal(|b, sgen| rec::sub(b, sgen, sid, &info));
        self.subs.insert(sid, info)
    }

    /// Removes subscription `sid`.
    pub(crate) fn remove_sub(&mut self, sid: u32) -> Option<SubInfo> {
        let old = self.subs.remove(&sid);
        if old.is_some() {
            self.journal(|b, sgen| rec::unsub(b, sgen, sid));
        }
        old
    }

    /// An inbound QoS 2 PUBLISH `pid` is received (true) or released (false); returns
    /// whether that changed anything.
    pub(crate) fn set_incoming(&mut self, pid: u16, add: bool) -> bool {
        let changed = if add {
            self.incoming.insert(pid)
        } else {
            self.incoming.remove(&pid)
        };
        if changed {
            self.journal(|b, sgen| rec::incoming(b, sgen, pid, add));
        }
        changed
    }

    /// The version of the attached connection.
    pub(crate) fn version(&self) -> Option<ProtocolVersion> {
        self.link.as_ref().map(|l| l.version)
    }

    fn window(&self) -> usize {
        match &self.link {
            Some(l) => usize::from(l.receive_max.min(self.max_inflight)),
            None => 0,
        }
    }

    /// One delivery to subscription `sid`. `force_retain` marks a retained message sent
    /// because of a new subscription.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver(
        &mut self,
        sid: u32,
        key: &Key,
        payload: &Bytes,
        msg: Option<&Message>,
        origin: u64,
        force_retain: bool,
        out: &mut OutBuf,
    ) -> bool {
        let Some(sub) = self.subs.get(&sid) else {
            return false;
        };
        if sub.skip_dollar && key.as_bytes().first() == Some(&b'$') {
            return false;
        }
        if sub.no_local && origin == self.session_id {
            return false;
        }
        let attrs = msg.map(|m| m.attrs).unwrap_or_default();
        if let Some(at) = attrs.expires
            && Instant::now() >= at
        {
            return false;
        }
        let qos = match attrs.guarantee {
            Some(g) => sub.qos.min(qos_of(g)),
            None => sub.qos,
        };
        let retain = force_retain || (sub.retain_as_published && attrs.retain);
        let sub_id = sub.id;
        if qos == QoS::AtMostOnce {
            if let Some(link) = &mut self.link
                && write_publish(
                    link,
                    &self.empty,
                    key,
                    payload,
                    msg,
                    qos,
                    retain,
                    None,
                    false,
                    sub_id,
                    out,
                )
            {
                self.sent += 1;
                return true;
            }
            return false;
        }
        let msg = match msg {
            Some(m) => m.clone(),
            None => Message::new(key.clone(), payload.clone()),
        };
        self.enqueue(
            Queued {
                msg,
                qos,
                retain,
                sub_id,
            },
            out,
        )
    }

    /// Queues a QoS 1 or 2 delivery (restored from disk, or from [`MqttDeliveries::deliver`])
    /// and sends what the window allows.
    /// False when it was dropped (the session's queue or the memory budget full).
    pub(crate) fn enqueue(&mut self, q: Queued, out: &mut OutBuf) -> bool {
        let size = held_size(&q);
        let held = self.tracker.held_bytes();
        let sends_now = self.link.is_some()
            && self.tracker.ready_len() == 0
            && self.tracker.in_flight_len() < self.window();
        if self.max_queued_bytes > 0 && held + size > self.max_queued_bytes && held > 0 {
            self.dropped += 1;
            return false;
        }
        if !sends_now && self.max_queued > 0 && self.tracker.ready_len() >= self.max_queued {
            self.dropped += 1;
            return false;
        }
        // Within the broker-wide budget too, at its footprint; a session holding nothing
        // always takes one.
        let need = self.pooled(self.cost(1, size));
        if !self.charge.cover(need) {
            if held > 0 {
                self.dropped += 1;
                return false;
            }
            self.charge.force(need);
        }
        let qid = self.next_qid;
        self.next_qid += 1;
        self.journal(|b, sgen| rec::queue(b, sgen, qid, &q));
        let mut q = q;
        if self.link.is_none() {
            // Held for an offline session: see `go_offline`.
            q.msg = q.msg.compact();
        }
        let item = Inflight {
            qid,
            pid: 0,
            item: q,
        };
        self.tracker.push(item, size, 0);
        self.fill(out);
        true
    }

    /// Restores delivery `qid` that was in flight when the state was saved (restored in
    /// the order of their numbers).
    pub(crate) fn restore_inflight(&mut self, qid: u64, pid: u16, item: Queued, stage: Stage) {
        if self.pids.contains_key(&pid) {
            // Not from a consistent state. A delivery already released must not be sent
            // again as a new PUBLISH; one that was not is sent again (at least once).
            tracing::warn!(pid, qid, "mqtt: restored delivery with a packet id in use");
            if stage == Stage::Released {
                return;
            }
            return self.restore_pending(qid, item);
        }
        self.next_qid = self.next_qid.max(qid + 1);
        let size = held_size(&item);
        let id = self
            .tracker
            .insert_in_flight(Inflight { qid, pid, item }, size, stage.byte());
        self.pids.insert(pid, id);
        self.sync_held();
    }

    /// Restores delivery `qid` that was waiting when the state was saved.
    pub(crate) fn restore_pending(&mut self, qid: u64, item: Queued) {
        self.next_qid = self.next_qid.max(qid + 1);
        let size = held_size(&item);
        self.tracker.push(Inflight { qid, pid: 0, item }, size, 0);
        self.sync_held();
    }

    /// Moves waiting messages into flight while the window has room, each with a new
    /// packet id. One that expired while it waited, or that the client cannot take (larger
    /// than its Maximum Packet Size), is discarded.
    fn fill(&mut self, out: &mut OutBuf) {
        if let Some(link) = &mut self.link {
            while let Some((id, f)) = self.tracker.next_ready() {
                // Expired while it waited, or larger than the client takes: discarded.
                let expires = f.item.msg.attrs.expires;
                let qid = f.qid;
                let pid = alloc_pid(&mut self.next_pid, &self.pids);
                if expires.is_some_and(|at| Instant::now() >= at)
                    || !write_queued(link, &self.empty, &f.item, pid, false, out)
                {
                    self.tracker.ack(id);
                    journal_to(&self.persist, |b, g| rec::ack(b, g, qid));
                    continue;
                }
                self.sent += 1;
                self.pids.insert(pid, id);
                if let Some(f) = self.tracker.get_mut(id) {
                    f.pid = pid;
                }
                journal_to(&self.persist, |b, g| rec::pid(b, g, qid, pid, false));
            }
        }
        self.sync_held();
    }

    /// The delivery in flight under `pid` is done (acknowledged, refused or unsendable); the
    /// caller then fills the window ([`MqttDeliveries::fill`], which also updates the held
    /// bytes).
    fn remove(&mut self, pid: u16) {
        if let Some(id) = self.pids.remove(&pid)
            && let Some(f) = self.tracker.ack(id)
        {
            self.journal(|b, sgen| rec::ack(b, sgen, f.qid));
        }
    }

    /// Ends the exchange of `pid` if it is at `stage` of a `qos` delivery (PUBACK of a QoS 1
    /// delivery sent, PUBCOMP of a QoS 2 delivery released) and fills the window; false if
    /// it was not.
    fn complete(&mut self, pid: u16, qos: QoS, stage: Stage, out: &mut OutBuf) -> bool {
        if self.stage_of(pid) != Some((qos, stage)) {
            return false;
        }
        self.remove(pid);
        self.fill(out);
        true
    }

    fn sync_held(&mut self) {
        let held = self.tracker.held_bytes();
        self.held.store(held, Ordering::Relaxed);
        let now = (
            (self.tracker.in_flight_len() + self.tracker.ready_len()) as u64,
            held as u64,
        );
        self.count_held(now);
        // Restored deliveries exist already (forced); freed ones give their share back.
        let need = self.pooled(self.cost(0, 0));
        self.charge.force(need);
        self.charge.shrink(need);
    }

    /// Moves this session's share of the front-end's held totals to `now`.
    fn count_held(&mut self, now: (u64, u64)) {
        let (was, t) = (self.counted, &self.totals);
        if now.0 != was.0 {
            t.messages
                .fetch_add(now.0.wrapping_sub(was.0), Ordering::Relaxed);
        }
        if now.1 != was.1 {
            t.bytes
                .fetch_add(now.1.wrapping_sub(was.1), Ordering::Relaxed);
        }
        self.counted = now;
    }

    /// The footprint of what the session holds with `more` deliveries of `bytes` (their
    /// [`held_size`]) added: the held bytes, [`ITEM_COST`] per delivery and the tracker's
    /// storage. What [`MqttDeliveries::pooled`] charges the memory budget from.
    fn cost(&self, more: usize, bytes: usize) -> usize {
        let n = self.tracker.in_flight_len() + self.tracker.ready_len() + more;
        self.tracker.held_bytes() + bytes + n * ITEM_COST + self.tracker.storage_bytes(more)
    }

    /// What `held` bytes of deliveries charge the memory budget: past the outbox's free
    /// allowance while a connection is attached (a session that keeps up never touches
    /// the pool), all of them while the session is offline (offline sessions are not
    /// bounded by the number of connections).
    fn pooled(&self, held: usize) -> usize {
        if self.link.is_some() {
            held.saturating_sub(hayate_broker::FREE_BYTES)
        } else {
            held
        }
    }

    fn stage_of(&self, pid: u16) -> Option<(QoS, Stage)> {
        let id = *self.pids.get(&pid)?;
        let qos = self.tracker.get(id)?.item.qos;
        Some((qos, Stage::of(self.tracker.stage(id)?)))
    }

    /// PUBACK from the client; false if `pid` was not a QoS 1 delivery in flight.
    pub(crate) fn puback(&mut self, pid: u16, out: &mut OutBuf) -> bool {
        self.complete(pid, QoS::AtLeastOnce, Stage::Sent, out)
    }

    /// PUBREC from the client: answers PUBREL (with 0x92 if `pid` is unknown), or ends
    /// the exchange when the client refused the message.
    pub(crate) fn pubrec(&mut self, pid: u16, refused: bool, out: &mut OutBuf) {
        let Some(version) = self.version() else {
            return;
        };
        match self.stage_of(pid) {
            Some((QoS::ExactlyOnce, Stage::Sent | Stage::Released)) if refused => {
                self.remove(pid);
                self.fill(out);
            }
            Some((QoS::ExactlyOnce, _)) => {
                if let Some(&id) = self.pids.get(&pid)
                    && self.tracker.set_stage(id, Stage::Released.byte())
                    && let Some(f) = self.tracker.get(id)
                {
                    let qid = f.qid;
                    self.journal(|b, sgen| rec::pid(b, sgen, qid, pid, true));
                }
                put_packet(&Packet::PubRel(Ack::new(pid)), version, out);
            }
            _ if refused => {}
            _ => {
                let reason = hayate_mqtt::ReasonCode::PacketIdentifierNotFound;
                let ack = if version.is_v5() {
                    Ack::with_reason(pid, reason)
                } else {
                    Ack::new(pid)
                };
                put_packet(&Packet::PubRel(ack), version, out);
            }
        }
    }

    /// PUBCOMP from the client; false if `pid` was not released.
    pub(crate) fn pubcomp(&mut self, pid: u16, out: &mut OutBuf) -> bool {
        self.complete(pid, QoS::ExactlyOnce, Stage::Released, out)
    }

    /// Attaches a connection: re-sends every delivery in flight (PUBLISH with DUP, or
    /// PUBREL), then fills the window from the held messages.
    pub(crate) fn go_online(&mut self, link: Link, out: &mut OutBuf) {
        self.link = Some(link);
        self.online.store(true, Ordering::Relaxed);
        // The client's new Receive Maximum may be lower than what was in flight: the
        // newest deliveries still at stage Sent go back to their places among the held
        // messages (sent again later, with new packet ids).
        let window = self.window();
        self.tracker.set_window(window);
        while self.tracker.in_flight_len() > window {
            let Some((id, _, stage)) = self.tracker.inflight_staged().next_back() else {
                break;
            };
            if Stage::of(stage) == Stage::Released {
                break;
            }
            let Some(f) = self.tracker.get_mut(id) else {
                break;
            };
            let (pid, qid) = (std::mem::take(&mut f.pid), f.qid);
            self.pids.remove(&pid);
            self.journal(|b, sgen| rec::pid(b, sgen, qid, 0, false));
            self.tracker.settle(id, Settle::Requeue, Instant::now());
        }
        let Some(link) = &mut self.link else {
            return;
        };
        let mut unsendable = Vec::new();
        for (_, f, stage) in self.tracker.inflight_staged() {
            match Stage::of(stage) {
                Stage::Sent => {
                    if write_queued(link, &self.empty, &f.item, f.pid, true, out) {
                        self.sent += 1;
                    } else {
                        unsendable.push(f.pid);
                    }
                }
                Stage::Released => {
                    put_packet(&Packet::PubRel(Ack::new(f.pid)), link.version, out);
                }
            }
        }
        for pid in unsendable {
            self.remove(pid);
        }
        self.fill(out);
    }

    /// Detaches the connection: from now on QoS 0 deliveries are dropped and QoS 1 and 2
    /// ones are held (up to the queue limit) for the next connection.
    pub(crate) fn go_offline(&mut self) {
        self.link = None;
        self.online.store(false, Ordering::Relaxed);
        // Held until the client comes back, maybe for long: in allocations of their own,
        // not pinning the read buffers they arrived in. All of it now charges the budget
        // (it exists: forced).
        self.tracker
            .for_each_mut(|f| f.item.msg = f.item.msg.compact());
        self.sync_held();
    }

    /// What the encoder reads for
    /// [`Encoder::held_bytes`](hayate_broker::Encoder::held_bytes) without locking this
    /// state.
    pub(crate) fn held_counter(&self) -> HeldCounter {
        HeldCounter {
            held: self.held.clone(),
            online: self.online.clone(),
        }
    }

    /// Deliveries in flight with their stages, in order.
    pub(crate) fn inflight(&self) -> impl Iterator<Item = (&Inflight, Stage)> {
        self.tracker
            .inflight_staged()
            .map(|(_, f, stage)| (f, Stage::of(stage)))
    }

    /// Held deliveries, in order.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &Inflight> {
        self.tracker.ready()
    }
}
