//! The front-end layer: one connection driver for every protocol.
//!
//! A protocol front-end (native, MQTT, STOMP) is a [`Handler`]: it decodes frames, handles
//! them against its broker [`Session`] and says when its timers are due. The driver owns the
//! lifecycle they share: attach the session's outbox to the transport and run its writer
//! task ([`attach`]), decode and handle *every* complete frame of a read before reading again,
//! flush what the read produced from this task ([`Session::flush`]), then wait for the next
//! read, the handler's timer, an outside event (an MQTT session takeover), the writer's end
//! or shutdown ([`drive`]); and at the end let the writer flush and stop ([`close`]).
//! Each protocol's own code is its handshake, its frame handling and its translation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use hayate_broker::{Outbox, Session, Taken};
use hayate_io::busy::BusyPoll;
use hayate_io::transport::{Reader, Writer, read_some, write_chunks};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A connection's subscriptions as its protocol names them (an MQTT filter, a STOMP
/// subscription id), each with the broker subscription id it was given. Set the protocol's
/// options for a subscription before `Session::subscribe` (a delivery may arrive as soon as
/// the broker knows it), bind the name after it succeeded.
#[derive(Debug, Default)]
pub(crate) struct SubTable {
    ids: std::collections::HashMap<String, u32>,
    next: u32,
}

impl SubTable {
    /// The broker subscription id of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Whether `name` is subscribed.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.ids.contains_key(name)
    }

    /// A broker subscription id not used yet on this connection.
    pub(crate) fn next_sid(&mut self) -> u32 {
        self.next = self.next.max(1);
        let sid = self.next;
        self.next += 1;
        sid
    }

    /// Binds `name` to `sid` (a restored subscription may bring its own id).
    pub(crate) fn bind(&mut self, name: String, sid: u32) {
        self.next = self.next.max(sid.saturating_add(1));
        self.ids.insert(name, sid);
    }

    /// Unbinds `name`; returns its broker subscription id.
    pub(crate) fn remove(&mut self, name: &str) -> Option<u32> {
        self.ids.remove(name)
    }
}

/// Why the driver stopped on its own (not because the handler said so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The peer closed its side (end of stream).
    Eof,
    /// Reading failed.
    Io,
    /// The writer task ended (the peer stopped taking data, a write failed, or the broker
    /// cut the connection off as a slow consumer).
    WriterGone,
    /// The server is shutting down.
    Shutdown,
}

/// A protocol front-end, as the driver sees it.
pub(crate) trait Handler {
    /// One decoded frame (packet).
    type Frame;
    /// Why the connection ends; what the front-end's closing code gets.
    type End;

    /// Decodes one frame from the front of `buf`; `Ok(None)` when more input is needed.
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Frame>, Self::End>;

    /// Handles one frame; `Err` ends the connection.
    fn handle(&mut self, frame: Self::Frame) -> impl Future<Output = Result<(), Self::End>> + Send;

    /// The session whose deliveries are flushed after every read.
    fn session(&mut self) -> &mut Session;

    /// How much to read next (`None`: whatever arrives; see `hayate_native::ReadPlanner`).
    fn read_limit(&mut self, _buf: &mut BytesMut) -> Option<usize> {
        None
    }

    /// A read brought input (keep-alive timers restart here).
    fn on_read(&mut self) {}

    /// When [`Handler::on_timer`] is due next (`None`: no timer).
    fn deadline(&self) -> Option<Instant> {
        None
    }

    /// The deadline passed; `Err` ends the connection.
    fn on_timer(&mut self) -> impl Future<Output = Result<(), Self::End>> + Send {
        async { Ok(()) }
    }

    /// An event from outside the connection that ends it (an MQTT session taken over by
    /// another connection); never by default.
    fn event(&mut self) -> impl Future<Output = Self::End> + Send {
        std::future::pending()
    }

    /// The driver stopped for `why`.
    fn stopped(&mut self, why: Stop) -> Self::End;
}

/// What ended one wait of the driver.
enum Woke<E> {
    Read(std::io::Result<usize>),
    Timer,
    Event(E),
    WriterGone,
    Shutdown,
}

/// What the server hands a protocol's `serve` for one accepted connection: the transport's
/// halves, the server's shutdown signal and its busy-polling handle (when that mode is on).
pub struct Accepted {
    /// The read half.
    pub reader: Reader,
    /// The write half.
    pub writer: Writer,
    /// Changes when the server shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// Busy-polling: reads note their input here.
    pub busy: Option<BusyPoll>,
}

impl Accepted {
    /// A connection on `reader` and `writer`, without busy-polling.
    pub fn new(reader: Reader, writer: Writer, shutdown: watch::Receiver<bool>) -> Accepted {
        Accepted {
            reader,
            writer,
            shutdown,
            busy: None,
        }
    }
}

/// One connection's I/O while a handler serves it: the transport's read half and read
/// buffer, the session's writer task, the server's shutdown signal and busy-polling handle.
pub(crate) struct Conn {
    reader: Reader,
    buf: BytesMut,
    writer_task: JoinHandle<()>,
    shutdown: watch::Receiver<bool>,
    busy: Option<BusyPoll>,
}

