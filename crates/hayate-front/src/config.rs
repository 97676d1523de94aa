//! Broker settings: plain serde structs with defaults. The `hayate` binary loads them from a
//! TOML file and applies command-line overrides; `hayate config default` prints them.

use serde::{Deserialize, Serialize};

/// The default native-protocol address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4700";
/// The largest MQTT packet size a broker can advertise: the protocol's largest remaining
/// length (clients such as paho refuse a Maximum Packet Size above it, although the whole
/// packet may be 5 bytes longer): `hayate_mqtt::MAX_VAR_INT`, written out so that this
/// layer depends on no protocol's codec (the MQTT front-end's tests check the two agree).
pub const MQTT_MAX_PACKET: u32 = 268_435_455;
/// The default MQTT address.
pub const DEFAULT_MQTT_LISTEN: &str = "127.0.0.1:1883";
/// The default STOMP address.
pub const DEFAULT_STOMP_LISTEN: &str = "127.0.0.1:61613";
/// The default AMQP 0-9-1 address.
pub const DEFAULT_AMQP_LISTEN: &str = "127.0.0.1:5672";
/// The default MQTT-over-WebSocket address.
pub const DEFAULT_MQTT_WS_LISTEN: &str = "127.0.0.1:8083";

/// All broker settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Server identity.
    pub server: ServerSection,
    /// Native protocol listeners.
    pub native: NativeSection,
    /// MQTT listeners and settings.
    pub mqtt: MqttSection,
    /// STOMP listeners and settings.
    pub stomp: StompSection,
    /// AMQP 0-9-1 listeners and settings.
    pub amqp: AmqpSection,
    /// Who may connect and what they may do (every protocol).
    pub auth: AuthSection,
    /// Certificates for the TLS listeners (`native.tls`, `mqtt.tls`, `mqtt.wss`,
    /// `stomp.tls`, `amqp.tls`).
    pub tls: TlsSection,
    /// Limits.
    pub limits: Limits,
    /// The admin HTTP listener: JSON API, Prometheus `/metrics`, health checks.
    pub admin: AdminSection,
    /// Streams to create at start (`[[stream]]`; kept in `server.data_dir`). A stream that
    /// exists with the same definition is opened as it is; one with another definition is an
    /// error. Streams created at run time (`hayate stream add`) need no entry here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stream: Vec<hayate_broker::StreamConfig>,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// Name reported to clients in WELCOME.
    pub name: String,
    /// Where state that survives a restart is kept (streams, MQTT persistent sessions and
    /// retained messages); created when first needed. Empty: nothing is kept, and streams
    /// cannot be created.
    pub data_dir: String,
    /// Busy-polling (a latency mode, off at 0): after input arrives, keep polling the sockets
    /// this many microseconds instead of sleeping in epoll. Costs up to one CPU while traffic
    /// flows; the `hayate broker` binary runs the broker on one I/O thread when it is on.
    pub busy_poll_us: u64,
    /// Threads that run the connections (the Tokio runtime's workers); 0: one per CPU core.
    /// Read by the `hayate broker` binary when it starts (busy-polling needs, and takes, 1).
    pub io_threads: usize,
    /// What is logged: a level (`error`, `warn`, `info`, `debug`, `trace`) and levels per
    /// module (`info,hayate_front_mqtt=debug`), as `RUST_LOG` takes them (`RUST_LOG`,
    /// when set, wins). Changed at run time by SIGHUP (read again from the file) or
    /// `PUT /api/log`.
    pub log: String,
    /// `text` (one line per event, the default) or `json` (one JSON object per line).
    pub log_format: String,
}

/// The most `[server] io_threads` may be.
pub const MAX_IO_THREADS: usize = 1024;

/// The broker's default log filter (also what the other commands log with).
pub const DEFAULT_LOG: &str =
    "info,async_nats=warn,zenoh=error,zeromq=warn,lapin=warn,rumqttc=warn,rdkafka=warn";

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            name: format!("hayate/{}", env!("CARGO_PKG_VERSION")),
            data_dir: "hayate-data".into(),
            busy_poll_us: 0,
            io_threads: 0,
            log: DEFAULT_LOG.into(),
            log_format: "text".into(),
        }
    }
}

