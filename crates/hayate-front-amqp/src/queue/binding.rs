//! A queue's bindings: those clients made and the routes exchange-to-exchange bindings
//! lead to ([`Binding`], [`Hop`], [`Route`]), each an entry of the broker's route table
//! with its filter ([`AmqpFilter`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_amqp::{FieldTable, ShortStr};
use hayate_core::Message;
use hayate_core::sync::lock;

use super::filter::AmqpFilter;
use super::{Bindings, MAX_BINDINGS, Queue};
use crate::names::{self, Kind};

/// One binding of a queue: the exchange, its type, the binding key, its arguments, and the
/// broker's route table entry that implements it (`sid`).
///
/// A binding a client made has no `via`. A route (a derived binding) has: it exists because
/// the queue is bound to an exchange that exchange-to-exchange bindings lead to from
/// `exchange` (the route's source, where its messages are published); its subscription is
/// the first of those bindings, and a message must also pass every hop of one of the paths
/// in `via` (the further exchange-to-exchange bindings, then the queue's own binding).
/// Routes are made, changed and removed by [`Queue::set_routes`] only; clients never see
/// them.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) exchange: String,
    /// The exchange's name as deliveries show it (made once, shared by every delivery).
    pub(super) exchange_s: ShortStr,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    pub(crate) sid: u32,
    pub(crate) via: Option<Arc<Vec<Vec<Hop>>>>,
    /// A client's binding: the guard of its maker's permissions (its subscription carries
    /// it too); routes into the binding check it in their last hop.
    pub(crate) guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
}

impl Binding {
    fn new(
        exchange: &str,
        kind: Kind,
        key: &str,
        args: FieldTable,
        via: Option<Arc<Vec<Vec<Hop>>>>,
        guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
    ) -> Binding {
        Binding {
            exchange: exchange.to_string(),
            exchange_s: ShortStr::lit(exchange),
            kind,
            key: key.to_string(),
            args,
            sid: 0,
            guard: if via.is_none() { guard } else { None },
            via,
        }
    }
}

/// A binding a message must pass on its way through exchange-to-exchange bindings: that of
/// exchange `exchange` (of `kind`) with `key` and `args`, matched as that exchange routes.
/// What the exchange's type ignores is left out (a fanout or headers exchange's key, the
/// arguments of any but a headers one), so bindings that route alike are equal.
#[derive(Debug, Clone)]
pub(crate) struct Hop {
    pub(crate) exchange: String,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    /// The binding's expression (of the `/` mapping) for direct and topic exchanges.
    expr: Option<hayate_core::KeyExpr>,
    /// A queue's own binding (the last hop of a route): its maker's guard, asked about the
    /// key the message would have had if published to the hop's exchange (under the
    /// vhost's key prefix, `prefix`), so a route brings in only what the binding would.
    pub(crate) guard: Option<(Arc<dyn hayate_broker::KeyGuard>, String)>,
}

impl PartialEq for Hop {
    fn eq(&self, other: &Hop) -> bool {
        self.exchange == other.exchange
            && self.kind == other.kind
            && self.key == other.key
            && self.args == other.args
            && match (&self.guard, &other.guard) {
                (None, None) => true,
                (Some((a, p)), Some((b, q))) => Arc::ptr_eq(a, b) && p == q,
                _ => false,
            }
    }
}

impl Hop {
    pub(crate) fn new(exchange: &str, kind: Kind, key: &str, args: &FieldTable) -> Hop {
        let expr = match kind {
            Kind::Direct | Kind::Topic => names::binding_expr(exchange, kind, key),
            Kind::Fanout | Kind::Headers => None,
        };
        Hop {
            exchange: exchange.to_string(),
            kind,
            key: match kind {
                Kind::Direct | Kind::Topic => key.to_string(),
                Kind::Fanout | Kind::Headers => String::new(),
            },
            args: if kind == Kind::Headers {
                args.clone()
            } else {
                FieldTable::default()
            },
            expr,
            guard: None,
        }
    }

    /// Does a message with routing key `rk` pass this binding? Matched through the same
    /// key mapping a publish to the hop's exchange would take (so exactly as if the message
    /// had been published there).
    pub(super) fn passes(&self, rk: &str, msg: &Message) -> bool {
        let matched = match self.kind {
            Kind::Fanout => true,
            Kind::Headers => crate::headers_match(&self.args, msg),
            Kind::Direct | Kind::Topic => self.expr.as_ref().is_some_and(|e| {
                names::publish_key(&self.exchange, self.kind, rk).is_some_and(|k| e.matches(&k))
            }),
        };
        matched
            && self.guard.as_ref().is_none_or(|(g, prefix)| {
                names::publish_key(&self.exchange, self.kind, rk)
                    .and_then(|k| hayate_core::Key::new(&format!("{prefix}{}", k.as_str())).ok())
                    .is_some_and(|k| g.admits(&k))
            })
    }
}

