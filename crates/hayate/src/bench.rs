//! `hayate bench`: command-line front of the hayate-bench crate.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use hayate_bench::{LatOptions, Record, Target, ThrOptions};

use crate::cli::{DEFAULT_SERVER, parse_duration};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Test {
    /// Throughput: one publisher back-to-back, one subscriber counting (payload sweep).
    Thr,
    /// Latency: ping-pong with one message in flight; half round trip percentiles.
    Lat,
    /// The raw TCP limit of the same path (throughput and latency), no broker.
    Baseline,
    /// Hayate and its peers side by side: starts each peer (bench/peers/*.sh), runs the
    /// throughput sweep, the 64 B latency, RPC, iperf3 and ddsperf, writes data, charts and an
    /// HTML report to bench/results/<date>-<host>[-quick]/.
    Compare,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// What to measure.
    pub(crate) test: Test,
    /// Hayate broker to measure (`HOST:PORT`), when no --target is given.
    #[arg(long, env = "HAYATE_SERVER", default_value = DEFAULT_SERVER)]
    pub(crate) server: String,
    /// Systems to measure, as URLs: `hayate://HOST:PORT`, `nats://HOST:PORT`; with the
    /// `peers` build feature also `mqtt://`, `amqp://`, `zmq://`, `kafka://`; `?name=LABEL`
    /// names the system in the results. Repeatable: every target is measured in the same
    /// run, interleaved per payload size.
    #[arg(long, value_name = "URL")]
    pub(crate) target: Vec<String>,
    /// Also measure the raw TCP baseline in the same run (thr and lat).
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
    /// Latency: repeat the measurement this many times, rotating the order of the systems,
    /// and report the median of each percentile over the runs.
    #[arg(long, default_value_t = 1)]
    pub(crate) runs: usize,
    /// Write one JSON record per point to this file, and SVG charts beside it.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
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

pub(crate) async fn run(a: BenchArgs) -> Result<()> {
    if a.test == Test::Compare {
        return compare(a).await;
    }
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
    };
    let records: Vec<Record> = tokio::task::block_in_place(|| -> Result<Vec<Record>> {
        Ok(match a.test {
            Test::Thr => hayate_bench::thr(&thr_opts(targets, a.baseline))?,
            Test::Lat => hayate_bench::lat(&lat_opts(targets, a.baseline))?,
            Test::Baseline | Test::Compare => {
                let mut r = hayate_bench::baseline_thr(&thr_opts(Vec::new(), true))?;
                r.extend(hayate_bench::baseline_lat(&lat_opts(Vec::new(), true))?);
                r
            }
        })
    })?;
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
