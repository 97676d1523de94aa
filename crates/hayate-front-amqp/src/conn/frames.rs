//! Frames: the connection driver's side of a connection ([`Driven`]: decoding, timers and
//! heartbeats), what each frame leads to ([`Conn::frame_now`], [`Conn::later`]), and the
//! dispatch of a channel's methods to their class's handler ([`Conn::method`]).

use std::time::Duration;

use bytes::BytesMut;
use hayate_amqp::frame::{ProtocolHeader, decode_protocol_header};
use hayate_amqp::method as class;
use hayate_amqp::{Frame, FrameDecoder, Method, ReplyCode};
use hayate_broker::{Batch, Session};
use tokio::time::Instant;

use super::error::{AmqpError, End, decode_error, err, not_client};
use super::{Conn, Stage};
use hayate_front::{Handler, Stop};

/// What the decoder produces, and what handling a frame may leave for its future.
#[derive(Debug)]
pub(crate) enum Item {
    Header,
    Frame(Frame),
    Later(Later),
}

/// What a frame leaves to wait for ([`Conn::frame_now`] does the rest without a future):
/// the larger, rarer paths.
#[derive(Debug)]
pub(crate) enum Later {
    /// A method of channel 0.
    ConnectionMethod(Method),
    /// A channel's method other than basic.publish, ack, nack and reject.
    ChannelMethod(u16, Method),
    /// channel.close (`true`: with its close-ok sent) or close-ok on a closing channel:
    /// its consumers and unacknowledged messages released.
    Release(u16, bool),
    /// A message whole on a channel in confirm mode or a transaction, or mandatory.
    Complete(u16),
    /// A publish whose deliveries found a full outbox or a queue group: the rest of them.
    Rest(Box<Rest>),
}

/// [`Later::Rest`]: the deliveries left, the message, and the content bytes it holds.
#[derive(Debug)]
pub(crate) struct Rest {
    pub(super) rest: hayate_broker::PublishRest,
    pub(super) msg: hayate_core::Message,
    pub(super) held: usize,
}

/// How long, after connection.close-ok, the broker waits for the client to close the
/// socket before it closes it. The client that asked to close is the one to close the
/// socket (RabbitMQ waits up to 30 s): a client that reads close-ok and the broker's end of
/// the stream together may take its own close for a broken connection (lapin logs it as an
/// error). Kept short, so that a client that never closes holds its connection only briefly.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// The front-end as the connection driver sees it.
pub(super) struct Driven<'a> {
    pub(super) c: Conn<'a>,
    pub(super) session: Session,
    pub(super) decoder: FrameDecoder,
    /// Until open: the handshake deadline; then the client's heartbeat deadline.
    pub(super) quiet: Instant,
    pub(super) beat: Option<Instant>,
    pub(super) last_read: Instant,
}

impl Driven<'_> {
    /// After each frame handled: the stage's timers and frame size.
    fn handled(&mut self) {
        let c = &mut self.c;
        if c.stage == Stage::Closed {
            // Until the client closes the socket, at most CLOSE_LINGER; no heartbeats.
            self.quiet = self.quiet.min(Instant::now() + CLOSE_LINGER);
            self.beat = None;
            return;
        }
        if c.stage == Stage::Ready && self.beat.is_none() {
            let now = Instant::now();
            if let Some(hb) = c.heartbeat {
                self.beat = Some(now + hb / 2);
                self.quiet = now + hb * 2;
            } else {
                self.quiet = now + Duration::from_secs(86_400 * 365);
            }
            // A sentinel: the heartbeat timers are set.
            self.beat
                .get_or_insert(now + Duration::from_secs(86_400 * 365));
        }
        if let Some(fm) = c.stage_frame_max() {
            self.decoder.set_max_frame(fm);
        }
    }
}

