//! The one-time migration of a virtual host's durable state as releases before the queue
//! store kept it, in `<data>/amqp/<vhost dir>/`: `definitions.json` (+ the changes since in
//! `definitions.log`, JSON lines), `log/` (the persistent messages' log), `acks` (settled
//! offsets, 8 bytes each) and `returns` (message id, 8 bytes, and count, 4; the last of an
//! id counts).
//!
//! The log is adopted as it is (renamed to the store's directory, `queues/<ns dir>/`: its
//! records' format is the store's, offsets and so message ids stay what they were); the
//! definitions, the settled offsets and the counts become the namespace's meta records,
//! written in one synced batch that ends with `ns/<ns>/imported`. Only then is the log
//! renamed and the other files moved to `<data>/legacy-1/amqp/<vhost dir>/` (kept; the
//! broker no longer reads them). A start that finds the files and no `imported` record
//! converts again (a cut batch is written again whole); one that finds `imported`
//! finishes the moves.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use hayate_broker::meta::Meta;
use hayate_broker::queue::store::{self, Import};
use serde::Deserialize;

use crate::defs::{BindingDef, EdgeDef, ExchangeDef, QueueDef, table_of_bytes};

/// The files of a vhost directory, besides `log/`.
const FILES: [&str; 7] = [
    "definitions.json",
    "definitions.log",
    "acks",
    "returns",
    "definitions.json.tmp",
    "acks.tmp",
    "returns.tmp",
];

/// The directory name releases before the queue store gave virtual host `name`.
pub(crate) fn vhost_dir(name: &str) -> String {
    if name == "/" {
        return "default".into();
    }
    store::file_name("vhost-", name)
}

