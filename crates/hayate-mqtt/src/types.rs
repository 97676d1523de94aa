//! The vocabulary every other module shares: protocol versions, quality of service, packet
//! types, and MQTT 5.0 property identifiers, their data types and the contexts they may
//! appear in.
//!
//! This module imports nothing else from the crate, so that the modules that define packets
//! (and [`Packet`](crate::Packet), which gathers them) can all depend on it without forming a
//! cycle. Its types are re-exported where they are documented: [`ProtocolVersion`], [`QoS`]
//! and [`PacketType`] from [`packet`](crate::packet), [`PropertyId`], [`PropertyType`] and
//! [`PropertyContext`] from [`property`](crate::property).

use std::fmt;

/// An MQTT protocol version, as a CONNECT packet announces it (protocol name and level).
///
/// Versions are ordered, oldest first. MQTT 3.1 and 3.1.1 share one wire format after
/// CONNECT; the codec treats them alike, except that 3.1 peers may set DUP on PUBREL,
/// SUBSCRIBE and UNSUBSCRIBE (3.1 allowed it on retransmission).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum ProtocolVersion {
    /// MQTT 3.1: protocol name `MQIsdp`, level 3.
    V3_1,
    /// MQTT 3.1.1 (OASIS): protocol name `MQTT`, level 4.
    V3_1_1,
    /// MQTT 5.0 (OASIS): protocol name `MQTT`, level 5. Properties, reason codes, AUTH.
    V5,
}

impl ProtocolVersion {
    /// Every version, oldest first.
    pub const ALL: [ProtocolVersion; 3] = [
        ProtocolVersion::V3_1,
        ProtocolVersion::V3_1_1,
        ProtocolVersion::V5,
    ];

    /// The protocol level byte of a CONNECT packet: 3, 4 or 5.
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V3_1 => 3,
            ProtocolVersion::V3_1_1 => 4,
            ProtocolVersion::V5 => 5,
        }
    }

    /// The protocol name of a CONNECT packet: `"MQIsdp"` for 3.1, `"MQTT"` after it.
    pub fn protocol_name(self) -> &'static str {
        match self {
            ProtocolVersion::V3_1 => "MQIsdp",
            ProtocolVersion::V3_1_1 | ProtocolVersion::V5 => "MQTT",
        }
    }

    /// The version with this protocol level, if the codec supports it.
    pub fn from_level(level: u8) -> Option<ProtocolVersion> {
        match level {
            3 => Some(ProtocolVersion::V3_1),
            4 => Some(ProtocolVersion::V3_1_1),
            5 => Some(ProtocolVersion::V5),
            _ => None,
        }
    }

    /// Whether this is MQTT 5.0 (properties, reason codes everywhere, AUTH).
    pub fn is_v5(self) -> bool {
        self == ProtocolVersion::V5
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProtocolVersion::V3_1 => "3.1",
            ProtocolVersion::V3_1_1 => "3.1.1",
            ProtocolVersion::V5 => "5.0",
        })
    }
}

/// Quality of service of a PUBLISH, a will message or a subscription. Ordered, lowest first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(u8)]
pub enum QoS {
    /// QoS 0: at most once, no acknowledgement.
    #[default]
    AtMostOnce = 0,
    /// QoS 1: at least once, acknowledged by PUBACK.
    AtLeastOnce = 1,
    /// QoS 2: exactly once, PUBREC / PUBREL / PUBCOMP.
    ExactlyOnce = 2,
}

