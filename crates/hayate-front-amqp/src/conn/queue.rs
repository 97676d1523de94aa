//! The queue class: queue.declare, bind, unbind, purge and delete; finding a queue by name
//! for any method ([`Conn::queue`], [`Conn::may_serve`]); deleting one ([`delete_queue`]).

use std::sync::Arc;

use hayate_amqp::{FieldTable, Method, ReplyCode, ShortStr};
use hayate_broker::Session;
use hayate_core::KeyExpr;
use hayate_core::sync::lock;

use super::Conn;
use super::error::{AmqpError, err, not_client};
use crate::names::{self, Kind};
use crate::queue::{Queue, QueueArgs};

/// queue.declare's flags.
#[derive(Debug, Clone, Copy)]
struct Flags {
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
}

/// Deletes a queue: out of the registry, its consumers told (basic.cancel on their
/// channels), its bindings gone. How many messages it held.
pub(crate) fn delete_queue(q: &Arc<Queue>) -> u32 {
    let _topology = lock(&q.vhost.topology);
    // Its bindings go with it: auto-delete exchanges they were the last of go too.
    let exchanges: Vec<String> = q.bindings().into_iter().map(|b| b.exchange).collect();
    {
        let mut reg = lock(&q.vhost.registry);
        if reg.queues.get(&q.name).is_some_and(|x| Arc::ptr_eq(x, q)) {
            reg.queues.remove(&q.name);
        }
    }
    let n = q.delete();
    q.vhost.drop_unused_exchanges(exchanges);
    n
}

/// 64 random bits for generated names (not secret: uniqueness with the counter beside).
pub(super) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

