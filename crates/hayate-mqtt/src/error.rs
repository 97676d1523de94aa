//! [`DecodeError`] (what was wrong with received bytes, and the reason code to answer with)
//! and [`EncodeError`] (why a packet cannot be written).

use crate::reason::ReasonCode;
use crate::types::{PacketType, PropertyContext, PropertyId, ProtocolVersion, QoS};

/// Why received bytes are not a valid MQTT packet.
///
/// Every variant maps to the reason code a server sends in its CONNACK (during CONNECT) or
/// DISCONNECT (5.0) before closing the connection: [`DecodeError::reason_code`]. Roughly,
/// bytes that cannot be parsed are 0x81 Malformed Packet, parsable packets that break a
/// rule are 0x82 Protocol Error, and a few have their own code (0x95 Packet too large,
/// 0x90 Topic Name invalid, 0x8F Topic Filter invalid, 0x84 Unsupported Protocol Version).
/// Strings quoted in messages are cut to 64 bytes.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The fixed header announces a packet larger than the maximum packet size. Reported as
    /// soon as the fixed header is buffered, before the body arrives.
    #[error("packet of {size} bytes exceeds the maximum packet size of {max} bytes")]
    PacketTooLarge {
        /// The packet's size: fixed header plus remaining length.
        size: u64,
        /// The maximum the caller allows.
        max: u32,
    },
    /// A variable byte integer (remaining length, property length, subscription identifier,
    /// property identifier) runs over 4 bytes or is not in its shortest form.
    #[error("malformed variable byte integer (more than 4 bytes, or not in its shortest form)")]
    MalformedVarInt,
    /// Packet type 0, or 15 (AUTH) before MQTT 5.0.
    #[error("reserved packet type {0}")]
    ReservedPacketType(u8),
    /// The low nibble of the first byte is not what the packet type requires (0b0010 for
    /// PUBREL, SUBSCRIBE, UNSUBSCRIBE, 0 for the others), or a QoS 0 PUBLISH has DUP set.
    #[error("invalid fixed header flags {flags:#06b} in {packet}")]
    InvalidFlags {
        /// The packet.
        packet: PacketType,
        /// The low nibble of its first byte.
        flags: u8,
    },
    /// A QoS of 3: in a PUBLISH, a will, or a subscription's options.
    #[error("QoS 3 in {0}")]
    InvalidQoS(PacketType),
    /// The packet ends (or its property block ends) in the middle of a field.
    #[error("{0} ends in the middle of a field")]
    Truncated(PacketType),
    /// The packet has bytes after its last field.
    #[error("{0} has bytes after its last field")]
    TrailingBytes(PacketType),
    /// A string is not valid UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// A string contains the null character U+0000.
    #[error("string contains the null character U+0000")]
    NulInString,
    /// The CONNECT protocol name is neither `MQTT` nor `MQIsdp`.
    #[error("unknown protocol name {0:?} (expected \"MQTT\" or \"MQIsdp\")")]
    InvalidProtocolName(String),
    /// The CONNECT protocol level is not one this codec speaks with that protocol name
    /// (`MQTT` 4 or 5, `MQIsdp` 3). A server answers with a CONNACK 0x84 (3.1.1 return code
    /// 1) before closing.
    #[error("unsupported protocol level {level} with protocol name {name:?}")]
    UnsupportedProtocolVersion {
        /// The protocol name: `"MQTT"` or `"MQIsdp"`.
        name: &'static str,
        /// The protocol level.
        level: u8,
    },
    /// The CONNECT flags are inconsistent: the reserved bit is set, a will QoS or retain
    /// without a will, or (before 5.0) a password without a user name.
    #[error("invalid CONNECT flags {0:#010b}")]
    InvalidConnectFlags(u8),
    /// Reserved bits are set in the CONNACK acknowledge flags.
    #[error("reserved bits set in the CONNACK flags {0:#010b}")]
    InvalidConnAckFlags(u8),
    /// A CONNACK refusing the connection has session present set.
    #[error("CONNACK with a failure reason code has session present set")]
    SessionPresentOnFailure,
    /// A reason code (or 3.1.1 return code) that this packet may not carry.
    #[error("reason code {code:#04x} is not valid in {packet}")]
    InvalidReasonCode {
        /// The packet.
        packet: PacketType,
        /// The byte on the wire.
        code: u8,
    },
    /// A packet identifier of 0.
    #[error("{0} has packet identifier 0")]
    ZeroPacketId(PacketType),
    /// A PUBLISH or will topic containing a wildcard (`+`, `#`), or an empty will topic.
    #[error("invalid topic name {0:?} (wildcards are not allowed)")]
    InvalidTopicName(String),
    /// A PUBLISH with an empty topic name and no topic alias (5.0), or any empty PUBLISH
    /// topic before 5.0.
    #[error("empty topic name without a topic alias")]
    EmptyTopicName,
    /// A SUBSCRIBE or UNSUBSCRIBE topic filter that is empty, misplaces a wildcard, or is a
    /// malformed `$share/` filter; see [`valid_topic_filter`](crate::valid_topic_filter).
    #[error("invalid topic filter {0:?}")]
    InvalidTopicFilter(String),
    /// A SUBSCRIBE or UNSUBSCRIBE without any topic filter.
    #[error("{0} has no topic filter")]
    NoTopicFilters(PacketType),
    /// Reserved bits are set in a subscription's options byte.
    #[error("reserved bits set in subscription options {0:#010b}")]
    InvalidSubscriptionOptions(u8),
    /// Retain handling 3 (reserved).
    #[error("retain handling 3 is reserved")]
    InvalidRetainHandling,
    /// No Local set on a shared subscription.
    #[error("no local is set on shared subscription {0:?}")]
    NoLocalOnSharedSubscription(String),
    /// A property identifier the specification does not define.
    #[error("unknown property identifier {0:#04x}")]
    UnknownProperty(u32),
    /// A property this packet (or a will) may not carry.
    #[error("property {property} is not allowed in {context}")]
    PropertyNotAllowed {
        /// The property.
        property: PropertyId,
        /// The packet or will properties it appeared in.
        context: PropertyContext,
    },
    /// A property that may appear only once appears twice.
    #[error("property {0} appears more than once")]
    DuplicateProperty(PropertyId),
    /// A property value the specification forbids: 0 for Receive Maximum, Maximum Packet
    /// Size, Topic Alias or Subscription Identifier, above 1 for a byte that is a flag.
    #[error("invalid value {value} for property {property}")]
    InvalidPropertyValue {
        /// The property.
        property: PropertyId,
        /// The value on the wire.
        value: u32,
    },
    /// A Response Topic that is not a valid topic name (empty, or with wildcards).
    #[error("response topic {0:?} is not a valid topic name")]
    InvalidResponseTopic(String),
    /// A CONNECT with Authentication Data but no Authentication Method.
    #[error("authentication data without an authentication method")]
    AuthDataWithoutMethod,
    /// [`decode_connect`](crate::decode_connect) found another packet first.
    #[error("the first packet must be CONNECT, not {0}")]
    ExpectedConnect(PacketType),
}

