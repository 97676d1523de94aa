//! The exchange class: exchange.declare, delete, bind and unbind (exchange-to-exchange
//! bindings).

use std::sync::atomic::Ordering;

use hayate_amqp::{FieldTable, Method, ReplyCode, ShortStr};
use hayate_broker::Session;
use hayate_core::sync::lock;

use super::Conn;
use super::error::{AmqpError, err, not_client};
use crate::Exchange;
use crate::names::{self, Kind};

/// Exchange-to-exchange bindings per vhost, at most.
const MAX_EXCHANGE_BINDINGS: usize = 4096;

impl Conn<'_> {
    /// May this connection's user publish on all of exchange `x`'s keys? `None` when its
    /// name is no key.
    pub(super) fn may_publish_exchange(&self, x: &str) -> Option<bool> {
        self.vhost
            .expr(names::binding_expr(x, Kind::Topic, "#"))
            .map(|e| self.identity.access.may_publish_all(&e))
    }

    /// The exchange class's methods.
    pub(super) fn exchange_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::ExchangeDeclare {
                exchange,
                kind,
                passive,
                durable,
                auto_delete,
                internal,
                no_wait,
                ..
            } => {
                self.exchange_declare(exchange, kind, *passive, *durable, *auto_delete, *internal)?;
                self.answer(session, ch, *no_wait, Method::ExchangeDeclareOk {});
            }
            Method::ExchangeDelete {
                exchange,
                if_unused,
                no_wait,
                ..
            } => {
                self.exchange_delete(exchange, *if_unused)?;
                self.answer(session, ch, *no_wait, Method::ExchangeDeleteOk {});
            }
            Method::ExchangeBind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
                ..
            }
            | Method::ExchangeUnbind {
                destination,
                source,
                routing_key,
                no_wait,
                arguments,
                ..
            } => {
                let bind = matches!(m, Method::ExchangeBind { .. });
                self.exchange_bind(destination, source, routing_key, arguments, bind)?;
                let ok = if bind {
                    Method::ExchangeBindOk {}
                } else {
                    Method::ExchangeUnbindOk {}
                };
                self.answer(session, ch, *no_wait, ok);
            }
            m => return Err(not_client(m)),
        }
        Ok(())
    }

    fn exchange_declare(
        &self,
        name: &ShortStr,
        kind: &ShortStr,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
    ) -> Result<(), AmqpError> {
        let n = name
            .as_str()
            .ok_or_else(|| err(ReplyCode::PreconditionFailed, "exchange name is not UTF-8"))?;
        let mut reg = lock(&self.vhost.registry);
        if passive {
            return if reg.exchanges.contains_key(n) {
                Ok(())
            } else {
                Err(err(
                    ReplyCode::NotFound,
                    format!("no exchange '{n}' in vhost '{vh}'", vh = self.vhost.name),
                ))
            };
        }
        let k = kind.as_str().unwrap_or("");
        let Some(kind) = Kind::parse(k) else {
            return Err(err(
                ReplyCode::CommandInvalid,
                format!("invalid exchange type '{k}'"),
            ));
        };
        if let Some(x) = reg.exchanges.get(n) {
            if x.kind != kind {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arg 'type' for exchange '{n}' in vhost '{vh}': received '{}' but current is '{}'",
                        kind.name(),
                        x.kind.name(),
                        vh = self.vhost.name
                    ),
                ));
            }
            if !x.builtin && x.durable != durable {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arg 'durable' for exchange '{n}' in vhost '{vh}': received '{durable}' but current is '{}'",
                        x.durable,
                        vh = self.vhost.name
                    ),
                ));
            }
            return Ok(());
        }
        if n.starts_with("amq.") {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("exchange name '{n}' contains reserved prefix 'amq.*'"),
            ));
        }
        if !n.is_empty() && names::binding_expr(n, Kind::Topic, "#").is_none() {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("exchange name '{n}' cannot be a key"),
            ));
        }
        if n.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        if reg.exchanges.len() >= self.amqp.cfg.max_queues {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange limit in vhost '{vh}' ({}) is reached",
                    self.amqp.cfg.max_queues,
                    vh = self.vhost.name
                ),
            ));
        }
        self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        reg.exchanges.insert(
            n.to_string(),
            Exchange {
                kind,
                durable,
                auto_delete,
                internal,
                builtin: false,
            },
        );
        drop(reg);
        if let Some(s) = self.vhost.store_for(durable) {
            let def = crate::defs::ExchangeDef {
                kind: kind.name().to_string(),
                auto_delete,
                internal,
            };
            let kept = [(crate::defs::exchange_key(n), def.encode())];
            s.put_defs(&kept).map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!("cannot keep durable exchange '{n}': {e}"),
                )
            })?;
        }
        Ok(())
    }

    fn exchange_delete(&self, name: &ShortStr, if_unused: bool) -> Result<(), AmqpError> {
        let n = name.as_str().unwrap_or("");
        let _topology = lock(&self.vhost.topology);
        let reg = lock(&self.vhost.registry);
        let Some(x) = reg.exchanges.get(n) else {
            // Deleting what is not there is not an error (RabbitMQ 3.x).
            return Ok(());
        };
        if x.builtin {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("operation not permitted on exchange '{n}'"),
            ));
        }
        // Deleting an exchange ends what is published through it: publish on all of its
        // keys is needed.
        // (A name that is no key, declared by an older version, has no keys to protect.)
        if self.may_publish_exchange(n) == Some(false) {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to exchange '{n}' in vhost '{vh}' refused for user '{}'",
                    self.identity.name(),
                    vh = self.vhost.name
                ),
            ));
        }
        let queues: Vec<_> = reg.queues.values().cloned().collect();
        let forwards = reg.edges.iter().any(|e| e.source == n);
        drop(reg);
        // In use: the source of a binding (a queue's or another exchange's), as RabbitMQ.
        let used = forwards || queues.iter().any(|q| q.bound_to(|b| b == n));
        if if_unused && used {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange '{n}' in vhost '{vh}' in use",
                    vh = self.vhost.name
                ),
            ));
        }
        let affected = self.vhost.queues_after(n);
        let sources: Vec<String>;
        {
            let mut reg = lock(&self.vhost.registry);
            sources = reg
                .edges
                .iter()
                .filter(|e| e.destination == n && e.source != n)
                .map(|e| e.source.clone())
                .collect();
            reg.exchanges.remove(n);
            reg.edges.retain(|e| e.source != n && e.destination != n);
        }
        self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        for q in queues {
            // A durable queue's bindings are kept without those to the exchange.
            if q.unbind_exchange(n)
                && let Err(e) = q.save_bindings()
            {
                tracing::error!(conn = self.id, queue = %q.name, "amqp: bindings not kept: {e}");
            }
        }
        if let Err(e) = self.vhost.reroute(&affected) {
            tracing::warn!(conn = self.id, vhost = %self.vhost.name, "amqp: routes after deleting exchange {n:?}: {e}");
        }
        self.vhost.drop_unused_exchanges(sources);
        self.vhost.forget_exchange(n).map_err(|e| {
            err(
                ReplyCode::InternalError,
                format!("cannot forget durable exchange '{n}': {e}"),
            )
        })?;
        Ok(())
    }

    /// exchange.bind (`bind`) or exchange.unbind: messages `source` routes with
    /// `routing_key` go on through `destination`'s bindings. Every queue bound downstream
    /// gets (or loses) the routes this makes (docs/amqp.md, "Exchange-to-exchange
    /// bindings").
    fn exchange_bind(
        &self,
        destination: &ShortStr,
        source: &ShortStr,
        routing_key: &ShortStr,
        arguments: &FieldTable,
        bind: bool,
    ) -> Result<(), AmqpError> {
        let d = destination.as_str().unwrap_or("");
        let s = source.as_str().unwrap_or("");
        if d.is_empty() || s.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        let key = routing_key.as_str().unwrap_or("");
        let vh = &self.vhost.name;
        let _topology = lock(&self.vhost.topology);
        let reg = lock(&self.vhost.registry);
        let exchange = |x: &str| {
            reg.exchanges.get(x).cloned().ok_or_else(|| {
                err(
                    ReplyCode::NotFound,
                    format!("no exchange '{x}' in vhost '{vh}'"),
                )
            })
        };
        let (sx, dx) = (exchange(s)?, exchange(d)?);
        let edge = crate::Edge {
            source: s.to_string(),
            destination: d.to_string(),
            key: key.to_string(),
            args: arguments.clone(),
        };
        // As RabbitMQ: reading the source (what the binding takes of it, as a queue binding
        // there would) and writing the destination (what queues bound there get is as if
        // published there: all of its keys), to bind and to unbind.
        let Some(read) = self.vhost.expr(names::binding_expr(s, sx.kind, key)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("binding key '{key}' of exchange '{s}' cannot be a key expression"),
            ));
        };
        let write = self.may_publish_exchange(d) == Some(true);
        if !self.identity.access.may_read_all(&read, false) || !write {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "access to exchange '{s}' (read) and '{d}' (write) in vhost '{vh}' refused for user '{}'",
                    self.identity.name()
                ),
            ));
        }
        let exists = reg.edges.contains(&edge);
        if bind && exists || !bind && !exists {
            return Ok(());
        }
        if bind && reg.edges.len() >= MAX_EXCHANGE_BINDINGS {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "exchange-to-exchange binding limit in vhost '{vh}' ({MAX_EXCHANGE_BINDINGS}) is reached"
                ),
            ));
        }
        drop(reg);
        let affected = self.vhost.queues_after(d);
        let change = |add: bool| {
            let mut reg = lock(&self.vhost.registry);
            if add {
                reg.edges.push(edge.clone());
            } else {
                reg.edges.retain(|e| e != &edge);
            }
            drop(reg);
            self.vhost.exchanges_changed.fetch_add(1, Ordering::AcqRel);
        };
        change(bind);
        if let Err(e) = self.vhost.reroute(&affected) {
            // Too many routes for some queue (nothing changed), or a subscription refused
            // midway: back to the bindings as they were.
            change(!bind);
            let _ = self.vhost.reroute(&affected);
            return Err(err(ReplyCode::PreconditionFailed, e));
        }
        // Kept when both ends are durable, as in RabbitMQ.
        let mut kept = Ok(());
        if let Some(st) = self.vhost.store_for(sx.durable && dx.durable) {
            let def = crate::defs::EdgeDef {
                source: s.to_string(),
                destination: d.to_string(),
                key: key.to_string(),
                args: arguments.clone(),
            };
            let value = if bind { def.encode() } else { Vec::new() };
            let written = st.put_defs(&[(def.key(), value)]);
            kept = written.map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!("cannot keep the exchange-to-exchange bindings of '{d}': {e}"),
                )
            });
        }
        if !bind {
            // The source lost a binding: an auto-delete source may now be unused.
            self.vhost.drop_unused_exchanges(vec![s.to_string()]);
        }
        kept
    }
}
