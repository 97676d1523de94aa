//! MQTT topics and filters as Hayate keys and key expressions.
//!
//! Hayate keys are `/`-separated, non-empty segments; `*` and `**` segments are wildcards in key
//! expressions. MQTT topic levels may be empty (`/a`, `a//b`) and may hold `*` characters. The
//! mapping keeps every MQTT topic addressable and is reversible:
//!
//! | MQTT level | Hayate segment |
//! |---|---|
//! | empty (`/a` has an empty first level) | `%` |
//! | a `%` character | `%25` |
//! | a `*` character | `%2A` |
//! | anything else | as is |
//!
//! So `sensors/room1/temp` is the key `sensors/room1/temp` (the common case costs nothing),
//! `/devices/x` is `%/devices/x`, and `a/*/b` is `a/%2A/b`. Filters: `+` is `*` and `#` is
//! `**` (which, as in MQTT, also matches the parent: `a/#` matches `a`); other levels are
//! mapped as above. Back from Hayate to MQTT, `%` alone is an empty level and `%25`/`%2A`
//! decode; any other `%` sequence and any `*` inside a segment (native keys such as
//! `a/b*c`) are kept as they are.

use std::borrow::Cow;

use hayate_core::{Key, KeyExpr};

/// Why a topic or filter has no Hayate equivalent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The key would be empty or too long, or the filter is not a valid MQTT filter.
    #[error("topic {0:?} has no Hayate key: {1}")]
    Topic(String, String),
}

fn level_to_segment(level: &str) -> Cow<'_, str> {
    if level.is_empty() {
        return Cow::Borrowed("%");
    }
    if !level.contains(['%', '*']) {
        return Cow::Borrowed(level);
    }
    let mut s = String::with_capacity(level.len() + 4);
    for c in level.chars() {
        match c {
            '%' => s.push_str("%25"),
            '*' => s.push_str("%2A"),
            c => s.push(c),
        }
    }
    Cow::Owned(s)
}

fn segment_to_level(seg: &str) -> Cow<'_, str> {
    if seg == "%" {
        return Cow::Borrowed("");
    }
    if !seg.contains('%') {
        return Cow::Borrowed(seg);
    }
    Cow::Owned(seg.replace("%2A", "*").replace("%25", "%"))
}

/// Whether `topic` is its own key: no empty level, no `%` or `*` to escape.
fn is_plain(topic: &str) -> bool {
    !topic.is_empty()
        && !topic.contains(['%', '*'])
        && !topic.starts_with('/')
        && !topic.ends_with('/')
        && !topic.contains("//")
}

/// The Hayate key of an MQTT topic name (no wildcards; validated by the codec).
pub fn topic_to_key(topic: &str) -> Result<Key, MapError> {
    let r = if is_plain(topic) {
        Key::new(topic)
    } else {
        let mapped: Vec<Cow<'_, str>> = topic.split('/').map(level_to_segment).collect();
        Key::new(&mapped.join("/"))
    };
    r.map_err(|e| MapError::Topic(topic.to_string(), e.to_string()))
}

/// [`topic_to_key`] for a topic in a read buffer: a plain topic becomes its key without a
/// copy (the key shares the buffer).
pub fn topic_bytes_to_key(topic: &crate::ByteStr) -> Result<Key, MapError> {
    let t = topic.as_str();
    if is_plain(t) {
        Key::from_bytes(topic.as_shared().clone())
            .map_err(|e| MapError::Topic(t.to_string(), e.to_string()))
    } else {
        topic_to_key(t)
    }
}

/// The MQTT topic name of a Hayate key.
pub fn key_to_topic(key: &str) -> Cow<'_, str> {
    if !key.contains('%') {
        return Cow::Borrowed(key);
    }
    let levels: Vec<Cow<'_, str>> = key.split('/').map(segment_to_level).collect();
    Cow::Owned(levels.join("/"))
}

/// The Hayate key expression of an MQTT topic filter (validated by the codec: `#` last and
/// alone in its level, `+` alone in its level).
pub fn filter_to_expr(filter: &str) -> Result<KeyExpr, MapError> {
    let segs: Vec<Cow<'_, str>> = filter
        .split('/')
        .map(|l| match l {
            "+" => Cow::Borrowed("*"),
            "#" => Cow::Borrowed("**"),
            l => level_to_segment(l),
        })
        .collect();
    KeyExpr::new(&segs.join("/")).map_err(|e| MapError::Topic(filter.to_string(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_topics_map_to_themselves() {
        assert_eq!(topic_to_key("a/b/c").unwrap().as_str(), "a/b/c");
        assert_eq!(key_to_topic("a/b/c"), "a/b/c");
    }

    #[test]
    fn empty_levels_and_stars_round_trip() {
        for t in [
            "/a", "a/", "a//b", "/", "a/*/b", "x*y", "%", "a/%2A", "%/%%",
        ] {
            let k = topic_to_key(t).unwrap();
            assert_eq!(key_to_topic(k.as_str()), t, "{t} -> {}", k.as_str());
        }
        assert_eq!(topic_to_key("/devices/x").unwrap().as_str(), "%/devices/x");
        assert_eq!(topic_to_key("a/*/b").unwrap().as_str(), "a/%2A/b");
    }

    #[test]
    fn filters() {
        assert_eq!(
            filter_to_expr("a/+/c").unwrap(),
            KeyExpr::new("a/*/c").unwrap()
        );
        assert_eq!(
            filter_to_expr("a/#").unwrap(),
            KeyExpr::new("a/**").unwrap()
        );
        assert_eq!(filter_to_expr("#").unwrap(), KeyExpr::new("**").unwrap());
        assert_eq!(filter_to_expr("/+").unwrap(), KeyExpr::new("%/*").unwrap());
        // A literal `*` in a filter level is not a wildcard.
        let e = filter_to_expr("a/b*c").unwrap();
        assert!(e.matches(&topic_to_key("a/b*c").unwrap()));
        assert!(!e.matches(&topic_to_key("a/bxc").unwrap()));
    }

    proptest::proptest! {
        #[test]
        fn every_topic_round_trips(levels in proptest::collection::vec("[a-c%*2A5]{0,4}", 1..5)) {
            let topic = levels.join("/");
            let key = topic_to_key(&topic).unwrap();
            proptest::prop_assert_eq!(key_to_topic(key.as_str()), topic.as_str());
            // A filter made of the same levels (no wildcards) matches exactly that key.
            proptest::prop_assert!(filter_to_expr(&topic).unwrap().matches(&key));
        }
    }

    #[test]
    fn native_keys_with_stars_reach_mqtt_unchanged() {
        assert_eq!(key_to_topic("a/b*c"), "a/b*c");
        assert_eq!(key_to_topic("a/%zz"), "a/%zz");
    }
}