#[derive(Debug, Clone, Deserialize)]
struct OldExchange {
    kind: String,
    auto_delete: bool,
    internal: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct OldBinding {
    exchange: String,
    key: String,
    arguments: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
struct OldEdge {
    source: String,
    destination: String,
    key: String,
    arguments: String,
}

#[derive(Debug, Clone, Deserialize)]
struct OldQueue {
    id: u64,
    auto_delete: bool,
    arguments: String,
    bindings: Vec<OldBinding>,
}

/// `definitions.json`.
#[derive(Debug, Default, Deserialize)]
struct Defs {
    next_id: u64,
    exchanges: BTreeMap<String, OldExchange>,
    queues: BTreeMap<String, OldQueue>,
    #[serde(default)]
    edges: Vec<OldEdge>,
}

/// A line of `definitions.log`.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Change {
    PutQueue {
        name: String,
        def: OldQueue,
    },
    RemoveQueue {
        name: String,
        id: u64,
    },
    SetBindings {
        name: String,
        id: u64,
        bindings: Vec<OldBinding>,
    },
    PutExchange {
        name: String,
        def: OldExchange,
    },
    RemoveExchange {
        name: String,
    },
    PutEdge {
        def: OldEdge,
    },
    RemoveEdge {
        def: OldEdge,
    },
}

impl Defs {
    fn apply(&mut self, c: Change) {
        match c {
            Change::PutQueue { name, def } => {
                self.next_id = self.next_id.max(def.id);
                self.queues.insert(name, def);
            }
            Change::RemoveQueue { name, id } => {
                if self.queues.get(&name).is_some_and(|q| q.id == id) {
                    self.queues.remove(&name);
                }
            }
            Change::SetBindings { name, id, bindings } => {
                if let Some(q) = self.queues.get_mut(&name).filter(|q| q.id == id) {
                    q.bindings = bindings;
                }
            }
            Change::PutExchange { name, def } => {
                self.exchanges.insert(name, def);
            }
            Change::PutEdge { def } if !self.edges.contains(&def) => self.edges.push(def),
            Change::PutEdge { .. } => {}
            Change::RemoveEdge { def } => self.edges.retain(|e| *e != def),
            Change::RemoveExchange { name } => {
                self.exchanges.remove(&name);
                self.edges
                    .retain(|e| e.source != name && e.destination != name);
                for q in self.queues.values_mut() {
                    q.bindings.retain(|b| b.exchange != name);
                }
            }
        }
    }
}

fn read_opt(p: &Path) -> Result<Vec<u8>, String> {
    match std::fs::read(p) {
        Ok(raw) => Ok(raw),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

/// `definitions.json`, then the changes of `definitions.log` over it (a last line cut
/// short by a crash is left out: its change was not acknowledged).
fn read_defs(dir: &Path) -> Result<Defs, String> {
    let raw = read_opt(&dir.join("definitions.json"))?;
    let mut defs: Defs = if raw.is_empty() {
        Defs::default()
    } else {
        serde_json::from_slice(&raw)
            .map_err(|e| format!("{}/definitions.json: {e}", dir.display()))?
    };
    let raw = read_opt(&dir.join("definitions.log"))?;
    let mut lines = raw.split(|b| *b == b'\n').peekable();
    let mut n = 0;
    while let Some(line) = lines.next() {
        n += 1;
        let last = lines.peek().is_none_or(|l| l.is_empty());
        match serde_json::from_slice::<Change>(line) {
            _ if line.is_empty() => {}
            Ok(c) => defs.apply(c),
            Err(_) if last => {
                tracing::warn!(dir = %dir.display(), "amqp: definitions.log ends in a torn line: left out")
            }
            Err(e) => return Err(format!("{}/definitions.log line {n}: {e}", dir.display())),
        }
    }
    Ok(defs)
}

fn table_of_hex(s: &str) -> Result<hayate_amqp::FieldTable, String> {
    let raw: Result<Vec<u8>, _> = (0..s.len() / 2 * 2)
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
        .collect();
    if !s.len().is_multiple_of(2) {
        return Err("odd hex length".into());
    }
    table_of_bytes(&raw.map_err(|e| e.to_string())?)
}

/// Entries of `N` bytes (a torn last one is ignored).
fn entries<const N: usize>(p: &Path) -> Result<Vec<[u8; N]>, String> {
    Ok(read_opt(p)?
        .chunks_exact(N)
        .map(|c| c.try_into().unwrap_or([0; N]))
        .collect())
}

/// What the files of `dir` hold, as the namespace's records.
fn read(dir: &Path) -> Result<Import, String> {
    let defs = read_defs(dir)?;
    let mut imp = Import {
        next_id: defs.next_id,
        ..Import::default()
    };
    for (name, x) in defs.exchanges {
        let d = ExchangeDef {
            kind: x.kind,
            auto_delete: x.auto_delete,
            internal: x.internal,
        };
        imp.defs
            .push((crate::defs::exchange_key(&name), d.encode()));
    }
    for e in defs.edges {
        let Ok(args) = table_of_hex(&e.arguments) else {
            tracing::warn!(dir = %dir.display(), "amqp: exchange binding {:?} -> {:?}: bad arguments, left out", e.source, e.destination);
            continue;
        };
        let d = EdgeDef {
            source: e.source,
            destination: e.destination,
            key: e.key,
            args,
        };
        imp.defs.push((d.key(), d.encode()));
    }
    for (name, q) in defs.queues {
        let Ok(args) = table_of_hex(&q.arguments) else {
            tracing::warn!(dir = %dir.display(), "amqp: queue {name:?}: bad arguments, left out");
            continue;
        };
        let bindings = q
            .bindings
            .into_iter()
            .filter_map(|b| {
                Some(BindingDef {
                    args: table_of_hex(&b.arguments).ok()?,
                    exchange: b.exchange,
                    key: b.key,
                })
            })
            .collect();
        let d = QueueDef {
            auto_delete: q.auto_delete,
            args,
            bindings,
        };
        imp.queues.push((name, q.id, d.encode()));
    }
    imp.settled = entries::<8>(&dir.join("acks"))?
        .into_iter()
        .map(u64::from_be_bytes)
        .collect();
    let mut returns = HashMap::new();
    for e in entries::<12>(&dir.join("returns"))? {
        let (id, n) = e.split_at(8);
        returns.insert(
            u64::from_be_bytes(id.try_into().unwrap_or([0; 8])),
            u32::from_be_bytes(n.try_into().unwrap_or([0; 4])),
        );
    }
    imp.returns = returns.into_iter().collect();
    Ok(imp)
}

fn sync_dir(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// Converts virtual host `vhost`'s files of an older release under `data` (if any) into
/// namespace `ns`'s records in `meta`, adopts its log and moves the rest away (see the
/// module's documentation). Runs before the namespace's store opens.
pub(crate) fn migrate(data: &Path, meta: &Meta, vhost: &str, ns: &str) -> Result<(), String> {
    let vd = vhost_dir(vhost);
    let dir = data.join("amqp").join(&vd);
    let log = dir.join("log");
    let files: Vec<&str> = FILES
        .into_iter()
        .filter(|f| dir.join(f).is_file())
        .collect();
    if files.is_empty() && !log.is_dir() {
        return Ok(());
    }
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    if !store::imported(meta, ns) {
        let imp = read(&dir)?;
        tracing::info!(vhost, queues = imp.queues.len(), dir = %dir.display(), "amqp: converting the durable queues of an earlier release");
        store::import(meta, ns, &imp)?;
    }
    if log.is_dir() {
        let target = data.join(store::dir_of(ns));
        if target.exists() {
            return Err(format!(
                "{} and {} both hold vhost {vhost:?}'s messages",
                log.display(),
                target.display()
            ));
        }
        let parent = target.parent().unwrap_or(data);
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        std::fs::rename(&log, &target).map_err(|e| io(&log, e))?;
        sync_dir(parent)
            .and_then(|()| sync_dir(&dir))
            .and_then(|()| sync_dir(data))
            .map_err(|e| io(parent, e))?;
    }
    let legacy = data.join("legacy-1").join("amqp").join(&vd);
    std::fs::create_dir_all(&legacy).map_err(|e| io(&legacy, e))?;
    for f in &files {
        std::fs::rename(dir.join(f), legacy.join(f)).map_err(|e| io(&dir.join(f), e))?;
    }
    sync_dir(&legacy)
        .and_then(|()| sync_dir(&dir))
        .map_err(|e| io(&legacy, e))?;
    if std::fs::remove_dir(&dir).is_ok() {
        let _ = std::fs::remove_dir(data.join("amqp"));
        let _ = sync_dir(data);
    }
    tracing::info!(vhost, dir = %legacy.display(), "amqp: files of the earlier format moved (kept; the broker no longer reads them)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use hayate_broker::queue::store::{Recovered, Store};
    use hayate_log::{FsRoot, FsyncPolicy};

    use super::*;

    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                copy(&p, &to.join(e.file_name()));
            } else {
                std::fs::copy(&p, to.join(e.file_name())).unwrap();
            }
        }
    }

    /// `<fixture>/amqp` copied into a new data directory.
    fn data_of(fixture: &str, n: u32) -> PathBuf {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../hayate/tests/fixtures")
            .join(fixture)
            .join("amqp");
        let d = std::env::temp_dir().join(format!("hayate-amqp-legacy-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        copy(&src, &d.join("amqp"));
        d
    }

    fn open(data: &Path) -> (Arc<Meta>, Arc<Store>, Recovered) {
        let root = FsRoot(data.to_path_buf());
        let meta = Arc::new(Meta::open(&root).unwrap());
        migrate(data, &meta, "/", "").unwrap();
        let (s, rec) = Store::open(&root, meta.clone(), "", FsyncPolicy::Never, 1 << 20).unwrap();
        (meta, s, rec)
    }

    fn bodies(rec: &Recovered) -> Vec<(String, Vec<String>)> {
        rec.queues
            .iter()
            .map(|q| {
                let b = q
                    .items
                    .iter()
                    .map(|m| String::from_utf8_lossy(&m.msg.payload).into_owned());
                (q.name.clone(), b.collect())
            })
            .collect()
    }

    #[test]
    fn the_release_fixtures_convert_once_and_keep_every_queue_message_and_binding() {
        for (n, fixture) in ["data-844fe42", "data-844fe42-kill"]
            .into_iter()
            .enumerate()
        {
            let data = data_of(fixture, n as u32);
            let (meta, s, rec) = open(&data);
            let want = [
                ("fx.dead", vec!["o3"]),
                ("fx.idle", vec!["i1", "i2", "i3"]),
                ("fx.orders", vec!["o4", "o5"]),
                ("fx.prio", vec!["t-low", "t-mid", "t-none"]),
            ];
            let want: Vec<(String, Vec<String>)> = want
                .iter()
                .map(|(q, b)| (q.to_string(), b.iter().map(|x| x.to_string()).collect()))
                .collect();
            assert_eq!(bodies(&rec), want, "{fixture}");
            assert!(
                rec.queues
                    .iter()
                    .all(|q| q.items.iter().all(|m| m.redelivered))
            );
            let prio: Vec<u8> = rec.queues[3].items.iter().map(|m| m.priority).collect();
            assert_eq!(prio, [1, 3, 0], "{fixture}");
            let idle = QueueDef::decode(&rec.queues[1].def).unwrap();
            let mut b: Vec<_> = idle
                .bindings
                .iter()
                .map(|b| (b.exchange.as_str(), b.key.as_str()))
                .collect();
            b.sort();
            assert_eq!(
                b,
                [("fx.direct", "idle"), ("fx.topic", "idle.*")],
                "{fixture}"
            );
            let xs: Vec<String> = rec
                .defs
                .iter()
                .filter_map(|(k, _)| crate::defs::exchange_of_key(k))
                .collect();
            assert_eq!(xs, ["fx.direct", "fx.topic"], "{fixture}");
            // The old files moved away, the log adopted.
            assert!(!data.join("amqp").exists(), "{fixture}");
            assert!(
                data.join("legacy-1/amqp/default/definitions.json")
                    .is_file()
            );
            assert!(data.join("legacy-1/amqp/default/acks").is_file());
            assert!(data.join(store::dir_of("")).is_dir());
            // Settling after the conversion sticks; a second start converts nothing.
            let o4 = rec.queues[2].items[0].stored.unwrap();
            s.settle(o4);
            drop((s, meta));
            let (_, _, rec) = open(&data);
            assert_eq!(bodies(&rec)[2].1, ["o5"], "{fixture}");
            let _ = std::fs::remove_dir_all(&data);
        }
    }

    #[test]
    fn vhost_dirs_are_those_of_the_earlier_release() {
        assert_eq!(vhost_dir("/"), "default");
        assert_eq!(vhost_dir("a/b c%"), "vhost-a%2Fb%20c%25");
        assert_ne!(vhost_dir("default"), vhost_dir("/"));
        let long = "v".repeat(300);
        let h = hayate_front::stable_hash(&long);
        assert!(vhost_dir(&long).ends_with(&format!("-{h:016x}")));
    }

    #[test]
    fn a_conversion_cut_short_is_done_again_or_finished() {
        // Cut before `imported` was written: the records written are written again.
        let data = data_of("data-844fe42", 10);
        {
            let meta = Meta::open(&FsRoot(data.clone())).unwrap();
            let mut imp = read(&data.join("amqp/default")).unwrap();
            imp.queues.truncate(1);
            let key = hayate_broker::queue::store::settled::queue_key("", &imp.queues[0].0);
            let mut v = imp.queues[0].1.to_be_bytes().to_vec();
            v.extend_from_slice(&imp.queues[0].2);
            meta.put_durable(&[(&key, &v)]).unwrap();
        }
        let (_, _, rec) = open(&data);
        assert_eq!(rec.queues.len(), 4);
        let _ = std::fs::remove_dir_all(&data);
        // Cut after `imported`, before the files moved: the moves are finished.
        let data = data_of("data-844fe42", 11);
        {
            let meta = Meta::open(&FsRoot(data.clone())).unwrap();
            store::import(&meta, "", &read(&data.join("amqp/default")).unwrap()).unwrap();
            // What was settled since then would be undone by a second conversion.
            meta.put_durable(&[(
                &hayate_broker::queue::store::settled::queue_key("", "fx.idle"),
                &[][..],
            )])
            .unwrap();
        }
        let (_, _, rec) = open(&data);
        assert_eq!(rec.queues.len(), 3, "not converted twice");
        assert!(!data.join("amqp").exists());
        let _ = std::fs::remove_dir_all(&data);
    }
}
