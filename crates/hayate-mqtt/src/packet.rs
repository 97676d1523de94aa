//! Protocol versions, quality of service, packet types and the [`Packet`] enum.

use std::fmt;

use crate::ack::Ack;
use crate::connect::{ConnAck, Connect};
use crate::disconnect::{Auth, Disconnect};
use crate::publish::Publish;
use crate::subscribe::{SubAck, Subscribe, UnsubAck, Unsubscribe};

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

/// One MQTT control packet.
///
/// CONNECT and CONNACK are boxed: they are rare and large, and the enum stays the size of a
/// PUBLISH. PUBACK, PUBREC, PUBREL and PUBCOMP share one shape, [`Ack`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Packet {
    /// CONNECT: the first packet from a client.
    Connect(Box<Connect>),
    /// CONNACK: the server's answer to CONNECT.
    ConnAck(Box<ConnAck>),
    /// PUBLISH: an application message, either way.
    Publish(Publish),
    /// PUBACK: acknowledges a QoS 1 PUBLISH.
    PubAck(Ack),
    /// PUBREC: first answer to a QoS 2 PUBLISH.
    PubRec(Ack),
    /// PUBREL: answer to PUBREC.
    PubRel(Ack),
    /// PUBCOMP: answer to PUBREL, the end of a QoS 2 exchange.
    PubComp(Ack),
    /// SUBSCRIBE: client subscribes to topic filters.
    Subscribe(Subscribe),
    /// SUBACK: the server's answer to SUBSCRIBE, one reason code per filter.
    SubAck(SubAck),
    /// UNSUBSCRIBE: client removes subscriptions.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK: the server's answer to UNSUBSCRIBE.
    UnsubAck(UnsubAck),
    /// PINGREQ: keep-alive from the client.
    PingReq,
    /// PINGRESP: the server's answer to PINGREQ.
    PingResp,
    /// DISCONNECT: the client's (3.1.1) or either side's (5.0) last packet.
    Disconnect(Disconnect),
    /// AUTH: extended authentication exchange (5.0 only).
    Auth(Auth),
}

impl Packet {
    /// The packet's type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }
}

impl From<Connect> for Packet {
    fn from(p: Connect) -> Packet {
        Packet::Connect(Box::new(p))
    }
}

impl From<ConnAck> for Packet {
    fn from(p: ConnAck) -> Packet {
        Packet::ConnAck(Box::new(p))
    }
}

impl From<Publish> for Packet {
    fn from(p: Publish) -> Packet {
        Packet::Publish(p)
    }
}

impl From<Subscribe> for Packet {
    fn from(p: Subscribe) -> Packet {
        Packet::Subscribe(p)
    }
}

impl From<SubAck> for Packet {
    fn from(p: SubAck) -> Packet {
        Packet::SubAck(p)
    }
}

impl From<Unsubscribe> for Packet {
    fn from(p: Unsubscribe) -> Packet {
        Packet::Unsubscribe(p)
    }
}

impl From<UnsubAck> for Packet {
    fn from(p: UnsubAck) -> Packet {
        Packet::UnsubAck(p)
    }
}

impl From<Disconnect> for Packet {
    fn from(p: Disconnect) -> Packet {
        Packet::Disconnect(p)
    }
}

impl From<Auth> for Packet {
    fn from(p: Auth) -> Packet {
        Packet::Auth(p)
    }
}
