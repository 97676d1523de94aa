//! DISCONNECT and AUTH (sections 3.14 and 3.15): a reason code and properties, both left
//! out on the wire when they are defaults.

use bytes::BytesMut;

use crate::ack::{optional_len, read_optional, write_optional};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{AuthProperties, DisconnectProperties};
use crate::reason::ReasonCode;
use crate::types::{PacketType, PropertyContext, ProtocolVersion};
use crate::wire::Reader;

/// DISCONNECT: the last packet of a connection, from the client (any version) or the
/// server (5.0).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Disconnect {
    /// Why (5.0): Normal disconnection ([`ReasonCode::NORMAL_DISCONNECTION`]), Disconnect
    /// with Will Message, or a failure. Always Normal disconnection before 5.0.
    pub reason_code: ReasonCode,
    /// Properties (5.0).
    pub properties: DisconnectProperties,
}

impl Disconnect {
    /// A DISCONNECT with this reason code and no properties.
    pub fn new(reason_code: ReasonCode) -> Disconnect {
        Disconnect {
            reason_code,
            properties: DisconnectProperties::default(),
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<Disconnect, DecodeError> {
        if !version.is_v5() {
            return Ok(Disconnect::default());
        }
        let (reason_code, properties) = read_optional(
            r,
            PacketType::Disconnect,
            PropertyContext::Disconnect,
            version,
        )?;
        Ok(Disconnect {
            reason_code,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        optional_len(
            self.reason_code,
            &self.properties,
            PacketType::Disconnect,
            version,
            "DISCONNECT properties",
        )
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        if version.is_v5() {
            write_optional(self.reason_code, &self.properties, false, out);
        }
    }
}

/// AUTH: one step of an extended authentication exchange (5.0 only; packet type 15 is
/// reserved before).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Auth {
    /// Success, Continue authentication or Re-authenticate.
    pub reason_code: ReasonCode,
    /// Properties: the authentication method and data.
    pub properties: AuthProperties,
}

impl Auth {
    /// An AUTH with this reason code and no properties.
    pub fn new(reason_code: ReasonCode) -> Auth {
        Auth {
            reason_code,
            properties: AuthProperties::default(),
        }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<Auth, DecodeError> {
        let (reason_code, properties) =
            read_optional(r, PacketType::Auth, PropertyContext::Auth, version)?;
        Ok(Auth {
            reason_code,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if !version.is_v5() {
            return Err(EncodeError::NotInVersion {
                what: "AUTH",
                version,
            });
        }
        // Unlike DISCONNECT, AUTH may only leave out both the reason code and the property
        // length (3.15.2.1), so a reason code always comes with a property length.
        let len = optional_len(
            self.reason_code,
            &self.properties,
            PacketType::Auth,
            version,
            "AUTH properties",
        )?;
        Ok(if len == 1 { 2 } else { len })
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        if version.is_v5() {
            write_optional(self.reason_code, &self.properties, true, out);
        }
    }
}
