//! `hayate bench compare`: Hayate and its peers side by side in one run.
//!
//! Starts each peer (through its `bench/peers/<name>.sh` script; Hayate's own broker from the
//! given executable), runs the throughput sweep (all targets interleaved per payload, with the
//! raw TCP baseline), the 64 B latency test, the RPC test (Hayate and NATS), iperf3 over
//! loopback (the ideal line) and Cyclone DDS' `ddsperf` where installed, then writes the data
//! (JSON, CSV), the charts and a self-contained HTML page. Every process it started is stopped
//! at the end, also on error ([`Cleanup`] is shared with the caller for Ctrl-C).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::html::{self, Page, PeerRow};
use crate::size::format_size;
use crate::{LatOptions, MachineInfo, Record, Target, ThrOptions};

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
    "grpc",
    "ddsperf",
    "iperf3",
];

/// What a peer is, how it starts and which settings it runs with.
struct Spec {
    name: &'static str,
    /// `bench/peers/<script>.sh`; `None` for brokerless peers and Hayate.
    script: Option<&'static str>,
    /// The benchmark target URL for a port (`None`: measured otherwise, e.g. ddsperf).
    url: Option<&'static str>,
    /// Port passed to `start` (0: a free port chosen here; `None`: no argument).
    port: Option<u16>,
    settings: &'static str,
    /// Measured by the RPC benchmark only (request/reply systems without pub/sub here).
    rpc_only: bool,
}

