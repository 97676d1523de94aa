//! Saving persistent MQTT sessions and retained messages, so they survive a restart.
//!
//! One file, `mqtt.state` in the data directory, rewritten whole (to a temporary file,
//! synced, then renamed over the old one) at shutdown and every `mqtt.autosave_secs`.
//! A crash loses what changed since the last save; the durable log (a later issue) will
//! make QoS 1 and 2 messages durable as they arrive.
//!
//! Format: the magic line `HAYATE-MQTT 1\n`, then records. A record is a tag byte (`R` a
//! retained message, `S` a session) and its fields; integers are big-endian, strings and
//! byte strings are a `u32` length and the bytes. Expiry instants are saved as the time
//! left, in milliseconds.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hayate_core::{Key, Message};
use hayate_mqtt::{ProtocolVersion, QoS, RetainHandling, shared_subscription};

use super::delivery::{Queued, Stage, SubInfo, lock};
use super::translate::{broker_qos, filter_to_expr, guarantee, qos_of};
use super::{Mqtt, locked};

const MAGIC: &[u8] = b"HAYATE-MQTT 1\n";
const FILE: &str = "mqtt.state";

/// Why a saved state could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The file could not be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file is not a state file of this version, or is truncated.
    #[error("corrupt state file: {0}")]
    Corrupt(&'static str),
}

fn put_bytes(b: &mut BytesMut, v: &[u8]) {
    b.put_u32(v.len() as u32);
    b.put_slice(v);
}

fn put_message(b: &mut BytesMut, m: &Message, now: Instant) {
    put_bytes(b, m.key.as_bytes());
    put_bytes(b, &m.payload);
    match &m.reply_to {
        Some(r) => {
            b.put_u8(1);
            put_bytes(b, r.as_bytes());
        }
        None => b.put_u8(0),
    }
    match &m.correlation_id {
        Some(c) => {
            b.put_u8(1);
            put_bytes(b, c);
        }
        None => b.put_u8(0),
    }
    let h = m.headers.as_deref().unwrap_or_default();
    b.put_u32(h.len() as u32);
    for (k, v) in h {
        put_bytes(b, k.as_bytes());
        put_bytes(b, v);
    }
    // The guarantee as its MQTT QoS number; 255 when the publisher stated none.
    b.put_u8(m.attrs.guarantee.map_or(255, |g| qos_of(g).as_u8()));
    b.put_u8(u8::from(m.attrs.retain));
    b.put_u8(u8::from(m.attrs.utf8));
    b.put_u64(m.attrs.expires.map_or(u64::MAX, |at| {
        at.saturating_duration_since(now).as_millis() as u64
    }));
}

fn put_queued(b: &mut BytesMut, q: &Queued, now: Instant) {
    put_message(b, &q.msg, now);
    b.put_u8(q.qos.as_u8());
    b.put_u8(u8::from(q.retain));
    b.put_u32(q.sub_id.unwrap_or(0));
}

struct Reader(Bytes);

impl Reader {
    fn need(&self, n: usize) -> Result<(), PersistError> {
        if self.0.remaining() < n {
            Err(PersistError::Corrupt("truncated"))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, PersistError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u16(&mut self) -> Result<u16, PersistError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }
    fn u32(&mut self) -> Result<u32, PersistError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }
    fn u64(&mut self) -> Result<u64, PersistError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    fn bytes(&mut self) -> Result<Bytes, PersistError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        Ok(self.0.split_to(n))
    }
    fn string(&mut self) -> Result<String, PersistError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| PersistError::Corrupt("utf-8"))
    }
    fn key(&mut self) -> Result<Key, PersistError> {
        Key::from_bytes(self.bytes()?).map_err(|_| PersistError::Corrupt("key"))
    }
    fn qos(&mut self) -> Result<QoS, PersistError> {
        QoS::from_u8(self.u8()?).ok_or(PersistError::Corrupt("qos"))
    }

    fn message(&mut self, now: Instant) -> Result<Message, PersistError> {
        let key = self.key()?;
        let payload = self.bytes()?;
        let mut m = Message::new(key, payload);
        if self.u8()? == 1 {
            m.reply_to = Some(self.key()?);
        }
        if self.u8()? == 1 {
            m.correlation_id = Some(self.bytes()?);
        }
        let n = self.u32()?;
        if n > 0 {
            let mut h = Vec::new();
            for _ in 0..n {
                h.push((self.string()?, self.bytes()?));
            }
            m.headers = Some(h);
        }
        m.attrs.guarantee = QoS::from_u8(self.u8()?).map(guarantee);
        m.attrs.retain = self.u8()? == 1;
        m.attrs.utf8 = self.u8()? == 1;
        let left = self.u64()?;
        m.attrs.expires = (left != u64::MAX).then(|| now + Duration::from_millis(left));
        Ok(m)
    }

    fn queued(&mut self, now: Instant) -> Result<Queued, PersistError> {
        let msg = self.message(now)?;
        let qos = self.qos()?;
        let retain = self.u8()? == 1;
        let sub_id = self.u32()?;
        Ok(Queued {
            msg,
            qos,
            retain,
            sub_id: (sub_id != 0).then_some(sub_id),
        })
    }
}

