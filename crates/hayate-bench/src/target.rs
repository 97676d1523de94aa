//! Benchmark targets: a system and the address of its server, parsed from a URL.

use std::fmt;

use anyhow::{Context, bail};

/// The kind of server a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum System {
    /// `hayate broker`, native protocol, through `hayate-client`.
    Hayate,
    /// `nats-server`, through `async-nats`.
    Nats,
    /// An MQTT 3.1.1 or 5.0 broker (Mosquitto, RabbitMQ's MQTT plugin, Hayate's MQTT
    /// listener...), through the `hayate-mqtt` codec (always compiled in), or through
    /// `rumqttc` with `?client=rumqttc` (feature `peers`).
    Mqtt,
    /// An AMQP 0-9-1 broker (RabbitMQ), through `lapin` (feature `peers`).
    Amqp,
    /// ZeroMQ PUB/SUB, brokerless, through the pure-Rust `zeromq` crate (feature `peers`).
    Zmq,
    /// A Kafka broker, through `rdkafka` (librdkafka; feature `peers`).
    Kafka,
    /// A STOMP 1.2 broker (RabbitMQ's STOMP plugin...), through the `hayate-stomp` codec
    /// (always compiled in).
    Stomp,
    /// Zenoh: a client of the `zenohd` router (`?mode=client`, the default) or brokerless
    /// peer to peer (`?mode=peer`), through the `zenoh` crate (feature `peers`).
    Zenoh,
    /// gRPC unary calls over HTTP/2, no broker, through `tonic` (feature `peers`): the
    /// no-broker reference of `bench rpc` only (thr and lat refuse it).
    Grpc,
}

impl System {
    /// The default name used in records: "hayate", "nats", "mqtt", "amqp", "zmq", "kafka".
    pub fn name(self) -> &'static str {
        match self {
            System::Hayate => "hayate",
            System::Nats => "nats",
            System::Mqtt => "mqtt",
            System::Amqp => "amqp",
            System::Zmq => "zmq",
            System::Kafka => "kafka",
            System::Stomp => "stomp",
            System::Zenoh => "zenoh",
            System::Grpc => "grpc",
        }
    }

    /// The URL scheme.
    pub fn scheme(self) -> &'static str {
        self.name()
    }

    /// Whether a driver for this system is compiled in (the peers need feature `peers`).
    pub fn available(self) -> bool {
        matches!(
            self,
            System::Hayate | System::Nats | System::Stomp | System::Mqtt
        ) || cfg!(feature = "peers")
    }

    /// The query parameters a target URL of this system accepts, besides `name`.
    fn params(self) -> &'static [&'static str] {
        match self {
            System::Hayate => &[
                "mode", "ca", "shm", "in_place", "spin", "slots", "slot", "arena", "peers", "rpc",
            ],
            System::Mqtt => &[
                "qos",
                "version",
                "client",
                "transport",
                "path",
                "session",
                "ca",
            ],
            System::Kafka => &["acks"],
            System::Amqp => &["client", "durable", "io"],
            System::Zenoh => &["mode", "express", "connect"],
            _ => &[],
        }
    }

    /// The port used when a URL names none.
    pub fn default_port(self) -> u16 {
        match self {
            System::Hayate => 4700,
            System::Nats => 4222,
            System::Mqtt => 1883,
            System::Amqp => 5672,
            // ZeroMQ is brokerless: the publisher binds; port 0 picks a free port.
            System::Zmq => 0,
            System::Kafka => 19092,
            System::Stomp => 61613,
            System::Zenoh => 7447,
            // gRPC is served by the benchmark itself: port 0 picks a free port.
            System::Grpc => 0,
        }
    }
}

/// A server to benchmark: `SCHEME://HOST:PORT[?name=LABEL&...]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// Which system (and protocol) the server speaks.
    pub system: System,
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The name used in records (`?name=LABEL`; default: the system's name), so that two
    /// servers speaking one protocol (Mosquitto and RabbitMQ's MQTT plugin) are told apart.
    pub name: String,
    /// Other query parameters, in URL order (`qos` for mqtt, `acks` for kafka).
    pub params: Vec<(String, String)>,
}

/// Whether a driver for `system` is compiled in, given the target's parameters (`param`):
/// the workspace's own AMQP client (`client=hayate`) always is.
fn available<'a>(system: System, param: impl Fn(&str) -> Option<&'a str>) -> bool {
    system.available() || (system == System::Amqp && param("client") == Some("hayate"))
}

