//! The encoding of the MQTT state: the checkpoint's and the journal's records (`rec`), written
//! with the `put_*` functions and read back with [`Reader`], which skips an entry it cannot
//! take (a bad key) and keeps the rest.

use super::*;

// ----- encoding -----

pub(super) fn put_bytes(b: &mut impl BufMut, v: &[u8]) {
    b.put_u32(v.len() as u32);
    b.put_slice(v);
}

/// Wall-clock milliseconds of `at` (an expiry instant), `u64::MAX` for none.
pub(super) fn wall_ms(at: Option<Instant>) -> u64 {
    let Some(at) = at else { return u64::MAX };
    let left = at.saturating_duration_since(Instant::now());
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now + left).as_millis().min(u128::from(u64::MAX - 1)) as u64
}

/// The instant of wall-clock milliseconds `ms` (see [`wall_ms`]); a time past is now.
pub(super) fn instant_of(ms: u64) -> Option<Instant> {
    if ms == u64::MAX {
        return None;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let left = Duration::from_millis(ms).saturating_sub(now);
    Some(Instant::now() + left)
}

pub(super) fn put_message(b: &mut impl BufMut, m: &Message) {
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
    b.put_u64(wall_ms(m.attrs.expires));
}

pub(super) fn put_queued(b: &mut impl BufMut, q: &Queued) {
    put_message(b, &q.msg);
    b.put_u8(q.qos.as_u8());
    b.put_u8(u8::from(q.retain));
    b.put_u32(q.sub_id.unwrap_or(0));
}

pub(super) fn put_sub(b: &mut impl BufMut, sid: u32, s: &SubInfo) {
    b.put_u32(sid);
    put_bytes(b, s.filter.as_bytes());
    b.put_u8(s.qos.as_u8());
    b.put_u8(u8::from(s.no_local));
    b.put_u8(u8::from(s.retain_as_published));
    b.put_u8(s.retain_handling as u8);
    b.put_u32(s.id.unwrap_or(0));
}

/// Journal records, one function each; `b` is the journal's buffer.
pub(crate) mod rec {
    use super::*;

    /// `O` client, generation, protocol level, expiry interval: the session of `client`
    /// became persistent (replacing any other session of `client`).
    pub(crate) fn open(b: &mut Vec<u8>, client: &str, sgen: u64, v: ProtocolVersion, exp: u32) {
        b.put_u8(b'O');
        put_bytes(b, client.as_bytes());
        b.put_u64(sgen);
        b.put_u8(v.level());
        b.put_u32(exp);
    }
    /// `M` generation, protocol level, expiry interval: they changed.
    pub(crate) fn meta(b: &mut Vec<u8>, sgen: u64, v: ProtocolVersion, exp: u32) {
        b.put_u8(b'M');
        b.put_u64(sgen);
        b.put_u8(v.level());
        b.put_u32(exp);
    }
    /// `W` generation, user: the user who owns the session's client id.
    pub(crate) fn owner(b: &mut Vec<u8>, sgen: u64, user: &str) {
        b.put_u8(b'W');
        b.put_u64(sgen);
        put_bytes(b, user.as_bytes());
    }
    /// `E` generation: the session ended.
    pub(crate) fn end(b: &mut Vec<u8>, sgen: u64) {
        b.put_u8(b'E');
        b.put_u64(sgen);
    }
    /// `S` generation, subscription: subscribed (or its options changed).
    pub(crate) fn sub(b: &mut Vec<u8>, sgen: u64, sid: u32, s: &SubInfo) {
        b.put_u8(b'S');
        b.put_u64(sgen);
        put_sub(b, sid, s);
    }
    /// `U` generation, subscription id: unsubscribed.
    pub(crate) fn unsub(b: &mut Vec<u8>, sgen: u64, sid: u32) {
        b.put_u8(b'U');
        b.put_u64(sgen);
        b.put_u32(sid);
    }
    /// `I` generation, packet id, 1 added / 0 removed: an inbound QoS 2 PUBLISH received
    /// (PUBREC owed) or released (PUBREL).
    pub(crate) fn incoming(b: &mut Vec<u8>, sgen: u64, pid: u16, add: bool) {
        b.put_u8(b'I');
        b.put_u64(sgen);
        b.put_u16(pid);
        b.put_u8(u8::from(add));
    }
    /// `Q` generation, qid, delivery: a QoS 1/2 delivery taken (waiting).
    pub(crate) fn queue(b: &mut Vec<u8>, sgen: u64, qid: u64, q: &Queued) {
        b.put_u8(b'Q');
        b.put_u64(sgen);
        b.put_u64(qid);
        put_queued(b, q);
    }
    /// `P` generation, qid, packet id, 1 released: sent with this packet id (0: back to
    /// waiting), or PUBREL sent.
    pub(crate) fn pid(b: &mut Vec<u8>, sgen: u64, qid: u64, pid: u16, released: bool) {
        b.put_u8(b'P');
        b.put_u64(sgen);
        b.put_u64(qid);
        b.put_u16(pid);
        b.put_u8(u8::from(released));
    }
    /// `A` generation, qid: the delivery is done (acknowledged, expired or discarded).
    pub(crate) fn ack(b: &mut Vec<u8>, sgen: u64, qid: u64) {
        b.put_u8(b'A');
        b.put_u64(sgen);
        b.put_u64(qid);
    }
    /// `R` message: retained (an empty payload clears the key's retained message).
    pub(crate) fn retained(b: &mut Vec<u8>, m: &Message) {
        b.put_u8(b'R');
        put_message(b, m);
    }
}

/// Checkpoint records (written by [`super::Checkpoint`], between a `C` and its `K`).
pub(crate) mod ckpt {
    use super::*;

    /// `C` number, P (the journal offset the checkpoint covers up to), next generation.
    pub(crate) fn begin(b: &mut Vec<u8>, number: u64, p: u64, next_sgen: u64) {
        b.put_u8(b'C');
        b.put_u64(number);
        b.put_u64(p);
        b.put_u64(next_sgen);
    }
    /// `K` number: the checkpoint of that number is complete.
    pub(crate) fn end(b: &mut Vec<u8>, number: u64) {
        b.put_u8(b'K');
        b.put_u64(number);
    }
    /// `W` client, user: the owner of the session of `client` (after its `Z`).
    pub(crate) fn owner(b: &mut Vec<u8>, client: &str, user: &str) {
        b.put_u8(b'W');
        put_bytes(b, client.as_bytes());
        put_bytes(b, user.as_bytes());
    }
    /// The head of a `Z` record: number, then the session as the file's `S` has it (client,
    /// generation, level, expiry; the caller writes subscriptions, packet ids, deliveries).
    pub(crate) fn session_head(
        b: &mut Vec<u8>,
        number: u64,
        client: &str,
        sgen: u64,
        v: ProtocolVersion,
        expiry: u32,
    ) {
        b.put_u8(b'Z');
        b.put_u64(number);
        put_bytes(b, client.as_bytes());
        b.put_u64(sgen);
        b.put_u8(v.level());
        b.put_u32(expiry);
    }
    /// The subscriptions and the unreleased inbound packet ids of a `Z` record.
    pub(crate) fn subs_and_pids<'a>(
        b: &mut Vec<u8>,
        subs: impl ExactSizeIterator<Item = (&'a u32, &'a SubInfo)>,
        pids: impl ExactSizeIterator<Item = &'a u16>,
    ) {
        b.put_u32(subs.len() as u32);
        for (sid, s) in subs {
            put_sub(b, *sid, s);
        }
        b.put_u32(pids.len() as u32);
        for pid in pids {
            b.put_u16(*pid);
        }
    }
    /// A delivery of a `Z` record: qid, packet id (0: waiting), released, the delivery.
    pub(crate) fn item(b: &mut Vec<u8>, qid: u64, pid: u16, released: bool, q: &Queued) {
        b.put_u64(qid);
        b.put_u16(pid);
        b.put_u8(u8::from(released));
        put_queued(b, q);
    }
}

