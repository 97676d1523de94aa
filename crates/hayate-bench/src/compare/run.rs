//! [`compare`]: the whole comparison, from starting the peers to the HTML page.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::ddsperf::{ddsperf_lat, ddsperf_thr};
use super::durable::durable;
use super::iperf::iperf3;
use super::peers::{Peer, prepare, script_path, spec};
use super::process::{Cleanup, Guard, run_script};
use super::{ALL_PEERS, CompareOptions, CompareResult};
use crate::html::{self, Page, PeerRow};
use crate::size::format_size;
use crate::{LatOptions, MachineInfo, Record, Target, ThrOptions};

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
    let mut peers = start_peers(&names, opts, cleanup)?;
    let plan = Plan::new(&peers, opts.quick, &opts.hayate_exe);
    let mut m = measure(&plan)?;
    measure_tools(&mut peers, &plan, opts, &mut m);
    // Stop the servers before writing (and before the screenshot).
    drop(guard);

    let out = match &opts.out {
        Some(o) => o.clone(),
        None => opts.root.join("bench/results").join(format!(
            "{}-{}{}",
            date_string(machine_start.timestamp),
            machine_start.hostname,
            if opts.quick { "-quick" } else { "" }
        )),
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let durable_rows = durable_rows(&names, opts, &out);
    let svgs = write_data(&out, &m, &durable_rows)?;
    let mut settings = settings(opts, &plan, &m, &durable_rows);
    settings.push((
        "duration".to_string(),
        format!("{:.0} s", t0.elapsed().as_secs_f64()),
    ));
    let page = Page {
        title: format!(
            "Hayate compare: {} on {}{}",
            date_string(machine_start.timestamp),
            machine_start.hostname,
            if opts.quick { " (quick)" } else { "" }
        ),
        machine: html::machine_facts(&machine_start, &MachineInfo::current()),
        peers: peer_rows(&peers, &m),
        settings,
        thr: m.thr.clone(),
        lat: m.lat.clone(),
        rpc: m.rpc.clone(),
        durable: durable_rows.clone(),
        fanout: m.fanout.clone(),
        charts: svgs,
    };
    write_page(&page, &out, &opts.root)?;
    Ok(CompareResult {
        out,
        thr: m.thr,
        lat: m.lat,
        rpc: m.rpc,
        durable: durable_rows,
        fanout: m.fanout,
    })
}