impl System {
    /// The system of a URL scheme (`tcp` is ZeroMQ's).
    fn from_scheme(scheme: &str, url: &str) -> anyhow::Result<System> {
        Ok(match scheme.to_ascii_lowercase().as_str() {
            "hayate" => System::Hayate,
            "nats" => System::Nats,
            "mqtt" => System::Mqtt,
            "amqp" => System::Amqp,
            "zmq" | "tcp" => System::Zmq,
            "kafka" => System::Kafka,
            "stomp" => System::Stomp,
            "zenoh" => System::Zenoh,
            "grpc" => System::Grpc,
            other => bail!(
                "target {url:?}: unknown scheme {other:?} \
                 (expected hayate, nats, mqtt, amqp, zmq, kafka, stomp, zenoh or grpc)"
            ),
        })
    }
}

/// A URL's query: the name (`name=`, default the system's) and the other parameters, each
/// one `system` accepts, in URL order.
fn parse_query(
    system: System,
    query: &str,
    url: &str,
) -> anyhow::Result<(String, Vec<(String, String)>)> {
    let mut name = system.name().to_string();
    let mut params = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("target {url:?}: expected KEY=VALUE, got {kv:?}"))?;
        if k == "name" {
            if v.is_empty() {
                bail!("target {url:?}: empty name");
            }
            name = v.to_string();
        } else if system.params().contains(&k) {
            params.push((k.to_string(), v.to_string()));
        } else {
            bail!(
                "target {url:?}: unknown parameter {k:?} for {} (known: name{})",
                system.name(),
                system
                    .params()
                    .iter()
                    .map(|p| format!(", {p}"))
                    .collect::<String>()
            );
        }
    }
    Ok((name, params))
}

/// `HOST[:PORT]` (an IPv6 host in brackets); without a port, the system's default.
fn parse_host_port(rest: &str, system: System, url: &str) -> anyhow::Result<(String, u16)> {
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') || rest.contains('@') {
        bail!("target {url:?}: expected SCHEME://HOST:PORT");
    }
    let (host, port) = if let Some(r) = rest.strip_prefix('[') {
        let (h, after) = r
            .split_once(']')
            .with_context(|| format!("target {url:?}: unclosed '['"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => bail!("target {url:?}: garbage after ']'"),
        };
        (h.to_string(), port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (rest.to_string(), None),
        }
    };
    if host.is_empty() {
        bail!("target {url:?}: empty host");
    }
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .with_context(|| format!("target {url:?}: bad port {p:?}"))?,
        None => system.default_port(),
    };
    Ok((host, port))
}

impl Target {
    /// Whether this target's driver is compiled in.
    pub fn available(&self) -> bool {
        available(self.system, |k| self.param(k))
    }
    /// Parses `SCHEME://HOST[:PORT][?name=LABEL&KEY=VALUE...]`; the scheme is `hayate`,
    /// `nats`, `stomp`, `mqtt`, `amqp`, `zmq`, `kafka` or `zenoh` (the last four need feature
    /// `peers`), or `grpc` (feature `peers`, `bench rpc` only). A missing port means the
    /// system's default (hayate 4700, nats 4222, stomp 61613, mqtt 1883, amqp 5672, zmq 0 = any
    /// free port, kafka 19092, zenoh 7447, grpc 0 = any free port). IPv6 hosts
    /// go in brackets: `nats://[::1]:4222`. Query parameters: `name` (any system), `qos=0|1`,
    /// `version=3.1.1|5`, `client=hayate|rumqttc` (mqtt; rumqttc needs feature `peers`) and
    /// `transport=tcp|ws` (mqtt, hayate client: MQTT over WebSocket, `path=/mqtt` by default),
    /// `acks=0|1|all` (kafka), `durable=1` (amqp, `client=hayate`: persistent messages
    /// with publisher confirms into a durable queue consumed with acknowledgements),
    /// `io=tokio|blocking` (amqp, `client=hayate`, `bench rpc`: the callers and the server on
    /// Tokio, the default, or each on a thread of its own blocked in its socket's reads, as
    /// the `--baseline` relay's are), `mode=client|peer` and `express=0|1` (zenoh), `mode=peer`
    /// (hayate: with `bench rpc` the server is a `PeerServer` that callers reach directly;
    /// with `thr`/`lat` publisher and subscriber are two peer nodes in this process; HOST is
    /// where they listen, the port is ignored), `shm=off|auto|require` and `spin=MICROS`
    /// (hayate `mode=peer`: shared memory between the nodes, default auto, which they use
    /// since they share a host; how long a reader polls its ring before it sleeps), `slots=N`
    /// and `slot=BYTES` (the ring's geometry), `arena=BYTES` (the arena of messages read in
    /// place; 0: none), `peers=ADDR,...` (a node linking to those
    /// instead of pairing with another in this process: the fan-out benchmark's subscribers),
    /// `rpc=node` (`bench rpc` in peer mode between nodes, the server's node in the child
    /// process and one node per caller, instead of a `PeerServer`).
    pub fn parse(url: &str) -> anyhow::Result<Target> {
        let url = url.trim();
        let (scheme, rest) = url
            .split_once("://")
            .with_context(|| format!("target {url:?}: expected SCHEME://HOST:PORT"))?;
        let system = System::from_scheme(scheme, url)?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (name, params) = parse_query(system, query.unwrap_or(""), url)?;
        if !available(system, |k| {
            params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
        }) {
            bail!(
                "target {url:?}: the {} driver is not compiled in \
                 (build with `--features peers`)",
                system.name()
            );
        }
        let (host, port) = parse_host_port(rest, system, url)?;
        let t = Target {
            system,
            host,
            port,
            name,
            params,
        };
        t.check_params(url)?;
        Ok(t)
    }

