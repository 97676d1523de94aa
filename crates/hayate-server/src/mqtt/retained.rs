//! Retained messages: the last retained message of each key, stored by PUBLISH (and wills,
//! `$SYS`) and sent to new subscriptions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hayate_core::{Key, KeyExpr, Message};
use hayate_io::memory::{Charge, Memory};

use super::{Mqtt, locked};

/// Retained messages by key, at most `max_bytes` of keys and payloads together.
#[derive(Debug, Default)]
pub(crate) struct Retained {
    map: HashMap<Key, Message>,
    bytes: usize,
    /// 0: no limit.
    max_bytes: usize,
    /// The retained messages' share of the broker-wide memory budget.
    charge: Option<Charge>,
}

fn size(m: &Message) -> usize {
    m.key.as_bytes().len() + m.payload.len()
}

impl Retained {
    /// An empty store holding at most `max_bytes` (0: no limit).
    pub(crate) fn new(max_bytes: usize) -> Retained {
        Retained {
            max_bytes,
            ..Retained::default()
        }
    }

    /// Stores `msg` as the retained message of its key (an empty payload clears it). False
    /// when storing it would take the store past its budget: nothing changes then (the
    /// key keeps its earlier retained message, if any).
    pub(crate) fn set(&mut self, msg: &Message) -> bool {
        self.set_as(msg, false)
    }

    /// As [`Retained::set`] for a message restored from disk: it exists already, so the
    /// memory budget takes it whatever it holds (`max_bytes` still applies).
    pub(crate) fn restore(&mut self, msg: &Message) -> bool {
        self.set_as(msg, true)
    }

    fn set_as(&mut self, msg: &Message, forced: bool) -> bool {
        let old = self.map.get(&msg.key).map_or(0, size);
        if msg.payload.is_empty() {
            self.map.remove(&msg.key);
            self.bytes -= old;
            self.settle_charge();
            return true;
        }
        let new = size(msg);
        if self.max_bytes > 0 && self.bytes - old + new > self.max_bytes {
            return false;
        }
        if let Some(c) = &mut self.charge {
            let need = self.bytes - old + new;
            if forced {
                c.force(need);
            } else if !c.cover(need) {
                return false;
            }
        }
        // Kept for long: in allocations of its own, not pinning the read buffer it came in.
        let msg = msg.compact();
        self.map.insert(msg.key.clone(), msg);
        self.bytes = self.bytes - old + new;
        self.settle_charge();
        true
    }

    /// Charges what is kept to `memory` from now on: a message the budget has no room for
    /// is not kept (as past `max_bytes`).
    pub(crate) fn with_memory(mut self, memory: &Arc<Memory>) -> Retained {
        let mut c = Charge::exact(memory);
        c.force(self.bytes);
        self.charge = Some(c);
        self
    }

    fn settle_charge(&mut self) {
        if let Some(c) = &mut self.charge {
            c.shrink(self.bytes);
        }
    }

    /// Bytes held (keys and payloads).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The retained messages matching `expr` (not `$` keys when `skip_dollar`).
    pub(crate) fn matching(&mut self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        let now = Instant::now();
        let mut freed = 0;
        self.map.retain(|_, m| {
            let keep = m.attrs.expires.is_none_or(|at| at > now);
            if !keep {
                freed += size(m);
            }
            keep
        });
        self.bytes -= freed;
        self.settle_charge();
        self.map
            .values()
            .filter(|m| !(skip_dollar && m.key.as_bytes().first() == Some(&b'$')))
            .filter(|m| expr.matches(&m.key))
            .cloned()
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Message> {
        self.map.values()
    }
}

impl Mqtt {
    /// Stores or clears a retained message (journaled, except the broker's own `$SYS`
    /// ones: the journal's order for a key is the order of the changes, under this lock).
    pub(crate) fn retain(&self, msg: &Message) {
        let mut r = locked(&self.retained);
        if !r.set(msg) {
            // Routed live all the same; not kept. Counted, and logged at debug (a client
            // could otherwise fill the log).
            self.stats
                .retained_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(
                key = msg.key.as_str(),
                "retained message not kept: mqtt.max_retained_bytes reached"
            );
            return;
        }
        if let Some(j) = self.journal()
            && !super::is_sys(msg.key.as_str())
        {
            j.push(|b| super::persist::rec::retained(b, msg));
        }
    }

    /// The retained messages matching `expr`.
    pub(crate) fn retained_matching(&self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        locked(&self.retained).matching(expr, skip_dollar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(k: &str, n: usize) -> Message {
        Message::new(Key::new(k).unwrap_or_else(|e| panic!("{e}")), vec![7u8; n])
    }

    #[test]
    fn the_budget_counts_keys_and_payloads_and_replacements() {
        let mut r = Retained::new(100);
        assert!(r.set(&m("a", 40))); // 41
        assert!(r.set(&m("b", 40))); // 82
        assert!(!r.set(&m("c", 40)), "past the budget: refused");
        assert_eq!((r.len(), r.bytes()), (2, 82));
        assert!(
            r.set(&m("a", 10)),
            "a replacement frees the old one's bytes"
        ); // 52
        assert!(r.set(&m("c", 40))); // 93
        assert!(r.set(&m("b", 0)), "an empty payload clears"); // 52
        assert_eq!((r.len(), r.bytes()), (2, 52));
        let mut open = Retained::new(0);
        assert!(open.set(&m("x", 1 << 20)));
    }
}