impl Conn {
    /// Attaches `outbox` to the connection's transport (see [`attach`]); `buf` may already
    /// hold input read during a handshake.
    pub(crate) fn new(io: Accepted, buf: BytesMut, outbox: &Arc<Outbox>) -> Conn {
        Conn {
            writer_task: attach(outbox, &io.writer),
            reader: io.reader,
            buf,
            shutdown: io.shutdown,
            busy: io.busy,
        }
    }

    /// Runs the connection: decodes and handles input until the handler, the peer, the
    /// writer or shutdown ends it; returns why.
    pub(crate) async fn drive<H: Handler>(&mut self, h: &mut H) -> H::End {
        drive(h, self).await
    }

    /// True once the writer task has ended.
    pub(crate) fn writer_done(&self) -> bool {
        self.writer_task.is_finished()
    }

    /// Closes `outbox` and lets the writer flush (see [`close`]).
    pub(crate) async fn close(self, outbox: &Outbox) {
        close(outbox, self.writer_task).await;
    }

    /// Gives the writer up to 5 s to end (after a detach, which ends it).
    pub(crate) async fn finish(self) {
        finish_writer(self.writer_task).await;
    }
}

async fn drive<H: Handler>(h: &mut H, c: &mut Conn) -> H::End {
    let Conn {
        reader,
        buf,
        writer_task,
        shutdown,
        busy,
    } = c;
    // One timer for the connection, moved only when the handler's deadline changes (a timer
    // registered per read would cost more than the read).
    let timer = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    loop {
        // Decode and handle every complete frame before reading again.
        loop {
            match h.decode(buf) {
                Ok(Some(frame)) => {
                    if let Err(end) = h.handle(frame).await {
                        return end;
                    }
                }
                Ok(None) => break,
                Err(end) => return end,
            }
        }
        // Send what this read produced now, from this task, where the sockets can take it.
        h.session().flush();
        let limit = h.read_limit(buf);
        let deadline = h.deadline();
        if deadline != armed {
            if let Some(at) = deadline {
                timer.as_mut().reset(at);
            }
            armed = deadline;
        }
        let woke = tokio::select! {
            r = read_some(reader, buf, limit, busy.as_ref()) => Woke::Read(r),
            () = &mut timer, if armed.is_some() => Woke::Timer,
            e = h.event() => Woke::Event(e),
            _ = &mut *writer_task => Woke::WriterGone,
            _ = shutdown.changed() => Woke::Shutdown,
        };
        match woke {
            Woke::Read(Ok(0)) => return h.stopped(Stop::Eof),
            Woke::Read(Ok(_)) => h.on_read(),
            Woke::Read(Err(_)) => return h.stopped(Stop::Io),
            Woke::Timer => {
                // Fired: re-armed by the next deadline, even if it is the same instant.
                armed = None;
                if let Err(end) = h.on_timer().await {
                    return end;
                }
            }
            Woke::Event(end) => {
                // What the peer sent before the event is handled first: an MQTT client's
                // DISCONNECT just ahead of its own new connection taking the session over
                // must count. Only input already at hand: one read that does not wait.
                {
                    let mut read = std::pin::pin!(read_some(reader, buf, limit, None));
                    let _ = read
                        .as_mut()
                        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
                }
                loop {
                    match h.decode(buf) {
                        Ok(Some(frame)) => {
                            if let Err(first) = h.handle(frame).await {
                                return first;
                            }
                        }
                        Ok(None) => return end,
                        Err(first) => return first,
                    }
                }
            }
            Woke::WriterGone => return h.stopped(Stop::WriterGone),
            Woke::Shutdown => return h.stopped(Stop::Shutdown),
        }
    }
}

/// Attaches `outbox` to the connection's transport: inline flushes write to `writer`, and a
/// writer task drains the rest. Returns the writer task.
fn attach(outbox: &Arc<Outbox>, writer: &Writer) -> JoinHandle<()> {
    outbox.set_sink(writer.clone());
    tokio::spawn(write_loop(writer.clone(), outbox.clone(), outbox.epoch()))
}

/// Closes `outbox` and gives the writer up to 5 s to flush what is queued (a last error
/// frame included) and shut the transport down.
async fn close(outbox: &Outbox, writer_task: JoinHandle<()>) {
    outbox.close();
    finish_writer(writer_task).await;
}

/// Gives the writer task up to 5 s to end.
async fn finish_writer(writer_task: JoinHandle<()>) {
    if !writer_task.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
    }
}

/// Drains `outbox` into `w` until the outbox closes or is detached from this connection
/// (its epoch changes), then shuts the transport's write side down.
async fn write_loop(w: Writer, outbox: Arc<Outbox>, epoch: u64) {
    let mut q = VecDeque::new();
    loop {
        match outbox.take(&mut q, epoch).await {
            Taken::Data => {
                // A write that cannot finish (a client that does not read) ends when the
                // broker cuts the connection off as a slow consumer.
                let r = tokio::select! {
                    r = write_chunks(&*w, &mut q) => r,
                    _ = outbox.cut_off() => Err(std::io::ErrorKind::TimedOut.into()),
                };
                outbox.release(epoch);
                if r.is_err() {
                    // The reader sees this task end and ends the connection.
                    return;
                }
            }
            Taken::Closed => {
                w.shutdown();
                return;
            }
        }
    }
}
