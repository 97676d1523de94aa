//! Methods: every method of the connection, channel, exchange, queue, basic, confirm and tx
//! classes, with their fields in the spec's order. Consecutive `bool` fields are bits packed
//! into octets (lowest bit first); `reserved_*` fields are carried as they came.
//!
//! One table below ([`methods!`]) declares each method once: its variant, class and method
//! ids, and fields; the encoder, decoder and names are generated from it.

use bytes::{Bytes, BytesMut};

use crate::error::DecodeError;
use crate::types::{FieldTable, Reader, ShortStr, Writer};

/// Class ids.
pub const CONNECTION: u16 = 10;
/// Channel class.
pub const CHANNEL: u16 = 20;
/// Exchange class.
pub const EXCHANGE: u16 = 40;
/// Queue class.
pub const QUEUE: u16 = 50;
/// Basic class.
pub const BASIC: u16 = 60;
/// Confirm class (RabbitMQ's publisher confirms).
pub const CONFIRM: u16 = 85;
/// Tx class.
pub const TX: u16 = 90;

/// A field type of a method.
trait Field: Sized {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
    fn write(&self, w: &mut Writer<'_>);
}

impl Field for u8 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u8()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u8(*self)
    }
}

impl Field for u16 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u16()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u16(*self)
    }
}

impl Field for u32 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u32()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(*self)
    }
}

impl Field for u64 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u64()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(*self)
    }
}

impl Field for bool {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.bit()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.bit(*self)
    }
}

impl Field for ShortStr {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.shortstr()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.shortstr(self)
    }
}

/// Long strings.
impl Field for Bytes {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.longstr()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.longstr(self)
    }
}

impl Field for FieldTable {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.table()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.table(self)
    }
}

