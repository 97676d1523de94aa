//! What an identity may do: allow/deny rules on key expressions, and the rules every client
//! gets whatever its permissions (`$SYS` read-only, reply inboxes private).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use hayate_broker::KeyGuard;
use hayate_core::{INBOX_PREFIX, Key, KeyExpr, is_inbox_key, is_under};

/// The key prefix of the broker's own status topics: clients may read, never publish.
pub const SYS_PREFIX: &str = "$SYS";

/// One kind of operation's rules: keys allowed (`None`: every key) minus keys denied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// `None`: no allow list, every key is allowed (but the denied ones).
    pub allow: Option<Vec<KeyExpr>>,
    /// Denied keys: deny wins over allow.
    pub deny: Vec<KeyExpr>,
}

impl Rule {
    /// Does the rule let the operation through on `key`?
    pub fn admits(&self, key: &Key) -> bool {
        !self.deny.iter().any(|d| d.matches(key))
            && self
                .allow
                .as_ref()
                .is_none_or(|a| a.iter().any(|x| x.matches(key)))
    }

    /// True when the rule allows everything (nothing to check).
    pub fn is_open(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }

    /// Does the rule let the operation through on every key `expr` selects?
    pub fn admits_all(&self, expr: &KeyExpr) -> bool {
        !self.deny.iter().any(|d| d.intersects(expr))
            && self
                .allow
                .as_ref()
                .is_none_or(|a| a.iter().any(|x| x.includes(expr)))
    }
}

/// Why an operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// Publishing under `$SYS` (read-only for clients).
    Sys,
    /// Subscribing to other clients' reply inboxes.
    Inbox,
    /// The user's permissions do not allow it.
    Rule {
        /// `publish`, `subscribe`, `serve` or `call`.
        what: &'static str,
        /// The key or expression.
        on: String,
    },
    /// The user was removed, or anonymous access ended, by a config reload.
    Revoked,
    /// Joining a durable consumer another user created.
    Owner {
        /// What is owned (`consumer <stream>/<name>`).
        what: String,
        /// Its owner.
        owner: String,
    },
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denied::Sys => write!(f, "not authorized: {SYS_PREFIX} is read-only"),
            Denied::Inbox => write!(
                f,
                "not authorized: another client's reply inbox ({INBOX_PREFIX}/...)"
            ),
            Denied::Rule { what, on } => write!(f, "not authorized to {what} on {on}"),
            Denied::Revoked => write!(f, "not authorized: access revoked by a config reload"),
            Denied::Owner { what, owner } => {
                write!(f, "not authorized: {what} belongs to user {owner}")
            }
        }
    }
}

/// What an identity may do. Built once per user (shared by its connections).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Publishing without a reply-to.
    pub publish: Rule,
    /// Subscribing without a queue group.
    pub subscribe: Rule,
    /// Subscribing in a queue group (serving a service's requests).
    pub serve: Rule,
    /// Publishing with a reply-to (calling a service).
    pub call: Rule,
}

impl Access {
    /// Everything allowed (but the rules every client gets).
    pub fn all() -> Arc<Access> {
        Arc::new(Access::default())
    }

    /// The rule of a subscription (`group`: in a queue group, serving).
    fn subscription_rule(&self, group: bool) -> &Rule {
        if group { &self.serve } else { &self.subscribe }
    }

    /// May this identity publish on `key` (`with_reply`: the message carries a reply-to,
    /// a call)?
    pub fn check_publish(&self, key: &Key, with_reply: bool) -> Result<(), Denied> {
        let k = key.as_str();
        if is_under(k, SYS_PREFIX) {
            return Err(Denied::Sys);
        }
        if is_inbox_key(k) {
            // A reply: the inbox name is the capability (unguessable, learnt only from a
            // request's reply-to), so replies are not subject to publish rules.
            return Ok(());
        }
        let (rule, what) = if with_reply {
            (&self.call, "call")
        } else {
            (&self.publish, "publish")
        };
        if rule.is_open() || rule.admits(key) {
            Ok(())
        } else {
            Err(Denied::Rule {
                what,
                on: k.to_owned(),
            })
        }
    }

