//! The definitions a store keeps (durable exchanges, durable queues and their bindings,
//! exchange-to-exchange bindings): `definitions.json`, the snapshot, and
//! `definitions.log`, the journal of changes since.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use bytes::BytesMut;
use hayate_amqp::FieldTable;
use hayate_core::sync::lock;
use hayate_log::storage::write_atomically;
use serde::{Deserialize, Serialize};

use super::{Files, Store};

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
pub(super) struct Defs {
    /// The number the next durable queue gets.
    pub(super) next_id: u64,
    pub(super) exchanges: BTreeMap<String, ExchangeDef>,
    pub(super) queues: BTreeMap<String, QueueDef>,
    /// Exchange-to-exchange bindings (absent from files older than them).
    #[serde(default)]
    pub(super) edges: Vec<EdgeDef>,
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
pub(super) fn read_defs(dir: &Path) -> Result<Defs, String> {
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

/// `definitions.log` is folded into `definitions.json` once it is this large and larger
/// than the snapshot (so a change costs one line, and the files stay within a few times
/// the definitions' size).
pub(super) const JOURNAL_FOLD_BYTES: u64 = 64 << 10;

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

impl Store {
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
    pub(super) fn snapshot(&self, files: &mut Files) -> std::io::Result<()> {
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
}
