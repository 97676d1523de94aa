//! Listeners and the accept loop.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hayate_broker::{Broker, BrokerConfig};
use hayate_io::busy::BusyPoll;
use hayate_io::memory::Memory;
use tokio::net::{TcpListener, UnixListener};

use crate::shm::ShmOffer;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::amqp::Amqp;
use crate::auth::{Authenticator, ConfigAuth};
use crate::config::{Config, Limits};
use crate::frontend::InputBudget;
use crate::mqtt::Mqtt;
use crate::native;
use crate::ops::{ListenerStats, Ops};
use crate::stomp::Stomp;
use crate::tls::ServerTls;

mod accept;
mod figures;

use accept::{ConnRate, Ctx, PerAddress, accept_loop};

/// The protocol a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Hayate's native protocol.
    Native,
    /// MQTT 3.1, 3.1.1 and 5.0 over TCP.
    Mqtt,
    /// MQTT over WebSocket.
    MqttWs,
    /// STOMP 1.0, 1.1 and 1.2 over TCP.
    Stomp,
    /// The native protocol over TLS.
    NativeTls,
    /// MQTT over TLS.
    MqttTls,
    /// MQTT over WebSocket over TLS (`wss://`).
    MqttWss,
    /// STOMP over TLS.
    StompTls,
    /// AMQP 0-9-1 over TCP.
    Amqp,
    /// AMQP 0-9-1 over TLS (`amqps`).
    AmqpTls,
}

impl Protocol {
    /// How the broker names it in its startup lines (`hayate broker: mqtt on ...`).
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Native => "native protocol",
            Protocol::Mqtt => "mqtt",
            Protocol::MqttWs => "mqtt over websocket",
            Protocol::Stomp => "stomp",
            Protocol::NativeTls => "native protocol over tls",
            Protocol::MqttTls => "mqtt over tls",
            Protocol::MqttWss => "mqtt over websocket over tls",
            Protocol::StompTls => "stomp over tls",
            Protocol::Amqp => "amqp",
            Protocol::AmqpTls => "amqp over tls",
        }
    }

    /// Whether connections start with a TLS handshake.
    pub fn is_tls(self) -> bool {
        matches!(
            self,
            Protocol::NativeTls
                | Protocol::MqttTls
                | Protocol::MqttWss
                | Protocol::StompTls
                | Protocol::AmqpTls
        )
    }

    /// Its short name in the admin API and metrics (`native`, `mqtt-wss`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Native => "native",
            Protocol::Mqtt => "mqtt",
            Protocol::MqttWs => "mqtt-ws",
            Protocol::Stomp => "stomp",
            Protocol::NativeTls => "native-tls",
            Protocol::MqttTls => "mqtt-tls",
            Protocol::MqttWss => "mqtt-wss",
            Protocol::StompTls => "stomp-tls",
            Protocol::Amqp => "amqp",
            Protocol::AmqpTls => "amqp-tls",
        }
    }

    /// The protocol spoken once TLS is set up.
    fn inner(self) -> Protocol {
        match self {
            Protocol::NativeTls => Protocol::Native,
            Protocol::MqttTls => Protocol::Mqtt,
            Protocol::MqttWss => Protocol::MqttWs,
            Protocol::StompTls => Protocol::Stomp,
            Protocol::AmqpTls => Protocol::Amqp,
            p => p,
        }
    }
}

/// A bound listener.
#[derive(Debug)]
enum Listener {
    Tcp(TcpListener, Protocol),
    Unix(UnixListener, String),
    /// The abstract socket native clients on this host set up shared memory over.
    Shm(UnixListener),
}

/// A broker with its listeners bound, ready to [`run`](Server::run).
pub struct Server {
    broker: Broker,
    listeners: Vec<Listener>,
    /// `[limits]`, replaced whole by a config reload ([`Reloader`]); each connection takes
    /// the version current when it is accepted.
    limits: LimitsCell,
    /// New connections per second per address (its rate changes with a reload).
    rate: Arc<ConnRate>,
    name: Arc<str>,
    keepalive: native::Keepalive,
    mqtt: Arc<Mqtt>,
    stomp: Arc<Stomp>,
    amqp: Arc<Amqp>,
    auth: Arc<dyn Authenticator>,
    tls: Option<Arc<ServerTls>>,
    busy_poll: Duration,
    /// The busy-polling state its connections note input in (when `busy_poll` is set).
    busy: Option<BusyPoll>,
    /// Shared memory offered to native clients on this host (`native.shm`).
    shm: Option<Arc<ShmOffer>>,
    /// Listener statistics, live connections, readiness (admin API, metrics).
    ops: Arc<Ops>,
    /// The admin HTTP listener (`[admin] listen`), and who may use it.
    admin: Option<TcpListener>,
    admin_users: Arc<std::sync::RwLock<Vec<String>>>,
    /// Reads and sets the process's log filter (`PUT /api/log`), when the program gives one.
    log_control: Option<crate::admin::LogControl>,
    /// Reloads the configuration (`POST /api/reload`), when the program gives one.
    reload_control: Option<crate::admin::ReloadControl>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("listeners", &self.listeners)
            .field("name", &self.name)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

async fn bind_tcp(addr: &str) -> Result<TcpListener, crate::config::ConfigError> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| crate::config::ConfigError::Invalid(format!("cannot listen on {addr}: {e}")))
}

