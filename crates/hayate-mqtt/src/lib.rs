//! A sans-IO codec for MQTT 3.1, 3.1.1 and 5.0 packets, meant to be shared by Hayate's MQTT
//! front-end, its clients and the benchmark (one codec crate for both sides: the lesson of
//! rumqtt#996). It works on [`bytes::BytesMut`] only and never touches a socket or a clock;
//! sessions (keep-alive, packet identifiers in flight, topic aliases, QoS flows) are built
//! on top of it.
//!
//! Like `hayate-stomp`, it depends on no other Hayate crate: it speaks MQTT only. Translating
//! MQTT to Hayate (topics to keys, filters to key expressions, QoS to delivery guarantees,
//! 5.0 properties to message headers, reply-to and correlation id) is the broker's MQTT
//! front-end's business, all of it in one module, `hayate_front_mqtt::translate`.
//!
//! # Layout
//!
//! - [`packet`]: [`Packet`] (one variant per control packet), [`PacketType`],
//!   [`ProtocolVersion`], [`QoS`].
//! - One module per packet family: [`connect`](mod@connect) ([`Connect`], [`Will`],
//!   [`ConnAck`]), [`publish`](mod@publish) ([`Publish`], and [`PublishHead`] for the
//!   hot-path [`encode_publish_head`]), [`ack`] ([`Ack`] for PUBACK, PUBREC, PUBREL,
//!   PUBCOMP), [`subscribe`](mod@subscribe) ([`Subscribe`], [`SubAck`], [`Unsubscribe`],
//!   [`UnsubAck`], [`SubscriptionOptions`]), [`disconnect`](mod@disconnect)
//!   ([`Disconnect`], [`Auth`]).
//! - [`property`]: the 27 MQTT 5.0 property identifiers ([`PropertyId`]), their types and
//!   where each is allowed; [`properties`]: one typed property set per packet
//!   ([`PublishProperties`], [`ConnectProperties`], ...).
//! - [`reason`]: [`ReasonCode`], with the specification's values and names, which packet
//!   may carry which, and the 3.1.1 CONNACK return codes.
//! - [`topic`]: [`valid_topic_name`], [`valid_topic_filter`], [`shared_subscription`].
//! - [`codec`]: [`decode`], [`decode_connect`], [`packet_len`], [`encode`],
//!   [`encoded_len`]; [`error`]: [`DecodeError`] (with
//!   [`reason_code`](DecodeError::reason_code)) and [`EncodeError`].
//! - [`ByteStr`]: a UTF-8 string in [`bytes::Bytes`].
//!
//! The modules form no cycle. At the bottom, a private `types` module, which imports
//! nothing from the crate, defines the vocabulary every other module shares:
//! [`ProtocolVersion`], [`QoS`], [`PacketType`], [`PropertyId`], [`PropertyType`],
//! [`PropertyContext`] (re-exported from [`packet`] and [`property`]). Above it, in order:
//! [`reason`], [`error`], the wire primitives, [`property`], [`properties`], the packet
//! modules, then [`packet`], which gathers them into [`Packet`], and [`codec`] on top.
//!
//! # Versions
//!
//! The decoder and the encoder take the connection's [`ProtocolVersion`]. A CONNECT is the
//! exception: it carries its own protocol name and level, so it is decoded whatever the
//! version argument (a server calls [`decode_connect`], or [`decode`] with any version,
//! for the first packet, then uses [`Connect::protocol_version`]) and encoded in its own
//! version. MQTT 3.1 (`MQIsdp`, level 3) CONNECTs are accepted; after the CONNECT, 3.1 and
//! 3.1.1 are the same wire format.
//!
//! The packet types are the same for every version; what 3.1.1 lacks is simply absent when
//! decoding (empty property sets, [`ReasonCode::Success`] in acknowledgements) and refused
//! when encoding ([`EncodeError::NotInVersion`]), rather than silently dropped.
//!
//! # Validation
//!
//! The decoder checks every rule that can be checked on one packet alone: reserved bits and
//! fixed-header flags, UTF-8 without U+0000 in strings, variable byte integers of at most 4
//! bytes in their shortest form, the remaining length against the fields, QoS 3, packet
//! identifier 0, empty SUBSCRIBE and UNSUBSCRIBE, wildcards in topic names, topic filter
//! syntax (also `$share/`), reason codes and properties allowed in each packet, duplicate
//! properties, property values (0 for Receive Maximum, ...). Each error maps to the reason
//! code to close the connection with ([`DecodeError::reason_code`]). Rules that need the
//! session (a second CONNECT, a topic alias above the maximum, a packet identifier in use,
//! a client sending a subscription identifier, the authentication method matching) are the
//! session's.
//!
//! The encoder refuses whatever the decoder would reject, so an encoded packet always
//! decodes back to an equal one.
//!
//! # Zero copy
//!
//! In a decoded PUBLISH, the topic, the properties' strings and binary data and the
//! payload are slices of the read buffer: no copy on the hot path. Other packets copy their
//! (few, small) strings, because a session tends to keep them (a will, a subscription's
//! filter) and a slice would keep the whole read buffer alive. On the way out,
//! [`encode_publish_head`] writes a PUBLISH up to its payload, so a writer can send the
//! payload by reference.
//!
//! # Quick start
//!
//! ```
//! use bytes::BytesMut;
//! use hayate_mqtt::{
//!     Connect, MAX_PACKET_SIZE, Packet, ProtocolVersion, Publish, QoS, decode, decode_connect,
//!     encode,
//! };
//!
//! // A client writes a CONNECT and a QoS 1 PUBLISH.
//! let mut wire = BytesMut::new();
//! let connect = Connect::new(ProtocolVersion::V5, "sensor-1");
//! encode(&Packet::from(connect), ProtocolVersion::V5, &mut wire).unwrap();
//! let mut publish = Publish::new("sensors/1/temp", "21.5");
//! publish.qos = QoS::AtLeastOnce;
//! publish.packet_id = Some(1);
//! encode(&Packet::Publish(publish), ProtocolVersion::V5, &mut wire).unwrap();
//!
//! // The server reads the CONNECT without knowing the version yet...
//! let connect = decode_connect(&mut wire, MAX_PACKET_SIZE).unwrap().unwrap();
//! assert_eq!(connect.client_id, "sensor-1");
//! let version = connect.protocol_version;
//!
//! // ...then every packet after it in that version.
//! let max = 1 << 20;
//! let Some(Packet::Publish(p)) = decode(&mut wire, version, max).unwrap() else {
//!     panic!("expected PUBLISH")
//! };
//! assert_eq!(p.topic, "sensors/1/temp");
//! assert_eq!(&p.payload[..], b"21.5");
//! assert_eq!(decode(&mut wire, version, max).unwrap(), None); // read more
//! ```

