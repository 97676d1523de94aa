//! How AMQP exchanges and routing keys meet Hayate keys (docs/amqp.md, "Keys").
//!
//! - The default exchange (`""`): a routing key is a queue name, and a queue name is a key
//!   (`/`-separated segments, each escaped: see [`escape_word`]). So the default exchange's
//!   `orders` is the key `orders`, which STOMP's `/queue/orders` also uses, and a reply-to
//!   set by a client of another protocol (`_inbox/...`) is a routing key that reaches it.
//! - `amq.topic`: the routing key's words (`.`-separated) are the key's segments, so
//!   `sensors.room1` is MQTT's `sensors/room1` and STOMP's `/topic/sensors/room1`
//!   (RabbitMQ's MQTT and STOMP plugins use the same convention). In a binding, `*` is `*`
//!   and `#` is `**`.
//! - Any other exchange `X`: its messages live under `amqp/<X>/`: routing key `a.b` is
//!   `amqp/<X>/a/b`, whatever the exchange's type (a fanout or headers exchange's bindings
//!   cover all of `amqp/<X>/**`: the routing key is carried in the key, not routed on, so
//!   deliveries show it and exchange-to-exchange bindings can route on it further).
//!
//! Escaping keeps every word a valid, unambiguous segment: `%` is `%25`, `/` is `%2F`, a
//! word that is exactly `*` or `**` is `%2A` or `%2A%2A` (a key cannot have a wildcard
//! segment; in a topic binding `*` stays a wildcard), and an empty word is `%_`.

use hayate_core::{Key, KeyExpr};

/// Exchange types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Direct,
    Fanout,
    Topic,
    Headers,
}

impl Kind {
    pub(crate) fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "direct" => Kind::Direct,
            "fanout" => Kind::Fanout,
            "topic" => Kind::Topic,
            "headers" => Kind::Headers,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Direct => "direct",
            Kind::Fanout => "fanout",
            Kind::Topic => "topic",
            Kind::Headers => "headers",
        }
    }
}

/// The prefix of a routing key that names a connection's direct reply-to inbox.
pub(crate) const REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// The pseudo-queue a client consumes from for direct reply-to.
pub(crate) const REPLY_TO_QUEUE: &str = "amq.rabbitmq.reply-to";

/// One word (or path segment) as a key segment.
pub(crate) fn escape_word(w: &str, out: &mut String) {
    match w {
        "" => out.push_str("%_"),
        "*" => out.push_str("%2A"),
        "**" => out.push_str("%2A%2A"),
        _ => {
            for c in w.chars() {
                match c {
                    '%' => out.push_str("%25"),
                    '/' => out.push_str("%2F"),
                    // Inside a word: a key expression would read it as a partial wildcard.
                    '*' => out.push_str("%2A"),
                    c => out.push(c),
                }
            }
        }
    }
}

/// The inverse of [`escape_word`] (a segment that is not an escape comes back as it is).
pub(crate) fn unescape_word(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    match s {
        "%_" => return String::new(),
        "%2A" => return "*".into(),
        "%2A%2A" => return "**".into(),
        _ => {}
    }
    s.replace("%2F", "/")
        .replace("%2A", "*")
        .replace("%25", "%")
}

/// The key of a queue name (the default exchange's routing key): its `/`-separated parts,
/// escaped. `None` when the result is not a valid key (a control character, too long).
pub(crate) fn queue_key(name: &str) -> Option<Key> {
    if name.is_empty() {
        // No queue has the empty name: the default exchange's "" routes nowhere.
        return None;
    }
    if let Some(inbox) = name.strip_prefix(REPLY_TO_PREFIX) {
        // A direct reply-to address: the requester's inbox key, as it is.
        return Key::new(inbox).ok();
    }
    if is_plain_path(name) {
        // Nothing to escape (most names): the name is its key.
        return Key::new(name).ok();
    }
    escaped_queue_key(name)
}

/// Whether escaping leaves queue name `name` as it is: no empty part (no `/` first, last
/// or twice), no `*` and no `%` anywhere. One pass over the bytes.
fn is_plain_path(name: &str) -> bool {
    let b = name.as_bytes();
    let mut prev = b'/';
    for &c in b {
        if c == b'*' || c == b'%' || (c == b'/' && prev == b'/') {
            return false;
        }
        prev = c;
    }
    prev != b'/'
}

/// [`queue_key`] of a name with parts to escape.
fn escaped_queue_key(name: &str) -> Option<Key> {
    let mut k = String::with_capacity(name.len() + 4);
    for (i, part) in name.split('/').enumerate() {
        if i > 0 {
            k.push('/');
        }
        match part {
            // Only the wildcards and empty parts need escaping in a path; `%` stays
            // itself unless it could be read as an escape.
            "" | "*" | "**" => escape_word(part, &mut k),
            p if p.starts_with('%') || p.contains('*') => escape_word(p, &mut k),
            p => k.push_str(p),
        }
    }
    Key::new(&k).ok()
}

