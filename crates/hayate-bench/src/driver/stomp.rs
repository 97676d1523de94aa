//! STOMP 1.2 driver (`stomp://HOST:PORT`, default 61613, login guest/guest), a small client
//! over the workspace's own sans-IO codec (`hayate-stomp`); always compiled in (it has no
//! dependency of its own).
//!
//! - Destinations: a key is published to and subscribed at `/topic/<key with / turned into .>`
//!   (RabbitMQ's STOMP plugin maps `/topic/` to the `amq.topic` exchange with that routing
//!   key, as the AMQP driver does).
//! - Subscriptions use `ack:auto` (the best-effort setting, like MQTT QoS 0); each has its own
//!   `id`, and the reader task dispatches MESSAGE frames by their `subscription` header.
//!   [`StompConn::listen`] registers a channel for a subscription id without sending a
//!   SUBSCRIBE: replies to a `reply-to:/temp-queue/<name>` request arrive with
//!   `subscription:/temp-queue/<name>` (RabbitMQ's temp-queue convention, used by the RPC
//!   benchmark).
//! - Writes: frames are encoded into one buffer that a writer task sends with one `write_all`
//!   per batch (like any client's write buffer); a publisher waits while more than
//!   [`HIGH_WATER`] bytes are buffered.
//! - Flush: `BEGIN` then `ABORT` of a transaction with a `receipt` header; the server handles
//!   a connection's frames in order, so the RECEIPT means every frame before it was processed
//!   (a subscription is active).
//! - An ERROR frame from the server is recorded as trouble and fails the point.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_core::sync::lock;
use hayate_stomp::{Command, Frame, Item, Limits, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = concat!("hayate-stomp client ", env!("CARGO_PKG_VERSION"));

/// A publisher waits while more than this many bytes are waiting to be written.
const HIGH_WATER: usize = 1 << 20;
/// Frames a subscription buffers before the reader waits for the consumer.
const SUB_CAPACITY: usize = 64 << 10;

/// The STOMP destination of a key: `/topic/<key with / -> .>`.
pub(crate) fn topic_destination(key: &str) -> String {
    format!("/topic/{}", key.replace('/', "."))
}

struct Shared {
    buf: super::wbuf::WriteBuf,
    subs: Mutex<HashMap<String, mpsc::Sender<Frame>>>,
    receipts: Mutex<HashMap<String, oneshot::Sender<()>>>,
    next_id: AtomicU64,
    server: Mutex<Option<String>>,
}

#[derive(Clone)]
pub(crate) struct StompConn {
    shared: Arc<Shared>,
    tasks: Arc<Vec<tokio::task::AbortHandle>>,
}

pub(crate) struct StompSub(mpsc::Receiver<Frame>);

impl StompConn {
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<StompConn> {
        let (mut rd, mut wr) = crate::driver::connect_tcp(target, timeout).await?;
        let mut buf = BytesMut::with_capacity(64 << 10);
        let connect = Frame::new(Command::Connect)
            .header("accept-version", "1.2")
            .header("host", "/")
            .header("login", "guest")
            .header("passcode", "guest")
            .header("heart-beat", "0,0")
            .header("client-id", name);
        let mut out = BytesMut::new();
        hayate_stomp::encode(&connect, Version::V1_2, &mut out);
        wr.write_all(&out).await?;
        let limits = Limits {
            max_body: 256 << 20,
            ..Limits::default()
        };
        let connected = tokio::time::timeout(timeout, async {
            loop {
                match hayate_stomp::decode(&mut buf, Version::V1_2, &limits)? {
                    Some(Item::Frame(f)) => return anyhow::Ok(f),
                    Some(Item::HeartBeat) => continue,
                    None => {
                        if rd.read_buf(&mut buf).await? == 0 {
                            bail!("{target}: connection closed during CONNECT");
                        }
                    }
                }
            }
        })
        .await
        .with_context(|| format!("{target}: no CONNECTED within {timeout:?}"))??;
        if connected.command != Command::Connected {
            bail!(
                "{target}: CONNECT answered with {}: {}",
                connected.command.as_str(),
                connected.get("message").unwrap_or("")
            );
        }
        let shared = Arc::new(Shared {
            buf: super::wbuf::WriteBuf::new(HIGH_WATER),
            subs: Mutex::default(),
            receipts: Mutex::default(),
            next_id: AtomicU64::new(0),
            server: Mutex::new(connected.get("server").map(str::to_string)),
        });
        let reader = {
            let shared = shared.clone();
            tokio::spawn(async move {
                let e = read_loop(&mut rd, &mut buf, &limits, &shared).await;
                shared.buf.close();
                lock(&shared.subs).clear();
                if let Err(e) = e {
                    shared.buf.fail(format!("stomp: {e:#}"));
                }
            })
        };
        let writer = super::wbuf::spawn_writer(shared.clone(), wr, |s| &s.buf, "stomp");
        Ok(StompConn {
            shared,
            tasks: Arc::new(vec![reader.abort_handle(), writer]),
        })
    }

    /// Appends to the write buffer with `f`, waiting while it is over the high-water mark.
    async fn write(&self, f: impl Fn(&mut BytesMut)) -> anyhow::Result<()> {
        if !self.shared.buf.write(f).await {
            bail!(
                "{}",
                self.trouble()
                    .unwrap_or_else(|| "stomp: connection closed".into())
            );
        }
        Ok(())
    }

    /// SEND to a destination with extra headers.
    pub(crate) async fn send(
        &self,
        destination: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<()> {
        self.write(|out| hayate_stomp::encode_send(destination, headers, body, Version::V1_2, out))
            .await
    }

    /// Registers a channel for MESSAGE frames carrying `subscription:<id>`.
    pub(crate) fn listen(&self, id: &str) -> StompSub {
        let (tx, rx) = mpsc::channel(SUB_CAPACITY);
        lock(&self.shared.subs).insert(id.to_string(), tx);
        StompSub(rx)
    }

    /// SUBSCRIBE to a destination with `ack:auto`.
    pub(crate) async fn subscribe_destination(
        &self,
        destination: &str,
    ) -> anyhow::Result<StompSub> {
        let id = format!("s{}", self.shared.next_id.fetch_add(1, Ordering::Relaxed));
        let sub = self.listen(&id);
        let frame = Frame::new(Command::Subscribe)
            .header("id", &id)
            .header("destination", destination)
            .header("ack", "auto");
        self.write(|out| hayate_stomp::encode(&frame, Version::V1_2, out))
            .await?;
        Ok(sub)
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<StompSub> {
        self.subscribe_destination(&topic_destination(key)).await
    }

    pub(crate) async fn publish(&self, destination: &str, payload: Bytes) -> anyhow::Result<()> {
        self.send(destination, &[], &payload).await
    }

    /// BEGIN + ABORT with a receipt; returns when the RECEIPT arrives.
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        let n = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx_name, receipt) = (format!("flush-{n}"), format!("r{n}"));
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.receipts).insert(receipt.clone(), tx);
        let begin = Frame::new(Command::Begin).header("transaction", &tx_name);
        let abort = Frame::new(Command::Abort)
            .header("transaction", &tx_name)
            .header("receipt", &receipt);
        self.write(|out| {
            hayate_stomp::encode(&begin, Version::V1_2, out);
            hayate_stomp::encode(&abort, Version::V1_2, out);
        })
        .await?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => bail!(
                "{}",
                self.trouble()
                    .unwrap_or_else(|| "stomp: connection closed before the receipt".into())
            ),
            Err(_) => bail!("stomp: no RECEIPT within {timeout:?}"),
        }
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        self.shared.buf.trouble()
    }

    pub(crate) fn server_version(&self) -> Option<String> {
        lock(&self.shared.server).clone()
    }

    /// DISCONNECT with a receipt (waits for it, bounded by the caller's timeout), then stops
    /// the tasks.
    pub(crate) async fn close(self) {
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.receipts).insert("bye".into(), tx);
        let bye = Frame::new(Command::Disconnect).header("receipt", "bye");
        if self
            .write(|out| hayate_stomp::encode(&bye, Version::V1_2, out))
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        for t in self.tasks.iter() {
            t.abort();
        }
    }
}

