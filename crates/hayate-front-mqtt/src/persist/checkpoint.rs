//! Checkpoints in the MQTT log: writing the whole state as records between a `C` and its `K`,
//! and reading the log back (the last complete checkpoint, then the journal from its `P`).
//!
//! A checkpoint is appended in one batch: `C` {number, P, next generation}, then a `R` per
//! retained message, a `Z` per persistent session (with its `W` owner after it), then
//! `K` {number}. Journal records never come between a `C` and its `K` (the batch is written
//! under the journal's writer lock); a `C` without its `K` (a crash or a failed write cut the
//! batch) is followed only by another `C` (a reopened journal, or the next start, checkpoints
//! first). Reading: the last `C` whose `K` follows is the base, then every journal record
//! from its P on is applied in order ([`Saved::apply`]), the records of every checkpoint
//! (that one too) skipped.

use super::*;

/// Records to append, one after the other in one buffer.
#[derive(Debug, Default)]
pub(crate) struct Records {
    pub(crate) bytes: Vec<u8>,
    /// End of each record in `bytes`.
    pub(crate) ends: Vec<usize>,
}

impl Records {
    pub(crate) fn push(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        f(&mut self.bytes);
        self.ends.push(self.bytes.len());
    }
}

/// The state of `mqtt` now, as checkpoint `number` covering the journal up to `p`
/// (`C`, the snapshot, `K`); with the number of sessions and retained messages in it.
pub(crate) fn snapshot(
    mqtt: &Mqtt,
    number: u64,
    p: u64,
    next_sgen: u64,
) -> (Records, usize, usize) {
    let mut recs = Records::default();
    recs.push(|b| ckpt::begin(b, number, p, next_sgen));
    let mut retained = 0;
    // `$SYS` messages are the broker's own, regenerated after a restart.
    for m in lock(&mqtt.retained)
        .all()
        .filter(|m| !super::super::is_sys(m.key.as_str()))
    {
        recs.push(|b| rec::retained(b, m));
        retained += 1;
    }
    let mut sessions = 0;
    for out in mqtt.session_states() {
        let st = lock(&out);
        let Some(p) = st.persist() else { continue };
        sessions += 1;
        recs.push(|b| {
            ckpt::session_head(b, number, &p.client, p.sgen, p.version, p.expiry);
            ckpt::subs_and_pids(b, st.subs.iter(), st.incoming.iter());
            let n = st.inflight().count() + st.pending().count();
            b.put_u32(n as u32);
            for (f, stage) in st.inflight() {
                ckpt::item(b, f.qid, f.pid, stage == Stage::Released, &f.item);
            }
            for f in st.pending() {
                ckpt::item(b, f.qid, 0, false, &f.item);
            }
        });
        if let Some(o) = &p.owner {
            recs.push(|b| ckpt::owner(b, &p.client, o));
        }
    }
    recs.push(|b| ckpt::end(b, number));
    (recs, sessions, retained)
}

/// `saved` as checkpoint `number` covering the journal up to `p` (the same records as
/// [`snapshot`] writes for the live state).
#[cfg(test)]
pub(crate) fn snapshot_of(saved: &Saved, number: u64, p: u64) -> Records {
    let mut recs = Records::default();
    recs.push(|b| ckpt::begin(b, number, p, saved.next_sgen));
    for m in saved.retained.values() {
        recs.push(|b| rec::retained(b, m));
    }
    for (client, s) in &saved.sessions {
        recs.push(|b| {
            ckpt::session_head(b, number, client, s.sgen, s.version, s.expiry);
            ckpt::subs_and_pids(b, s.subs.iter(), s.incoming.iter());
            b.put_u32(s.items.len() as u32);
            for (qid, it) in &s.items {
                ckpt::item(b, *qid, it.pid, it.released, &it.q);
            }
        });
        if let Some(o) = &s.owner {
            recs.push(|b| ckpt::owner(b, client, o));
        }
    }
    recs.push(|b| ckpt::end(b, number));
    recs
}

/// Where the records of the MQTT log are read from (the log itself; a list in tests).
pub(crate) trait Source {
    /// The first offset held.
    fn first(&self) -> u64;
    /// Each record from `from` on, in order, with its offset; `f` returns false to stop.
    fn each(&self, from: u64, f: &mut dyn FnMut(u64, &[u8]) -> bool) -> Result<(), String>;
}

impl Source for [Vec<u8>] {
    fn first(&self) -> u64 {
        0
    }
    fn each(&self, from: u64, f: &mut dyn FnMut(u64, &[u8]) -> bool) -> Result<(), String> {
        for (i, r) in self.iter().enumerate().skip(from as usize) {
            if !f(i as u64, r) {
                break;
            }
        }
        Ok(())
    }
}

/// What reading the log found.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) saved: Saved,
    /// Whether a complete checkpoint was found (else the state is the journal alone).
    pub(crate) complete: bool,
    /// Whether the log holds any record.
    pub(crate) any: bool,
    /// The number the next checkpoint takes.
    pub(crate) next_number: u64,
    /// Journal records applied, and skipped as undecodable.
    pub(crate) replayed: u64,
    pub(crate) skipped: u64,
}

