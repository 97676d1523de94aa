//! The [`Packet`] enum, one variant per control packet, and the types that describe packets:
//! [`ProtocolVersion`], [`QoS`], [`PacketType`] (defined in the crate's dependency-free
//! `types` module, which every packet module uses, and re-exported here).

use crate::ack::Ack;
use crate::connect::{ConnAck, Connect};
use crate::disconnect::{Auth, Disconnect};
use crate::publish::Publish;
use crate::subscribe::{SubAck, Subscribe, UnsubAck, Unsubscribe};

pub use crate::types::{PacketType, ProtocolVersion, QoS};

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
