//! Retained messages: the last retained message of each key, stored by PUBLISH (and wills,
//! `$SYS`) and sent to new subscriptions.

use std::collections::HashMap;
use std::time::Instant;

use hayate_core::{Key, KeyExpr, Message};

use super::{Mqtt, locked};

/// Retained messages by key.
#[derive(Debug, Default)]
pub(crate) struct Retained {
    map: HashMap<Key, Message>,
}

impl Retained {
    /// Stores `msg` as the retained message of its key (an empty payload clears it).
    pub(crate) fn set(&mut self, msg: &Message) {
        if msg.payload.is_empty() {
            self.map.remove(&msg.key);
        } else {
            self.map.insert(msg.key.clone(), msg.clone());
        }
    }

    /// The retained messages matching `expr` (not `$` keys when `skip_dollar`).
    pub(crate) fn matching(&mut self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        let now = Instant::now();
        self.map
            .retain(|_, m| m.attrs.expires.is_none_or(|at| at > now));
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
        r.set(msg);
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
