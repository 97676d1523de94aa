//! `hayate bench`: command-line front of the hayate-bench crate.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use hayate_bench::{LatOptions, Record, Target, ThrOptions};

use crate::cli::{DEFAULT_SERVER, parse_duration};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Test {
    /// Throughput: one publisher back-to-back, one subscriber counting (payload sweep).
    Thr,
    /// Latency: ping-pong with one message in flight; half round trip percentiles.
    Lat,
    /// The raw TCP limit of the same path (throughput and latency), no broker; for throughput
    /// also its relay floor (publisher -> a thread that only copies bytes -> subscriber).
    Baseline,
    /// Request/reply by rpc-bench's method: the client sends a number, the server answers with
    /// the number plus one, every reply checked. Default points: 32k..512k calls at
    /// concurrency 1, then 10k calls at concurrency 4..64 (see --calls, --concurrency). Each
    /// point's server runs in a child process (see --server-in-process).
    Rpc,
    /// The serving side of one rpc point (run by `bench rpc` as a child process): serves
    /// --target under --prefix, prints one JSON line, serves until stdin closes.
    #[value(hide = true)]
    RpcServer,
    /// The relay (with --to ADDR) or the server of the rpc baseline (run by `bench rpc
    /// --baseline` as a child process): prints its address, serves until stdin closes.
    #[value(hide = true)]
    RpcRelay,
    /// Fan-out: one publisher, N subscribers in N processes of their own on this host, the
    /// aggregate throughput (see --subscribers; default payload 1 KiB). For Hayate's peer
    /// mode the subscribers are nodes linking to the publisher's (over shared memory with
    /// `shm=require`, TCP with `shm=off`).
    Fanout,
    /// A subscriber process of a fanout point (run by `bench fanout`).
    #[value(hide = true)]
    FanoutSub,
    /// Hayate and its peers side by side: starts each peer (bench/peers/*.sh), runs the
    /// throughput sweep, the 64 B latency, RPC, iperf3 and ddsperf, writes data, charts and an
    /// HTML report to bench/results/<date>-<host>[-quick]/.
    Compare,
    /// Durable publishing: confirmed messages/s with --window confirms outstanding, and the
    /// confirm latency of one message at a time, per --fsync policy and payload (a stream per
    /// point; the broker needs a data directory).
    Durable,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// What to measure.
    pub(crate) test: Test,
    /// Hayate broker to measure (`HOST:PORT`), when no --target is given.
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    /// Systems to measure, as URLs: `hayate://HOST:PORT`, `nats://HOST:PORT`,
    /// `stomp://HOST:PORT`, `mqtt://HOST:PORT`; with the `peers` build feature also `amqp://`,
    /// `zmq://`, `kafka://`, `zenoh://` (`?mode=peer` for brokerless) and, for rpc only,
    /// `grpc://` (a tonic server started by the benchmark; port 0 = a free port);
    /// `?name=LABEL` names the system in the results. Repeatable: every target is measured in
    /// the same run, interleaved per point.
    #[arg(long, value_name = "URL")]
    pub(crate) target: Vec<String>,
    /// Also measure the raw TCP baseline in the same run: thr and lat over one connection;
    /// thr also through a relay thread that only copies bytes from the publisher's connection
    /// to the subscriber's (the floor of any brokered path on this host: system `tcp`, mode
    /// `relay`; the table then gives every system's msg/s as a share of it); rpc through a
    /// relay process that only copies bytes, to a server process (the floor of a brokered
    /// call on this host: system `tcp`, mode `relay`).
    #[arg(long)]
    pub(crate) baseline: bool,
    /// Payload sizes: `64,1KiB,64KiB` or a doubling range `8..64MiB`. Default: 8 B to 64 MiB
    /// (thr), 64 B (lat).
    #[arg(long)]
    pub(crate) payload: Option<String>,
    /// Measuring time per point (e.g. `5s`).
    #[arg(long, default_value = "5s")]
    pub(crate) duration: String,
    /// Warm-up per point.
    #[arg(long, default_value = "1s")]
    pub(crate) warmup: String,
    /// Samples per throughput point (the median is reported after dropping those beyond the
    /// 1st/99th percentiles).
    #[arg(long, default_value_t = 10)]
    pub(crate) samples: usize,
    /// Latency and RPC: repeat the measurement this many times, rotating the order of the
    /// systems, and report the median of each figure over the runs.
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: usize,
    /// Write one JSON record per point to this file, and SVG charts beside it.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// rpc: total calls of the concurrency-1 points, comma-separated (`32k,64k` or plain
    /// numbers). Default 32k,64k,128k,256k,512k.
    #[arg(long, value_name = "LIST")]
    pub(crate) calls: Option<String>,
    /// rpc: concurrencies measured with --concurrent-calls calls each, comma-separated.
    /// Default 4,8,16,32,64; `none` for none.
    #[arg(long, value_name = "LIST")]
    pub(crate) concurrency: Option<String>,
    /// rpc: total calls of each point with concurrency above 1.
    #[arg(long, default_value = "10k")]
    pub(crate) concurrent_calls: String,
    /// rpc: a point stops after this long; the calls made so far count.
    #[arg(long, default_value = "120s")]
    pub(crate) max_time: String,
    /// rpc: run each point's server in this process, on the callers' runtime (the method
    /// before; recorded as "server in-process"). By default it runs in a child process
    /// (this executable), as rpc-bench runs its server as a program of its own.
    #[arg(long)]
    pub(crate) server_in_process: bool,
    /// rpc-server: the key prefix of the point (given by `bench rpc`); fanout-sub: the key.
    #[arg(long, hide = true)]
    pub(crate) prefix: Option<String>,
    /// rpc-relay: the address to relay to (given by `bench rpc --baseline`).
    #[arg(long, hide = true)]
    pub(crate) to: Option<String>,
    /// fanout: the numbers of subscriber processes, comma-separated (default 1,2,5,10,20).
    #[arg(long, value_name = "LIST", default_value = "1,2,5,10,20")]
    pub(crate) subscribers: String,
    /// fanout: each subscriber reads every byte of every payload (sums it), as an
    /// application that uses its data does; by default it only counts messages.
    #[arg(long)]
    pub(crate) touch: bool,
    /// lat: each side (pinger, echo) on a thread of its own with a single-threaded runtime,
    /// as two single-threaded processes (and the raw TCP baseline's two blocking threads)
    /// are. By default both share one multi-threaded runtime and the pinger runs on the
    /// calling thread, so each pong crosses from a worker thread to it.
    #[arg(long)]
    pub(crate) own_threads: bool,
    /// fanout: also measure Cyclone DDS (`ddsperf sub` processes and one `ddsperf pub`;
    /// bench/peers/cyclonedds.sh install), as system `cyclonedds`.
    #[arg(long)]
    pub(crate) ddsperf: bool,
    /// compare: peers to run, comma-separated (default: all of them; those whose driver is
    /// not compiled in or whose install fails are reported as skipped).
    #[arg(long, value_name = "LIST")]
    pub(crate) peers: Option<String>,
    /// compare: the quick run (6 payloads, 1 s per point, 3 latency runs).
    #[arg(long)]
    pub(crate) quick: bool,
    /// compare: output directory (default bench/results/<date>-<host>[-quick]).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// thr, lat: measure durable publishing instead (as `bench durable`: confirmed messages
    /// per second for thr, confirm latency for lat), per --fsync policy.
    #[arg(long)]
    pub(crate) durable: bool,
    /// durable: fsync policies measured, comma-separated.
    #[arg(long, default_value = "always,interval=100")]
    pub(crate) fsync: String,
    /// durable: confirms outstanding during the throughput part.
    #[arg(long, default_value_t = 1024)]
    pub(crate) window: usize,
    /// durable: messages sent one at a time for the latency part.
    #[arg(long, default_value_t = 2000)]
    pub(crate) lat_samples: usize,
    /// durable: instead, fill a stream with this much (e.g. `10GiB`, messages of the first
    /// --payload size, default 64 KiB) and measure a durable consumer reading it all.
    #[arg(long, value_name = "SIZE")]
    pub(crate) catchup: Option<String>,
}

