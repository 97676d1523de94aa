//! Topic names, topic filters and shared subscriptions (sections 4.7 and 4.8.2).
//!
//! A topic name (in a PUBLISH, a will, a Response Topic) is a non-empty string without
//! wildcards. A topic filter (in SUBSCRIBE and UNSUBSCRIBE) may hold wildcards: `+` matches
//! one level and must fill its level, `#` matches any number of levels and must be the
//! last level. Both are UTF-8 strings of at most 65,535 bytes without U+0000.

/// The most bytes a topic name or filter may have (a string's two-byte length prefix).
const MAX_LEN: usize = u16::MAX as usize;

/// The prefix of a shared subscription's topic filter.
pub const SHARED_PREFIX: &str = "$share/";

/// Whether `topic` is a valid topic name: not empty, at most 65,535 bytes, no U+0000, no
/// `+` or `#`.
///
/// (An MQTT 5.0 PUBLISH may have an empty topic name when it carries a topic alias; the
/// codec allows that case itself.)
///
/// ```
/// use hayate_mqtt::valid_topic_name;
/// assert!(valid_topic_name("sensors/1/temp"));
/// assert!(valid_topic_name("/"));
/// assert!(!valid_topic_name("sensors/+/temp"));
/// assert!(!valid_topic_name(""));
/// ```
pub fn valid_topic_name(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= MAX_LEN && !topic.contains(['+', '#', '\0'])
}

/// Whether `filter` is a valid topic filter: not empty, at most 65,535 bytes, no U+0000,
/// `+` only as a whole level, `#` only as the whole last level; and if it starts with
/// `$share/`, a well-formed shared subscription (see [`shared_subscription`]).
///
/// The `$share/` rule applies in every protocol version: servers commonly offer shared
/// subscriptions to 3.1.1 clients too, and a filter of that shape can only mean one.
///
/// ```
/// use hayate_mqtt::valid_topic_filter;
/// assert!(valid_topic_filter("sensors/+/temp"));
/// assert!(valid_topic_filter("sensors/#"));
/// assert!(valid_topic_filter("#"));
/// assert!(valid_topic_filter("$share/workers/jobs/#"));
/// assert!(!valid_topic_filter("sensors/#/temp"));
/// assert!(!valid_topic_filter("sensors/te+mp"));
/// assert!(!valid_topic_filter("$share/workers"));
/// assert!(!valid_topic_filter(""));
/// ```
pub fn valid_topic_filter(filter: &str) -> bool {
    if filter.len() > MAX_LEN || filter.contains('\0') {
        return false;
    }
    if filter.starts_with(SHARED_PREFIX) {
        return shared_subscription(filter).is_some();
    }
    wildcards_in_place(filter)
}

/// Not empty, `+` alone in its level, `#` alone in the last level.
fn wildcards_in_place(filter: &str) -> bool {
    if filter.is_empty() {
        return false;
    }
    let mut levels = filter.split('/').peekable();
    while let Some(level) = levels.next() {
        match level {
            "#" => return levels.peek().is_none(),
            "+" => {}
            _ if level.contains(['+', '#']) => return false,
            _ => {}
        }
    }
    true
}

/// Whether `filter` contains a wildcard (`+` or `#`). For a shared subscription, pass the
/// inner [`SharedSubscription::filter`].
pub fn has_wildcards(filter: &str) -> bool {
    filter.contains(['+', '#'])
}

/// A shared subscription's filter, `$share/{group}/{filter}`, taken apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SharedSubscription<'a> {
    /// The share name: the group whose members share the messages. Not empty; no `/`, `+`
    /// or `#`.
    pub group: &'a str,
    /// The topic filter the group subscribes to.
    pub filter: &'a str,
}

/// Takes a shared subscription's filter apart: `Some` when `filter` is
/// `$share/{group}/{filter}` with a non-empty group free of `/`, `+` and `#`, followed by a
/// valid topic filter; `None` for any other filter, including malformed `$share/` ones
/// (which [`valid_topic_filter`] rejects).
///
/// ```
/// use hayate_mqtt::{SharedSubscription, shared_subscription};
/// assert_eq!(
///     shared_subscription("$share/workers/jobs/+"),
///     Some(SharedSubscription { group: "workers", filter: "jobs/+" })
/// );
/// assert_eq!(shared_subscription("jobs/+"), None);
/// assert_eq!(shared_subscription("$share//jobs"), None);
/// assert_eq!(shared_subscription("$share/wor+kers/jobs"), None);
/// assert_eq!(shared_subscription("$share/workers/"), None);
/// ```
pub fn shared_subscription(filter: &str) -> Option<SharedSubscription<'_>> {
    let rest = filter.strip_prefix(SHARED_PREFIX)?;
    let (group, filter) = rest.split_once('/')?;
    if group.is_empty() || group.contains(['+', '#']) || !wildcards_in_place(filter) {
        return None;
    }
    Some(SharedSubscription { group, filter })
}