impl DecodeError {
    /// The MQTT 5.0 reason code to report this error with (in a CONNACK if the error is in
    /// the CONNECT, in a DISCONNECT after that).
    pub fn reason_code(&self) -> ReasonCode {
        use DecodeError as E;
        match self {
            E::PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
            E::MalformedVarInt
            | E::ReservedPacketType(_)
            | E::InvalidFlags { .. }
            | E::Truncated(_)
            | E::TrailingBytes(_)
            | E::InvalidUtf8
            | E::NulInString
            | E::InvalidConnectFlags(_)
            | E::InvalidConnAckFlags(_)
            | E::InvalidSubscriptionOptions(_)
            | E::UnknownProperty(_)
            | E::PropertyNotAllowed { .. } => ReasonCode::MalformedPacket,
            // "It is a Protocol Error if the Maximum QoS field has the value 3" (3.8.3.1);
            // a QoS of 3 in a PUBLISH or a will is a Malformed Packet.
            E::InvalidQoS(PacketType::Subscribe) => ReasonCode::ProtocolError,
            E::InvalidQoS(_) => ReasonCode::MalformedPacket,
            E::InvalidProtocolName(_) | E::UnsupportedProtocolVersion { .. } => {
                ReasonCode::UnsupportedProtocolVersion
            }
            E::InvalidTopicName(_) => ReasonCode::TopicNameInvalid,
            E::InvalidTopicFilter(_) => ReasonCode::TopicFilterInvalid,
            E::SessionPresentOnFailure
            | E::InvalidReasonCode { .. }
            | E::ZeroPacketId(_)
            | E::EmptyTopicName
            | E::NoTopicFilters(_)
            | E::InvalidRetainHandling
            | E::NoLocalOnSharedSubscription(_)
            | E::DuplicateProperty(_)
            | E::InvalidPropertyValue { .. }
            | E::InvalidResponseTopic(_)
            | E::AuthDataWithoutMethod
            | E::ExpectedConnect(_) => ReasonCode::ProtocolError,
        }
    }
}

/// Quotes at most 64 bytes of a string for an error message.
pub(crate) fn snippet(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Why a packet cannot be encoded. Nothing is written to the output when encoding fails.
///
/// The encoder refuses anything the decoder would reject, so that whatever it writes, a
/// peer's decoder (this one included) accepts: such errors come as [`EncodeError::Invalid`]
/// with the [`DecodeError`] the peer would have reported.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The remaining length would exceed 268,435,455 bytes, the most MQTT can express.
    #[error("packet too large: {size} bytes after the fixed header (at most 268435455)")]
    PacketTooLarge {
        /// The remaining length the packet would have.
        size: usize,
    },
    /// A string longer than 65,535 bytes.
    #[error("string of {0} bytes is longer than 65535 bytes")]
    StringTooLong(usize),
    /// Binary data (a password, a will payload, correlation or authentication data) longer
    /// than 65,535 bytes.
    #[error("binary data of {0} bytes is longer than 65535 bytes")]
    BinaryTooLong(usize),
    /// Something only MQTT 5.0 has (properties, a reason code other than success, AUTH,
    /// subscription options other than QoS), encoded for MQTT 3.1 or 3.1.1.
    #[error("{what} cannot be encoded in MQTT {version}")]
    NotInVersion {
        /// What could not be encoded.
        what: &'static str,
        /// The version asked for.
        version: ProtocolVersion,
    },
    /// A QoS 0 PUBLISH with a packet identifier, or a QoS 1 or 2 PUBLISH without one.
    #[error("a QoS {} PUBLISH with packet identifier {packet_id:?}", .qos.as_u8())]
    PacketIdForQoS {
        /// The PUBLISH's QoS.
        qos: QoS,
        /// Its packet identifier.
        packet_id: Option<u16>,
    },
    /// The packet breaks a rule of the protocol: the receiver would reject it with this
    /// error.
    #[error("invalid packet: {0}")]
    Invalid(#[from] DecodeError),
}
