//! The MQTT 5.0 property sets, one type per packet (or will): each field is a property
//! that packet may carry, so a property in the wrong packet cannot be built, and a
//! duplicate cannot be either (except User Property, and Subscription Identifier in a
//! PUBLISH, which are lists).
//!
//! Before MQTT 5.0 there are no properties: the decoder returns empty sets (`Default`) and
//! the encoder refuses a set that is not empty.

use bytes::Bytes;

use crate::bytestr::ByteStr;
use crate::error::DecodeError;
use crate::property::{PayloadFormat, Properties, Property, Visit, not_allowed, once};
use crate::types::{PropertyContext, PropertyId as P, QoS};

/// User properties: name/value pairs, in wire order. Names may repeat.
pub type UserProperties = Vec<(ByteStr, ByteStr)>;

fn visit_user<V: Visit>(user: &UserProperties, v: &mut V) {
    for (name, value) in user {
        v.pair(P::UserProperty, name, value);
    }
}

/// Properties of a CONNECT (section 3.1.2.11).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ConnectProperties {
    /// Seconds the session outlives the connection (0, the default, ends it with the
    /// connection; `u32::MAX` never expires).
    pub session_expiry_interval: Option<u32>,
    /// Most QoS 1 and 2 PUBLISHes the client processes at once (not 0; default 65,535).
    pub receive_maximum: Option<u16>,
    /// Largest packet the client accepts (not 0; default: no limit beyond the protocol's).
    pub maximum_packet_size: Option<u32>,
    /// Highest topic alias the client accepts from the server (default 0: none).
    pub topic_alias_maximum: Option<u16>,
    /// Whether the client asks for Response Information in the CONNACK (default false).
    pub request_response_information: Option<bool>,
    /// Whether the server may send Reason Strings and User Properties on failures
    /// (default true).
    pub request_problem_information: Option<bool>,
    /// Name of the extended authentication method.
    pub authentication_method: Option<ByteStr>,
    /// Data of the extended authentication method (only with a method).
    pub authentication_data: Option<Bytes>,
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for ConnectProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::SessionExpiryInterval(v) => once(&mut self.session_expiry_interval, v, id),
            Property::ReceiveMaximum(v) => once(&mut self.receive_maximum, v, id),
            Property::MaximumPacketSize(v) => once(&mut self.maximum_packet_size, v, id),
            Property::TopicAliasMaximum(v) => once(&mut self.topic_alias_maximum, v, id),
            Property::RequestResponseInformation(v) => {
                once(&mut self.request_response_information, v, id)
            }
            Property::RequestProblemInformation(v) => {
                once(&mut self.request_problem_information, v, id)
            }
            Property::AuthenticationMethod(v) => once(&mut self.authentication_method, v, id),
            Property::AuthenticationData(v) => once(&mut self.authentication_data, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.session_expiry_interval {
            v.four(P::SessionExpiryInterval, x);
        }
        if let Some(x) = self.receive_maximum {
            v.two(P::ReceiveMaximum, x);
        }
        if let Some(x) = self.maximum_packet_size {
            v.four(P::MaximumPacketSize, x);
        }
        if let Some(x) = self.topic_alias_maximum {
            v.two(P::TopicAliasMaximum, x);
        }
        if let Some(x) = self.request_response_information {
            v.byte(P::RequestResponseInformation, u8::from(x));
        }
        if let Some(x) = self.request_problem_information {
            v.byte(P::RequestProblemInformation, u8::from(x));
        }
        if let Some(x) = &self.authentication_method {
            v.string(P::AuthenticationMethod, x);
        }
        if let Some(x) = &self.authentication_data {
            v.binary(P::AuthenticationData, x);
        }
        visit_user(&self.user_properties, v);
    }

    fn check(&self) -> Result<(), DecodeError> {
        // "It is a Protocol Error to include Authentication Data if there is no
        // Authentication Method" (3.1.2.11.10).
        if self.authentication_data.is_some() && self.authentication_method.is_none() {
            return Err(DecodeError::AuthDataWithoutMethod);
        }
        Ok(())
    }
}

