//! The peers: what each one is ([`Spec`]) and how it is installed and started ([`prepare`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use hayate_core::sync::lock;

use super::ddsperf::DDS_CONFIG;
use super::hayate::hayate_addr;
use super::process::{Cleanup, Running, free_port, run_script};
use super::{CompareOptions, MAX_PAYLOAD};
use crate::Target;

/// What a peer is, how it starts and which settings it runs with.
pub(super) struct Spec {
    pub(super) name: &'static str,
    /// `bench/peers/<script>.sh`; `None` for brokerless peers and Hayate.
    script: Option<&'static str>,
    /// The benchmark target URL for a port (`None`: measured otherwise, e.g. ddsperf).
    url: Option<&'static str>,
    /// Port passed to `start` (0: a free port chosen here; `None`: no argument).
    port: Option<u16>,
    pub(super) settings: &'static str,
    /// Measured by the RPC benchmark only (request/reply systems without pub/sub here).
    pub(super) rpc_only: bool,
    /// Not measured by the RPC benchmark (its RPC would be another row's).
    pub(super) pubsub_only: bool,
}

impl Spec {
    /// A peer measured by every test that applies to it.
    fn new(
        name: &'static str,
        script: Option<&'static str>,
        url: Option<&'static str>,
        port: Option<u16>,
        settings: &'static str,
    ) -> Spec {
        Spec {
            name,
            script,
            url,
            port,
            settings,
            rpc_only: false,
            pubsub_only: false,
        }
    }
}

/// What peer `name` is; `None` for a name not known.
pub(super) fn spec(name: &str) -> Option<Spec> {
    hayate_spec(name)
        .or_else(|| broker_spec(name))
        .or_else(|| brokerless_spec(name))
        .or_else(|| tool_spec(name))
}

/// Hayate's own brokers: the default one (native, shared memory, MQTT, STOMP and AMQP
/// listeners) and the busy-polling one (native, MQTT, STOMP).
fn hayate_spec(name: &str) -> Option<Spec> {
    let s = Spec::new;
    Some(match name {
        "hayate" => s(
            "hayate",
            None,
            Some("hayate://127.0.0.1:{port}?shm=off"),
            Some(0),
            "hayate broker --max-payload 67108864; clients over TCP loopback (shared memory \
             with the broker off, as every other system here is on TCP); hayate-client \
             default subscription (reliable, congestion Block: back-pressure reaches the \
             publisher, nothing dropped)",
        ),
        "hayate-broker-shm" => s(
            "hayate-broker-shm",
            None,
            Some("hayate://127.0.0.1:{port}?shm=require&name=hayate-broker-shm"),
            Some(0),
            "the same hayate broker, its clients on shared memory with it (what hayate-client \
             chooses by itself on the broker's host: two rings of 2 MiB per connection; \
             docs/shm.md)",
        ),
        "hayate-mqtt" => s(
            "hayate-mqtt",
            None,
            Some("mqtt://127.0.0.1:{port}?name=hayate-mqtt"),
            Some(0),
            "the same hayate broker's MQTT listener; MQTT 3.1.1 QoS 0, clean session, the \
             hayate-mqtt client (as for Mosquitto)",
        ),
        "hayate-stomp" => s(
            "hayate-stomp",
            None,
            Some("stomp://127.0.0.1:{port}?name=hayate-stomp"),
            Some(0),
            "the same hayate broker's STOMP listener; /topic/ destinations, ack auto; RPC by \
             temp-queue reply-to (as for RabbitMQ STOMP)",
        ),
        "hayate-amqp" => s(
            "hayate-amqp",
            None,
            Some("amqp://127.0.0.1:{port}?name=hayate-amqp"),
            None,
            "the same hayate broker's AMQP 0-9-1 listener; the same client and settings as \
             rabbitmq (lapin, no publisher confirms, auto-ack consumer, transient messages; RPC \
             by direct reply-to)",
        ),
        "hayate-busy" => s(
            "hayate-busy",
            None,
            Some("hayate://127.0.0.1:{port}?name=hayate-busy"),
            Some(0),
            "a second hayate broker, with busy-polling (--busy-poll-us 300: one I/O thread that \
             polls for 300 µs after input instead of sleeping; docs/performance.md); otherwise \
             as hayate",
        ),
        "hayate-mqtt-busy" => s(
            "hayate-mqtt-busy",
            None,
            Some("mqtt://127.0.0.1:{port}?name=hayate-mqtt-busy"),
            Some(0),
            "the busy-polling hayate broker's MQTT listener; otherwise as hayate-mqtt",
        ),
        "hayate-stomp-busy" => s(
            "hayate-stomp-busy",
            None,
            Some("stomp://127.0.0.1:{port}?name=hayate-stomp-busy"),
            Some(0),
            "the busy-polling hayate broker's STOMP listener; otherwise as hayate-stomp",
        ),
        _ => return None,
    })
}