/// Writes the state file; `None` when there was nothing to save and no file to replace.
pub(crate) fn save(mqtt: &Mqtt, dir: &Path) -> Result<Option<(usize, usize)>, PersistError> {
    let now = Instant::now();
    let mut b = BytesMut::new();
    b.put_slice(MAGIC);
    let mut retained = 0;
    // `$SYS` messages are the broker's own, regenerated after a restart.
    for m in locked(&mqtt.retained)
        .all()
        .filter(|m| !m.key.as_str().starts_with("$SYS/"))
    {
        b.put_u8(b'R');
        put_message(&mut b, m, now);
        retained += 1;
    }
    let sessions = mqtt.saved_sessions();
    for (id, version, expiry, out) in &sessions {
        let st = lock(out);
        b.put_u8(b'S');
        put_bytes(&mut b, id.as_bytes());
        b.put_u8(version.level());
        b.put_u32(*expiry);
        b.put_u32(st.subs.len() as u32);
        for (sid, s) in &st.subs {
            b.put_u32(*sid);
            put_bytes(&mut b, s.filter.as_bytes());
            b.put_u8(s.qos.as_u8());
            b.put_u8(u8::from(s.no_local));
            b.put_u8(u8::from(s.retain_as_published));
            b.put_u8(s.retain_handling as u8);
            b.put_u32(s.id.unwrap_or(0));
        }
        b.put_u32(st.incoming.len() as u32);
        for pid in &st.incoming {
            b.put_u16(*pid);
        }
        let inflight: Vec<_> = st.inflight().collect();
        b.put_u32(inflight.len() as u32);
        for f in inflight {
            b.put_u16(f.pid);
            b.put_u8(u8::from(f.stage == Stage::Released));
            put_queued(&mut b, &f.item, now);
        }
        b.put_u32(st.pending().count() as u32);
        for q in st.pending() {
            put_queued(&mut b, q, now);
        }
    }
    let path = dir.join(FILE);
    if retained == 0 && sessions.is_empty() && !path.exists() {
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&b)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(Some((sessions.len(), retained)))
}

/// Reads the state file (if any) into `mqtt`: retained messages, and sessions parked as
/// if their clients had just disconnected. Returns (sessions, retained messages).
pub(crate) fn load(mqtt: &Mqtt, dir: &Path) -> Result<(usize, usize), PersistError> {
    let path = dir.join(FILE);
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(e.into()),
    };
    if !data.starts_with(MAGIC) {
        return Err(PersistError::Corrupt("not a Hayate MQTT state file"));
    }
    let now = Instant::now();
    let mut r = Reader(Bytes::from(data).slice(MAGIC.len()..));
    let (mut sessions, mut retained) = (0, 0);
    while r.0.has_remaining() {
        match r.u8()? {
            b'R' => {
                let m = r.message(now)?;
                mqtt.retain(&m);
                retained += 1;
            }
            b'S' => {
                load_session(mqtt, &mut r, now)?;
                sessions += 1;
            }
            _ => return Err(PersistError::Corrupt("unknown record")),
        }
    }
    Ok((sessions, retained))
}

fn load_session(mqtt: &Mqtt, r: &mut Reader, now: Instant) -> Result<(), PersistError> {
    let id = r.string()?;
    let version =
        ProtocolVersion::from_level(r.u8()?).ok_or(PersistError::Corrupt("protocol level"))?;
    let expiry = r.u32()?;
    let mut ms = mqtt.new_session();
    let n = r.u32()?;
    for _ in 0..n {
        let sid = r.u32()?;
        let filter = r.string()?;
        let qos = r.qos()?;
        let no_local = r.u8()? == 1;
        let retain_as_published = r.u8()? == 1;
        let retain_handling =
            RetainHandling::from_u8(r.u8()?).ok_or(PersistError::Corrupt("retain handling"))?;
        let sub_id = r.u32()?;
        let (group, plain) = match shared_subscription(&filter) {
            Some(s) => (Some(s.group.to_string()), s.filter.to_string()),
            None => (None, filter.clone()),
        };
        let expr = filter_to_expr(&plain).map_err(|_| PersistError::Corrupt("filter"))?;
        lock(&ms.out).subs.insert(
            sid,
            SubInfo {
                filter: filter.clone(),
                qos,
                no_local,
                retain_as_published,
                retain_handling,
                id: (sub_id != 0).then_some(sub_id),
                skip_dollar: plain.starts_with('+') || plain.starts_with('#'),
            },
        );
        if ms
            .session
            .subscribe(sid, expr, group.as_deref(), broker_qos(qos))
            .is_ok()
        {
            ms.subs.bind(filter, sid);
        }
    }
    let n = r.u32()?;
    for _ in 0..n {
        let pid = r.u16()?;
        lock(&ms.out).incoming.insert(pid);
    }
    let n = r.u32()?;
    for _ in 0..n {
        let pid = r.u16()?;
        let released = r.u8()? == 1;
        let q = r.queued(now)?;
        let stage = if released {
            Stage::Released
        } else {
            Stage::Sent
        };
        lock(&ms.out).restore_inflight(pid, q, stage);
    }
    let n = r.u32()?;
    let outbox = ms.session.outbox().clone();
    for _ in 0..n {
        let q = r.queued(now)?;
        let out = ms.out.clone();
        outbox.push_reply_unbudgeted(|o| lock(&out).enqueue(q, o));
    }
    // The restored session is offline: no connection takes its output yet.
    let out = ms.out.clone();
    outbox.detach(|| lock(&out).go_offline());
    mqtt.park_restored(id, ms, version, expiry);
    Ok(())
}