/// `[mqtt]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttSection {
    /// TCP addresses for MQTT 3.1, 3.1.1 and 5.0 (empty: no MQTT listener).
    pub listen: Vec<String>,
    /// TCP addresses for MQTT over WebSocket (subprotocol `mqtt`, any path).
    pub ws: Vec<String>,
    /// TCP addresses for MQTT over TLS (usually port 8883; needs `[tls]`).
    pub tls: Vec<String>,
    /// TCP addresses for MQTT over WebSocket over TLS (`wss://`; needs `[tls]`).
    pub wss: Vec<String>,
    /// Largest MQTT packet accepted, in bytes (advertised to 5.0 clients); larger ones
    /// close the connection (5.0: DISCONNECT 0x95).
    pub max_packet_size: u32,
    /// Most QoS 2 PUBLISHes a client may have unreleased at once (the server's Receive
    /// Maximum).
    pub receive_maximum: u16,
    /// Most QoS 1 and 2 deliveries unacknowledged by a client at once (lowered further by
    /// the client's Receive Maximum).
    pub max_inflight: u16,
    /// Most QoS 1 and 2 messages waiting for a session beyond its in-flight window
    /// (online or offline); further ones are dropped and counted.
    pub max_queued_messages: usize,
    /// Most bytes (payloads and keys) of QoS 1 and 2 messages held for a session, in flight
    /// and waiting (online or offline); further ones are dropped and counted. While the
    /// client is connected they also count against its outbox budget (`limits.outbox_bytes`),
    /// so a client that does not acknowledge slows its publishers. 0: no limit.
    pub max_queued_bytes: u64,
    /// Bytes of retained messages (keys and payloads) the broker keeps (0: no limit); past
    /// it a new retained message is routed but not kept (counted).
    pub max_retained_bytes: u64,
    /// Highest topic alias a client may use (0: none).
    pub topic_alias_maximum: u16,
    /// Longest keep alive, in seconds, a client may ask for; a 5.0 client asking more (or
    /// 0) is told this one (Server Keep Alive). 0: no limit.
    pub max_keep_alive: u16,
    /// Longest session expiry interval, in seconds, a session may ask for.
    pub max_session_expiry: u32,
    /// Period of the `$SYS/broker/...` statistics, in seconds (0: off).
    pub sys_interval_secs: u64,
    /// Period of checkpoints of persistent sessions and retained messages in
    /// `server.data_dir`, in seconds (0: only at start, shutdown and when the journal has
    /// grown by 64 MiB). With the journal on, a checkpoint only bounds the journal's size and
    /// the replay at start; without it, it is all that is saved.
    pub autosave_secs: u64,
    /// Journal every change to persistent sessions and retained messages before it is
    /// acknowledged (PUBACK/PUBREC/SUBACK), so that it survives `kill -9`. Off: saved only by
    /// checkpoints (a crash loses what changed since the last one).
    pub journal: bool,
    /// When the journal is synced to disk: `always` (an acknowledgement waits for the group
    /// commit: survives power loss), `interval=<ms>` or `never` (acknowledged once written:
    /// survives a process kill; a power loss may lose the last interval).
    pub journal_fsync: String,
}

impl Default for MqttSection {
    fn default() -> Self {
        MqttSection {
            listen: vec![DEFAULT_MQTT_LISTEN.to_string()],
            ws: vec![DEFAULT_MQTT_WS_LISTEN.to_string()],
            tls: Vec::new(),
            wss: Vec::new(),
            max_packet_size: MQTT_MAX_PACKET,
            receive_maximum: 1024,
            max_inflight: 1024,
            max_queued_messages: 100_000,
            max_queued_bytes: 64 * 1024 * 1024,
            max_retained_bytes: 256 * 1024 * 1024,
            topic_alias_maximum: 1024,
            max_keep_alive: 0,
            max_session_expiry: u32::MAX,
            sys_interval_secs: 10,
            autosave_secs: 60,
            journal: true,
            journal_fsync: "interval=100".into(),
        }
    }
}

/// Whether `addr` (`HOST:PORT`) names a loopback address (`localhost` counts).
fn is_loopback(addr: &str) -> bool {
    if let Ok(a) = addr.parse::<std::net::SocketAddr>() {
        return a.ip().is_loopback();
    }
    addr.rsplit_once(':')
        .is_some_and(|(h, _)| h.eq_ignore_ascii_case("localhost"))
}

/// The admin listener's default address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:4780";

