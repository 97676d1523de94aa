//! Helpers of the peer-node tests (node.rs, node_shm.rs).

use std::time::Duration;

use hayate_client::{Key, Subscription};

/// The watchdog of every wait in these tests.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// `f`, or a panic after [`WAIT`].
pub(crate) async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f).await.expect("test watchdog")
}

/// The payloads of the next `n` messages of `sub`.
pub(crate) async fn take(sub: &mut Subscription, n: usize) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    while v.len() < n {
        let m = within(sub.next()).await.expect("subscription ended");
        v.push(m.payload.to_vec());
    }
    v
}

/// A key (valid by construction in these tests).
#[allow(clippy::unwrap_used)]
pub(crate) fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}
