//! PUBLISH (section 3.3), and the hot-path encoder that writes everything but the payload.

use bytes::{BufMut, Bytes, BytesMut};

use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError, snippet};
use crate::properties::PublishProperties;
use crate::property::{properties_len, read_properties, write_properties};
use crate::types::{PacketType, PropertyContext, ProtocolVersion, QoS};
use crate::wire::{MAX_VAR_INT, Reader, check_str, put_str, put_var_int, var_int_len};

/// PUBLISH: an application message, from client to server or server to client.
///
/// In a decoded PUBLISH, the topic, the properties' strings and binary data, and the
/// payload are zero-copy slices of the read buffer.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Publish {
    /// Whether this is a re-delivery (QoS 1 and 2 only).
    pub dup: bool,
    /// The quality of service.
    pub qos: QoS,
    /// Whether the server keeps the message for future subscribers (client to server), or
    /// sends it because it was retained (server to client).
    pub retain: bool,
    /// The topic name: no wildcards; empty only with a topic alias (5.0).
    pub topic: ByteStr,
    /// The packet identifier: `Some` (not 0) for QoS 1 and 2, `None` for QoS 0.
    pub packet_id: Option<u16>,
    /// Properties (5.0).
    pub properties: PublishProperties,
    /// The application payload.
    pub payload: Bytes,
}

impl Publish {
    /// A QoS 0, not retained PUBLISH without properties.
    pub fn new(topic: impl Into<ByteStr>, payload: impl Into<Bytes>) -> Publish {
        Publish {
            topic: topic.into(),
            payload: payload.into(),
            ..Publish::default()
        }
    }

    /// Everything but the payload, borrowed, for [`encode_publish_head`].
    pub fn head(&self) -> PublishHead<'_> {
        PublishHead {
            dup: self.dup,
            qos: self.qos,
            retain: self.retain,
            topic: &self.topic,
            packet_id: self.packet_id,
            properties: &self.properties,
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        flags: u8,
        version: ProtocolVersion,
    ) -> Result<Publish, DecodeError> {
        // The fixed header check has rejected QoS 3 and DUP on QoS 0.
        let qos = QoS::from_u8((flags >> 1) & 0b11)
            .ok_or(DecodeError::InvalidQoS(PacketType::Publish))?;
        let topic = r.string()?;
        let packet_id = if qos == QoS::AtMostOnce {
            None
        } else {
            Some(r.packet_id()?)
        };
        let properties: PublishProperties = if version.is_v5() {
            read_properties(r, PropertyContext::Publish)?
        } else {
            PublishProperties::default()
        };
        check_topic(&topic, properties.topic_alias.is_some(), version)?;
        Ok(Publish {
            dup: flags & 0b1000 != 0,
            qos,
            retain: flags & 0b0001 != 0,
            topic,
            packet_id,
            properties,
            payload: r.rest()?,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        self.head()
            .variable_header_len(version)?
            .checked_add(self.payload.len())
            .ok_or(EncodeError::PacketTooLarge { size: usize::MAX })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        self.head().write_variable_header(version, out);
        out.put_slice(&self.payload);
    }
}

/// A PUBLISH topic name must have no wildcards, and may be empty only in 5.0 with a topic
/// alias.
fn check_topic(topic: &str, has_alias: bool, version: ProtocolVersion) -> Result<(), DecodeError> {
    if topic.is_empty() {
        if version.is_v5() && has_alias {
            Ok(())
        } else {
            Err(DecodeError::EmptyTopicName)
        }
    } else if topic.contains(['+', '#']) {
        Err(DecodeError::InvalidTopicName(snippet(topic)))
    } else {
        Ok(())
    }
}

/// Everything of a PUBLISH but its payload, borrowed: what [`encode_publish_head`] writes.
///
/// A broker delivering one message to many subscribers builds one of these per delivery
/// (its own QoS, packet identifier and, in 5.0, subscription identifiers or topic alias)
/// around the message's shared topic and properties, then queues the payload by reference.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PublishHead<'a> {
    /// Whether this is a re-delivery (QoS 1 and 2 only).
    pub dup: bool,
    /// The quality of service.
    pub qos: QoS,
    /// The retain flag.
    pub retain: bool,
    /// The topic name (empty only with a topic alias, in 5.0).
    pub topic: &'a str,
    /// `Some` (not 0) for QoS 1 and 2, `None` for QoS 0.
    pub packet_id: Option<u16>,
    /// Properties (5.0; must be empty before).
    pub properties: &'a PublishProperties,
}

impl PublishHead<'_> {
    /// The low nibble of the first byte: DUP, QoS, RETAIN.
    pub(crate) fn flags(&self) -> u8 {
        (u8::from(self.dup) << 3) | (self.qos.as_u8() << 1) | u8::from(self.retain)
    }

