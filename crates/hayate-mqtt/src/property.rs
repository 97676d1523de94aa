//! MQTT 5.0 properties (section 2.2.2): the 27 identifiers, their data types, where each
//! may appear ([`PropertyId`], [`PropertyType`], [`PropertyContext`]: defined in the crate's
//! dependency-free `types` module and re-exported here), and the machinery shared by the
//! per-packet property sets of [`properties`](crate::properties): reading one property,
//! checking values, and measuring and writing a property block.

use bytes::{BufMut, Bytes, BytesMut};

use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError, snippet};
use crate::topic::valid_topic_name;
use crate::types::{ProtocolVersion, QoS};
use crate::wire::{
    MAX_VAR_INT, Reader, check_binary, check_str, put_binary, put_str, put_var_int, var_int_len,
};

pub use crate::types::{PropertyContext, PropertyId, PropertyType};

/// The Payload Format Indicator of a PUBLISH or a will.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[repr(u8)]
pub enum PayloadFormat {
    /// 0: unspecified bytes (the same as no indicator).
    #[default]
    Unspecified = 0,
    /// 1: UTF-8 encoded character data.
    Utf8 = 1,
}

/// One property with its typed value, as read from the wire.
///
/// Values are checked on reading: flags (Byte properties other than Payload Format
/// Indicator and Maximum QoS) are 0 or 1, Receive Maximum, Maximum Packet Size, Topic Alias
/// and Subscription Identifier are not 0, Maximum QoS is 0 or 1, a Response Topic has no
/// wildcards.
#[derive(Clone, PartialEq, Eq, Debug)]
#[allow(missing_docs)] // each variant is the property of the same name in `PropertyId`
pub enum Property {
    PayloadFormatIndicator(PayloadFormat),
    MessageExpiryInterval(u32),
    ContentType(ByteStr),
    ResponseTopic(ByteStr),
    CorrelationData(Bytes),
    SubscriptionIdentifier(u32),
    SessionExpiryInterval(u32),
    AssignedClientIdentifier(ByteStr),
    ServerKeepAlive(u16),
    AuthenticationMethod(ByteStr),
    AuthenticationData(Bytes),
    RequestProblemInformation(bool),
    WillDelayInterval(u32),
    RequestResponseInformation(bool),
    ResponseInformation(ByteStr),
    ServerReference(ByteStr),
    ReasonString(ByteStr),
    ReceiveMaximum(u16),
    TopicAliasMaximum(u16),
    TopicAlias(u16),
    MaximumQoS(QoS),
    RetainAvailable(bool),
    UserProperty(ByteStr, ByteStr),
    MaximumPacketSize(u32),
    WildcardSubscriptionAvailable(bool),
    SubscriptionIdentifierAvailable(bool),
    SharedSubscriptionAvailable(bool),
}

impl Property {
    /// The property's identifier.
    pub fn id(&self) -> PropertyId {
        use PropertyId as P;
        match self {
            Property::PayloadFormatIndicator(_) => P::PayloadFormatIndicator,
            Property::MessageExpiryInterval(_) => P::MessageExpiryInterval,
            Property::ContentType(_) => P::ContentType,
            Property::ResponseTopic(_) => P::ResponseTopic,
            Property::CorrelationData(_) => P::CorrelationData,
            Property::SubscriptionIdentifier(_) => P::SubscriptionIdentifier,
            Property::SessionExpiryInterval(_) => P::SessionExpiryInterval,
            Property::AssignedClientIdentifier(_) => P::AssignedClientIdentifier,
            Property::ServerKeepAlive(_) => P::ServerKeepAlive,
            Property::AuthenticationMethod(_) => P::AuthenticationMethod,
            Property::AuthenticationData(_) => P::AuthenticationData,
            Property::RequestProblemInformation(_) => P::RequestProblemInformation,
            Property::WillDelayInterval(_) => P::WillDelayInterval,
            Property::RequestResponseInformation(_) => P::RequestResponseInformation,
            Property::ResponseInformation(_) => P::ResponseInformation,
            Property::ServerReference(_) => P::ServerReference,
            Property::ReasonString(_) => P::ReasonString,
            Property::ReceiveMaximum(_) => P::ReceiveMaximum,
            Property::TopicAliasMaximum(_) => P::TopicAliasMaximum,
            Property::TopicAlias(_) => P::TopicAlias,
            Property::MaximumQoS(_) => P::MaximumQoS,
            Property::RetainAvailable(_) => P::RetainAvailable,
            Property::UserProperty(_, _) => P::UserProperty,
            Property::MaximumPacketSize(_) => P::MaximumPacketSize,
            Property::WildcardSubscriptionAvailable(_) => P::WildcardSubscriptionAvailable,
            Property::SubscriptionIdentifierAvailable(_) => P::SubscriptionIdentifierAvailable,
            Property::SharedSubscriptionAvailable(_) => P::SharedSubscriptionAvailable,
        }
    }
}