/// Installs and starts every peer named; one that cannot be is kept, marked skipped.
fn start_peers(
    names: &[String],
    opts: &CompareOptions,
    cleanup: &Cleanup,
) -> anyhow::Result<Vec<Peer>> {
    let mut peers = Vec::new();
    let mut started = Vec::new();
    for name in names {
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
    Ok(peers)
}

/// Whether peer `n` is among `peers` and was not skipped.
fn active(peers: &[Peer], n: &str) -> bool {
    peers
        .iter()
        .any(|p| p.spec.name == n && p.skipped.is_none())
}

/// The settings of each measurement of a run, from the peers started.
struct Plan {
    quick: bool,
    payloads: Vec<usize>,
    thr: ThrOptions,
    lat: LatOptions,
    rpc: crate::RpcOptions,
    fanout: crate::FanoutOptions,
}

impl Plan {
    fn new(peers: &[Peer], quick: bool, hayate_exe: &Path) -> Plan {
        let targets = |keep: &dyn Fn(&Peer) -> bool| -> Vec<Target> {
            peers
                .iter()
                .filter(|p| keep(p))
                .filter_map(|p| p.target.clone())
                .collect()
        };
        let rpc_targets = targets(&|p| !p.spec.pubsub_only);
        // The fan-out: systems whose subscribers can run as processes of their own here.
        let fanout_targets = targets(&|p| {
            matches!(
                p.spec.name,
                "hayate-shm"
                    | "hayate-p2p"
                    | "hayate"
                    | "hayate-broker-shm"
                    | "nats"
                    | "zenoh"
                    | "zenoh-p2p"
                    | "mosquitto"
            )
        });
        let targets = targets(&|p| !p.spec.rpc_only);
        let payloads: Vec<usize> = if quick {
            vec![8, 64, 1024, 16 << 10, 256 << 10, 4 << 20]
        } else {
            crate::default_sweep()
        };
        let warmup = Duration::from_millis(if quick { 500 } else { 1000 });
        Plan {
            quick,
            thr: ThrOptions {
                targets: targets.clone(),
                include_baseline: true,
                payloads: payloads.clone(),
                duration: Duration::from_secs(if quick { 1 } else { 3 }),
                warmup,
                samples: 10,
            },
            lat: LatOptions {
                targets,
                include_baseline: true,
                payload: 64,
                duration: Duration::from_secs(if quick { 1 } else { 2 }),
                warmup,
                runs: if quick { 3 } else { 5 },
                own_threads: false,
            },
            // RPC at concurrency 1 for every target: three runs per system in a rotating
            // order (a single pass favours whoever runs second on this kind of machine),
            // medians reported.
            rpc: crate::RpcOptions {
                targets: rpc_targets,
                points: vec![crate::RpcPoint {
                    calls: if quick { 5_000 } else { 32_000 },
                    concurrency: 1,
                }],
                runs: 3,
                max_time: Duration::from_secs(if quick { 10 } else { 60 }),
                call_timeout: Duration::from_secs(10),
                // As rpc-bench: each point's server is a child process (`hayate bench
                // rpc-server`).
                server: crate::ServerPlacement::Child(hayate_exe.to_path_buf()),
                // The floor of a brokered call here: a relay process that only copies bytes.
                include_baseline: true,
            },
            fanout: crate::FanoutOptions {
                targets: fanout_targets,
                subscribers: if quick {
                    vec![1, 5, 20]
                } else {
                    vec![1, 2, 5, 10, 20]
                },
                payloads: vec![1024],
                duration: Duration::from_secs(if quick { 1 } else { 3 }),
                warmup,
                exe: hayate_exe.to_path_buf(),
                ddsperf: active(peers, "ddsperf"),
                touch: false,
            },
            payloads,
        }
    }

    /// Calls per RPC point.
    fn calls(&self) -> u64 {
        self.rpc.points.first().map_or(0, |p| p.calls)
    }
}

/// The figures of a run's measurements.
struct Measured {
    thr: Vec<Record>,
    lat: Vec<Record>,
    rpc: Vec<Record>,
    fanout: Vec<Record>,
    /// iperf3 over loopback, when it ran.
    iperf_bps: Option<f64>,
}

/// The harness's own measurements: the throughput sweep, the latency, RPC and the fan-out.
fn measure(plan: &Plan) -> anyhow::Result<Measured> {
    println!(
        "compare: throughput sweep ({} payloads, {} targets + tcp baseline and relay floor)",
        plan.payloads.len(),
        plan.thr.targets.len()
    );
    let thr = crate::thr(&plan.thr)?;
    println!("compare: latency (64 B, {} runs)", plan.lat.runs);
    let lat = crate::lat(&plan.lat)?;
    println!(
        "compare: rpc ({} calls at concurrency 1, 3 rotated runs, at most {} s each)",
        plan.calls(),
        plan.rpc.max_time.as_secs()
    );
    let rpc = crate::rpc(&plan.rpc)?;
    let fanout = if plan.fanout.targets.is_empty() {
        Vec::new()
    } else {
        println!(
            "compare: fan-out (1 KiB, {:?} subscriber processes, {} targets)",
            plan.fanout.subscribers,
            plan.fanout.targets.len()
        );
        crate::fanout(&plan.fanout)?
    };
    Ok(Measured {
        thr,
        lat,
        rpc,
        fanout,
        iperf_bps: None,
    })
}

/// The other tools' measurements, when their peers are active: iperf3 over loopback (the
/// ideal line, a throughput record per payload) and Cyclone DDS' `ddsperf`.
fn measure_tools(peers: &mut [Peer], plan: &Plan, opts: &CompareOptions, m: &mut Measured) {
    let quick = plan.quick;
    if active(peers, "iperf3") {
        let secs = if quick { 3 } else { 10 };
        println!("compare: iperf3 over loopback ({secs} s)");
        let path = script_path(&opts.root, "iperf3");
        match iperf3(&path, secs) {
            Ok(bps) => {
                m.iperf_bps = Some(bps);
                for &p in &plan.payloads {
                    let mut r = Record::new("iperf3", "ideal", "thr", p);
                    r.client = "iperf3".into();
                    r.bits_per_sec = Some(bps);
                    r.samples = 1;
                    m.thr.push(r);
                }
            }
            Err(e) => {
                println!("compare: iperf3 failed: {e:#}");
                mark_skipped(peers, "iperf3", format!("run failed: {e:#}"));
            }
        }
    }
    if active(peers, "ddsperf") {
        let version = peers
            .iter()
            .find(|p| p.spec.name == "ddsperf")
            .map(|p| p.version.clone())
            .unwrap_or_default();
        println!("compare: Cyclone DDS ddsperf");
        let secs = if quick { 2 } else { 4 };
        for &p in &plan.payloads {
            m.thr.push(ddsperf_thr(p, secs, &version));
        }
        m.lat.push(ddsperf_lat(if quick { 3 } else { 6 }, &version));
    }
}

/// Durable publishing, with every other server stopped: Hayate's streams and Kafka, each
/// starting its own server (when `hayate` is among the peers; a failure is reported, not
/// fatal).
fn durable_rows(names: &[String], opts: &CompareOptions, out: &Path) -> Vec<Record> {
    if !names.iter().any(|n| n == "hayate") {
        return Vec::new();
    }
    // Kafka's durable figures come from its own Java tool: no driver needed, only the peer
    // asked for (the script installs and starts it).
    let kafka = names.iter().any(|n| n == "kafka");
    println!(
        "compare: durable publishing (Hayate streams{})",
        if kafka { " and Kafka" } else { "" }
    );
    match durable(
        &opts.root,
        &opts.hayate_exe,
        &out.join("durable"),
        kafka,
        opts.quick,
    ) {
        Ok(r) => r,
        Err(e) => {
            println!("compare: durable publishing failed: {e:#}");
            Vec::new()
        }
    }
}

/// Writes the data (JSON per test, one CSV) and the charts into `out`; the charts as (file
/// name, SVG text) for the page.
fn write_data(
    out: &Path,
    m: &Measured,
    durable_rows: &[Record],
) -> anyhow::Result<Vec<(String, String)>> {
    crate::write_json(&out.join("thr.json"), &m.thr)?;
    crate::write_json(&out.join("lat.json"), &m.lat)?;
    crate::write_json(&out.join("rpc.json"), &m.rpc)?;
    crate::write_json(&out.join("durable.json"), durable_rows)?;
    crate::write_json(&out.join("fanout.json"), &m.fanout)?;
    let all: Vec<Record> = m
        .thr
        .iter()
        .chain(&m.lat)
        .chain(&m.rpc)
        .chain(durable_rows)
        .chain(&m.fanout)
        .cloned()
        .collect();
    crate::write_csv(&out.join("results.csv"), &all)?;
    let mut charts = Vec::new();
    for (name, records) in [
        ("thr", &m.thr),
        ("lat", &m.lat),
        ("rpc", &m.rpc),
        ("fanout", &m.fanout),
    ] {
        charts.extend(crate::write_charts(&out.join(name), records)?);
    }
    let mut svgs = Vec::new();
    for f in &charts {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        svgs.push((name, std::fs::read_to_string(f)?));
    }
    Ok(svgs)
}

/// The "Settings of the run" of the page: the command and how each test was measured.
fn settings(
    opts: &CompareOptions,
    plan: &Plan,
    m: &Measured,
    durable_rows: &[Record],
) -> Vec<(String, String)> {
    let quick = plan.quick;
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
                 dropping samples beyond the 1st/99th percentiles; targets interleaved per \
                 payload, then raw TCP and the relay floor (publisher -> a thread copying bytes \
                 -> subscriber), to which every system's msg/s is also given as a share",
                plan.payloads
                    .iter()
                    .map(|p| format_size(*p))
                    .collect::<Vec<_>>()
                    .join(", "),
                plan.thr.warmup.as_secs_f64(),
                plan.thr.duration.as_secs_f64(),
                plan.thr.samples
            ),
        ),
        (
            "latency".to_string(),
            format!(
                "64 B ping-pong, one message in flight; {} runs of {} s (rotating order), \
                 median of each percentile over the runs; HDR histogram of half round trips",
                plan.lat.runs,
                plan.lat.duration.as_secs_f64()
            ),
        ),
        (
            "rpc".to_string(),
            format!(
                "{} sequential requests (concurrency 1; a run stops after {} s, the calls \
                 made so far count): the client sends a number, the server adds 1, every \
                 reply is checked; the server runs in a child process (`hayate bench \
                 rpc-server`), the callers in the benchmark's; 3 rotated runs, medians. Each \
                 system's own request/reply (see the client column)",
                plan.calls(),
                plan.rpc.max_time.as_secs()
            ),
        ),
    ];
    if !m.fanout.is_empty() {
        settings.push((
            "fan-out".to_string(),
            format!(
                "1 KiB; one publisher in the bench process, N subscribers each in a process of \
                 its own (`hayate bench fanout-sub`), N in {:?}; {} s warm-up, then each \
                 subscriber counts for {} s; the sum of their rates",
                plan.fanout.subscribers,
                plan.fanout.warmup.as_secs_f64(),
                plan.fanout.duration.as_secs_f64()
            ),
        ));
    }
    if !durable_rows.is_empty() {
        settings.push((
            "durable".to_string(),
            format!(
                "bench/durable-vs-kafka.sh (raw outputs in durable/): Hayate `bench durable`, \
                 one connection, 1024 confirms outstanding for {} s, then 2000 messages one at a \
                 time for the confirm latency; Kafka 4.1 KRaft, 1 partition, its own \
                 ProducerPerformance at full speed ({} records), latency at 500 records/s",
                if quick { 2 } else { 5 },
                if quick {
                    "600k / 200k / 6k"
                } else {
                    "3M / 1M / 30k"
                }
            ),
        ));
    }
    if let Some(bps) = m.iperf_bps {
        settings.push((
            "iperf3".to_string(),
            format!("{} over loopback", crate::format_bits(bps)),
        ));
    }
    settings
}

/// The page's line of each peer: version, client library (from its first record), settings,
/// status.
fn peer_rows(peers: &[Peer], m: &Measured) -> Vec<PeerRow> {
    peers
        .iter()
        .map(|p| PeerRow {
            name: p.spec.name.to_string(),
            version: p.version.clone(),
            client: m
                .thr
                .iter()
                .chain(&m.lat)
                .find(|r| r.system == p.spec.name && !r.client.is_empty())
                .map(|r| r.client.clone())
                .unwrap_or_default(),
            settings: p.spec.settings.to_string(),
            skipped: p.skipped.clone(),
        })
        .collect()
}

/// Writes `out/index.html`, then its screenshot `out/report.png` where chromium is installed.
fn write_page(page: &Page, out: &Path, root: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("index.html"), html::render(page))?;
    println!("compare: wrote {}", out.join("index.html").display());
    let shot = root.join("bench/screenshot.sh");
    if shot.exists() && which("chromium") {
        match run_script(&shot, &[out.display().to_string()]) {
            Ok(_) => println!("compare: wrote {}", out.join("report.png").display()),
            Err(e) => println!("compare: screenshot failed: {e:#}"),
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::iperf::parse_bits_per_second;

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
}