impl Handler for Driven<'_> {
    type Frame = Item;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, End> {
        if self.c.stage == Stage::Closed {
            buf.clear();
            return Ok(None);
        }
        if self.c.stage == Stage::Header {
            return match decode_protocol_header(buf) {
                None => Ok(None),
                Some(ProtocolHeader::Amqp091) => Ok(Some(Item::Header)),
                Some(ProtocolHeader::Other) => Err(End::BadHeader),
            };
        }
        match self.decoder.decode(buf) {
            Ok(f) => Ok(f.map(Item::Frame)),
            Err(e) => Err(End::Hard(decode_error(&e))),
        }
    }

    async fn handle(&mut self, item: Item) -> Result<(), End> {
        let (c, session) = (&mut self.c, &mut self.session);
        match item {
            Item::Header => c.start(session),
            Item::Frame(f) => {
                if let Some(l) = c.frame_now(f, session)? {
                    c.later(l, session).await?;
                }
            }
            Item::Later(l) => c.later(l, session).await?,
        }
        self.handled();
        Ok(())
    }

    fn handle_now(&mut self, item: Item) -> Result<Option<Item>, End> {
        let Item::Frame(f) = item else {
            return Ok(Some(item));
        };
        match self.c.frame_now(f, &mut self.session)? {
            Some(l) => Ok(Some(Item::Later(l))),
            None => {
                self.handled();
                Ok(None)
            }
        }
    }

    fn flush(&mut self) {
        self.c.send_confirms(&mut self.session);
        self.c.check_blocked(&mut self.session);
        self.session.flush();
    }

    fn on_read(&mut self) {
        self.last_read = Instant::now();
    }

    fn deadline(&self) -> Option<Instant> {
        Some(self.beat.map_or(self.quiet, |b| b.min(self.quiet)))
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        let now = Instant::now();
        if self.c.stage != Stage::Ready {
            if now >= self.quiet {
                return Err(End::Done);
            }
            return Ok(());
        }
        if let Some(hb) = self.c.heartbeat {
            if self.last_read + hb * 2 > self.quiet {
                self.quiet = self.last_read + hb * 2;
            }
            if now >= self.quiet {
                tracing::debug!(conn = self.c.id, "amqp: missed heartbeats");
                return Err(End::Done);
            }
            if self.beat.is_some_and(|b| now >= b) {
                self.beat = Some(now + hb / 2);
                self.session
                    .outbox()
                    .push_control_unbudgeted(|b| Frame::Heartbeat.encode(b));
            }
        }
        Ok(())
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Shutdown => End::Hard(err(ReplyCode::ConnectionForced, "broker shutdown")),
            Stop::Memory => End::Hard(err(
                ReplyCode::ResourceError,
                "the broker's memory budget is spent",
            )),
            Stop::Eof | Stop::Io | Stop::WriterGone => End::Done,
        }
    }
}

impl Conn<'_> {
    /// Handles `f` as far as it goes without waiting (see `Handler::handle_now`): every
    /// content frame, basic.publish, ack, nack and reject, channel.open, and a publish that
    /// every subscriber takes at once. What is left is for [`Conn::later`].
    pub(super) fn frame_now(
        &mut self,
        f: Frame,
        session: &mut Session,
    ) -> Result<Option<Later>, End> {
        let ch = f.channel();
        match f {
            Frame::Heartbeat => Ok(None),
            Frame::Method(0, m) => Ok(Some(Later::ConnectionMethod(m))),
            _ if self.stage != Stage::Ready => Err(End::Hard(err(
                ReplyCode::CommandInvalid,
                "the connection is not open yet",
            ))),
            _ if ch > self.channel_max => Err(End::Hard(err(
                ReplyCode::ChannelError,
                format!(
                    "channel {ch} is out of range (channel_max {})",
                    self.channel_max
                ),
            ))),
            Frame::Method(ch, m) => self.channel_method(ch, m, session),
            Frame::Header(ch, h) => {
                let c = self.content_header(ch, h)?;
                self.content_done(ch, c, session)
            }
            Frame::Body(ch, b) => {
                let c = self.content_body(ch, b)?;
                self.content_done(ch, c, session)
            }
        }
    }

    /// What [`Conn::frame_now`] left: the paths that may wait.
    pub(super) async fn later(&mut self, l: Later, session: &mut Session) -> Result<(), End> {
        match l {
            // Rare, and its future is large: on the heap.
            Later::ConnectionMethod(m) => Box::pin(self.connection_method(m, session)).await,
            Later::ChannelMethod(ch, m) => {
                // The other methods are rarer and some wait: their larger future goes on
                // the heap too.
                let r = Box::pin(self.method(ch, &m, session)).await;
                self.method_done(ch, &m, r, session)
            }
            Later::Release(ch, close_ok) => {
                self.release_channel(ch, session).await;
                if close_ok {
                    self.send(session, ch, Method::ChannelCloseOk {});
                }
                Ok(())
            }
            Later::Complete(ch) => self.complete(ch, session).await,
            Later::Rest(r) => {
                let Rest { rest, msg, held } = *r;
                session.publish_rest(rest, Batch::One(&msg)).await;
                self.release_held(held);
                Ok(())
            }
        }
    }

    /// The outcome of channel method `m`: a hard error closes the connection, a soft one
    /// the channel.
    pub(super) fn method_done(
        &mut self,
        ch: u16,
        m: &Method,
        r: Result<(), AmqpError>,
        session: &mut Session,
    ) -> Result<(), End> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.code.is_hard() => Err(End::Hard(e.on(m))),
            Err(e) => {
                self.soft_close(ch, e.on(m), session);
                Ok(())
            }
        }
    }

    /// A channel's method that [`Conn::channel_method`] left: to its class's handler.
    pub(super) async fn method(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m.ids().0 {
            class::CHANNEL => self.channel_class(ch, m, session).await,
            class::EXCHANGE => self.exchange_class(ch, m, session),
            class::QUEUE => self.queue_class(ch, m, session).await,
            class::BASIC => self.basic_class(ch, m, session),
            class::CONFIRM => self.confirm_class(ch, m, session),
            class::TX => self.tx_class(ch, m, session).await,
            _ => Err(not_client(m)),
        }
    }
}