/// Checks an integer property value (both directions): see [`Property`].
pub(crate) fn check_value(id: PropertyId, value: u32) -> Result<(), DecodeError> {
    use PropertyId as P;
    let ok = match id {
        P::PayloadFormatIndicator
        | P::RequestProblemInformation
        | P::RequestResponseInformation
        | P::MaximumQoS
        | P::RetainAvailable
        | P::WildcardSubscriptionAvailable
        | P::SubscriptionIdentifierAvailable
        | P::SharedSubscriptionAvailable => value <= 1,
        P::ReceiveMaximum | P::TopicAlias | P::MaximumPacketSize => value != 0,
        P::SubscriptionIdentifier => (1..=MAX_VAR_INT).contains(&value),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(DecodeError::InvalidPropertyValue {
            property: id,
            value,
        })
    }
}

/// Checks a string property value beyond the rules for every string: a Response Topic must
/// be a valid topic name.
pub(crate) fn check_string(id: PropertyId, value: &str) -> Result<(), DecodeError> {
    if id == PropertyId::ResponseTopic && !valid_topic_name(value) {
        return Err(DecodeError::InvalidResponseTopic(snippet(value)));
    }
    Ok(())
}

/// Reads one property (identifier and value) and checks its value.
pub(crate) fn read_property(r: &mut Reader) -> Result<Property, DecodeError> {
    use PropertyId as P;
    let raw = r.var_int()?;
    let id = u8::try_from(raw)
        .ok()
        .and_then(PropertyId::from_u8)
        .ok_or(DecodeError::UnknownProperty(raw))?;
    let byte = |r: &mut Reader| -> Result<u8, DecodeError> {
        let v = r.u8()?;
        check_value(id, u32::from(v))?;
        Ok(v)
    };
    let flag = |r: &mut Reader| -> Result<bool, DecodeError> { Ok(byte(r)? == 1) };
    let two = |r: &mut Reader| -> Result<u16, DecodeError> {
        let v = r.u16()?;
        check_value(id, u32::from(v))?;
        Ok(v)
    };
    let four = |r: &mut Reader| -> Result<u32, DecodeError> {
        let v = r.u32()?;
        check_value(id, v)?;
        Ok(v)
    };
    let string = |r: &mut Reader| -> Result<ByteStr, DecodeError> {
        let v = r.string()?;
        check_string(id, &v)?;
        Ok(v)
    };
    Ok(match id {
        P::PayloadFormatIndicator => Property::PayloadFormatIndicator(if byte(r)? == 1 {
            PayloadFormat::Utf8
        } else {
            PayloadFormat::Unspecified
        }),
        P::MessageExpiryInterval => Property::MessageExpiryInterval(four(r)?),
        P::ContentType => Property::ContentType(string(r)?),
        P::ResponseTopic => Property::ResponseTopic(string(r)?),
        P::CorrelationData => Property::CorrelationData(r.binary()?),
        P::SubscriptionIdentifier => {
            let v = r.var_int()?;
            check_value(id, v)?;
            Property::SubscriptionIdentifier(v)
        }
        P::SessionExpiryInterval => Property::SessionExpiryInterval(four(r)?),
        P::AssignedClientIdentifier => Property::AssignedClientIdentifier(string(r)?),
        P::ServerKeepAlive => Property::ServerKeepAlive(two(r)?),
        P::AuthenticationMethod => Property::AuthenticationMethod(string(r)?),
        P::AuthenticationData => Property::AuthenticationData(r.binary()?),
        P::RequestProblemInformation => Property::RequestProblemInformation(flag(r)?),
        P::WillDelayInterval => Property::WillDelayInterval(four(r)?),
        P::RequestResponseInformation => Property::RequestResponseInformation(flag(r)?),
        P::ResponseInformation => Property::ResponseInformation(string(r)?),
        P::ServerReference => Property::ServerReference(string(r)?),
        P::ReasonString => Property::ReasonString(string(r)?),
        P::ReceiveMaximum => Property::ReceiveMaximum(two(r)?),
        P::TopicAliasMaximum => Property::TopicAliasMaximum(two(r)?),
        P::TopicAlias => Property::TopicAlias(two(r)?),
        P::MaximumQoS => Property::MaximumQoS(if byte(r)? == 1 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        }),
        P::RetainAvailable => Property::RetainAvailable(flag(r)?),
        P::UserProperty => Property::UserProperty(r.string()?, r.string()?),
        P::MaximumPacketSize => Property::MaximumPacketSize(four(r)?),
        P::WildcardSubscriptionAvailable => Property::WildcardSubscriptionAvailable(flag(r)?),
        P::SubscriptionIdentifierAvailable => Property::SubscriptionIdentifierAvailable(flag(r)?),
        P::SharedSubscriptionAvailable => Property::SharedSubscriptionAvailable(flag(r)?),
    })
}

