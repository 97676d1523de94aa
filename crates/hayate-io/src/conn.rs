//! The connection driver: one lifecycle for every protocol's server side.
//!
//! A protocol's server side (the broker's native, MQTT and STOMP front-ends, the client
//! library's peer-to-peer server) is a [`Handler`]: it decodes frames, handles them and says
//! when its timer is due. Its output is an [`Outgoing`] queue (the broker's `Outbox`). The
//! driver owns what they share: attach the queue to the transport and run its writer task
//! ([`Conn::new`]), decode and handle *every* complete frame of a read before reading again,
//! let the handler flush what the read produced from this task ([`Handler::flush`]), then
//! wait for the next read, the handler's timer, an event of the handler's own (an MQTT session
//! takeover, a peer request's reply), the writer's end or shutdown ([`Conn::drive`]); at the
//! end let the writer flush and stop ([`Conn::close`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::busy::BusyPoll;
use crate::memory::{Charge, Memory};
use crate::transport::{Reader, Writer, read_some, write_chunks};

/// The output queue the driver writes from, and what its writer takes (hayate-flow).
pub use hayate_flow::outgoing::{Outgoing, Taken};

/// [`Outgoing`]'s back-pressure half, type-erased for the driver.
trait Pressure: Send + Sync {
    fn backed_up(&self) -> bool;
    fn drained(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl<O: Outgoing> Pressure for O {
    fn backed_up(&self) -> bool {
        Outgoing::backed_up(self)
    }
    fn drained(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(Outgoing::drained(self))
    }
}

/// Why the driver stopped on its own (not because the handler said so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The peer closed its side (end of stream).
    Eof,
    /// Reading failed.
    Io,
    /// The writer task ended (the peer stopped taking data, a write failed, or the
    /// connection was cut off as a slow consumer).
    WriterGone,
    /// The server is shutting down.
    Shutdown,
    /// The broker-wide memory budget had no room for the rest of a frame larger than the
    /// connection's free input allowance for longer than its wait (see [`InputBudget`]).
    Memory,
}

/// A connection's read buffer: its start size and the free space kept before each read, for
/// every protocol's server side and the client library's connections.
pub const READ_BUF: usize = 64 * 1024;

/// Unhandled input a connection may hold without charging the memory budget: frames up to
/// this size never wait for it.
pub const FREE_INPUT: usize = 256 * 1024;

/// How a connection's input draws on the broker-wide memory budget: input past
/// [`FREE_INPUT`] (the part of a large frame read so far) is charged before it is read.
/// When the budget has no room, the connection is not read (its sender is slowed by TCP
/// back-pressure); after `wait` without room it is ended ([`Stop::Memory`]).
#[derive(Debug, Clone)]
pub struct InputBudget {
    /// The pool charged.
    pub memory: Arc<Memory>,
    /// Longest a connection waits for room with a frame half read (`None`: forever).
    pub wait: Option<Duration>,
}

impl Default for InputBudget {
    fn default() -> Self {
        InputBudget {
            memory: Memory::unlimited(),
            wait: None,
        }
    }
}

/// A protocol's server side, as the driver sees it.
pub trait Handler {
    /// One decoded frame (packet).
    type Frame;
    /// Why the connection ends; what the protocol's closing code gets.
    type End;

    /// Decodes one frame from the front of `buf`; `Ok(None)` when more input is needed (or
    /// the handler holds further input back: see [`Handler::read_limit`]).
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Frame>, Self::End>;

    /// Handles one frame; `Err` ends the connection.
    fn handle(&mut self, frame: Self::Frame) -> impl Future<Output = Result<(), Self::End>> + Send;

    /// Handles `frame` without a future when it needs no wait: `Ok(None)` when done, or a
    /// frame (this one, or what is left of its work) for [`Handler::handle`]. A frame's
    /// future is as large as the deepest path it may take (kilobytes), and each one made is
    /// moved into its caller's; the common frames skip that here. By default every frame
    /// goes to [`Handler::handle`].
    fn handle_now(&mut self, frame: Self::Frame) -> Result<Option<Self::Frame>, Self::End> {
        Ok(Some(frame))
    }

    /// Called after the frames of a read are handled: send what they produced now, from
    /// this task (the broker's inline flush).
    fn flush(&mut self);

    /// How much to read next: `None` whatever arrives (see `hayate_native::ReadPlanner` for
    /// a planned size), `Some(0)` nothing for now (the handler holds input back until one
    /// of its events; back-pressure on a pipelining peer).
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

    /// An event of the handler's own, from outside the connection: `Ok` once handled (a
    /// peer request answered), `Err` when it ends the connection (an MQTT session taken
    /// over by another connection). Never, by default.
    fn event(&mut self) -> impl Future<Output = Result<(), Self::End>> + Send {
        std::future::pending()
    }