/// The repository root: the first ancestor of the working directory (then of the executable)
/// that holds `bench/peers`.
fn repo_root() -> Result<PathBuf> {
    let mut starts = vec![std::env::current_dir()?];
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    for s in starts {
        if let Some(r) = s.ancestors().find(|d| d.join("bench/peers").is_dir()) {
            return Ok(r.to_path_buf());
        }
    }
    bail!("bench/peers not found above the working directory: run from the Hayate repository")
}

async fn compare(a: BenchArgs) -> Result<()> {
    let opts = hayate_bench::CompareOptions {
        peers: a.peers.as_deref().map(|p| {
            p.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        }),
        quick: a.quick,
        out: a.out,
        root: repo_root()?,
        hayate_exe: std::env::current_exe()?,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let cleanup = hayate_bench::Cleanup::default();
    let c = cleanup.clone();
    let job = tokio::task::spawn_blocking(move || hayate_bench::compare(&opts, &c));
    tokio::select! {
        r = job => {
            let r = r??;
            println!("results in {}", r.out.display());
            Ok(())
        }
        _ = tokio::signal::ctrl_c() => {
            eprintln!("interrupted: stopping the peers");
            tokio::task::spawn_blocking(move || cleanup.stop_all()).await?;
            std::process::exit(130);
        }
    }
}

/// `32k` -> 32000, `1m` -> 1000000, `500` -> 500.
fn parse_count(s: &str) -> Result<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = s.strip_suffix('k') {
        (n, 1_000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 1_000_000)
    } else {
        (s.as_str(), 1)
    };
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad count {s:?} (expected e.g. 500, 32k, 1m)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        _ => bail!("bad count {s:?}: must be between 1 and 2^64"),
    }
}

