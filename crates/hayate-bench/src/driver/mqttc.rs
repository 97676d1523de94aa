//! MQTT driver (`mqtt://HOST:PORT`, default 1883), a small client over the workspace's own
//! sans-IO codec (`hayate-mqtt`); always compiled in (it has no dependency of its own). The
//! default for `mqtt://` targets; `?client=rumqttc` selects the `rumqttc` driver instead
//! (feature `peers`).
//!
//! - MQTT 3.1.1 by default, `?version=5` for MQTT 5.0. Clean session, keep alive 60 s (a
//!   task sends a PINGREQ when nothing was written for 30 s), a client id unique to the
//!   process and connection. A refused CONNECT fails with the broker's reason.
//! - Topics: a key `a/b` is the MQTT topic `a/b` as is (exact topics, no wildcards).
//! - QoS 0 by default; `?qos=1` publishes and subscribes with QoS 1. Packet ids cycle through
//!   1..=65535 (skipping ids still in use); at most [`WINDOW`] publications wait for their
//!   PUBACK (fewer if an MQTT 5.0 broker's Receive Maximum says so), beyond that a publisher
//!   waits until an eighth of the window is free. Incoming QoS 1 PUBLISHes are acknowledged by the reader task.
//! - Writes: packets are encoded into one buffer that a writer task sends with one `write_all`
//!   per batch (like any client's write buffer; payloads are copied into it); a publisher
//!   waits while more than [`HIGH_WATER`] bytes are buffered.
//! - Reads: one reader task reads into a large buffer and decodes every packet in it before
//!   reading again; PUBLISH payloads (zero-copy slices of the read buffer) are handed, in one
//!   batch per read and topic, to the subscription of their topic.
//! - Subscribe waits for the SUBACK (a refusal fails). Flush = PINGREQ / PINGRESP: a broker
//!   handles one connection's packets in order, so the PINGRESP means that every SUBSCRIBE
//!   and PUBLISH sent before it was processed (subscriptions active, publications routed).
//! - A decode error, an unexpected packet, a DISCONNECT from the broker or the connection
//!   closing is recorded as trouble and fails the point.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_mqtt::{
    Ack, ByteStr, Connect, Disconnect, Packet, ProtocolVersion, PublishHead, PublishProperties,
    QoS, ReasonCode, Subscribe, Subscription,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = concat!("hayate-mqtt client ", env!("CARGO_PKG_VERSION"));
/// The same, speaking MQTT 5.0.
pub(crate) const CLIENT_V5: &str = concat!(
    "hayate-mqtt client ",
    env!("CARGO_PKG_VERSION"),
    " (MQTT 5.0)"
);

/// A publisher waits while more than this many bytes are waiting to be written.
const HIGH_WATER: usize = 1 << 20;
/// QoS 1 publications waiting for their PUBACK, at most.
pub(crate) const WINDOW: usize = 1024;
/// Batches of payloads (one per read and topic) a subscription buffers before the reader
/// waits for the consumer.
const SUB_BATCHES: usize = 256;
/// A batch is handed over once it holds this many payloads, even within one read.
const MAX_BATCH: usize = 1024;
/// The largest packet accepted from the broker.
const MAX_PACKET: u32 = 256 << 20;
/// Read buffer: this much free space before each read.
const READ_CHUNK: usize = 64 << 10;
/// Keep alive announced in the CONNECT; a PINGREQ is sent after half of it without writes.
const KEEP_ALIVE: u16 = 60;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The MQTT version a target asks for (`?version=`; 3.1.1 by default).
pub(crate) fn version(target: &Target) -> anyhow::Result<ProtocolVersion> {
    Ok(match target.param("version").unwrap_or("3.1.1") {
        "3.1.1" | "4" => ProtocolVersion::V3_1_1,
        "5" | "5.0" => ProtocolVersion::V5,
        v => bail!("mqtt: version={v} is not supported (3.1.1 or 5)"),
    })
}

