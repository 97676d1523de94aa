//! The route table: who is subscribed to what, and where a key's messages go. One type for
//! the broker and for peer nodes, generic over what a subscription leads to (its *target*:
//! the broker's outbox and QoS; a peer node's local subscription or another node).
//!
//! - [`Table`]: subscriptions by id ([`SubKey`]), each with its key expression, its queue
//!   group (if any) and its target; the [`SubscriptionIndex`] (a trie over the expressions'
//!   segments) finds those matching a key without looking at the others; queue groups with
//!   their member counts and their round-robin turn.
//! - [`Route`]: what [`Table::route`] makes of one key: the fan-out targets and, per queue
//!   group, its members and its turn ([`RoundRobin`]).
//! - [`RouteCache`]: routes per key, kept while the table's generation (a counter its owner
//!   bumps on every change) is unchanged, so that the publish path matches nothing and takes
//!   no lock.
//!
//! The owner keeps the generation and the lock; nothing here counts, locks or does I/O.

mod cache;
mod index;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Key, KeyExpr};

pub use cache::RouteCache;
pub use index::{SubKey, SubscriptionIndex};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// One subscription of a [`Table`].
#[derive(Debug, Clone)]
pub struct Sub<T> {
    /// Its key expression.
    pub expr: KeyExpr,
    /// Its queue group (`None`: fan-out), one `Arc` per group for the whole table.
    pub group: Option<Arc<str>>,
    /// Where its messages go.
    pub target: T,
}

/// A queue group's turn: which member takes the next message. Shared by every route of the
/// group (a group's members take turns over every key it matches).
#[derive(Debug, Clone, Default)]
pub struct RoundRobin(Arc<AtomicUsize>);

impl RoundRobin {
    /// Takes a turn: a number that grows by one per call (wrapping).
    #[inline]
    pub fn turn(&self) -> usize {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    /// The member of `members` whose turn it is (`None` if there is none).
    #[inline]
    pub fn pick<'a, U>(&self, members: &'a [U]) -> Option<&'a U> {
        match members.len() {
            0 => None,
            n => members.get(self.turn() % n),
        }
    }

    /// Every member of `members` once, from the one whose turn it is, round: the order in
    /// which to try them when the first may turn out to be gone.
    #[inline]
    pub fn rotation<'a, U>(
        &self,
        members: &'a [U],
    ) -> std::iter::Chain<std::slice::Iter<'a, U>, std::slice::Iter<'a, U>> {
        let start = self.turn();
        let at = if members.is_empty() {
            0
        } else {
            start % members.len()
        };
        let (before, after) = members.split_at(at);
        after.iter().chain(before)
    }
}

/// A queue group's part of one key's [`Route`].
#[derive(Debug)]
pub struct GroupRoute<U> {
    /// The group's id (as given to [`Table::insert`]).
    pub id: Arc<str>,
    /// The group's turn.
    pub rr: RoundRobin,
    /// Its members that the key reaches, in id order.
    pub members: Vec<U>,
}

/// Where messages on one key go: every fan-out target, and each queue group's members (of
/// which one takes each message).
#[derive(Debug)]
pub struct Route<U> {
    /// Subscriptions outside queue groups, in id order.
    pub fanout: Vec<U>,
    /// Queue groups with at least one member the key reaches, in the order of their first
    /// member's id.
    pub groups: Vec<GroupRoute<U>>,
}

impl<U> Default for Route<U> {
    fn default() -> Self {
        Route {
            fanout: Vec::new(),
            groups: Vec::new(),
        }
    }
}

impl<U> Route<U> {
    /// No target at all.
    pub fn is_empty(&self) -> bool {
        self.fanout.is_empty() && self.groups.is_empty()
    }

    /// The part of queue group `id`, if the key reaches one of its members.
    pub fn group(&self, id: &str) -> Option<&GroupRoute<U>> {
        self.groups.iter().find(|g| &*g.id == id)
    }
}

#[derive(Debug, Default)]
struct Group {
    rr: RoundRobin,
    members: usize,
}

/// What [`Table::remove`] took out.
#[derive(Debug)]
pub struct Removed<T> {
    /// The subscription.
    pub sub: Sub<T>,
    /// It was the last member of its queue group, which is gone with it.
    pub group_emptied: bool,
}