/// The key a record of the log is written with (for inspection: nothing reads keys):
/// `s/<client>` for what describes a session (`O M W E S U I`, and `Z`/`W` of a checkpoint),
/// `m/<client>` for its deliveries (`Q P A`), `r/<topic>` for a retained message (`R`),
/// `checkpoint` for `C` and `K`. `names` maps generations to client ids (learnt from `O` and
/// `Z`; an `E` forgets one); a generation not known is written `g/<generation>`. `snapshot`:
/// the record is a checkpoint's (its `W` names the client, not the generation).
pub(crate) fn key_of(
    rec: &[u8],
    snapshot: bool,
    names: &mut HashMap<u64, String>,
    out: &mut Vec<u8>,
) {
    let be64 = |at: usize| {
        rec.get(at..at + 8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let string = |at: usize| -> Option<&[u8]> {
        let n = u32::from_be_bytes(rec.get(at..at + 4)?.try_into().ok()?) as usize;
        rec.get(at + 4..at + 4 + n)
    };
    let by_gen = |prefix: &[u8], sgen: Option<u64>, out: &mut Vec<u8>| {
        out.extend_from_slice(prefix);
        match sgen.and_then(|g| names.get(&g)) {
            Some(c) => out.extend_from_slice(c.as_bytes()),
            None => {
                out.truncate(out.len() - prefix.len());
                out.extend_from_slice(b"g/");
                out.extend_from_slice(sgen.unwrap_or(0).to_string().as_bytes());
            }
        }
    };
    match rec.first() {
        Some(b'C' | b'K') => out.extend_from_slice(b"checkpoint"),
        Some(b'R') => {
            out.extend_from_slice(b"r/");
            out.extend_from_slice(string(1).unwrap_or_default());
        }
        Some(b'O') => {
            let client = string(1).unwrap_or_default();
            if let Some(g) = be64(5 + client.len()) {
                names.insert(g, String::from_utf8_lossy(client).into_owned());
            }
            out.extend_from_slice(b"s/");
            out.extend_from_slice(client);
        }
        Some(b'Z') => {
            let client = string(9).unwrap_or_default();
            if let Some(g) = be64(13 + client.len()) {
                names.insert(g, String::from_utf8_lossy(client).into_owned());
            }
            out.extend_from_slice(b"s/");
            out.extend_from_slice(client);
        }
        Some(b'W') if snapshot => {
            out.extend_from_slice(b"s/");
            out.extend_from_slice(string(1).unwrap_or_default());
        }
        Some(b'Q' | b'P' | b'A') => by_gen(b"m/", be64(1), out),
        Some(b'E') => {
            by_gen(b"s/", be64(1), out);
            if let Some(g) = be64(1) {
                names.remove(&g);
            }
        }
        _ => by_gen(b"s/", be64(1), out),
    }
}

// ----- decoding -----

pub(super) struct Reader(pub(super) Bytes);

impl Reader {
    pub(super) fn need(&self, n: usize) -> Result<(), PersistError> {
        if self.0.remaining() < n {
            Err(PersistError::Corrupt("truncated"))
        } else {
            Ok(())
        }
    }
    pub(super) fn u8(&mut self) -> Result<u8, PersistError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    pub(super) fn u16(&mut self) -> Result<u16, PersistError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }
    pub(super) fn u32(&mut self) -> Result<u32, PersistError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }
    pub(super) fn u64(&mut self) -> Result<u64, PersistError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    pub(super) fn bytes(&mut self) -> Result<Bytes, PersistError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        Ok(self.0.split_to(n))
    }
    pub(super) fn string(&mut self) -> Result<String, PersistError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| PersistError::Corrupt("utf-8"))
    }
    /// A key; `None` (warned about) when the bytes are no valid key: the state was saved
    /// by a broker that let such a key in, or edited. The entry that holds it is skipped,
    /// not the file: its length is known, so what follows is still read.
    pub(super) fn key(&mut self) -> Result<Option<Key>, PersistError> {
        match Key::from_bytes_or_return(self.bytes()?) {
            Ok(k) => Ok(Some(k)),
            Err((e, b)) => {
                tracing::warn!(
                    key = %String::from_utf8_lossy(&b).escape_debug(),
                    "mqtt: saved state: a message whose key is not valid ({e}) skipped"
                );
                Ok(None)
            }
        }
    }
    pub(super) fn qos(&mut self) -> Result<QoS, PersistError> {
        QoS::from_u8(self.u8()?).ok_or(PersistError::Corrupt("qos"))
    }
    pub(super) fn version(&mut self) -> Result<ProtocolVersion, PersistError> {
        ProtocolVersion::from_level(self.u8()?).ok_or(PersistError::Corrupt("protocol level"))
    }

    /// A message; `v1`: its expiry is the time left when saved. `None` (read to its end,
    /// warned about) when its key or reply-to is not a valid key: the caller skips it.
    pub(super) fn message_at(
        &mut self,
        v1: Option<Instant>,
    ) -> Result<Option<Message>, PersistError> {
        let key = self.key()?;
        let payload = self.bytes()?;
        let mut valid = key.is_some();
        let mut m = Message::new(key.unwrap_or_else(placeholder), payload);
        if self.u8()? == 1 {
            m.reply_to = self.key()?;
            valid &= m.reply_to.is_some();
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
        let t = self.u64()?;
        m.attrs.expires = match v1 {
            Some(now) => (t != u64::MAX).then(|| now + Duration::from_millis(t)),
            None => instant_of(t),
        };
        Ok(valid.then_some(m))
    }

    pub(super) fn message(&mut self) -> Result<Option<Message>, PersistError> {
        self.message_at(None)
    }

    /// A delivery; `None` when its message is skipped ([`Reader::message_at`]).
    pub(super) fn queued_at(
        &mut self,
        v1: Option<Instant>,
    ) -> Result<Option<Queued>, PersistError> {
        let msg = self.message_at(v1)?;
        let qos = self.qos()?;
        let retain = self.u8()? == 1;
        let sub_id = self.u32()?;
        Ok(msg.map(|msg| Queued {
            msg,
            qos,
            retain,
            sub_id: (sub_id != 0).then_some(sub_id),
        }))
    }

    pub(super) fn queued(&mut self) -> Result<Option<Queued>, PersistError> {
        self.queued_at(None)
    }

    pub(super) fn sub(&mut self) -> Result<(u32, SubInfo), PersistError> {
        let sid = self.u32()?;
        let filter = self.string()?;
        let qos = self.qos()?;
        let no_local = self.u8()? == 1;
        let retain_as_published = self.u8()? == 1;
        let retain_handling =
            RetainHandling::from_u8(self.u8()?).ok_or(PersistError::Corrupt("retain handling"))?;
        let id = self.u32()?;
        let plain = shared_subscription(&filter).map_or(filter.as_str(), |s| s.filter);
        let skip_dollar = plain.starts_with('+') || plain.starts_with('#');
        Ok((
            sid,
            SubInfo {
                filter,
                qos,
                no_local,
                retain_as_published,
                retain_handling,
                id: (id != 0).then_some(id),
                skip_dollar,
            },
        ))
    }

    /// A session's subscriptions and unreleased packet ids (both file versions), into `s`.
    pub(super) fn session_head(&mut self, s: &mut SavedSession) -> Result<(), PersistError> {
        for _ in 0..self.u32()? {
            let (sid, info) = self.sub()?;
            s.subs.insert(sid, info);
        }
        for _ in 0..self.u32()? {
            s.incoming.insert(self.u16()?);
        }
        Ok(())
    }

    /// A session of a version 2 file.
    pub(super) fn session(&mut self) -> Result<(String, SavedSession), PersistError> {
        let client = self.string()?;
        let sgen = self.u64()?;
        let version = self.version()?;
        let mut s = SavedSession::new(sgen, version, self.u32()?);
        self.session_head(&mut s)?;
        for _ in 0..self.u32()? {
            let qid = self.u64()?;
            let pid = self.u16()?;
            let released = self.u8()? == 1;
            if let Some(q) = self.queued()? {
                s.items.insert(qid, SavedItem { q, pid, released });
            }
        }
        Ok((client, s))
    }

    /// A session of a version 1 file (no generation, no delivery numbers: given here).
    pub(super) fn session_v1(
        &mut self,
        sgen: u64,
        now: Instant,
    ) -> Result<(String, SavedSession), PersistError> {
        let client = self.string()?;
        let version = self.version()?;
        let mut s = SavedSession::new(sgen, version, self.u32()?);
        self.session_head(&mut s)?;
        let mut qid = 1;
        for _ in 0..self.u32()? {
            let pid = self.u16()?;
            let released = self.u8()? == 1;
            if let Some(q) = self.queued_at(Some(now))? {
                s.items.insert(qid, SavedItem { q, pid, released });
            }
            qid += 1;
        }
        for _ in 0..self.u32()? {
            if let Some(q) = self.queued_at(Some(now))? {
                let (pid, released) = (0, false);
                s.items.insert(qid, SavedItem { q, pid, released });
            }
            qid += 1;
        }
        Ok((client, s))
    }
}

/// The key a skipped message is read with (never kept: see [`Reader::message_at`]).
pub(super) fn placeholder() -> Key {
    Key::new("%").unwrap_or_else(|_| unreachable!("a valid key"))
}