/// `[admin]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    /// The HTTP address of the admin API, `/metrics`, `/healthz` and `/readyz` (at most one;
    /// empty: no admin listener).
    pub listen: Vec<String>,
    /// Users who may use the admin API and `/metrics` when the broker has users
    /// (`auth.required`): HTTP Basic with their broker password, or a bearer token. Without
    /// users configured, anyone who reaches the listener may (keep it on 127.0.0.1).
    /// `/healthz` and `/readyz` are open to all.
    pub users: Vec<String>,
}

impl Default for AdminSection {
    fn default() -> Self {
        AdminSection {
            listen: vec![DEFAULT_ADMIN_LISTEN.to_string()],
            users: Vec::new(),
        }
    }
}

/// `[stomp]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StompSection {
    /// TCP addresses for STOMP 1.0, 1.1 and 1.2 (empty: no STOMP listener).
    pub listen: Vec<String>,
    /// TCP addresses for STOMP over TLS (needs `[tls]`).
    pub tls: Vec<String>,
    /// Heart-beat interval in milliseconds the server offers to send and wants to receive
    /// (negotiated with the client's `heart-beat` header; 0: none). A client silent for
    /// twice its negotiated interval is disconnected.
    pub heart_beat_ms: u32,
    /// Messages a `/queue/` keeps while it has no consumer; further ones are dropped.
    pub queue_max_backlog: usize,
    /// Payload bytes a `/queue/` keeps while it has no consumer (0: no limit); further
    /// messages are dropped.
    pub queue_max_bytes: u64,
    /// Largest frame body accepted, in bytes; larger frames get an ERROR and a close.
    pub max_frame_size: usize,
    /// Most headers in one frame.
    pub max_headers: usize,
}

impl Default for StompSection {
    fn default() -> Self {
        StompSection {
            listen: vec![DEFAULT_STOMP_LISTEN.to_string()],
            tls: Vec::new(),
            heart_beat_ms: 10_000,
            queue_max_backlog: 10_000,
            queue_max_bytes: 64 * 1024 * 1024,
            max_frame_size: 64 * 1024 * 1024,
            max_headers: 128,
        }
    }
}

/// `[amqp]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSection {
    /// TCP addresses for AMQP 0-9-1 (default `127.0.0.1:5672`).
    pub listen: Vec<String>,
    /// TCP addresses for AMQP 0-9-1 over TLS (`amqps`, RabbitMQ's port 5671; none by
    /// default), with the `[tls]` certificate.
    pub tls: Vec<String>,
    /// Channels per connection at most (connection.tune's channel-max).
    pub channel_max: u16,
    /// Largest frame, in bytes (connection.tune's frame-max; at least 4096).
    pub frame_max: u32,
    /// Heartbeat interval offered, in seconds (0: none).
    pub heartbeat_secs: u16,
    /// Largest message body accepted, in bytes (larger: the channel is closed with
    /// PRECONDITION_FAILED, as RabbitMQ does).
    pub max_message_size: u64,
    /// Bytes a queue holds at most (its `x-max-length-bytes` may lower it); past it the
    /// oldest messages are dropped (or new ones refused with `x-overflow`).
    pub queue_max_bytes: u64,
    /// Queues at most.
    pub max_queues: usize,
    /// The virtual hosts that exist (connection.open names one): each has exchanges and
    /// queues of its own, and every vhost but `/` publishes under the keys
    /// `amqp-vhost/<name>/...` (docs/amqp.md, "Virtual hosts").
    pub vhosts: Vec<String>,
    /// When persistent messages in durable queues are synced to disk before their
    /// publisher's confirm: `always` (default, as RabbitMQ: one fsync shared by concurrent
    /// publishers), `interval=<ms>` or `never` (written, so they survive the broker being
    /// killed, not a power loss). Durable queues are kept in `<data>/amqp/`.
    pub fsync: String,
}

impl Default for AmqpSection {
    fn default() -> Self {
        AmqpSection {
            listen: vec![DEFAULT_AMQP_LISTEN.to_string()],
            tls: Vec::new(),
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat_secs: 60,
            max_message_size: 128 * 1024 * 1024,
            queue_max_bytes: 64 * 1024 * 1024,
            max_queues: 10_000,
            vhosts: vec!["/".to_string()],
            fsync: "always".to_string(),
        }
    }
}