/// The QoS a target asks for (`?qos=`; 0 by default).
fn qos(target: &Target) -> anyhow::Result<QoS> {
    Ok(match target.param("qos").unwrap_or("0") {
        "0" => QoS::AtMostOnce,
        "1" => QoS::AtLeastOnce,
        q => bail!("mqtt: qos={q} is not supported (0 or 1)"),
    })
}

/// What the writer sends and the packet ids in use, under one lock.
struct Out {
    buf: BytesMut,
    /// Packet ids in use (QoS 1 PUBLISH waiting for PUBACK, SUBSCRIBE waiting for SUBACK):
    /// one bit per id.
    used: Vec<u64>,
    /// The next packet id to try.
    next_id: u16,
    /// QoS 1 publications waiting for their PUBACK.
    inflight: usize,
    /// One entry per PINGREQ written, in order: a flush waiting for its PINGRESP, or `None`
    /// for a keep-alive ping.
    pings: VecDeque<Option<oneshot::Sender<()>>>,
}

impl Out {
    fn is_used(&self, id: u16) -> bool {
        self.used[usize::from(id) / 64] & (1 << (id % 64)) != 0
    }

    /// Takes a free packet id (1..=65535, cycling).
    fn alloc_id(&mut self) -> Option<u16> {
        for _ in 0..u16::MAX {
            let id = self.next_id;
            self.next_id = if id == u16::MAX { 1 } else { id + 1 };
            if !self.is_used(id) {
                self.used[usize::from(id) / 64] |= 1 << (id % 64);
                return Some(id);
            }
        }
        None
    }

    /// Frees a packet id; false if it was not in use.
    fn free_id(&mut self, id: u16) -> bool {
        let was = id != 0 && self.is_used(id);
        self.used[usize::from(id) / 64] &= !(1 << (id % 64));
        was
    }

    /// Appends a packet the codec accepts (ours always are).
    fn encode(&mut self, packet: &Packet, version: ProtocolVersion) {
        if let Err(e) = hayate_mqtt::encode(packet, version, &mut self.buf) {
            // Only a bug gets here: every packet this driver builds is valid.
            tracing::error!("mqtt: cannot encode {:?}: {e}", packet.packet_type());
        }
    }
}

struct Shared {
    version: ProtocolVersion,
    out: Mutex<Out>,
    /// Wakes the writer task.
    wake: Notify,
    /// Wakes writers waiting for buffer space (after each write).
    space: Notify,
    /// Wakes publishers waiting for the in-flight window, once an eighth of it is free.
    acks: Notify,
    /// The connection has ended (or is closing: no more writes).
    closed: AtomicBool,
    /// `close` sent a DISCONNECT: the connection ending is expected.
    closing: AtomicBool,
    /// The writer wrote something since the keep-alive task last looked.
    wrote: AtomicBool,
    /// The in-flight window (QoS 1).
    window: usize,
    routes: Mutex<HashMap<String, mpsc::Sender<Vec<Bytes>>>>,
    subacks: Mutex<HashMap<u16, oneshot::Sender<Vec<ReasonCode>>>>,
    trouble: Mutex<Option<String>>,
    who: String,
}

impl Shared {
    fn fail(&self, msg: String) {
        let mut t = lock(&self.trouble);
        if t.is_none() {
            *t = Some(format!("{}: {msg}", self.who));
        }
    }

    fn closed_error(&self) -> anyhow::Error {
        anyhow::anyhow!(
            "{}",
            lock(&self.trouble)
                .clone()
                .unwrap_or_else(|| "mqtt: connection closed".into())
        )
    }

    /// Ends the connection's state: subscriptions end, waiters wake up and fail.
    fn shut(&self) {
        {
            // Under the lock: a writer that saw `closed` false has registered its waiter
            // (SUBACK, PINGRESP) before the waiters are dropped here.
            let mut out = lock(&self.out);
            self.closed.store(true, Ordering::Release);
            out.pings.clear();
        }
        lock(&self.routes).clear();
        lock(&self.subacks).clear();
        self.space.notify_waiters();
        self.acks.notify_waiters();
        self.wake.notify_one();
    }
}

