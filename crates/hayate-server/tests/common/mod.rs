//! Test helpers: a broker on 127.0.0.1:0 that stops by itself.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use hayate_server::{Config, Protocol, Server};
use tokio::sync::oneshot;

/// A running broker; dropping it shuts the broker down.
pub struct TestBroker {
    /// Native protocol address.
    pub addr: String,
    /// MQTT address.
    pub mqtt: String,
    /// STOMP address.
    pub stomp: String,
    pub broker: hayate_broker::Broker,
    /// The busy-polling state, when the config turns it on.
    pub busy: Option<hayate_server::busy::BusyPoll>,
    /// The shared-memory offer, when `native.shm` is on.
    pub shm: Option<std::sync::Arc<hayate_server::shm::ShmOffer>>,
    stop: Option<oneshot::Sender<()>>,
    run: Option<tokio::task::JoinHandle<()>>,
}

impl TestBroker {
    /// Stops the broker and waits until it has finished (and saved its state).
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.run.take() {
            let _ = h.await;
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A broker with native, MQTT and STOMP listeners on ephemeral ports. Unless the config names
/// its own data directory, nothing is kept on disk.
pub async fn start(mut config: Config) -> TestBroker {
    if config.server.data_dir == Config::default().server.data_dir {
        config.server.data_dir.clear();
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mqtt = m.local_addr().unwrap().to_string();
    let st = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stomp = st.local_addr().unwrap().to_string();
    let server = Server::from_listeners(
        vec![
            (l, Protocol::Native),
            (m, Protocol::Mqtt),
            (st, Protocol::Stomp),
        ],
        &config,
    );
    server.open_streams(&config).unwrap();
    let addr = server.local_addrs()[0].clone();
    let broker = server.broker().clone();
    let busy = server.busy_poll().cloned();
    let shm = server.shm().cloned();
    let (tx, rx) = oneshot::channel();
    let run = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    TestBroker {
        addr,
        mqtt,
        stomp,
        broker,
        busy,
        shm,
        stop: Some(tx),
        run: Some(run),
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