/// A route to make into a queue (see [`Binding`]): the source exchange's binding (in the
/// effective form of [`Hop`]), and the paths of hops from it, any of which lets a message
/// in.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    pub(crate) source: String,
    pub(crate) kind: Kind,
    pub(crate) key: String,
    pub(crate) args: FieldTable,
    pub(crate) paths: Vec<Vec<Hop>>,
}

/// What a route is known by: its subscription (source exchange, key and arguments in the
/// effective form of [`Hop`]). Routes computed with one are merged
/// (`crate::Topology::routes`); a queue's kept routes are found by it ([`Queue::set_routes`]).
pub(crate) fn route_id(source: &str, key: &str, args: &FieldTable) -> (String, String, String) {
    (
        source.to_string(),
        key.to_string(),
        crate::defs::table_hex(args),
    )
}

impl Queue {
    /// Is one of the bindings clients made to an exchange `bound(exchange)` says yes to?
    /// (Without copying them.)
    pub(crate) fn bound_to(&self, bound: impl Fn(&str) -> bool) -> bool {
        lock(&self.bind)
            .list
            .iter()
            .any(|b| b.via.is_none() && bound(&b.exchange))
    }

    /// The bindings clients made (not routes).
    pub(crate) fn bindings(&self) -> Vec<Binding> {
        lock(&self.bind)
            .list
            .iter()
            .filter(|b| b.via.is_none())
            .cloned()
            .collect()
    }

    /// A durable queue's bindings into its store's definitions (after a bind or unbind).
    pub(crate) fn save_bindings(&self) -> Result<(), String> {
        let Some((store, id)) = &self.store else {
            return Ok(());
        };
        let bindings = lock(&self.bind)
            .list
            .iter()
            .filter(|b| !b.exchange.is_empty() && b.via.is_none())
            .map(|b| crate::defs::BindingDef {
                exchange: b.exchange.clone(),
                key: b.key.clone(),
                args: b.args.clone(),
            })
            .collect();
        let cfg = self.core.config();
        let def = crate::defs::QueueDef {
            auto_delete: cfg.auto_delete,
            args: crate::defs::table_of_bytes(&cfg.args)?,
            bindings,
        };
        store.set_queue(&self.name, *id, &def.encode())
    }

    /// Adds a binding (an entry of the broker's route table on `expr`); an identical one is
    /// kept as is.
    pub(crate) fn bind(
        &self,
        exchange: &str,
        kind: Kind,
        key: &str,
        args: FieldTable,
        expr: hayate_core::KeyExpr,
        guard: Option<Arc<dyn hayate_broker::KeyGuard>>,
    ) -> Result<(), String> {
        let mut st = lock(&self.bind);
        if self.core.is_deleted() {
            return Err("queue is being deleted".into());
        }
        if st
            .list
            .iter()
            .any(|b| b.via.is_none() && b.exchange == exchange && b.key == key && b.args == args)
        {
            return Ok(());
        }
        if st.list.iter().filter(|b| b.via.is_none()).count() >= MAX_BINDINGS {
            return Err(format!("a queue has at most {MAX_BINDINGS} bindings"));
        }
        let b = Binding::new(exchange, kind, key, args, None, guard);
        self.add_binding(&mut st, b, expr);
        Ok(())
    }

    /// Adds binding (or route) `b` on `expr` to the broker's route table (bindings held):
    /// its `sid` is the broker's id of it.
    fn add_binding(&self, st: &mut Bindings, mut b: Binding, expr: hayate_core::KeyExpr) {
        let filter = AmqpFilter::of(&self.vhost, &b);
        let guard = match &b.via {
            // A route's last hop checks its binding's guard.
            Some(_) => hayate_front::auth::inbox_guard(&expr).ok().flatten(),
            None => b.guard.clone(),
        };
        b.sid = self
            .broker
            .queue_bind(&self.core, expr, guard, Some(filter));
        st.list.push(b);
    }