/// A checkpoint found: its number, where its `C` is, P, the next generation.
#[derive(Debug, Clone, Copy)]
struct Found {
    number: u64,
    at: u64,
    p: u64,
    next_sgen: u64,
}

fn begin_of(rec: &[u8]) -> Option<(u64, u64, u64)> {
    let mut r = Reader(Bytes::copy_from_slice(rec.get(1..)?));
    Some((r.u64().ok()?, r.u64().ok()?, r.u64().ok()?))
}

fn number_of(rec: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(rec.get(1..9)?.try_into().ok()?))
}

/// The last complete checkpoint of `src` and the next checkpoint number.
fn last_complete(src: &(impl Source + ?Sized)) -> Result<(Option<Found>, u64, bool), String> {
    let (mut open, mut last, mut next, mut any) = (None::<Found>, None, 1, false);
    src.each(src.first(), &mut |at, rec| {
        any = true;
        match rec.first() {
            Some(b'C') => {
                open = begin_of(rec).map(|(number, p, next_sgen)| Found {
                    number,
                    at,
                    p,
                    next_sgen,
                });
                if let Some(o) = open {
                    next = next.max(o.number + 1);
                }
            }
            Some(b'K') => {
                if let (Some(o), Some(n)) = (open, number_of(rec))
                    && o.number == n
                {
                    last = Some(o);
                }
                open = None;
            }
            _ => {}
        }
        true
    })?;
    Ok((last, next, any))
}

/// Reads `src`: the last complete checkpoint, then the journal from its P (from the start of
/// the log when there is none). A record that cannot be decoded is skipped and counted.
pub(crate) fn load(src: &(impl Source + ?Sized)) -> Result<Loaded, String> {
    let (found, next_number, any) = last_complete(src)?;
    let mut out = Loaded {
        saved: Saved {
            next_sgen: 1,
            ..Saved::default()
        },
        complete: found.is_some(),
        any,
        next_number,
        ..Loaded::default()
    };
    let from = match found {
        Some(f) => {
            out.saved.next_sgen = f.next_sgen.max(1);
            read_snapshot(src, f, &mut out)?;
            f.p.max(src.first())
        }
        None => src.first(),
    };
    // Replay: journal records in order; every checkpoint's records skipped.
    let mut in_snapshot = false;
    let saved = &mut out.saved;
    let (mut replayed, mut skipped) = (0, 0);
    src.each(from, &mut |at, rec| {
        match rec.first() {
            Some(b'C') => in_snapshot = true,
            Some(b'K') => in_snapshot = false,
            Some(b'Z') => {}
            Some(b'R' | b'W') if in_snapshot => {}
            _ => {
                // A journal record after a `C` whose `K` never came: that checkpoint is over.
                in_snapshot = false;
                match saved.apply(rec) {
                    Ok(()) => replayed += 1,
                    Err(e) => {
                        skipped += 1;
                        tracing::error!("mqtt: log record {at} skipped: {e}");
                    }
                }
            }
        }
        true
    })?;
    out.replayed = replayed;
    out.skipped = skipped;
    Ok(out)
}

/// The records of checkpoint `f` into `out.saved`.
fn read_snapshot(src: &(impl Source + ?Sized), f: Found, out: &mut Loaded) -> Result<(), String> {
    let saved = &mut out.saved;
    let mut skipped = 0;
    src.each(f.at + 1, &mut |at, rec| {
        let r = match rec.first() {
            Some(b'K') => return false,
            Some(b'Z') => read_session(saved, f.number, rec),
            Some(b'R') => saved.apply(rec),
            Some(b'W') => read_owner(saved, rec),
            _ => Err(PersistError::Corrupt("not a checkpoint record")),
        };
        if let Err(e) = r {
            skipped += 1;
            tracing::error!("mqtt: checkpoint {} record {at} skipped: {e}", f.number);
        }
        true
    })?;
    out.skipped += skipped;
    Ok(())
}

fn read_session(saved: &mut Saved, number: u64, rec: &[u8]) -> Result<(), PersistError> {
    let mut r = Reader(Bytes::copy_from_slice(&rec[1..]));
    if r.u64()? != number {
        return Err(PersistError::Corrupt("a session of another checkpoint"));
    }
    let (client, s) = r.session()?;
    if r.0.has_remaining() {
        return Err(PersistError::Corrupt(
            "trailing bytes in a checkpoint record",
        ));
    }
    saved.insert(client, s);
    Ok(())
}

fn read_owner(saved: &mut Saved, rec: &[u8]) -> Result<(), PersistError> {
    let mut r = Reader(Bytes::copy_from_slice(&rec[1..]));
    let client = r.string()?;
    let user = r.string()?;
    if let Some(s) = saved.sessions.get_mut(&client) {
        s.owner = Some(user);
    }
    Ok(())
}
