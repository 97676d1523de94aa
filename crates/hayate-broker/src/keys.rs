//! Which keys carry the traffic: a sampled, bounded estimate of messages per key prefix (the
//! first two levels of a key), for the admin API's "top keys".
//!
//! Each session offers one publish in [`EVERY`] to the sampler, counted as [`EVERY`] times
//! its messages, so the sampler's lock is taken for a small fraction of publishes. The
//! sampler keeps at most [`CAPACITY`] prefixes with the Space-Saving rule: a new prefix
//! when the table is full takes the place of the smallest one, inheriting its count. The
//! heavy prefixes are then kept, each over-estimated by at most the smallest count. What is
//! kept is taken (and reset) by whoever reports rates, once a second.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use hayate_core::Key;

/// One publish in this many, per session, is sampled.
pub const EVERY: u32 = 16;

/// Prefixes kept at most.
pub const CAPACITY: usize = 256;

/// Longest prefix kept, in bytes (longer ones are cut at a character boundary).
const MAX_PREFIX: usize = 128;

/// The sampled messages per key prefix since the last [`KeySampler::take`].
#[derive(Debug, Default)]
pub struct KeySampler {
    counts: Mutex<HashMap<Box<str>, u64>>,
}

/// The first two levels of `key`; every reply inbox counts as `_inbox/*`.
pub fn prefix(key: &str) -> &str {
    if key.starts_with("_inbox/") {
        return "_inbox/*";
    }
    let end = match key.match_indices('/').nth(1) {
        Some((i, _)) => i,
        None => key.len(),
    };
    let mut end = end.min(MAX_PREFIX);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

impl KeySampler {
    /// Counts `msgs` messages on `key` (already multiplied by the sampling rate). A sample
    /// that finds the table locked by another publisher is dropped: an estimate loses
    /// little, and no publisher waits for it.
    pub fn note(&self, key: &Key, msgs: u64) {
        let p = prefix(key.as_str());
        let mut m = match self.counts.try_lock() {
            Ok(m) => m,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if let Some(c) = m.get_mut(p) {
            *c += msgs;
            return;
        }
        if m.len() < CAPACITY {
            m.insert(p.into(), msgs);
            return;
        }
        // Space-Saving: the smallest makes room, and the newcomer inherits its count.
        let Some((smallest, &min)) = m.iter().min_by_key(|(_, c)| **c) else {
            return;
        };
        let smallest = smallest.clone();
        m.remove(&smallest);
        m.insert(p.into(), min + msgs);
    }

    /// What was counted since the last call, largest first, and a fresh start.
    pub fn take(&self) -> Vec<(String, u64)> {
        let m = std::mem::take(&mut *self.counts.lock().unwrap_or_else(PoisonError::into_inner));
        let mut v: Vec<_> = m.into_iter().map(|(k, c)| (k.into_string(), c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(prefix("a/b/c/d"), "a/b");
        assert_eq!(prefix("a/b"), "a/b");
        assert_eq!(prefix("a"), "a");
        assert_eq!(prefix("_inbox/abc/1"), "_inbox/*");
        let long = format!("{}/x", "é".repeat(100));
        assert!(prefix(&long).len() <= MAX_PREFIX);
    }

    #[test]
    fn heavy_prefixes_survive_a_full_table() {
        let s = KeySampler::default();
        let heavy = Key::new("heavy/one/x").unwrap();
        for i in 0..(CAPACITY * 4) {
            s.note(&heavy, 10);
            s.note(&Key::new(&format!("light/{i}")).unwrap(), 1);
        }
        let v = s.take();
        assert!(v.len() <= CAPACITY);
        assert_eq!(v[0].0, "heavy/one");
        assert!(v[0].1 >= (CAPACITY * 4 * 10) as u64);
        assert!(s.take().is_empty(), "take resets");
    }
}