fn parse_list<T>(s: &str, f: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(f)
        .collect()
}

fn rpc_points(a: &BenchArgs) -> Result<Vec<hayate_bench::RpcPoint>> {
    let defaults = hayate_bench::default_rpc_points();
    let mut points = match &a.calls {
        Some(c) => parse_list(c, parse_count)?
            .into_iter()
            .map(|calls| hayate_bench::RpcPoint {
                calls,
                concurrency: 1,
            })
            .collect(),
        None => defaults
            .iter()
            .filter(|p| p.concurrency == 1)
            .copied()
            .collect::<Vec<_>>(),
    };
    let calls = parse_count(&a.concurrent_calls)?;
    let conc: Vec<usize> = match a.concurrency.as_deref() {
        Some("none") => Vec::new(),
        Some(c) => parse_list(c, |x| {
            let n: usize = x
                .parse()
                .map_err(|_| anyhow::anyhow!("bad concurrency {x:?}"))?;
            if n == 0 || n > 4096 {
                bail!("concurrency must be 1..4096, not {n}");
            }
            Ok(n)
        })?,
        None => defaults
            .iter()
            .filter(|p| p.concurrency > 1)
            .map(|p| p.concurrency)
            .collect(),
    };
    points.extend(
        conc.into_iter()
            .map(|concurrency| hayate_bench::RpcPoint { calls, concurrency }),
    );
    Ok(points)
}

/// `bench rpc-server --target URL --prefix PREFIX`: the child process of one rpc point.
fn rpc_server(a: &BenchArgs) -> Result<()> {
    let [target] = a.target.as_slice() else {
        bail!("rpc-server: exactly one --target");
    };
    let target = Target::parse(target)?;
    let Some(prefix) = a.prefix.as_deref() else {
        bail!("rpc-server: --prefix is required");
    };
    tokio::task::block_in_place(|| hayate_bench::serve_rpc_point(&target, prefix))
}

