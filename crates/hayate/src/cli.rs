//! Command-line definitions (see DESIGN.md "Command line": keep them stable).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Default server address for the client commands.
pub(crate) const DEFAULT_SERVER: &str = "127.0.0.1:4700";

/// Hayate: a fast message broker, its clients and its benchmark tool.
#[derive(Debug, Parser)]
#[command(name = "hayate", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the broker (native protocol on 127.0.0.1:4700 by default).
    Broker(BrokerArgs),
    /// Publish a message (PAYLOAD, or standard input if omitted).
    Pub(PubArgs),
    /// Subscribe to a key expression and print what arrives.
    Sub(SubArgs),
    /// Send a request and print the reply.
    Request(RequestArgs),
    /// Run an echo service: answer every request with its own payload.
    Reply(ReplyArgs),
    /// Measure throughput, latency and RPC (of Hayate or a peer such as NATS).
    Bench(Box<crate::bench::BenchArgs>),
    /// Print the default or the effective configuration.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Manage streams (durable logs of captured keys) on a running broker.
    Stream(crate::stream::StreamArgs),
    /// Users of the `[auth]` section: hash a password, make a token.
    User(crate::user::UserArgs),
    /// The broker's live view in the terminal, from its admin listener (q quits).
    Top(crate::top::TopArgs),
}

#[derive(Debug, Args, Default, Clone)]
pub(crate) struct BrokerArgs {
    /// Configuration file (TOML); see `hayate config default`.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Native protocol TCP address (repeatable; replaces the configured list).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) listen: Vec<String>,
    /// Native protocol Unix socket path (repeatable).
    #[arg(long, value_name = "PATH")]
    pub(crate) unix: Vec<String>,
    /// MQTT TCP address (repeatable; replaces the configured list; `off` for none).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) mqtt: Vec<String>,
    /// MQTT-over-WebSocket TCP address (repeatable; replaces the configured list; `off`
    /// for none).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) ws: Vec<String>,
    /// STOMP TCP address (repeatable; replaces the configured list; `off` for none).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) stomp: Vec<String>,
    /// AMQP 0-9-1 TCP address (repeatable; replaces the configured list; `off` for none;
    /// default 127.0.0.1:5672).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) amqp: Vec<String>,
    /// Native protocol over TLS: TCP address (repeatable; needs --tls-cert and --tls-key).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) native_tls: Vec<String>,
    /// MQTT over TLS: TCP address (repeatable; usually port 8883).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) mqtt_tls: Vec<String>,
    /// MQTT over WebSocket over TLS (`wss://`): TCP address (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) wss: Vec<String>,
    /// STOMP over TLS: TCP address (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) stomp_tls: Vec<String>,
    /// AMQP 0-9-1 over TLS (amqps): TCP address (repeatable).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) amqp_tls: Vec<String>,
    /// PEM file with the server's certificate chain (`[tls] cert`).
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_cert: Option<String>,
    /// PEM file with the server's private key (`[tls] key`).
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_key: Option<String>,
    /// What is logged (`[server] log`): a level and levels per module, as RUST_LOG.
    #[arg(long, value_name = "FILTER")]
    pub(crate) log: Option<String>,
    /// Log format (`[server] log_format`): text or json.
    #[arg(long, value_name = "FORMAT")]
    pub(crate) log_format: Option<String>,
    /// Admin HTTP address: JSON API, Prometheus /metrics, /healthz, /readyz (`off` for
    /// none; default 127.0.0.1:4780).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) admin: Option<String>,
    /// Data directory (streams, persistent MQTT sessions, retained messages, AMQP durable
    /// queues).
    #[arg(long, value_name = "DIR")]
    pub(crate) data: Option<String>,
    /// Largest payload accepted, in bytes.
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_payload: Option<u64>,
    /// Byte budget of each session's outbox.
    #[arg(long, value_name = "BYTES")]
    pub(crate) outbox_bytes: Option<u64>,
    /// Busy-polling, a latency mode: after input, keep polling this many microseconds
    /// instead of sleeping (0: off, the default). Runs the broker on one I/O thread and
    /// burns up to one CPU while traffic flows.
    #[arg(long, value_name = "MICROSECONDS")]
    pub(crate) busy_poll_us: Option<u64>,
    /// Threads that run the connections (0: one per CPU core, the default).
    #[arg(long, value_name = "N")]
    pub(crate) io_threads: Option<usize>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCmd {
    /// Print the complete, commented default configuration file.
    Default,
    /// Print the effective configuration (file and flags merged).
    Show(Box<BrokerArgs>),
}

/// Credentials of the client commands (also `hayate://user:password@host:port`).
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct ClientAuth {
    /// User name to log in as (with --password).
    #[arg(long, global = true, env = "HAYATE_USER")]
    pub(crate) user: Option<String>,
    /// Password of --user (prefer the environment variable: a flag shows in `ps`).
    #[arg(long, global = true, env = "HAYATE_PASSWORD", hide_env_values = true)]
    pub(crate) password: Option<String>,
    /// Bearer token (`hyt_...`, from `hayate user token`).
    #[arg(
        long,
        global = true,
        env = "HAYATE_TOKEN",
        hide_env_values = true,
        conflicts_with = "user"
    )]
    pub(crate) token: Option<String>,
    /// PEM file with the CA of a `tls://HOST:PORT` server.
    #[arg(long, global = true, env = "HAYATE_TLS_CA", value_name = "FILE")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for servers that ask for one (with --tls-client-key).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_client_key")]
    pub(crate) tls_client_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-client-cert.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_client_cert")]
    pub(crate) tls_client_key: Option<PathBuf>,
    /// Shared memory with a broker (or, with --peer, other nodes) on this host: `auto` (use
    /// it when offered), `off`, or `require` (fail without it).
    #[arg(
        long,
        global = true,
        value_name = "off|auto|require",
        default_value = "auto"
    )]
    pub(crate) shm: hayate_client::peer::ShmMode,
}