/// Subscriptions by id, with the trie that matches keys against their expressions and the
/// queue groups they form (see the [module](self) documentation).
#[derive(Debug)]
pub struct Table<T> {
    index: SubscriptionIndex,
    subs: Map<SubKey, Sub<T>>,
    groups: Map<Arc<str>, Group>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            index: SubscriptionIndex::new(),
            subs: Map::default(),
            groups: Map::default(),
        }
    }
}

impl<T> Table<T> {
    /// An empty table.
    pub fn new() -> Table<T> {
        Table::default()
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// True if there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// Subscription `id`.
    pub fn get(&self, id: SubKey) -> Option<&Sub<T>> {
        self.subs.get(&id)
    }

    /// Every subscription, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (SubKey, &Sub<T>)> {
        self.subs.iter().map(|(id, s)| (*id, s))
    }

    /// Every subscription whose expression matches `key`, each once, in id order.
    pub fn matching(&self, key: &Key) -> impl Iterator<Item = (SubKey, &Sub<T>)> {
        self.index
            .matches(key)
            .into_iter()
            .filter_map(|id| self.subs.get(&id).map(|s| (id, s)))
    }

    /// Whether queue group `id` has a member.
    pub fn has_group(&self, id: &str) -> bool {
        self.groups.contains_key(id)
    }

    /// Queue groups with their member counts, in no particular order.
    pub fn groups(&self) -> impl Iterator<Item = (&Arc<str>, usize)> {
        self.groups.iter().map(|(id, g)| (id, g.members))
    }

    /// Adds subscription `id` on `expr`, in queue group `group` (any string naming it: the
    /// broker's are a name and an expression) or fan-out, leading to `target`; one already
    /// under `id` is replaced. Returns the group's `Arc`, the table's one.
    pub fn insert(
        &mut self,
        id: SubKey,
        expr: KeyExpr,
        group: Option<&str>,
        target: T,
    ) -> Option<Arc<str>> {
        self.remove(id);
        let group = group.map(|g| {
            let g = match self.groups.get_key_value(g) {
                Some((k, _)) => k.clone(),
                None => Arc::from(g),
            };
            self.groups.entry(g.clone()).or_default().members += 1;
            g
        });
        self.index.insert(&expr, id);
        self.subs.insert(
            id,
            Sub {
                expr,
                group: group.clone(),
                target,
            },
        );
        group
    }

    /// Removes subscription `id`; what it was, if there was one.
    pub fn remove(&mut self, id: SubKey) -> Option<Removed<T>> {
        let sub = self.subs.remove(&id)?;
        self.index.remove(&sub.expr, id);
        let mut group_emptied = false;
        if let Some(g) = &sub.group
            && let Some(e) = self.groups.get_mut(g)
        {
            e.members -= 1;
            if e.members == 0 {
                self.groups.remove(g);
                group_emptied = true;
            }
        }
        Some(Removed { sub, group_emptied })
    }

    /// Removes every subscription for which `keep` is false; how many.
    pub fn retain(&mut self, mut keep: impl FnMut(SubKey, &Sub<T>) -> bool) -> usize {
        let gone: Vec<SubKey> = self
            .subs
            .iter()
            .filter(|(id, s)| !keep(**id, s))
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.remove(*id);
        }
        gone.len()
    }

    /// Where messages on `key` go: each matching subscription that `admit` maps to a target
    /// (`None`: left out), fan-out or in its queue group's part.
    pub fn route<U>(
        &self,
        key: &Key,
        mut admit: impl FnMut(SubKey, &Sub<T>) -> Option<U>,
    ) -> Route<U> {
        let mut route = Route::default();
        for (id, s) in self.matching(key) {
            let Some(u) = admit(id, s) else { continue };
            let Some(g) = &s.group else {
                route.fanout.push(u);
                continue;
            };
            match route.groups.iter_mut().find(|r| r.id == *g) {
                Some(r) => r.members.push(u),
                None => route.groups.push(GroupRoute {
                    id: g.clone(),
                    rr: self.groups.get(g).map(|e| e.rr.clone()).unwrap_or_default(),
                    members: vec![u],
                }),
            }
        }
        route
    }
}

#[cfg(test)]
mod tests;