/// Visits the properties of a property set, in the order they are written. Implemented by
/// [`Measure`] (size and checks) and [`Writer`].
pub(crate) trait Visit {
    fn byte(&mut self, id: PropertyId, value: u8);
    fn two(&mut self, id: PropertyId, value: u16);
    fn four(&mut self, id: PropertyId, value: u32);
    fn var(&mut self, id: PropertyId, value: u32);
    fn string(&mut self, id: PropertyId, value: &str);
    fn binary(&mut self, id: PropertyId, value: &[u8]);
    fn pair(&mut self, id: PropertyId, name: &str, value: &str);
}

/// A per-packet set of properties: read property by property, written through [`Visit`].
pub(crate) trait Properties: Default {
    /// Stores one property read in `context`. Fails on a property not allowed there and on
    /// a second occurrence of a property that may appear once.
    fn set(&mut self, property: Property, context: PropertyContext) -> Result<(), DecodeError>;

    /// Visits every property present, in wire order.
    fn visit<V: Visit>(&self, v: &mut V);

    /// Rules between properties, checked after reading and before writing.
    fn check(&self) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// Stores a property that may appear at most once.
pub(crate) fn once<T>(slot: &mut Option<T>, value: T, id: PropertyId) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::DuplicateProperty(id));
    }
    *slot = Some(value);
    Ok(())
}

/// The error for a property that `context` does not allow.
pub(crate) fn not_allowed(property: &Property, context: PropertyContext) -> DecodeError {
    DecodeError::PropertyNotAllowed {
        property: property.id(),
        context,
    }
}

/// Reads a property block (its length, then properties up to that length) into `T`.
pub(crate) fn read_properties<T: Properties>(
    r: &mut Reader,
    context: PropertyContext,
) -> Result<T, DecodeError> {
    let len = r.var_int()?;
    let mut block = r.sub(len as usize)?;
    let mut props = T::default();
    while !block.is_empty() {
        props.set(read_property(&mut block)?, context)?;
    }
    props.check()?;
    Ok(props)
}

/// Sums the size of a property block's contents and checks every value.
#[derive(Default)]
pub(crate) struct Measure {
    len: usize,
    error: Option<EncodeError>,
}

impl Measure {
    fn add(&mut self, size: Result<usize, EncodeError>) {
        match size {
            Ok(n) => self.len += n,
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, e: EncodeError) {
        self.error.get_or_insert(e);
    }

    fn check(&mut self, r: Result<(), DecodeError>) {
        if let Err(e) = r {
            self.fail(e.into());
        }
    }
}

// Each property starts with its one-byte identifier.
impl Visit for Measure {
    fn byte(&mut self, id: PropertyId, value: u8) {
        self.len += 2;
        self.check(check_value(id, u32::from(value)));
    }

