//! Routes cached per key while the table they were made from is unchanged.

use std::collections::HashMap;
use std::sync::Arc;

use crate::Key;

/// Routes (`R`: whatever its owner makes of a [`super::Route`]) per key, valid while the
/// table's generation is the one they were made at: a change of generation, or more than
/// `limit` keys, empties it. Owned by one publisher (a broker session) or behind its
/// owner's lock (a peer node's), so a hit costs one hash lookup and an `Arc` clone.
#[derive(Debug)]
pub struct RouteCache<R> {
    routes: HashMap<Key, Arc<R>, foldhash::fast::RandomState>,
    generation: u64,
    limit: usize,
}

impl<R> RouteCache<R> {
    /// An empty cache of at most `limit` keys.
    pub fn new(limit: usize) -> RouteCache<R> {
        RouteCache {
            routes: HashMap::default(),
            generation: 0,
            limit,
        }
    }

    /// Number of keys cached.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// `key`'s route now that the table's generation is `generation`: the cached one, or
    /// the one `build` makes, with the generation it read the table at. That one is kept
    /// only if it is still `generation` (a route made across a change serves this call
    /// alone), and as a copy of the key: `key` may be a slice of a read buffer, which the
    /// cache must not keep alive.
    #[inline]
    pub fn get_or_build(
        &mut self,
        generation: u64,
        key: &Key,
        build: impl FnOnce() -> (u64, Arc<R>),
    ) -> Arc<R> {
        if generation != self.generation || self.routes.len() >= self.limit {
            self.routes.clear();
            self.generation = generation;
        }
        if let Some(r) = self.routes.get(key) {
            return r.clone();
        }
        let (built_at, route) = build();
        if built_at == self.generation {
            self.routes.insert(key.compact(), route.clone());
        }
        route
    }
}