/// `[tls]`: the server's certificate for every TLS listener, and client certificates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSection {
    /// PEM file with the server's certificate chain (leaf first).
    pub cert: String,
    /// PEM file with the server's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// PEM file with the CA certificates that client certificates must chain to. Empty:
    /// client certificates are not asked for.
    pub client_ca: String,
    /// With `client_ca`: refuse clients without a valid certificate (else a certificate is
    /// optional, and checked when given).
    pub require_client_cert: bool,
    /// A client whose verified certificate's subject common name (CN) is a configured user
    /// is logged in as that user without a password.
    pub cert_user: bool,
}

/// `[auth]`: who may connect and what they may do (docs/security.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSection {
    /// Whether clients without credentials may connect. Unset: yes when no user is
    /// configured, no otherwise; `true` with users configured is an error (anonymous access
    /// is off whenever users exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_anonymous: Option<bool>,
    /// Users by name (`[auth.users.NAME]`).
    pub users: std::collections::BTreeMap<String, UserConfig>,
    /// Groups' permissions by name (`[auth.groups.NAME]`), joined to their members'.
    pub groups: std::collections::BTreeMap<String, Permissions>,
    /// Failed password logins of one user name from one address within a minute before that
    /// pair is locked out (0: never).
    pub max_failures: u32,
    /// Seconds an (address, user name) pair stays locked out (its logins refused without
    /// being checked).
    pub lockout_secs: u64,
    /// Failed password logins within a minute across all addresses past which a pair that
    /// has failed within the minute is refused without being checked (0: no such limit).
    pub global_max_failures: u32,
    /// Connections one configured user may have open at once (0: no limit).
    pub max_connections_per_user: usize,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            allow_anonymous: None,
            users: Default::default(),
            groups: Default::default(),
            max_failures: 10,
            lockout_secs: 60,
            global_max_failures: 100,
            max_connections_per_user: 1024,
        }
    }
}

/// `[auth.users.NAME]`. A plain string (`alice = "secret"`, a plaintext password) is refused
/// with a pointer to `hayate user add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct UserConfig {
    /// argon2 hash of the password, as a PHC string (`hayate user add NAME` makes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    /// Digests of the user's bearer tokens, `sha256:<hex>` (`hayate user token NAME`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    /// Groups whose permissions the user also has.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// The user's own permissions.
    #[serde(skip_serializing_if = "Permissions::is_empty")]
    pub permissions: Permissions,
}

