//! `hayate bench compare`: Hayate and its peers side by side in one run.
//!
//! Starts each peer (through its `bench/peers/<name>.sh` script; Hayate's own broker from the
//! given executable), runs the throughput sweep (all targets interleaved per payload, with the
//! raw TCP baseline and its relay floor), the 64 B latency test, the RPC test (Hayate and NATS), iperf3 over
//! loopback (the ideal line), Cyclone DDS' `ddsperf` where installed, and durable publishing
//! (Hayate streams against Kafka, when `hayate` is among the peers), then writes the data
//! (JSON, CSV), the charts and a self-contained HTML page. Every process it started is stopped
//! at the end, also on error ([`Cleanup`] is shared with the caller for Ctrl-C).
//!
//! # Layout
//! - this module: the settings ([`CompareOptions`]), the peers known ([`ALL_PEERS`]) and the
//!   figures of a run ([`CompareResult`]);
//! - `peers`: what each peer is (name, script, target URL, settings) and how it is installed
//!   and started;
//! - `hayate`: the Hayate brokers a comparison starts (the default one and the busy-polling
//!   one), with their native, MQTT and STOMP listeners;
//! - `process`: the processes a comparison started ([`Cleanup`]), running the peer scripts,
//!   free ports;
//! - `run`: [`compare`] itself: the measurements, then the data, the charts and the HTML page;
//! - `iperf`: iperf3 over loopback (the ideal line);
//! - `ddsperf`: Cyclone DDS' `ddsperf` (throughput and latency) and the parsing of its output;
//! - `durable`: durable publishing (Hayate streams against Kafka) through
//!   `bench/durable-vs-kafka.sh`, after the live measurements.

use std::path::PathBuf;

use crate::Record;

pub(crate) mod ddsperf;
mod durable;
mod hayate;
mod iperf;
mod peers;
pub(crate) mod process;
mod run;

pub use process::Cleanup;
pub use run::compare;

/// The largest payload of the sweep; every broker is configured to accept it.
const MAX_PAYLOAD: usize = 64 << 20;

/// Settings of a comparison run.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Peer names to run; `None`: every known peer.
    pub peers: Option<Vec<String>>,
    /// The quick run: fewer payloads, 1 s per point.
    pub quick: bool,
    /// Output directory; `None`: `bench/results/<date>-<host>[-quick]` under `root`.
    pub out: Option<PathBuf>,
    /// The repository root (holds `bench/peers/`).
    pub root: PathBuf,
    /// The `hayate` executable that runs the broker.
    pub hayate_exe: PathBuf,
    /// The command line, for the report.
    pub command: String,
}

/// Every peer `compare` knows, in report order.
pub const ALL_PEERS: &[&str] = &[
    "hayate",
    "hayate-mqtt",
    "hayate-stomp",
    "hayate-amqp",
    "hayate-broker-shm",
    "hayate-busy",
    "hayate-mqtt-busy",
    "hayate-stomp-busy",
    "nats",
    "mosquitto",
    "rabbitmq",
    "rabbitmq-stomp",
    "rabbitmq-mqtt",
    "kafka",
    "zenoh",
    "zenoh-p2p",
    "zmq",
    "hayate-p2p",
    "hayate-shm",
    "grpc",
    "ddsperf",
    "iperf3",
];

/// The figures of a whole comparison.
pub struct CompareResult {
    /// The output directory.
    pub out: PathBuf,
    /// Throughput records (targets, baseline, iperf3, ddsperf).
    pub thr: Vec<Record>,
    /// Latency records.
    pub lat: Vec<Record>,
    /// RPC records.
    pub rpc: Vec<Record>,
    /// Durable publishing records (Hayate streams and Kafka; test `"durable"`).
    pub durable: Vec<Record>,
    /// Fan-out records (one publisher, 1 to 20 subscriber processes; test `"fanout"`).
    pub fanout: Vec<Record>,
}