    /// May this identity subscribe to `expr` (`group`: in a queue group, i.e. serve)? `inbox`
    /// is the session's own reply inbox (`_inbox/<id>`). `Ok(Some(guard))`: yes, but the
    /// subscription's expression also covers keys it may not read, which the guard keeps
    /// from it (other clients' inboxes, denied keys, keys outside the allow list).
    pub fn check_subscribe(
        &self,
        expr: &KeyExpr,
        group: bool,
        inbox: &str,
    ) -> Result<Option<Arc<dyn KeyGuard>>, Denied> {
        let rule = self.subscription_rule(group);
        let what = if group { "serve" } else { "subscribe" };
        let refused = || Denied::Rule {
            what,
            on: expr.as_str().to_owned(),
        };
        if is_own_inbox(expr, inbox) {
            // A session's own inbox is always its to read, whatever its rules (the client
            // library subscribes to it on connecting).
            return Ok(None);
        }
        let all_inboxes = all_inboxes();
        if rule.deny.iter().any(|d| d.includes(expr)) {
            return Err(refused());
        }
        if let Some(allow) = &rule.allow
            && !allow.iter().any(|a| a.intersects(expr))
        {
            return Err(refused());
        }
        let touches_inboxes = all_inboxes.intersects(expr);
        if touches_inboxes && all_inboxes.includes(expr) {
            return Err(Denied::Inbox);
        }
        let rule_guard = rule.deny.iter().any(|d| d.intersects(expr))
            || rule
                .allow
                .as_ref()
                .is_some_and(|a| !a.iter().any(|x| x.includes(expr)));
        let inbox_guard = touches_inboxes;
        if !rule_guard && !inbox_guard {
            return Ok(None);
        }
        Ok(Some(Arc::new(Guard {
            rule: rule_guard.then(|| rule.clone()),
            inbox: inbox_guard.then(|| inbox.to_owned()),
        })))
    }
}

/// What keeps every reply inbox out of a subscription on `expr` that belongs to no client
/// (an AMQP queue's bindings): `Ok(None)` if it covers none, `Err` if it covers only them.
pub fn inbox_guard(expr: &KeyExpr) -> Result<Option<Arc<dyn KeyGuard>>, Denied> {
    Access::default().check_subscribe(expr, false, "")
}

/// `_inbox/**`: every session's reply inbox.
fn all_inboxes() -> KeyExpr {
    KeyExpr::new(&format!("{INBOX_PREFIX}/**")).unwrap_or_else(|_| unreachable_expr())
}

/// Does `expr` select only keys in the session's own inbox (`inbox`, or under it)?
fn is_own_inbox(expr: &KeyExpr, inbox: &str) -> bool {
    [inbox.to_owned(), format!("{inbox}/**")]
        .iter()
        .filter_map(|s| KeyExpr::new(s).ok())
        .any(|o| o.includes(expr))
}

/// A user's permissions as they are now, shared by the user's connections. A config reload
/// replaces the [`Access`] inside in place ([`Grant::set`]), so a changed permission takes
/// effect on each connection's next publish or subscribe; subscriptions made before it are
/// filtered by the permissions current when a route is built ([`LiveGuard`]; the reload
/// empties the broker's route caches). A revoked grant (user removed, anonymous access
/// ended) refuses everything; the reload also closes its connections.
#[derive(Debug)]
pub struct Grant {
    access: ArcSwap<Access>,
    /// False for grants that never change (anonymous and open-mode clients: everything
    /// allowed): their subscriptions keep the cheaper fixed guard.
    live: bool,
    revoked: AtomicBool,
}

impl Grant {
    /// A configured user's permissions (replaced by reloads).
    pub fn user(access: Access) -> Arc<Grant> {
        Arc::new(Grant {
            access: ArcSwap::from_pointee(access),
            live: true,
            revoked: AtomicBool::new(false),
        })
    }

