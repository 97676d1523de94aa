//! Durable queues: what of a virtual host survives a restart of the broker (docs/amqp.md,
//! "Durable queues").
//!
//! One store per virtual host, in `<data>/amqp/<vhost dir>/`:
//! - `definitions.json`: the durable exchanges clients declared and the durable queues (flags,
//!   arguments, bindings), each queue with a number of its own (a queue deleted and declared
//!   again is another queue: the first one's messages do not come back into it);
//!   `definitions.log`: the changes since, one JSON line each, synced before the client's
//!   declare-ok (bind-ok, delete-ok); folded into `definitions.json` (temporary file,
//!   fsync, rename) at start and once it outgrows it.
//! - `log/`: a hayate-log with one record per persistent message and durable queue it entered
//!   (the queue's number, the exchange and routing key it is delivered with, its priority and
//!   expiry, then the message as streams store it). Appended in the publisher's task before
//!   its confirm; durable under the store's fsync policy (`[amqp] fsync`).
//! - `acks`: the offsets (8 bytes, big-endian) of records not to read back: their message
//!   left its queue (acknowledged, rejected, expired, dropped, purged, its queue deleted),
//!   or it was moved (the original, and copies a failed move left), appended every 100 ms:
//!   a message acknowledged just before a crash may come back once (at least once).
//! - `returns`: how often a quorum queue's message was given back (its id, 8 bytes, and the
//!   count, 4 bytes, big-endian; the last entry of an id counts), appended every 100 ms and
//!   rewritten with only the messages still held at start and once it has grown.
//!
//! Opening reads every record of a known queue whose offset is not in `acks` back into its
//! queue, marked redelivered, in the order the messages were first stored. Whole log
//! segments below the oldest message still held are removed as the queues move on, and
//! `acks` is rewritten without what they covered. So that one message held for long does
//! not keep every later segment, the records still held in the oldest segments are moved
//! to the log's end once the log outgrows what is held ([`Store::compact`]).
//!
//! Locks: [`Store::st`] is taken under a queue's state, never the other way round, and
//! only the log's own locks are taken under it (no append is made under it);
//! [`Store::files`] is taken before `st` when both are needed, and never under a queue's
//! lock; [`Store::flushing`] before `files`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hayate_amqp::{FieldTable, ShortStr};
use hayate_broker::stream::codec;
use hayate_log::storage::write_atomically;
use hayate_log::{Entry, FsyncPolicy, Log, LogConfig, ReadLimit, Record};
use serde::{Deserialize, Serialize};

use hayate_core::sync::lock;

use super::queue::QMsg;

/// The record format this store writes (its first byte).
const FORMAT: u8 = 1;

/// The format of a record moved to the log's end ([`Store::compact`]): [`FORMAT`]'s head
/// with the offset the message was first stored at (its id) after the format byte.
const FORMAT_MOVED: u8 = 2;

/// Log bytes allowed beyond twice the bytes of the records still held before the oldest
/// segment's held records are moved to the end (two segments).
const COMPACT_SLACK: u64 = 32 << 20;

/// The most segments one flush compacts (the rest wait for the next).
const COMPACT_SEGMENTS: usize = 4;

/// How often acknowledgements are written and old segments removed.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// `acks` and `returns` are rewritten (with only what is still needed) once they are this
/// large and have doubled since they were last rewritten.
const REWRITE_BYTES: u64 = 1 << 20;

/// How long compaction waits after it failed before it tries again.
const COMPACT_PAUSE: Duration = Duration::from_secs(30);

/// Bytes a moved record's head takes beyond the original's (the log is opened with this
/// much room above the largest record [`Store::append`] accepts, so every record can move).
const MOVED_EXTRA: usize = 8;

/// A durable exchange a client declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExchangeDef {
    /// Its type (`direct`, `fanout`, `topic`, `headers`).
    pub(crate) kind: String,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
}

/// A binding of a durable queue (the default exchange's is not kept: every queue has it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BindingDef {
    pub(crate) exchange: String,
    pub(crate) key: String,
    /// The binding's arguments, as an AMQP field table, in hex.
    pub(crate) arguments: String,
}

/// An exchange-to-exchange binding between two durable exchanges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EdgeDef {
    pub(crate) source: String,
    pub(crate) destination: String,
    pub(crate) key: String,
    /// The binding's arguments, as an AMQP field table, in hex.
    pub(crate) arguments: String,
}

/// A durable queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct QueueDef {
    /// Its number: records carry it.
    pub(crate) id: u64,
    pub(crate) auto_delete: bool,
    /// queue.declare's arguments, as an AMQP field table, in hex.
    pub(crate) arguments: String,
    pub(crate) bindings: Vec<BindingDef>,
}

/// `definitions.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Defs {
    /// The number the next durable queue gets.
    next_id: u64,
    exchanges: BTreeMap<String, ExchangeDef>,
    queues: BTreeMap<String, QueueDef>,
    /// Exchange-to-exchange bindings (absent from files older than them).
    #[serde(default)]
    edges: Vec<EdgeDef>,
}

/// One change of the definitions: a line of `definitions.log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Change {
    PutQueue {
        name: String,
        def: QueueDef,
    },
    RemoveQueue {
        name: String,
        id: u64,
    },
    SetBindings {
        name: String,
        id: u64,
        bindings: Vec<BindingDef>,
    },
    PutExchange {
        name: String,
        def: ExchangeDef,
    },
    RemoveExchange {
        name: String,
    },
    PutEdge {
        def: EdgeDef,
    },
    RemoveEdge {
        def: EdgeDef,
    },
}

impl State {
    /// The lowest offset a flush must keep: the first record held or being appended, else
    /// `end` (the log's end, read under `st`).
    fn floor(&self, end: u64) -> u64 {
        let held = self.live.first_key_value().map(|(o, _)| *o);
        let appending = self.in_flight.first_key_value().map(|(o, _)| *o);
        held.into_iter().chain(appending).min().unwrap_or(end)
    }

    /// Record `o` was copied to `c` (`bytes` long, synced): the copy holds its message from
    /// now on and `o` is settled; if the message was settled meanwhile, so is the copy.
    fn moved_to(&mut self, o: u64, c: u64, bytes: u64) {
        match self.live.remove(&o) {
            Some(h) => {
                self.live_bytes = self.live_bytes - h.bytes + bytes;
                self.live.insert(c, Held { id: h.id, bytes });
                self.moved.insert(h.id, c);
                self.acks.push(o);
            }
            None => self.acks.push(c),
        }
    }
}

