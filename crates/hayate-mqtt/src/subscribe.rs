//! SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK (sections 3.8 to 3.11), and subscription
//! options.

use bytes::{BufMut, BytesMut};

use crate::ack::{check_reason_code, read_reason_code};
use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError, snippet};
use crate::properties::{AckProperties, SubscribeProperties, UnsubscribeProperties};
use crate::property::{properties_len, read_properties, write_properties};
use crate::reason::ReasonCode;
use crate::topic::{SHARED_PREFIX, valid_topic_filter};
use crate::types::{PacketType, PropertyContext, ProtocolVersion, QoS};
use crate::wire::{Reader, check_str, put_str};

/// When the server sends retained messages for a new subscription (5.0).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(u8)]
pub enum RetainHandling {
    /// 0: send retained messages when subscribing (the only behaviour before 5.0).
    #[default]
    SendAtSubscribe = 0,
    /// 1: send them only if the subscription did not exist yet.
    SendAtSubscribeIfNew = 1,
    /// 2: do not send them.
    DoNotSend = 2,
}

impl RetainHandling {
    /// The retain handling with this wire value; `None` for 3 (reserved) and above.
    pub fn from_u8(value: u8) -> Option<RetainHandling> {
        match value {
            0 => Some(RetainHandling::SendAtSubscribe),
            1 => Some(RetainHandling::SendAtSubscribeIfNew),
            2 => Some(RetainHandling::DoNotSend),
            _ => None,
        }
    }
}

/// The options byte of one subscription (section 3.8.3.1). Before 5.0 only `qos` exists;
/// the other fields must keep their defaults.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct SubscriptionOptions {
    /// The highest QoS the server may deliver with.
    pub qos: QoS,
    /// Do not deliver the client's own publications back to it. Not allowed on a shared
    /// subscription.
    pub no_local: bool,
    /// Keep the RETAIN flag of forwarded messages as published (instead of clearing it).
    pub retain_as_published: bool,
    /// When to send retained messages.
    pub retain_handling: RetainHandling,
}

impl SubscriptionOptions {
    /// Options with this QoS and every other option at its default.
    pub fn new(qos: QoS) -> SubscriptionOptions {
        SubscriptionOptions {
            qos,
            ..SubscriptionOptions::default()
        }
    }

    fn to_byte(self) -> u8 {
        self.qos.as_u8()
            | (u8::from(self.no_local) << 2)
            | (u8::from(self.retain_as_published) << 3)
            | ((self.retain_handling as u8) << 4)
    }

    fn from_byte(b: u8, version: ProtocolVersion) -> Result<SubscriptionOptions, DecodeError> {
        let reserved = if version.is_v5() {
            0b1100_0000
        } else {
            0b1111_1100
        };
        if b & reserved != 0 {
            return Err(DecodeError::InvalidSubscriptionOptions(b));
        }
        Ok(SubscriptionOptions {
            qos: QoS::from_u8(b & 0b11).ok_or(DecodeError::InvalidQoS(PacketType::Subscribe))?,
            no_local: b & 0b0100 != 0,
            retain_as_published: b & 0b1000 != 0,
            retain_handling: RetainHandling::from_u8((b >> 4) & 0b11)
                .ok_or(DecodeError::InvalidRetainHandling)?,
        })
    }
}

/// One topic filter of a SUBSCRIBE with its options.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Subscription {
    /// The topic filter: wildcards allowed, or a shared subscription `$share/{group}/{filter}`.
    pub filter: ByteStr,
    /// The subscription's options.
    pub options: SubscriptionOptions,
}

impl Subscription {
    /// A subscription to `filter` with this QoS and default options.
    pub fn new(filter: impl Into<ByteStr>, qos: QoS) -> Subscription {
        Subscription {
            filter: filter.into(),
            options: SubscriptionOptions::new(qos),
        }
    }
}

/// What SUBSCRIBE and UNSUBSCRIBE must have before they are encoded: a packet id other than
/// 0 and at least one filter.
fn check_request(kind: PacketType, packet_id: u16, no_filters: bool) -> Result<(), EncodeError> {
    if packet_id == 0 {
        return Err(DecodeError::ZeroPacketId(kind).into());
    }
    if no_filters {
        return Err(DecodeError::NoTopicFilters(kind).into());
    }
    Ok(())
}

