//! Opening a store: the definitions from the meta log, then every record of the log not
//! settled back into its queue ([`Recovered`]), then what is settled written again whole.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use hayate_log::{FsyncPolicy, Log, LogConfig, ReadLimit, Root};

use super::log::{MOVED_EXTRA, decode_record, record_bytes};
use super::settled::{self, covered};
use super::{Defs, Flushing, Held, State, Store};
use crate::meta::Meta;
use crate::queue::QItem;

/// A durable queue as opening its store found it.
#[derive(Debug)]
pub struct RecoveredQueue {
    pub name: String,
    /// Its number in the store.
    pub id: u64,
    /// What its front-end kept with it.
    pub def: Bytes,
    /// The messages it held, in the order they were first stored (marked redelivered).
    pub items: Vec<QItem>,
}

/// What opening a store found: the front-end's own definitions (`key` under `ns/<ns>/`,
/// value), and each durable queue with the messages it held.
#[derive(Debug, Default)]
pub struct Recovered {
    pub defs: Vec<(String, Bytes)>,
    pub queues: Vec<RecoveredQueue>,
}

/// Each queue's messages read back, by queue number: (message id, message).
type QueueMsgs = HashMap<u64, Vec<(u64, QItem)>>;

/// Reads every record of `log` from `floor` back: a record not settled whose queue is in
/// `queues` is held (into `st`, under its message's id, with its count from `returned`);
/// the others (settled, of a deleted queue, a second copy of a moved message, unreadable)
/// are not. Each queue's messages as (id, message), in log order.
fn read_back(
    log: &Log,
    dir: &str,
    (floor, done): (u64, &[(u64, u64)]),
    queues: &HashSet<u64>,
    mut returned: HashMap<u64, u32>,
    st: &mut State,
) -> Result<QueueMsgs, String> {
    let mut held = QueueMsgs::new();
    // Ids met: a message moved to the end by a compaction that a crash cut short is there
    // twice (the first copy is kept).
    let mut ids_seen = HashSet::new();
    let mut cursor = 0;
    let mut at = log.start_offset().max(floor);
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
            .map_err(|e| format!("{dir}: {e}"))?;
        if batch.next <= at {
            break;
        }
        for r in &batch.records {
            if covered(done, &mut cursor, r.offset) {
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
                Ok(_) => {}
                Err(e) => tracing::warn!(dir, "queue store: {e}: skipped"),
            }
        }
        at = batch.next;
    }
    Ok(held)
}

/// The definitions of namespace `ns` in the meta log: the front-end's, the queues (name,
/// number, bytes), the last number given.
type Definitions = (Vec<(String, Bytes)>, Vec<(String, u64, Bytes)>, u64);

fn definitions(meta: &Meta, ns: &str) -> Definitions {
    let prefix = settled::defs_prefix(ns);
    let (mut defs, mut queues) = (Vec::new(), Vec::new());
    let mut next = meta
        .get(&settled::next_key(ns))
        .and_then(|v| Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?)))
        .unwrap_or(0);
    for (key, value) in meta.scan(&prefix) {
        let rest = &key[prefix.len()..];
        if let Some(name) = rest.strip_prefix("queue/") {
            let Some(id) = value.get(..8).and_then(|b| b.try_into().ok()) else {
                tracing::warn!(key, "queue store: queue record cut short: left out");
                continue;
            };
            let id = u64::from_be_bytes(id);
            next = next.max(id);
            queues.push((settled::name_of_part(name), id, value.slice(8..)));
        } else if rest != "imported" {
            defs.push((rest.to_owned(), value));
        }
    }
    (defs, queues, next)
}

impl Store {
    /// Opens (or creates) the store of namespace `ns` in `root` (its definitions and
    /// positions in `meta`) and reads back what it kept. Records of queues that no longer
    /// exist count as settled. Returns once what is settled is durable.
    pub fn open(
        root: &dyn Root,
        meta: Arc<Meta>,
        ns: &str,
        fsync: FsyncPolicy,
        max_message: usize,
    ) -> Result<(Arc<Store>, Recovered), String> {
        let dir = super::dir_of(ns);
        let max_record = max_message.saturating_add(256 << 10).min(1 << 30);
        let config = LogConfig {
            segment_bytes: 16 << 20,
            max_record_bytes: max_record + MOVED_EXTRA,
            fsync,
            ..LogConfig::default()
        };
        let log = Log::open_in(root, &dir, config).map_err(|e| format!("{dir}: {e}"))?;
        for r in &log.recovery().repairs {
            tracing::warn!(dir, "queue store recovery: {r}");
        }
        let bad = |what: &str, e: String| format!("meta log {what}/{ns}: {e}");
        let done = match meta.get(&settled::settled_key(ns)) {
            Some(v) => settled::decode_settled(&v).map_err(|e| bad("store", e))?,
            None => (0, Vec::new()),
        };
        let returned = match meta.get(&settled::returns_key(ns)) {
            Some(v) => settled::decode_returns(&v).map_err(|e| bad("returns", e))?,
            None => HashMap::new(),
        };
        let (defs, queues, next_id) = definitions(&meta, ns);
        let ids: HashSet<u64> = queues.iter().map(|(_, id, _)| *id).collect();
        let mut st = State::default();
        let mut held = read_back(&log, &dir, (done.0, &done.1), &ids, returned, &mut st)?;
        // What is settled, whole again: below the log's end, so that offsets a power loss
        // took back are not read as settled once new records take them.
        let full = st.full_settled(log.end_offset(), &[]);
        let returns = st.full_returns();
        let (sk, rk) = (settled::settled_key(ns), settled::returns_key(ns));
        meta.put_durable(&[(&sk, &full), (&rk, &returns)])
            .map_err(|e| bad("store", e.to_string()))?;
        let rec = Recovered {
            defs,
            queues: queues
                .iter()
                .map(|(name, id, def)| {
                    // In the order they were first stored (moved ones are further on).
                    let mut msgs = held.remove(id).unwrap_or_default();
                    msgs.sort_by_key(|(id, _)| *id);
                    RecoveredQueue {
                        name: name.clone(),
                        id: *id,
                        def: def.clone(),
                        items: msgs.into_iter().map(|(_, m)| m).collect(),
                    }
                })
                .collect(),
        };
        let floor = st.floor(log.end_offset());
        let store = Arc::new(Store {
            ns: ns.to_owned(),
            dir,
            log,
            meta,
            max_record,
            st: Mutex::new(st),
            defs: Mutex::new(Defs {
                queues: queues.into_iter().map(|(n, id, _)| (n, id)).collect(),
                next_id,
                next_written: next_id,
            }),
            flushing: Mutex::new(Flushing {
                settled_full: full.len(),
                returns_full: returns.len(),
                floor_written: floor,
                ..Flushing::default()
            }),
        });
        store.flush();
        Ok((store, rec))
    }
}
