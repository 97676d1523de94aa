//! The MQTT state of format 1 (before the MQTT log): the checkpoint file `mqtt.state`
//! (versions 1 and 2) and the journal `mqtt-journal/` (the same records as the log's journal
//! records, without keys). Read once, by the migration: a data directory that has either and
//! no complete checkpoint in the log is read as before (the file, then the journal from the
//! file's P), restored, and checkpointed into the log; once that checkpoint's `K` is durable
//! the old files are moved to `<data>/legacy-1/` (never deleted). A start cut before the `K`
//! finds a log without a complete checkpoint and the old files still there: it empties the log
//! and migrates again; a start that finds both a complete checkpoint and the old files
//! finishes their move.

use std::path::Path;
use std::sync::Arc;

use hayate_log::{Log, LogConfig, Root, Storage};

use super::*;

pub(crate) const MAGIC_V1: &[u8] = b"HAYATE-MQTT 1\n";
pub(crate) const MAGIC: &[u8] = b"HAYATE-MQTT 2\n";
/// The checkpoint file of format 1.
pub(crate) const FILE: &str = "mqtt.state";
/// The journal of format 1.
pub(crate) const JOURNAL_DIR: &str = "mqtt-journal";
/// Where the files of format 1 go once migrated (shared with the meta log's migration).
pub(crate) const LEGACY_DIR: &str = "legacy-1";
/// The journal offset of a checkpoint file that is the whole state on its own (taken with no
/// journal): nothing is replayed over it.
pub(crate) const NO_JOURNAL: u64 = u64::MAX;

/// Whether `data` (the directory `root` is) holds MQTT state of format 1.
pub(crate) fn present(root: &dyn Root, data: &Path) -> bool {
    data.join(FILE).exists()
        || root
            .list("")
            .is_ok_and(|d| d.iter().any(|n| n == JOURNAL_DIR))
}

/// Reads the state of format 1: the checkpoint file, then the old journal from its P. A
/// file that cannot be read is left out (the journal alone is read, from its start).
pub(crate) fn read(root: &dyn Root, data: &Path) -> Saved {
    let mut saved = match read_file(data) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("mqtt: {}: cannot read ({e}): not migrated", FILE);
            Saved {
                next_sgen: 1,
                ..Saved::default()
            }
        }
    };
    let has_journal = root
        .list("")
        .is_ok_and(|d| d.iter().any(|n| n == JOURNAL_DIR));
    if has_journal && saved.replay_from != NO_JOURNAL {
        let config = LogConfig {
            segment_bytes: 16 << 20,
            max_record_bytes: 1 << 30,
            fsync: hayate_log::FsyncPolicy::Never,
            ..LogConfig::default()
        };
        match Log::open_in(root, JOURNAL_DIR, config) {
            Ok(log) => {
                let (mut n, mut skipped) = (0u64, 0u64);
                let r = checkpoint::Source::each(&log, saved.replay_from, &mut |at, rec| {
                    match saved.apply(rec) {
                        Ok(()) => n += 1,
                        Err(e) => {
                            skipped += 1;
                            tracing::error!("mqtt: {JOURNAL_DIR} record {at} skipped: {e}");
                        }
                    }
                    true
                });
                if let Err(e) = r {
                    tracing::error!("mqtt: {JOURNAL_DIR}: replay stopped: {e}");
                }
                tracing::info!("mqtt: {JOURNAL_DIR}: replayed {n} records ({skipped} skipped)");
            }
            Err(e) => tracing::error!("mqtt: cannot open {JOURNAL_DIR}: {e}"),
        }
    }
    saved
}

/// Moves the files of format 1 to `<data>/legacy-1/` (after the migrated checkpoint is
/// durable); what a cut move left is moved by the next start.
pub(crate) fn move_files(root: &dyn Root, data: &Path) -> std::io::Result<()> {
    let to = data.join(LEGACY_DIR);
    std::fs::create_dir_all(&to)?;
    // The journal first: the file last, so that `present` holds until everything moved.
    if root
        .list("")
        .is_ok_and(|d| d.iter().any(|n| n == JOURNAL_DIR))
    {
        match root.path() {
            Some(p) => {
                let target = to.join(JOURNAL_DIR);
                if target.exists() {
                    // An earlier move copied it and was cut before removing the source.
                    std::fs::remove_dir_all(&target)?;
                }
                std::fs::rename(p.join(JOURNAL_DIR), &target)?;
                std::fs::File::open(p)?.sync_all()?;
            }
            None => copy_dir(root, JOURNAL_DIR, &format!("{LEGACY_DIR}/{JOURNAL_DIR}"))?,
        }
    }
    let mut names: Vec<_> = std::fs::read_dir(data)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(FILE) && n != FILE)
        .collect();
    names.sort();
    names.push(FILE.to_owned());
    for n in names {
        match std::fs::rename(data.join(&n), to.join(&n)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::File::open(&to)?.sync_all()?;
    std::fs::File::open(data)?.sync_all()?;
    tracing::info!(
        dir = %to.display(),
        "mqtt: {FILE} and {JOURNAL_DIR}/ of the earlier format moved (kept; the broker no \
         longer reads them)"
    );
    Ok(())
}

/// Copies directory `from` of `root` to `to` (durably), then removes `from` (a root not on
/// the local file system).
fn copy_dir(root: &dyn Root, from: &str, to: &str) -> std::io::Result<()> {
    let src: Arc<dyn Storage> = root.dir(from, false)?;
    let dst = root.dir(to, true)?;
    for name in src.list()? {
        let f = src.open(&name, false)?;
        let mut buf = vec![0; usize::try_from(f.len()?).unwrap_or(usize::MAX)];
        let mut at = 0;
        while at < buf.len() {
            match f.read_at(&mut buf[at..], at as u64)? {
                0 => break,
                n => at += n,
            }
        }
        let g = dst.open(&name, true)?;
        g.set_len(0)?;
        let mut at = 0;
        while at < buf.len() {
            match g.write_at(&buf[at..], at as u64)? {
                0 => return Err(std::io::ErrorKind::WriteZero.into()),
                n => at += n,
            }
        }
        g.sync_data()?;
    }
    dst.sync_dir()?;
    root.remove_dir(from)
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
