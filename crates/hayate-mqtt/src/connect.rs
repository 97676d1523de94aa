//! CONNECT (with its will message) and CONNACK: sections 3.1 and 3.2.

use bytes::{BufMut, Bytes, BytesMut};

use crate::ack::check_reason_code;
use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError, snippet};
use crate::properties::{ConnAckProperties, ConnectProperties, WillProperties};
use crate::property::{properties_len, read_properties, write_properties};
use crate::reason::ReasonCode;
use crate::topic::valid_topic_name;
use crate::types::{PacketType, PropertyContext, ProtocolVersion, QoS};
use crate::wire::{Reader, check_binary, check_str, put_binary, put_str};

const CLEAN_START: u8 = 0x02;
const WILL: u8 = 0x04;
const WILL_RETAIN: u8 = 0x20;
const PASSWORD: u8 = 0x40;
const USER_NAME: u8 = 0x80;

/// CONNECT: the first packet a client sends.
///
/// The packet carries its own protocol version, so [`decode`](crate::decode()) reads a
/// CONNECT whatever version it is given, and [`encode`](crate::encode()) writes it in
/// [`Connect::protocol_version`], whatever version it is given.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Connect {
    /// The protocol version (name and level) the client speaks.
    pub protocol_version: ProtocolVersion,
    /// Clean Start (5.0), or Clean Session (3.1.1): start a new session rather than resume
    /// one.
    pub clean_start: bool,
    /// Seconds between the client's packets before the server may close the connection;
    /// 0 turns keep-alive off.
    pub keep_alive: u16,
    /// The client identifier; may be empty (the server then assigns one, or refuses).
    pub client_id: ByteStr,
    /// The will message the server publishes if the connection ends without DISCONNECT.
    pub will: Option<Will>,
    /// The user name.
    pub username: Option<ByteStr>,
    /// The password (binary data). Before 5.0 only together with a user name.
    pub password: Option<Bytes>,
    /// Properties (5.0).
    pub properties: ConnectProperties,
}

/// A will message: published by the server for a client whose connection ends without a
/// DISCONNECT (or with DISCONNECT 0x04).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Will {
    /// The topic to publish to: a topic name, no wildcards.
    pub topic: ByteStr,
    /// The payload (binary data, at most 65,535 bytes).
    pub payload: Bytes,
    /// The QoS to publish with.
    pub qos: QoS,
    /// Whether to publish it retained.
    pub retain: bool,
    /// Will properties (5.0).
    pub properties: WillProperties,
}

impl Will {
    /// A QoS 0, non-retained will with no properties.
    pub fn new(topic: impl Into<ByteStr>, payload: impl Into<Bytes>) -> Will {
        Will {
            topic: topic.into(),
            payload: payload.into(),
            qos: QoS::AtMostOnce,
            retain: false,
            properties: WillProperties::default(),
        }
    }
}

impl Connect {
    /// A CONNECT with clean start, a keep-alive of 60 s, and nothing else.
    pub fn new(protocol_version: ProtocolVersion, client_id: impl Into<ByteStr>) -> Connect {
        Connect {
            protocol_version,
            clean_start: true,
            keep_alive: 60,
            client_id: client_id.into(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        }
    }

    fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.clean_start {
            flags |= CLEAN_START;
        }
        if let Some(will) = &self.will {
            flags |= WILL | (will.qos.as_u8() << 3);
            if will.retain {
                flags |= WILL_RETAIN;
            }
        }
        if self.password.is_some() {
            flags |= PASSWORD;
        }
        if self.username.is_some() {
            flags |= USER_NAME;
        }
        flags
    }

    pub(crate) fn decode(r: &mut Reader) -> Result<Connect, DecodeError> {
        let name = r.binary()?;
        let level = r.u8()?;
        let protocol_version = match (&name[..], level) {
            (b"MQTT", 4) => ProtocolVersion::V3_1_1,
            (b"MQTT", 5) => ProtocolVersion::V5,
            (b"MQIsdp", 3) => ProtocolVersion::V3_1,
            (b"MQTT", _) => {
                return Err(DecodeError::UnsupportedProtocolVersion {
                    name: "MQTT",
                    level,
                });
            }
            (b"MQIsdp", _) => {
                return Err(DecodeError::UnsupportedProtocolVersion {
                    name: "MQIsdp",
                    level,
                });
            }
            _ => {
                return Err(DecodeError::InvalidProtocolName(snippet(
                    &String::from_utf8_lossy(&name),
                )));
            }
        };
        let v5 = protocol_version.is_v5();

        let flags = r.u8()?;
        let will_flag = flags & WILL != 0;
        let will_qos = (flags >> 3) & 0b11;
        let will_retain = flags & WILL_RETAIN != 0;
        let reserved = flags & 0x01 != 0;
        let will_bits_without_will = !will_flag && (will_qos != 0 || will_retain);
        let password_without_user = !v5 && flags & PASSWORD != 0 && flags & USER_NAME == 0;
        if reserved || will_bits_without_will || password_without_user {
            return Err(DecodeError::InvalidConnectFlags(flags));
        }
        let will_qos =
            QoS::from_u8(will_qos).ok_or(DecodeError::InvalidQoS(PacketType::Connect))?;

        let keep_alive = r.u16()?;
        let properties = if v5 {
            read_properties(r, PropertyContext::Connect)?
        } else {
            ConnectProperties::default()
        };
        let client_id = r.string()?;
        let will = if will_flag {
            let properties = if v5 {
                read_properties(r, PropertyContext::Will)?
            } else {
                WillProperties::default()
            };
            let topic = r.string()?;
            if !valid_topic_name(&topic) {
                return Err(DecodeError::InvalidTopicName(snippet(&topic)));
            }
            let payload = r.binary()?;
            Some(Will {
                topic,
                payload,
                qos: will_qos,
                retain: will_retain,
                properties,
            })
        } else {
            None
        };
        let username = if flags & USER_NAME != 0 {
            Some(r.string()?)
        } else {
            None
        };
        let password = if flags & PASSWORD != 0 {
            Some(r.binary()?)
        } else {
            None
        };
        Ok(Connect {
            protocol_version,
            clean_start: flags & CLEAN_START != 0,
            keep_alive,
            client_id,
            will,
            username,
            password,
            properties,
        })
    }

