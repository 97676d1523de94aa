//! MQTT 5.0 reason codes (section 2.4 of the specification), which packet may carry which,
//! and the MQTT 3.1.1 CONNACK return codes they stand for.

use std::fmt;

use crate::types::{PacketType, ProtocolVersion, QoS};

/// Declares [`ReasonCode`] from one table: variant, value, the specification's name.
macro_rules! reason_codes {
    ($( $(#[$doc:meta])* $variant:ident = $value:literal, $name:literal; )*) => {
        /// An MQTT 5.0 reason code: the outcome of an operation, carried by CONNACK, PUBACK,
        /// PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK, DISCONNECT and AUTH. Values of 0x80
        /// and above are failures.
        ///
        /// Value 0x00 has three names in the specification (Success, Normal disconnection,
        /// Granted QoS 0); here it is [`ReasonCode::Success`], with the aliases
        /// [`ReasonCode::NORMAL_DISCONNECTION`] and [`ReasonCode::GRANTED_QOS_0`].
        ///
        /// MQTT 3.1.1 packets carry a subset: CONNACK return codes 0 to 5 are mapped to
        /// their 5.0 equivalents ([`ReasonCode::from_v3_connack`]), SUBACK return codes
        /// 0x00, 0x01, 0x02 and 0x80 have the same values in both versions, and every other
        /// 3.1.1 acknowledgement is implicitly [`ReasonCode::Success`].
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
        #[repr(u8)]
        pub enum ReasonCode {
            $( $(#[$doc])* $variant = $value, )*
        }

        impl ReasonCode {
            /// Every reason code, in numeric order.
            pub const ALL: &[ReasonCode] = &[$( ReasonCode::$variant, )*];

            /// The reason code with this value, if the specification defines one.
            pub fn from_u8(value: u8) -> Option<ReasonCode> {
                match value {
                    $( $value => Some(ReasonCode::$variant), )*
                    _ => None,
                }
            }

            /// The name the specification gives this value (the first one, for 0x00).
            pub fn name(self) -> &'static str {
                match self {
                    $( ReasonCode::$variant => $name, )*
                }
            }
        }
    };
}

reason_codes! {
    /// 0x00 Success; also Normal disconnection (DISCONNECT) and Granted QoS 0 (SUBACK).
    /// The default.
    #[default]
    Success = 0x00, "Success";
    /// 0x01 Granted QoS 1 (SUBACK).
    GrantedQoS1 = 0x01, "Granted QoS 1";
    /// 0x02 Granted QoS 2 (SUBACK).
    GrantedQoS2 = 0x02, "Granted QoS 2";
    /// 0x04 Disconnect with Will Message (DISCONNECT from a client: publish the will).
    DisconnectWithWillMessage = 0x04, "Disconnect with Will Message";
    /// 0x10 No matching subscribers (PUBACK, PUBREC).
    NoMatchingSubscribers = 0x10, "No matching subscribers";
    /// 0x11 No subscription existed (UNSUBACK).
    NoSubscriptionExisted = 0x11, "No subscription existed";
    /// 0x18 Continue authentication (AUTH).
    ContinueAuthentication = 0x18, "Continue authentication";
    /// 0x19 Re-authenticate (AUTH).
    ReAuthenticate = 0x19, "Re-authenticate";
    /// 0x80 Unspecified error; also the 3.1.1 SUBACK failure return code.
    UnspecifiedError = 0x80, "Unspecified error";
    /// 0x81 Malformed Packet: the packet could not be parsed according to the specification.
    MalformedPacket = 0x81, "Malformed Packet";
    /// 0x82 Protocol Error: the packet broke a rule of the specification.
    ProtocolError = 0x82, "Protocol Error";
    /// 0x83 Implementation specific error.
    ImplementationSpecificError = 0x83, "Implementation specific error";
    /// 0x84 Unsupported Protocol Version (CONNACK; 3.1.1 return code 1).
    UnsupportedProtocolVersion = 0x84, "Unsupported Protocol Version";
    /// 0x85 Client Identifier not valid (CONNACK; 3.1.1 return code 2).
    ClientIdentifierNotValid = 0x85, "Client Identifier not valid";
    /// 0x86 Bad User Name or Password (CONNACK; 3.1.1 return code 4).
    BadUserNameOrPassword = 0x86, "Bad User Name or Password";
    /// 0x87 Not authorized (3.1.1 CONNACK return code 5).
    NotAuthorized = 0x87, "Not authorized";
    /// 0x88 Server unavailable (CONNACK; 3.1.1 return code 3).
    ServerUnavailable = 0x88, "Server unavailable";
    /// 0x89 Server busy.
    ServerBusy = 0x89, "Server busy";
    /// 0x8A Banned (CONNACK).
    Banned = 0x8A, "Banned";
    /// 0x8B Server shutting down (DISCONNECT).
    ServerShuttingDown = 0x8B, "Server shutting down";
    /// 0x8C Bad authentication method (CONNACK, DISCONNECT).
    BadAuthenticationMethod = 0x8C, "Bad authentication method";
    /// 0x8D Keep Alive timeout (DISCONNECT).
    KeepAliveTimeout = 0x8D, "Keep Alive timeout";
    /// 0x8E Session taken over (DISCONNECT).
    SessionTakenOver = 0x8E, "Session taken over";
    /// 0x8F Topic Filter invalid.
    TopicFilterInvalid = 0x8F, "Topic Filter invalid";
    /// 0x90 Topic Name invalid.
    TopicNameInvalid = 0x90, "Topic Name invalid";
    /// 0x91 Packet Identifier in use.
    PacketIdentifierInUse = 0x91, "Packet Identifier in use";
    /// 0x92 Packet Identifier not found (PUBREL, PUBCOMP).
    PacketIdentifierNotFound = 0x92, "Packet Identifier not found";
    /// 0x93 Receive Maximum exceeded (DISCONNECT).
    ReceiveMaximumExceeded = 0x93, "Receive Maximum exceeded";
    /// 0x94 Topic Alias invalid (DISCONNECT).
    TopicAliasInvalid = 0x94, "Topic Alias invalid";
    /// 0x95 Packet too large.
    PacketTooLarge = 0x95, "Packet too large";
    /// 0x96 Message rate too high (DISCONNECT).
    MessageRateTooHigh = 0x96, "Message rate too high";
    /// 0x97 Quota exceeded.
    QuotaExceeded = 0x97, "Quota exceeded";
    /// 0x98 Administrative action (DISCONNECT).
    AdministrativeAction = 0x98, "Administrative action";
    /// 0x99 Payload format invalid.
    PayloadFormatInvalid = 0x99, "Payload format invalid";
    /// 0x9A Retain not supported.
    RetainNotSupported = 0x9A, "Retain not supported";
    /// 0x9B QoS not supported.
    QoSNotSupported = 0x9B, "QoS not supported";
    /// 0x9C Use another server.
    UseAnotherServer = 0x9C, "Use another server";
    /// 0x9D Server moved.
    ServerMoved = 0x9D, "Server moved";
    /// 0x9E Shared Subscriptions not supported.
    SharedSubscriptionsNotSupported = 0x9E, "Shared Subscriptions not supported";
    /// 0x9F Connection rate exceeded.
    ConnectionRateExceeded = 0x9F, "Connection rate exceeded";
    /// 0xA0 Maximum connect time (DISCONNECT).
    MaximumConnectTime = 0xA0, "Maximum connect time";
    /// 0xA1 Subscription Identifiers not supported.
    SubscriptionIdentifiersNotSupported = 0xA1, "Subscription Identifiers not supported";
    /// 0xA2 Wildcard Subscriptions not supported.
    WildcardSubscriptionsNotSupported = 0xA2, "Wildcard Subscriptions not supported";
}

impl ReasonCode {
    /// 0x00 in a DISCONNECT: "Normal disconnection".
    pub const NORMAL_DISCONNECTION: ReasonCode = ReasonCode::Success;
    /// 0x00 in a SUBACK: "Granted QoS 0".
    pub const GRANTED_QOS_0: ReasonCode = ReasonCode::Success;

    /// The wire value.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether this is a failure (0x80 and above).
    pub fn is_error(self) -> bool {
        self.as_u8() >= 0x80
    }

    /// The SUBACK reason code granting `qos`.
    pub fn granted(qos: QoS) -> ReasonCode {
        match qos {
            QoS::AtMostOnce => ReasonCode::Success,
            QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
            QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
        }
    }

    /// The 5.0 equivalent of an MQTT 3.1(.1) CONNACK return code (0 to 5).
    pub fn from_v3_connack(code: u8) -> Option<ReasonCode> {
        Some(match code {
            0 => ReasonCode::Success,
            1 => ReasonCode::UnsupportedProtocolVersion,
            2 => ReasonCode::ClientIdentifierNotValid,
            3 => ReasonCode::ServerUnavailable,
            4 => ReasonCode::BadUserNameOrPassword,
            5 => ReasonCode::NotAuthorized,
            _ => return None,
        })
    }

    /// The MQTT 3.1(.1) CONNACK return code for this reason code, if 3.1.1 has one.
    pub fn to_v3_connack(self) -> Option<u8> {
        Some(match self {
            ReasonCode::Success => 0,
            ReasonCode::UnsupportedProtocolVersion => 1,
            ReasonCode::ClientIdentifierNotValid => 2,
            ReasonCode::ServerUnavailable => 3,
            ReasonCode::BadUserNameOrPassword => 4,
            ReasonCode::NotAuthorized => 5,
            _ => return None,
        })
    }

    /// Whether a `packet` of protocol `version` may carry this reason code (the tables of
    /// sections 3.2.2.2, 3.4.2.1, 3.5.2.1, 3.6.2.1, 3.7.2.1, 3.9.3, 3.11.3, 3.14.2.1 and
    /// 3.15.2.1; for 3.1.1, the codes listed in [`ReasonCode`]'s documentation).
    pub fn allowed_in(self, packet: PacketType, version: ProtocolVersion) -> bool {
        use ReasonCode as R;
        if !version.is_v5() {
            return match packet {
                PacketType::ConnAck => self.to_v3_connack().is_some(),
                PacketType::SubAck => matches!(
                    self,
                    R::Success | R::GrantedQoS1 | R::GrantedQoS2 | R::UnspecifiedError
                ),
                PacketType::PubAck
                | PacketType::PubRec
                | PacketType::PubRel
                | PacketType::PubComp
                | PacketType::Disconnect => self == R::Success,
                _ => false,
            };
        }
        match packet {
            PacketType::ConnAck => matches!(
                self,
                R::Success
                    | R::UnspecifiedError
                    | R::MalformedPacket
                    | R::ProtocolError
                    | R::ImplementationSpecificError
                    | R::UnsupportedProtocolVersion
                    | R::ClientIdentifierNotValid
                    | R::BadUserNameOrPassword
                    | R::NotAuthorized
                    | R::ServerUnavailable
                    | R::ServerBusy
                    | R::Banned
                    | R::BadAuthenticationMethod
                    | R::TopicNameInvalid
                    | R::PacketTooLarge
                    | R::QuotaExceeded
                    | R::PayloadFormatInvalid
                    | R::RetainNotSupported
                    | R::QoSNotSupported
                    | R::UseAnotherServer
                    | R::ServerMoved
                    | R::ConnectionRateExceeded
            ),
            PacketType::PubAck | PacketType::PubRec => matches!(
                self,
                R::Success
                    | R::NoMatchingSubscribers
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicNameInvalid
                    | R::PacketIdentifierInUse
                    | R::QuotaExceeded
                    | R::PayloadFormatInvalid
            ),
            PacketType::PubRel | PacketType::PubComp => {
                matches!(self, R::Success | R::PacketIdentifierNotFound)
            }
            PacketType::SubAck => matches!(
                self,
                R::Success
                    | R::GrantedQoS1
                    | R::GrantedQoS2
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicFilterInvalid
                    | R::PacketIdentifierInUse
                    | R::QuotaExceeded
                    | R::SharedSubscriptionsNotSupported
                    | R::SubscriptionIdentifiersNotSupported
                    | R::WildcardSubscriptionsNotSupported
            ),
            PacketType::UnsubAck => matches!(
                self,
                R::Success
                    | R::NoSubscriptionExisted
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicFilterInvalid
                    | R::PacketIdentifierInUse
            ),
            PacketType::Disconnect => matches!(
                self,
                R::Success
                    | R::DisconnectWithWillMessage
                    | R::UnspecifiedError
                    | R::MalformedPacket
                    | R::ProtocolError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::ServerBusy
                    | R::ServerShuttingDown
                    // Listed for DISCONNECT in section 2.4, though not in 3.14.2.1.
                    | R::BadAuthenticationMethod
                    | R::KeepAliveTimeout
                    | R::SessionTakenOver
                    | R::TopicFilterInvalid
                    | R::TopicNameInvalid
                    | R::ReceiveMaximumExceeded
                    | R::TopicAliasInvalid
                    | R::PacketTooLarge
                    | R::MessageRateTooHigh
                    | R::QuotaExceeded
                    | R::AdministrativeAction
                    | R::PayloadFormatInvalid
                    | R::RetainNotSupported
                    | R::QoSNotSupported
                    | R::UseAnotherServer
                    | R::ServerMoved
                    | R::SharedSubscriptionsNotSupported
                    | R::ConnectionRateExceeded
                    | R::MaximumConnectTime
                    | R::SubscriptionIdentifiersNotSupported
                    | R::WildcardSubscriptionsNotSupported
            ),
            PacketType::Auth => matches!(
                self,
                R::Success | R::ContinueAuthentication | R::ReAuthenticate
            ),
            _ => false,
        }
    }
}

impl fmt::Display for ReasonCode {
    /// `0x87 Not authorized`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x} {}", self.as_u8(), self.name())
    }
}