impl Defs {
    /// Applies `c`; false when it changes nothing.
    fn apply(&mut self, c: &Change) -> bool {
        match c {
            Change::PutQueue { name, def } => {
                self.next_id = self.next_id.max(def.id);
                self.queues.insert(name.clone(), def.clone()).as_ref() != Some(def)
            }
            Change::RemoveQueue { name, id } => {
                if self.queues.get(name).is_some_and(|q| q.id == *id) {
                    self.queues.remove(name);
                    true
                } else {
                    false
                }
            }
            Change::SetBindings { name, id, bindings } => match self.queues.get_mut(name) {
                Some(q) if q.id == *id && q.bindings != *bindings => {
                    q.bindings = bindings.clone();
                    true
                }
                _ => false,
            },
            Change::PutExchange { name, def } => {
                self.exchanges.insert(name.clone(), def.clone()).as_ref() != Some(def)
            }
            Change::PutEdge { def } => {
                let new = !self.edges.contains(def);
                if new {
                    self.edges.push(def.clone());
                }
                new
            }
            Change::RemoveEdge { def } => {
                let before = self.edges.len();
                self.edges.retain(|e| e != def);
                self.edges.len() != before
            }
            Change::RemoveExchange { name } => {
                let mut changed = self.exchanges.remove(name).is_some();
                let before = self.edges.len();
                self.edges
                    .retain(|e| e.source != *name && e.destination != *name);
                changed |= self.edges.len() != before;
                for q in self.queues.values_mut() {
                    let before = q.bindings.len();
                    q.bindings.retain(|b| b.exchange != *name);
                    changed |= q.bindings.len() != before;
                }
                changed
            }
        }
    }
}

/// `definitions.json`, then the changes of `definitions.log` over it. A last line cut
/// short by a crash is left out (its change was not acknowledged); anything else that
/// does not read is an error.
fn read_defs(dir: &Path) -> Result<Defs, String> {
    let mut defs: Defs = match std::fs::read(dir.join("definitions.json")) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map_err(|e| format!("{}/definitions.json: {e}", dir.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Defs::default(),
        Err(e) => return Err(format!("{}/definitions.json: {e}", dir.display())),
    };
    let raw = match std::fs::read(dir.join("definitions.log")) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}/definitions.log: {e}", dir.display())),
    };
    let mut lines = raw.split(|b| *b == b'\n').peekable();
    let mut n = 0;
    while let Some(line) = lines.next() {
        n += 1;
        let last = lines.peek().is_none_or(|l| l.is_empty());
        if line.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Change>(line) {
            Ok(c) => {
                defs.apply(&c);
            }
            Err(_) if last => {
                tracing::warn!(dir = %dir.display(), "amqp store: definitions.log ends in a torn line: left out");
            }
            Err(e) => return Err(format!("{}/definitions.log line {n}: {e}", dir.display())),
        }
    }
    Ok(defs)
}

/// What opening a store found: the durable exchanges, and each durable queue with the
/// messages it held.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub(crate) exchanges: Vec<(String, ExchangeDef)>,
    pub(crate) edges: Vec<EdgeDef>,
    pub(crate) queues: Vec<(String, QueueDef, Vec<QMsg>)>,
}

/// A record whose message a queue still holds.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The message's id: the offset it was first stored at (what its queue knows it by).
    id: u64,
    /// The record's bytes on disk.
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The records whose message a queue still holds (ready or unacknowledged), by offset.
    live: BTreeMap<u64, Held>,
    /// Messages whose record is not where they were first stored: id → offset now.
    moved: HashMap<u64, u64>,
    /// Quorum queues' messages given back: id → times.
    returns: HashMap<u64, u32>,
    /// Ids whose count changed since the last flush.
    returned: HashSet<u64>,
    /// Appends in progress: the log's end offset before each (a lower bound of the offset
    /// it gets), with how many share it.
    in_flight: BTreeMap<u64, usize>,
    /// The bytes of the records in `live`.
    live_bytes: u64,
    /// Offsets settled since the last flush.
    acks: Vec<u64>,
    defs: Defs,
}

/// A file of fixed-size entries appended between rewrites (`acks`, `returns`).
#[derive(Debug)]
struct Entries {
    name: &'static str,
    file: std::fs::File,
    /// Its size after it was last rewritten.
    base: u64,
}

impl Entries {
    /// Writes `dir/name` with `bytes` (atomically) and opens it for appending.
    fn create(dir: &Path, name: &'static str, bytes: &[u8]) -> std::io::Result<Entries> {
        write_atomically(dir, name, bytes)?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(name))?;
        Ok(Entries {
            name,
            file,
            base: bytes.len() as u64,
        })
    }

    /// Appends `bytes` whole or not at all: a failed write is cut off again, so the entries
    /// after it stay aligned.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let len = self.file.metadata()?.len();
        self.file.write_all(bytes).inspect_err(|_| {
            let _ = self.file.set_len(len);
        })
    }

    /// It has grown enough to be rewritten.
    fn wants_rewrite(&self) -> bool {
        let size = self.file.metadata().map_or(0, |m| m.len());
        size >= REWRITE_BYTES && size >= 2 * self.base
    }

    /// Replaces the file with `bytes`.
    fn rewrite(&mut self, dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let mut e = Entries::create(dir, self.name, bytes)?;
        e.base = e.base.max(REWRITE_BYTES / 2);
        *self = e;
        Ok(())
    }
}

/// The entries of `N` bytes in `path` (none if it does not exist; a torn last one is
/// ignored).
fn read_entries<const N: usize>(path: &Path) -> std::io::Result<Vec<[u8; N]>> {
    let raw = match std::fs::read(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(raw
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N]))
        .collect())
}

/// `acks`' entries: offsets, 8 bytes big-endian.
fn acks_bytes(acks: impl IntoIterator<Item = u64>) -> Vec<u8> {
    acks.into_iter().flat_map(u64::to_be_bytes).collect()
}

/// `returns`' entries: an id (8 bytes) and its count (4), big-endian.
fn returns_bytes(returns: impl IntoIterator<Item = (u64, u32)>) -> Vec<u8> {
    let mut v = Vec::new();
    for (id, n) in returns {
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(&n.to_be_bytes());
    }
    v
}

#[derive(Debug)]
struct Files {
    acks: Entries,
    returns: Entries,
    /// `definitions.log`: the changes since `definitions.json` was written.
    journal: std::fs::File,
    /// The size of `definitions.json` when last written.
    snapshot_bytes: u64,
}

/// `definitions.log` is folded into `definitions.json` once it is this large and larger
/// than the snapshot (so a change costs one line, and the files stay within a few times
/// the definitions' size).
const JOURNAL_FOLD_BYTES: u64 = 64 << 10;

/// The durable state of one virtual host.
pub(crate) struct Store {
    dir: PathBuf,
    log: Log,
    /// The largest record [`Store::append`] takes.
    max_record: usize,
    st: Mutex<State>,
    files: Mutex<Files>,
    /// Held by a flush (one at a time; only a flush appends moved records and removes
    /// segments): until when compaction rests after a failure.
    flushing: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// A field table as hex (definitions keep tables so).
pub(crate) fn table_hex(t: &FieldTable) -> String {
    let mut b = BytesMut::new();
    hayate_amqp::types::Writer::new(&mut b).table(t);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A field table back from [`table_hex`].
pub(crate) fn table_of_hex(s: &str) -> Result<FieldTable, String> {
    if !s.len().is_multiple_of(2) {
        return Err("odd hex length".into());
    }
    let raw: Result<Vec<u8>, _> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
        .collect();
    let raw = raw.map_err(|e| e.to_string())?;
    let mut r = hayate_amqp::types::Reader::new(&raw);
    let t = r.table().map_err(|e| e.to_string())?;
    r.finish().map_err(|e| e.to_string())?;
    Ok(t)
}

/// The directory name of virtual host `name`: its characters a file name cannot hold (and
/// `%`) as `%XX`.
pub(crate) fn vhost_dir(name: &str) -> String {
    if name == "/" {
        return "default".into();
    }
    let mut d = String::from("vhost-");
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.' {
            d.push(b as char);
        } else {
            d.push_str(&format!("%{b:02X}"));
        }
    }
    if d.len() > 120 {
        // Too long for a file name: cut, and told apart by a hash of the whole name.
        let h = crate::frontend::stable_hash(name);
        let cut: String = d.chars().take(100).collect();
        d = format!("{cut}-{h:016x}");
    }
    d
}

