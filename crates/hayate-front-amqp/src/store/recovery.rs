//! Opening a store: the definitions, then every record of the log not settled back into
//! its queue ([`Recovered`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use hayate_core::sync::lock;
use hayate_log::{FsyncPolicy, Log, LogConfig, ReadLimit};

use super::defs::{EdgeDef, ExchangeDef, QueueDef, read_defs};
use super::entries::{Entries, acks_bytes, read_entries, returns_bytes};
use super::log::{MOVED_EXTRA, decode_record, record_bytes};
use super::{Files, Held, State, Store};
use hayate_broker::queue::QItem;

/// What opening a store found: the durable exchanges, and each durable queue with the
/// messages it held.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub(crate) exchanges: Vec<(String, ExchangeDef)>,
    pub(crate) edges: Vec<EdgeDef>,
    pub(crate) queues: Vec<(String, QueueDef, Vec<QItem>)>,
}

/// Each queue's messages read back, by queue number: (message id, message).
type QueueMsgs = HashMap<u64, Vec<(u64, QItem)>>;

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
    #[cfg(test)]
    pub(crate) fn open(
        dir: &Path,
        fsync: FsyncPolicy,
        max_message: usize,
    ) -> Result<(Arc<Store>, Recovered), String> {
        Store::open_with(dir, None, fsync, max_message)
    }

    /// [`Store::open`] with the log in `storage` instead of `dir/log` (the broker's storage
    /// root gives it; tests inject faults).
    pub(crate) fn open_with(
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
}