    /// The driver stopped for `why`.
    fn stopped(&mut self, why: Stop) -> Self::End;
}

/// What ended one wait of the driver.
enum Woke<E> {
    Read(std::io::Result<usize>),
    Timer,
    Event(Result<(), E>),
    /// The peer read some of its backed-up output.
    Drained,
    /// Time to look for room in the memory budget again.
    Retry,
    WriterGone,
    Shutdown,
}

/// What a server hands a protocol's `serve` for one accepted connection: the transport's
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
    /// The client's address (TCP), for authentication throttling and logs.
    pub peer: Option<std::net::SocketAddr>,
    /// A name the transport vouches for (the subject CN of a verified TLS client
    /// certificate, when the server maps certificates to users).
    pub verified_name: Option<String>,
    /// What the connection's input draws on.
    pub budget: InputBudget,
    /// Its entry among the server's live connections (admin API), removed when dropped:
    /// the protocol's `serve` keeps it until the connection ends.
    pub registered: Option<crate::registry::ConnGuard>,
    /// Its listener's traffic totals, which its session counts in.
    pub class: Option<std::sync::Arc<crate::traffic::TrafficClass>>,
}

impl Accepted {
    /// A connection on `reader` and `writer`, without busy-polling.
    pub fn new(reader: Reader, writer: Writer, shutdown: watch::Receiver<bool>) -> Accepted {
        Accepted {
            reader,
            writer,
            shutdown,
            busy: None,
            peer: None,
            verified_name: None,
            budget: InputBudget::default(),
            registered: None,
            class: None,
        }
    }

    /// Takes the registry entry out (the caller keeps it for the connection's life) and
    /// returns the entry to fill in.
    pub fn take_registered(
        &mut self,
    ) -> (
        Option<crate::registry::ConnGuard>,
        Option<std::sync::Arc<crate::registry::ConnEntry>>,
    ) {
        let g = self.registered.take();
        let e = g.as_ref().map(|g| g.entry().clone());
        (g, e)
    }
}

/// One connection's I/O while a handler serves it: the transport's read half and read
/// buffer, the output queue's writer task, the server's shutdown signal and busy-polling
/// handle.
pub struct Conn {
    reader: Reader,
    buf: BytesMut,
    writer_task: JoinHandle<()>,
    shutdown: watch::Receiver<bool>,
    busy: Option<BusyPoll>,
    out: Arc<dyn Pressure>,
    input: Charge,
    wait: Option<Duration>,
}

impl Conn {
    /// Attaches `out` to the connection's transport: inline flushes write to its write half
    /// and a writer task drains the rest. `buf` may already hold input read during a
    /// handshake.
    pub fn new<O: Outgoing>(io: Accepted, buf: BytesMut, out: &Arc<O>) -> Conn {
        out.set_sink(io.writer.clone());
        let writer_task = tokio::spawn(write_loop(io.writer.clone(), out.clone(), out.epoch()));
        Conn {
            writer_task,
            reader: io.reader,
            buf,
            shutdown: io.shutdown,
            busy: io.busy,
            out: out.clone(),
            input: Charge::new(&io.budget.memory),
            wait: io.budget.wait,
        }
    }

    /// Runs the connection: decodes and handles input until the handler, the peer, the
    /// writer or shutdown ends it; returns why.
    pub async fn drive<H: Handler>(&mut self, h: &mut H) -> H::End {
        drive(h, self).await
    }

    /// True once the writer task has ended.
    pub fn writer_done(&self) -> bool {
        self.writer_task.is_finished()
    }

    /// Closes `out` and gives the writer up to 5 s to flush what is queued (a last error
    /// frame included) and shut the transport down.
    pub async fn close<O: Outgoing>(self, out: &O) -> Reader {
        out.close();
        self.finish().await
    }

    /// Gives the writer up to 5 s to end (after a detach, which ends it); returns the read
    /// half (for a linger read).
    pub async fn finish(self) -> Reader {
        finish_writer(self.writer_task).await;
        self.reader
    }
}