impl Server {
    /// Validates `config` and binds every listener it names.
    pub async fn bind(config: &Config) -> Result<Server, crate::config::ConfigError> {
        config.validate()?;
        let mut listeners = Vec::new();
        for addr in &config.native.listen {
            listeners.push(Listener::Tcp(bind_tcp(addr).await?, Protocol::Native));
        }
        for addr in &config.mqtt.listen {
            listeners.push(Listener::Tcp(bind_tcp(addr).await?, Protocol::Mqtt));
        }
        for addr in &config.mqtt.ws {
            listeners.push(Listener::Tcp(bind_tcp(addr).await?, Protocol::MqttWs));
        }
        for addr in &config.stomp.listen {
            listeners.push(Listener::Tcp(bind_tcp(addr).await?, Protocol::Stomp));
        }
        for addr in &config.amqp.listen {
            listeners.push(Listener::Tcp(bind_tcp(addr).await?, Protocol::Amqp));
        }
        for (addrs, p) in [
            (&config.native.tls, Protocol::NativeTls),
            (&config.mqtt.tls, Protocol::MqttTls),
            (&config.mqtt.wss, Protocol::MqttWss),
            (&config.stomp.tls, Protocol::StompTls),
            (&config.amqp.tls, Protocol::AmqpTls),
        ] {
            for addr in addrs {
                listeners.push(Listener::Tcp(bind_tcp(addr).await?, p));
            }
        }
        for path in &config.native.unix {
            // A stale socket file from an earlier run would make bind fail.
            if std::fs::symlink_metadata(path)
                .map(|m| {
                    use std::os::unix::fs::FileTypeExt;
                    m.file_type().is_socket()
                })
                .unwrap_or(false)
            {
                let _ = std::fs::remove_file(path);
            }
            let l = UnixListener::bind(path).map_err(|e| {
                crate::config::ConfigError::Invalid(format!("cannot listen on {path}: {e}"))
            })?;
            listeners.push(Listener::Unix(l, path.clone()));
        }
        let mut server = Server::assemble(config, listeners);
        if let Some(addr) = config.admin.listen.first() {
            server.admin = Some(bind_tcp(addr).await?);
        }
        server.recover(config)?;
        Ok(server)
    }

    /// Recovers everything the data directory keeps, in this order (one path at start;
    /// [`Server::bind`] calls it, servers made from bound listeners call it themselves):
    ///
    /// 1. the broker's meta log, with the one-time migration of older files into it;
    /// 2. the streams it defines, with their consumers' positions;
    /// 3. the streams of `config.stream` that do not exist yet;
    /// 4. AMQP's durable exchanges, queues, bindings and persistent messages (with the
    ///    one-time migration of its earlier files);
    /// 5. MQTT's persistent sessions and retained messages (its own log).
    ///
    /// Until step 5 has run, MQTT neither journals nor checkpoints: a server never recovered
    /// leaves MQTT's saved state as it is. Without a data directory only step 3 does
    /// anything (in-memory streams).
    pub fn recover(&self, config: &Config) -> Result<(), crate::config::ConfigError> {
        let bad =
            |e: hayate_broker::StreamError| crate::config::ConfigError::Invalid(e.to_string());
        if self.broker.config().data.is_some() {
            self.broker.meta().map_err(bad)?;
        }
        let opened = self.broker.open_streams().map_err(bad)?;
        if !opened.is_empty() {
            tracing::info!(streams = ?opened, "streams opened");
        }
        for s in &config.stream {
            self.broker.create_stream(s.clone()).map_err(bad)?;
        }
        self.amqp.open_durable().map_err(|e| {
            crate::config::ConfigError::Invalid(format!("amqp durable queues: {e}"))
        })?;
        self.mqtt.recover_state();
        Ok(())
    }

