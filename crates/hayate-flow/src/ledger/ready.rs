//! A ledger's ready items: one first-in first-out list per priority, the highest served
//! first, each in seq order (an item given back goes back to its place).

use std::collections::VecDeque;

use super::Entry;

/// The ready items: one list per priority, each in seq order.
#[derive(Debug, Clone)]
pub(super) struct Ready<T> {
    /// Priority 0.
    pub(super) base: VecDeque<Entry<T>>,
    /// The other priorities seen, highest first.
    pub(super) levels: Vec<(u8, VecDeque<Entry<T>>)>,
    pub(super) len: usize,
}

impl<T> Ready<T> {
    pub(super) fn new() -> Ready<T> {
        Ready {
            base: VecDeque::new(),
            levels: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn level(&mut self, priority: u8) -> &mut VecDeque<Entry<T>> {
        if priority == 0 {
            return &mut self.base;
        }
        let at = match self.levels.iter().position(|(p, _)| *p <= priority) {
            Some(i) if self.levels[i].0 == priority => i,
            Some(i) => {
                self.levels.insert(i, (priority, VecDeque::new()));
                i
            }
            None => {
                self.levels.push((priority, VecDeque::new()));
                self.levels.len() - 1
            }
        };
        &mut self.levels[at].1
    }

    pub(super) fn push_back(&mut self, e: Entry<T>) {
        self.len += 1;
        self.level(e.priority).push_back(e);
    }

    pub(super) fn push_front(&mut self, e: Entry<T>) {
        self.len += 1;
        self.level(e.priority).push_front(e);
    }

    /// To its place among its priority, by seq.
    pub(super) fn insert(&mut self, e: Entry<T>) {
        self.len += 1;
        let level = self.level(e.priority);
        if level.back().is_none_or(|b| b.seq < e.seq) {
            level.push_back(e);
        } else {
            let at = level.partition_point(|x| x.seq < e.seq);
            level.insert(at, e);
        }
    }

    /// The item of `priority` with `seq`, if it is still ready.
    pub(super) fn get_mut(&mut self, priority: u8, seq: u64) -> Option<&mut Entry<T>> {
        let level = if priority == 0 {
            &mut self.base
        } else {
            &mut self.levels.iter_mut().find(|(p, _)| *p == priority)?.1
        };
        let at = level.partition_point(|x| x.seq < seq);
        level.get_mut(at).filter(|e| e.seq == seq)
    }

    /// The next in delivery order.
    pub(super) fn pop(&mut self) -> Option<Entry<T>> {
        let level = match self.levels.iter_mut().find(|(_, l)| !l.is_empty()) {
            Some((_, l)) => l,
            None => &mut self.base,
        };
        let e = level.pop_front()?;
        // A ring that held many (an offline session's backlog) gives its room back as it
        // drains: halved whenever it is less than a quarter full (so each halving follows
        // as many pops as it moves items).
        let cap = level.capacity();
        if cap > 64 && level.len() < cap / 4 {
            level.shrink_to(cap / 2);
        }
        self.len -= 1;
        Some(e)
    }

    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &Entry<T>> {
        self.levels
            .iter()
            .flat_map(|(_, l)| l.iter())
            .chain(self.base.iter())
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Entry<T>> {
        self.levels
            .iter_mut()
            .flat_map(|(_, l)| l.iter_mut())
            .chain(self.base.iter_mut())
    }

    /// Keeps the entries for which `keep` is true.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Entry<T>) -> bool) {
        for (_, l) in &mut self.levels {
            l.retain(&mut keep);
        }
        self.base.retain(keep);
        self.len = self.base.len() + self.levels.iter().map(|(_, l)| l.len()).sum::<usize>();
    }

    /// Removes the heads of each priority for which `pick` is true.
    pub(super) fn pop_heads(&mut self, mut pick: impl FnMut(&T) -> bool) -> Vec<Entry<T>> {
        let mut out = Vec::new();
        let levels = self.levels.iter_mut().map(|(_, l)| l);
        for l in levels.chain(std::iter::once(&mut self.base)) {
            while l.front().is_some_and(|e| pick(&e.item)) {
                out.extend(l.pop_front());
            }
        }
        self.len -= out.len();
        out
    }

    pub(super) fn take(&mut self) -> Vec<Entry<T>> {
        self.len = 0;
        let mut all: Vec<Entry<T>> = Vec::new();
        for (_, l) in std::mem::take(&mut self.levels) {
            all.extend(l);
        }
        all.extend(std::mem::take(&mut self.base));
        all
    }
}
