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
    /// Admin HTTP address.
    pub admin: String,
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
pub async fn start(config: Config) -> TestBroker {
    start_recovering(config, true).await
}

/// As [`start`], without [`Server::recover`] unless `recover` (a server that never reads
/// its data directory back).
pub async fn start_recovering(mut config: Config, recover: bool) -> TestBroker {
    if config.server.data_dir == Config::default().server.data_dir {
        config.server.data_dir.clear();
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let m = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mqtt = m.local_addr().unwrap().to_string();
    let st = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stomp = st.local_addr().unwrap().to_string();
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = a.local_addr().unwrap().to_string();
    let server = Server::from_listeners(
        vec![
            (l, Protocol::Native),
            (m, Protocol::Mqtt),
            (st, Protocol::Stomp),
        ],
        &config,
    )
    .with_admin(a);
    if recover {
        server.recover(&config).unwrap();
    }
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
        admin,
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
/// One HTTP/1.1 request to `addr` (its own connection): the status code and the body.
pub async fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    http_with_body(addr, method, path, headers, "").await
}

/// [`http`] with a request body.
pub async fn http_with_body(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    within(10, s.read_to_end(&mut out)).await.unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    // Chunked bodies (axum's default for streamed ones): join the chunks.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut rest = body;
        let mut joined = String::new();
        while let Some((len, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            joined.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
        joined
    } else {
        body.to_string()
    };
    (status, body)
}

pub async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("test watchdog expired")
}