    /// The checks of a system's parameters against each other, once they are parsed.
    fn check_params(&self, url: &str) -> anyhow::Result<()> {
        match self.system {
            System::Hayate => match self.param("mode") {
                None | Some("broker") | Some("peer") => {}
                Some(m) => bail!("target {url:?}: unknown hayate mode {m:?} (broker or peer)"),
            },
            System::Amqp => self.check_amqp(url)?,
            System::Mqtt => self.check_mqtt(url)?,
            #[cfg(feature = "peers")]
            System::Zenoh => crate::driver::zenoh_check_params(self)
                .with_context(|| format!("target {url:?}"))?,
            _ => {}
        }
        Ok(())
    }

    /// `client`, and `durable` and `io` (which need the workspace's client).
    fn check_amqp(&self, url: &str) -> anyhow::Result<()> {
        match self.param("client") {
            None | Some("lapin") | Some("hayate") => {}
            Some(c) => bail!("target {url:?}: unknown amqp client {c:?} (lapin or hayate)"),
        }
        match (self.param("durable"), self.param("client")) {
            (None | Some("0"), _) | (Some("1"), Some("hayate")) => {}
            (Some("1"), _) => {
                bail!("target {url:?}: durable=1 needs the hayate AMQP client (client=hayate)")
            }
            (Some(d), _) => bail!("target {url:?}: durable={d:?}: 0 or 1"),
        }
        match (self.param("io"), self.param("client")) {
            (None | Some("tokio"), _) | (Some("blocking"), Some("hayate")) => {}
            (Some("blocking"), _) => {
                bail!("target {url:?}: io=blocking needs the hayate AMQP client (client=hayate)")
            }
            (Some(x), _) => bail!("target {url:?}: io={x:?}: tokio or blocking"),
        }
        Ok(())
    }

    /// `client`, `transport` (ws and tls need the workspace's client, tls a CA) and
    /// `version`.
    fn check_mqtt(&self, url: &str) -> anyhow::Result<()> {
        match self.param("client") {
            None | Some("hayate") => {}
            Some("rumqttc") if cfg!(feature = "peers") => {}
            Some("rumqttc") => bail!(
                "target {url:?}: the rumqttc driver is not compiled in \
                 (build with `--features peers`)"
            ),
            Some(c) => bail!("target {url:?}: unknown mqtt client {c:?} (hayate or rumqttc)"),
        }
        match (self.param("transport"), self.param("client")) {
            (None | Some("tcp"), _) => {}
            (Some("ws"), None | Some("hayate")) => {}
            (Some("tls"), None | Some("hayate")) if self.param("ca").is_some() => {}
            (Some("tls"), None | Some("hayate")) => {
                bail!("target {url:?}: transport=tls needs ca=FILE (the server's CA, PEM)")
            }
            (Some(x @ ("ws" | "tls")), Some(c)) => {
                bail!("target {url:?}: transport={x} needs the hayate client, not {c}")
            }
            (Some(x), _) => {
                bail!("target {url:?}: unknown mqtt transport {x:?} (tcp, ws or tls)")
            }
        }
        crate::driver::mqttc::version(self).with_context(|| format!("target {url:?}"))?;
        Ok(())
    }

