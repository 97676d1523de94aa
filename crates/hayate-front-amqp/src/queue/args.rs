//! The `x-` arguments of queue.declare ([`QueueArgs`]).

use std::time::Duration;

use hayate_amqp::{FieldTable, FieldValue};
use hayate_broker::queue::{Overflow, QueueConfig};

/// What `x-` arguments of queue.declare set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueueArgs {
    pub(crate) message_ttl: Option<Duration>,
    pub(crate) max_length: Option<usize>,
    pub(crate) max_length_bytes: Option<usize>,
    pub(crate) dead_letter_exchange: Option<String>,
    pub(crate) dead_letter_routing_key: Option<String>,
    pub(crate) expires: Option<Duration>,
    /// `x-overflow = reject-publish`: new messages are refused (dropped) instead of the
    /// oldest.
    pub(crate) reject_publish: bool,
    /// `x-overflow = reject-publish-dlx`: and dead-lettered.
    pub(crate) reject_publish_dlx: bool,
    /// `x-max-priority`: a priority queue, message priorities 0 to this (higher ones count
    /// as this).
    pub(crate) max_priority: Option<u8>,
    /// `x-queue-type = quorum`: every message is kept in the store (persistent or not), and
    /// `x-delivery-limit` applies. (One node: nothing is replicated.)
    pub(crate) quorum: bool,
    /// `x-delivery-limit` (quorum queues): a message given back more often than this is
    /// dead-lettered (or dropped) instead of requeued.
    pub(crate) delivery_limit: Option<u32>,
}

impl QueueArgs {
    /// Reads the arguments this broker knows; `Err` (PRECONDITION_FAILED's text) for a bad
    /// value. Unknown arguments are ignored, as RabbitMQ does.
    pub(crate) fn parse(t: &FieldTable) -> Result<QueueArgs, String> {
        let mut a = QueueArgs::default();
        let int = |name: &str, v: &FieldValue| -> Result<u64, String> {
            v.as_i64()
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| format!("invalid arg '{name}' for queue: a non-negative integer"))
        };
        let text = |name: &str, v: &FieldValue| -> Result<String, String> {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("invalid arg '{name}' for queue: a string"))
        };
        for (k, v) in &t.0 {
            let Some(name) = k.as_str() else { continue };
            match name {
                "x-message-ttl" => a.message_ttl = Some(Duration::from_millis(int(name, v)?)),
                "x-expires" => {
                    let ms = int(name, v)?;
                    if ms == 0 {
                        return Err("invalid arg 'x-expires' for queue: must be positive".into());
                    }
                    a.expires = Some(Duration::from_millis(ms));
                }
                "x-max-length" => a.max_length = Some(int(name, v)? as usize),
                "x-max-priority" => match int(name, v)? {
                    n @ 1..=255 => a.max_priority = Some(n as u8),
                    _ => {
                        return Err("invalid arg 'x-max-priority' for queue: from 1 to 255".into());
                    }
                },
                "x-max-length-bytes" => a.max_length_bytes = Some(int(name, v)? as usize),
                "x-dead-letter-exchange" => a.dead_letter_exchange = Some(text(name, v)?),
                "x-dead-letter-routing-key" => {
                    a.dead_letter_routing_key = Some(text(name, v)?);
                }
                "x-overflow" => match text(name, v)?.as_str() {
                    "drop-head" => a.reject_publish = false,
                    "reject-publish" => a.reject_publish = true,
                    "reject-publish-dlx" => {
                        a.reject_publish = true;
                        a.reject_publish_dlx = true;
                    }
                    o => return Err(format!("invalid arg 'x-overflow' for queue: '{o}'")),
                },
                "x-queue-type" => match text(name, v)?.as_str() {
                    "classic" => {}
                    // A durable queue whose every message is stored, with a delivery limit:
                    // what a single-node RabbitMQ quorum queue is (nothing to replicate to).
                    "quorum" => a.quorum = true,
                    // RabbitMQ's streams are read by offset with their own protocol
                    // extensions: not this queue model.
                    o => {
                        return Err(format!(
                            "invalid arg 'x-queue-type' for queue: '{o}' (this broker has classic and quorum queues)"
                        ));
                    }
                },
                "x-delivery-limit" => {
                    a.delivery_limit = Some(u32::try_from(int(name, v)?).unwrap_or(u32::MAX));
                }
                _ => {}
            }
        }
        if !a.quorum {
            // As RabbitMQ: a classic queue has no delivery limit.
            a.delivery_limit = None;
        } else if a.max_priority.is_some() {
            return Err(
                "invalid arg 'x-max-priority' for queue of queue type quorum: priorities need a classic queue"
                    .into(),
            );
        }
        Ok(a)
    }
}

impl QueueArgs {
    /// The engine's configuration of a queue with these arguments and queue.declare's
    /// flags; `max_bytes` is `amqp.queue_max_bytes`.
    pub(crate) fn config(
        &self,
        durable: bool,
        auto_delete: bool,
        owner: Option<u64>,
        max_bytes: usize,
    ) -> QueueConfig {
        QueueConfig {
            durable,
            auto_delete,
            owner,
            expires: self.expires,
            message_ttl: self.message_ttl,
            max_length: self.max_length,
            max_body_bytes: self.max_length_bytes,
            max_bytes,
            overflow: match (self.reject_publish, self.reject_publish_dlx) {
                (false, _) => Overflow::DropHead,
                (true, false) => Overflow::RejectPublish,
                (true, true) => Overflow::RejectPublishDeadLetter,
            },
            max_priority: self.max_priority,
            persist_all: self.quorum,
            count_returns: self.quorum,
            delivery_limit: self.delivery_limit,
            declared: true,
            args: bytes::Bytes::new(),
        }
    }
}
