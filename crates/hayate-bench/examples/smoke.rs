//! A quick run without the CLI:
//! `cargo run --release -p hayate-bench --example smoke -- thr|lat URL[,URL..]|- SIZES SECS [PREFIX]`
//! (`-` for no target: baseline only). Prints the table; writes PREFIX.json and charts if given.

use std::path::PathBuf;
use std::time::Duration;

use hayate_bench::{LatOptions, Target, ThrOptions, lat, parse_sizes, thr};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let targets = match arg(1, "-").as_str() {
        "-" => Vec::new(),
        list => list
            .split(',')
            .map(Target::parse)
            .collect::<anyhow::Result<_>>()?,
    };
    let duration = Duration::from_secs_f64(arg(3, "2").parse()?);
    let records = if arg(0, "thr") == "lat" {
        lat(&LatOptions {
            targets,
            include_baseline: true,
            payload: parse_sizes(&arg(2, "64"))?[0],
            duration,
            ..LatOptions::default()
        })?
    } else {
        thr(&ThrOptions {
            targets,
            include_baseline: true,
            payloads: parse_sizes(&arg(2, "8,1KiB,64KiB"))?,
            duration,
            ..ThrOptions::default()
        })?
    };
    hayate_bench::print_table(&records);
    if let Some(prefix) = args.get(4).map(PathBuf::from) {
        hayate_bench::write_json(&prefix.with_extension("json"), &records)?;
        for f in hayate_bench::write_charts(&prefix, &records)? {
            println!("wrote {}", f.display());
        }
    }
    Ok(())
}