    /// How the system is reached: "brokered", or "peer-to-peer" (ZeroMQ, gRPC, Zenoh
    /// `mode=peer`).
    pub fn mode(&self) -> &'static str {
        match self.system {
            System::Zmq | System::Grpc => "peer-to-peer",
            System::Zenoh | System::Hayate if self.param("mode") == Some("peer") => "peer-to-peer",
            _ => "brokered",
        }
    }

    /// The name used in records: `?name=` or the system's name ("hayate", "nats", "mqtt"...).
    pub fn system(&self) -> &str {
        &self.name
    }

    /// A query parameter (not `name`).
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `HOST:PORT` (with brackets around an IPv6 host), as a socket address string.
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.system.scheme(), self.addr())?;
        let mut sep = '?';
        if self.name != self.system.name() {
            write!(f, "?name={}", self.name)?;
            sep = '&';
        }
        for (k, v) in &self.params {
            write!(f, "{sep}{k}={v}")?;
            sep = '&';
        }
        Ok(())
    }
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Target> {
        Target::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let t = Target::parse("hayate://127.0.0.1:4000").unwrap();
        assert_eq!(t.system, System::Hayate);
        assert_eq!(t.addr(), "127.0.0.1:4000");
        assert_eq!(t.system(), "hayate");
        let t = Target::parse("nats://localhost").unwrap();
        assert_eq!(t.port, 4222);
        assert_eq!(t.to_string(), "nats://localhost:4222");
        let t = Target::parse("nats://[::1]:5000/").unwrap();
        assert_eq!(t.addr(), "[::1]:5000");
        assert!(Target::parse("ftp://x:1").is_err());
        let t = Target::parse("stomp://127.0.0.1?name=rabbitmq-stomp").unwrap();
        assert_eq!(
            (t.system, t.port, t.mode()),
            (System::Stomp, 61613, "brokered")
        );
        assert_eq!(
            Target::parse("amqp://x:1").is_ok(),
            cfg!(feature = "peers"),
            "peers are parsed only with the feature"
        );
        // ... except the workspace's own AMQP client, always compiled in.
        let t = Target::parse("amqp://x:1?client=hayate").unwrap();
        assert!(t.available());
        assert_eq!(Target::parse("grpc://x:0").is_ok(), cfg!(feature = "peers"));
        let t = Target::parse("mqtt://x:1?qos=1&version=5").unwrap();
        assert_eq!((t.system, t.param("version")), (System::Mqtt, Some("5")));
        assert!(Target::parse("mqtt://x:1?client=hayate").is_ok());
        assert_eq!(
            Target::parse("mqtt://x:1?client=rumqttc").is_ok(),
            cfg!(feature = "peers")
        );
        assert!(Target::parse("mqtt://x:1?client=paho").is_err());
        let t = Target::parse("nats://127.0.0.1:4222?name=nats-2.15").unwrap();
        assert_eq!(t.system(), "nats-2.15");
        assert_eq!(t.to_string(), "nats://127.0.0.1:4222?name=nats-2.15");
        assert!(Target::parse("nats://h:1?qos=1").is_err());
        assert!(Target::parse("nats://h:1?name=").is_err());
        assert!(Target::parse("127.0.0.1:4000").is_err());
        assert!(Target::parse("nats://:4222").is_err());
        assert!(Target::parse("nats://h:99999").is_err());
    }

    #[cfg(feature = "peers")]
    #[test]
    fn parses_peer_urls() {
        let t = Target::parse("mqtt://127.0.0.1:11883?name=rabbitmq-mqtt&qos=1").unwrap();
        assert_eq!(t.system, System::Mqtt);
        assert_eq!(t.system(), "rabbitmq-mqtt");
        assert_eq!(t.param("qos"), Some("1"));
        assert_eq!(
            t.to_string(),
            "mqtt://127.0.0.1:11883?name=rabbitmq-mqtt&qos=1"
        );
        assert_eq!(Target::parse("mqtt://h").unwrap().port, 1883);
        assert_eq!(Target::parse("amqp://h").unwrap().port, 5672);
        assert_eq!(Target::parse("kafka://h").unwrap().port, 19092);
        assert_eq!(Target::parse("zmq://127.0.0.1").unwrap().port, 0);
        assert_eq!(Target::parse("zmq://h:5555").unwrap().system(), "zmq");
        assert!(Target::parse("amqp://h?qos=1").is_err());
        let t = Target::parse("zenoh://127.0.0.1?mode=peer&name=zenoh-p2p").unwrap();
        assert_eq!((t.port, t.mode()), (7447, "peer-to-peer"));
        assert_eq!(Target::parse("zenoh://h:1").unwrap().mode(), "brokered");
        assert!(Target::parse("zenoh://h:1?mode=router").is_err());
        assert!(Target::parse("zenoh://h:1?express=2").is_err());
        let t = Target::parse("grpc://127.0.0.1").unwrap();
        assert_eq!(
            (t.system, t.port, t.mode()),
            (System::Grpc, 0, "peer-to-peer")
        );
        assert_eq!(t.to_string(), "grpc://127.0.0.1:0");
        assert!(Target::parse("grpc://h:1?mode=peer").is_err());
        let t = Target::parse("hayate://127.0.0.1:0?mode=peer&name=hayate-p2p").unwrap();
        assert_eq!((t.system(), t.mode()), ("hayate-p2p", "peer-to-peer"));
        assert_eq!(Target::parse("hayate://h").unwrap().mode(), "brokered");
        assert!(Target::parse("hayate://h?mode=router").is_err());
    }
}