macro_rules! methods {
    ($(
        $(#[$doc:meta])*
        $variant:ident = ($class:ident, $id:literal, $name:literal) { $($field:ident : $ty:ty),* $(,)? }
    ),* $(,)?) => {
        /// A method frame's content.
        #[derive(Debug, Clone, PartialEq)]
        #[allow(missing_docs)]
        pub enum Method {
            $( $(#[$doc])* $variant { $($field: $ty),* } ),*
        }

        impl Method {
            /// (class id, method id).
            pub fn ids(&self) -> (u16, u16) {
                match self {
                    $( Method::$variant { .. } => ($class, $id), )*
                }
            }

            /// The spec's name (`basic.publish`).
            pub fn name(&self) -> &'static str {
                match self {
                    $( Method::$variant { .. } => $name, )*
                }
            }

            /// The spec's name of a method by its ids, if it is one of these.
            pub fn name_of(class: u16, method: u16) -> Option<&'static str> {
                match (class, method) {
                    $( ($class, $id) => Some($name), )*
                    _ => None,
                }
            }

            /// Appends the method's payload (class id, method id, fields).
            #[allow(unused_variables)]
            pub fn encode(&self, out: &mut BytesMut) {
                let mut w = Writer::new(out);
                match self {
                    $( Method::$variant { $($field),* } => {
                        w.u16($class);
                        w.u16($id);
                        $( Field::write($field, &mut w); )*
                    } )*
                }
            }

            /// Decodes a method frame's payload: every field, and nothing after them.
            pub fn decode(payload: &Bytes) -> Result<Method, DecodeError> {
                let mut r = Reader::shared(payload);
                let class = r.u16()?;
                let method = r.u16()?;
                let m = match (class, method) {
                    $( ($class, $id) => Method::$variant { $($field: Field::read(&mut r)?),* }, )*
                    _ => return Err(DecodeError::UnknownMethod { class, method }),
                };
                r.finish()?;
                Ok(m)
            }
        }
    };
}

methods! {
    ConnectionStart = (CONNECTION, 10, "connection.start") {
        version_major: u8, version_minor: u8, server_properties: FieldTable,
        mechanisms: Bytes, locales: Bytes,
    },
    ConnectionStartOk = (CONNECTION, 11, "connection.start-ok") {
        client_properties: FieldTable, mechanism: ShortStr, response: Bytes, locale: ShortStr,
    },
    ConnectionSecure = (CONNECTION, 20, "connection.secure") { challenge: Bytes },
    ConnectionSecureOk = (CONNECTION, 21, "connection.secure-ok") { response: Bytes },
    ConnectionTune = (CONNECTION, 30, "connection.tune") {
        channel_max: u16, frame_max: u32, heartbeat: u16,
    },
    ConnectionTuneOk = (CONNECTION, 31, "connection.tune-ok") {
        channel_max: u16, frame_max: u32, heartbeat: u16,
    },
    ConnectionOpen = (CONNECTION, 40, "connection.open") {
        virtual_host: ShortStr, capabilities: ShortStr, insist: bool,
    },
    ConnectionOpenOk = (CONNECTION, 41, "connection.open-ok") { known_hosts: ShortStr },
    ConnectionClose = (CONNECTION, 50, "connection.close") {
        reply_code: u16, reply_text: ShortStr, class_id: u16, method_id: u16,
    },
    ConnectionCloseOk = (CONNECTION, 51, "connection.close-ok") {},
    ConnectionBlocked = (CONNECTION, 60, "connection.blocked") { reason: ShortStr },
    ConnectionUnblocked = (CONNECTION, 61, "connection.unblocked") {},
    ConnectionUpdateSecret = (CONNECTION, 70, "connection.update-secret") {
        new_secret: Bytes, reason: ShortStr,
    },
    ConnectionUpdateSecretOk = (CONNECTION, 71, "connection.update-secret-ok") {},

    ChannelOpen = (CHANNEL, 10, "channel.open") { out_of_band: ShortStr },
    ChannelOpenOk = (CHANNEL, 11, "channel.open-ok") { channel_id: Bytes },
    ChannelFlow = (CHANNEL, 20, "channel.flow") { active: bool },
    ChannelFlowOk = (CHANNEL, 21, "channel.flow-ok") { active: bool },
    ChannelClose = (CHANNEL, 40, "channel.close") {
        reply_code: u16, reply_text: ShortStr, class_id: u16, method_id: u16,
    },
    ChannelCloseOk = (CHANNEL, 41, "channel.close-ok") {},

    ExchangeDeclare = (EXCHANGE, 10, "exchange.declare") {
        ticket: u16, exchange: ShortStr, kind: ShortStr, passive: bool, durable: bool,
        auto_delete: bool, internal: bool, no_wait: bool, arguments: FieldTable,
    },
    ExchangeDeclareOk = (EXCHANGE, 11, "exchange.declare-ok") {},
    ExchangeDelete = (EXCHANGE, 20, "exchange.delete") {
        ticket: u16, exchange: ShortStr, if_unused: bool, no_wait: bool,
    },
    ExchangeDeleteOk = (EXCHANGE, 21, "exchange.delete-ok") {},
    ExchangeBind = (EXCHANGE, 30, "exchange.bind") {
        ticket: u16, destination: ShortStr, source: ShortStr, routing_key: ShortStr,
        no_wait: bool, arguments: FieldTable,
    },
    ExchangeBindOk = (EXCHANGE, 31, "exchange.bind-ok") {},
    ExchangeUnbind = (EXCHANGE, 40, "exchange.unbind") {
        ticket: u16, destination: ShortStr, source: ShortStr, routing_key: ShortStr,
        no_wait: bool, arguments: FieldTable,
    },
    ExchangeUnbindOk = (EXCHANGE, 51, "exchange.unbind-ok") {},

    QueueDeclare = (QUEUE, 10, "queue.declare") {
        ticket: u16, queue: ShortStr, passive: bool, durable: bool, exclusive: bool,
        auto_delete: bool, no_wait: bool, arguments: FieldTable,
    },
    QueueDeclareOk = (QUEUE, 11, "queue.declare-ok") {
        queue: ShortStr, message_count: u32, consumer_count: u32,
    },
    QueueBind = (QUEUE, 20, "queue.bind") {
        ticket: u16, queue: ShortStr, exchange: ShortStr, routing_key: ShortStr,
        no_wait: bool, arguments: FieldTable,
    },
    QueueBindOk = (QUEUE, 21, "queue.bind-ok") {},
    QueuePurge = (QUEUE, 30, "queue.purge") { ticket: u16, queue: ShortStr, no_wait: bool },
    QueuePurgeOk = (QUEUE, 31, "queue.purge-ok") { message_count: u32 },
    QueueDelete = (QUEUE, 40, "queue.delete") {
        ticket: u16, queue: ShortStr, if_unused: bool, if_empty: bool, no_wait: bool,
    },
    QueueDeleteOk = (QUEUE, 41, "queue.delete-ok") { message_count: u32 },
    QueueUnbind = (QUEUE, 50, "queue.unbind") {
        ticket: u16, queue: ShortStr, exchange: ShortStr, routing_key: ShortStr,
        arguments: FieldTable,
    },
    QueueUnbindOk = (QUEUE, 51, "queue.unbind-ok") {},

    BasicQos = (BASIC, 10, "basic.qos") { prefetch_size: u32, prefetch_count: u16, global: bool },
    BasicQosOk = (BASIC, 11, "basic.qos-ok") {},
    BasicConsume = (BASIC, 20, "basic.consume") {
        ticket: u16, queue: ShortStr, consumer_tag: ShortStr, no_local: bool, no_ack: bool,
        exclusive: bool, no_wait: bool, arguments: FieldTable,
    },
    BasicConsumeOk = (BASIC, 21, "basic.consume-ok") { consumer_tag: ShortStr },
    BasicCancel = (BASIC, 30, "basic.cancel") { consumer_tag: ShortStr, no_wait: bool },
    BasicCancelOk = (BASIC, 31, "basic.cancel-ok") { consumer_tag: ShortStr },
    BasicPublish = (BASIC, 40, "basic.publish") {
        ticket: u16, exchange: ShortStr, routing_key: ShortStr, mandatory: bool, immediate: bool,
    },
    BasicReturn = (BASIC, 50, "basic.return") {
        reply_code: u16, reply_text: ShortStr, exchange: ShortStr, routing_key: ShortStr,
    },
    BasicDeliver = (BASIC, 60, "basic.deliver") {
        consumer_tag: ShortStr, delivery_tag: u64, redelivered: bool, exchange: ShortStr,
        routing_key: ShortStr,
    },
    BasicGet = (BASIC, 70, "basic.get") { ticket: u16, queue: ShortStr, no_ack: bool },
    BasicGetOk = (BASIC, 71, "basic.get-ok") {
        delivery_tag: u64, redelivered: bool, exchange: ShortStr, routing_key: ShortStr,
        message_count: u32,
    },
    BasicGetEmpty = (BASIC, 72, "basic.get-empty") { cluster_id: ShortStr },
    BasicAck = (BASIC, 80, "basic.ack") { delivery_tag: u64, multiple: bool },
    BasicReject = (BASIC, 90, "basic.reject") { delivery_tag: u64, requeue: bool },
    BasicRecoverAsync = (BASIC, 100, "basic.recover-async") { requeue: bool },
    BasicRecover = (BASIC, 110, "basic.recover") { requeue: bool },
    BasicRecoverOk = (BASIC, 111, "basic.recover-ok") {},
    BasicNack = (BASIC, 120, "basic.nack") { delivery_tag: u64, multiple: bool, requeue: bool },

    ConfirmSelect = (CONFIRM, 10, "confirm.select") { no_wait: bool },
    ConfirmSelectOk = (CONFIRM, 11, "confirm.select-ok") {},

    TxSelect = (TX, 10, "tx.select") {},
    TxSelectOk = (TX, 11, "tx.select-ok") {},
    TxCommit = (TX, 20, "tx.commit") {},
    TxCommitOk = (TX, 21, "tx.commit-ok") {},
    TxRollback = (TX, 30, "tx.rollback") {},
    TxRollbackOk = (TX, 31, "tx.rollback-ok") {},
}

impl Method {
    /// True for the methods followed by a content header and body (basic.publish, .return,
    /// .deliver, .get-ok).
    pub fn has_content(&self) -> bool {
        matches!(
            self,
            Method::BasicPublish { .. }
                | Method::BasicReturn { .. }
                | Method::BasicDeliver { .. }
                | Method::BasicGetOk { .. }
        )
    }

    /// Appends a basic.deliver's payload without building the method (the delivery path).
    pub fn encode_deliver(
        consumer_tag: &ShortStr,
        delivery_tag: u64,
        redelivered: bool,
        exchange: &ShortStr,
        routing_key: &[u8],
        out: &mut BytesMut,
    ) {
        let mut w = Writer::new(out);
        w.u16(BASIC);
        w.u16(60);
        w.shortstr(consumer_tag);
        w.u64(delivery_tag);
        w.bit(redelivered);
        w.shortstr(exchange);
        w.u8(routing_key.len().min(255) as u8);
        out.extend_from_slice(&routing_key[..routing_key.len().min(255)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_round_trips_and_trailing_bytes_are_refused() {
        let m = Method::QueueDeclare {
            ticket: 0,
            queue: ShortStr::lit("q"),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: true,
            no_wait: false,
            arguments: FieldTable::default(),
        };
        let mut b = BytesMut::new();
        m.encode(&mut b);
        // class 50, method 10, ticket, "q", bits durable|auto_delete = 0b01010, empty table.
        assert_eq!(
            &b[..],
            &[0, 50, 0, 10, 0, 0, 1, b'q', 0b0000_1010, 0, 0, 0, 0]
        );
        assert_eq!(Method::decode(&b.clone().freeze()), Ok(m));
        b.extend_from_slice(&[0]);
        assert_eq!(
            Method::decode(&b.freeze()),
            Err(DecodeError::TrailingBytes(1))
        );
        assert_eq!(
            Method::decode(&Bytes::from_static(&[0, 60, 0, 99])),
            Err(DecodeError::UnknownMethod {
                class: 60,
                method: 99
            })
        );
        assert_eq!(Method::name_of(60, 40), Some("basic.publish"));
    }

    #[test]
    fn the_deliver_fast_path_matches_the_method() {
        let m = Method::BasicDeliver {
            consumer_tag: ShortStr::lit("ctag"),
            delivery_tag: 7,
            redelivered: true,
            exchange: ShortStr::lit("amq.topic"),
            routing_key: ShortStr::lit("a.b"),
        };
        let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
        m.encode(&mut a);
        Method::encode_deliver(
            &ShortStr::lit("ctag"),
            7,
            true,
            &ShortStr::lit("amq.topic"),
            b"a.b",
            &mut b,
        );
        assert_eq!(a, b);
    }
}