/// Encodes the record of `m` in durable queue `queue`: its `headers` field.
fn encode_head(queue: u64, m: &QMsg, meta: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.put_u8(FORMAT);
    out.put_u64(queue);
    out.put_u8(m.priority);
    let x = m.exchange.as_bytes();
    out.put_u8(x.len().min(255) as u8);
    out.put_slice(&x[..x.len().min(255)]);
    let rk = m.routing_key.as_bytes();
    let n = rk.len().min(u16::MAX as usize);
    out.put_u16(n as u16);
    out.put_slice(&rk[..n]);
    out.put_i64(m.expires.map_or(-1, codec::instant_to_ms));
    out.put_slice(meta);
}

/// A record back into its queue's number, its message's id and the message (marked
/// redelivered); `Err` says what is wrong with it.
fn decode_record(r: &Record) -> Result<(u64, u64, QMsg), String> {
    let mut h = r.headers.clone();
    let need = |h: &Bytes, n: usize| {
        if h.remaining() < n {
            Err(format!("record {}: truncated head", r.offset))
        } else {
            Ok(())
        }
    };
    need(&h, 1 + 8 + 1 + 1)?;
    let id = match h.get_u8() {
        FORMAT => r.offset,
        FORMAT_MOVED => {
            need(&h, 8 + 8 + 1 + 1)?;
            h.get_u64()
        }
        _ => return Err(format!("record {}: unknown format", r.offset)),
    };
    let queue = h.get_u64();
    let priority = h.get_u8();
    let xl = usize::from(h.get_u8());
    need(&h, xl + 2)?;
    let exchange = h.split_to(xl);
    let rl = usize::from(h.get_u16());
    need(&h, rl + 8)?;
    let rk = h.split_to(rl);
    let expires = h.get_i64();
    let meta = Record {
        offset: r.offset,
        timestamp: r.timestamp,
        key: r.key.clone(),
        headers: h,
        value: r.value.clone(),
    };
    let msg = codec::decode(&meta).map_err(|e| e.to_string())?;
    let short = |b: Bytes| {
        ShortStr::new(b.clone())
            .unwrap_or_else(|| ShortStr::lit(std::str::from_utf8(&b).unwrap_or("")))
    };
    Ok((
        queue,
        id,
        QMsg {
            msg,
            exchange: short(exchange),
            routing_key: short(rk),
            redelivered: true,
            expires: (expires >= 0).then(|| codec::ms_to_instant(expires)),
            seq: 0,
            priority,
            stored: Some(id),
            returns: 0,
        },
    ))
}

/// The head of record `r` moved to the log's end: its message keeps its id.
fn moved_head(r: &Record) -> Vec<u8> {
    match r.headers.first() {
        Some(&FORMAT) => {
            let mut h = Vec::with_capacity(r.headers.len() + 8);
            h.push(FORMAT_MOVED);
            h.extend_from_slice(&r.offset.to_be_bytes());
            h.extend_from_slice(&r.headers[1..]);
            h
        }
        _ => r.headers.to_vec(),
    }
}

/// The bytes record `r` takes in the log.
fn record_bytes(r: &Record) -> u64 {
    Entry {
        timestamp: r.timestamp,
        key: &r.key,
        headers: &r.headers,
        value: &r.value,
    }
    .encoded_len() as u64
}

/// Each queue's messages read back, by queue number: (message id, message).
type QueueMsgs = HashMap<u64, Vec<(u64, QMsg)>>;

/// Reads every record of `log` back: a record not in `acked` whose queue is in `queues` is
/// held (into `st`, under its message's id, with its count from `returned`); the others
/// (settled, of a deleted queue, a second copy of a moved message, unreadable) are settled
/// (the second value). The first value: each queue's messages as (id, message), in log
/// order.
fn read_back(
    log: &Log,
    dir: &Path,
    queues: &HashSet<u64>,
    acked: &HashSet<u64>,
    mut returned: HashMap<u64, u32>,
    st: &mut State,
) -> Result<(QueueMsgs, Vec<u64>), String> {
    let mut held = QueueMsgs::new();
    // Ids met: a message moved to the end by a compaction that a crash cut short is there
    // twice (the first copy is kept).
    let mut ids_seen = HashSet::new();
    let mut settled = Vec::new();
    let mut at = log.start_offset();
    let end = log.end_offset();
    while at < end {
        let batch = log
            .read(
                at,
                ReadLimit {
                    max_bytes: 4 << 20,
                    max_records: 10_000,
                    confirmed_only: false,
                },
            )
            .map_err(|e| format!("{}/log: {e}", dir.display()))?;
        if batch.next <= at {
            break;
        }
        for r in &batch.records {
            if acked.contains(&r.offset) {
                settled.push(r.offset);
                continue;
            }
            match decode_record(r) {
                Ok((q, id, mut m)) if queues.contains(&q) && ids_seen.insert(id) => {
                    let bytes = record_bytes(r);
                    // The message keeps its id (the offset first stored at) for good.
                    st.live.insert(r.offset, Held { id, bytes });
                    if id != r.offset {
                        st.moved.insert(id, r.offset);
                    }
                    if let Some(n) = returned.remove(&id) {
                        m.returns = n;
                        st.returns.insert(id, n);
                    }
                    st.live_bytes += bytes;
                    held.entry(q).or_default().push((id, m));
                }
                // Its queue was deleted, or a second copy.
                Ok(_) => settled.push(r.offset),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), "amqp store: {e}: skipped");
                    settled.push(r.offset);
                }
            }
        }
        at = batch.next;
    }
    Ok((held, settled))
}