/// The prefix of exchange `x`'s keys (`amqp/<x>`), for exchanges other than the default
/// and `amq.topic`.
fn exchange_prefix(x: &str) -> String {
    let mut p = String::from("amqp/");
    escape_word(x, &mut p);
    p
}

/// What stands for a routing key that no key can carry, of a message to a fanout or headers
/// exchange (deliveries show it as the routing key: `%` followed by `!` is no escape). Only
/// dead letters meet it: a basic.publish with such a routing key is refused (channel error
/// 406, `Conn::publish_key`).
pub(crate) const UNKEYABLE: &str = "%!";

/// The key a message published to exchange `x` (of `kind`) with routing key `rk` is
/// published on; `None` when there is none (not a valid key: unroutable).
pub(crate) fn publish_key(x: &str, kind: Kind, rk: &str) -> Option<Key> {
    if x.is_empty() {
        return queue_key(rk);
    }
    let prefix = if x == "amq.topic" {
        String::new()
    } else {
        exchange_prefix(x)
    };
    let mut k = prefix.clone();
    // The routing key's words (amq.topic's empty routing key is one empty word; another
    // exchange's is its prefix alone), whatever the exchange's type.
    if x == "amq.topic" || !rk.is_empty() {
        for w in rk.split('.') {
            if !k.is_empty() {
                k.push('/');
            }
            escape_word(w, &mut k);
        }
    }
    match Key::new(&k) {
        Ok(k) => Some(k),
        // A fanout or headers exchange does not route on the routing key: one that cannot
        // be in a key (a control character, too long) is replaced by UNKEYABLE, not the
        // message lost (a segment escaping never makes, so it is not the empty key's).
        Err(_) if matches!(kind, Kind::Fanout | Kind::Headers) && !prefix.is_empty() => {
            Key::new(&format!("{prefix}/{UNKEYABLE}")).ok()
        }
        Err(_) => None,
    }
}

/// The expression a binding of exchange `x` of `kind` with binding key `bk` subscribes to.
pub(crate) fn binding_expr(x: &str, kind: Kind, bk: &str) -> Option<KeyExpr> {
    if x.is_empty() {
        return queue_key(bk).and_then(|k| KeyExpr::new(k.as_str()).ok());
    }
    let mut e = if x == "amq.topic" {
        String::new()
    } else {
        exchange_prefix(x)
    };
    match kind {
        // Every routing key of the exchange (`**` also matches none).
        Kind::Fanout | Kind::Headers => e.push_str("/**"),
        Kind::Direct | Kind::Topic => {
            if x == "amq.topic" || !bk.is_empty() {
                for w in bk.split('.') {
                    if !e.is_empty() {
                        e.push('/');
                    }
                    match (kind, w) {
                        (Kind::Topic, "*") => e.push('*'),
                        (Kind::Topic, "#") => e.push_str("**"),
                        _ => escape_word(w, &mut e),
                    }
                }
            }
        }
    }
    KeyExpr::new(&e).ok()
}

