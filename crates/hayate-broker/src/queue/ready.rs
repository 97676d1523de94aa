//! A queue's ready messages in delivery order ([`Ready`]: a FIFO per priority).

use std::collections::VecDeque;

use super::QItem;

/// A queue's ready messages in delivery order: a first-in first-out list per priority
/// (a queue without priorities has priority 0 only), the highest served first. New
/// messages go to the back of their priority's list (O(1)); a message given back goes to
/// its place in its own list (by `seq`).
#[derive(Debug, Default)]
pub(super) struct Ready {
    /// Index: the priority (grown to the highest one seen).
    levels: Vec<VecDeque<QItem>>,
    len: usize,
}

impl Ready {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn level(&mut self, priority: u8) -> &mut VecDeque<QItem> {
        let p = usize::from(priority);
        if self.levels.len() <= p {
            self.levels.resize_with(p + 1, VecDeque::new);
        }
        &mut self.levels[p]
    }

    /// The next to deliver.
    pub(super) fn front(&self) -> Option<&QItem> {
        self.levels.iter().rev().find_map(VecDeque::front)
    }

    pub(super) fn pop_front(&mut self) -> Option<QItem> {
        let m = self.levels.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.len -= 1;
        Some(m)
    }

    /// A new message (its `seq` the highest yet): at the back of its priority.
    pub(super) fn push_back(&mut self, m: QItem) {
        self.level(m.priority).push_back(m);
        self.len += 1;
    }

    /// A message given back: to its place among those of its priority.
    pub(super) fn insert_in_place(&mut self, m: QItem) {
        let level = self.level(m.priority);
        let at = level.partition_point(|x| x.seq < m.seq);
        level.insert(at, m);
        self.len += 1;
    }

    /// The message with `priority` and `seq`, if it is still here.
    pub(super) fn get_mut(&mut self, priority: u8, seq: u64) -> Option<&mut QItem> {
        let level = self.levels.get_mut(usize::from(priority))?;
        let at = level.partition_point(|x| x.seq < seq);
        level.get_mut(at).filter(|m| m.seq == seq)
    }

    pub(super) fn clear(&mut self) {
        self.levels.clear();
        self.len = 0;
    }
}
