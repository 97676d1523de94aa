//! Locking helpers shared by every crate above this one.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poisoning: a panic while some state was locked cannot leave it worse
/// than losing the task that panicked (a connection, a benchmark driver), and the rest carries
/// on. Every crate of the workspace but `hayate-log` (which depends on none) uses this one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
