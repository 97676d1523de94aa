//! What a binding lets into its queue ([`AmqpFilter`], the engine's [`BindingFilter`]): a
//! key of its own vhost, a headers exchange's arguments, a route's hops; and the exchange
//! and routing key the message is delivered with.

use std::sync::Arc;

use hayate_amqp::{FieldTable, ShortStr};
use hayate_broker::queue::{BindingFilter, Via};
use hayate_core::Message;

use super::{Binding, Hop};
use crate::VHost;
use crate::names::{self, Kind};

/// A binding's filter.
#[derive(Debug)]
pub(crate) struct AmqpFilter {
    vhost: Arc<VHost>,
    /// The exchange, as deliveries show it.
    exchange: ShortStr,
    /// A headers exchange's binding arguments.
    args: Option<FieldTable>,
    /// A route's paths of further hops (one must pass).
    via: Option<Arc<Vec<Vec<Hop>>>>,
}

impl AmqpFilter {
    pub(super) fn of(vhost: &Arc<VHost>, b: &Binding) -> Arc<dyn BindingFilter> {
        Arc::new(AmqpFilter {
            vhost: vhost.clone(),
            exchange: b.exchange_s.clone(),
            args: (b.kind == Kind::Headers).then(|| b.args.clone()),
            via: b.via.clone(),
        })
    }
}

impl BindingFilter for AmqpFilter {
    fn admit(&self, msg: &Message) -> Option<Via> {
        // A key of another vhost (a `/` binding's wildcard covers them all): not this
        // queue's.
        if self.vhost.foreign(msg.key.as_str()) {
            return None;
        }
        if self
            .args
            .as_ref()
            .is_some_and(|a| !crate::headers_match(a, msg))
        {
            return None;
        }
        let x = self.exchange.as_str().unwrap_or("");
        let rk = names::routing_key_of(x, self.vhost.strip(msg.key.as_str()));
        // A route: every further exchange-to-exchange hop of one of its paths, and the
        // queue's binding, must take it too.
        if self.via.as_ref().is_some_and(|paths| {
            !paths
                .iter()
                .any(|hops| hops.iter().all(|h| h.passes(&rk, msg)))
        }) {
            return None;
        }
        // The string's buffer becomes the subject's (no second copy); a routing key is a
        // short string (cut at 255 bytes).
        let subject = if rk.len() <= 255 {
            bytes::Bytes::from(rk)
        } else {
            ShortStr::lit(&rk).bytes().clone()
        };
        Some(Via {
            source: self.exchange.bytes().clone(),
            subject,
        })
    }
}
