//! [`MqttConn`]: connecting, publishing, subscribing, flushing and closing; [`MqttSub`]: the
//! payloads of one subscription.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_core::sync::lock;
use hayate_mqtt::{
    ConnAck, Connect, Disconnect, Packet, ProtocolVersion, PublishHead, PublishProperties, QoS,
    ReasonCode, Subscribe, Subscription,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};

use super::reader::read_loop;
use super::writer::write_loop;
use super::{
    HIGH_WATER, KEEP_ALIVE, MAX_PACKET, Out, READ_CHUNK, SUB_BATCHES, Shared, Tasks, WINDOW, qos,
    version,
};
use crate::target::Target;

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
        let (mut rd, mut wr) = open(target, timeout).await?;
        let connect = connect_packet(target, version, &id)?;
        let mut buf = BytesMut::with_capacity(READ_CHUNK * 2);
        let connack = handshake(&mut rd, &mut wr, &mut buf, connect, target, timeout).await?;
        let window = connack
            .properties
            .receive_maximum
            .map_or(WINDOW, |m| WINDOW.min(usize::from(m)));
        let shared = Arc::new(Shared::new(version, window, name));
        let tasks = spawn_tasks(&shared, rd, wr, buf);
        Ok(MqttConn {
            shared,
            qos,
            tasks: Arc::new(tasks),
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
        let codes = match tokio::time::timeout(crate::driver::FLUSH_TIMEOUT, ack_rx).await {
            Ok(Ok(codes)) => codes,
            Ok(Err(_)) => return Err(self.shared.closed_error()),
            Err(_) => bail!("mqtt: no SUBACK within {:?}", crate::driver::FLUSH_TIMEOUT),
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
                let mut d = Disconnect::new(ReasonCode::NORMAL_DISCONNECTION);
                if version.is_v5() {
                    // Ends a persistent session too (expiry 0 now).
                    d.properties.session_expiry_interval = Some(0);
                }
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

/// The connection to the broker, by `?transport=` (tcp, ws or tls).
async fn open(target: &Target, timeout: Duration) -> anyhow::Result<(super::Rd, super::Wr)> {
    Ok(match target.param("transport") {
        None | Some("tcp") => {
            let (r, w) = crate::driver::connect_tcp(target, timeout).await?;
            (Box::new(r), Box::new(w))
        }
        Some("ws") => {
            let (r, w) = crate::driver::connect_tcp(target, timeout).await?;
            let stream = r.reunite(w)?;
            let path = target.param("path").unwrap_or("/mqtt");
            let (r, w) = crate::driver::ws::connect(stream, &target.host, path).await?;
            (Box::new(r), Box::new(w))
        }
        Some("tls") => {
            let ca = target
                .param("ca")
                .context("mqtt: transport=tls needs ca=FILE (the server's CA, PEM)")?;
            let (r, w) = crate::driver::connect_tls(target, ca, timeout).await?;
            (Box::new(r), Box::new(w))
        }
        Some(t) => bail!("mqtt: unknown transport {t:?} (tcp, ws or tls)"),
    })
}

/// The CONNECT of client `id`, with the session `?session=` asks for.
fn connect_packet(target: &Target, version: ProtocolVersion, id: &str) -> anyhow::Result<Connect> {
    let mut connect = Connect::new(version, id);
    connect.keep_alive = KEEP_ALIVE;
    // `?session=persistent`: a persistent session (clean start off; 5.0: expiry 60 s),
    // so that the broker keeps (and, with a journal, stores) its QoS 1 deliveries.
    let persistent = match target.param("session").unwrap_or("clean") {
        "clean" => false,
        "persistent" => true,
        s => bail!("mqtt: session={s} is not supported (clean or persistent)"),
    };
    if persistent && !version.is_v5() {
        // A 3.1.1 session cannot be ended by its DISCONNECT: the broker would keep every
        // connection's session (and queue later points' messages into it).
        bail!("mqtt: session=persistent needs version=5");
    }
    connect.clean_start = !persistent;
    if version.is_v5() {
        connect.properties.maximum_packet_size = Some(MAX_PACKET);
        if persistent {
            connect.properties.session_expiry_interval = Some(60);
        }
    }
    Ok(connect)
}

/// Sends `connect` and waits for the broker's CONNACK (within `timeout`), failing if it
/// refuses; what was read past the CONNACK stays in `buf`.
async fn handshake(
    rd: &mut super::Rd,
    wr: &mut super::Wr,
    buf: &mut BytesMut,
    connect: Connect,
    target: &Target,
    timeout: Duration,
) -> anyhow::Result<Box<ConnAck>> {
    let version = connect.protocol_version;
    let mut hello = BytesMut::new();
    hayate_mqtt::encode(&Packet::from(connect), version, &mut hello)?;
    wr.write_all(&hello).await?;
    wr.flush().await?;

    let connack = tokio::time::timeout(timeout, async {
        loop {
            let packet = hayate_mqtt::decode(buf, version, MAX_PACKET)
                .context("decoding the broker's answer to CONNECT")?;
            if let Some(p) = packet {
                return anyhow::Ok(p);
            }
            if rd.read_buf(buf).await? == 0 {
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
    Ok(connack)
}

impl Shared {
    /// The state of a connection just accepted, with the in-flight `window` its CONNACK
    /// allows.
    fn new(version: ProtocolVersion, window: usize, who: &str) -> Shared {
        Shared {
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
            who: who.to_string(),
        }
    }
}

/// The connection's tasks: the reader (from what `buf` already holds on), the writer, and
/// the keep-alive, which sends a PINGREQ after half the keep-alive period without a write.
fn spawn_tasks(
    shared: &Arc<Shared>,
    mut rd: super::Rd,
    mut wr: super::Wr,
    mut buf: BytesMut,
) -> Tasks {
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
    Tasks {
        aborts: vec![
            reader.abort_handle(),
            writer.abort_handle(),
            keep_alive.abort_handle(),
        ],
        reader: Mutex::new(Some(reader)),
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