    /// Everything allowed, for ever (anonymous and open-mode clients); only revocable.
    pub fn all() -> Arc<Grant> {
        Arc::new(Grant {
            access: ArcSwap::new(Access::all()),
            live: false,
            revoked: AtomicBool::new(false),
        })
    }

    /// The permissions now.
    pub fn current(&self) -> Arc<Access> {
        self.access.load_full()
    }

    /// Replaces the permissions (config reload).
    pub fn set(&self, access: Access) {
        self.access.store(Arc::new(access));
    }

    /// Refuses everything from now on.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// True once revoked.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// [`Access::check_publish`] with the permissions now.
    pub fn check_publish(&self, key: &Key, with_reply: bool) -> Result<(), Denied> {
        if self.is_revoked() {
            return Err(Denied::Revoked);
        }
        self.access.load().check_publish(key, with_reply)
    }

    /// May this identity, with its permissions now, read every key `expr` selects
    /// (`group`: by the serve rule)? Nothing of it denied or outside its allow list, and not
    /// only reply inboxes (what else it covers of them a subscription's [`inbox_guard`]
    /// keeps out). For AMQP consumers and exchange-to-exchange bindings, checked when made.
    pub fn may_read_all(&self, expr: &KeyExpr, group: bool) -> bool {
        if self.is_revoked() {
            return false;
        }
        let a = self.access.load();
        a.check_subscribe(expr, group, "").is_ok() && a.subscription_rule(group).admits_all(expr)
    }

    /// May this identity, with its permissions now, publish (without a reply-to) on every
    /// key `expr` selects? (AMQP exchange-to-exchange bindings: what a queue bound to the
    /// destination gets is as if published there.)
    pub fn may_publish_all(&self, expr: &KeyExpr) -> bool {
        !self.is_revoked() && self.access.load().publish.admits_all(expr)
    }

    /// [`Access::check_subscribe`] with the permissions now. For a configured user, the
    /// guard of an admitted subscription (but of its own inbox) checks the permissions
    /// current when each route is built, so a later reload narrows or widens what it
    /// receives.
    pub fn check_subscribe(
        self: &Arc<Self>,
        expr: &KeyExpr,
        group: bool,
        inbox: &str,
    ) -> Result<Option<Arc<dyn KeyGuard>>, Denied> {
        if self.is_revoked() {
            return Err(Denied::Revoked);
        }
        let fixed = self.access.load().check_subscribe(expr, group, inbox)?;
        if !self.live || is_own_inbox(expr, inbox) {
            return Ok(fixed);
        }
        Ok(Some(Arc::new(LiveGuard {
            grant: self.clone(),
            group,
            inbox: all_inboxes().intersects(expr).then(|| inbox.to_owned()),
        })))
    }
}

/// Keeps from a configured user's subscription what its permissions, as they are when a
/// route is built, do not let it read.
#[derive(Debug)]
struct LiveGuard {
    grant: Arc<Grant>,
    /// A queue-group subscription (the serve rule), else the subscribe rule.
    group: bool,
    /// The owner's inbox, when the expression reaches into `_inbox/**`.
    inbox: Option<String>,
}

impl KeyGuard for LiveGuard {
    fn admits(&self, key: &Key) -> bool {
        if self.grant.is_revoked() || !inbox_admits(self.inbox.as_deref(), key) {
            return false;
        }
        self.grant
            .access
            .load()
            .subscription_rule(self.group)
            .admits(key)
    }
}

/// Under another session's inbox: refused (`own`: the subscriber's inbox, when its
/// subscription reaches into `_inbox/**`).
fn inbox_admits(own: Option<&str>, key: &Key) -> bool {
    own.is_none_or(|own| {
        let k = key.as_str();
        !is_inbox_key(k) || is_under(k, own)
    })
}

#[cold]
fn unreachable_expr() -> KeyExpr {
    // `_inbox/**` is a valid expression; this only keeps the code free of unwraps.
    KeyExpr::new("**").unwrap_or_else(|_| std::process::abort())
}