    /// [`Server::recover`] (its earlier name).
    pub fn open_streams(&self, config: &Config) -> Result<(), crate::config::ConfigError> {
        self.recover(config)
    }

    /// A server on an already-bound native-protocol TCP listener (tests bind
    /// `127.0.0.1:0`).
    pub fn from_listener(listener: TcpListener, config: &Config) -> Server {
        Server::assemble(config, vec![Listener::Tcp(listener, Protocol::Native)])
    }

    /// A server on already-bound TCP listeners, each with its protocol.
    pub fn from_listeners(listeners: Vec<(TcpListener, Protocol)>, config: &Config) -> Server {
        let l = listeners
            .into_iter()
            .map(|(l, p)| Listener::Tcp(l, p))
            .collect();
        Server::assemble(config, l)
    }

    fn assemble(config: &Config, mut listeners: Vec<Listener>) -> Server {
        let native = listeners.iter().any(|l| match l {
            Listener::Tcp(_, p) => p.inner() == Protocol::Native,
            Listener::Unix(..) => true,
            Listener::Shm(..) => false,
        });
        let memory = Memory::new(config.limits.memory_budget_bytes());
        let shm = if native && config.native.shm && config.native.shm_max_connections > 0 {
            let fanout = usize::try_from(config.native.shm_fanout_bytes).unwrap_or(usize::MAX);
            match ShmOffer::bind(config.native.shm_max_connections, fanout, &memory) {
                Ok((offer, l)) => {
                    listeners.push(Listener::Shm(l));
                    Some(offer)
                }
                Err(e) => {
                    tracing::warn!("shared memory not offered: cannot bind its socket: {e}");
                    None
                }
            }
        } else {
            None
        };
        let broker = Broker::new(BrokerConfig {
            outbox_bytes: usize::try_from(config.limits.outbox_bytes).unwrap_or(usize::MAX),
            max_block: (config.limits.max_block_ms > 0)
                .then(|| Duration::from_millis(config.limits.max_block_ms)),
            max_unacked: config.limits.max_unacked as usize,
            data_dir: (!config.server.data_dir.is_empty())
                .then(|| std::path::PathBuf::from(&config.server.data_dir)),
            data: None,
            max_streams: config.limits.max_streams as usize,
            max_consumers: config.limits.max_consumers as usize,
            max_streams_per_user: config.limits.max_streams_per_user as usize,
            max_consumers_per_user: config.limits.max_consumers_per_user as usize,
            shared_consumers: vec![crate::stomp::QUEUE_CONSUMER_PREFIX.to_owned()],
            max_subscriptions: config.limits.max_subscriptions,
            queue_max_bytes: usize::try_from(config.stomp.queue_max_bytes).unwrap_or(usize::MAX),
            queue_max_length: config.stomp.queue_max_backlog,
            memory: memory.clone(),
        });
        let auth: Arc<dyn Authenticator> = match ConfigAuth::from_section(&config.auth) {
            Ok(a) => {
                // The argon2 checks' memory (docs/security.md, *Checking a password*).
                a.charge_to(&memory);
                Arc::new(a)
            }
            Err(e) => {
                // `bind` validates first; a server assembled from an invalid section fails
                // closed.
                tracing::error!("[auth]: {e}: every login is refused");
                Arc::new(ConfigAuth::deny_all())
            }
        };
        let tls = if config.tls.cert.is_empty() {
            None
        } else {
            match ServerTls::load(&config.tls) {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    // `bind` validates first; here TLS connections are refused.
                    tracing::error!("[tls]: {e}: TLS listeners refuse every connection");
                    None
                }
            }
        };
        let mqtt = Mqtt::new(broker.clone(), config, auth.clone());
        let stomp = Stomp::new(broker.clone(), config, auth.clone());
        let amqp = Amqp::new(broker.clone(), config, auth.clone());
        let ops = Ops::new(
            listeners
                .iter()
                .map(|l| {
                    let (p, a) = listener_name(l);
                    ListenerStats::new(p, a)
                })
                .collect(),
        );
        Server {
            broker,
            listeners,
            limits: Arc::new(std::sync::RwLock::new(Arc::new(config.limits.clone()))),
            rate: Arc::new(ConnRate::new(config.limits.max_connection_rate_per_address)),
            name: config.server.name.as_str().into(),
            keepalive: native::Keepalive {
                interval: (config.native.ping_interval_ms > 0)
                    .then(|| Duration::from_millis(config.native.ping_interval_ms)),
                max_pings_out: config.native.max_pings_out,
            },
            mqtt,
            stomp,
            amqp,
            auth,
            tls,
            busy_poll: Duration::from_micros(config.server.busy_poll_us),
            busy: (config.server.busy_poll_us > 0).then(BusyPoll::new),
            shm,
            ops,
            admin: None,
            admin_users: Arc::new(std::sync::RwLock::new(config.admin.users.clone())),
            log_control: None,
            reload_control: None,
        }
    }

    /// Serves the admin HTTP API on `listener` too (tests bind `127.0.0.1:0`;
    /// [`Server::bind`] binds `[admin] listen`).
    pub fn with_admin(mut self, listener: TcpListener) -> Server {
        self.admin = Some(listener);
        self
    }

    /// Lets the admin API read and set the log filter (`GET`/`PUT /api/log`).
    pub fn with_log_control(mut self, control: crate::admin::LogControl) -> Server {
        self.log_control = Some(control);
        self
    }

    /// The admin listener's address, when there is one.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// What applies a new configuration to this server while it runs (SIGHUP, the admin
    /// API's reload).
    pub fn reloader(&self) -> Reloader {
        Reloader {
            limits: self.limits.clone(),
            rate: self.rate.clone(),
            auth: self.auth.clone(),
            admin_users: self.admin_users.clone(),
            broker: self.broker.clone(),
            ops: self.ops.clone(),
        }
    }

    /// Lets the admin API reload the configuration (`POST /api/reload`): `control` reads
    /// the config file again and applies it.
    pub fn with_reload_control(mut self, control: crate::admin::ReloadControl) -> Server {
        self.reload_control = Some(control);
        self
    }

    /// Listener statistics, live connections and readiness.
    pub fn ops(&self) -> &Arc<Ops> {
        &self.ops
    }

    /// The shared-memory offer (its socket's name), when `native.shm` is on.
    pub fn shm(&self) -> Option<&Arc<ShmOffer>> {
        self.shm.as_ref()
    }

    /// The TLS settings, for reloading them (SIGHUP) while the server runs.
    pub fn tls(&self) -> Option<Arc<ServerTls>> {
        self.tls.clone()
    }

    /// The MQTT front-end's shared state (statistics, saving).
    pub fn mqtt(&self) -> &Arc<Mqtt> {
        &self.mqtt
    }

    /// The busy-polling state (with `[server] busy_poll_us` set): its turn count shows
    /// whether the poll loop runs.
    pub fn busy_poll(&self) -> Option<&BusyPoll> {
        self.busy.as_ref()
    }

    /// The engine (for embedding programs and tests).
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The bound native-protocol addresses: `HOST:PORT` for TCP, `unix:PATH` for Unix
    /// sockets.
    pub fn local_addrs(&self) -> Vec<String> {
        self.bound()
            .into_iter()
            .filter(|(p, _)| *p == Protocol::Native)
            .map(|(_, a)| a)
            .collect()
    }

    /// Every bound address with its protocol.
    pub fn bound(&self) -> Vec<(Protocol, String)> {
        self.listeners
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(t, p) => Some((
                    *p,
                    t.local_addr()
                        .map(|a| a.to_string())
                        .unwrap_or_else(|e| format!("? ({e})")),
                )),
                Listener::Unix(_, p) => Some((Protocol::Native, format!("unix:{p}"))),
                // Not an address clients dial: WELCOME hands it out (`Server::shm`).
                Listener::Shm(..) => None,
            })
            .collect()
    }

    /// Accepts and serves connections until `shutdown` completes, then closes every
    /// connection (each flushes what it has queued) and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let live = Arc::new(AtomicUsize::new(0));
        let per_address = PerAddress::default();
        let rate = self.rate.clone();
        let limits = current(&self.limits);
        let mut accepts = JoinSet::new();
        let mut paths = Vec::new();
        let background = tokio::spawn(self.mqtt.clone().background(stop_rx.clone()));
        let retention = tokio::spawn(retention_loop(self.broker.clone(), stop_rx.clone()));
        let admin = self.admin.map(|l| {
            let state = crate::admin::AdminState {
                broker: self.broker.clone(),
                ops: self.ops.clone(),
                figures: figures::front_figures(&self.mqtt, self.shm.as_ref()),
                auth: self.auth.clone(),
                users: self.admin_users.clone(),
                log: self.log_control.clone(),
                reload: self.reload_control.clone(),
            };
            tokio::spawn(crate::admin::serve(l, state, stop_rx.clone()))
        });
        let spinner = self.busy.clone().map(|busy| {
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            if workers > 1 {
                tracing::warn!(
                    workers,
                    "busy-polling on a runtime with more than one worker: the polling task \
                     may not run on the thread that polls for I/O (the hayate binary uses one)"
                );
            }
            tokio::spawn(busy.spin(self.busy_poll))
        });
        for (l, stats) in self.listeners.into_iter().zip(self.ops.listeners.clone()) {
            let ctx = Ctx {
                listener: stats,
                conns: self.ops.conns.clone(),
                broker: self.broker.clone(),
                limits: limits.clone(),
                cell: self.limits.clone(),
                name: self.name.clone(),
                keepalive: self.keepalive,
                stop: stop_rx.clone(),
                busy: self.busy.clone(),
                live: live.clone(),
                mqtt: self.mqtt.clone(),
                stomp: self.stomp.clone(),
                amqp: self.amqp.clone(),
                auth: self.auth.clone(),
                tls: self.tls.clone(),
                shm: self.shm.clone(),
                per_address: per_address.clone(),
                rate: rate.clone(),
                budget: InputBudget {
                    memory: self.broker.config().memory.clone(),
                    wait: (limits.max_block_ms > 0)
                        .then(|| Duration::from_millis(limits.max_block_ms)),
                },
            };
            if let Listener::Unix(_, p) = &l {
                paths.push(p.clone());
            }
            accepts.spawn(accept_loop(l, ctx));
        }
        self.ops.set_ready();
        shutdown.await;
        let _ = stop_tx.send(true);
        accepts.shutdown().await;
        retention.abort();
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
        // Give connections a moment to flush and close.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while live.load(Ordering::Acquire) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), background).await;
        // Persistent MQTT sessions are parked by now: save them with the retained messages.
        let m = self.mqtt.clone();
        let _ = tokio::task::spawn_blocking(move || m.save_final()).await;
        if let Some(s) = spinner {
            s.abort();
        }
        if let Some(a) = admin {
            a.abort();
        }
    }
}