#![warn(missing_docs)]

pub mod ack;
mod bytestr;
pub mod codec;
pub mod connect;
pub mod disconnect;
pub mod error;
pub mod packet;
pub mod properties;
pub mod property;
pub mod publish;
pub mod reason;
pub mod subscribe;
pub mod topic;
mod types;
mod wire;

pub use ack::Ack;
pub use bytestr::ByteStr;
pub use codec::{
    MAX_PACKET_SIZE, RawPacket, decode, decode_connect, encode, encoded_len, packet_len, split,
};
pub use connect::{ConnAck, Connect, Will};
pub use disconnect::{Auth, Disconnect};
pub use error::{DecodeError, EncodeError};
pub use packet::{Packet, PacketType, ProtocolVersion, QoS};
pub use properties::{
    AckProperties, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties,
    PublishProperties, SubscribeProperties, UnsubscribeProperties, UserProperties, WillProperties,
};
pub use property::{PayloadFormat, Property, PropertyContext, PropertyId, PropertyType};
pub use publish::{Publish, PublishHead, encode_publish_head};
pub use reason::ReasonCode;
pub use subscribe::{RetainHandling, SubAck, Subscribe, Subscription, SubscriptionOptions};
pub use subscribe::{UnsubAck, Unsubscribe};
pub use topic::{
    SHARED_PREFIX, SharedSubscription, has_wildcards, shared_subscription, valid_topic_filter,
    valid_topic_name,
};
pub use wire::MAX_VAR_INT;