/// Keeps from one subscription the keys its owner may not read.
#[derive(Debug)]
struct Guard {
    rule: Option<Rule>,
    /// The owner's inbox: keys under other inboxes are kept out.
    inbox: Option<String>,
}

impl KeyGuard for Guard {
    fn admits(&self, key: &Key) -> bool {
        if !inbox_admits(self.inbox.as_deref(), key) {
            return false;
        }
        self.rule.as_ref().is_none_or(|r| r.admits(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(s: &str) -> KeyExpr {
        KeyExpr::new(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    fn k(s: &str) -> Key {
        Key::new(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn sys_is_read_only_and_inboxes_private() {
        let a = Access::all();
        assert_eq!(a.check_publish(&k("$SYS/x"), false), Err(Denied::Sys));
        assert_eq!(a.check_publish(&k("$SYS"), true), Err(Denied::Sys));
        assert!(a.check_publish(&k("$SYSTEM/x"), false).is_ok());
        assert!(a.check_subscribe(&e("$SYS/**"), false, "_inbox/me").is_ok());
        let me = "_inbox/me";
        assert!(matches!(
            a.check_subscribe(&e("_inbox/me/*"), false, me),
            Ok(None)
        ));
        assert!(matches!(
            a.check_subscribe(&e("_inbox/me"), false, me),
            Ok(None)
        ));
        assert_eq!(
            a.check_subscribe(&e("_inbox/other/**"), false, me).err(),
            Some(Denied::Inbox)
        );
        assert_eq!(
            a.check_subscribe(&e("_inbox/**"), false, me).err(),
            Some(Denied::Inbox)
        );
        let g = a
            .check_subscribe(&e("**"), false, me)
            .expect("allowed")
            .expect("guarded");
        assert!(g.admits(&k("a/b")));
        assert!(g.admits(&k("_inbox/me/1")));
        assert!(g.admits(&k("_inbox/me")));
        assert!(!g.admits(&k("_inbox/mex/1")));
        assert!(!g.admits(&k("_inbox/other/1")));
        assert!(g.admits(&k("_inboxes/x")));
        assert!(matches!(a.check_subscribe(&e("a/**"), false, me), Ok(None)));
    }

    #[test]
    fn allow_and_deny_lists() {
        let a = Access {
            subscribe: Rule {
                allow: Some(vec![e("sensors/**"), e("alerts/*")]),
                deny: vec![e("sensors/secret/**")],
            },
            publish: Rule {
                allow: None,
                deny: vec![e("secret/**")],
            },
            serve: Rule {
                allow: Some(vec![e("svc/math")]),
                deny: vec![],
            },
            call: Rule::default(),
        };
        let me = "_inbox/me";
        assert!(a.check_publish(&k("secret/x"), false).is_err());
        assert!(a.check_publish(&k("public/x"), false).is_ok());
        assert!(
            a.check_publish(&k("secret/x"), true).is_ok(),
            "call has its own rule"
        );
        assert!(
            a.check_subscribe(&e("sensors/secret/**"), false, me)
                .is_err()
        );
        assert!(a.check_subscribe(&e("other/**"), false, me).is_err());
        assert!(matches!(
            a.check_subscribe(&e("alerts/fire"), false, me),
            Ok(None)
        ));
        let g = a
            .check_subscribe(&e("**"), false, me)
            .expect("intersects the allow list")
            .expect("guarded");
        assert!(g.admits(&k("sensors/a")));
        assert!(!g.admits(&k("sensors/secret/a")));
        assert!(!g.admits(&k("other/a")));
        assert!(!g.admits(&k("alerts/a/b")));
        assert!(a.check_subscribe(&e("svc/math"), true, me).is_ok());
        // Its own inbox is readable whatever the rules; replies may always be published.
        assert!(matches!(
            a.check_subscribe(&e("_inbox/me/*"), false, me),
            Ok(None)
        ));
        assert!(a.check_publish(&k("_inbox/other/7"), false).is_ok());
        assert!(a.check_subscribe(&e("svc/other"), true, me).is_err());
    }
}