/// Aborts the connection's tasks when the last handle is dropped.
struct Tasks {
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    aborts: Vec<tokio::task::AbortHandle>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.aborts {
            t.abort();
        }
    }
}

#[derive(Clone)]
pub(crate) struct MqttConn {
    shared: Arc<Shared>,
    qos: QoS,
    tasks: Arc<Tasks>,
}

pub(crate) struct MqttSub {
    rx: mpsc::Receiver<Vec<Bytes>>,
    batch: std::vec::IntoIter<Bytes>,
}

impl MqttConn {
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        _expect_payload: usize,
        timeout: Duration,
    ) -> anyhow::Result<MqttConn> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let qos = qos(target)?;
        let version = version(target)?;
        let id = format!(
            "{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let (mut rd, mut wr) = crate::driver::connect_tcp(target, timeout).await?;

        let mut connect = Connect::new(version, id.as_str());
        connect.keep_alive = KEEP_ALIVE;
        connect.clean_start = true;
        if version.is_v5() {
            connect.properties.maximum_packet_size = Some(MAX_PACKET);
        }
        let mut hello = BytesMut::new();
        hayate_mqtt::encode(&Packet::from(connect), version, &mut hello)?;
        wr.write_all(&hello).await?;

        let mut buf = BytesMut::with_capacity(READ_CHUNK * 2);
        let connack = tokio::time::timeout(timeout, async {
            loop {
                let packet = hayate_mqtt::decode(&mut buf, version, MAX_PACKET)
                    .context("decoding the broker's answer to CONNECT")?;
                if let Some(p) = packet {
                    return anyhow::Ok(p);
                }
                if rd.read_buf(&mut buf).await? == 0 {
                    bail!("connection closed by the broker during CONNECT");
                }
            }
        })
        .await
        .with_context(|| format!("{target}: no CONNACK within {timeout:?}"))?
        .with_context(|| format!("{target}: MQTT {version} CONNECT"))?;
        let Packet::ConnAck(connack) = connack else {
            bail!(
                "{target}: CONNECT answered with {}",
                connack.packet_type().name()
            );
        };
        if connack.reason_code.is_error() {
            bail!(
                "{target}: CONNECT refused: {}{}",
                connack.reason_code,
                connack
                    .properties
                    .reason_string
                    .as_ref()
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default()
            );
        }
        let window = connack
            .properties
            .receive_maximum
            .map_or(WINDOW, |m| WINDOW.min(usize::from(m)));

        let shared = Arc::new(Shared {
            version,
            out: Mutex::new(Out {
                buf: BytesMut::with_capacity(HIGH_WATER),
                used: vec![0; 1 << 10],
                next_id: 1,
                inflight: 0,
                pings: VecDeque::new(),
            }),
            wake: Notify::new(),
            space: Notify::new(),
            acks: Notify::new(),
            closed: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            wrote: AtomicBool::new(false),
            window,
            routes: Mutex::default(),
            subacks: Mutex::default(),
            trouble: Mutex::default(),
            who: name.to_string(),
        });
        let reader = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let e = read_loop(&mut rd, &mut buf, &shared).await;
                if let Err(e) = e
                    && !shared.closing.load(Ordering::Acquire)
                {
                    shared.fail(format!("mqtt: {e:#}"));
                }
                shared.shut();
            })
        };
        let writer = {
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = write_loop(&mut wr, &shared).await
                    && !shared.closing.load(Ordering::Acquire)
                {
                    shared.fail(format!("mqtt write: {e}"));
                }
                shared.shut();
            })
        };
        let keep_alive = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let period = Duration::from_secs(u64::from(KEEP_ALIVE) / 2);
                loop {
                    tokio::time::sleep(period).await;
                    if shared.closed.load(Ordering::Acquire) {
                        return;
                    }
                    if !shared.wrote.swap(false, Ordering::AcqRel) {
                        // Nothing written for half the keep-alive period: PINGREQ.
                        let mut out = lock(&shared.out);
                        out.pings.push_back(None);
                        out.encode(&Packet::PingReq, shared.version);
                        drop(out);
                        shared.wake.notify_one();
                    }
                }
            })
        };
        Ok(MqttConn {
            shared,
            qos,
            tasks: Arc::new(Tasks {
                aborts: vec![
                    reader.abort_handle(),
                    writer.abort_handle(),
                    keep_alive.abort_handle(),
                ],
                reader: Mutex::new(Some(reader)),
            }),
        })
    }

    /// Appends to the write buffer with `f` once there is room (below the high-water mark;
    /// with `qos1`, also a free slot in the in-flight window).
    #[inline]
    async fn write<R>(&self, qos1: bool, f: impl FnOnce(&mut Out) -> R) -> anyhow::Result<R> {
        let s = &*self.shared;
        let mut f = Some(f);
        let space = s.space.notified();
        tokio::pin!(space);
        let acks = s.acks.notified();
        tokio::pin!(acks);
        // Registered for a wake-up: `Some(true)` for the window, `Some(false)` for space.
        let mut registered: Option<bool> = None;
        loop {
            let for_window = {
                // `closed` is checked under the lock (see `Shared::shut`).
                let mut out = lock(&s.out);
                if s.closed.load(Ordering::Acquire) {
                    drop(out);
                    return Err(s.closed_error());
                }
                let full = out.buf.len() >= HIGH_WATER;
                if !full && (!qos1 || out.inflight < s.window) {
                    let was_empty = out.buf.is_empty();
                    let f = f.take().expect("f is called once");
                    let r = f(&mut out);
                    drop(out);
                    // The writer sleeps only after finding the buffer empty.
                    if was_empty {
                        s.wake.notify_one();
                    }
                    return Ok(r);
                }
                !full
            };
            match registered {
                Some(w) if w == for_window => {
                    if w {
                        acks.as_mut().await;
                        acks.set(s.acks.notified());
                    } else {
                        space.as_mut().await;
                        space.set(s.space.notified());
                    }
                    registered = None;
                }
                // Register, then check again: a wake-up between the check and here counts.
                _ => {
                    if for_window {
                        acks.as_mut().enable();
                    } else {
                        space.as_mut().enable();
                    }
                    registered = Some(for_window);
                }
            }
        }
    }

    #[inline]
    pub(crate) async fn publish(&self, topic: &str, payload: Bytes) -> anyhow::Result<()> {
        let version = self.shared.version;
        let qos = self.qos;
        let props = PublishProperties::default();
        self.write(qos == QoS::AtLeastOnce, |out| {
            let packet_id = if qos == QoS::AtLeastOnce {
                let Some(id) = out.alloc_id() else {
                    return Err(anyhow::anyhow!("mqtt: no free packet id"));
                };
                out.inflight += 1;
                Some(id)
            } else {
                None
            };
            let head = PublishHead {
                dup: false,
                qos,
                retain: false,
                topic,
                packet_id,
                properties: &props,
            };
            match hayate_mqtt::encode_publish_head(&head, payload.len(), version, &mut out.buf) {
                Ok(()) => {
                    out.buf.extend_from_slice(&payload);
                    Ok(())
                }
                Err(e) => {
                    if let Some(id) = packet_id {
                        out.free_id(id);
                        out.inflight -= 1;
                    }
                    Err(anyhow::Error::new(e).context(format!("mqtt: PUBLISH to {topic:?}")))
                }
            }
        })
        .await?
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<MqttSub> {
        let (tx, rx) = mpsc::channel(SUB_BATCHES);
        lock(&self.shared.routes).insert(key.to_string(), tx);
        let (ack_tx, ack_rx) = oneshot::channel();
        let version = self.shared.version;
        let qos = self.qos;
        let subacks = &self.shared.subacks;
        self.write(false, |out| {
            let id = out.alloc_id().context("mqtt: no free packet id")?;
            lock(subacks).insert(id, ack_tx);
            let sub = Subscribe::new(id, vec![Subscription::new(key, qos)]);
            out.encode(&Packet::Subscribe(sub), version);
            anyhow::Ok(())
        })
        .await??;
        let codes = match tokio::time::timeout(super::FLUSH_TIMEOUT, ack_rx).await {
            Ok(Ok(codes)) => codes,
            Ok(Err(_)) => return Err(self.shared.closed_error()),
            Err(_) => bail!("mqtt: no SUBACK within {:?}", super::FLUSH_TIMEOUT),
        };
        if let Some(c) = codes.iter().find(|c| c.is_error()) {
            lock(&self.shared.routes).remove(key);
            bail!("mqtt: SUBSCRIBE to {key:?} refused: {c}");
        }
        Ok(MqttSub {
            rx,
            batch: Vec::new().into_iter(),
        })
    }

    /// PINGREQ / PINGRESP (see the module docs).
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        let (tx, rx) = oneshot::channel();
        let version = self.shared.version;
        self.write(false, |out| {
            out.pings.push_back(Some(tx));
            out.encode(&Packet::PingReq, version);
        })
        .await?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.shared.closed_error()),
            Err(_) => bail!("mqtt: no PINGRESP within {timeout:?}"),
        }
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.shared.trouble).clone()
    }

    /// DISCONNECT, then waits for the broker to close the connection (bounded by the
    /// caller's timeout); the tasks stop when the last handle is dropped.
    pub(crate) async fn close(self) {
        let version = self.shared.version;
        let sent = self
            .write(false, |out| {
                let d = Disconnect::new(ReasonCode::NORMAL_DISCONNECTION);
                out.encode(&Packet::Disconnect(d), version);
            })
            .await;
        // After the DISCONNECT is buffered: the writer sends it, then shuts the socket down.
        self.shared.closing.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let reader = lock(&self.tasks.reader).take();
        if let (Ok(()), Some(reader)) = (sent, reader) {
            let _ = reader.await;
        }
    }
}