/// The other brokers, each started by its `bench/peers/<script>.sh`.
fn broker_spec(name: &str) -> Option<Spec> {
    let s = Spec::new;
    Some(match name {
        "nats" => s(
            "nats",
            Some("nats"),
            Some("nats://127.0.0.1:{port}"),
            Some(0),
            "nats-server max_payload 64 MiB, max_pending max(4 x max_payload, 64 MiB), otherwise \
             defaults; async-nats defaults except a raised subscription_capacity (no client drop)",
        ),
        "mosquitto" => s(
            "mosquitto",
            Some("mosquitto"),
            Some("mqtt://127.0.0.1:{port}?name=mosquitto"),
            Some(0),
            "MQTT QoS 0 (as the seeds), clean session; mosquitto config from bench/peers",
        ),
        "rabbitmq" => s(
            "rabbitmq",
            Some("rabbitmq"),
            Some("amqp://127.0.0.1:5672?name=rabbitmq"),
            None,
            "AMQP 0-9-1, no publisher confirms, auto-ack consumer, transient messages",
        ),
        "rabbitmq-stomp" => s(
            "rabbitmq-stomp",
            Some("rabbitmq"),
            Some("stomp://127.0.0.1:61613?name=rabbitmq-stomp"),
            None,
            "STOMP 1.2 plugin, /topic/ destinations (amq.topic), ack auto; RPC by \
             temp-queue reply-to",
        ),
        "rabbitmq-mqtt" => s(
            "rabbitmq-mqtt",
            Some("rabbitmq"),
            Some("mqtt://127.0.0.1:11883?name=rabbitmq-mqtt"),
            None,
            "RabbitMQ MQTT plugin, QoS 0",
        ),
        "kafka" => s(
            "kafka",
            Some("kafka"),
            Some("kafka://127.0.0.1:19092"),
            Some(19092),
            "KRaft, 1 partition; producer linger.ms=0, batch.size tuned, acks=0 for throughput",
        ),
        "zenoh" => s(
            "zenoh",
            Some("zenoh"),
            Some("zenoh://127.0.0.1:{port}"),
            Some(0),
            "zenohd router (no multicast scouting), sessions in client mode; reliable, \
             congestion control Block, automatic batching",
        ),
        _ => return None,
    })
}

/// The brokerless systems: in the bench process for thr/lat, a child process for RPC.
fn brokerless_spec(name: &str) -> Option<Spec> {
    let s = Spec::new;
    Some(match name {
        "zmq" => s(
            "zmq",
            None,
            Some("zmq://127.0.0.1:0"),
            None,
            "brokerless PUB/SUB over TCP loopback; PUB drops past the high-water mark, the \
             subscriber counts what arrives; RPC by REQ callers and a ROUTER server",
        ),
        "zenoh-p2p" => s(
            "zenoh-p2p",
            None,
            Some("zenoh://127.0.0.1:0?mode=peer&name=zenoh-p2p"),
            None,
            "brokerless: two peer sessions, one listening on loopback and one connecting; \
             reliable, congestion control Block, automatic batching; RPC by get/queryable",
        ),
        "hayate-p2p" => s(
            "hayate-p2p",
            None,
            Some("hayate://127.0.0.1:0?mode=peer&shm=off&name=hayate-p2p"),
            None,
            "Hayate peer to peer, no broker, over TCP loopback (shared memory off): pub/sub \
             between two peer nodes (hayate-client Node) in the bench process, block \
             subscriptions; RPC: the server is a PeerServer on a free loopback port, each \
             caller connects its Client to it",
        ),
        "hayate-shm" => s(
            "hayate-shm",
            None,
            Some("hayate://127.0.0.1:0?mode=peer&shm=require&rpc=node&name=hayate-shm"),
            None,
            "the same two peer nodes over shared memory (the publisher's ring, 1024 slots of \
             64 KiB; readers sleep on a doorbell socket, no busy polling); in the fan-out, every \
             subscriber process reads the one ring; RPC between a server node (child \
             process) and a node per caller, over shared memory",
        ),
        "grpc" => Spec {
            rpc_only: true,
            ..s(
                "grpc",
                None,
                Some("grpc://127.0.0.1:0"),
                None,
                "RPC only: gRPC unary calls (tonic), the no-broker reference; one HTTP/2 \
                 connection per caller",
            )
        },
        _ => return None,
    })
}

