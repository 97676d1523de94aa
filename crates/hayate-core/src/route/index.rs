//! The subscription index: a trie over key-expression segments.

use std::collections::HashMap;

use crate::key::Segment;
use crate::{Key, KeyExpr};

/// Identifies one subscription: (session id, subscription id within the session).
pub type SubKey = (u64, u32);

#[derive(Debug, Default)]
struct Node {
    literal: HashMap<Box<[u8]>, Node, foldhash::fast::RandomState>,
    star: Option<Box<Node>>,
    double_star: Option<Box<Node>>,
    subs: Vec<SubKey>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.subs.is_empty()
            && self.literal.is_empty()
            && self.star.is_none()
            && self.double_star.is_none()
    }
}

/// Maps key expressions to the subscriptions that hold them, and finds every subscription
/// whose expression matches a key.
#[derive(Debug, Default)]
pub struct SubscriptionIndex {
    root: Node,
    len: usize,
}

impl SubscriptionIndex {
    /// An empty index.
    pub fn new() -> SubscriptionIndex {
        SubscriptionIndex::default()
    }

    /// Number of subscriptions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no subscriptions.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `sub` under `expr`.
    pub fn insert(&mut self, expr: &KeyExpr, sub: SubKey) {
        let mut node = &mut self.root;
        for seg in expr.segments() {
            node = match seg {
                Segment::Literal(l) => node.literal.entry(l.clone()).or_default(),
                Segment::Star => node.star.get_or_insert_with(Default::default),
                Segment::DoubleStar => node.double_star.get_or_insert_with(Default::default),
            };
        }
        node.subs.push(sub);
        self.len += 1;
    }

    /// Removes `sub` from under `expr`; returns whether it was there. Prunes empty nodes.
    pub fn remove(&mut self, expr: &KeyExpr, sub: SubKey) -> bool {
        let removed = remove_at(&mut self.root, expr.segments(), sub);
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Every subscription whose expression matches `key`, each once, in a stable order.
    pub fn matches(&self, key: &Key) -> Vec<SubKey> {
        let segs: Vec<&[u8]> = key.segments().collect();
        let mut out = Vec::new();
        collect(&self.root, &segs, 0, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }
}

fn remove_at(node: &mut Node, segs: &[Segment], sub: SubKey) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        let before = node.subs.len();
        node.subs.retain(|s| *s != sub);
        return node.subs.len() != before;
    };
    match first {
        Segment::Literal(l) => {
            let Some(child) = node.literal.get_mut(l) else {
                return false;
            };
            let removed = remove_at(child, rest, sub);
            if child.is_empty() {
                node.literal.remove(l);
            }
            removed
        }
        Segment::Star | Segment::DoubleStar => {
            let slot = if *first == Segment::Star {
                &mut node.star
            } else {
                &mut node.double_star
            };
            let Some(child) = slot.as_deref_mut() else {
                return false;
            };
            let removed = remove_at(child, rest, sub);
            if child.is_empty() {
                *slot = None;
            }
            removed
        }
    }
}

fn collect(node: &Node, segs: &[&[u8]], i: usize, out: &mut Vec<SubKey>) {
    if i == segs.len() {
        out.extend_from_slice(&node.subs);
        if let Some(d) = &node.double_star {
            collect(d, segs, i, out);
        }
        return;
    }
    if let Some(c) = node.literal.get(segs[i]) {
        collect(c, segs, i + 1, out);
    }
    if let Some(s) = &node.star {
        collect(s, segs, i + 1, out);
    }
    if let Some(d) = &node.double_star {
        for j in i..=segs.len() {
            collect(d, segs, j, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::tests::{expr, key};
    use proptest::prelude::*;

    proptest! {
        /// The trie agrees with matching each expression on its own.
        #[test]
        fn trie_agrees_with_linear_scan(
            exprs in proptest::collection::vec(expr(), 0..12),
            remove in proptest::collection::vec(any::<bool>(), 12),
            keys in proptest::collection::vec(key(), 1..10),
        ) {
            let mut idx = SubscriptionIndex::new();
            for (i, e) in exprs.iter().enumerate() {
                idx.insert(e, (1, i as u32));
            }
            let mut live = Vec::new();
            for (i, e) in exprs.iter().enumerate() {
                if remove[i] {
                    prop_assert!(idx.remove(e, (1, i as u32)));
                } else {
                    live.push((i as u32, e));
                }
            }
            prop_assert_eq!(idx.len(), live.len());
            for k in &keys {
                let want: Vec<SubKey> = live
                    .iter()
                    .filter(|(_, e)| e.matches(k))
                    .map(|(i, _)| (1, *i))
                    .collect();
                prop_assert_eq!(idx.matches(k), want);
            }
        }
    }

    #[test]
    fn removal_prunes() {
        let mut idx = SubscriptionIndex::new();
        let e = KeyExpr::new("a/**/b/*").unwrap();
        idx.insert(&e, (1, 1));
        assert!(idx.remove(&e, (1, 1)));
        assert!(!idx.remove(&e, (1, 1)));
        assert!(idx.root.is_empty());
    }
}