fn spec(name: &str) -> Option<Spec> {
    let s = |name, script, url, port, settings| Spec {
        name,
        script,
        url,
        port,
        settings,
        rpc_only: false,
    };
    Some(match name {
        "hayate" => s(
            "hayate",
            None,
            Some("hayate://127.0.0.1:{port}"),
            Some(0),
            "hayate broker --max-payload 67108864; hayate-client default subscription \
             (reliable, congestion Block: back-pressure reaches the publisher, nothing dropped)",
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
        "zmq" => s(
            "zmq",
            None,
            Some("zmq://127.0.0.1:0"),
            None,
            "brokerless PUB/SUB over TCP loopback; PUB drops past the high-water mark, the \
             subscriber counts what arrives; RPC by REQ callers and a ROUTER server",
        ),
        "zenoh" => s(
            "zenoh",
            Some("zenoh"),
            Some("zenoh://127.0.0.1:{port}"),
            Some(0),
            "zenohd router (no multicast scouting), sessions in client mode; reliable, \
             congestion control Block, automatic batching",
        ),
        "zenoh-p2p" => s(
            "zenoh-p2p",
            None,
            Some("zenoh://127.0.0.1:0?mode=peer&name=zenoh-p2p"),
            None,
            "brokerless: two peer sessions, one listening on loopback and one connecting; \
             reliable, congestion control Block, automatic batching; RPC by get/queryable",
        ),
        "hayate-p2p" => Spec {
            rpc_only: true,
            ..s(
                "hayate-p2p",
                None,
                Some("hayate://127.0.0.1:0?mode=peer&name=hayate-p2p"),
                None,
                "RPC only: Hayate peer to peer, no broker: the server is a PeerServer \
                 (hayate-client) on a free loopback port, each caller connects its Client to it",
            )
        },
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

/// A started process to stop at the end.
enum Running {
    Child(String, Child),
    Script { script: PathBuf, port: Option<u16> },
}

/// The processes a comparison started; [`Cleanup::stop_all`] stops them (idempotent). Clone it
/// before calling [`compare`] to stop everything from a Ctrl-C handler.
#[derive(Clone, Default)]
pub struct Cleanup(Arc<Mutex<Vec<Running>>>);

impl Cleanup {
    fn push(&self, r: Running) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    /// Stops every process started so far, newest first.
    pub fn stop_all(&self) {
        let running: Vec<Running> =
            std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        for r in running.into_iter().rev() {
            match r {
                Running::Child(name, mut c) => {
                    let _ = c.kill();
                    let _ = c.wait();
                    eprintln!("compare: stopped {name}");
                }
                Running::Script { script, port } => {
                    let mut args = vec!["stop".to_string()];
                    args.extend(port.map(|p| p.to_string()));
                    if let Err(e) = run_script(&script, &args) {
                        eprintln!("compare: {} stop: {e:#}", script.display());
                    }
                }
            }
        }
    }
}

/// Stops everything when dropped (error paths and panics).
struct Guard(Cleanup);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.stop_all();
    }
}

/// Runs `bash SCRIPT ARGS...`; stdout on success, the output tail as the error otherwise.
fn run_script(script: &Path, args: &[String]) -> anyhow::Result<String> {
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().chain(stdout.lines()).rev().take(3).collect();
        bail!(
            "{} {} failed ({}): {}",
            script.display(),
            args.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
    }
    Ok(stdout)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The busy-polling window of the `*-busy` Hayate peers, in microseconds.
const BUSY_POLL_US: u32 = 300;

/// The listeners of the hayate brokers this comparison started (the default one and the
/// busy-polling one): protocol label → address.
static HAYATE: Mutex<[Option<HashMap<String, String>>; 2]> = Mutex::new([None, None]);

/// The address of a started hayate broker's `label` listener (`native protocol`, `mqtt`,
/// `stomp`), starting that broker on first use.
fn hayate_addr(exe: &Path, cleanup: &Cleanup, label: &str, busy: bool) -> anyhow::Result<String> {
    let mut h = HAYATE.lock().unwrap_or_else(|e| e.into_inner());
    let slot = &mut h[usize::from(busy)];
    if slot.is_none() {
        *slot = Some(start_hayate(exe, cleanup, busy)?);
    }
    slot.as_ref()
        .and_then(|m| m.get(label).cloned())
        .with_context(|| format!("the hayate broker reported no {label} listener"))
}

/// Spawns `hayate broker` with its native, MQTT and STOMP listeners on kernel-chosen ports
/// (no WebSocket, nothing kept on disk), busy-polling if `busy`, and returns their addresses
/// by protocol label.
fn start_hayate(
    exe: &Path,
    cleanup: &Cleanup,
    busy: bool,
) -> anyhow::Result<HashMap<String, String>> {
    let busy_poll = if busy { BUSY_POLL_US } else { 0 };
    let mut child = Command::new(exe)
        .args([
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--mqtt",
            "127.0.0.1:0",
            "--stomp",
            "127.0.0.1:0",
            "--ws",
            "off",
            "--data",
            "",
            "--max-payload",
        ])
        .arg(MAX_PAYLOAD.to_string())
        .arg("--busy-poll-us")
        .arg(busy_poll.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {} broker", exe.display()))?;
    let stdout = child.stdout.take().context("broker stdout")?;
    cleanup.push(Running::Child("hayate broker".into(), child));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut found = HashMap::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("ready") {
                let _ = tx.send(std::mem::take(&mut found));
            } else if let Some(rest) = line.strip_prefix("hayate broker: ")
                && let Some((label, addr)) = rest.split_once(" on ")
            {
                found.insert(label.to_string(), addr.trim().to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("the hayate broker did not report its addresses within 10 s")
}

/// A peer as it went: its target (if measured by the harness) or why it was skipped.
struct Peer {
    spec: Spec,
    target: Option<Target>,
    version: String,
    skipped: Option<String>,
}

fn script_path(root: &Path, script: &str) -> PathBuf {
    root.join("bench/peers").join(format!("{script}.sh"))
}

/// Installs and starts one peer; `Err` is the reason to skip it.
fn prepare(
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
        "hayate" => Some("native protocol"),
        "hayate-mqtt" => Some("mqtt"),
        "hayate-stomp" => Some("stomp"),
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
            _ => format!("hayate://{addr}"),
        };
        let t = Target::parse(&url)?;
        return Ok((Some(t), format!("hayate {}", env!("CARGO_PKG_VERSION"))));
    }
    let Some(script) = spec.script else {
        // Brokerless: in the bench process for thr/lat, a child process for RPC.
        let url = spec.url.unwrap_or_default();
        let version = match spec.name {
            "hayate-p2p" => format!("hayate {}", env!("CARGO_PKG_VERSION")),
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
            *DDS_CONFIG.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
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
}

/// Runs the comparison (see the module documentation). Stops every started process before
/// returning, whatever happens.
pub fn compare(opts: &CompareOptions, cleanup: &Cleanup) -> anyhow::Result<CompareResult> {
    let guard = Guard(cleanup.clone());
    let t0 = Instant::now();
    let machine_start = MachineInfo::current();
    let names: Vec<String> = match &opts.peers {
        Some(p) => p.clone(),
        None => ALL_PEERS.iter().map(|s| s.to_string()).collect(),
    };
    let mut peers = Vec::new();
    let mut started = Vec::new();
    for name in &names {
        let Some(spec) = spec(name) else {
            bail!("unknown peer {name:?} (known: {})", ALL_PEERS.join(", "));
        };
        let p = match prepare(&spec, opts, cleanup, &mut started) {
            Ok((target, version)) => Peer {
                spec,
                target,
                version,
                skipped: None,
            },
            Err(e) => {
                println!("compare: skipping {name}: {e:#}");
                Peer {
                    spec,
                    target: None,
                    version: String::new(),
                    skipped: Some(format!("{e:#}")),
                }
            }
        };
        peers.push(p);
    }
    let active = |peers: &[Peer], n: &str| {
        peers
            .iter()
            .any(|p| p.spec.name == n && p.skipped.is_none())
    };
    let rpc_targets: Vec<Target> = peers.iter().filter_map(|p| p.target.clone()).collect();
    let targets: Vec<Target> = peers
        .iter()
        .filter(|p| !p.spec.rpc_only)
        .filter_map(|p| p.target.clone())
        .collect();

    let quick = opts.quick;
    let payloads: Vec<usize> = if quick {
        vec![8, 64, 1024, 16 << 10, 256 << 10, 4 << 20]
    } else {
        crate::default_sweep()
    };
    let thr_opts = ThrOptions {
        targets: targets.clone(),
        include_baseline: true,
        payloads: payloads.clone(),
        duration: Duration::from_secs(if quick { 1 } else { 3 }),
        warmup: Duration::from_millis(if quick { 500 } else { 1000 }),
        samples: 10,
    };
    let lat_opts = LatOptions {
        targets: targets.clone(),
        include_baseline: true,
        payload: 64,
        duration: Duration::from_secs(if quick { 1 } else { 2 }),
        warmup: Duration::from_millis(if quick { 500 } else { 1000 }),
        runs: if quick { 3 } else { 5 },
    };
    println!(
        "compare: throughput sweep ({} payloads, {} targets + tcp baseline)",
        payloads.len(),
        targets.len()
    );
    let mut thr = crate::thr(&thr_opts)?;
    println!("compare: latency (64 B, {} runs)", lat_opts.runs);
    let mut lat = crate::lat(&lat_opts)?;

    // RPC at concurrency 1 for every target: three runs per system in a rotating order (a
    // single pass favours whoever runs second on this kind of machine), medians reported.
    let calls = if quick { 5_000 } else { 32_000 };
    let rpc_opts = crate::RpcOptions {
        targets: rpc_targets.clone(),
        points: vec![crate::RpcPoint {
            calls,
            concurrency: 1,
        }],
        runs: 3,
        max_time: Duration::from_secs(if quick { 10 } else { 60 }),
        call_timeout: Duration::from_secs(10),
        // As rpc-bench: each point's server is a child process (`hayate bench rpc-server`).
        server: crate::ServerPlacement::Child(opts.hayate_exe.clone()),
    };
    println!(
        "compare: rpc ({calls} calls at concurrency 1, 3 rotated runs, at most {} s each)",
        rpc_opts.max_time.as_secs()
    );
    let rpc = crate::rpc(&rpc_opts)?;

    let mut iperf_bps = None;
    if active(&peers, "iperf3") {
        let secs = if quick { 3 } else { 10 };
        println!("compare: iperf3 over loopback ({secs} s)");
        let path = script_path(&opts.root, "iperf3");
        match iperf3(&path, secs) {
            Ok(bps) => {
                iperf_bps = Some(bps);
                for &p in &payloads {
                    let mut r = Record::new("iperf3", "ideal", "thr", p);
                    r.client = "iperf3".into();
                    r.bits_per_sec = Some(bps);
                    r.samples = 1;
                    thr.push(r);
                }
            }
            Err(e) => {
                println!("compare: iperf3 failed: {e:#}");
                mark_skipped(&mut peers, "iperf3", format!("run failed: {e:#}"));
            }
        }
    }
    if active(&peers, "ddsperf") {
        let version = peers
            .iter()
            .find(|p| p.spec.name == "ddsperf")
            .map(|p| p.version.clone())
            .unwrap_or_default();
        println!("compare: Cyclone DDS ddsperf");
        let secs = if quick { 2 } else { 4 };
        for &p in &payloads {
            thr.push(ddsperf_thr(p, secs, &version));
        }
        lat.push(ddsperf_lat(if quick { 3 } else { 6 }, &version));
    }
    // Stop the servers before writing (and before the screenshot).
    drop(guard);

    let out = match &opts.out {
        Some(o) => o.clone(),
        None => opts.root.join("bench/results").join(format!(
            "{}-{}{}",
            date_string(machine_start.timestamp),
            machine_start.hostname,
            if quick { "-quick" } else { "" }
        )),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    crate::write_json(&out.join("thr.json"), &thr)?;
    crate::write_json(&out.join("lat.json"), &lat)?;
    crate::write_json(&out.join("rpc.json"), &rpc)?;
    let all: Vec<Record> = thr.iter().chain(&lat).chain(&rpc).cloned().collect();
    crate::write_csv(&out.join("results.csv"), &all)?;
    let mut charts = Vec::new();
    for f in crate::write_charts(&out.join("thr"), &thr)? {
        charts.push(f);
    }
    for f in crate::write_charts(&out.join("lat"), &lat)? {
        charts.push(f);
    }
    for f in crate::write_charts(&out.join("rpc"), &rpc)? {
        charts.push(f);
    }
    let mut svgs = Vec::new();
    for f in &charts {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        svgs.push((name, std::fs::read_to_string(f)?));
    }
    let machine_end = MachineInfo::current();
    let mut settings = vec![
        ("command".to_string(), opts.command.clone()),
        (
            "run".to_string(),
            if quick { "quick" } else { "full" }.to_string(),
        ),
        (
            "throughput".to_string(),
            format!(
                "payloads {}; per point {} s warm-up then {} s in {} samples, median after \
                 dropping samples beyond the 1st/99th percentiles; targets interleaved per payload",
                payloads
                    .iter()
                    .map(|p| format_size(*p))
                    .collect::<Vec<_>>()
                    .join(", "),
                thr_opts.warmup.as_secs_f64(),
                thr_opts.duration.as_secs_f64(),
                thr_opts.samples
            ),
        ),
        (
            "latency".to_string(),
            format!(
                "64 B ping-pong, one message in flight; {} runs of {} s (rotating order), \
                 median of each percentile over the runs; HDR histogram of half round trips",
                lat_opts.runs,
                lat_opts.duration.as_secs_f64()
            ),
        ),
        (
            "rpc".to_string(),
            format!(
                "{calls} sequential requests (concurrency 1; a run stops after {} s, the calls \
                 made so far count): the client sends a number, the server adds 1, every \
                 reply is checked; the server runs in a child process (`hayate bench \
                 rpc-server`), the callers in the benchmark's; 3 rotated runs, medians. Each \
                 system's own request/reply (see the client column)",
                rpc_opts.max_time.as_secs()
            ),
        ),
    ];
    if let Some(bps) = iperf_bps {
        settings.push((
            "iperf3".to_string(),
            format!("{} over loopback", crate::format_bits(bps)),
        ));
    }
    settings.push((
        "duration".to_string(),
        format!("{:.0} s", t0.elapsed().as_secs_f64()),
    ));
    let rows: Vec<PeerRow> = peers
        .iter()
        .map(|p| PeerRow {
            name: p.spec.name.to_string(),
            version: p.version.clone(),
            client: thr
                .iter()
                .chain(&lat)
                .find(|r| r.system == p.spec.name && !r.client.is_empty())
                .map(|r| r.client.clone())
                .unwrap_or_default(),
            settings: p.spec.settings.to_string(),
            skipped: p.skipped.clone(),
        })
        .collect();
    let page = Page {
        title: format!(
            "Hayate compare: {} on {}{}",
            date_string(machine_start.timestamp),
            machine_start.hostname,
            if quick { " (quick)" } else { "" }
        ),
        machine: html::machine_facts(&machine_start, &machine_end),
        peers: rows,
        settings,
        thr: thr.clone(),
        lat: lat.clone(),
        rpc: rpc.clone(),
        charts: svgs,
    };
    std::fs::write(out.join("index.html"), html::render(&page))?;
    println!("compare: wrote {}", out.join("index.html").display());
    let shot = opts.root.join("bench/screenshot.sh");
    if shot.exists() && which("chromium") {
        match run_script(&shot, &[out.display().to_string()]) {
            Ok(_) => println!("compare: wrote {}", out.join("report.png").display()),
            Err(e) => println!("compare: screenshot failed: {e:#}"),
        }
    }
    Ok(CompareResult { out, thr, lat, rpc })
}

fn mark_skipped(peers: &mut [Peer], name: &str, why: String) {
    for p in peers.iter_mut().filter(|p| p.spec.name == name) {
        p.skipped = Some(why.clone());
    }
}

fn which(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(cmd).is_file()))
}

/// YYYY-MM-DD (UTC) of a Unix time.
pub(crate) fn date_string(unix: u64) -> String {
    // Howard Hinnant's civil_from_days.
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// iperf3 over loopback: bits per second, via `iperf3.sh` when it exists, else `iperf3`.
fn iperf3(script: &Path, secs: u64) -> anyhow::Result<f64> {
    if script.exists() {
        let out = run_script(script, &["run".into(), secs.to_string()])?;
        return parse_bits_per_second(&out)
            .with_context(|| format!("no `bits_per_second N` in {out:?}"));
    }
    let port = free_port()?;
    let server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning iperf3 -s")?;
    let mut server = KillOnDrop(server);
    std::thread::sleep(Duration::from_millis(300));
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J", "-t"])
        .arg(secs.to_string())
        .output()
        .context("running iperf3 -c")?;
    let _ = server.0.wait();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("iperf3 -J output")?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("no end.sum_received.bits_per_second in iperf3 -J output")
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn parse_bits_per_second(s: &str) -> Option<f64> {
    s.lines()
        .find_map(|l| l.trim().strip_prefix("bits_per_second"))
        .and_then(|v| v.trim().parse().ok())
}

/// The Cyclone DDS config from `cyclonedds.sh config` (loopback, no multicast).
static DDS_CONFIG: Mutex<Option<String>> = Mutex::new(None);

fn ddsperf_cmd() -> Command {
    let mut c = Command::new("ddsperf");
    let config = DDS_CONFIG.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(path) = config.filter(|p| !p.is_empty()) {
        c.env("CYCLONEDDS_URI", format!("file://{path}"));
    } else if std::env::var_os("CYCLONEDDS_URI").is_none() {
        // Unicast on loopback only (no multicast on shared machines).
        c.env(
            "CYCLONEDDS_URI",
            "<General><Interfaces><NetworkInterface address=\"127.0.0.1\"/></Interfaces>\
             <AllowMulticast>false</AllowMulticast></General><Discovery><ParticipantIndex>auto\
             </ParticipantIndex><MaxAutoParticipantIndex>30</MaxAutoParticipantIndex><Peers>\
             <Peer address=\"127.0.0.1\"/></Peers></Discovery>",
        );
    }
    c.stdin(Stdio::null());
    c
}

/// Runs a ddsperf pair: `server` in the background, `client` in the foreground, returns the
/// output of the side that reports (`report_server`: the server's).
fn ddsperf_pair(
    server: &[String],
    client: &[String],
    report_server: bool,
) -> anyhow::Result<String> {
    let srv = ddsperf_cmd()
        .args(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning ddsperf")?;
    let mut srv = KillOnDrop(srv);
    std::thread::sleep(Duration::from_millis(300));
    let cli = ddsperf_cmd()
        .args(client)
        .stderr(Stdio::null())
        .output()
        .context("running ddsperf")?;
    if report_server {
        // The server runs one second longer than the client; give it that and a margin.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if srv.0.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = srv.0.kill();
        let mut s = String::new();
        if let Some(mut o) = srv.0.stdout.take() {
            use std::io::Read;
            o.read_to_string(&mut s)?;
        }
        Ok(s)
    } else {
        Ok(String::from_utf8_lossy(&cli.stdout).to_string())
    }
}

fn ddsperf_record(test: &str, payload: usize, version: &str) -> Record {
    let mut r = Record::new("cyclonedds", "brokerless", test, payload);
    r.client = format!("ddsperf {version}").trim().to_string();
    r.target = "ddsperf (DDS over UDP loopback)".into();
    r
}

/// One throughput point: `ddsperf sub` and `ddsperf pub size N` for `secs`; the median of the
/// per-second rates the subscriber reports, the first second dropped.
fn ddsperf_thr(payload: usize, secs: u64, version: &str) -> Record {
    let size = payload.max(12);
    let mut r = ddsperf_record("thr", size, version);
    let res = ddsperf_pair(
        &["-D".into(), (secs + 2).to_string(), "sub".into()],
        &[
            "-D".into(),
            (secs + 1).to_string(),
            "pub".into(),
            "size".into(),
            size.to_string(),
        ],
        true,
    );
    match res {
        Ok(out) => {
            let rates: Vec<f64> = parse_ddsperf_sub(&out)
                .into_iter()
                .filter(|(s, _)| *s == size)
                .map(|(_, rate)| rate)
                .collect();
            // Drop the first interval (discovery, warm-up) and the last (partial).
            let kept: Vec<f64> = if rates.len() > 2 {
                rates[1..rates.len() - 1].to_vec()
            } else {
                rates
            };
            match crate::stats::median(&kept) {
                Some(m) if m > 0.0 => {
                    r.msgs_per_sec = Some(m);
                    r.bits_per_sec = Some(m * size as f64 * 8.0);
                    r.samples = kept.len();
                }
                _ => r.error = Some("ddsperf sub reported no data".into()),
            }
        }
        Err(e) => r.error = Some(format!("{e:#}")),
    }
    r
}

/// Latency: `ddsperf pong` and `ddsperf ping size 64`; ddsperf reports half round trips; the
/// median over its per-second reports (first dropped). ddsperf has no p99.9.
fn ddsperf_lat(secs: u64, version: &str) -> Record {
    let mut r = ddsperf_record("lat", 64, version);
    let res = ddsperf_pair(
        &["-D".into(), (secs + 2).to_string(), "pong".into()],
        &[
            "-D".into(),
            secs.to_string(),
            "ping".into(),
            "size".into(),
            "64".into(),
        ],
        false,
    );
    match res {
        Ok(out) => {
            let mut pts = parse_ddsperf_ping(&out);
            if pts.len() > 1 {
                pts.remove(0);
            }
            let med = |f: fn(&DdsPing) -> f64| {
                crate::stats::median(&pts.iter().map(f).collect::<Vec<_>>())
            };
            if pts.is_empty() {
                r.error = Some("ddsperf ping reported no round trips".into());
            } else {
                r.p50_us = med(|p| p.p50_us);
                r.p99_us = med(|p| p.p99_us);
                r.samples = pts.iter().map(|p| p.count).sum::<u64>() as usize;
                r.msgs_per_sec = Some(r.samples as f64 / pts.len() as f64);
            }
        }
        Err(e) => r.error = Some(format!("{e:#}")),
    }
    r
}

/// Per-second lines of `ddsperf sub`: `(size, samples per second)`, from
/// `... size 1024 total 278301 lost 0 delta 189124 lost 0 rate 189.08 kS/s 1548.91 Mb/s ...`.
pub(crate) fn parse_ddsperf_sub(out: &str) -> Vec<(usize, f64)> {
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let size = after(&w, "size")?.parse().ok()?;
            let i = w.iter().position(|x| *x == "rate")?;
            let v: f64 = w.get(i + 1)?.parse().ok()?;
            let mult = match *w.get(i + 2)? {
                "S/s" => 1.0,
                "kS/s" => 1e3,
                "MS/s" => 1e6,
                _ => return None,
            };
            Some((size, v * mult))
        })
        .collect()
}

/// One per-second report of `ddsperf ping`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DdsPing {
    pub(crate) p50_us: f64,
    pub(crate) p90_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) count: u64,
}

/// Per-second lines of `ddsperf ping`: `... size 64 mean 127.776us min 11.421us 50% 79.042us
/// 90% 263.191us 99% 586.023us max 3749.435us cnt 3904`.
pub(crate) fn parse_ddsperf_ping(out: &str) -> Vec<DdsPing> {
    let us = |s: &str| s.strip_suffix("us").and_then(|v| v.parse::<f64>().ok());
    out.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some(DdsPing {
                p50_us: us(after(&w, "50%")?)?,
                p90_us: us(after(&w, "90%")?)?,
                p99_us: us(after(&w, "99%")?)?,
                count: after(&w, "cnt")?.parse().ok()?,
            })
        })
        .collect()
}

fn after<'a>(words: &[&'a str], key: &str) -> Option<&'a str> {
    let i = words.iter().position(|w| *w == key)?;
    words.get(i + 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUB: &str = "\
[2315] participant vm:2315: new (self)
[2315] participant vm:2325: new
[2315] 1.000  size 1024 total 89177 lost 0 delta 89177 lost 0 rate 89.16 kS/s 730.43 Mb/s (8.92 kS/s 73.04 Mb/s)
[2315] 1.000  rss:7.2MB vcsw:1860 ivcsw:399 tev:0%+3% recvUC:13%+11%
[2315] 2.000  size 1024 total 278301 lost 0 delta 189124 lost 0 rate 189.08 kS/s 1548.91 Mb/s (27.82 kS/s 227.93 Mb/s)
[2315] 2.000  rss:7.2MB vcsw:2840 ivcsw:140 tev:0%+2% recvUC:33%+11%
[2315] participant vm:2325: gone
";

    const PING: &str = "\
[2351] participant vm:2351: new (self)
[2351] participant vm:2340: new
[2351] 2.000  vm:2340 size 64 mean 127.776us min 11.421us 50% 79.042us 90% 263.191us 99% 586.023us max 3749.435us cnt 3904
[2351] 2.000  rss:7.3MB vcsw:2987 ivcsw:987 recvUC:4%+34%
[2351] 3.000  vm:2340 size 64 mean 177.053us min 25.612us 50% 184.058us 90% 284.350us 99% 615.674us max 2567.032us cnt 2822
";

    #[test]
    fn parses_ddsperf_output() {
        assert_eq!(
            parse_ddsperf_sub(SUB),
            vec![(1024, 89_160.0), (1024, 189_080.0)]
        );
        let p = parse_ddsperf_ping(PING);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].p50_us, 79.042);
        assert_eq!(p[0].p90_us, 263.191);
        assert_eq!(p[1].p99_us, 615.674);
        assert_eq!(p[1].count, 2822);
        assert!(parse_ddsperf_ping(SUB).is_empty());
    }

    #[test]
    fn parses_iperf_and_dates() {
        assert_eq!(
            parse_bits_per_second("started\nbits_per_second 24900000000\n"),
            Some(24.9e9)
        );
        assert_eq!(parse_bits_per_second("nothing"), None);
        assert_eq!(date_string(0), "1970-01-01");
        assert_eq!(date_string(1_795_323_242), "2026-11-22");
        assert_eq!(date_string(951_782_400), "2000-02-29");
    }

    #[test]
    fn knows_every_peer() {
        for p in ALL_PEERS {
            assert!(spec(p).is_some(), "{p}");
        }
        assert!(spec("nope").is_none());
    }
}
