//! Retained messages: the last retained message of each key, stored by PUBLISH (and wills,
//! `$SYS`) and sent to new subscriptions.

use std::collections::HashMap;
use std::mem::size_of;
use std::sync::Arc;
use std::time::Instant;

use hayate_broker::footprint;
use hayate_core::{Key, KeyExpr, Message};
use hayate_io::memory::{Charge, Memory};

use super::Mqtt;
use hayate_core::sync::lock;

/// Retained messages by key, at most `max_bytes` of keys and payloads together, and within
/// the memory budget at their footprint ([`cost`]).
#[derive(Debug, Default)]
pub(crate) struct Retained {
    /// Boxed: a table slot is then 40 bytes, not a whole `Message`'s, so the table's empty
    /// slots (up to 3.6 per message, see [`SLOT`]) cost little.
    map: HashMap<Key, Box<Message>>,
    /// Keys and payloads held (what `max_bytes` bounds).
    bytes: usize,
    /// The footprint of what is held (the sum of [`cost`]: what the budget is charged).
    cost: usize,
    /// 0: no limit.
    max_bytes: usize,
    /// The retained messages' share of the broker-wide memory budget.
    charge: Option<Charge>,
}

/// Why a retained message was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// `mqtt.max_retained_bytes` reached.
    Limit,
    /// The broker-wide memory budget has no room for it.
    Budget,
}

fn size(m: &Message) -> usize {
    m.key.as_bytes().len() + m.payload.len()
}

/// What holding one retained message costs besides its data: its `Box<Message>` (the
/// struct and its allocation) and its share of the hash table. A table slot is a
/// `(Key, Box<Message>)` and a control byte; the table is at most 7/8 full and at least
/// 7/16 just after it doubled, and [`Retained::settle`] halves it when it is less than a
/// quarter full, so it keeps at most 32/7 slots per message: 419 bytes in all. Measured
/// (docs/performance.md, *Memory*): 7.7 M one-byte messages took 4.48 GB of RSS before the
/// table was boxed (580 bytes each, a table of 2^24 unboxed slots); boxed and bounded, a
/// one-byte message on a 9-byte topic is charged 557 bytes (this and `footprint::data`) and
/// costs about 380 of RSS.
const SLOT: usize =
    size_of::<Message>() + footprint::ALLOC + (size_of::<(Key, Box<Message>)>() + 1) * 32 / 7;