impl QoS {
    /// Every QoS level, lowest first.
    pub const ALL: [QoS; 3] = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce];

    /// The QoS with this wire value; `None` for 3 and above (3 is reserved).
    pub fn from_u8(value: u8) -> Option<QoS> {
        match value {
            0 => Some(QoS::AtMostOnce),
            1 => Some(QoS::AtLeastOnce),
            2 => Some(QoS::ExactlyOnce),
            _ => None,
        }
    }

    /// The wire value: 0, 1 or 2.
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// The type of an MQTT control packet: the high nibble of its first byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[repr(u8)]
pub enum PacketType {
    /// Client request to connect (1).
    Connect = 1,
    /// Connect acknowledgement (2).
    ConnAck = 2,
    /// Publish message (3).
    Publish = 3,
    /// Publish acknowledgement, QoS 1 (4).
    PubAck = 4,
    /// Publish received, QoS 2 part 1 (5).
    PubRec = 5,
    /// Publish release, QoS 2 part 2 (6).
    PubRel = 6,
    /// Publish complete, QoS 2 part 3 (7).
    PubComp = 7,
    /// Subscribe request (8).
    Subscribe = 8,
    /// Subscribe acknowledgement (9).
    SubAck = 9,
    /// Unsubscribe request (10).
    Unsubscribe = 10,
    /// Unsubscribe acknowledgement (11).
    UnsubAck = 11,
    /// Ping request (12).
    PingReq = 12,
    /// Ping response (13).
    PingResp = 13,
    /// Disconnect notification (14).
    Disconnect = 14,
    /// Authentication exchange, MQTT 5.0 only (15; reserved in 3.1.1).
    Auth = 15,
}

impl PacketType {
    /// Every packet type, in numeric order.
    pub const ALL: [PacketType; 15] = [
        PacketType::Connect,
        PacketType::ConnAck,
        PacketType::Publish,
        PacketType::PubAck,
        PacketType::PubRec,
        PacketType::PubRel,
        PacketType::PubComp,
        PacketType::Subscribe,
        PacketType::SubAck,
        PacketType::Unsubscribe,
        PacketType::UnsubAck,
        PacketType::PingReq,
        PacketType::PingResp,
        PacketType::Disconnect,
        PacketType::Auth,
    ];

    /// The packet type with this number (1 to 15); `None` for 0 (reserved) and above 15.
    pub fn from_u8(value: u8) -> Option<PacketType> {
        PacketType::ALL
            .get(usize::from(value).checked_sub(1)?)
            .copied()
    }

    /// The packet type number, 1 to 15.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// The packet's name as the specification writes it, e.g. `"PUBACK"`.
    pub fn name(self) -> &'static str {
        match self {
            PacketType::Connect => "CONNECT",
            PacketType::ConnAck => "CONNACK",
            PacketType::Publish => "PUBLISH",
            PacketType::PubAck => "PUBACK",
            PacketType::PubRec => "PUBREC",
            PacketType::PubRel => "PUBREL",
            PacketType::PubComp => "PUBCOMP",
            PacketType::Subscribe => "SUBSCRIBE",
            PacketType::SubAck => "SUBACK",
            PacketType::Unsubscribe => "UNSUBSCRIBE",
            PacketType::UnsubAck => "UNSUBACK",
            PacketType::PingReq => "PINGREQ",
            PacketType::PingResp => "PINGRESP",
            PacketType::Disconnect => "DISCONNECT",
            PacketType::Auth => "AUTH",
        }
    }

    /// The flags (low nibble of the first byte) this packet type must carry, or `None` for
    /// PUBLISH, whose flags are DUP, QoS and RETAIN.
    pub fn fixed_flags(self) -> Option<u8> {
        match self {
            PacketType::Publish => None,
            PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => Some(0b0010),
            _ => Some(0),
        }
    }
}

impl fmt::Display for PacketType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The data type of a property's value (section 1.5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PropertyType {
    /// One byte.
    Byte,
    /// A big-endian `u16`.
    TwoByteInteger,
    /// A big-endian `u32`.
    FourByteInteger,
    /// A variable byte integer (up to 268,435,455).
    VariableByteInteger,
    /// A UTF-8 encoded string.
    Utf8String,
    /// Binary data: a two-byte length and bytes.
    BinaryData,
    /// A UTF-8 string pair: name and value (User Property).
    Utf8StringPair,
}