/// Tools that measure themselves: Cyclone DDS' `ddsperf` and iperf3 (the ideal line).
fn tool_spec(name: &str) -> Option<Spec> {
    let s = Spec::new;
    Some(match name {
        "ddsperf" => s(
            "ddsperf",
            Some("cyclonedds"),
            None,
            None,
            "Cyclone DDS ddsperf, reliable, topic KS, pub and sub (ping and pong) in two \
             processes, unicast on 127.0.0.1; smallest payload 12 B",
        ),
        "iperf3" => s(
            "iperf3",
            Some("iperf3"),
            None,
            None,
            "iperf3 TCP over loopback, one stream: the ideal line",
        ),
        _ => return None,
    })
}

/// A peer as it went: its target (if measured by the harness) or why it was skipped.
pub(super) struct Peer {
    pub(super) spec: Spec,
    pub(super) target: Option<Target>,
    pub(super) version: String,
    pub(super) skipped: Option<String>,
}

pub(super) fn script_path(root: &Path, script: &str) -> PathBuf {
    root.join("bench/peers").join(format!("{script}.sh"))
}

/// Installs and starts one peer; `Err` is the reason to skip it.
pub(super) fn prepare(
    spec: &Spec,
    opts: &CompareOptions,
    cleanup: &Cleanup,
    started: &mut Vec<String>,
) -> anyhow::Result<(Option<Target>, String)> {
    // Is the driver compiled in? A URL the harness cannot parse means no.
    if let Some(url) = spec.url {
        Target::parse(&url.replace("{port}", "1")).map_err(|e| {
            anyhow::anyhow!("driver not compiled in (build with the `peers` feature): {e}")
        })?;
    }
    if let Some(label) = match spec.name.trim_end_matches("-busy") {
        "hayate" | "hayate-broker-shm" => Some("native protocol"),
        "hayate-mqtt" => Some("mqtt"),
        "hayate-stomp" => Some("stomp"),
        "hayate-amqp" => Some("amqp"),
        _ => None,
    } {
        let busy = spec.name.ends_with("-busy");
        let addr = hayate_addr(&opts.hayate_exe, cleanup, label, busy)?;
        let which = if busy {
            "busy-polling hayate broker"
        } else {
            "hayate broker"
        };
        println!("compare: {which}, {label} on {addr}");
        let url = match spec.url {
            Some(u) if spec.name != "hayate" => {
                u.replace("127.0.0.1:{port}", &addr).replace("{port}", "")
            }
            _ => format!("hayate://{addr}?shm=off"),
        };
        let t = Target::parse(&url)?;
        return Ok((Some(t), format!("hayate {}", env!("CARGO_PKG_VERSION"))));
    }
    let Some(script) = spec.script else {
        // Brokerless: in the bench process for thr/lat, a child process for RPC.
        let url = spec.url.unwrap_or_default();
        let version = match spec.name {
            "hayate-p2p" | "hayate-shm" => format!("hayate {}", env!("CARGO_PKG_VERSION")),
            "grpc" => crate::driver::client_name(&Target::parse(url)?).to_string(),
            _ => "brokerless".into(),
        };
        return Ok((Some(Target::parse(url)?), version));
    };
    let path = script_path(&opts.root, script);
    if !path.exists() {
        bail!("{} not found", path.display());
    }
    if spec.name == "ddsperf" || spec.name == "iperf3" {
        run_script(&path, &["install".into()]).context("install")?;
        if spec.name == "ddsperf" {
            let config = first_line(&run_script(&path, &["config".into()]).unwrap_or_default());
            *lock(&DDS_CONFIG) = Some(config);
        }
        let v = run_script(&path, &["version".into()]).unwrap_or_default();
        return Ok((None, first_line(&v)));
    }
    run_script(&path, &["install".into()]).context("install")?;
    let port = match spec.port {
        Some(0) => Some(free_port()?),
        p => p,
    };
    // Several peers share one server (RabbitMQ): start it once.
    if !started.iter().any(|s| s == script) {
        let mut args = vec!["start".to_string()];
        args.extend(port.map(|p| p.to_string()));
        if script == "nats" {
            args.push(MAX_PAYLOAD.to_string());
        }
        println!("compare: {} {}", path.display(), args.join(" "));
        run_script(&path, &args)?;
        cleanup.push(Running::Script {
            script: path.clone(),
            port,
        });
        started.push(script.to_string());
    }
    let version = first_line(&run_script(&path, &["version".into()]).unwrap_or_default());
    let url = spec
        .url
        .unwrap_or_default()
        .replace("{port}", &port.unwrap_or(0).to_string());
    Ok((Some(Target::parse(&url)?), version))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ALL_PEERS;

    #[test]
    fn knows_every_peer() {
        for p in ALL_PEERS {
            assert!(spec(p).is_some(), "{p}");
        }
        assert!(spec("nope").is_none());
    }
}
