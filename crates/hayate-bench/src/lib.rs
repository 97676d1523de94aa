//! Hayate's benchmark harness: throughput and latency of a broker, measured the way the seed
//! documents measure (see `shared/BENCH.md`), against Hayate and its peers in the same run.
//!
//! # Entry points
//! - [`thr`]: one publisher sends back-to-back, one subscriber counts, for each payload size and
//!   each target (interleaved per payload so that machine noise hits every system alike).
//! - [`lat`]: ping-pong with one message in flight; half round trips in an HDR histogram.
//! - [`baseline_thr`] / [`baseline_lat`]: the same workloads over a raw in-process TCP
//!   connection on loopback: the physical limit of the path (`system = "tcp"`, `mode = "raw"`);
//!   for throughput also its relay floor, publisher -> a thread that only copies bytes ->
//!   subscriber (`mode = "relay"`): the most a brokered path reaches on the machine.
//! - [`print_table`], [`write_json`], [`write_charts`]: reporting.
//!
//! The functions are synchronous: they build their own Tokio runtime. Called from inside a
//! runtime they run on a separate OS thread (blocking the caller), so a `#[tokio::main]` CLI can
//! call them directly.
//!
//! # Method
//! Each throughput point: warm-up, then `samples` samples over `duration`; a sample's rate is
//! the number of messages received between two *message arrivals* divided by the time between
//! those arrivals, so there is no quantisation error even when a window sees few messages. A
//! sample lasts at least `duration / samples` and at least [`MIN_MSGS_PER_SAMPLE`] messages
//! (so large payloads may take longer than `duration`). Samples outside the 1st and 99th
//! percentiles are dropped and the median of the rest is reported (see [`stats`]).

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod baseline;
mod chart;
mod compare;
mod driver;
mod fanout;
mod html;
mod lat;
mod machine;
mod progress;
mod report;
mod rpc;
mod sampler;
mod size;
pub mod stats;
mod target;
mod thr;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use baseline::{baseline_lat, baseline_thr};
pub use chart::write_charts;
pub use compare::{ALL_PEERS, Cleanup, CompareOptions, CompareResult, compare};
pub use fanout::{FanoutOptions, fanout, fanout_sub};
pub use lat::lat;
pub use machine::MachineInfo;
pub use report::{format_csv, format_table, print_table, write_csv, write_json};
pub use rpc::{
    RpcOptions, RpcPoint, ServerPlacement, default_points as default_rpc_points, rpc, serve_relay,
    serve_rpc_point,
};
pub use sampler::MIN_MSGS_PER_SAMPLE;
pub use size::{default_sweep, format_bits, format_rate, format_size, parse_size, parse_sizes};
pub use target::{System, Target};
pub use thr::thr;

/// One measured point: a system, a test and a payload size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// "hayate", "nats" or "tcp".
    pub system: String,
    /// "brokered" (through a broker), "peer-to-peer", "raw" (the TCP baseline) or "relay" (the
    /// TCP baseline through a relay that only copies bytes: the floor of a brokered path).
    pub mode: String,
    /// "thr", "lat" or "rpc".
    pub test: String,
    /// The target URL (empty for the baseline).
    pub target: String,
    /// Client library used, e.g. "async-nats 0.51".
    pub client: String,
    /// Server version when the server tells it (NATS does).
    pub server_version: Option<String>,
    /// Payload size of each message.
    pub payload_bytes: usize,
    /// Throughput: median msg/s. Latency: round trips per second during the measurement.
    pub msgs_per_sec: Option<f64>,
    /// Throughput only: `msgs_per_sec * payload_bytes * 8` (payload bits only).
    pub bits_per_sec: Option<f64>,
    /// Latency only: half round trip, microseconds.
    pub p50_us: Option<f64>,
    /// Latency only: half round trip, microseconds.
    pub p99_us: Option<f64>,
    /// Latency only: half round trip, microseconds.
    pub p999_us: Option<f64>,
    /// Throughput: samples kept after trimming. Latency: round trips measured.
    pub samples: usize,
    /// Latency: the number of runs whose medians are reported (see `LatOptions::runs`).
    #[serde(default = "one")]
    pub runs: usize,
    /// Fan-out: the number of subscriber processes (`msgs_per_sec` and `bits_per_sec` are
    /// then their sum). RPC only: callers with one request in flight each. For RPC records `msgs_per_sec` is
    /// calls per second, `samples` the calls made and the percentiles are whole call times
    /// (round trips, not halves).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Set when the point failed (slow consumer disconnect, payload too large, timeout...).
    pub error: Option<String>,
    /// Machine host name.
    pub hostname: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// CPU model from /proc/cpuinfo.
    pub cpu_model: String,
    /// Load average (1, 5, 15 min) from /proc/loadavg when the point was measured.
    pub loadavg: [f64; 3],
    /// Unix time (seconds) when the point was measured.
    pub timestamp: u64,
}