/// Declares [`PropertyId`] from one table: variant, identifier, type, specification name.
macro_rules! property_ids {
    ($( $variant:ident = $id:literal, $ty:ident, $name:literal; )*) => {
        /// A property identifier (section 2.2.2.2). Every identifier is one byte on the wire.
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
        #[repr(u8)]
        pub enum PropertyId {
            $(
                #[doc = concat!($name, " (", stringify!($id), ", ", stringify!($ty), ").")]
                $variant = $id,
            )*
        }

        impl PropertyId {
            /// Every property identifier, in numeric order.
            pub const ALL: &[PropertyId] = &[$( PropertyId::$variant, )*];

            /// The property with this identifier, if the specification defines one.
            pub fn from_u8(id: u8) -> Option<PropertyId> {
                match id {
                    $( $id => Some(PropertyId::$variant), )*
                    _ => None,
                }
            }

            /// The data type of the property's value.
            pub fn property_type(self) -> PropertyType {
                match self {
                    $( PropertyId::$variant => PropertyType::$ty, )*
                }
            }

            /// The property's name in the specification, e.g. `"Topic Alias"`.
            pub fn name(self) -> &'static str {
                match self {
                    $( PropertyId::$variant => $name, )*
                }
            }
        }
    };
}

property_ids! {
    PayloadFormatIndicator = 0x01, Byte, "Payload Format Indicator";
    MessageExpiryInterval = 0x02, FourByteInteger, "Message Expiry Interval";
    ContentType = 0x03, Utf8String, "Content Type";
    ResponseTopic = 0x08, Utf8String, "Response Topic";
    CorrelationData = 0x09, BinaryData, "Correlation Data";
    SubscriptionIdentifier = 0x0B, VariableByteInteger, "Subscription Identifier";
    SessionExpiryInterval = 0x11, FourByteInteger, "Session Expiry Interval";
    AssignedClientIdentifier = 0x12, Utf8String, "Assigned Client Identifier";
    ServerKeepAlive = 0x13, TwoByteInteger, "Server Keep Alive";
    AuthenticationMethod = 0x15, Utf8String, "Authentication Method";
    AuthenticationData = 0x16, BinaryData, "Authentication Data";
    RequestProblemInformation = 0x17, Byte, "Request Problem Information";
    WillDelayInterval = 0x18, FourByteInteger, "Will Delay Interval";
    RequestResponseInformation = 0x19, Byte, "Request Response Information";
    ResponseInformation = 0x1A, Utf8String, "Response Information";
    ServerReference = 0x1C, Utf8String, "Server Reference";
    ReasonString = 0x1F, Utf8String, "Reason String";
    ReceiveMaximum = 0x21, TwoByteInteger, "Receive Maximum";
    TopicAliasMaximum = 0x22, TwoByteInteger, "Topic Alias Maximum";
    TopicAlias = 0x23, TwoByteInteger, "Topic Alias";
    MaximumQoS = 0x24, Byte, "Maximum QoS";
    RetainAvailable = 0x25, Byte, "Retain Available";
    UserProperty = 0x26, Utf8StringPair, "User Property";
    MaximumPacketSize = 0x27, FourByteInteger, "Maximum Packet Size";
    WildcardSubscriptionAvailable = 0x28, Byte, "Wildcard Subscription Available";
    SubscriptionIdentifierAvailable = 0x29, Byte, "Subscription Identifier Available";
    SharedSubscriptionAvailable = 0x2A, Byte, "Shared Subscription Available";
}