pub(crate) async fn run(a: BenchArgs) -> Result<()> {
    if a.test == Test::Compare {
        return compare(a).await;
    }
    if a.test == Test::RpcServer {
        return rpc_server(&a);
    }
    if a.test == Test::RpcRelay {
        return tokio::task::block_in_place(|| hayate_bench::serve_relay(a.to.as_deref()));
    }
    if a.test == Test::FanoutSub {
        return fanout_sub(&a);
    }
    let mut a = a;
    if a.durable && matches!(a.test, Test::Thr | Test::Lat) {
        // `thr --durable` and `lat --durable`: the durable benchmark measures both.
        a.test = Test::Durable;
    }
    if a.test == Test::Durable {
        return durable(&a).await;
    }
    let records = measure(&a)?;
    hayate_bench::print_table(&records);
    if let Some(path) = &a.json {
        hayate_bench::write_json(path, &records)?;
        println!("wrote {}", path.display());
        for f in hayate_bench::write_charts(&path.with_extension(""), &records)? {
            println!("wrote {}", f.display());
        }
    }
    Ok(())
}

/// `bench fanout-sub --target URL --prefix KEY`: a subscriber process of a fanout point.
fn fanout_sub(a: &BenchArgs) -> Result<()> {
    let [target] = a.target.as_slice() else {
        bail!("fanout-sub: exactly one --target");
    };
    let target = Target::parse(target)?;
    let key = a
        .prefix
        .as_deref()
        .context("fanout-sub: --prefix is required")?;
    let payload = match a.payload.as_deref() {
        Some(p) => *hayate_bench::parse_sizes(p)?.first().context("--payload")?,
        None => 1024,
    };
    tokio::task::block_in_place(|| hayate_bench::fanout_sub(&target, key, payload, a.touch))
}

/// `bench durable` (and `thr --durable`, `lat --durable`): confirmed publishing per
/// --fsync policy and payload, or with --catchup a durable consumer reading a filled stream.
async fn durable(a: &BenchArgs) -> Result<()> {
    let payloads = match a.payload.as_deref() {
        Some(p) => hayate_bench::parse_sizes(p)?,
        None => vec![64, 1024, 65536],
    };
    let policies: Vec<String> = a
        .fsync
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let server = a
        .server
        .strip_prefix("hayate://")
        .unwrap_or(&a.server)
        .to_owned();
    if let Some(total) = &a.catchup {
        return catchup(a, &server, total).await;
    }
    let points = crate::durable::run(
        &server,
        &policies,
        &payloads,
        a.window.max(1),
        parse_duration(&a.duration)?,
        a.lat_samples,
    )
    .await?;
    if let Some(path) = &a.json {
        let mut out = String::new();
        for p in &points {
            out.push_str(&serde_json::to_string(p)?);
            out.push('\n');
        }
        std::fs::write(path, out)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// `bench durable --catchup SIZE`: fills a stream with `total` and measures a durable
/// consumer reading it all.
async fn catchup(a: &BenchArgs, server: &str, total: &str) -> Result<()> {
    let total = *hayate_bench::parse_sizes(total)?
        .first()
        .ok_or_else(|| anyhow::anyhow!("--catchup SIZE"))?;
    let payload = a
        .payload
        .as_deref()
        .map(hayate_bench::parse_sizes)
        .transpose()?
        .and_then(|v| v.first().copied())
        .unwrap_or(65536);
    let r = crate::durable::catchup(server, total as u64, payload, a.window.max(1)).await?;
    println!(
        "catch-up: {} messages, {:.1} MB read by a durable consumer in {:.2} s: {:.0} MB/s (stream {} left for comparison)",
        r.messages,
        r.bytes as f64 / 1e6,
        r.read_secs,
        r.read_mb_per_sec,
        r.stream
    );
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string(&r)? + "\n")?;
    }
    Ok(())
}