/// Checks a topic filter, and that a shared subscription does not ask for No Local.
fn check_filter(filter: &str, no_local: bool) -> Result<(), DecodeError> {
    if !valid_topic_filter(filter) {
        return Err(DecodeError::InvalidTopicFilter(snippet(filter)));
    }
    if no_local && filter.starts_with(SHARED_PREFIX) {
        return Err(DecodeError::NoLocalOnSharedSubscription(snippet(filter)));
    }
    Ok(())
}

/// SUBSCRIBE: the client asks for messages matching one or more topic filters.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Subscribe {
    /// The packet identifier (not 0), echoed by the SUBACK.
    pub packet_id: u16,
    /// The topic filters and their options; at least one.
    pub subscriptions: Vec<Subscription>,
    /// Properties (5.0).
    pub properties: SubscribeProperties,
}

impl Subscribe {
    /// A SUBSCRIBE without properties.
    pub fn new(packet_id: u16, subscriptions: Vec<Subscription>) -> Subscribe {
        Subscribe {
            packet_id,
            subscriptions,
            properties: SubscribeProperties::default(),
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<Subscribe, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = if version.is_v5() {
            read_properties(r, PropertyContext::Subscribe)?
        } else {
            SubscribeProperties::default()
        };
        let mut subscriptions = Vec::new();
        while !r.is_empty() {
            let filter = r.string()?;
            let options = SubscriptionOptions::from_byte(r.u8()?, version)?;
            check_filter(&filter, options.no_local)?;
            subscriptions.push(Subscription { filter, options });
        }
        if subscriptions.is_empty() {
            return Err(DecodeError::NoTopicFilters(PacketType::Subscribe));
        }
        Ok(Subscribe {
            packet_id,
            subscriptions,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        check_request(
            PacketType::Subscribe,
            self.packet_id,
            self.subscriptions.is_empty(),
        )?;
        let mut n = 2 + properties_len(&self.properties, version, "SUBSCRIBE properties")?;
        for s in &self.subscriptions {
            if !version.is_v5() && s.options != SubscriptionOptions::new(s.options.qos) {
                return Err(EncodeError::NotInVersion {
                    what: "subscription options other than QoS",
                    version,
                });
            }
            check_filter(&s.filter, s.options.no_local)?;
            n += check_str(&s.filter)? + 1;
        }
        Ok(n)
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id);
        if version.is_v5() {
            write_properties(&self.properties, out);
        }
        for s in &self.subscriptions {
            put_str(out, &s.filter);
            out.put_u8(s.options.to_byte());
        }
    }
}

/// SUBACK: the server's answer to a SUBSCRIBE, one reason code per topic filter, in order.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SubAck {
    /// The SUBSCRIBE's packet identifier (not 0).
    pub packet_id: u16,
    /// One per subscription: the granted QoS ([`ReasonCode::granted`]) or a failure. Before
    /// 5.0 only Granted QoS 0/1/2 and 0x80 (failure).
    pub reason_codes: Vec<ReasonCode>,
    /// Properties (5.0).
    pub properties: AckProperties,
}

impl SubAck {
    /// A SUBACK without properties.
    pub fn new(packet_id: u16, reason_codes: Vec<ReasonCode>) -> SubAck {
        SubAck {
            packet_id,
            reason_codes,
            properties: AckProperties::default(),
        }
    }

    pub(crate) fn decode(r: &mut Reader, version: ProtocolVersion) -> Result<SubAck, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = if version.is_v5() {
            read_properties(r, PropertyContext::SubAck)?
        } else {
            AckProperties::default()
        };
        let mut reason_codes = Vec::with_capacity(r.remaining());
        while !r.is_empty() {
            reason_codes.push(read_reason_code(r, PacketType::SubAck, version)?);
        }
        Ok(SubAck {
            packet_id,
            reason_codes,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if self.packet_id == 0 {
            return Err(DecodeError::ZeroPacketId(PacketType::SubAck).into());
        }
        for &code in &self.reason_codes {
            check_reason_code(code, PacketType::SubAck, version)?;
        }
        let props = properties_len(&self.properties, version, "SUBACK properties")?;
        Ok(2 + props + self.reason_codes.len())
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id);
        if version.is_v5() {
            write_properties(&self.properties, out);
        }
        for code in &self.reason_codes {
            out.put_u8(code.as_u8());
        }
    }
}

/// UNSUBSCRIBE: the client removes subscriptions.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Unsubscribe {
    /// The packet identifier (not 0), echoed by the UNSUBACK.
    pub packet_id: u16,
    /// The topic filters, exactly as subscribed; at least one.
    pub filters: Vec<ByteStr>,
    /// Properties (5.0).
    pub properties: UnsubscribeProperties,
}

