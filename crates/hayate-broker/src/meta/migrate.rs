//! The one-time migration of a data directory written before the meta log (format 1):
//! `streams/<n>/stream.json` and `streams/<n>/consumers/<c>.json` become records of the
//! meta log (`stream/<n>`, `consumer/<n>/<c>`, `pos/<n>/<c>`); the stream's segments stay
//! where they are.
//!
//! Crash-safe: the `format` record is appended last and synced; a meta log found without it
//! is an interrupted migration and is emptied and written again. The JSON files are moved to
//! `<data>/legacy-1/streams/<n>/` only once `format` is durable (and the move is finished by
//! the next start if a crash cut it); the broker never deletes them.

use std::path::Path;

use serde::Deserialize;

use super::Meta;
use super::record::{self, Position};
use crate::stream::consumer::ConsumerConfig;
use crate::stream::{StreamConfig, StreamError};

/// Where the files of format 1 go once migrated.
pub(crate) const LEGACY_DIR: &str = "legacy-1";

/// A consumer's state file of format 1.
#[derive(Deserialize)]
struct Saved {
    config: ConsumerConfig,
    floor: u64,
    next: u64,
    done: Vec<(u64, u64)>,
    deliveries: Vec<(u64, u32)>,
}

fn invalid(m: String) -> StreamError {
    StreamError::Invalid(m)
}

/// Brings the meta log to the current format: a data directory of format 1 is migrated, a
/// new one gets its `format` record.
pub(crate) fn run(meta: &Meta, data: Option<&Path>) -> Result<(), StreamError> {
    let log_err = |source| StreamError::Log {
        name: super::DIR.to_owned(),
        source,
    };
    if meta.get(record::FORMAT_KEY).is_none() {
        if !meta.scan("").is_empty() {
            tracing::warn!(
                "meta log without a format record: a migration was cut short; doing it again"
            );
            meta.reset().map_err(log_err)?;
        }
        let mut records: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(d) = data {
            read_streams(d, &mut records)?;
        }
        if !records.is_empty() {
            tracing::info!(
                records = records.len(),
                "migrating stream and consumer files into the meta log"
            );
        }
        let format = record::FORMAT.to_be_bytes();
        let mut all: Vec<(&str, &[u8])> = records
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        all.push((record::FORMAT_KEY, &format));
        meta.put_durable(&all).map_err(log_err)?;
    }
    if let Some(d) = data {
        move_legacy(d).map_err(|source| StreamError::Io {
            name: LEGACY_DIR.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// The stream directories of format 1 under `data` (those with a `stream.json`), sorted.
fn legacy_streams(data: &Path) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(data.join("streams")) else {
        return Vec::new();
    };
    let mut dirs: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("stream.json").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn read_streams(data: &Path, out: &mut Vec<(String, Vec<u8>)>) -> Result<(), StreamError> {
    for dir in legacy_streams(data) {
        let file = dir.join("stream.json");
        let text = std::fs::read(&file).map_err(|source| StreamError::Io {
            name: file.display().to_string(),
            source,
        })?;
        let config: StreamConfig = serde_json::from_slice(&text)
            .map_err(|e| invalid(format!("{}: {e}", file.display())))?;
        if dir.file_name().and_then(|n| n.to_str()) != Some(config.name.as_str()) {
            return Err(invalid(format!(
                "{}: names stream {}",
                dir.display(),
                config.name
            )));
        }
        let json = serde_json::to_vec(&config).map_err(|e| invalid(e.to_string()))?;
        out.push((record::stream_key(&config.name), json));
        read_consumers(&dir, &config.name, out);
    }
    Ok(())
}

/// The consumers of one stream; a file that cannot be read is left out (logged; it is
/// moved to the legacy directory with the rest).
fn read_consumers(dir: &Path, stream: &str, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(rd) = std::fs::read_dir(dir.join("consumers")) else {
        return;
    };
    let mut files: Vec<_> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|x| x.to_str()) == Some("json"))
        .collect();
    files.sort();
    for p in files {
        let saved = std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_slice::<Saved>(&t).map_err(|e| e.to_string()))
            .and_then(|s| {
                if s.config.stream == stream {
                    Ok(s)
                } else {
                    Err(format!("names stream {}", s.config.stream))
                }
            });
        let s = match saved {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(stream, file = %p.display(), "consumer state unusable ({e}): not migrated");
                continue;
            }
        };
        let name = s.config.name.clone();
        let Ok(json) = serde_json::to_vec(&s.config) else {
            continue;
        };
        let pos = Position {
            floor: s.floor,
            next: s.next,
            done: s.done,
            deliveries: s.deliveries,
        };
        out.push((record::consumer_key(stream, &name), json));
        out.push((record::pos_key(stream, &name), pos.encode()));
    }
}

/// Moves the files of format 1 (`stream.json`, `consumers/`) to `<data>/legacy-1/streams/<n>/`.
fn move_legacy(data: &Path) -> std::io::Result<()> {
    let dirs = legacy_streams(data);
    let mut moved = false;
    let streams = data.join("streams");
    let Ok(rd) = std::fs::read_dir(&streams) else {
        return Ok(());
    };
    let all: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    for dir in all {
        let Some(name) = dir.file_name() else {
            continue;
        };
        let consumers = dir.join("consumers");
        if !dirs.contains(&dir) && !consumers.is_dir() {
            continue;
        }
        let target = data.join(LEGACY_DIR).join("streams").join(name);
        std::fs::create_dir_all(&target)?;
        if consumers.is_dir() {
            let to = target.join("consumers");
            std::fs::create_dir_all(&to)?;
            for e in std::fs::read_dir(&consumers)?.flatten() {
                std::fs::rename(e.path(), to.join(e.file_name()))?;
            }
            std::fs::File::open(&to)?.sync_all()?;
            std::fs::remove_dir(&consumers)?;
        }
        // The definition last: a stream directory keeps it until everything else moved.
        if dir.join("stream.json").is_file() {
            std::fs::rename(dir.join("stream.json"), target.join("stream.json"))?;
        }
        let _ = std::fs::remove_file(dir.join("stream.json.tmp"));
        std::fs::File::open(&target)?.sync_all()?;
        std::fs::File::open(&dir)?.sync_all()?;
        moved = true;
    }
    if moved {
        tracing::info!(dir = %data.join(LEGACY_DIR).display(), "stream files of the earlier format moved (kept; the broker no longer reads them)");
    }
    Ok(())
}