impl Conn<'_> {
    pub(super) fn queue(&self, name: &ShortStr) -> Result<Arc<Queue>, AmqpError> {
        let n = name.as_str().unwrap_or("");
        let q = lock(&self.vhost.registry).queues.get(n).cloned();
        let q = q
            .filter(|q| !q.is_deleted())
            .or_else(|| self.amqp.adopt_implicit(&self.vhost, n));
        let Some(q) = q else {
            return Err(err(
                ReplyCode::NotFound,
                format!("no queue '{n}' in vhost '{vh}'", vh = self.vhost.name),
            ));
        };
        if q.config().owner.is_some_and(|o| o != self.id) {
            return Err(self.locked(n));
        }
        Ok(q)
    }

    /// May this connection's user take messages from `q` (serve its key)?
    pub(super) fn may_serve(&self, q: &Queue) -> Result<(), AmqpError> {
        let Some(key) = self.vhost.key(names::queue_key(&q.name)) else {
            return Ok(());
        };
        let expr = KeyExpr::new(key.as_str())
            .map_err(|e| err(ReplyCode::PreconditionFailed, e.to_string()))?;
        // A queue's messages carry no per-key guard: all of it must be readable.
        match self.identity.access.may_read_all(&expr, true) {
            true => Ok(()),
            false => Err(self.queue_refused(&q.name)),
        }
    }

    /// The queue class's methods.
    pub(super) async fn queue_class(
        &mut self,
        ch: u16,
        m: &Method,
        session: &mut Session,
    ) -> Result<(), AmqpError> {
        match m {
            Method::QueueDeclare {
                queue,
                passive,
                durable,
                exclusive,
                auto_delete,
                no_wait,
                arguments,
                ..
            } => {
                let flags = Flags {
                    durable: *durable,
                    exclusive: *exclusive,
                    auto_delete: *auto_delete,
                };
                let (name, n, c) = self
                    .queue_declare(queue, *passive, flags, arguments)
                    .await?;
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueueDeclareOk {
                        queue: ShortStr::lit(&name),
                        message_count: n,
                        consumer_count: c,
                    },
                );
            }
            Method::QueueBind {
                queue,
                exchange,
                routing_key,
                no_wait,
                arguments,
                ..
            } => {
                self.queue_bind(queue, exchange, routing_key, arguments, true)?;
                self.answer(session, ch, *no_wait, Method::QueueBindOk {});
            }
            Method::QueueUnbind {
                queue,
                exchange,
                routing_key,
                arguments,
                ..
            } => {
                self.queue_bind(queue, exchange, routing_key, arguments, false)?;
                self.send(session, ch, Method::QueueUnbindOk {});
            }
            Method::QueuePurge { queue, no_wait, .. } => {
                let q = self.queue(queue)?;
                self.may_serve(&q)?;
                let n = q.purge();
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueuePurgeOk { message_count: n },
                );
            }
            Method::QueueDelete {
                queue,
                if_unused,
                if_empty,
                no_wait,
                ..
            } => {
                let n = self.queue_delete(queue, *if_unused, *if_empty)?;
                self.answer(
                    session,
                    ch,
                    *no_wait,
                    Method::QueueDeleteOk { message_count: n },
                );
            }
            m => return Err(not_client(m)),
        }
        Ok(())
    }

    /// queue.declare: the queue's name (made up when empty), its ready messages and its
    /// consumers.
    async fn queue_declare(
        &mut self,
        name: &ShortStr,
        passive: bool,
        f: Flags,
        arguments: &FieldTable,
    ) -> Result<(String, u32, u32), AmqpError> {
        let mut n = name
            .as_str()
            .ok_or_else(|| err(ReplyCode::PreconditionFailed, "queue name is not UTF-8"))?
            .to_string();
        if passive {
            let q = self.queue(name)?;
            let (m, c) = q.counts();
            return Ok((n, m, c));
        }
        if n.is_empty() {
            n = format!("amq.gen-{:016x}{:08x}", rand_u64(), self.amqp.next_id());
        } else if n.starts_with("amq.") {
            return Err(err(
                ReplyCode::AccessRefused,
                format!("queue name '{n}' contains reserved prefix 'amq.*'"),
            ));
        }
        let args = self.declare_args(&n, arguments, f)?;
        let existing = lock(&self.vhost.registry).queues.get(&n).cloned();
        let existing = existing
            .filter(|q| !q.is_deleted())
            .or_else(|| self.amqp.adopt_implicit(&self.vhost, &n));
        if let Some(q) = existing {
            self.redeclare(&q, &n, f, &args)?;
            q.touch();
            let (m, c) = q.counts();
            return Ok((n, m, c));
        }
        let expr = self.may_declare(name, &n, &args)?;
        self.create_queue(n, f, args, arguments, expr)
    }

    /// queue.declare's arguments, checked: a quorum queue is durable, shared and kept
    /// (RabbitMQ's texts).
    fn declare_args(
        &self,
        n: &str,
        arguments: &FieldTable,
        f: Flags,
    ) -> Result<QueueArgs, AmqpError> {
        let args =
            QueueArgs::parse(arguments).map_err(|e| err(ReplyCode::PreconditionFailed, e))?;
        if args.quorum {
            for (bad, what) in [
                (!f.durable, "non-durable"),
                (f.exclusive, "exclusive-owner"),
                (f.auto_delete, "auto-delete"),
            ] {
                if bad {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        format!(
                            "invalid property '{what}' for queue '{n}' in vhost '{vh}'",
                            vh = self.vhost.name
                        ),
                    ));
                }
            }
        }
        Ok(args)
    }

    /// A declare of queue `q` (named `n`) that exists: what it asks must be what `q` is.
    /// An implicit queue (made by a STOMP or native first use) takes any declare as
    /// equivalent: it stays what it is (in memory, its limits), docs/amqp.md.
    fn redeclare(&self, q: &Queue, n: &str, f: Flags, args: &QueueArgs) -> Result<(), AmqpError> {
        if q.config().owner.is_some_and(|o| o != self.id) {
            return Err(self.locked(n));
        }
        if !q.config().declared {
            return Ok(());
        }
        for (what, got, have) in [
            ("durable", f.durable, q.config().durable),
            ("exclusive", f.exclusive, q.config().owner.is_some()),
            ("auto_delete", f.auto_delete, q.config().auto_delete),
        ] {
            if got != have {
                return Err(err(
                    ReplyCode::PreconditionFailed,
                    format!(
                        "inequivalent arg '{what}' for queue '{n}' in vhost '{vh}': received '{got}' but current is '{have}'",
                        vh = self.vhost.name
                    ),
                ));
            }
        }
        if *args != q.args {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!(
                    "inequivalent arguments for queue '{n}' in vhost '{vh}'",
                    vh = self.vhost.name
                ),
            ));
        }
        Ok(())
    }

    /// May this connection's user declare queue `n` (`name` as the client gave it) with
    /// `args`? The expression of the queue's key.
    fn may_declare(
        &self,
        name: &ShortStr,
        n: &str,
        args: &QueueArgs,
    ) -> Result<KeyExpr, AmqpError> {
        let Some(key) = self.vhost.key(names::queue_key(n)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("queue name '{n}' cannot be a key"),
            ));
        };
        let expr = KeyExpr::new(key.as_str())
            .map_err(|e| err(ReplyCode::PreconditionFailed, e.to_string()))?;
        // A queue's default binding reads its own key: never a reply inbox's, whoever asks.
        // Messages it collects leave only through a consumer (serve, checked then) or as
        // dead letters: with a dead-letter exchange, a client names only a queue it may
        // consume from (serve on all of its key). A server-named one is a fresh random key.
        if !name.is_empty()
            && (hayate_front::auth::inbox_guard(&expr).is_err()
                || args.dead_letter_exchange.is_some()
                    && !self.identity.access.may_read_all(&expr, true))
        {
            return Err(self.queue_refused(n));
        }
        // Dead letters are published on the dead-letter exchange's keys: the declarer must
        // be allowed to publish on all of them, as RabbitMQ checks write on the DLX.
        if let Some(dlx) = &args.dead_letter_exchange {
            let allowed = if dlx.is_empty() {
                self.vhost
                    .expr(KeyExpr::new("**").ok())
                    .map(|s| self.identity.access.may_publish_all(&s))
            } else {
                self.may_publish_exchange(dlx)
            };
            if allowed != Some(true) {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to dead-letter exchange '{dlx}' in vhost '{vh}' refused for user '{}'",
                        self.identity.name(),
                        vh = self.vhost.name
                    ),
                ));
            }
        }
        Ok(expr)
    }

    /// A new queue `n` (its key's expression `expr`): made, bound to the default exchange,
    /// into the registry (unless another connection declared it meanwhile: that one's
    /// counts), kept in the store if durable.
    fn create_queue(
        &mut self,
        n: String,
        f: Flags,
        args: QueueArgs,
        arguments: &FieldTable,
        expr: KeyExpr,
    ) -> Result<(String, u32, u32), AmqpError> {
        if lock(&self.vhost.registry).queues.len() >= self.amqp.cfg.max_queues {
            return Err(self.queue_limit());
        }
        // A durable queue (not exclusive: those end with their connection) is kept in the
        // vhost's store, with a number of its own.
        let store = self
            .vhost
            .store_for(f.durable && !f.exclusive)
            .map(|s| (s.clone(), s.new_queue_id()));
        let made = crate::Made {
            durable: f.durable,
            auto_delete: f.auto_delete,
            owner: f.exclusive.then_some(self.id),
            arguments,
        };
        let q = self
            .amqp
            .make_queue(&self.vhost, &n, made, args, store.clone());
        q.bind("", Kind::Direct, &n, FieldTable::default(), expr, None)
            .map_err(|e| err(ReplyCode::InternalError, e))?;
        if let Some((m, c)) = self.register(&n, &q)? {
            return Ok((n, m, c));
        }
        if let Some((s, id)) = store {
            let def = crate::defs::QueueDef {
                auto_delete: f.auto_delete,
                args: arguments.clone(),
                bindings: Vec::new(),
            };
            if let Err(e) = s.put_queue(&n, id, &def.encode()) {
                tracing::error!(queue = %n, "amqp: cannot keep a durable queue: {e}");
                delete_queue(&q);
                return Err(err(
                    ReplyCode::InternalError,
                    format!("cannot keep durable queue '{n}': {e}"),
                ));
            }
        }
        if f.exclusive {
            self.exclusive.retain(|q| !q.is_deleted());
            self.exclusive.push(q);
        }
        Ok((n, 0, 0))
    }

    /// New queue `q` into the registry as `n`, unless another connection declared it
    /// meanwhile (that one stands: its counts, and `q` goes) or the limit is reached; the
    /// queue found is looked at outside the registry's lock (a leaf).
    fn register(&self, n: &str, q: &Arc<Queue>) -> Result<Option<(u32, u32)>, AmqpError> {
        loop {
            let found = {
                let mut reg = lock(&self.vhost.registry);
                match reg.queues.get(n).cloned() {
                    Some(other) => Some(other),
                    None if reg.queues.len() >= self.amqp.cfg.max_queues => {
                        drop(reg);
                        q.delete();
                        return Err(self.queue_limit());
                    }
                    None => {
                        reg.queues.insert(n.to_string(), q.clone());
                        q.listed();
                        None
                    }
                }
            };
            let Some(other) = found else { break };
            if !other.is_deleted() {
                let counts = other.counts();
                q.delete();
                return Ok(Some(counts));
            }
            // A queue on its way out: ours takes its place.
            let mut reg = lock(&self.vhost.registry);
            if reg.queues.get(n).is_some_and(|o| Arc::ptr_eq(o, &other)) {
                reg.queues.insert(n.to_string(), q.clone());
                q.listed();
                break;
            }
        }
        Ok(None)
    }

    /// The vhost has as many queues as it may.
    fn queue_limit(&self) -> AmqpError {
        err(
            ReplyCode::PreconditionFailed,
            format!(
                "queue limit in vhost '{vh}' ({}) is reached",
                self.amqp.cfg.max_queues,
                vh = self.vhost.name
            ),
        )
    }

    /// This connection's user may not use queue `n` so.
    fn queue_refused(&self, n: &str) -> AmqpError {
        err(
            ReplyCode::AccessRefused,
            format!(
                "access to queue '{n}' in vhost '{vh}' refused for user '{}'",
                self.identity.name(),
                vh = self.vhost.name
            ),
        )
    }

    /// Queue `n` is another connection's exclusive queue.
    fn locked(&self, n: &str) -> AmqpError {
        err(
            ReplyCode::ResourceLocked,
            format!(
                "cannot obtain exclusive access to locked queue '{n}' in vhost '{vh}'",
                vh = self.vhost.name
            ),
        )
    }

    fn queue_bind(
        &self,
        queue: &ShortStr,
        exchange: &ShortStr,
        routing_key: &ShortStr,
        arguments: &FieldTable,
        bind: bool,
    ) -> Result<(), AmqpError> {
        let q = self.queue(queue)?;
        let _topology = lock(&self.vhost.topology);
        // What a binding brings into a queue is as if published to it: binding and
        // unbinding need publish on all of the queue's key (as RabbitMQ's write on the
        // queue), but for a queue exclusive to this connection, which nobody else reaches.
        if q.config().owner != Some(self.id) {
            let writable = self
                .vhost
                .key(names::queue_key(&q.name))
                .and_then(|k| KeyExpr::new(k.as_str()).ok())
                .is_some_and(|e| self.identity.access.may_publish_all(&e));
            if !writable {
                return Err(self.queue_refused(&q.name));
            }
        }
        let x = exchange.as_str().unwrap_or("");
        if x.is_empty() {
            return Err(err(
                ReplyCode::AccessRefused,
                "operation not permitted on the default exchange",
            ));
        }
        let kind = lock(&self.vhost.registry).exchanges.get(x).map(|e| e.kind);
        let Some(kind) = kind else {
            return Err(err(
                ReplyCode::NotFound,
                format!("no exchange '{x}' in vhost '{vh}'", vh = self.vhost.name),
            ));
        };
        let rk = routing_key.as_str().unwrap_or("");
        let saved = |q: &Queue| {
            q.save_bindings().map_err(|e| {
                err(
                    ReplyCode::InternalError,
                    format!(
                        "cannot keep the bindings of durable queue '{}': {e}",
                        q.name
                    ),
                )
            })
        };
        if !bind {
            if q.unbind(x, rk, arguments) {
                if let Err(e) = self.vhost.reroute(std::slice::from_ref(&q)) {
                    tracing::warn!(conn = self.id, queue = %q.name, "amqp: routes after an unbind: {e}");
                }
                let kept = saved(&q);
                self.vhost.drop_unused_exchanges(vec![x.to_string()]);
                kept?;
            }
            return Ok(());
        }
        if q.bindings()
            .iter()
            .any(|b| b.exchange == x && b.key == rk && &b.args == arguments)
        {
            return Ok(());
        }
        let Some(expr) = self.vhost.expr(names::binding_expr(x, kind, rk)) else {
            return Err(err(
                ReplyCode::PreconditionFailed,
                format!("binding key '{rk}' of exchange '{x}' cannot be a key expression"),
            ));
        };
        // As a subscription of the binder's: what the expression covers that the binder may
        // not read (other clients' reply inboxes, denied keys) its guard keeps out.
        let guard = match self.identity.access.check_subscribe(&expr, false, "") {
            // A durable queue's binding outlives the guard (a restart puts it back with
            // the reply-inbox guard only): all of it must be readable.
            Ok(_) if q.store.is_some() && !self.identity.access.may_read_all(&expr, false) => {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to all of '{}' refused for user '{}' (a durable queue's bindings must be readable in full)",
                        expr.as_str(),
                        self.identity.name()
                    ),
                ));
            }
            Ok(guard) => guard,
            Err(_) => {
                return Err(err(
                    ReplyCode::AccessRefused,
                    format!(
                        "access to '{}' refused for user '{}'",
                        expr.as_str(),
                        self.identity.name()
                    ),
                ));
            }
        };
        q.bind(x, kind, rk, arguments.clone(), expr, guard)
            .map_err(|e| err(ReplyCode::InternalError, e))?;
        // The routes exchange-to-exchange bindings lead into the exchange.
        if let Err(e) = self.vhost.reroute(std::slice::from_ref(&q)) {
            q.unbind(x, rk, arguments);
            let _ = self.vhost.reroute(std::slice::from_ref(&q));
            return Err(err(ReplyCode::PreconditionFailed, e));
        }
        saved(&q)
    }

    fn queue_delete(
        &mut self,
        name: &ShortStr,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<u32, AmqpError> {
        let q = match self.queue(name) {
            Ok(q) => q,
            Err(e) if e.code == ReplyCode::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        self.may_serve(&q)?;
        let (m, c) = q.counts();
        let refused = |why: &str| {
            err(
                ReplyCode::PreconditionFailed,
                format!(
                    "queue '{}' in vhost '{vh}' {why}",
                    q.name,
                    vh = self.vhost.name
                ),
            )
        };
        if if_unused && c > 0 {
            return Err(refused("in use"));
        }
        if if_empty && m > 0 {
            return Err(refused("is not empty"));
        }
        Ok(delete_queue(&q))
    }
}