impl Store {
    /// Opens (or creates) the store in `dir` and reads back what it kept. Records of
    /// queues that no longer exist count as settled.
    pub(crate) fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        max_message: usize,
    ) -> Result<(Arc<Store>, Recovered), String> {
        Store::open_with(dir, None, fsync, max_message)
    }

    /// [`Store::open`] with the log in `storage` instead of `dir/log` (tests inject faults).
    fn open_with(
        dir: &Path,
        storage: Option<Arc<dyn hayate_log::Storage>>,
        fsync: FsyncPolicy,
        max_message: usize,
    ) -> Result<(Arc<Store>, Recovered), String> {
        let io = |what: &str, e: std::io::Error| format!("{}: {what}: {e}", dir.display());
        std::fs::create_dir_all(dir).map_err(|e| io("create", e))?;
        let _ = std::fs::remove_file(dir.join("definitions.json.tmp"));
        let _ = std::fs::remove_file(dir.join("acks.tmp"));
        let _ = std::fs::remove_file(dir.join("returns.tmp"));
        let defs = read_defs(dir)?;
        let max_record = max_message.saturating_add(256 << 10).min(1 << 30);
        let config = LogConfig {
            segment_bytes: 16 << 20,
            max_record_bytes: max_record + MOVED_EXTRA,
            fsync,
            ..LogConfig::default()
        };
        let log = match storage {
            Some(s) => Log::open(s, config),
            None => Log::open_dir(dir.join("log"), config),
        }
        .map_err(|e| format!("{}/log: {e}", dir.display()))?;
        for r in &log.recovery().repairs {
            tracing::warn!(dir = %dir.display(), "amqp store recovery: {r}");
        }
        let acked: HashSet<u64> = read_entries::<8>(&dir.join("acks"))
            .map_err(|e| io("acks", e))?
            .into_iter()
            .map(u64::from_be_bytes)
            .collect();
        // The last count of each id.
        let returned: HashMap<u64, u32> = read_entries::<12>(&dir.join("returns"))
            .map_err(|e| io("returns", e))?
            .into_iter()
            .map(|e| {
                let (id, n) = e.split_at(8);
                (
                    u64::from_be_bytes(id.try_into().unwrap_or([0; 8])),
                    u32::from_be_bytes(n.try_into().unwrap_or([0; 4])),
                )
            })
            .collect();
        let queues: HashSet<u64> = defs.queues.values().map(|q| q.id).collect();
        let mut st = State::default();
        let (mut held, settled) = read_back(&log, dir, &queues, &acked, returned, &mut st)?;
        // `acks` again, with only what the log still holds, and `returns` with only the
        // messages still held.
        let acks = Entries::create(dir, "acks", &acks_bytes(settled.iter().copied()))
            .map_err(|e| io("acks", e))?;
        let returns_file = Entries::create(
            dir,
            "returns",
            &returns_bytes(st.returns.iter().map(|(a, b)| (*a, *b))),
        )
        .map_err(|e| io("returns", e))?;
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("definitions.log"))
            .map_err(|e| io("definitions.log", e))?;
        let rec = Recovered {
            exchanges: defs
                .exchanges
                .iter()
                .map(|(n, x)| (n.clone(), x.clone()))
                .collect(),
            edges: defs.edges.clone(),
            queues: defs
                .queues
                .iter()
                .map(|(n, q)| {
                    // In the order they were first stored (moved ones are further on).
                    let mut msgs = held.remove(&q.id).unwrap_or_default();
                    msgs.sort_by_key(|(id, _)| *id);
                    (
                        n.clone(),
                        q.clone(),
                        msgs.into_iter().map(|(_, m)| m).collect(),
                    )
                })
                .collect(),
        };
        let store = Arc::new(Store {
            dir: dir.to_path_buf(),
            log,
            max_record,
            st: Mutex::new(State { defs, ..st }),
            files: Mutex::new(Files {
                acks,
                returns: returns_file,
                journal,
                snapshot_bytes: 0,
            }),
            flushing: Mutex::new(None),
        });
        // The definitions as read, in one file again.
        store
            .snapshot(&mut lock(&store.files))
            .map_err(|e| io("definitions.json", e))?;
        store.flush();
        Ok((store, rec))
    }

    /// Starts the task that writes acknowledgements and removes old segments (every
    /// [`FLUSH_EVERY`]) until the store is dropped.
    pub(crate) fn start(self: &Arc<Self>) {
        let weak: Weak<Store> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(FLUSH_EVERY).await;
                let Some(s) = weak.upgrade() else { return };
                // File work off the runtime's threads.
                let _ = tokio::task::spawn_blocking(move || s.flush()).await;
            }
        });
    }

    /// Appends `m`, entering durable queue `queue`; returns its offset, the message's id
    /// (held from now on, until [`Store::settle`]).
    pub(crate) fn append(&self, queue: u64, m: &QMsg) -> Result<u64, hayate_log::Error> {
        thread_local! {
            /// The message's metadata and the record's head, reused: no allocation per
            /// message.
            static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = Default::default();
        }
        SCRATCH.with_borrow_mut(|(meta, head)| {
            codec::encode_meta(&m.msg, meta);
            encode_head(queue, m, meta, head);
            let e = Entry {
                timestamp: codec::now_ms(),
                key: m.msg.key.as_bytes(),
                headers: head,
                value: &m.msg.payload,
            };
            let bytes = e.encoded_len();
            if bytes > self.max_record {
                return Err(hayate_log::Error::RecordTooLarge {
                    size: bytes,
                    max: self.max_record,
                });
            }
            // A flush must not remove the segment of a record appended but not yet in
            // `live`: the log's end before the append bounds it until then.
            let bound = {
                let mut st = lock(&self.st);
                let b = self.log.end_offset();
                *st.in_flight.entry(b).or_default() += 1;
                b
            };
            let r = self.log.append(&e);
            let mut st = lock(&self.st);
            if let Some(n) = st.in_flight.get_mut(&bound) {
                *n -= 1;
                if *n == 0 {
                    st.in_flight.remove(&bound);
                }
            }
            let o = r?;
            st.live.insert(
                o,
                Held {
                    id: o,
                    bytes: bytes as u64,
                },
            );
            st.live_bytes += bytes as u64;
            Ok(o)
        })
    }

    /// The record at `offset` is durable under the fsync policy.
    pub(crate) fn is_durable(&self, offset: u64) -> bool {
        self.log.confirmed_offset() > offset
    }

    /// Resolves once the record at `offset` is durable under the fsync policy; `None` when
    /// it is already.
    pub(crate) fn confirmed(&self, offset: u64) -> Option<hayate_log::Confirmed> {
        (!self.is_durable(offset)).then(|| self.log.confirmed(offset))
    }

    /// The message `id` (the offset [`Store::append`] gave) left its queue.
    pub(crate) fn settle(&self, id: u64) {
        let mut st = lock(&self.st);
        let offset = st.moved.remove(&id).unwrap_or(id);
        st.returns.remove(&id);
        if let Some(h) = st.live.remove(&offset) {
            st.live_bytes -= h.bytes;
            st.acks.push(offset);
        }
    }

    /// Message `id` of a quorum queue was given back: `n` times so far.
    pub(crate) fn note_return(&self, id: u64, n: u32) {
        let mut st = lock(&self.st);
        let at = st.moved.get(&id).copied().unwrap_or(id);
        if st.live.contains_key(&at) {
            st.returns.insert(id, n);
            st.returned.insert(id);
        }
    }

    /// Moves the records still held in the oldest segments to the log's end while the log
    /// is more than twice the bytes held (plus [`COMPACT_SLACK`]), so that one message
    /// held for long (a consumer that never acknowledges) does not keep every segment
    /// after it. A moved record keeps its message's id; the old one is settled once the
    /// copy is synced. A crash in between leaves both, and opening keeps the first. After a
    /// failure the copies made are settled and compaction rests for [`COMPACT_PAUSE`]
    /// (`paused`). Called by a flush, with `flushing` held.
    fn compact(&self, paused: &mut Option<Instant>) {
        if paused.is_some_and(|t| Instant::now() < t) {
            return;
        }
        for _ in 0..COMPACT_SEGMENTS {
            let segs = self.log.segments();
            let total: u64 = segs.iter().map(|s| s.bytes).sum();
            let (Some(first), true) = (segs.first(), segs.len() > 1) else {
                return;
            };
            let held: Vec<u64> = {
                let st = lock(&self.st);
                if total <= 2 * st.live_bytes + COMPACT_SLACK {
                    return;
                }
                st.live.range(..first.next).map(|(o, _)| *o).collect()
            };
            let mut copies = Vec::with_capacity(held.len());
            let mut failed = None;
            for &o in &held {
                match self.copy_to_end(o) {
                    Ok(c) => copies.push((o, c)),
                    Err(e) => {
                        failed = Some(format!("cannot move record {o}: {e}"));
                        break;
                    }
                }
            }
            if failed.is_none()
                && !copies.is_empty()
                && let Err(e) = self.log.sync()
            {
                failed = Some(format!("cannot sync moved records: {e}"));
            }
            let mut st = lock(&self.st);
            if let Some(why) = failed {
                // The copies made must not outlive their message after a restart.
                st.acks.extend(copies.iter().map(|(_, (c, _))| *c));
                drop(st);
                tracing::error!(dir = %self.dir.display(), "amqp store: {why}; compaction rests for {COMPACT_PAUSE:?}");
                *paused = Some(Instant::now() + COMPACT_PAUSE);
                return;
            }
            for (o, (c, bytes)) in copies {
                st.moved_to(o, c, bytes);
            }
            let floor = st.floor(self.log.end_offset());
            drop(st);
            if let Err(e) = self.log.delete_before(floor) {
                tracing::error!(dir = %self.dir.display(), "amqp store: cannot remove segments: {e}");
                return;
            }
        }
    }

    /// Appends a copy of record `o` (as moved); its offset and size.
    fn copy_to_end(&self, o: u64) -> Result<(u64, u64), hayate_log::Error> {
        let batch = self.log.read(
            o,
            ReadLimit {
                max_bytes: 0,
                max_records: 1,
                confirmed_only: false,
            },
        )?;
        let Some(r) = batch.records.first().filter(|r| r.offset == o) else {
            return Err(hayate_log::Error::OffsetOutOfRange {
                offset: o,
                start: self.log.start_offset(),
                end: self.log.end_offset(),
            });
        };
        let head = moved_head(r);
        let e = Entry {
            timestamp: r.timestamp,
            key: &r.key,
            headers: &head,
            value: &r.value,
        };
        let c = self.log.append(&e)?;
        Ok((c, e.encoded_len() as u64))
    }

    /// Compacts the log, writes the acknowledgements and return counts gathered since the
    /// last time, removes the segments no queue needs any more, folds `definitions.log`,
    /// and rewrites `acks` and `returns` when they have grown.
    pub(crate) fn flush(&self) {
        let mut paused = lock(&self.flushing);
        self.compact(&mut paused);
        let mut files = lock(&self.files);
        let rewrite_returns = files.returns.wants_rewrite();
        let (acks, floor, returned) = {
            let mut st = lock(&self.st);
            let floor = st.floor(self.log.end_offset());
            let changed = std::mem::take(&mut st.returned);
            // All counts when rewriting, else those that changed (and are still held).
            let returned: Vec<(u64, u32)> = if rewrite_returns {
                st.returns.iter().map(|(a, b)| (*a, *b)).collect()
            } else {
                changed
                    .into_iter()
                    .filter_map(|id| st.returns.get(&id).map(|n| (id, *n)))
                    .collect()
            };
            (std::mem::take(&mut st.acks), floor, returned)
        };
        let r = if rewrite_returns {
            files
                .returns
                .rewrite(&self.dir, &returns_bytes(returned.iter().copied()))
        } else if returned.is_empty() {
            Ok(())
        } else {
            files
                .returns
                .append(&returns_bytes(returned.iter().copied()))
        };
        if let Err(e) = r {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot write returns: {e}");
            // Again at the next flush.
            lock(&self.st)
                .returned
                .extend(returned.iter().map(|(id, _)| *id));
        }
        if !acks.is_empty()
            && let Err(e) = files.acks.append(&acks_bytes(acks.iter().copied()))
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot write acks: {e}");
            lock(&self.st).acks.extend(acks);
        }
        if floor > self.log.start_offset()
            && let Err(e) = self.log.delete_before(floor)
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot remove segments: {e}");
        }
        let journal = files.journal.metadata().map_or(0, |m| m.len());
        if journal >= JOURNAL_FOLD_BYTES
            && journal >= files.snapshot_bytes
            && let Err(e) = self.snapshot(&mut files)
        {
            tracing::error!(dir = %self.dir.display(), "amqp store: cannot fold definitions.log: {e}");
        }
        if files.acks.wants_rewrite() {
            // Without the offsets of removed segments.
            let start = self.log.start_offset();
            let r = read_entries::<8>(&self.dir.join("acks")).and_then(|a| {
                let mut keep: Vec<u64> = a
                    .into_iter()
                    .map(u64::from_be_bytes)
                    .filter(|o| *o >= start)
                    .collect();
                keep.sort_unstable();
                files.acks.rewrite(&self.dir, &acks_bytes(keep))
            });
            if let Err(e) = r {
                tracing::error!(dir = %self.dir.display(), "amqp store: cannot rewrite acks: {e}");
            }
        }
    }

    /// Applies a change to the definitions and, if it changed them, appends it to
    /// `definitions.log` and syncs it before returning (under `files`: changes are logged
    /// in the order they are applied).
    fn change(&self, c: Change) -> Result<(), String> {
        let mut files = lock(&self.files);
        if !lock(&self.st).defs.apply(&c) {
            return Ok(());
        }
        let mut line = serde_json::to_vec(&c).map_err(|e| e.to_string())?;
        line.push(b'\n');
        files
            .journal
            .write_all(&line)
            .and_then(|()| files.journal.sync_data())
            .map_err(|e| format!("{}/definitions.log: {e}", self.dir.display()))
    }

    /// Writes `definitions.json` with the definitions as they stand and empties
    /// `definitions.log` (called with `files` held). Replaying the log's changes over the
    /// new snapshot (a crash between the two) ends in the same definitions: every change
    /// sets a value by name.
    fn snapshot(&self, files: &mut Files) -> std::io::Result<()> {
        let raw = serde_json::to_vec_pretty(&lock(&self.st).defs)?;
        write_atomically(&self.dir, "definitions.json", &raw)?;
        files.journal.set_len(0)?;
        files.journal.sync_all()?;
        files.snapshot_bytes = raw.len() as u64;
        Ok(())
    }

    /// The number a new durable queue gets.
    pub(crate) fn new_queue_id(&self) -> u64 {
        let mut st = lock(&self.st);
        st.defs.next_id += 1;
        st.defs.next_id
    }

    /// Keeps durable queue `name` (replacing a queue of the same name).
    pub(crate) fn put_queue(&self, name: &str, def: QueueDef) -> Result<(), String> {
        self.change(Change::PutQueue {
            name: name.to_string(),
            def,
        })
    }

    /// Forgets durable queue `name` if it is still queue number `id`; its messages are
    /// settled by the queue.
    pub(crate) fn remove_queue(&self, name: &str, id: u64) -> Result<(), String> {
        self.change(Change::RemoveQueue {
            name: name.to_string(),
            id,
        })
    }

    /// Durable queue `name` (number `id`) has these bindings now.
    pub(crate) fn set_bindings(
        &self,
        name: &str,
        id: u64,
        bindings: Vec<BindingDef>,
    ) -> Result<(), String> {
        self.change(Change::SetBindings {
            name: name.to_string(),
            id,
            bindings,
        })
    }

    /// Keeps durable exchange `name`.
    pub(crate) fn put_exchange(&self, name: &str, def: ExchangeDef) -> Result<(), String> {
        self.change(Change::PutExchange {
            name: name.to_string(),
            def,
        })
    }

    /// Keeps an exchange-to-exchange binding.
    pub(crate) fn put_edge(&self, def: EdgeDef) -> Result<(), String> {
        self.change(Change::PutEdge { def })
    }

    /// Forgets an exchange-to-exchange binding.
    pub(crate) fn remove_edge(&self, def: EdgeDef) -> Result<(), String> {
        self.change(Change::RemoveEdge { def })
    }

    /// Forgets exchange `name`, every durable queue's bindings to it and the
    /// exchange-to-exchange bindings it is an end of.
    pub(crate) fn remove_exchange(&self, name: &str) -> Result<(), String> {
        self.change(Change::RemoveExchange {
            name: name.to_string(),
        })
    }

    /// Records whose message a queue still holds (for tests).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        lock(&self.st).live.len()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_core::{Key, Message};

    /// A directory of its own, removed when dropped.
    struct TmpDir(PathBuf);
    impl TmpDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tempdir() -> TmpDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("hayate-amqp-store-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TmpDir(d)
    }

    fn qmsg(key: &str, body: &str, persistent: bool) -> QMsg {
        let mut msg = Message::new(Key::new(key).unwrap(), Bytes::from(body.to_string()));
        if persistent {
            msg.headers = Some(vec![("persistent".into(), Bytes::from_static(b"true"))]);
        }
        msg.correlation_id = Some(Bytes::from_static(b"c-1"));
        QMsg {
            msg,
            exchange: ShortStr::lit("amq.topic"),
            routing_key: ShortStr::lit("a.b"),
            redelivered: false,
            expires: None,
            seq: 0,
            priority: 3,
            stored: None,
            returns: 0,
        }
    }

    fn def(id: u64) -> QueueDef {
        QueueDef {
            id,
            auto_delete: false,
            arguments: table_hex(&FieldTable::default()),
            bindings: vec![BindingDef {
                exchange: "amq.topic".into(),
                key: "a.*".into(),
                arguments: table_hex(&FieldTable::default()),
            }],
        }
    }

    #[test]
    fn messages_not_settled_come_back_in_order_and_settled_ones_do_not() {
        let dir = tempdir();
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert!(rec.queues.is_empty());
        let q1 = s.new_queue_id();
        let q2 = s.new_queue_id();
        s.put_queue("one", def(q1)).unwrap();
        s.put_queue("two", def(q2)).unwrap();
        let mut offsets = Vec::new();
        for i in 0..10 {
            offsets.push(s.append(q1, &qmsg("a/b", &format!("m{i}"), true)).unwrap());
        }
        let o2 = s.append(q2, &qmsg("a/c", "other", true)).unwrap();
        s.settle(offsets[0]);
        s.settle(offsets[4]);
        s.settle(o2);
        s.flush();
        s.settle(offsets[9]); // not flushed: comes back (at least once)
        std::mem::forget(s); // as if killed: no last flush
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let one = &rec.queues.iter().find(|q| q.0 == "one").unwrap().2;
        let bodies: Vec<_> = one.iter().map(|m| m.msg.payload.clone()).collect();
        let want: Vec<Bytes> = [1, 2, 3, 5, 6, 7, 8, 9]
            .iter()
            .map(|i| Bytes::from(format!("m{i}")))
            .collect();
        assert_eq!(bodies, want);
        let m = &one[0];
        assert!(m.redelivered);
        assert_eq!(m.priority, 3);
        assert_eq!(m.routing_key.as_str(), Some("a.b"));
        assert_eq!(m.exchange.as_str(), Some("amq.topic"));
        assert_eq!(m.msg.correlation_id.as_deref(), Some(&b"c-1"[..]));
        assert_eq!(m.msg.key.as_str(), "a/b");
        assert!(
            rec.queues
                .iter()
                .find(|q| q.0 == "two")
                .unwrap()
                .2
                .is_empty()
        );
        assert_eq!(s.held(), 8);
        assert_eq!(rec.queues[0].1.bindings, def(q1).bindings);
    }

    #[test]
    fn a_deleted_queue_leaves_nothing_and_a_new_one_of_its_name_starts_empty() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let q1 = s.new_queue_id();
        s.put_queue("q", def(q1)).unwrap();
        s.append(q1, &qmsg("q", "old", true)).unwrap();
        s.remove_queue("q", q1).unwrap();
        let q2 = s.new_queue_id();
        s.put_queue("q", def(q2)).unwrap();
        s.append(q2, &qmsg("q", "new", true)).unwrap();
        drop(s);
        let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(rec.queues.len(), 1);
        let (name, d, msgs) = &rec.queues[0];
        assert_eq!((name.as_str(), d.id), ("q", q2));
        assert_eq!(msgs.len(), 1);
        assert_eq!(&msgs[0].msg.payload[..], b"new");
    }

    #[test]
    fn exchanges_and_bindings_are_kept_and_an_exchange_takes_its_bindings_along() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let x = ExchangeDef {
            kind: "topic".into(),
            auto_delete: false,
            internal: false,
        };
        s.put_exchange("dx", x.clone()).unwrap();
        s.put_exchange("gone", x.clone()).unwrap();
        let id = s.new_queue_id();
        s.put_queue("q", def(id)).unwrap();
        let mut b = def(id).bindings;
        b.push(BindingDef {
            exchange: "gone".into(),
            key: "k".into(),
            arguments: table_hex(&FieldTable::default()),
        });
        s.set_bindings("q", id, b).unwrap();
        let edge = |s: &str, d: &str, k: &str| EdgeDef {
            source: s.into(),
            destination: d.into(),
            key: k.into(),
            arguments: table_hex(&FieldTable::default()),
        };
        s.put_edge(edge("amq.topic", "dx", "a.#")).unwrap();
        s.put_edge(edge("amq.topic", "dx", "b.#")).unwrap();
        s.put_edge(edge("amq.topic", "dx", "a.#")).unwrap(); // the same again: one
        s.put_edge(edge("gone", "dx", "k")).unwrap();
        s.put_edge(edge("dx", "gone", "k")).unwrap();
        s.remove_edge(edge("amq.topic", "dx", "b.#")).unwrap();
        s.remove_exchange("gone").unwrap();
        drop(s);
        let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(rec.exchanges, vec![("dx".to_string(), x)]);
        assert_eq!(rec.queues[0].1.bindings, def(id).bindings);
        assert_eq!(rec.edges, vec![edge("amq.topic", "dx", "a.#")]);
    }

    #[test]
    fn segments_nobody_needs_are_removed_and_acks_shrink() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let id = s.new_queue_id();
        s.put_queue("q", def(id)).unwrap();
        let body = "x".repeat(64 << 10);
        // 48 MiB: three segments of 16 MiB.
        let offsets: Vec<u64> = (0..768)
            .map(|_| s.append(id, &qmsg("q", &body, true)).unwrap())
            .collect();
        for o in &offsets[..767] {
            s.settle(*o);
        }
        s.flush();
        assert!(s.log.start_offset() > 0, "old segments removed");
        drop(s);
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(rec.queues[0].2.len(), 1);
        assert_eq!(rec.queues[0].2[0].stored, Some(767));
        let acks = std::fs::metadata(dir.path().join("acks")).unwrap().len();
        assert!(
            acks / 8 < 767 - s.log.start_offset() + 1,
            "acks rewritten: {acks}"
        );
    }

    /// A store in `dir` (no fsync) with one durable queue, `q`: the store and its number.
    fn store_with_queue(dir: &TmpDir) -> (Arc<Store>, u64) {
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let q = s.new_queue_id();
        s.put_queue("q", def(q)).unwrap();
        (s, q)
    }

    /// A store in `dir` (no fsync) whose log is on `disk` (faults, crashes).
    fn open_faulty(dir: &TmpDir, disk: &Arc<hayate_log::FaultyStorage>) -> (Arc<Store>, Recovered) {
        Store::open_with(
            dir.path(),
            Some(disk.clone() as Arc<dyn hayate_log::Storage>),
            FsyncPolicy::Never,
            1 << 20,
        )
        .unwrap()
    }

    fn bodies(rec: &Recovered, queue: &str) -> Vec<String> {
        rec.queues
            .iter()
            .find(|q| q.0 == queue)
            .map(|q| {
                q.2.iter()
                    .map(|m| {
                        String::from_utf8_lossy(&m.msg.payload[..8.min(m.msg.payload.len())])
                            .into_owned()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_message_held_long_does_not_keep_the_log_from_shrinking() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let (q, other) = (s.new_queue_id(), s.new_queue_id());
        s.put_queue("held", def(q)).unwrap();
        s.put_queue("busy", def(other)).unwrap();
        let pad = "x".repeat(64 << 10);
        // Three messages a consumer keeps unacknowledged, stored between 200 MiB of others
        // that are acknowledged as they go.
        s.append(q, &qmsg("q", &format!("aaaaaaaa{pad}"), true))
            .unwrap();
        let mut most = 0;
        let mut moved_b = None;
        for i in 0..3200 {
            let o = s.append(other, &qmsg("o", &pad, true)).unwrap();
            s.settle(o);
            if i == 1000 {
                moved_b = Some(
                    s.append(q, &qmsg("q", &format!("bbbbbbbb{pad}"), true))
                        .unwrap(),
                );
            }
            if i == 2000 {
                s.append(q, &qmsg("q", &format!("cccccccc{pad}"), true))
                    .unwrap();
            }
            if i % 64 == 0 {
                s.flush();
                let bytes = s.log.stats().bytes;
                most = most.max(bytes);
                let held = lock(&s.st).live_bytes;
                assert!(
                    bytes <= 2 * held + COMPACT_SLACK + (16 << 20) + (4 << 20),
                    "log {bytes} B for {held} B held"
                );
            }
        }
        assert!(most < 64 << 20, "the log peaked at {most} B");
        // `a` and `b` were moved (their first segments are gone): their ids still settle.
        assert!(s.log.start_offset() > moved_b.unwrap());
        s.settle(moved_b.unwrap());
        s.flush();
        std::mem::forget(s); // as if killed
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(bodies(&rec, "held"), ["aaaaaaaa", "cccccccc"]);
        assert!(bodies(&rec, "busy").is_empty());
        assert_eq!(s.held(), 2);
    }

    #[test]
    fn a_move_cut_short_by_a_crash_leaves_one_copy_in_its_place() {
        let dir = tempdir();
        let (s, q) = store_with_queue(&dir);
        let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
        s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
        // Moved once for good (the original settled) and then half moved again (the copy
        // written, the crash before the first copy was settled).
        let (c1, _) = s.copy_to_end(a).unwrap();
        s.settle(a);
        s.flush();
        s.copy_to_end(c1).unwrap();
        s.log.sync().unwrap();
        std::mem::forget(s);
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        // Once, and before `b`, which was stored after it.
        assert_eq!(bodies(&rec, "q"), ["aaaaaaaa", "bbbbbbbb"]);
        assert_eq!(s.held(), 2);
    }

    #[test]
    fn return_counts_survive_a_crash_and_go_with_their_message() {
        let dir = tempdir();
        let (s, q) = store_with_queue(&dir);
        let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
        let b = s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
        let c = s.append(q, &qmsg("q", "cccccccc", true)).unwrap();
        s.note_return(a, 1);
        s.note_return(a, 2);
        s.note_return(b, 1);
        s.settle(b); // settled: its count goes with it
        // Moved (as a compaction does), then given back: the count follows its id.
        let (moved, bytes) = s.copy_to_end(c).unwrap();
        lock(&s.st).moved_to(c, moved, bytes);
        s.note_return(c, 5);
        s.flush();
        std::mem::forget(s);
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let msgs = &rec.queues[0].2;
        let got: Vec<_> = msgs.iter().map(|m| (m.stored, m.returns)).collect();
        assert_eq!(got, [(Some(a), 2), (Some(c), 5)]);
        // Ids stay what they were: settling `c` by its id after the restart works.
        s.settle(c);
        s.flush();
        drop(s);
        let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(bodies(&rec, "q"), ["aaaaaaaa"]);
        assert_eq!(
            std::fs::metadata(dir.path().join("returns")).unwrap().len(),
            12
        );
    }

    #[test]
    fn a_message_returned_without_end_keeps_the_returns_file_small() {
        // A consumer that nacks with requeue in a tight loop (no delivery limit).
        let dir = tempdir();
        let (s, q) = store_with_queue(&dir);
        let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
        let path = dir.path().join("returns");
        let mut most = 0;
        for n in 1..=300_000u32 {
            s.note_return(a, n);
            if n % 1000 == 0 {
                s.flush();
                most = most.max(std::fs::metadata(&path).unwrap().len());
            }
        }
        assert!(
            most <= (REWRITE_BYTES + 12 * 1000),
            "returns grew to {most} B"
        );
        std::mem::forget(s);
        let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        assert_eq!(rec.queues[0].2[0].returns, 300_000);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 12);
    }

    #[test]
    fn a_move_that_fails_leaves_no_copy_to_come_back() {
        let dir = tempdir();
        let disk = Arc::new(hayate_log::FaultyStorage::new());
        let (s, _) = open_faulty(&dir, &disk);
        let q = s.new_queue_id();
        s.put_queue("q", def(q)).unwrap();
        let a = s.append(q, &qmsg("q", "aaaaaaaa", true)).unwrap();
        s.append(q, &qmsg("q", "bbbbbbbb", true)).unwrap();
        let pad = "x".repeat(64 << 10);
        for _ in 0..800 {
            let o = s.append(q, &qmsg("o", &pad, true)).unwrap();
            s.settle(o);
        }
        // The disk fills while the two are moved: `a`'s copy is written, `b`'s is not.
        disk.fail_writes_after(200);
        s.flush();
        disk.clear_write_faults();
        assert!(s.log.start_offset() <= a, "nothing moved for good");
        // `a` is acknowledged: neither it nor the copy the failed move wrote comes back.
        s.settle(a);
        s.flush();
        std::mem::forget(s);
        let disk = Arc::new(disk.crash(hayate_log::CrashMode::ProcessKill));
        let (s, rec) = open_faulty(&dir, &disk);
        assert_eq!(bodies(&rec, "q"), ["bbbbbbbb"]);
        assert_eq!(s.held(), 1);
    }

    #[test]
    fn the_largest_record_taken_can_still_be_moved() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 10).unwrap();
        let q = s.new_queue_id();
        let o = s.append(q, &qmsg("q", "x", true)).unwrap();
        let overhead = lock(&s.st).live_bytes as usize - 1;
        s.settle(o);
        let body = "y".repeat(s.max_record - overhead);
        let big = s.append(q, &qmsg("q", &body, true)).unwrap();
        assert!(
            s.copy_to_end(big).is_ok(),
            "a moved head is larger: room is kept for it"
        );
        let over = format!("{body}z");
        assert!(matches!(
            s.append(q, &qmsg("q", &over, true)),
            Err(hayate_log::Error::RecordTooLarge { .. })
        ));
    }

    #[test]
    fn a_power_loss_right_after_a_move_keeps_the_message() {
        // A message durable before it is moved stays durable: the copy is synced before the
        // original is settled. (No fsync policy here, so that only the explicit syncs, the
        // test's and the moves', make anything durable.)
        let dir = tempdir();
        let disk = Arc::new(hayate_log::FaultyStorage::new());
        let (s, _) = open_faulty(&dir, &disk);
        let q = s.new_queue_id();
        s.put_queue("q", def(q)).unwrap();
        // Held (a consumer that does not acknowledge), then 40 MiB acknowledged as they go.
        s.append(q, &qmsg("q", "held-one", true)).unwrap();
        let pad = "x".repeat(64 << 10);
        for _ in 0..640 {
            let o = s.append(q, &qmsg("o", &pad, true)).unwrap();
            s.settle(o);
        }
        s.log.sync().unwrap(); // as confirms under `always` wait for
        s.flush(); // moves `held-one` and removes the segments before it
        assert!(s.log.start_offset() > 0, "moved and removed");
        std::mem::forget(s);
        let disk = Arc::new(disk.crash(hayate_log::CrashMode::PowerLoss));
        let (s, rec) = open_faulty(&dir, &disk);
        assert_eq!(bodies(&rec, "q"), ["held-one"]);
        assert_eq!(s.held(), 1);
    }

    #[test]
    fn a_torn_ack_and_a_garbage_record_are_survived() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let id = s.new_queue_id();
        s.put_queue("q", def(id)).unwrap();
        let a = s.append(id, &qmsg("q", "a", true)).unwrap();
        // A record of another format: skipped with a warning.
        s.log
            .append(&Entry {
                timestamp: 0,
                key: b"q",
                headers: &[9, 9, 9],
                value: b"junk",
            })
            .unwrap();
        let b = s.append(id, &qmsg("q", "b", true)).unwrap();
        s.settle(a);
        s.flush();
        drop(s);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("acks"))
            .unwrap();
        f.write_all(&[0, 0, 0]).unwrap(); // torn
        drop(f);
        let (_, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let msgs = &rec.queues[0].2;
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].stored, Some(b));
    }

    #[test]
    fn definitions_are_a_journal_folded_into_a_snapshot() {
        let dir = tempdir();
        let (s, _) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        // Many changes: each is a line, and the log is folded as it grows, so the bytes
        // written stay proportional to the changes, not to changes x definitions.
        let mut kept = Vec::new();
        for i in 0..3000 {
            let id = s.new_queue_id();
            let name = format!("q{i}");
            s.put_queue(&name, def(id)).unwrap();
            if i % 3 == 0 {
                kept.push((name, id));
            } else {
                s.remove_queue(&name, id).unwrap();
            }
            if i % 500 == 0 {
                s.flush();
            }
        }
        s.flush();
        let log = std::fs::metadata(dir.path().join("definitions.log"))
            .unwrap()
            .len();
        let snap = std::fs::metadata(dir.path().join("definitions.json"))
            .unwrap()
            .len();
        assert!(
            log < 2 * JOURNAL_FOLD_BYTES.max(snap),
            "log {log}, snapshot {snap}"
        );
        std::mem::forget(s);
        // A line torn by a crash at the end is left out; the rest is read.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("definitions.log"))
            .unwrap();
        f.write_all(b"{\"op\":\"remove_queue\",\"na").unwrap();
        drop(f);
        let (s, rec) = Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).unwrap();
        let names: Vec<&str> = rec.queues.iter().map(|q| q.0.as_str()).collect();
        assert_eq!(names.len(), kept.len());
        for (n, id) in &kept {
            assert!(rec.queues.iter().any(|q| &q.0 == n && q.1.id == *id), "{n}");
        }
        // Numbers go on from the highest given.
        assert!(s.new_queue_id() > kept.last().unwrap().1);
        drop(s);
        // Garbage before the last line is an error, not a silent loss.
        std::fs::write(
            dir.path().join("definitions.log"),
            b"garbage\n{\"op\":\"remove_exchange\",\"name\":\"x\"}\n",
        )
        .unwrap();
        assert!(Store::open(dir.path(), FsyncPolicy::Never, 1 << 20).is_err());
    }

    #[test]
    fn a_full_disk_and_a_failed_fsync_reach_the_publisher() {
        let dir = tempdir();
        let disk = Arc::new(hayate_log::FaultyStorage::new());
        let (s, _) = Store::open_with(
            dir.path(),
            Some(disk.clone() as Arc<dyn hayate_log::Storage>),
            FsyncPolicy::Always,
            1 << 20,
        )
        .unwrap();
        let id = s.new_queue_id();
        s.put_queue("q", def(id)).unwrap();
        // A failed fsync: the append is written, but its confirm resolves with the error
        // (the publisher gets basic.nack), and the log refuses later appends.
        disk.fail_syncs(1);
        let o = s.append(id, &qmsg("q", "a", true)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let waited = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), s.confirmed(o).unwrap()).await
        });
        assert!(waited.expect("the confirm resolves").is_err());
        assert!(s.append(id, &qmsg("q", "b", true)).is_err());
        assert_eq!(s.held(), 1, "a refused append is not held");
        // A full disk on a fresh store: the append fails, nothing is held.
        let dir2 = tempdir();
        let disk2 = Arc::new(hayate_log::FaultyStorage::new());
        let (s2, _) = Store::open_with(
            dir2.path(),
            Some(disk2.clone() as Arc<dyn hayate_log::Storage>),
            FsyncPolicy::Never,
            1 << 20,
        )
        .unwrap();
        let id2 = s2.new_queue_id();
        disk2.fail_writes_after(0);
        assert!(s2.append(id2, &qmsg("q", "c", true)).is_err());
        assert_eq!(s2.held(), 0);
        disk2.clear_write_faults();
    }

    #[test]
    fn hex_tables_round_trip_and_vhost_dirs_are_file_names() {
        let mut t = FieldTable::default();
        t.insert("x-max-length", hayate_amqp::FieldValue::I32(5));
        assert_eq!(table_of_hex(&table_hex(&t)).unwrap(), t);
        assert!(table_of_hex("zz").is_err());
        assert!(table_of_hex("000000").is_err());
        assert_eq!(vhost_dir("/"), "default");
        assert_eq!(vhost_dir("a/b c%"), "vhost-a%2Fb%20c%25");
        assert_ne!(vhost_dir("default"), vhost_dir("/"));
    }
}