async fn drive<H: Handler>(h: &mut H, c: &mut Conn) -> H::End {
    let Conn {
        reader,
        buf,
        writer_task,
        shutdown,
        busy,
        out,
        input,
        wait,
    } = c;
    let mut starved_since: Option<Instant> = None;
    // One timer for the connection, moved only when the handler's deadline changes (a timer
    // registered per read would cost more than the read).
    let timer = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(timer);
    let mut armed: Option<Instant> = None;
    // One wait for shutdown for the connection's life: made afresh per read, it would join
    // and leave the waiters of the watch every connection shares (two locks per read).
    let shut = shutdown.changed();
    tokio::pin!(shut);
    loop {
        // Decode and handle every complete frame before reading again.
        if let Err(end) = handle_buffered(h, buf).await {
            return end;
        }
        // Send what this read produced now, from this task, where the sockets can take it.
        h.flush();
        // A peer that does not read its own answers is not read either (whatever the
        // protocol): its output stays within the queue's budget.
        let backed_up = out.backed_up();
        let mut limit = if backed_up {
            Some(0)
        } else {
            h.read_limit(buf)
        };
        // Input past the free allowance is read only as far as the memory budget covers it.
        input.shrink(buf.len().saturating_sub(FREE_INPUT));
        let mut starved = false;
        if limit != Some(0) {
            let room = |input: &Charge| (FREE_INPUT + input.bytes()).saturating_sub(buf.len());
            if room(input) < READ_AHEAD {
                // A full read ahead if the pool has it, else whatever a small read needs:
                // a frame a few KiB short of complete must not wait for 64 KiB of room.
                let _ = input.cover((buf.len() + READ_AHEAD).saturating_sub(FREE_INPUT))
                    || input.cover((buf.len() + SMALL_READ).saturating_sub(FREE_INPUT));
            }
            let r = room(input);
            if r == 0 {
                starved = true;
                limit = Some(0);
            } else {
                limit = Some(limit.map_or(r, |l| l.min(r)));
            }
        }
        if starved {
            let since = *starved_since.get_or_insert_with(Instant::now);
            if wait.is_some_and(|w| since.elapsed() >= w) {
                return h.stopped(Stop::Memory);
            }
        } else {
            starved_since = None;
        }
        let deadline = h.deadline();
        if deadline != armed {
            if let Some(at) = deadline {
                timer.as_mut().reset(at);
            }
            armed = deadline;
        }
        let woke = tokio::select! {
            r = read_some(reader, buf, limit, busy.as_ref()), if limit != Some(0) => Woke::Read(r),
            () = &mut timer, if armed.is_some() => Woke::Timer,
            () = async { out.drained().await }, if backed_up => Woke::Drained,
            // Lazily: select! evaluates every branch's expression, disabled or not, and a
            // `sleep` made per read costs a clock read per read.
            () = async { tokio::time::sleep(RETRY).await }, if starved => Woke::Retry,
            e = h.event() => Woke::Event(e),
            _ = &mut *writer_task => Woke::WriterGone,
            _ = &mut shut => Woke::Shutdown,
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
            Woke::Event(Ok(())) | Woke::Drained | Woke::Retry => {}
            Woke::Event(Err(end)) => {
                // What the peer sent before the event is handled first: an MQTT client's
                // DISCONNECT just ahead of its own new connection taking the session over
                // must count. Only input already at hand: one read that does not wait.
                if limit != Some(0) {
                    let mut read = std::pin::pin!(read_some(reader, buf, limit, None));
                    let _ = read.as_mut().poll(&mut Context::from_waker(Waker::noop()));
                }
                return handle_buffered(h, buf).await.err().unwrap_or(end);
            }
            Woke::WriterGone => return h.stopped(Stop::WriterGone),
            Woke::Shutdown => return h.stopped(Stop::Shutdown),
        }
    }
}

/// What one read may bring before the budget is asked for more room.
const READ_AHEAD: usize = 64 * 1024;

/// The least a read asks the budget room for when it cannot have [`READ_AHEAD`].
const SMALL_READ: usize = 4 * 1024;

/// How often a connection waiting for room in the memory budget looks again.
const RETRY: Duration = Duration::from_millis(5);

/// Decodes and handles every complete frame in `buf`.
async fn handle_buffered<H: Handler>(h: &mut H, buf: &mut BytesMut) -> Result<(), H::End> {
    while let Some(frame) = h.decode(buf)? {
        if let Some(frame) = h.handle_now(frame)? {
            h.handle(frame).await?;
        }
    }
    Ok(())
}

/// Gives the writer task up to 5 s to end.
async fn finish_writer(writer_task: JoinHandle<()>) {
    if !writer_task.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), writer_task).await;
    }
}

/// Drains `out` into `w` until it closes or is detached from this connection (its epoch
/// changes), then shuts the transport's write side down.
async fn write_loop<O: Outgoing>(w: Writer, out: Arc<O>, epoch: u64) {
    let mut q = VecDeque::new();
    loop {
        match out.take(&mut q, epoch).await {
            Taken::Data => {
                // A write that cannot finish (a peer that does not read) ends when the
                // connection is cut off as a slow consumer.
                let r = tokio::select! {
                    r = write_chunks(&*w, &mut q) => r,
                    () = out.cut_off() => Err(std::io::ErrorKind::TimedOut.into()),
                };
                out.release(epoch);
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
