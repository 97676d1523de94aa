//! The fixed header, and [`decode`] / [`encode`] for whole packets.

use bytes::{BufMut, Bytes, BytesMut};

use crate::ack::Ack;
use crate::connect::{ConnAck, Connect};
use crate::disconnect::{Auth, Disconnect};
use crate::error::{DecodeError, EncodeError};
use crate::packet::Packet;
use crate::publish::Publish;
use crate::subscribe::{SubAck, Subscribe, UnsubAck, Unsubscribe};
use crate::types::{PacketType, ProtocolVersion};
use crate::wire::{MAX_VAR_INT, Reader, put_var_int, var_int, var_int_len};

/// The largest packet MQTT can express: a 5-byte fixed header and a remaining length of
/// 268,435,455. Pass it as `max_packet_size` for "no limit of my own".
pub const MAX_PACKET_SIZE: u32 = 1 + 4 + MAX_VAR_INT;

/// What the fixed header says.
#[derive(Debug, Clone, Copy)]
struct FixedHeader {
    packet: PacketType,
    /// The low nibble of the first byte.
    flags: u8,
    /// Bytes of the fixed header: 2 to 5.
    header_len: usize,
    /// The remaining length: bytes of the packet after the fixed header.
    remaining: usize,
}

impl FixedHeader {
    fn size(&self) -> usize {
        self.header_len + self.remaining
    }
}

/// Checks the first byte: a packet type that exists in `version`, and the flags it
/// requires.
fn check_first_byte(first: u8, version: ProtocolVersion) -> Result<PacketType, DecodeError> {
    let packet = match PacketType::from_u8(first >> 4) {
        Some(PacketType::Auth) if !version.is_v5() => {
            return Err(DecodeError::ReservedPacketType(15));
        }
        Some(packet) => packet,
        None => return Err(DecodeError::ReservedPacketType(first >> 4)),
    };
    let flags = first & 0x0F;
    let ok = match packet.fixed_flags() {
        None => {
            // PUBLISH: QoS 3 is malformed, and DUP must be 0 for QoS 0.
            let qos = (flags >> 1) & 0b11;
            if qos == 3 {
                return Err(DecodeError::InvalidQoS(PacketType::Publish));
            }
            !(qos == 0 && flags & 0b1000 != 0)
        }
        // MQTT 3.1 set DUP on retransmitted PUBREL, SUBSCRIBE and UNSUBSCRIBE.
        Some(0b0010) if version == ProtocolVersion::V3_1 => flags & 0b0111 == 0b0010,
        Some(required) => flags == required,
    };
    if ok {
        Ok(packet)
    } else {
        Err(DecodeError::InvalidFlags { packet, flags })
    }
}

/// Reads and checks the fixed header at the front of `buf`: `Ok(None)` until it is
/// complete. Rejects a packet above `max_packet_size` here, before its body arrives.
fn fixed_header(
    buf: &[u8],
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    let packet = check_first_byte(first, version)?;
    let Some((remaining, n)) = var_int(&buf[1..])? else {
        return Ok(None);
    };
    let header = FixedHeader {
        packet,
        flags: first & 0x0F,
        header_len: 1 + n,
        remaining: remaining as usize,
    };
    let size = header.size() as u64;
    if size > u64::from(max_packet_size) {
        return Err(DecodeError::PacketTooLarge {
            size,
            max: max_packet_size,
        });
    }
    Ok(Some(header))
}