impl Unsubscribe {
    /// An UNSUBSCRIBE without properties.
    pub fn new(packet_id: u16, filters: Vec<ByteStr>) -> Unsubscribe {
        Unsubscribe {
            packet_id,
            filters,
            properties: UnsubscribeProperties::default(),
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<Unsubscribe, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = if version.is_v5() {
            read_properties(r, PropertyContext::Unsubscribe)?
        } else {
            UnsubscribeProperties::default()
        };
        let mut filters = Vec::new();
        while !r.is_empty() {
            let filter = r.string()?;
            check_filter(&filter, false)?;
            filters.push(filter);
        }
        if filters.is_empty() {
            return Err(DecodeError::NoTopicFilters(PacketType::Unsubscribe));
        }
        Ok(Unsubscribe {
            packet_id,
            filters,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        check_request(
            PacketType::Unsubscribe,
            self.packet_id,
            self.filters.is_empty(),
        )?;
        let mut n = 2 + properties_len(&self.properties, version, "UNSUBSCRIBE properties")?;
        for filter in &self.filters {
            check_filter(filter, false)?;
            n += check_str(filter)?;
        }
        Ok(n)
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id);
        if version.is_v5() {
            write_properties(&self.properties, out);
        }
        for filter in &self.filters {
            put_str(out, filter);
        }
    }
}

/// UNSUBACK: the server's answer to an UNSUBSCRIBE.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct UnsubAck {
    /// The UNSUBSCRIBE's packet identifier (not 0).
    pub packet_id: u16,
    /// One per topic filter (5.0): Success, No subscription existed, or a failure. Before
    /// 5.0 an UNSUBACK carries none, so this must be empty.
    pub reason_codes: Vec<ReasonCode>,
    /// Properties (5.0).
    pub properties: AckProperties,
}

impl UnsubAck {
    /// An UNSUBACK without properties.
    pub fn new(packet_id: u16, reason_codes: Vec<ReasonCode>) -> UnsubAck {
        UnsubAck {
            packet_id,
            reason_codes,
            properties: AckProperties::default(),
        }
    }

    pub(crate) fn decode(
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<UnsubAck, DecodeError> {
        let packet_id = r.packet_id()?;
        if !version.is_v5() {
            return Ok(UnsubAck::new(packet_id, Vec::new()));
        }
        let properties = read_properties(r, PropertyContext::UnsubAck)?;
        let mut reason_codes = Vec::with_capacity(r.remaining());
        while !r.is_empty() {
            reason_codes.push(read_reason_code(r, PacketType::UnsubAck, version)?);
        }
        Ok(UnsubAck {
            packet_id,
            reason_codes,
            properties,
        })
    }

    pub(crate) fn body_len(&self, version: ProtocolVersion) -> Result<usize, EncodeError> {
        if self.packet_id == 0 {
            return Err(DecodeError::ZeroPacketId(PacketType::UnsubAck).into());
        }
        if !version.is_v5() && !self.reason_codes.is_empty() {
            return Err(EncodeError::NotInVersion {
                what: "UNSUBACK reason codes",
                version,
            });
        }
        for &code in &self.reason_codes {
            check_reason_code(code, PacketType::UnsubAck, version)?;
        }
        let props = properties_len(&self.properties, version, "UNSUBACK properties")?;
        Ok(2 + props + self.reason_codes.len())
    }

    pub(crate) fn write(&self, version: ProtocolVersion, out: &mut BytesMut) {
        out.put_u16(self.packet_id);
        if version.is_v5() {
            write_properties(&self.properties, out);
            for code in &self.reason_codes {
                out.put_u8(code.as_u8());
            }
        }
    }
}