/// A listener's protocol name and address, as the admin API shows them.
fn listener_name(l: &Listener) -> (&'static str, String) {
    match l {
        Listener::Tcp(t, p) => (
            p.name(),
            t.local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|e| format!("? ({e})")),
        ),
        Listener::Unix(_, p) => ("native", format!("unix:{p}")),
        Listener::Shm(_) => ("native", "shm".to_string()),
    }
}

/// `[limits]` as it is now: reloads replace the inner `Arc`.
type LimitsCell = Arc<std::sync::RwLock<Arc<Limits>>>;

fn current(cell: &LimitsCell) -> Arc<Limits> {
    cell.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Applies a new configuration to a running server, for what can change safely: `[limits]`
/// (each new connection takes the new version; connections up keep theirs), the users,
/// tokens and permissions of `[auth]` (new logins; users logged in get the new permissions
/// at their next operation and route; removed users' connections are closed), and
/// `[admin] users`. Listeners, TLS
/// paths, the data directory, busy-polling, the I/O threads and the MQTT and STOMP sections
/// need a restart; the memory
/// budget and `max_block_ms` keep their start values.
#[derive(Clone)]
pub struct Reloader {
    limits: LimitsCell,
    rate: Arc<ConnRate>,
    auth: Arc<dyn Authenticator>,
    admin_users: Arc<std::sync::RwLock<Vec<String>>>,
    broker: Broker,
    ops: Arc<Ops>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

impl Reloader {
    /// Checks `config` and applies it; `Err` (and nothing changed) when it is not valid.
    pub fn reload(&self, config: &Config) -> Result<(), String> {
        config.validate().map_err(|e| e.to_string())?;
        let revoked = self.auth.reload(&config.auth)?;
        // Subscriptions' guards read the permissions as they are now: routes built before
        // the reload are dropped.
        self.broker.forget_routes();
        if revoked.all || !revoked.users.is_empty() {
            let mut closed = 0;
            for c in self.ops.conns.list() {
                let user = c.user();
                if revoked.all || user.as_ref().is_some_and(|u| revoked.users.contains(u)) {
                    c.close();
                    closed += 1;
                }
            }
            tracing::info!(
                users = ?revoked.users,
                anonymous = revoked.all,
                closed,
                "config reload revoked access: connections closed"
            );
        }
        *self
            .limits
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config.limits.clone());
        self.rate.per_sec.store(
            config.limits.max_connection_rate_per_address,
            Ordering::Relaxed,
        );
        *self
            .admin_users
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config.admin.users.clone();
        Ok(())
    }
}

/// Applies every stream's retention once a minute (and once at start).
async fn retention_loop(broker: Broker, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = every.tick() => {
                let b = broker.clone();
                // File removal is blocking I/O.
                let _ = tokio::task::spawn_blocking(move || b.apply_retention()).await;
            }
            _ = stop.changed() => return,
        }
    }
}