impl ClientAuth {
    /// Connection options with these credentials.
    pub(crate) fn options(&self, name: &str) -> hayate_client::ConnectOptions {
        let mut o = hayate_client::ConnectOptions::default().name(name);
        o.shm = self.shm;
        if let Some(ca) = &self.tls_ca {
            o = o.tls_ca(ca);
        }
        if let (Some(c), Some(k)) = (&self.tls_client_cert, &self.tls_client_key) {
            o = o.tls_client_cert(c, k);
        }
        match (&self.token, &self.user) {
            (Some(t), _) => o.token(t),
            (None, Some(u)) => o.password(u, self.password.as_deref().unwrap_or("")),
            (None, None) => o,
        }
    }
}

/// Peer mode of `pub` and `sub` (docs/peer.md): no broker, the command is a peer node.
#[derive(Debug, Args, Default, Clone)]
pub(crate) struct PeerArgs {
    /// Peer mode: no broker; this command is a peer node linked to the others directly.
    #[arg(long)]
    pub(crate) peer: bool,
    /// Where the node listens for other nodes (peer mode; `0.0.0.0:0` to be reachable from
    /// other hosts or namespaces).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:0")]
    pub(crate) peer_listen: String,
    /// A node to link to (peer mode; repeatable): the static list.
    #[arg(long = "peer-connect", value_name = "HOST:PORT")]
    pub(crate) peer_connect: Vec<String>,
    /// Find other nodes by UDP multicast scouting (peer mode).
    #[arg(long)]
    pub(crate) scout: bool,
    /// The interface address scouting sends and listens on.
    #[arg(long, value_name = "IPV4")]
    pub(crate) scout_interface: Option<std::net::Ipv4Addr>,
    /// The scouting group and port (default 239.255.47.1:4701).
    #[arg(long, value_name = "GROUP:PORT")]
    pub(crate) scout_group: Option<std::net::SocketAddrV4>,
    /// Meet other nodes at this broker (peer mode).
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) rendezvous: Option<String>,
    /// `pub` in peer mode: linked nodes to wait for before publishing.
    #[arg(long, default_value_t = 1)]
    pub(crate) wait_peers: usize,
}