    /// The size of the body (after the fixed header); checks everything.
    pub(crate) fn body_len(&self) -> Result<usize, EncodeError> {
        let version = self.protocol_version;
        // Protocol name, level, flags, keep alive.
        let mut n = 2 + version.protocol_name().len() + 1 + 1 + 2;
        n += properties_len(&self.properties, version, "CONNECT properties")?;
        n += check_str(&self.client_id)?;
        if let Some(will) = &self.will {
            n += properties_len(&will.properties, version, "will properties")?;
            if !valid_topic_name(&will.topic) {
                return Err(DecodeError::InvalidTopicName(snippet(&will.topic)).into());
            }
            n += check_str(&will.topic)?;
            n += check_binary(&will.payload)?;
        }
        if let Some(username) = &self.username {
            n += check_str(username)?;
        }
        if let Some(password) = &self.password {
            if !version.is_v5() && self.username.is_none() {
                return Err(DecodeError::InvalidConnectFlags(self.flags()).into());
            }
            n += check_binary(password)?;
        }
        Ok(n)
    }

    /// Writes the body checked by [`Connect::body_len`].
    pub(crate) fn write(&self, out: &mut BytesMut) {
        let version = self.protocol_version;
        put_str(out, version.protocol_name());
        out.put_u8(version.level());
        out.put_u8(self.flags());
        out.put_u16(self.keep_alive);
        if version.is_v5() {
            write_properties(&self.properties, out);
        }
        put_str(out, &self.client_id);
        if let Some(will) = &self.will {
            if version.is_v5() {
                write_properties(&will.properties, out);
            }
            put_str(out, &will.topic);
            put_binary(out, &will.payload);
        }
        if let Some(username) = &self.username {
            put_str(out, username);
        }
        if let Some(password) = &self.password {
            put_binary(out, password);
        }
    }
}

/// CONNACK: the server's answer to a CONNECT.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ConnAck {
    /// Whether the server resumed a session it had for this client. Must be false when the
    /// reason code is a failure.
    pub session_present: bool,
    /// The outcome: [`ReasonCode::Success`] or a failure. Before 5.0 only the codes that
    /// have a 3.1.1 return code ([`ReasonCode::to_v3_connack`]).
    pub reason_code: ReasonCode,
    /// Properties (5.0).
    pub properties: ConnAckProperties,
}

impl ConnAck {
    /// A CONNACK with this reason code, no session present and no properties.
    pub fn new(reason_code: ReasonCode) -> ConnAck {
        ConnAck {
            reason_code,
            ..ConnAck::default()
        }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
        let flags = r.u8()?;
        if flags & 0xFE != 0 {
            return Err(DecodeError::InvalidConnAckFlags(flags));
        }
        let code = r.u8()?;
        let reason_code = if version.is_v5() {
            ReasonCode::from_u8(code).filter(|c| c.allowed_in(PacketType::ConnAck, version))
        } else {
            ReasonCode::from_v3_connack(code)
        }
        .ok_or(DecodeError::InvalidReasonCode {
            packet: PacketType::ConnAck,
            code,
        })?;
        let session_present = flags & 0x01 != 0;
        if session_present && reason_code != ReasonCode::Success {
            return Err(DecodeError::SessionPresentOnFailure);
        }
        let properties = if version.is_v5() {
            read_properties(r, PropertyContext::ConnAck)?
        } else {
            ConnAckProperties::default()
        };
        Ok(ConnAck {
            session_present,
            reason_code,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        check_reason_code(self.reason_code, PacketType::ConnAck, version)?;
        if self.session_present && self.reason_code != ReasonCode::Success {
            return Err(DecodeError::SessionPresentOnFailure.into());
        }
        Ok(2 + properties_len(&self.properties, version, "CONNACK properties")?)
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u8(u8::from(self.session_present));
        out.put_u8(if version.is_v5() {
            self.reason_code.as_u8()
        } else {
            // `body_len` checked the code has a 3.1.1 equivalent.
            self.reason_code.to_v3_connack().unwrap_or_default()
        });
        if version.is_v5() {
            write_properties(&self.properties, out);
        }
    }
}
