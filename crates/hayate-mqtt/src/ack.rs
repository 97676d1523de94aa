//! PUBACK, PUBREC, PUBREL and PUBCOMP (sections 3.4 to 3.7): one shape, [`Ack`].

use bytes::{BufMut, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::properties::AckProperties;
use crate::property::{Properties, is_empty, properties_len, read_properties, write_properties};
use crate::reason::ReasonCode;
use crate::types::{PacketType, PropertyContext, ProtocolVersion};
use crate::wire::Reader;

/// The body of PUBACK, PUBREC, PUBREL and PUBCOMP: which PUBLISH, how it went, and (5.0)
/// properties. Which of the four it is is the [`Packet`](crate::Packet) variant.
///
/// On the wire, 5.0 leaves out what is default: a Success without properties is just the
/// packet identifier, a reason code without properties has no property length. The encoder
/// writes the shortest form; the decoder reads every form.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Ack {
    /// The packet identifier of the PUBLISH (or PUBREL) being answered; not 0.
    pub packet_id: u16,
    /// The outcome (5.0; always [`ReasonCode::Success`] before). PUBACK and PUBREC allow
    /// Success, No matching subscribers and failures; PUBREL and PUBCOMP Success and Packet
    /// Identifier not found ([`ReasonCode::allowed_in`]).
    pub reason_code: ReasonCode,
    /// Properties (5.0).
    pub properties: AckProperties,
}

impl Ack {
    /// A successful acknowledgement of `packet_id`, without properties.
    pub fn new(packet_id: u16) -> Ack {
        Ack::with_reason(packet_id, ReasonCode::Success)
    }

    /// An acknowledgement of `packet_id` with `reason_code`, without properties.
    pub fn with_reason(packet_id: u16, reason_code: ReasonCode) -> Ack {
        Ack {
            packet_id,
            reason_code,
            properties: AckProperties::default(),
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        packet: PacketType,
        version: ProtocolVersion,
    ) -> Result<Ack, DecodeError> {
        let packet_id = r.packet_id()?;
        if !version.is_v5() {
            return Ok(Ack::new(packet_id));
        }
        let (reason_code, properties) = read_optional(r, packet, ack_context(packet), version)?;
        Ok(Ack {
            packet_id,
            reason_code,
            properties,
        })
    }

    pub(crate) fn body_len(
        &self,
        packet: PacketType,
        version: ProtocolVersion,
    ) -> Result<usize, EncodeError> {
        if self.packet_id == 0 {
            return Err(DecodeError::ZeroPacketId(packet).into());
        }
        let tail = optional_len(
            self.reason_code,
            &self.properties,
            packet,
            version,
            "acknowledgement properties",
        )?;
        Ok(2 + tail)
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id);
        if version.is_v5() {
            write_optional(self.reason_code, &self.properties, false, out);
        }
    }
}

/// The property context of an acknowledgement packet.
fn ack_context(packet: PacketType) -> PropertyContext {
    match packet {
        PacketType::PubAck => PropertyContext::PubAck,
        PacketType::PubRec => PropertyContext::PubRec,
        PacketType::PubRel => PropertyContext::PubRel,
        _ => PropertyContext::PubComp,
    }
}

/// Reads a reason code byte that `packet` must allow.
pub(crate) fn read_reason_code(
    r: &mut Reader,
    packet: PacketType,
    version: ProtocolVersion,
) -> Result<ReasonCode, DecodeError> {
    let code = r.u8()?;
    ReasonCode::from_u8(code)
        .filter(|c| c.allowed_in(packet, version))
        .ok_or(DecodeError::InvalidReasonCode { packet, code })
}

/// Fails if `packet` may not carry `code` in `version`.
pub(crate) fn check_reason_code(
    code: ReasonCode,
    packet: PacketType,
    version: ProtocolVersion,
) -> Result<(), EncodeError> {
    if code.allowed_in(packet, version) {
        Ok(())
    } else if !version.is_v5() {
        Err(EncodeError::NotInVersion {
            what: "this reason code",
            version,
        })
    } else {
        Err(DecodeError::InvalidReasonCode {
            packet,
            code: code.as_u8(),
        }
        .into())
    }
}

/// Reads an optional reason code and an optional property block: an empty body is
/// Success without properties, a single byte a reason code without properties.
pub(crate) fn read_optional<T: Properties>(
    r: &mut Reader,
    packet: PacketType,
    context: PropertyContext,
    version: ProtocolVersion,
) -> Result<(ReasonCode, T), DecodeError> {
    if r.is_empty() {
        return Ok((ReasonCode::Success, T::default()));
    }
    let reason_code = read_reason_code(r, packet, version)?;
    let properties = if r.is_empty() {
        T::default()
    } else {
        read_properties(r, context)?
    };
    Ok((reason_code, properties))
}

/// The body size of an optional reason code and property block, in their shortest form.
pub(crate) fn optional_len<T: Properties>(
    reason: ReasonCode,
    props: &T,
    packet: PacketType,
    version: ProtocolVersion,
    what: &'static str,
) -> Result<usize, EncodeError> {
    check_reason_code(reason, packet, version)?;
    let props = properties_len(props, version, what)?;
    // A property block of 1 byte is just its zero length.
    Ok(match (reason, props <= 1) {
        (ReasonCode::Success, true) => 0,
        (_, true) => 1,
        (_, false) => 1 + props,
    })
}

/// Writes an optional reason code and property block in their shortest form; with
/// `length_with_reason`, a reason code is always followed by a property length.
pub(crate) fn write_optional<T: Properties>(
    reason: ReasonCode,
    props: &T,
    length_with_reason: bool,
    out: &mut BytesMut,
) {
    let empty = is_empty(props);
    if reason == ReasonCode::Success && empty {
        return;
    }
    out.put_u8(reason.as_u8());
    if !empty || length_with_reason {
        write_properties(props, out);
    }
}