impl PeerArgs {
    /// The node's options (`shm`: the global `--shm`).
    pub(crate) fn options(
        &self,
        shm: hayate_client::peer::ShmMode,
    ) -> hayate_client::peer::NodeOptions {
        let scout = self.scout.then(|| {
            let mut s = hayate_client::peer::ScoutOptions {
                interface: self.scout_interface,
                ..Default::default()
            };
            if let Some(g) = self.scout_group {
                s.group = *g.ip();
                s.port = g.port();
            }
            s
        });
        hayate_client::peer::NodeOptions {
            listen: self.peer_listen.clone(),
            peers: self.peer_connect.clone(),
            scout,
            rendezvous: self.rendezvous.clone(),
            shm: hayate_client::peer::ShmOptions {
                mode: shm,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct PubArgs {
    /// Key to publish on, e.g. `demo/x`.
    pub(crate) key: String,
    /// Payload (UTF-8 text); read from standard input when omitted.
    pub(crate) payload: Option<String>,
    /// How many times to publish it.
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u64,
    /// Wait for each message's confirm (stored durably by the streams capturing the key)
    /// and print it.
    #[arg(long)]
    pub(crate) confirm: bool,
    /// Broker address (`HOST:PORT`, `tls://HOST:PORT` with --tls-ca,
    /// `user:password@HOST:PORT` or `unix:PATH`).
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    #[command(flatten)]
    pub(crate) auth: ClientAuth,
    #[command(flatten)]
    pub(crate) peer: PeerArgs,
}

#[derive(Debug, Args)]
pub(crate) struct SubArgs {
    /// Key expression: `*` is one segment, `**` any number.
    #[arg(required_unless_present = "queue")]
    pub(crate) expr: Option<String>,
    /// Join this queue group (each message goes to one member).
    #[arg(long, conflicts_with = "queue")]
    pub(crate) group: Option<String>,
    /// Consume the broker's queue NAME instead (AMQP vhost `/`'s queue NAME, STOMP's
    /// `/queue/NAME`; made in memory if there is none): each line printed is
    /// `DELIVERY<TAB>new|redelivered<TAB>PAYLOAD`.
    #[arg(long, value_name = "NAME", conflicts_with = "peer")]
    pub(crate) queue: Option<String>,
    /// With --queue: `auto` acknowledges each message once printed; `stdin` reads lines
    /// `ack N`, `nack N` (put back in its place, for any consumer) and `ackall N`
    /// (every delivery up to N) from standard input.
    #[arg(long, default_value = "auto", value_parser = ["auto", "stdin"], requires = "queue")]
    pub(crate) ack: String,
    /// With --queue: most messages unacknowledged at once (0: the broker's
    /// limits.max_unacked).
    #[arg(long, default_value_t = 0, requires = "queue")]
    pub(crate) prefetch: u32,
    /// Exit after this many messages (0 = never).
    #[arg(long, default_value_t = 0)]
    pub(crate) count: u64,
    /// Broker address (`HOST:PORT`, `tls://HOST:PORT` with --tls-ca,
    /// `user:password@HOST:PORT` or `unix:PATH`).
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    #[command(flatten)]
    pub(crate) auth: ClientAuth,
    #[command(flatten)]
    pub(crate) peer: PeerArgs,
}

#[derive(Debug, Args)]
pub(crate) struct RequestArgs {
    /// Key of the service.
    pub(crate) key: String,
    /// Request payload.
    pub(crate) payload: String,
    /// How long to wait for the reply (e.g. `500ms`, `2s`).
    #[arg(long, default_value = "5s")]
    pub(crate) timeout: String,
    /// Broker address (`HOST:PORT`, `tls://HOST:PORT` with --tls-ca,
    /// `user:password@HOST:PORT` or `unix:PATH`).
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    #[command(flatten)]
    pub(crate) auth: ClientAuth,
}

#[derive(Debug, Args)]
pub(crate) struct ReplyArgs {
    /// Key expression to serve.
    pub(crate) expr: String,
    /// Serve as a member of this queue group (several replicas share the load).
    #[arg(long)]
    pub(crate) group: Option<String>,
    /// Exit after this many replies (0 = never).
    #[arg(long, default_value_t = 0)]
    pub(crate) count: u64,
    /// Broker address (`HOST:PORT`, `tls://HOST:PORT` with --tls-ca,
    /// `user:password@HOST:PORT` or `unix:PATH`).
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    #[command(flatten)]
    pub(crate) auth: ClientAuth,
    /// Serve peer to peer instead of through a broker: listen on this address (`HOST:PORT`,
    /// port 0 for a free one) for clients that connect directly (`hayate request --server`
    /// with the address printed at start).
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "group")]
    pub(crate) direct: Option<String>,
}

/// Parses `250ms`, `2s`, `1.5s`, `1m` or a bare number of seconds.
pub(crate) fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "us" => v / 1e6,
        _ => anyhow::bail!("invalid duration unit in {s:?} (use us, ms, s or m)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        anyhow::bail!("invalid duration {s:?}");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5h").is_err());
    }
}