    /// The queue's routes become `routes`. A route whose entry stays keeps it (only its
    /// paths change, in place), new ones are added before the old ones go (a message
    /// offered to both enters once), so no message in flight is lost. Each route's entry is
    /// on the source's binding expression in the queue's vhost. Keeps the queue's and the
    /// vhost's count of route cost (nothing for a queue being deleted).
    pub(crate) fn set_routes(&self, routes: Vec<Route>) -> Result<(), String> {
        let mut st = lock(&self.bind);
        if self.core.is_deleted() {
            return Ok(());
        }
        let cost = crate::route_cost(&routes);
        let old = self.route_cost.swap(cost, Ordering::AcqRel);
        self.vhost.route_cost.fetch_add(cost, Ordering::AcqRel);
        self.vhost.route_cost.fetch_sub(old, Ordering::AcqRel);
        // One lookup per route, not a scan of every binding: a change may reroute many
        // queues. Kept entries take their new paths; the rest are added.
        let at: std::collections::HashMap<_, usize> = st
            .list
            .iter()
            .enumerate()
            .filter(|(_, b)| b.via.is_some())
            .map(|(i, b)| (route_id(&b.exchange, &b.key, &b.args), i))
            .collect();
        let mut keep = std::collections::HashSet::new();
        let mut new = Vec::new();
        for r in routes {
            match at.get(&route_id(&r.source, &r.key, &r.args)) {
                Some(&i) => {
                    let b = &mut st.list[i];
                    if b.via.as_deref() != Some(&r.paths) {
                        b.via = Some(Arc::new(r.paths.clone()));
                        let filter = AmqpFilter::of(&self.vhost, b);
                        self.broker.queue_refilter(&self.core, b.sid, Some(filter));
                    }
                    keep.insert(b.sid);
                }
                None => new.push(r),
            }
        }
        for r in new {
            let Some(expr) = self
                .vhost
                .expr(names::binding_expr(&r.source, r.kind, &r.key))
            else {
                continue; // a binding key that is no expression routes nothing
            };
            // No reply inbox reaches a queue (the binder's permissions were checked when
            // the exchange binding was made).
            if hayate_front::auth::inbox_guard(&expr).is_err() {
                continue;
            }
            let paths = Some(Arc::new(r.paths));
            let b = Binding::new(&r.source, r.kind, &r.key, r.args, paths, None);
            self.add_binding(&mut st, b, expr);
            keep.insert(st.list.last().map_or(0, |b| b.sid));
        }
        let (gone, kept) = std::mem::take(&mut st.list)
            .into_iter()
            .partition::<Vec<_>, _>(|b| b.via.is_some() && !keep.contains(&b.sid));
        st.list = kept;
        for b in gone {
            self.broker.queue_unbind(&self.core, b.sid);
        }
        Ok(())
    }

    /// The cost of its routes now.
    pub(crate) fn route_cost(&self) -> usize {
        self.route_cost.load(Ordering::Acquire)
    }

    /// Removes a binding; false if there was none.
    pub(crate) fn unbind(&self, exchange: &str, key: &str, args: &FieldTable) -> bool {
        let mut st = lock(&self.bind);
        let Some(i) = st.list.iter().position(|b| {
            b.via.is_none() && b.exchange == exchange && b.key == key && &b.args == args
        }) else {
            return false;
        };
        let b = st.list.remove(i);
        self.broker.queue_unbind(&self.core, b.sid);
        true
    }

    /// Removes every binding to `exchange` and route from it (it is being deleted); true
    /// if a binding a client made went.
    pub(crate) fn unbind_exchange(&self, exchange: &str) -> bool {
        let mut st = lock(&self.bind);
        let (gone, keep) = std::mem::take(&mut st.list)
            .into_iter()
            .partition::<Vec<_>, _>(|b| b.exchange == exchange);
        st.list = keep;
        let made = gone.iter().any(|b| b.via.is_none());
        for b in gone {
            self.broker.queue_unbind(&self.core, b.sid);
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::{Hop, Kind};
    use hayate_amqp::{FieldTable, FieldValue};
    use hayate_core::{Key, Message};

    #[test]
    fn a_hop_matches_as_its_exchange_would_route() {
        let m = Message::new(
            Key::new("x").unwrap_or_else(|_| panic!()),
            bytes::Bytes::new(),
        );
        let none = FieldTable::default();
        let topic = Hop::new("t", Kind::Topic, "a.*.#", &none);
        assert!(topic.passes("a.b", &m) && topic.passes("a.b.c.d", &m));
        assert!(!topic.passes("a", &m) && !topic.passes("b.a.c", &m));
        let amq = Hop::new("amq.topic", Kind::Topic, "#", &none);
        assert!(amq.passes("any.thing", &m));
        let direct = Hop::new("d", Kind::Direct, "a.*", &none);
        assert!(direct.passes("a.*", &m), "a direct key's * is literal");
        assert!(!direct.passes("a.b", &m));
        assert!(Hop::new("f", Kind::Fanout, "k", &none).passes("", &m));
        let mut args = FieldTable::default();
        args.insert(
            "x-match",
            FieldValue::LongStr(bytes::Bytes::from_static(b"all")),
        );
        args.insert("k", FieldValue::LongStr(bytes::Bytes::from_static(b"v")));
        let headers = Hop::new("h", Kind::Headers, "", &args);
        assert!(!headers.passes("", &m));
        let mut with = m.clone();
        with.headers = Some(vec![("k".into(), bytes::Bytes::from_static(b"v"))]);
        assert!(headers.passes("", &with));
    }
}