impl MqttSub {
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(p) = self.batch.next() {
                return Some(p);
            }
            self.batch = self.rx.recv().await?.into_iter();
        }
    }
}

/// Payloads of one read for one topic.
struct Batch {
    topic: ByteStr,
    payloads: Vec<Bytes>,
}

async fn read_loop(rd: &mut OwnedReadHalf, buf: &mut BytesMut, s: &Shared) -> anyhow::Result<()> {
    let version = s.version;
    let mut batches: Vec<Batch> = Vec::new();
    let mut pubacks: Vec<u16> = Vec::new();
    let mut acked: Vec<u16> = Vec::new();
    loop {
        loop {
            let packet = match hayate_mqtt::decode(buf, version, MAX_PACKET) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    bail!("decoding a packet from the broker: {e}");
                }
            };
            match packet {
                Packet::Publish(p) => {
                    match p.qos {
                        QoS::AtMostOnce => {}
                        QoS::AtLeastOnce => pubacks.extend(p.packet_id),
                        QoS::ExactlyOnce => bail!("QoS 2 PUBLISH from the broker (not subscribed)"),
                    }
                    match batches.last_mut() {
                        Some(b) if b.topic == p.topic && b.payloads.len() < MAX_BATCH => {
                            b.payloads.push(p.payload)
                        }
                        _ => batches.push(Batch {
                            topic: p.topic,
                            payloads: vec![p.payload],
                        }),
                    }
                    if batches.len() >= 64 {
                        settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    }
                }
                Packet::PubAck(a) => {
                    if a.reason_code.is_error() {
                        s.fail(format!(
                            "mqtt: PUBLISH refused by the broker: {}",
                            a.reason_code
                        ));
                    }
                    acked.push(a.packet_id);
                }
                Packet::SubAck(a) => {
                    lock(&s.out).free_id(a.packet_id);
                    if let Some(tx) = lock(&s.subacks).remove(&a.packet_id) {
                        let _ = tx.send(a.reason_codes);
                    }
                }
                Packet::UnsubAck(a) => {
                    lock(&s.out).free_id(a.packet_id);
                }
                Packet::PingResp => {
                    if let Some(Some(tx)) = lock(&s.out).pings.pop_front() {
                        let _ = tx.send(());
                    }
                }
                Packet::Disconnect(d) => {
                    settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    bail!(
                        "the broker sent DISCONNECT: {}{}",
                        d.reason_code,
                        d.properties
                            .reason_string
                            .as_ref()
                            .map(|s| format!(": {s}"))
                            .unwrap_or_default()
                    );
                }
                other => bail!("unexpected {} from the broker", other.packet_type().name()),
            }
        }
        settle(s, &mut batches, &mut pubacks, &mut acked).await;
        // Room for the next packet in place when its size is known, else a large read.
        let want = hayate_mqtt::packet_len(buf, version, MAX_PACKET)
            .ok()
            .flatten()
            .map_or(READ_CHUNK, |n| n.saturating_sub(buf.len()).max(READ_CHUNK));
        if buf.capacity() - buf.len() < want {
            buf.reserve(want.max(READ_CHUNK * 2));
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed by the broker");
        }
    }
}