impl UserConfig {
    /// A user logging in with `password` (hashed here with argon2; tests and tools).
    pub fn with_password(password: &str) -> Result<UserConfig, String> {
        Ok(UserConfig {
            password_hash: Some(crate::auth::hash_password(password)?),
            ..UserConfig::default()
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserTable {
    #[serde(default)]
    password_hash: Option<String>,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    permissions: Permissions,
}

impl<'de> Deserialize<'de> for UserConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = UserConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a user table (password_hash, tokens, groups, permissions)")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<UserConfig, E> {
                Err(E::custom(
                    "plaintext passwords are refused: store an argon2 hash instead \
                     (`hayate user add NAME` prints the [auth.users.NAME] table)",
                ))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<UserConfig, A::Error> {
                let t = UserTable::deserialize(serde::de::value::MapAccessDeserializer::new(m))?;
                Ok(UserConfig {
                    password_hash: t.password_hash,
                    tokens: t.tokens,
                    groups: t.groups,
                    permissions: t.permissions,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// Allow and deny rules on key expressions (MQTT topics and STOMP destinations are checked
/// as the keys they map to). An allow list that is absent allows every key; deny wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Permissions {
    /// Keys the user may publish on (without a reply-to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<Vec<String>>,
    /// Expressions the user may subscribe to (without a queue group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<Vec<String>>,
    /// Expressions the user may serve: subscribe to in a queue group (unset: as `subscribe`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serve: Option<Vec<String>>,
    /// Keys the user may call: publish on with a reply-to (unset: as `publish`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<Vec<String>>,
    /// Keys the user may not publish or call on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_publish: Vec<String>,
    /// Keys the user may not receive, through any subscription or queue group.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub deny_subscribe: Vec<String>,
}

impl Permissions {
    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        *self == Permissions::default()
    }
}

/// `[native]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NativeSection {
    /// TCP addresses to listen on (`HOST:PORT`; port 0 picks a free port).
    pub listen: Vec<String>,
    /// TCP addresses for the native protocol over TLS (needs `[tls]`).
    pub tls: Vec<String>,
    /// Unix socket paths to listen on.
    pub unix: Vec<String>,
    /// Milliseconds of silence from a client after which the server sends it a PING
    /// (0: never). A client that leaves `max_pings_out` PINGs in a row unanswered (no input
    /// at all meanwhile) is disconnected: a dead peer's half-open connection is noticed.
    pub ping_interval_ms: u64,
    /// PINGs without any input in between before the connection is closed.
    pub max_pings_out: u32,
    /// Offer shared memory to native clients on this host that ask for it (HELLO flag
    /// `SHM`, docs/protocol.md *Shared memory with the broker*): after WELCOME they move to
    /// two rings in memfd segments (2 MiB each way), found through an abstract Unix socket
    /// that lives as long as the broker.
    pub shm: bool,
    /// Shared-memory connections at once (each holds a 2 MiB ring of the broker's); past it,
    /// clients stay on the transport they came in on.
    pub shm_max_connections: usize,
    /// Bytes of each fan-out arena (0: none). Each user with shared-memory clients has one
    /// (made with its first such client, freed with its last): a message of at least 512
    /// bytes for that user's shared-memory clients is written there once, whatever the
    /// number of subscribers, and each is sent a reference to it (docs/shm.md, *Fan-out to
    /// the broker's local clients*). Charged to `limits.memory_budget` while it lives; a
    /// client holds at most a quarter of it.
    pub shm_fanout_bytes: u64,
}

/// The smallest fan-out arena accepted (`native.shm_fanout_bytes`): a client's quota, a
/// quarter, then holds a 64 KiB message.
pub const MIN_FANOUT_BYTES: u64 = 256 << 10;
/// The largest (a memfd segment's limit, `hayate_shm::segment::MAX_SEGMENT_BYTES`).
pub const MAX_FANOUT_BYTES: u64 = 1 << 34;

impl Default for NativeSection {
    fn default() -> Self {
        NativeSection {
            listen: vec![DEFAULT_LISTEN.to_string()],
            tls: Vec::new(),
            unix: Vec::new(),
            ping_interval_ms: 30_000,
            max_pings_out: 2,
            shm: true,
            shm_max_connections: 256,
            shm_fanout_bytes: 16 << 20,
        }
    }
}

/// `[limits]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest payload accepted, in bytes. Frames above this (plus 64 KiB for the key and
    /// options) are refused with ERR 3 and the connection is closed.
    pub max_payload: u64,
    /// Byte budget of each session's outbox; past it, `drop` subscriptions lose messages and
    /// `block` subscriptions hold back their publishers.
    pub outbox_bytes: u64,
    /// Most simultaneous connections; further ones are accepted and closed at once.
    pub max_connections: usize,
    /// Connections open at once from one source address (0: no limit); further ones are
    /// closed at accept.
    pub max_connections_per_address: usize,
    /// Subscriptions one connection (session) may hold (0: no limit): native ERR 5, MQTT
    /// SUBACK 0x97 Quota exceeded (3.1.1: 0x80), STOMP ERROR past it.
    pub max_subscriptions: usize,
    /// Largest frame or packet accepted before the client has logged in (native HELLO, MQTT
    /// CONNECT with its will, STOMP CONNECT), in bytes: an unauthenticated client cannot
    /// make the broker buffer more (a larger one gets the protocol's error and a close).
    pub max_preauth_bytes: u32,
    /// Milliseconds a new connection has to send HELLO.
    pub handshake_timeout_ms: u64,
    /// Longest a publisher waits for room in one `block` subscriber's outbox (ms); past it
    /// the subscriber is disconnected as a slow consumer (or, for a subscription that asked
    /// for it, its messages are dropped and counted). 0 waits forever.
    pub max_block_ms: u64,
    /// Most deliveries of one session's acknowledged subscriptions in flight at once.
    pub max_unacked: u32,
    /// Most streams (each has files and, unless its fsync is `never`, a sync thread).
    pub max_streams: u32,
    /// Most durable consumers per stream.
    pub max_consumers: u32,
    /// Most streams one user may own (create through the stream API while logged in).
    pub max_streams_per_user: u32,
    /// Most durable consumers one user may create through the stream API (or by a STOMP
    /// SUBSCRIBE to a durable queue), over every stream.
    pub max_consumers_per_user: u32,
    /// The broker-wide memory budget in bytes (0: half the machine's memory, or of the
    /// container's limit). Outboxes past their first 256 KiB, unhandled input past a
    /// connection's first 256 KiB, offline MQTT sessions, queues without consumers and
    /// retained messages all draw on it; when it is spent, publishers are slowed (their
    /// input is not read) or their messages refused (dropped and counted), never an
    /// out-of-memory kill.
    pub memory_budget: u64,
    /// New connections accepted per second from one source address (a burst of as many is
    /// allowed; 0: no limit); further ones are closed at accept.
    pub max_connection_rate_per_address: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload: 64 * 1024 * 1024,
            outbox_bytes: 8 * 1024 * 1024,
            max_connections: 100_000,
            max_connections_per_address: 4096,
            max_subscriptions: 10_000,
            max_preauth_bytes: 64 * 1024,
            handshake_timeout_ms: 10_000,
            max_block_ms: 2_000,
            max_unacked: 1024,
            max_streams: 256,
            max_consumers: 1024,
            max_streams_per_user: 32,
            max_consumers_per_user: 256,
            memory_budget: 0,
            max_connection_rate_per_address: 1000,
        }
    }
}

impl Limits {
    /// The memory budget in bytes: `memory_budget`, or half of what the machine (or the
    /// cgroup the broker runs in, when it is smaller) has.
    pub fn memory_budget_bytes(&self) -> usize {
        if self.memory_budget > 0 {
            return usize::try_from(self.memory_budget).unwrap_or(usize::MAX);
        }
        let total = physical_memory().unwrap_or(2 * 1024 * 1024 * 1024);
        let total = match cgroup_memory_limit() {
            Some(c) if c < total => c,
            _ => total,
        };
        usize::try_from(total / 2).unwrap_or(usize::MAX)
    }

