//! MQTT driver (`mqtt://HOST:PORT`, default 1883), a small client over the workspace's own
//! sans-IO codec (`hayate-mqtt`); always compiled in (it has no dependency of its own). The
//! default for `mqtt://` targets; `?client=rumqttc` selects the `rumqttc` driver instead
//! (feature `peers`).
//!
//! - MQTT 3.1.1 by default, `?version=5` for MQTT 5.0. Clean session (`?session=persistent`:
//!   a persistent one, which the broker keeps after the run: 60 s in 5.0, for ever in 3.1.1),
//!   keep alive 60 s (a
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
//!
//! # Layout
//! - this module: the settings, the target's parameters, and the state that a connection's
//!   handles and tasks share (`Shared`, with the write buffer and packet ids, `Out`);
//! - `conn`: [`MqttConn`] (connect, publish, subscribe, flush, close) and [`MqttSub`];
//! - `reader`: the reader task: decoding, PUBACKs owed, payloads handed to subscriptions;
//! - `writer`: the writer task.

/// The read half of the connection (TCP, or WebSocket with `?transport=ws`).
type Rd = Box<dyn tokio::io::AsyncRead + Unpin + Send>;
/// The write half.
type Wr = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use bytes::{Bytes, BytesMut};
use hayate_core::sync::lock;
use hayate_mqtt::{Packet, ProtocolVersion, QoS, ReasonCode};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::target::Target;

mod conn;
mod reader;
mod writer;

pub(crate) use conn::{MqttConn, MqttSub};

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