/// The targets measured: --target, or else the --server broker (none for `baseline`).
fn targets(a: &BenchArgs) -> Result<Vec<Target>> {
    let mut targets: Vec<Target> = a
        .target
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<_>>()?;
    if targets.is_empty() && a.test != Test::Baseline {
        let server = if a.server.contains("://") {
            a.server.clone()
        } else {
            format!("hayate://{}", a.server)
        };
        targets.push(Target::parse(&server)?);
    }
    Ok(targets)
}

/// thr, lat, rpc, fanout and baseline: the records of the run.
fn measure(a: &BenchArgs) -> Result<Vec<Record>> {
    let targets = targets(a)?;
    let duration = parse_duration(&a.duration)?;
    let warmup = parse_duration(&a.warmup)?;
    if duration < Duration::from_millis(10) {
        bail!("--duration must be at least 10ms");
    }
    let sizes = a
        .payload
        .as_deref()
        .map(hayate_bench::parse_sizes)
        .transpose()?;
    let thr_opts = |targets: Vec<Target>, include_baseline| ThrOptions {
        targets,
        include_baseline,
        payloads: sizes.clone().unwrap_or_else(hayate_bench::default_sweep),
        duration,
        warmup,
        samples: a.samples.max(1),
    };
    let lat_opts = |targets: Vec<Target>, include_baseline| LatOptions {
        targets,
        include_baseline,
        payload: sizes
            .as_ref()
            .and_then(|s| s.first().copied())
            .unwrap_or(64),
        duration,
        warmup,
        runs: a.runs.max(1),
        own_threads: a.own_threads,
    };
    tokio::task::block_in_place(|| -> Result<Vec<Record>> {
        Ok(match a.test {
            Test::Thr => hayate_bench::thr(&thr_opts(targets, a.baseline))?,
            Test::Lat => hayate_bench::lat(&lat_opts(targets, a.baseline))?,
            Test::Rpc => hayate_bench::rpc(&hayate_bench::RpcOptions {
                targets,
                points: rpc_points(a)?,
                runs: a.runs.max(1),
                max_time: parse_duration(&a.max_time)?,
                call_timeout: Duration::from_secs(10),
                server: if a.server_in_process {
                    hayate_bench::ServerPlacement::InProcess
                } else {
                    hayate_bench::ServerPlacement::Child(std::env::current_exe()?)
                },
                include_baseline: a.baseline,
            })?,
            Test::Fanout => hayate_bench::fanout(&hayate_bench::FanoutOptions {
                targets,
                subscribers: parse_list(&a.subscribers, |s| {
                    s.parse::<usize>()
                        .ok()
                        .filter(|n| (1..=256).contains(n))
                        .with_context(|| format!("--subscribers: {s:?} is not 1 to 256"))
                })?,
                payloads: sizes.clone().unwrap_or_else(|| vec![1024]),
                duration,
                warmup,
                exe: std::env::current_exe()?,
                ddsperf: a.ddsperf,
                touch: a.touch,
            })?,
            Test::Baseline
            | Test::Compare
            | Test::RpcServer
            | Test::RpcRelay
            | Test::FanoutSub
            | Test::Durable => {
                let mut r = hayate_bench::baseline_thr(&thr_opts(Vec::new(), true))?;
                r.extend(hayate_bench::baseline_lat(&lat_opts(Vec::new(), true))?);
                r
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_lists() {
        assert_eq!(parse_count("32k").unwrap(), 32_000);
        assert_eq!(parse_count("1M").unwrap(), 1_000_000);
        assert_eq!(parse_count(" 500 ").unwrap(), 500);
        assert!(parse_count("0").is_err());
        assert!(parse_count("x").is_err());
        assert!(parse_count("99999999999999999999k").is_err());
        assert_eq!(
            parse_list("4, 8,,16", |s| Ok(s.len())).unwrap(),
            vec![1, 1, 2]
        );
    }
}