/// The routing key a delivery shows for a message on `key` that reached a binding of
/// exchange `x` (of any type): the words after the exchange's prefix, joined by `.` (for a
/// message published by AMQP, its routing key; for one from MQTT on `a/b`, `a.b`).
pub(crate) fn routing_key_of(x: &str, key: &str) -> String {
    if x.is_empty() {
        return key.to_string();
    }
    let rest = if x == "amq.topic" {
        Some(key)
    } else {
        let p = exchange_prefix(x);
        key.strip_prefix(p.as_str())
            .map(|r| r.strip_prefix('/').unwrap_or(r))
    };
    match rest {
        Some(r) if !r.is_empty() => {
            if !r.contains('%') {
                return r.replace('/', ".");
            }
            r.split('/')
                .map(unescape_word)
                .collect::<Vec<_>>()
                .join(".")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(x: &str, kind: Kind, rk: &str) -> Option<String> {
        publish_key(x, kind, rk).map(|k| k.as_str().to_string())
    }
    fn e(x: &str, kind: Kind, bk: &str) -> Option<String> {
        binding_expr(x, kind, bk).map(|k| k.as_str().to_string())
    }

    #[test]
    fn keys_of_each_exchange() {
        assert_eq!(k("", Kind::Direct, "orders"), Some("orders".into()));
        assert_eq!(k("", Kind::Direct, "a/b"), Some("a/b".into()));
        assert_eq!(k("", Kind::Direct, "a//b"), Some("a/%_/b".into()));
        assert_eq!(
            k("", Kind::Direct, ""),
            None,
            "an empty queue name is no key"
        );
        assert_eq!(
            k("", Kind::Direct, "amq.rabbitmq.reply-to._inbox/x/1"),
            Some("_inbox/x/1".into())
        );
        assert_eq!(k("amq.topic", Kind::Topic, "a.b.c"), Some("a/b/c".into()));
        assert_eq!(k("amq.topic", Kind::Topic, "a..b"), Some("a/%_/b".into()));
        assert_eq!(k("amq.topic", Kind::Topic, ""), Some("%_".into()));
        assert_eq!(k("amq.topic", Kind::Topic, "*"), Some("%2A".into()));
        assert_eq!(k("logs", Kind::Fanout, "x.y"), Some("amqp/logs/x/y".into()));
        assert_eq!(k("logs", Kind::Fanout, ""), Some("amqp/logs".into()));
        assert_eq!(
            k("logs", Kind::Fanout, "a\u{1}"),
            Some("amqp/logs/%!".into()),
            "a fanout exchange routes a routing key no key can carry"
        );
        assert_eq!(k("hx", Kind::Headers, "a\u{1}"), Some("amqp/hx/%!".into()));
        assert_eq!(routing_key_of("hx", "amqp/hx/%!"), "%!");
        assert_eq!(
            k("d", Kind::Direct, "%!"),
            Some("amqp/d/%25!".into()),
            "not the same key"
        );
        assert_eq!(k("ex", Kind::Direct, "a.b"), Some("amqp/ex/a/b".into()));
        assert_eq!(k("ex", Kind::Direct, ""), Some("amqp/ex".into()));
        assert_eq!(k("e/x", Kind::Topic, "a"), Some("amqp/e%2Fx/a".into()));
        assert_eq!(k("ex", Kind::Direct, "a\u{1}"), None, "control characters");
        // A `*` inside a word or queue name is escaped (a key expression would read it as
        // a partial wildcard), and comes back.
        assert_eq!(k("", Kind::Direct, "q*"), Some("q%2A".into()));
        assert_eq!(
            k("ex", Kind::Direct, "a*b.c"),
            Some("amqp/ex/a%2Ab/c".into())
        );
        assert_eq!(e("", Kind::Direct, "q*"), Some("q%2A".into()));
        assert_eq!(e("t", Kind::Topic, "a*.#"), Some("amqp/t/a%2A/**".into()));
        assert_eq!(routing_key_of("ex", "amqp/ex/a%2Ab/c"), "a*b.c");
        assert_eq!(routing_key_of("ex", "amqp/ex/a%252Ab"), "a%2Ab");
    }

    #[test]
    fn binding_expressions() {
        assert_eq!(e("amq.topic", Kind::Topic, "a.*.#"), Some("a/*/**".into()));
        assert_eq!(e("t", Kind::Topic, "#"), Some("amqp/t/**".into()));
        assert_eq!(e("d", Kind::Direct, "a.*"), Some("amqp/d/a/%2A".into()));
        assert_eq!(e("f", Kind::Fanout, "ignored"), Some("amqp/f/**".into()));
        assert_eq!(e("h", Kind::Headers, ""), Some("amqp/h/**".into()));
        assert_eq!(e("", Kind::Direct, "q"), Some("q".into()));
        // An empty binding key matches the empty routing key only.
        assert_eq!(e("amq.topic", Kind::Topic, ""), Some("%_".into()));
    }

    #[test]
    fn bindings_match_what_publishes_produce() {
        let m = |x: &str, kind: Kind, bk: &str, rk: &str| {
            let e = binding_expr(x, kind, bk).unwrap_or_else(|| panic!("{bk}"));
            publish_key(x, kind, rk).is_some_and(|k| e.matches(&k))
        };
        assert!(m("amq.topic", Kind::Topic, "a.*.c", "a.b.c"));
        assert!(!m("amq.topic", Kind::Topic, "a.*.c", "a.b.d"));
        assert!(m("amq.topic", Kind::Topic, "a.#", "a.b.c"));
        assert!(m("amq.topic", Kind::Topic, "#", "x"));
        assert!(m("t", Kind::Topic, "#", "x.y"));
        assert!(m("t", Kind::Topic, "a.#", "a"), "# matches zero words");
        assert!(m("d", Kind::Direct, "a.b", "a.b"));
        assert!(!m("d", Kind::Direct, "a.b", "a.b.c"));
        assert!(
            m("d", Kind::Direct, "*", "*"),
            "a direct key's * is literal"
        );
        assert!(!m("d", Kind::Direct, "*", "x"));
        assert!(m("f", Kind::Fanout, "ignored", "anything"));
        assert!(m("f", Kind::Fanout, "ignored", ""));
        assert!(m("f", Kind::Fanout, "ignored", "a.b.c"));
        assert!(m("h", Kind::Headers, "", "a.b"));
        assert!(m("", Kind::Direct, "q", "q"));
        // Another exchange's keys never meet this one's.
        let d = binding_expr("d", Kind::Direct, "a").unwrap_or_else(|| panic!());
        assert!(!d.matches(&publish_key("e", Kind::Direct, "a").unwrap_or_else(|| panic!())));
    }

    #[test]
    fn routing_keys_come_back() {
        assert_eq!(routing_key_of("amq.topic", "a/b"), "a.b");
        assert_eq!(routing_key_of("ex", "amqp/ex/a/%2A/%_"), "a.*.");
        assert_eq!(routing_key_of("", "orders"), "orders");
        assert_eq!(routing_key_of("f", "amqp/f"), "");
        assert_eq!(routing_key_of("f", "amqp/f/a/b"), "a.b");
        for rk in ["a.b", "x", "a%b.c/d", "*.#"] {
            let key = publish_key("t", Kind::Topic, rk).unwrap_or_else(|| panic!("{rk}"));
            assert_eq!(routing_key_of("t", key.as_str()), rk);
        }
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        /// Words with the characters the mapping escapes or keys treat specially.
        fn word() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![
                    Just('a'),
                    Just('Z'),
                    Just('*'),
                    Just('%'),
                    Just('/'),
                    Just('#'),
                    Just('-'),
                    Just('é'),
                    Just('2'),
                    Just('A'),
                    Just('_'),
                ],
                0..6,
            )
            .prop_map(|cs| cs.into_iter().collect())
        }

        fn routing_key() -> impl Strategy<Value = String> {
            prop::collection::vec(word(), 1..5).prop_map(|ws| ws.join("."))
        }

        proptest! {
            /// A routing key published to an exchange of any type comes back as itself; a
            /// direct binding with the same key, and any fanout or headers binding, match
            /// what the publish produced.
            #[test]
            fn routing_keys_round_trip(rk in routing_key(), x in word(), kind in 0..4u8) {
                let x = if x.is_empty() { "x".to_string() } else { x };
                let kind = [Kind::Direct, Kind::Topic, Kind::Fanout, Kind::Headers][usize::from(kind)];
                if let Some(key) = publish_key(&x, kind, &rk) {
                    prop_assert_eq!(routing_key_of(&x, key.as_str()), rk.clone());
                    if kind != Kind::Topic {
                        let e = binding_expr(&x, kind, &rk);
                        prop_assert!(e.is_some_and(|e| e.matches(&key)), "{} {}", x, rk);
                    }
                }
            }

            /// Queue names (the default exchange) map to keys that their own binding
            /// matches, and two different names never share a key.
            #[test]
            fn queue_names_are_keys_of_their_own(a in word(), b in word()) {
                if let (Some(ka), Some(ea)) = (queue_key(&a), binding_expr("", Kind::Direct, &a)) {
                    prop_assert!(ea.matches(&ka));
                    if a != b && !b.starts_with(REPLY_TO_PREFIX)
                        && let Some(kb) = queue_key(&b)
                    {
                        prop_assert_ne!(ka.as_str(), kb.as_str());
                    }
                }
            }

            /// A queue name without parts to escape is its own key: the fast path agrees
            /// with escaping each part.
            #[test]
            fn plain_queue_names_skip_escaping(ws in prop::collection::vec(word(), 0..4)) {
                let name = ws.join("/");
                prop_assume!(!name.is_empty() && !name.starts_with(REPLY_TO_PREFIX));
                let escaped = escaped_queue_key(&name).map(|k| k.as_str().to_string());
                prop_assert_eq!(queue_key(&name).map(|k| k.as_str().to_string()), escaped.clone());
                if is_plain_path(&name) {
                    prop_assert_eq!(escaped.as_deref().unwrap_or(name.as_str()), name.as_str());
                }
            }

            /// Two vhosts never share keys: neither prefix starts the other's, and each
            /// prefix makes valid keys and expressions.
            #[test]
            fn vhost_prefixes_are_apart(a in word(), b in word()) {
                prop_assume!(!a.is_empty() && !b.is_empty() && a != b && a != "/" && b != "/");
                let (va, vb) = (super::super::super::VHost::new(&a), super::super::super::VHost::new(&b));
                prop_assert!(!va.prefix.starts_with(vb.prefix.as_str()));
                prop_assert!(!vb.prefix.starts_with(va.prefix.as_str()));
                let e = va.expr(binding_expr("amq.topic", Kind::Topic, "#"));
                prop_assert!(e.is_some(), "{}", va.prefix);
                let k = va.publish_key("amq.topic", Kind::Topic, "x.y");
                prop_assert!(k.as_ref().is_some_and(|k| k.as_str().starts_with(va.prefix.as_str())));
                prop_assert!(k.is_some_and(|k| vb.foreign(k.as_str())));
            }
        }
    }
}
