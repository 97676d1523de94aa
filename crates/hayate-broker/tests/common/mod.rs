//! Test helpers: a recording encoder, a fake socket, a writer and timing assertions.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hayate_broker::{Batch, Broker, Encoder, OutBuf, Outbox, Session, Taken};
use hayate_core::{Key, KeyExpr, Message};
use hayate_flow::Sink;

/// What the recording encoder saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    /// One delivered item.
    Msg {
        sid: u32,
        key: String,
        payload: Bytes,
    },
    /// A report of `count` messages lost for `sid`.
    Lost { sid: u32, count: u64 },
}

/// The shared log of one session's encoder.
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Ev>>>);

impl Log {
    pub fn events(&self) -> Vec<Ev> {
        self.0.lock().unwrap().clone()
    }

    /// Payloads of the delivered items, as text, in order.
    pub fn payloads(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Msg { payload, .. } => Some(String::from_utf8(payload.to_vec()).unwrap()),
                Ev::Lost { .. } => None,
            })
            .collect()
    }

    /// (sid, key, payload) of the delivered items, in order.
    pub fn deliveries(&self) -> Vec<(u32, String, String)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Msg { sid, key, payload } => {
                    Some((sid, key, String::from_utf8(payload.to_vec()).unwrap()))
                }
                Ev::Lost { .. } => None,
            })
            .collect()
    }

    /// The loss reports, in order.
    pub fn lost(&self) -> Vec<(u32, u64)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Lost { sid, count } => Some((sid, count)),
                Ev::Msg { .. } => None,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// Records every delivery and writes its payload (and a `<lost sid n>` marker per loss
/// report) into the outbox, so byte budgets and byte order are exercised.
#[derive(Debug)]
pub struct Recorder {
    pub log: Log,
}

impl Encoder for Recorder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, out: &mut OutBuf) {
        for i in 0..batch.len() {
            let m = batch.message(i);
            out.put_payload(&m.payload);
            self.log.0.lock().unwrap().push(Ev::Msg {
                sid,
                key: m.key.as_str().to_string(),
                payload: m.payload,
            });
        }
    }

    fn encode_lost(&mut self, sid: u32, count: u64, out: &mut OutBuf) {
        out.tail()
            .extend_from_slice(lost_marker(sid, count).as_bytes());
        self.log.0.lock().unwrap().push(Ev::Lost { sid, count });
    }
}

/// The bytes [`Recorder`] writes for a loss report.
pub fn lost_marker(sid: u32, count: u64) -> String {
    format!("<lost {sid} {count}>")
}

/// Opens a session with a recording encoder.
pub fn open(broker: &Broker) -> (Session, Log) {
    let log = Log::default();
    let s = broker.open_session(Box::new(Recorder { log: log.clone() }));
    (s, log)
}

pub fn key(s: &str) -> Key {
    Key::new(s).unwrap()
}

pub fn expr(s: &str) -> KeyExpr {
    KeyExpr::new(s).unwrap()
}

pub fn msg(k: &str, payload: impl Into<Bytes>) -> Message {
    Message::new(key(k), payload)
}

/// A payload of `n` copies of `c`.
pub fn fill(c: char, n: usize) -> String {
    std::iter::repeat_n(c, n).collect()
}

/// Publishes one message with `payload` on `k`; returns the number of deliveries.
pub async fn publish(s: &mut Session, k: &str, payload: impl Into<Bytes>) -> usize {
    let m = msg(k, payload);
    within(s.publish(Batch::One(&m))).await
}

/// Awaits `f`, failing the test if it takes more than a second.
pub async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(1), f)
        .await
        .expect("did not complete within 1s")
}

/// Polls `f` for a while and fails the test if it completes.
pub async fn assert_pending<F: Future + Unpin>(f: &mut F)
where
    F::Output: std::fmt::Debug,
{
    if let Ok(v) = tokio::time::timeout(Duration::from_millis(100), f).await {
        panic!("expected to be pending, completed with {v:?}");
    }
}

/// Takes everything queued in `outbox` (current epoch), as a writer would, and releases it.
pub async fn drain(outbox: &Outbox) -> Vec<u8> {
    let epoch = outbox.epoch();
    let mut q = VecDeque::new();
    assert_eq!(within(outbox.take(&mut q, epoch)).await, Taken::Data);
    outbox.release(epoch);
    concat(&q)
}

/// The bytes of a chunk queue, in order.
pub fn concat(q: &VecDeque<Bytes>) -> Vec<u8> {
    q.iter().flat_map(|b| b.iter().copied()).collect()
}

/// A writer task: takes and "writes" everything until the outbox is closed (or detached);
/// returns all bytes in order.
pub fn spawn_writer(outbox: Arc<Outbox>) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let epoch = outbox.epoch();
        let mut q = VecDeque::new();
        let mut all = Vec::new();
        while outbox.take(&mut q, epoch).await == Taken::Data {
            all.extend(concat(&q));
            q.clear();
            outbox.release(epoch);
        }
        all
    })
}

/// How a [`FakeSink`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkMode {
    /// Takes up to `per_call` bytes per call while it has credit, then `WouldBlock`.
    Accept,
    /// Fails with a broken-pipe error.
    Fail,
    /// Returns `Ok(0)` (a closed socket).
    Zero,
}

/// A non-blocking socket that records what it was given.
pub struct FakeSink {
    pub written: Mutex<Vec<u8>>,
    pub per_call: usize,
    /// Bytes it takes before answering `WouldBlock`.
    pub credit: Mutex<usize>,
    pub mode: Mutex<SinkMode>,
    pub calls: AtomicUsize,
    /// Runs once, inside the first write (as another thread queueing output meanwhile).
    pub during_write: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl FakeSink {
    pub fn new(per_call: usize, credit: usize) -> Arc<FakeSink> {
        Arc::new(FakeSink {
            written: Mutex::new(Vec::new()),
            per_call,
            credit: Mutex::new(credit),
            mode: Mutex::new(SinkMode::Accept),
            calls: AtomicUsize::new(0),
            during_write: Mutex::new(None),
        })
    }

    pub fn written(&self) -> Vec<u8> {
        self.written.lock().unwrap().clone()
    }

    pub fn set_mode(&self, m: SinkMode) {
        *self.mode.lock().unwrap() = m;
    }

    pub fn set_credit(&self, c: usize) {
        *self.credit.lock().unwrap() = c;
    }

    pub fn on_first_write(&self, f: impl FnOnce() + Send + 'static) {
        *self.during_write.lock().unwrap() = Some(Box::new(f));
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for FakeSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeSink")
            .field("per_call", &self.per_call)
            .field("calls", &self.calls)
            .finish_non_exhaustive()
    }
}

impl Sink for FakeSink {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hook = self.during_write.lock().unwrap().take();
        if let Some(f) = hook {
            f();
        }
        match *self.mode.lock().unwrap() {
            SinkMode::Fail => return Err(io::Error::from(io::ErrorKind::BrokenPipe)),
            SinkMode::Zero => return Ok(0),
            SinkMode::Accept => {}
        }
        let mut credit = self.credit.lock().unwrap();
        if *credit == 0 {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let mut room = self.per_call.min(*credit);
        let mut out = self.written.lock().unwrap();
        let mut n = 0;
        for b in bufs {
            if room == 0 {
                break;
            }
            let k = b.len().min(room);
            out.extend_from_slice(&b[..k]);
            room -= k;
            n += k;
        }
        *credit -= n;
        Ok(n)
    }
}