/// The footprint of one retained message (what the memory budget is charged for it).
fn cost(m: &Message) -> usize {
    footprint::data(m) + SLOT
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
    #[cfg(test)]
    pub(crate) fn set(&mut self, msg: &Message) -> bool {
        self.set_as(msg, false).is_ok()
    }

    /// As [`Retained::set`] for a message restored from disk: it exists already, so the
    /// memory budget takes it whatever it holds (`max_bytes` still applies).
    pub(crate) fn restore(&mut self, msg: &Message) -> bool {
        self.set_as(msg, true).is_ok()
    }

    /// As [`Retained::set`], saying why a message was not kept.
    pub(crate) fn set_as(&mut self, msg: &Message, forced: bool) -> Result<(), Full> {
        let (old, old_cost) = self
            .map
            .get(&msg.key)
            .map_or((0, 0), |m| (size(m), cost(m)));
        if msg.payload.is_empty() {
            self.map.remove(&msg.key);
            self.bytes -= old;
            self.cost -= old_cost;
            self.settle();
            return Ok(());
        }
        let new = size(msg);
        if self.max_bytes > 0 && self.bytes - old + new > self.max_bytes {
            return Err(Full::Limit);
        }
        let new_cost = cost(msg);
        if let Some(c) = &mut self.charge {
            let need = self.cost - old_cost + new_cost;
            if forced {
                c.force(need);
            } else if !c.cover(need) {
                return Err(Full::Budget);
            }
        }
        // Kept for long: in allocations of its own, not pinning the read buffer it came in.
        let msg = msg.compact();
        self.map.insert(msg.key.clone(), Box::new(msg));
        self.bytes = self.bytes - old + new;
        self.cost = self.cost - old_cost + new_cost;
        self.settle();
        Ok(())
    }

    /// Charges what is kept to `memory` from now on: a message the budget has no room for
    /// is not kept (as past `max_bytes`).
    pub(crate) fn with_memory(mut self, memory: &Arc<Memory>) -> Retained {
        let mut c = Charge::exact(memory);
        c.force(self.cost);
        self.charge = Some(c);
        self
    }

    /// After removals: halves the table while it is less than a quarter full (so it keeps
    /// at most 32/7 slots per message, as [`SLOT`] charges), and gives back what the charge
    /// no longer needs.
    fn settle(&mut self) {
        let cap = self.map.capacity();
        if cap > 64 && self.map.len() < cap / 4 {
            self.map.shrink_to(self.map.len() * 2);
        }
        if let Some(c) = &mut self.charge {
            c.shrink(self.cost);
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
        let (mut freed, mut freed_cost) = (0, 0);
        self.map.retain(|_, m| {
            let keep = m.attrs.expires.is_none_or(|at| at > now);
            if !keep {
                freed += size(m);
                freed_cost += cost(m);
            }
            keep
        });
        self.bytes -= freed;
        self.cost -= freed_cost;
        self.settle();
        self.map
            .values()
            .filter(|m| !(skip_dollar && m.key.as_bytes().first() == Some(&b'$')))
            .filter(|m| expr.matches(&m.key))
            .map(|m| Message::clone(m))
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Message> {
        self.map.values().map(|m| &**m)
    }

    /// The footprint of what is held (what the memory budget is charged).
    #[cfg(test)]
    pub(crate) fn cost(&self) -> usize {
        self.cost
    }
}

impl Mqtt {
    /// Stores or clears a retained message (journaled, except the broker's own `$SYS`
    /// ones: the journal's order for a key is the order of the changes, under this lock).
    /// False when the memory budget had no room for it (a 5.0 publisher is told: Quota
    /// exceeded).
    pub(crate) fn retain(&self, msg: &Message) -> bool {
        let mut r = lock(&self.retained);
        if let Err(full) = r.set_as(msg, false) {
            // Routed live all the same; not kept. Counted, and logged at debug (a client
            // could otherwise fill the log).
            self.stats
                .retained_refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let why = match full {
                Full::Limit => "mqtt.max_retained_bytes reached",
                Full::Budget => "the memory budget is spent",
            };
            tracing::debug!(key = msg.key.as_str(), "retained message not kept: {why}");
            return full != Full::Budget;
        }
        if let Some(j) = self.journal()
            && !super::is_sys(msg.key.as_str())
        {
            j.push(|b| super::persist::rec::retained(b, msg));
        }
        true
    }

    /// The retained messages matching `expr`.
    pub(crate) fn retained_matching(&self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        lock(&self.retained).matching(expr, skip_dollar)
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
        assert_eq!(
            r.cost(),
            cost(&m("a", 10)) + cost(&m("c", 40)),
            "the footprint follows replacements and clears"
        );
        assert!(r.cost() > 2 * SLOT + 52);
        let mut budget = Retained::new(0).with_memory(&Memory::new(1 << 20));
        let mut n = 0;
        while budget.set(&m(&format!("t/{n}"), 1)) {
            n += 1;
        }
        assert!(
            n * (SLOT + 4 * footprint::ALLOC) <= 1 << 20 && n > 1000,
            "one-byte messages fill a 1 MiB budget at their footprint: {n}"
        );
        for i in 0..n {
            assert!(budget.set(&m(&format!("t/{i}"), 0)));
        }
        assert_eq!((budget.len(), budget.cost()), (0, 0));
        assert!(
            budget.map.capacity() <= 64,
            "the table shrank as it emptied"
        );
        let mut open = Retained::new(0);
        assert!(open.set(&m("x", 1 << 20)));
    }

    /// A retained message with MQTT 5.0 user properties, as `translate` builds it (its
    /// headers vector has room for a content type it may not carry), replaced and cleared
    /// over and over: the store's charge comes back to nothing. It was charged the vector's
    /// capacity when set and given back the stored copy's (`Message::compact`: exactly its
    /// length), so each replacement left 56 bytes charged for good, and a client doing so
    /// in a loop spent the whole memory budget.
    #[test]
    fn replacing_a_message_with_properties_gives_its_charge_back() {
        let pool = Memory::new(1 << 30);
        let mut r = Retained::new(0).with_memory(&pool);
        let with_props = |n: usize| {
            let mut msg = m("p/1", n);
            let mut h = Vec::with_capacity(2);
            h.push(("k".to_string(), bytes::Bytes::from_static(b"v")));
            msg.headers = Some(h);
            msg
        };
        for _ in 0..1000 {
            assert!(r.set(&with_props(1)));
        }
        assert_eq!(r.cost(), cost(&with_props(1).compact()), "one message held");
        assert!(r.set(&with_props(0)), "cleared");
        assert_eq!((r.len(), r.cost(), pool.used()), (0, 0, 0));
    }
}
