//! MQTT 5.0 properties (section 2.2.2): the 27 identifiers, their data types, where each
//! may appear, and the machinery shared by the per-packet property sets of
//! [`properties`](crate::properties): reading one property, checking values, and measuring
//! and writing a property block.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::bytestr::ByteStr;
use crate::error::{DecodeError, EncodeError, snippet};
use crate::packet::{ProtocolVersion, QoS};
use crate::topic::valid_topic_name;
use crate::wire::{
    MAX_VAR_INT, Reader, check_binary, check_str, put_binary, put_str, put_var_int, var_int_len,
};

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