/// After a read's packets are decoded: writes the PUBACKs owed and frees the acknowledged
/// packet ids (one lock), then hands the payloads to their subscriptions.
async fn settle(
    s: &Shared,
    batches: &mut Vec<Batch>,
    pubacks: &mut Vec<u16>,
    acked: &mut Vec<u16>,
) {
    if !pubacks.is_empty() || !acked.is_empty() {
        let mut out = lock(&s.out);
        let was_empty = out.buf.is_empty();
        for id in pubacks.drain(..) {
            out.encode(&Packet::PubAck(Ack::new(id)), s.version);
        }
        let mut freed = 0;
        for id in acked.drain(..) {
            if out.free_id(id) {
                freed += 1;
            }
        }
        out.inflight -= freed.min(out.inflight);
        // Publishers waiting for the window resume once an eighth of it is free (one wake-up
        // per many PUBACKs, not one per PUBACK, yet no stall with a small window).
        let resume = freed > 0 && out.inflight + (s.window / 8).max(1) <= s.window;
        let wrote = was_empty && !out.buf.is_empty();
        drop(out);
        if wrote {
            s.wake.notify_one();
        }
        if resume {
            s.acks.notify_waiters();
        }
    }
    if batches.is_empty() {
        return;
    }
    let txs: Vec<Option<mpsc::Sender<Vec<Bytes>>>> = {
        let routes = lock(&s.routes);
        batches
            .iter()
            .map(|b| routes.get(b.topic.as_str()).cloned())
            .collect()
    };
    for (b, tx) in batches.drain(..).zip(txs) {
        if let Some(tx) = tx {
            // A closed receiver is a subscription given up: drop.
            let _ = tx.send(b.payloads).await;
        }
    }
}

async fn write_loop(wr: &mut OwnedWriteHalf, s: &Shared) -> std::io::Result<()> {
    loop {
        let chunk = {
            let mut out = lock(&s.out);
            if out.buf.is_empty() {
                None
            } else {
                Some(out.buf.split())
            }
        };
        match chunk {
            Some(c) => {
                wr.write_all(&c).await?;
                s.wrote.store(true, Ordering::Relaxed);
                s.space.notify_waiters();
                // Give the buffer back when it is the only reference (reuse the allocation).
                let mut out = lock(&s.out);
                if out.buf.is_empty() {
                    let mut c = c;
                    c.clear();
                    out.buf.unsplit(c);
                }
            }
            None => {
                if s.closed.load(Ordering::Acquire) || s.closing.load(Ordering::Acquire) {
                    // Everything (the DISCONNECT last) is written.
                    let _ = wr.shutdown().await;
                    return Ok(());
                }
                s.wake.notified().await;
            }
        }
    }
}
