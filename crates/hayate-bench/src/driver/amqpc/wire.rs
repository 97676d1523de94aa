//! The wire of the AMQP client: the handshake (connection and channel [`CHANNEL`] open),
//! a publication's frames, and the assembly of deliveries from their frames. Used by the
//! pub/sub connection and by the RPC ends.

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_amqp::frame::PROTOCOL_HEADER;
use hayate_amqp::{ContentHeader, FieldTable, Frame, FrameDecoder, Method, ShortStr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{CHANNEL, Delivery, FRAME_MAX};
use crate::target::Target;

/// Reads frames until `want` says one is the answer.
async fn expect(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
    buf: &mut BytesMut,
    dec: &FrameDecoder,
    what: &str,
) -> anyhow::Result<Method> {
    loop {
        if let Some(f) = dec.decode(buf)? {
            match f {
                Frame::Method(
                    _,
                    Method::ConnectionClose {
                        reply_code,
                        reply_text,
                        ..
                    },
                ) => bail!("connection.close {reply_code} {reply_text} (waiting for {what})"),
                Frame::Method(_, m) => return Ok(m),
                _ => continue,
            }
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed waiting for {what}");
        }
    }
}

pub(super) fn frame(m: Method, channel: u16) -> BytesMut {
    let mut b = BytesMut::new();
    Frame::Method(channel, m).encode(&mut b);
    b
}

/// A connection after its handshake (channel [`CHANNEL`] open), before any task runs.
pub(super) struct Opened {
    pub(super) rd: tokio::net::tcp::OwnedReadHalf,
    pub(super) wr: tokio::net::tcp::OwnedWriteHalf,
    /// What was read past the handshake.
    pub(super) buf: BytesMut,
    pub(super) frame_max: u32,
    pub(super) server: Option<String>,
}

/// Connects to `target`, logs in (guest/guest) and opens channel [`CHANNEL`].
pub(super) async fn open(target: &Target, timeout: Duration) -> anyhow::Result<Opened> {
    let (mut rd, mut wr) = crate::driver::connect_tcp(target, timeout).await?;
    let mut buf = BytesMut::with_capacity(64 << 10);
    let dec = FrameDecoder::new(FRAME_MAX);
    let server = tokio::time::timeout(timeout, async {
        wr.write_all(&PROTOCOL_HEADER).await?;
        let start = expect(&mut rd, &mut buf, &dec, "connection.start").await?;
        let server = match &start {
            Method::ConnectionStart {
                server_properties, ..
            } => server_properties
                .get("version")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            m => bail!("expected connection.start, got {}", m.name()),
        };
        let ok = Method::ConnectionStartOk {
            client_properties: FieldTable::default(),
            mechanism: ShortStr::lit("PLAIN"),
            response: Bytes::from_static(b"\0guest\0guest"),
            locale: ShortStr::lit("en_US"),
        };
        wr.write_all(&frame(ok, 0)).await?;
        let (channel_max, frame_max) = match expect(&mut rd, &mut buf, &dec, "tune").await? {
            Method::ConnectionTune {
                channel_max,
                frame_max,
                ..
            } => (channel_max, frame_max),
            m => bail!("expected connection.tune, got {}", m.name()),
        };
        let fm = if frame_max == 0 {
            FRAME_MAX
        } else {
            frame_max.min(FRAME_MAX)
        };
        let mut out = frame(
            Method::ConnectionTuneOk {
                channel_max: channel_max.min(8),
                frame_max: fm,
                heartbeat: 0,
            },
            0,
        );
        out.extend_from_slice(&frame(
            Method::ConnectionOpen {
                virtual_host: ShortStr::lit("/"),
                capabilities: ShortStr::lit(""),
                insist: false,
            },
            0,
        ));
        out.extend_from_slice(&frame(
            Method::ChannelOpen {
                out_of_band: ShortStr::lit(""),
            },
            CHANNEL,
        ));
        wr.write_all(&out).await?;
        for what in ["connection.open-ok", "channel.open-ok"] {
            expect(&mut rd, &mut buf, &dec, what).await?;
        }
        anyhow::Ok((server, fm))
    })
    .await
    .with_context(|| format!("{target}: no AMQP handshake within {timeout:?}"))??;
    let (server, frame_max) = server;
    Ok(Opened {
        rd,
        wr,
        buf,
        frame_max,
        server,
    })
}

/// Appends a basic.publish of `payload` to `exchange` with `routing_key` and `props`: the
/// method, the content header and the body in frames of at most `frame_max` bytes.
pub(super) fn encode_publish(
    exchange: &ShortStr,
    routing_key: &ShortStr,
    props: &hayate_amqp::BasicProperties,
    payload: &[u8],
    frame_max: usize,
    out: &mut BytesMut,
) {
    Frame::Method(
        CHANNEL,
        Method::BasicPublish {
            ticket: 0,
            exchange: exchange.clone(),
            routing_key: routing_key.clone(),
            mandatory: false,
            immediate: false,
        },
    )
    .encode(out);
    Frame::Header(
        CHANNEL,
        Box::new(ContentHeader {
            body_size: payload.len() as u64,
            properties: props.clone(),
        }),
    )
    .encode(out);
    for part in payload.chunks(frame_max.saturating_sub(8).max(1)) {
        Frame::encode_body(CHANNEL, part, out);
    }
}

/// A delivery being received: its consumer, body size, properties and what came so far.
pub(super) struct Incoming {
    pub(super) tag: Bytes,
    pub(super) delivery_tag: u64,
    size: u64,
    body: BytesMut,
    pub(super) reply_to: Option<ShortStr>,
    pub(super) correlation_id: Option<ShortStr>,
}

impl Incoming {
    pub(super) fn done(self, body: Bytes) -> Delivery {
        Delivery {
            body,
            reply_to: self.reply_to,
            correlation_id: self.correlation_id,
        }
    }
}

/// Puts deliveries back together from their frames: basic.deliver, the content header,
/// then body frames up to the size the header announced.
#[derive(Default)]
pub(super) struct Assembly(Option<Incoming>);

/// What a frame made of the delivery being put together.
pub(super) enum Assembled {
    /// A complete delivery and its body.
    Delivery(Incoming, Bytes),
    /// Part of one (or content of none): nothing to do yet.
    Partial,
    /// A frame that is no part of a delivery.
    Other(Frame),
}

impl Assembly {
    pub(super) fn frame(&mut self, f: Frame) -> Assembled {
        match f {
            Frame::Method(
                _,
                Method::BasicDeliver {
                    consumer_tag,
                    delivery_tag,
                    ..
                },
            ) => {
                self.0 = Some(Incoming {
                    tag: consumer_tag.bytes().clone(),
                    delivery_tag,
                    size: 0,
                    body: BytesMut::new(),
                    reply_to: None,
                    correlation_id: None,
                });
                Assembled::Partial
            }
            Frame::Header(_, h) => {
                let Some(i) = &mut self.0 else {
                    return Assembled::Partial;
                };
                let h = *h;
                i.size = h.body_size;
                i.reply_to = h.properties.reply_to;
                i.correlation_id = h.properties.correlation_id;
                if i.size == 0 {
                    return self.done(Bytes::new());
                }
                Assembled::Partial
            }
            Frame::Body(_, b) => {
                let Some(i) = &mut self.0 else {
                    return Assembled::Partial;
                };
                if i.body.is_empty() && b.len() as u64 >= i.size {
                    return self.done(b);
                }
                i.body.extend_from_slice(&b);
                if (i.body.len() as u64) < i.size {
                    return Assembled::Partial;
                }
                let body = std::mem::take(&mut i.body).freeze();
                self.done(body)
            }
            other => Assembled::Other(other),
        }
    }

    fn done(&mut self, body: Bytes) -> Assembled {
        match self.0.take() {
            Some(i) => Assembled::Delivery(i, body),
            None => Assembled::Partial,
        }
    }
}