/// The size of the packet at the front of `buf`, once its fixed header is buffered:
/// `Ok(None)` before that. Checks what the fixed header allows to check (packet type,
/// flags, the size against `max_packet_size`).
///
/// A reader can use it to make room for a large packet before reading its body, so that
/// the packet is read in place.
pub fn packet_len(
    buf: &[u8],
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<usize>, DecodeError> {
    Ok(fixed_header(buf, version, max_packet_size)?.map(|h| h.size()))
}

/// Decodes the packet at the front of `buf`.
///
/// - `Ok(None)`: the packet is not complete yet; `buf` is untouched. Read more and call
///   again.
/// - `Ok(Some(packet))`: exactly one packet was consumed from `buf`. A PUBLISH's topic,
///   property values and payload are zero-copy slices of `buf`'s memory; every other
///   packet owns its bytes, so that what a session keeps from it (a will, a filter, a
///   client identifier) does not keep the read buffer alive.
/// - `Err(e)`: the bytes are not a valid packet; `buf` is left as it was. The connection
///   must be closed, after a DISCONNECT with [`e.reason_code()`](DecodeError::reason_code)
///   in 5.0 (or a CONNACK, if the error is in the CONNECT).
///
/// `version` is the protocol version of the connection. A CONNECT is decoded whatever
/// `version` is, since it carries its own: a server can pass any version until the CONNECT
/// arrives, then use its [`Connect::protocol_version`] (or use [`decode_connect`]).
///
/// A packet larger than `max_packet_size` bytes (fixed header included) is an error as
/// soon as the fixed header is buffered. Use [`MAX_PACKET_SIZE`] for no limit of your own.
///
/// Call it in a loop until it returns `Ok(None)`: one read may hold many packets.
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<Packet>, DecodeError> {
    let Some(raw) = split(buf, version, max_packet_size)? else {
        return Ok(None);
    };
    match raw.parse(version) {
        Ok(packet) => Ok(Some(packet)),
        Err(e) => {
            // Put the packet back: an error consumes nothing. (A copy, but only on an
            // error, after which the connection is closed.)
            let mut whole = BytesMut::with_capacity(raw.frame.len() + buf.len());
            whole.extend_from_slice(&raw.frame);
            whole.extend_from_slice(buf);
            *buf = whole;
            Err(e)
        }
    }
}

/// A whole packet split off a read buffer by [`split`], not parsed yet: what a server hands
/// from its decoding loop to its packet handling (a few words, where a [`Packet`] is a
/// few hundred bytes), to be parsed there with [`RawPacket::parse`].
#[derive(Debug, Clone)]
pub struct RawPacket {
    frame: Bytes,
    header: FixedHeader,
}

impl RawPacket {
    /// The packet type (from the fixed header, already checked).
    pub fn packet_type(&self) -> PacketType {
        self.header.packet
    }

    /// Parses the packet, as [`decode`] does (a PUBLISH's topic, property values and
    /// payload are zero-copy slices of the packet's bytes). An error means the connection
    /// must be closed, as with [`decode`].
    pub fn parse(&self, version: ProtocolVersion) -> Result<Packet, DecodeError> {
        parse(&self.frame, &self.header, version)
    }
}

/// Splits the packet at the front of `buf` off without parsing its body: `Ok(None)` until
/// it is complete (`buf` untouched). The fixed header is checked as [`decode`] checks it
/// (packet type, flags, size against `max_packet_size`); the body is checked by
/// [`RawPacket::parse`]. [`decode`] is `split` then `parse`.
///
/// ```
/// use bytes::BytesMut;
/// use hayate_mqtt::{MAX_PACKET_SIZE, Packet, ProtocolVersion, split};
///
/// let mut buf = BytesMut::from(&b"\x30\x05\x00\x01ahi\xc0\x00"[..]); // PUBLISH, PINGREQ
/// let raw = split(&mut buf, ProtocolVersion::V3_1_1, MAX_PACKET_SIZE).unwrap().unwrap();
/// let Packet::Publish(p) = raw.parse(ProtocolVersion::V3_1_1).unwrap() else { panic!() };
/// assert_eq!((p.topic.as_str(), &p.payload[..]), ("a", &b"hi"[..]));
/// assert_eq!(buf.len(), 2);
/// ```
pub fn split(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<RawPacket>, DecodeError> {
    let Some(header) = fixed_header(buf, version, max_packet_size)? else {
        return Ok(None);
    };
    if buf.len() < header.size() {
        return Ok(None);
    }
    Ok(Some(RawPacket {
        frame: buf.split_to(header.size()).freeze(),
        header,
    }))
}

/// Decodes the first packet of a connection on the server side, which must be a CONNECT:
/// like [`decode`], but any other packet is [`DecodeError::ExpectedConnect`], reported as
/// soon as the first byte is buffered.
///
/// ```
/// use bytes::BytesMut;
/// use hayate_mqtt::{DecodeError, MAX_PACKET_SIZE, ProtocolVersion, decode_connect};
///
/// // A 3.1.1 CONNECT: client "a", clean session, keep-alive 60 s.
/// let mut buf = BytesMut::from(&b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"[..]);
/// let connect = decode_connect(&mut buf, MAX_PACKET_SIZE).unwrap().unwrap();
/// assert_eq!(connect.protocol_version, ProtocolVersion::V3_1_1);
/// assert_eq!(connect.client_id, "a");
///
/// let mut buf = BytesMut::from(&b"\xc0"[..]); // PINGREQ
/// assert!(matches!(decode_connect(&mut buf, MAX_PACKET_SIZE), Err(DecodeError::ExpectedConnect(_))));
/// ```
pub fn decode_connect(
    buf: &mut BytesMut,
    max_packet_size: u32,
) -> Result<Option<Connect>, DecodeError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    match PacketType::from_u8(first >> 4) {
        Some(PacketType::Connect) => {}
        Some(other) => return Err(DecodeError::ExpectedConnect(other)),
        None => return Err(DecodeError::ReservedPacketType(first >> 4)),
    }
    match decode(buf, ProtocolVersion::V5, max_packet_size)? {
        Some(Packet::Connect(connect)) => Ok(Some(*connect)),
        Some(other) => Err(DecodeError::ExpectedConnect(other.packet_type())),
        None => Ok(None),
    }
}

/// Parses a whole packet; `frame` is the fixed header and the body.
fn parse(frame: &Bytes, h: &FixedHeader, version: ProtocolVersion) -> Result<Packet, DecodeError> {
    let body = frame.slice(h.header_len..);
    let zero_copy = h.packet == PacketType::Publish;
    let r = &mut Reader::new(body, h.packet, zero_copy);
    let packet = match h.packet {
        PacketType::Connect => Packet::Connect(Box::new(Connect::decode(r)?)),
        PacketType::ConnAck => Packet::ConnAck(Box::new(ConnAck::decode(r, version)?)),
        PacketType::Publish => Packet::Publish(Publish::decode(r, h.flags, version)?),
        PacketType::PubAck => Packet::PubAck(Ack::decode(r, h.packet, version)?),
        PacketType::PubRec => Packet::PubRec(Ack::decode(r, h.packet, version)?),
        PacketType::PubRel => Packet::PubRel(Ack::decode(r, h.packet, version)?),
        PacketType::PubComp => Packet::PubComp(Ack::decode(r, h.packet, version)?),
        PacketType::Subscribe => Packet::Subscribe(Subscribe::decode(r, version)?),
        PacketType::SubAck => Packet::SubAck(SubAck::decode(r, version)?),
        PacketType::Unsubscribe => Packet::Unsubscribe(Unsubscribe::decode(r, version)?),
        PacketType::UnsubAck => Packet::UnsubAck(UnsubAck::decode(r, version)?),
        PacketType::PingReq => Packet::PingReq,
        PacketType::PingResp => Packet::PingResp,
        PacketType::Disconnect => Packet::Disconnect(Disconnect::decode(r, version)?),
        PacketType::Auth => Packet::Auth(Auth::decode(r, version)?),
    };
    r.finish()?;
    Ok(packet)
}

/// The first byte and the body size of `packet` in `version`; checks everything.
fn plan(packet: &Packet, version: ProtocolVersion) -> Result<(u8, usize), EncodeError> {
    let t = packet.packet_type();
    let flags = match packet {
        Packet::Publish(p) => p.head().flags(),
        _ => t.fixed_flags().unwrap_or(0),
    };
    let body = match packet {
        Packet::Connect(p) => p.body_len()?,
        Packet::ConnAck(p) => p.body_len(version)?,
        Packet::Publish(p) => p.body_len(version)?,
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => {
            p.body_len(t, version)?
        }
        Packet::Subscribe(p) => p.body_len(version)?,
        Packet::SubAck(p) => p.body_len(version)?,
        Packet::Unsubscribe(p) => p.body_len(version)?,
        Packet::UnsubAck(p) => p.body_len(version)?,
        Packet::PingReq | Packet::PingResp => 0,
        Packet::Disconnect(p) => p.body_len(version)?,
        Packet::Auth(p) => p.body_len(version)?,
    };
    Ok(((t.as_u8() << 4) | flags, body))
}

/// The remaining length as a `u32`, if MQTT can express it.
fn remaining_length(body: usize) -> Result<u32, EncodeError> {
    u32::try_from(body)
        .ok()
        .filter(|&n| n <= MAX_VAR_INT)
        .ok_or(EncodeError::PacketTooLarge { size: body })
}

/// The number of bytes [`encode`] would write for `packet` in `version` (fixed header
/// included), or the error it would return. A server uses it to respect the client's
/// Maximum Packet Size.
pub fn encoded_len(packet: &Packet, version: ProtocolVersion) -> Result<usize, EncodeError> {
    let (_, body) = plan(packet, version)?;
    let remaining = remaining_length(body)?;
    Ok(1 + var_int_len(remaining) + body)
}

/// Appends `packet`, encoded for protocol `version`, to `out`.
///
/// A CONNECT is written in its own [`Connect::protocol_version`], whatever `version` is.
/// The encoder writes the shortest form the protocol allows (5.0 acknowledgements leave
/// out a Success reason code and an empty property block).
///
/// It refuses, and writes nothing, when the packet cannot be expressed in `version`
/// (properties, reason codes or AUTH before 5.0: [`EncodeError::NotInVersion`]), when it
/// is too large, and when a receiver would reject it: whatever `encode` writes,
/// [`decode`] reads back as an equal packet.
pub fn encode(
    packet: &Packet,
    version: ProtocolVersion,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let (first, body) = plan(packet, version)?;
    let remaining = remaining_length(body)?;
    out.reserve(1 + var_int_len(remaining) + body);
    out.put_u8(first);
    put_var_int(out, remaining);
    let start = out.len();
    match packet {
        Packet::Connect(p) => p.write(out),
        Packet::ConnAck(p) => p.write(version, out),
        Packet::Publish(p) => p.write(version, out),
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubRel(p) | Packet::PubComp(p) => {
            p.write(version, out)
        }
        Packet::Subscribe(p) => p.write(version, out),
        Packet::SubAck(p) => p.write(version, out),
        Packet::Unsubscribe(p) => p.write(version, out),
        Packet::UnsubAck(p) => p.write(version, out),
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(p) => p.write(version, out),
        Packet::Auth(p) => p.write(version, out),
    }
    debug_assert_eq!(out.len() - start, body, "body size differs from plan");
    Ok(())
}