impl PropertyId {
    /// The identifier byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether the property may appear in `context` (the table of section 2.2.2.2).
    pub fn allowed_in(self, context: PropertyContext) -> bool {
        use PropertyContext as C;
        use PropertyId as P;
        match self {
            P::PayloadFormatIndicator
            | P::MessageExpiryInterval
            | P::ContentType
            | P::ResponseTopic
            | P::CorrelationData => matches!(context, C::Publish | C::Will),
            P::SubscriptionIdentifier => matches!(context, C::Publish | C::Subscribe),
            P::SessionExpiryInterval => matches!(context, C::Connect | C::ConnAck | C::Disconnect),
            P::AssignedClientIdentifier
            | P::ServerKeepAlive
            | P::ResponseInformation
            | P::MaximumQoS
            | P::RetainAvailable
            | P::WildcardSubscriptionAvailable
            | P::SubscriptionIdentifierAvailable
            | P::SharedSubscriptionAvailable => context == C::ConnAck,
            P::AuthenticationMethod | P::AuthenticationData => {
                matches!(context, C::Connect | C::ConnAck | C::Auth)
            }
            P::RequestProblemInformation | P::RequestResponseInformation => context == C::Connect,
            P::WillDelayInterval => context == C::Will,
            P::ServerReference => matches!(context, C::ConnAck | C::Disconnect),
            P::ReasonString => !matches!(
                context,
                C::Connect | C::Will | C::Publish | C::Subscribe | C::Unsubscribe
            ),
            P::ReceiveMaximum | P::TopicAliasMaximum | P::MaximumPacketSize => {
                matches!(context, C::Connect | C::ConnAck)
            }
            P::TopicAlias => context == C::Publish,
            P::UserProperty => true,
        }
    }

    /// Whether the property may appear more than once in `context`: User Property always,
    /// Subscription Identifier in a PUBLISH (one per matching subscription).
    pub fn repeatable_in(self, context: PropertyContext) -> bool {
        match self {
            PropertyId::UserProperty => true,
            PropertyId::SubscriptionIdentifier => context == PropertyContext::Publish,
            _ => false,
        }
    }
}

impl fmt::Display for PropertyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.name(), self.as_u8())
    }
}

/// Where a property block appears: a packet's variable header, or a will in a CONNECT.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum PropertyContext {
    /// CONNECT.
    Connect,
    /// The will properties in a CONNECT's payload.
    Will,
    /// CONNACK.
    ConnAck,
    /// PUBLISH.
    Publish,
    /// PUBACK.
    PubAck,
    /// PUBREC.
    PubRec,
    /// PUBREL.
    PubRel,
    /// PUBCOMP.
    PubComp,
    /// SUBSCRIBE.
    Subscribe,
    /// SUBACK.
    SubAck,
    /// UNSUBSCRIBE.
    Unsubscribe,
    /// UNSUBACK.
    UnsubAck,
    /// DISCONNECT.
    Disconnect,
    /// AUTH.
    Auth,
}

impl PropertyContext {
    /// Every context.
    pub const ALL: [PropertyContext; 14] = [
        PropertyContext::Connect,
        PropertyContext::Will,
        PropertyContext::ConnAck,
        PropertyContext::Publish,
        PropertyContext::PubAck,
        PropertyContext::PubRec,
        PropertyContext::PubRel,
        PropertyContext::PubComp,
        PropertyContext::Subscribe,
        PropertyContext::SubAck,
        PropertyContext::Unsubscribe,
        PropertyContext::UnsubAck,
        PropertyContext::Disconnect,
        PropertyContext::Auth,
    ];
}

impl fmt::Display for PropertyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PropertyContext::Connect => "CONNECT",
            PropertyContext::Will => "will properties",
            PropertyContext::ConnAck => "CONNACK",
            PropertyContext::Publish => "PUBLISH",
            PropertyContext::PubAck => "PUBACK",
            PropertyContext::PubRec => "PUBREC",
            PropertyContext::PubRel => "PUBREL",
            PropertyContext::PubComp => "PUBCOMP",
            PropertyContext::Subscribe => "SUBSCRIBE",
            PropertyContext::SubAck => "SUBACK",
            PropertyContext::Unsubscribe => "UNSUBSCRIBE",
            PropertyContext::UnsubAck => "UNSUBACK",
            PropertyContext::Disconnect => "DISCONNECT",
            PropertyContext::Auth => "AUTH",
        })
    }
}
