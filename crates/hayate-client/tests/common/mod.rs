//! Helpers of the peer-node tests (node.rs, node_shm.rs) and of the fake servers
//! (keepalive.rs, hostile_server.rs).

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

/// The WELCOME a fake server answers a HELLO with (`max_payload` 1 MiB), encoded.
#[allow(dead_code)] // the peer-node tests run no fake server
pub(crate) fn welcome(server: &str) -> bytes::BytesMut {
    let mut out = bytes::BytesMut::new();
    hayate_native::encode(
        &hayate_native::Frame::Welcome(hayate_native::Welcome {
            version: hayate_native::PROTOCOL_VERSION,
            session: 1,
            max_payload: 1 << 20,
            server: server.into(),
            inbox: "_inbox/1".into(),
            shm: None,
        }),
        &mut out,
    );
    out
}