/// Properties of a will message (section 3.1.3.2), in a CONNECT's payload.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct WillProperties {
    /// Seconds the server waits after the connection ends before publishing the will.
    pub will_delay_interval: Option<u32>,
    /// Whether the will payload is UTF-8.
    pub payload_format_indicator: Option<PayloadFormat>,
    /// Lifetime of the will message in seconds.
    pub message_expiry_interval: Option<u32>,
    /// Content type of the will payload (e.g. a MIME type).
    pub content_type: Option<ByteStr>,
    /// Topic for a response: makes the will a request. No wildcards.
    pub response_topic: Option<ByteStr>,
    /// Data the requester uses to match a response to this request.
    pub correlation_data: Option<Bytes>,
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for WillProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::WillDelayInterval(v) => once(&mut self.will_delay_interval, v, id),
            Property::PayloadFormatIndicator(v) => once(&mut self.payload_format_indicator, v, id),
            Property::MessageExpiryInterval(v) => once(&mut self.message_expiry_interval, v, id),
            Property::ContentType(v) => once(&mut self.content_type, v, id),
            Property::ResponseTopic(v) => once(&mut self.response_topic, v, id),
            Property::CorrelationData(v) => once(&mut self.correlation_data, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.will_delay_interval {
            v.four(P::WillDelayInterval, x);
        }
        if let Some(x) = self.payload_format_indicator {
            v.byte(P::PayloadFormatIndicator, x as u8);
        }
        if let Some(x) = self.message_expiry_interval {
            v.four(P::MessageExpiryInterval, x);
        }
        if let Some(x) = &self.content_type {
            v.string(P::ContentType, x);
        }
        if let Some(x) = &self.response_topic {
            v.string(P::ResponseTopic, x);
        }
        if let Some(x) = &self.correlation_data {
            v.binary(P::CorrelationData, x);
        }
        visit_user(&self.user_properties, v);
    }
}

/// Properties of a CONNACK (section 3.2.2.3): what the server grants and supports.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ConnAckProperties {
    /// The session expiry interval the server uses, if not the client's.
    pub session_expiry_interval: Option<u32>,
    /// Most QoS 1 and 2 PUBLISHes the server processes at once (not 0; default 65,535).
    pub receive_maximum: Option<u16>,
    /// Highest QoS the server supports, if below 2 (only 0 or 1 may be sent).
    pub maximum_qos: Option<QoS>,
    /// Whether the server supports retained messages (default true).
    pub retain_available: Option<bool>,
    /// Largest packet the server accepts (not 0).
    pub maximum_packet_size: Option<u32>,
    /// The client identifier the server assigned, when the client sent an empty one.
    pub assigned_client_identifier: Option<ByteStr>,
    /// Highest topic alias the server accepts from the client (default 0: none).
    pub topic_alias_maximum: Option<u16>,
    /// Human-readable diagnostics.
    pub reason_string: Option<ByteStr>,
    /// User properties.
    pub user_properties: UserProperties,
    /// Whether the server supports wildcard subscriptions (default true).
    pub wildcard_subscription_available: Option<bool>,
    /// Whether the server supports subscription identifiers (default true).
    pub subscription_identifiers_available: Option<bool>,
    /// Whether the server supports shared subscriptions (default true).
    pub shared_subscription_available: Option<bool>,
    /// The keep alive the client must use instead of its own.
    pub server_keep_alive: Option<u16>,
    /// Basis for response topics, if the client requested response information.
    pub response_information: Option<ByteStr>,
    /// Another server for the client to use (with 0x9C or 0x9D).
    pub server_reference: Option<ByteStr>,
    /// Name of the extended authentication method.
    pub authentication_method: Option<ByteStr>,
    /// Data of the extended authentication method.
    pub authentication_data: Option<Bytes>,
}

