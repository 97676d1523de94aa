//! A queue's dead letters to its dead-letter exchange ([`AmqpDeadLetters`], the engine's
//! [`DeadLetterer`]).

use std::sync::Arc;

use hayate_broker::queue::{DeadLetterer, QItem, QueueId, Reason};
use hayate_core::Message;
use hayate_core::sync::lock;

use crate::VHost;

/// Where a queue's dead letters go: its dead-letter exchange, with its dead-letter routing
/// key or the message's own.
pub(crate) struct AmqpDeadLetters {
    pub(crate) vhost: Arc<VHost>,
    pub(crate) exchange: String,
    pub(crate) routing_key: Option<String>,
}

impl DeadLetterer for AmqpDeadLetters {
    /// The dead letter of `item` for its dead-letter exchange, with an `x-death`-like
    /// header (`x-first-death-reason`, `x-first-death-queue`). None (dropped) to a missing
    /// exchange (as RabbitMQ), to `$SYS`, or round a cycle.
    fn letter(&self, queue: &QueueId, item: QItem, why: Reason) -> Option<Message> {
        let vhost = &self.vhost;
        let kind = lock(&vhost.registry).exchanges.get(&self.exchange)?.kind;
        let own = std::str::from_utf8(&item.via.subject).unwrap_or("");
        let rk = self.routing_key.as_deref().unwrap_or(own);
        let key = vhost.publish_key(&self.exchange, kind, rk)?;
        // `$SYS` is read-only for clients, a dead letter's routing key included.
        if key.as_str() == hayate_front::auth::SYS_PREFIX
            || key
                .as_str()
                .strip_prefix(hayate_front::auth::SYS_PREFIX)
                .is_some_and(|r| r.starts_with('/'))
        {
            return None;
        }
        let mut msg = if item.returns > 0 {
            super::consumer::with_delivery_count(&item.msg, item.returns)
        } else {
            item.msg
        };
        // A cycle (a queue's dead letters coming back to it without a client rejecting
        // them, as RabbitMQ defines it): dropped, not sent round for ever.
        let first = msg
            .headers
            .iter()
            .flatten()
            .find(|(k, _)| k == "x-first-death-queue")
            .map(|(_, v)| v.clone());
        if why != Reason::Rejected && first.is_some_and(|q| q == queue.name.as_bytes()) {
            return None;
        }
        msg.key = key;
        msg.attrs.expires = None;
        let h = msg.headers.get_or_insert_with(Vec::new);
        if !h.iter().any(|(k, _)| k == "x-first-death-reason") {
            h.push((
                "x-first-death-reason".into(),
                bytes::Bytes::from_static(why.as_str().as_bytes()),
            ));
            h.push((
                "x-first-death-queue".into(),
                bytes::Bytes::copy_from_slice(queue.name.as_bytes()),
            ));
        }
        Some(msg)
    }
}