    /// The largest frame (type byte + body) a connection accepts.
    pub fn max_frame(&self) -> usize {
        usize::try_from(self.max_payload)
            .unwrap_or(usize::MAX)
            .saturating_add(64 * 1024)
            .min(u32::MAX as usize)
    }
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// TOML syntax or an unknown/mistyped setting.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// A value out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

impl Config {
    /// Parses TOML text (missing settings take their defaults) and validates it.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// The configuration as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks values are in range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::auth::ConfigAuth::from_section(&self.auth).map_err(ConfigError::Invalid)?;
        let tls_listeners = !(self.native.tls.is_empty()
            && self.mqtt.tls.is_empty()
            && self.mqtt.wss.is_empty()
            && self.stomp.tls.is_empty()
            && self.amqp.tls.is_empty());
        if tls_listeners || !self.tls.cert.is_empty() || !self.tls.key.is_empty() {
            crate::tls::ServerTls::load(&self.tls).map_err(ConfigError::Invalid)?;
        }
        if self.amqp.frame_max < 4096 {
            return Err(ConfigError::Invalid(
                "amqp.frame_max must be at least 4096 (AMQP's frame-min-size)".into(),
            ));
        }
        if self.amqp.channel_max == 0 {
            return Err(ConfigError::Invalid(
                "amqp.channel_max must be at least 1".into(),
            ));
        }
        if let Err(e) = self.amqp.fsync.parse::<hayate_log::FsyncPolicy>() {
            return Err(ConfigError::Invalid(format!("amqp.fsync: {e}")));
        }
        if self.amqp.vhosts.is_empty() {
            return Err(ConfigError::Invalid(
                "amqp.vhosts must name at least one virtual host".into(),
            ));
        }
        for (i, v) in self.amqp.vhosts.iter().enumerate() {
            if v.is_empty() || v.len() > 255 || v.chars().any(char::is_control) {
                return Err(ConfigError::Invalid(format!(
                    "amqp.vhosts: {v:?} is not a virtual host name (1 to 255 bytes, no control characters)"
                )));
            }
            if self.amqp.vhosts[..i].contains(v) {
                return Err(ConfigError::Invalid(format!(
                    "amqp.vhosts: {v:?} is listed twice"
                )));
            }
        }
        for s in &self.stream {
            hayate_broker::stream::check(s)
                .map_err(|e| ConfigError::Invalid(format!("[[stream]] {e}")))?;
        }
        if !self.stream.is_empty() && self.server.data_dir.is_empty() {
            return Err(ConfigError::Invalid(
                "[[stream]] needs server.data_dir".into(),
            ));
        }
        if !matches!(self.server.log_format.as_str(), "text" | "json") {
            return Err(ConfigError::Invalid(format!(
                "server.log_format is {:?}: text or json",
                self.server.log_format
            )));
        }
        if self.admin.listen.len() > 1 {
            return Err(ConfigError::Invalid(
                "admin.listen takes at most one address".into(),
            ));
        }
        if let Some(a) = self.admin.listen.first()
            && !is_loopback(a)
            && self.auth.users.is_empty()
        {
            return Err(ConfigError::Invalid(format!(
                "admin.listen = {a:?} is not a loopback address, and without [auth] users \
                 anyone who reaches it could close connections and delete streams: add \
                 users (and list the admins in admin.users), or listen on 127.0.0.1"
            )));
        }
        let l = &self.limits;
        if l.max_payload == 0 || l.max_payload > (u32::MAX as u64 - 64 * 1024) {
            return Err(ConfigError::Invalid(format!(
                "limits.max_payload must be between 1 and {} bytes",
                u32::MAX as u64 - 64 * 1024
            )));
        }
        if l.outbox_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "limits.outbox_bytes must be at least 1024".into(),
            ));
        }
        if self.server.busy_poll_us > 1_000_000 {
            return Err(ConfigError::Invalid(
                "server.busy_poll_us must be at most 1000000 (1 s)".into(),
            ));
        }
        if self.server.io_threads > MAX_IO_THREADS {
            return Err(ConfigError::Invalid(format!(
                "server.io_threads must be at most {MAX_IO_THREADS} (0: one per CPU core)"
            )));
        }
        if self.server.busy_poll_us > 0 && self.server.io_threads > 1 {
            return Err(ConfigError::Invalid(
                "server.io_threads must be 0 or 1 with server.busy_poll_us (busy-polling runs \
                 the broker on one I/O thread)"
                    .into(),
            ));
        }
        if l.max_unacked == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_unacked must be at least 1".into(),
            ));
        }
        if l.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_connections must be at least 1".into(),
            ));
        }
        let fanout = self.native.shm_fanout_bytes;
        if fanout != 0 && !(MIN_FANOUT_BYTES..=MAX_FANOUT_BYTES).contains(&fanout) {
            return Err(ConfigError::Invalid(format!(
                "native.shm_fanout_bytes must be 0 (no fan-out arena) or from {MIN_FANOUT_BYTES} \
                 to {MAX_FANOUT_BYTES}, not {fanout}"
            )));
        }
        if self.native.listen.is_empty()
            && self.native.unix.is_empty()
            && self.mqtt.listen.is_empty()
            && self.mqtt.ws.is_empty()
            && self.stomp.listen.is_empty()
            && self.amqp.listen.is_empty()
            && !tls_listeners
        {
            return Err(ConfigError::Invalid(
                "no listener: set native.listen, native.unix, mqtt.listen, mqtt.ws, \
                 stomp.listen, amqp.listen or a TLS listener"
                    .into(),
            ));
        }
        let m = &self.mqtt;
        if let Err(e) = m.journal_fsync.parse::<hayate_log::FsyncPolicy>() {
            return Err(ConfigError::Invalid(format!("mqtt.journal_fsync: {e}")));
        }
        if m.max_packet_size < 128 || m.max_packet_size > MQTT_MAX_PACKET {
            return Err(ConfigError::Invalid(format!(
                "mqtt.max_packet_size must be between 128 and {MQTT_MAX_PACKET} bytes"
            )));
        }
        if m.receive_maximum == 0 || m.max_inflight == 0 {
            return Err(ConfigError::Invalid(
                "mqtt.receive_maximum and mqtt.max_inflight must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// `MemTotal` of /proc/meminfo, in bytes.
fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory limit of the cgroup (v2, then v1) the process runs in, if it has one.
fn cgroup_memory_limit() -> Option<u64> {
    for path in [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ] {
        if let Ok(s) = std::fs::read_to_string(path)
            && let Ok(v) = s.trim().parse::<u64>()
        {
            return Some(v);
        }
    }
    None
}
