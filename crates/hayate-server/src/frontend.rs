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

use std::sync::Arc;

use bytes::BytesMut;
use hayate_broker::{Outbox, Session};
use hayate_io::conn;
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

pub use hayate_io::conn::Accepted;
pub(crate) use hayate_io::conn::Stop;

/// A protocol front-end of the broker, as the driver sees it: hayate-io's
/// [`conn::Handler`] with a broker [`Session`], whose deliveries are flushed after every read,
/// and events that only ever end the connection.
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

/// A front-end [`Handler`] as hayate-io's driver takes it.
struct Driven<'a, H>(&'a mut H);

impl<H: Handler + Send> conn::Handler for Driven<'_, H>
where
    H::Frame: Send,
    H::End: Send,
{
    type Frame = H::Frame;
    type End = H::End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<H::Frame>, H::End> {
        self.0.decode(buf)
    }

    fn handle(&mut self, frame: H::Frame) -> impl Future<Output = Result<(), H::End>> + Send {
        self.0.handle(frame)
    }

    fn flush(&mut self) {
        self.0.session().flush();
    }

    fn read_limit(&mut self, buf: &mut BytesMut) -> Option<usize> {
        self.0.read_limit(buf)
    }

    fn on_read(&mut self) {
        self.0.on_read();
    }

    fn deadline(&self) -> Option<Instant> {
        self.0.deadline()
    }

    fn on_timer(&mut self) -> impl Future<Output = Result<(), H::End>> + Send {
        self.0.on_timer()
    }

    async fn event(&mut self) -> Result<(), H::End> {
        Err(self.0.event().await)
    }

    fn stopped(&mut self, why: Stop) -> H::End {
        self.0.stopped(why)
    }
}

/// One connection's I/O while a front-end serves it (hayate-io's [`conn::Conn`]).
pub(crate) struct Conn(conn::Conn);

impl Conn {
    /// Attaches `outbox` to the connection's transport; `buf` may already hold input read
    /// during a handshake.
    pub(crate) fn new(io: Accepted, buf: BytesMut, outbox: &Arc<Outbox>) -> Conn {
        Conn(conn::Conn::new(io, buf, outbox))
    }

    /// Runs the connection until the handler, the peer, the writer or shutdown ends it;
    /// returns why.
    pub(crate) async fn drive<H: Handler + Send>(&mut self, h: &mut H) -> H::End
    where
        H::Frame: Send,
        H::End: Send,
    {
        self.0.drive(&mut Driven(h)).await
    }

    /// True once the writer task has ended.
    pub(crate) fn writer_done(&self) -> bool {
        self.0.writer_done()
    }

    /// Closes `outbox` and lets the writer flush (up to 5 s).
    pub(crate) async fn close(self, outbox: &Outbox) {
        self.0.close(outbox).await;
    }

    /// Gives the writer up to 5 s to end (after a detach, which ends it).
    pub(crate) async fn finish(self) {
        self.0.finish().await;
    }
}