impl Properties for ConnAckProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::SessionExpiryInterval(v) => once(&mut self.session_expiry_interval, v, id),
            Property::ReceiveMaximum(v) => once(&mut self.receive_maximum, v, id),
            Property::MaximumQoS(v) => once(&mut self.maximum_qos, v, id),
            Property::RetainAvailable(v) => once(&mut self.retain_available, v, id),
            Property::MaximumPacketSize(v) => once(&mut self.maximum_packet_size, v, id),
            Property::AssignedClientIdentifier(v) => {
                once(&mut self.assigned_client_identifier, v, id)
            }
            Property::TopicAliasMaximum(v) => once(&mut self.topic_alias_maximum, v, id),
            Property::ReasonString(v) => once(&mut self.reason_string, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            Property::WildcardSubscriptionAvailable(v) => {
                once(&mut self.wildcard_subscription_available, v, id)
            }
            Property::SubscriptionIdentifierAvailable(v) => {
                once(&mut self.subscription_identifiers_available, v, id)
            }
            Property::SharedSubscriptionAvailable(v) => {
                once(&mut self.shared_subscription_available, v, id)
            }
            Property::ServerKeepAlive(v) => once(&mut self.server_keep_alive, v, id),
            Property::ResponseInformation(v) => once(&mut self.response_information, v, id),
            Property::ServerReference(v) => once(&mut self.server_reference, v, id),
            Property::AuthenticationMethod(v) => once(&mut self.authentication_method, v, id),
            Property::AuthenticationData(v) => once(&mut self.authentication_data, v, id),
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.session_expiry_interval {
            v.four(P::SessionExpiryInterval, x);
        }
        if let Some(x) = self.receive_maximum {
            v.two(P::ReceiveMaximum, x);
        }
        if let Some(x) = self.maximum_qos {
            v.byte(P::MaximumQoS, x.as_u8());
        }
        if let Some(x) = self.retain_available {
            v.byte(P::RetainAvailable, u8::from(x));
        }
        if let Some(x) = self.maximum_packet_size {
            v.four(P::MaximumPacketSize, x);
        }
        if let Some(x) = &self.assigned_client_identifier {
            v.string(P::AssignedClientIdentifier, x);
        }
        if let Some(x) = self.topic_alias_maximum {
            v.two(P::TopicAliasMaximum, x);
        }
        if let Some(x) = &self.reason_string {
            v.string(P::ReasonString, x);
        }
        visit_user(&self.user_properties, v);
        if let Some(x) = self.wildcard_subscription_available {
            v.byte(P::WildcardSubscriptionAvailable, u8::from(x));
        }
        if let Some(x) = self.subscription_identifiers_available {
            v.byte(P::SubscriptionIdentifierAvailable, u8::from(x));
        }
        if let Some(x) = self.shared_subscription_available {
            v.byte(P::SharedSubscriptionAvailable, u8::from(x));
        }
        if let Some(x) = self.server_keep_alive {
            v.two(P::ServerKeepAlive, x);
        }
        if let Some(x) = &self.response_information {
            v.string(P::ResponseInformation, x);
        }
        if let Some(x) = &self.server_reference {
            v.string(P::ServerReference, x);
        }
        if let Some(x) = &self.authentication_method {
            v.string(P::AuthenticationMethod, x);
        }
        if let Some(x) = &self.authentication_data {
            v.binary(P::AuthenticationData, x);
        }
    }
}

/// Properties of a PUBLISH (section 3.3.2.3).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PublishProperties {
    /// Whether the payload is UTF-8.
    pub payload_format_indicator: Option<PayloadFormat>,
    /// Lifetime of the message in seconds. A server forwarding the message sends what is
    /// left of it.
    pub message_expiry_interval: Option<u32>,
    /// A topic alias (not 0): stands for the topic, which may then be empty.
    pub topic_alias: Option<u16>,
    /// Topic for a response: makes the message a request. No wildcards.
    pub response_topic: Option<ByteStr>,
    /// Data the requester uses to match a response to this request.
    pub correlation_data: Option<Bytes>,
    /// User properties, in order; a server forwards them unchanged.
    pub user_properties: UserProperties,
    /// From server to client: the identifiers of the subscriptions that matched (each
    /// 1 to 268,435,455). A client must not send them.
    pub subscription_identifiers: Vec<u32>,
    /// Content type of the payload (e.g. a MIME type).
    pub content_type: Option<ByteStr>,
}

impl Properties for PublishProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::PayloadFormatIndicator(v) => once(&mut self.payload_format_indicator, v, id),
            Property::MessageExpiryInterval(v) => once(&mut self.message_expiry_interval, v, id),
            Property::TopicAlias(v) => once(&mut self.topic_alias, v, id),
            Property::ResponseTopic(v) => once(&mut self.response_topic, v, id),
            Property::CorrelationData(v) => once(&mut self.correlation_data, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            Property::SubscriptionIdentifier(v) => {
                self.subscription_identifiers.push(v);
                Ok(())
            }
            Property::ContentType(v) => once(&mut self.content_type, v, id),
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.payload_format_indicator {
            v.byte(P::PayloadFormatIndicator, x as u8);
        }
        if let Some(x) = self.message_expiry_interval {
            v.four(P::MessageExpiryInterval, x);
        }
        if let Some(x) = self.topic_alias {
            v.two(P::TopicAlias, x);
        }
        if let Some(x) = &self.response_topic {
            v.string(P::ResponseTopic, x);
        }
        if let Some(x) = &self.correlation_data {
            v.binary(P::CorrelationData, x);
        }
        visit_user(&self.user_properties, v);
        for &x in &self.subscription_identifiers {
            v.var(P::SubscriptionIdentifier, x);
        }
        if let Some(x) = &self.content_type {
            v.string(P::ContentType, x);
        }
    }
}

/// Properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK: a reason string
/// and user properties.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct AckProperties {
    /// Human-readable diagnostics.
    pub reason_string: Option<ByteStr>,
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for AckProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::ReasonString(v) => once(&mut self.reason_string, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = &self.reason_string {
            v.string(P::ReasonString, x);
        }
        visit_user(&self.user_properties, v);
    }
}

/// Properties of a SUBSCRIBE (section 3.8.2.1).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SubscribeProperties {
    /// Identifier (1 to 268,435,455) the server sends back in every PUBLISH these
    /// subscriptions match.
    pub subscription_identifier: Option<u32>,
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for SubscribeProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::SubscriptionIdentifier(v) => once(&mut self.subscription_identifier, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.subscription_identifier {
            v.var(P::SubscriptionIdentifier, x);
        }
        visit_user(&self.user_properties, v);
    }
}

/// Properties of an UNSUBSCRIBE (section 3.10.2.1): user properties only.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct UnsubscribeProperties {
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for UnsubscribeProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        match p {
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        visit_user(&self.user_properties, v);
    }
}

/// Properties of a DISCONNECT (section 3.14.2.2).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct DisconnectProperties {
    /// From the client: a new session expiry interval (not allowed to turn a 0 from the
    /// CONNECT into non-zero; that check is the session's).
    pub session_expiry_interval: Option<u32>,
    /// Human-readable diagnostics.
    pub reason_string: Option<ByteStr>,
    /// User properties.
    pub user_properties: UserProperties,
    /// From the server: another server for the client to use.
    pub server_reference: Option<ByteStr>,
}

impl Properties for DisconnectProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::SessionExpiryInterval(v) => once(&mut self.session_expiry_interval, v, id),
            Property::ReasonString(v) => once(&mut self.reason_string, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            Property::ServerReference(v) => once(&mut self.server_reference, v, id),
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = self.session_expiry_interval {
            v.four(P::SessionExpiryInterval, x);
        }
        if let Some(x) = &self.reason_string {
            v.string(P::ReasonString, x);
        }
        visit_user(&self.user_properties, v);
        if let Some(x) = &self.server_reference {
            v.string(P::ServerReference, x);
        }
    }
}

/// Properties of an AUTH (section 3.15.2.2).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct AuthProperties {
    /// Name of the authentication method (the specification requires it in every AUTH;
    /// checking that is the session's, as is checking it matches the CONNECT's).
    pub authentication_method: Option<ByteStr>,
    /// Data of the authentication method.
    pub authentication_data: Option<Bytes>,
    /// Human-readable diagnostics.
    pub reason_string: Option<ByteStr>,
    /// User properties.
    pub user_properties: UserProperties,
}

impl Properties for AuthProperties {
    fn set(&mut self, p: Property, context: PropertyContext) -> Result<(), DecodeError> {
        let id = p.id();
        match p {
            Property::AuthenticationMethod(v) => once(&mut self.authentication_method, v, id),
            Property::AuthenticationData(v) => once(&mut self.authentication_data, v, id),
            Property::ReasonString(v) => once(&mut self.reason_string, v, id),
            Property::UserProperty(k, v) => {
                self.user_properties.push((k, v));
                Ok(())
            }
            other => Err(not_allowed(&other, context)),
        }
    }

    fn visit<V: Visit>(&self, v: &mut V) {
        if let Some(x) = &self.authentication_method {
            v.string(P::AuthenticationMethod, x);
        }
        if let Some(x) = &self.authentication_data {
            v.binary(P::AuthenticationData, x);
        }
        if let Some(x) = &self.reason_string {
            v.string(P::ReasonString, x);
        }
        visit_user(&self.user_properties, v);
    }
}