impl StompSub {
    /// The next MESSAGE frame; `None` when the connection ended.
    pub(crate) async fn next_frame(&mut self) -> Option<Frame> {
        self.0.recv().await
    }

    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv().await.map(|f| f.body)
    }
}

async fn read_loop(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
    limits: &Limits,
    shared: &Shared,
) -> anyhow::Result<()> {
    loop {
        while let Some(item) = hayate_stomp::decode(buf, Version::V1_2, limits)? {
            let Item::Frame(frame) = item else { continue };
            match frame.command {
                Command::Message => {
                    let tx = frame
                        .get("subscription")
                        .and_then(|id| lock(&shared.subs).get(id).cloned());
                    if let Some(tx) = tx {
                        // The consumer is gone: drop (the point has ended).
                        let _ = tx.send(frame).await;
                    }
                }
                Command::Receipt => {
                    let tx = frame
                        .get("receipt-id")
                        .and_then(|id| lock(&shared.receipts).remove(id));
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                    }
                }
                Command::Error => {
                    bail!(
                        "ERROR from the server: {} {}",
                        frame.get("message").unwrap_or(""),
                        String::from_utf8_lossy(&frame.body[..frame.body.len().min(200)])
                    );
                }
                other => bail!("unexpected {} frame from the server", other.as_str()),
            }
        }
        if buf.capacity() - buf.len() < 16 << 10 {
            buf.reserve(64 << 10);
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed by the server");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations() {
        assert_eq!(topic_destination("bench/1-0/thr"), "/topic/bench.1-0.thr");
    }
}