impl Record {
    /// An empty record for a point, stamped with the machine info and the current time.
    pub fn new(system: &str, mode: &str, test: &str, payload_bytes: usize) -> Record {
        let m = MachineInfo::current();
        Record {
            system: system.to_string(),
            mode: mode.to_string(),
            test: test.to_string(),
            target: String::new(),
            client: String::new(),
            server_version: None,
            payload_bytes,
            msgs_per_sec: None,
            bits_per_sec: None,
            p50_us: None,
            p99_us: None,
            p999_us: None,
            samples: 0,
            runs: 1,
            concurrency: None,
            error: None,
            hostname: m.hostname,
            cores: m.cores,
            cpu_model: m.cpu_model,
            loadavg: m.loadavg,
            timestamp: m.timestamp,
        }
    }

    /// A label for tables and charts: the system, plus the mode when it is not "brokered".
    pub fn label(&self) -> String {
        if self.mode == "brokered" {
            self.system.clone()
        } else {
            format!("{} ({})", self.system, self.mode)
        }
    }
}

/// Settings of a throughput run.
#[derive(Debug, Clone)]
pub struct ThrOptions {
    /// Systems to measure, in this order at each payload size.
    pub targets: Vec<Target>,
    /// Also measure the raw TCP baseline and its relay floor at each payload size (after the
    /// targets).
    pub include_baseline: bool,
    /// Payload sizes, in bytes.
    pub payloads: Vec<usize>,
    /// Measurement time per point (split into `samples` samples).
    pub duration: Duration,
    /// Warm-up per point, before sampling.
    pub warmup: Duration,
    /// Samples per point.
    pub samples: usize,
}

impl Default for ThrOptions {
    fn default() -> Self {
        ThrOptions {
            targets: Vec::new(),
            include_baseline: false,
            payloads: default_sweep(),
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            samples: 10,
        }
    }
}

/// Settings of a latency run.
#[derive(Debug, Clone)]
pub struct LatOptions {
    /// Systems to measure, in this order.
    pub targets: Vec<Target>,
    /// Also measure the raw TCP ping-pong baseline (after the targets).
    pub include_baseline: bool,
    /// Payload size of each ping (default 64 B).
    pub payload: usize,
    /// Measurement time.
    pub duration: Duration,
    /// Warm-up: at least this long and at least 1000 round trips.
    pub warmup: Duration,
    /// Repetitions. With more than one, the systems are measured in a rotating order in each
    /// run and each percentile reported is the median over the runs: on a noisy machine a
    /// single run's p50 moves by 2x from one run to the next.
    pub runs: usize,
    /// Each side (pinger, echo) on a thread of its own with a single-threaded Tokio runtime,
    /// as two single-threaded processes would be, and as the raw TCP baseline's two blocking
    /// threads are. By default both share one multi-threaded runtime and the pinger's loop
    /// runs on the calling thread, so each of its pongs crosses from a worker thread to it.
    pub own_threads: bool,
}

impl Default for LatOptions {
    fn default() -> Self {
        LatOptions {
            targets: Vec::new(),
            include_baseline: false,
            payload: 64,
            duration: Duration::from_secs(5),
            warmup: Duration::from_secs(1),
            runs: 1,
            own_threads: false,
        }
    }
}

/// Runs `f` on a fresh multi-threaded Tokio runtime. Inside an existing runtime (where
/// `block_on` would panic) the work moves to a scoped OS thread.
pub(crate) fn with_runtime<R: Send>(
    f: impl FnOnce(&tokio::runtime::Runtime) -> anyhow::Result<R> + Send,
) -> anyhow::Result<R> {
    let run = move || -> anyhow::Result<R> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("hayate-bench")
            .build()?;
        let out = f(&rt);
        rt.shutdown_timeout(Duration::from_secs(2));
        out
    };
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| match s.spawn(run).join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        })
    } else {
        run()
    }
}

fn one() -> usize {
    1
}

/// A throughput-style record for unit tests.
#[cfg(test)]
pub(crate) fn test_record(
    system: &str,
    mode: &str,
    test: &str,
    payload: usize,
    rate: f64,
) -> Record {
    let mut r = Record::new(system, mode, test, payload);
    r.msgs_per_sec = Some(rate);
    r.bits_per_sec = Some(rate * payload as f64 * 8.0);
    r.samples = 8;
    r
}
