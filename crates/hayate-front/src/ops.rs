//! What operators see of a running server: its listeners' traffic and connection counts, the
//! live connections, and whether it is ready. The admin HTTP listener (`hayate_admin`)
//! serves it as JSON and as Prometheus metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use hayate_io::registry::ConnRegistry;
use hayate_io::traffic::TrafficClass;

/// One listener: its protocol and address, the traffic of the sessions opened on it, and its
/// connection counts.
#[derive(Debug)]
pub struct ListenerStats {
    /// `native`, `native-tls`, `mqtt`, `mqtt-tls`, `mqtt-ws`, `mqtt-wss`, `stomp`,
    /// `stomp-tls`, `amqp`, `amqp-tls`.
    pub protocol: &'static str,
    /// `HOST:PORT`, `unix:PATH`, or `shm` (native clients on shared memory).
    pub addr: String,
    /// What the sessions opened on it published and were delivered.
    pub traffic: Arc<TrafficClass>,
    /// Connections accepted (past the connection limits; handshakes that then fail count).
    pub accepted: AtomicU64,
    /// Connections refused by a limit before any byte was read (`max_connections`,
    /// `max_connections_per_address`, `max_connection_rate_per_address`).
    pub refused: AtomicU64,
}

impl ListenerStats {
    pub fn new(protocol: &'static str, addr: String) -> Arc<ListenerStats> {
        Arc::new(ListenerStats {
            protocol,
            addr,
            traffic: TrafficClass::new(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }
}

/// The server's operational state, shared by its accept loops and the admin listener.
#[derive(Debug)]
pub struct Ops {
    /// Every connection alive now.
    pub conns: Arc<ConnRegistry>,
    /// The listeners, in the order they were bound.
    pub listeners: Vec<Arc<ListenerStats>>,
    started: Instant,
    ready: AtomicBool,
}

impl Ops {
    /// Connections open now on each listener, in the order of [`Ops::listeners`].
    pub fn connections_per_listener(&self) -> Vec<usize> {
        let conns = self.conns.list();
        self.listeners
            .iter()
            .map(|l| {
                conns
                    .iter()
                    .filter(|c| c.listener == l.addr && c.protocol == l.protocol)
                    .count()
            })
            .collect()
    }

    pub fn new(listeners: Vec<Arc<ListenerStats>>) -> Arc<Ops> {
        Arc::new(Ops {
            conns: ConnRegistry::new(),
            listeners,
            started: Instant::now(),
            ready: AtomicBool::new(false),
        })
    }

    /// Seconds since the server was made.
    pub fn uptime_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// True once every listener accepts (the admin listener closes when shutdown starts).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }
}
