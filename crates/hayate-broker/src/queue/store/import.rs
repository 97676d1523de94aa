//! Records of a namespace written from what an older release kept (a front-end's one-time
//! migration): the queues, the front-end's definitions, what was settled and the return
//! counts, with `ns/<ns>/imported` last, in one batch that is synced.

use super::settled;
use crate::meta::Meta;

/// What an older release kept of one namespace.
#[derive(Debug, Default)]
pub struct Import {
    /// The last queue number given.
    pub next_id: u64,
    /// Durable queues: name, number, the front-end's bytes.
    pub queues: Vec<(String, u64, Vec<u8>)>,
    /// The front-end's own definitions: key under `ns/<ns>/`, value.
    pub defs: Vec<(String, Vec<u8>)>,
    /// Offsets of the log not to read back.
    pub settled: Vec<u64>,
    /// Return counts: message id, count.
    pub returns: Vec<(u64, u32)>,
}

/// Were the files of an older release converted into namespace `ns`'s records?
pub fn imported(meta: &Meta, ns: &str) -> bool {
    meta.get(&settled::imported_key(ns)).is_some()
}

/// Writes `imp` as namespace `ns`'s records (the log of its messages, adopted as it is,
/// keeps its offsets: ids and settled offsets stay valid), then `ns/<ns>/imported`; returns
/// once they are durable. Written again whole if a crash cut it (every value is set by key).
pub fn import(meta: &Meta, ns: &str, imp: &Import) -> Result<(), String> {
    let prefix = settled::defs_prefix(ns);
    let mut records: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, id, def) in &imp.queues {
        let mut v = id.to_be_bytes().to_vec();
        v.extend_from_slice(def);
        records.push((settled::queue_key(ns, name), v));
    }
    for (k, v) in &imp.defs {
        records.push((format!("{prefix}{k}"), v.clone()));
    }
    let next = imp
        .queues
        .iter()
        .map(|(_, id, _)| *id)
        .max()
        .unwrap_or(0)
        .max(imp.next_id);
    records.push((settled::next_key(ns), next.to_be_bytes().to_vec()));
    let mut done = Vec::new();
    settled::encode_settled(true, 0, &settled::ranges_of(imp.settled.clone()), &mut done);
    records.push((settled::settled_key(ns), done));
    let mut returns = Vec::new();
    settled::encode_returns(true, &imp.returns, &mut returns);
    records.push((settled::returns_key(ns), returns));
    records.push((settled::imported_key(ns), vec![1]));
    let all: Vec<(&str, &[u8])> = records
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    meta.put_durable(&all).map_err(|e| e.to_string())
}
