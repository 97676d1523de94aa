//! Test helpers: a broker on 127.0.0.1:0 that stops by itself.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use hayate_server::{Config, Server};
use tokio::sync::oneshot;

/// A running broker; dropping it shuts the broker down.
pub struct TestBroker {
    pub addr: String,
    pub broker: hayate_broker::Broker,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub async fn start(mut config: Config) -> TestBroker {
    // Tests keep nothing on disk.
    config.server.data_dir.clear();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = Server::from_listener(l, &config);
    let addr = server.local_addrs()[0].clone();
    let broker = server.broker().clone();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    TestBroker {
        addr,
        broker,
        stop: Some(tx),
    }
}

pub async fn start_default() -> TestBroker {
    start(Config::default()).await
}

/// Awaits `f` or fails the test after `secs` seconds (a watchdog against hangs, not a
/// performance assertion).
pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test watchdog expired")
}