    fn two(&mut self, id: PropertyId, value: u16) {
        self.len += 3;
        self.check(check_value(id, u32::from(value)));
    }

    fn four(&mut self, id: PropertyId, value: u32) {
        self.len += 5;
        self.check(check_value(id, value));
    }

    fn var(&mut self, id: PropertyId, value: u32) {
        self.len += 1 + var_int_len(value);
        self.check(check_value(id, value));
    }

    fn string(&mut self, id: PropertyId, value: &str) {
        self.len += 1;
        self.add(check_str(value));
        self.check(check_string(id, value));
    }

    fn binary(&mut self, _id: PropertyId, value: &[u8]) {
        self.len += 1;
        self.add(check_binary(value));
    }

    fn pair(&mut self, _id: PropertyId, name: &str, value: &str) {
        self.len += 1;
        self.add(check_str(name));
        self.add(check_str(value));
    }
}

/// Writes properties checked by [`Measure`].
pub(crate) struct Writer<'a>(pub(crate) &'a mut BytesMut);

impl Visit for Writer<'_> {
    fn byte(&mut self, id: PropertyId, value: u8) {
        self.0.put_u8(id.as_u8());
        self.0.put_u8(value);
    }

    fn two(&mut self, id: PropertyId, value: u16) {
        self.0.put_u8(id.as_u8());
        self.0.put_u16(value);
    }

    fn four(&mut self, id: PropertyId, value: u32) {
        self.0.put_u8(id.as_u8());
        self.0.put_u32(value);
    }

    fn var(&mut self, id: PropertyId, value: u32) {
        self.0.put_u8(id.as_u8());
        put_var_int(self.0, value);
    }

    fn string(&mut self, id: PropertyId, value: &str) {
        self.0.put_u8(id.as_u8());
        put_str(self.0, value);
    }

    fn binary(&mut self, id: PropertyId, value: &[u8]) {
        self.0.put_u8(id.as_u8());
        put_binary(self.0, value);
    }

    fn pair(&mut self, id: PropertyId, name: &str, value: &str) {
        self.0.put_u8(id.as_u8());
        put_str(self.0, name);
        put_str(self.0, value);
    }
}

/// The size of a property block's contents (without the length prefix), after checking
/// every value and the rules between properties.
pub(crate) fn content_len<T: Properties>(props: &T) -> Result<usize, EncodeError> {
    props.check()?;
    let mut m = Measure::default();
    props.visit(&mut m);
    match m.error {
        Some(e) => Err(e),
        None => Ok(m.len),
    }
}

/// The size of a whole property block whose contents take `content` bytes.
pub(crate) fn block_len(content: usize) -> usize {
    var_int_len(u32::try_from(content).unwrap_or(u32::MAX)) + content
}

/// The size of a property set's contents, without checking it.
fn raw_len<T: Properties>(props: &T) -> usize {
    let mut m = Measure::default();
    props.visit(&mut m);
    m.len
}

/// Whether a property set is empty (writes nothing).
pub(crate) fn is_empty<T: Properties>(props: &T) -> bool {
    raw_len(props) == 0
}

/// Writes a property block, length prefix first, of a property set checked by
/// [`content_len`].
pub(crate) fn write_properties<T: Properties>(props: &T, out: &mut BytesMut) {
    // The packet's remaining length, which includes the contents, was checked to fit.
    put_var_int(out, u32::try_from(raw_len(props)).unwrap_or(MAX_VAR_INT));
    props.visit(&mut Writer(out));
}

/// The size of a property block in `version`: the whole block in 5.0; before 5.0 nothing,
/// and an error if the set is not empty.
pub(crate) fn properties_len<T: Properties>(
    props: &T,
    version: ProtocolVersion,
    what: &'static str,
) -> Result<usize, EncodeError> {
    if version.is_v5() {
        Ok(block_len(content_len(props)?))
    } else if is_empty(props) {
        Ok(0)
    } else {
        Err(EncodeError::NotInVersion { what, version })
    }
}