    /// The size of the topic, packet identifier and properties; checks them all.
    fn variable_header_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if self.dup && self.qos == QoS::AtMostOnce {
            return Err(DecodeError::InvalidFlags {
                packet: PacketType::Publish,
                flags: self.flags(),
            }
            .into());
        }
        let mut n = match (self.qos, self.packet_id) {
            (QoS::AtMostOnce, None) => 0,
            (QoS::AtLeastOnce | QoS::ExactlyOnce, Some(0)) => {
                return Err(DecodeError::ZeroPacketId(PacketType::Publish).into());
            }
            (QoS::AtLeastOnce | QoS::ExactlyOnce, Some(_)) => 2,
            (qos, packet_id) => return Err(EncodeError::PacketIdForQoS { qos, packet_id }),
        };
        n += properties_len(self.properties, version, "PUBLISH properties")?;
        check_topic(self.topic, self.properties.topic_alias.is_some(), version)?;
        n += check_str(self.topic)?;
        Ok(n)
    }

    fn write_variable_header(&self, version: ProtocolVersion, out: &mut BytesMut) {
        put_str(out, self.topic);
        if let Some(id) = self.packet_id {
            out.put_u16(id);
        }
        if version.is_v5() {
            write_properties(self.properties, out);
        }
    }
}

/// Appends everything of a PUBLISH that comes before its payload: the fixed header (with a
/// remaining length that counts `payload_len` payload bytes), the topic, the packet
/// identifier and the properties. The caller then sends exactly `payload_len` bytes of
/// payload, for instance by queueing the payload's `Bytes` for a vectored write instead of
/// copying it.
///
/// Checks what [`encode`](crate::encode()) checks; on error nothing is written.
///
/// ```
/// use bytes::{Bytes, BytesMut};
/// use hayate_mqtt::{Packet, ProtocolVersion, Publish, QoS, decode, encode_publish_head};
///
/// let payload = Bytes::from(vec![7u8; 100_000]);
/// let mut publish = Publish::new("video/frames", payload.clone());
/// publish.qos = QoS::AtLeastOnce;
/// publish.packet_id = Some(9);
///
/// let mut head = BytesMut::new();
/// encode_publish_head(&publish.head(), payload.len(), ProtocolVersion::V5, &mut head).unwrap();
/// assert!(head.len() < 30);
///
/// // What a vectored write would send: the head, then the payload.
/// head.extend_from_slice(&payload);
/// let decoded = decode(&mut head, ProtocolVersion::V5, u32::MAX).unwrap();
/// assert_eq!(decoded, Some(Packet::Publish(publish)));
/// ```
pub fn encode_publish_head(
    head: &PublishHead<'_>,
    payload_len: usize,
    version: ProtocolVersion,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let variable = head.variable_header_len(version)?;
    let remaining = variable.saturating_add(payload_len);
    let remaining = u32::try_from(remaining)
        .ok()
        .filter(|&n| n <= MAX_VAR_INT)
        .ok_or(EncodeError::PacketTooLarge { size: remaining })?;
    out.reserve(1 + var_int_len(remaining) + variable);
    out.put_u8((PacketType::Publish.as_u8() << 4) | head.flags());
    put_var_int(out, remaining);
    head.write_variable_header(version, out);
    Ok(())
}
