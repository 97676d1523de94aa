//! The durable rows of `compare`: publishing with a confirm that the message is stored, Hayate
//! streams (fsync `always` with group commit, and `interval=100`) against Kafka (acks=1 with
//! its default flush policy, and with `flush.messages=1`), 64 B, 1 KiB and 64 KiB, through
//! `bench/durable-vs-kafka.sh` (each system measured by its own tool: `hayate bench durable`,
//! Kafka's `ProducerPerformance`). Run after the live measurements, with every other server
//! stopped.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::Record;

/// Runs the script into `out` and returns the records (test `"durable"`). `kafka`: measure
/// Kafka too. `quick`: 2 s per Hayate point, a fifth of Kafka's records.
pub(super) fn durable(
    root: &Path,
    hayate_exe: &Path,
    out: &Path,
    kafka: bool,
    quick: bool,
) -> anyhow::Result<Vec<Record>> {
    let script = root.join("bench/durable-vs-kafka.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(out)
        .env("HAYATE_BIN", hayate_exe)
        .env("DURATION", if quick { "2s" } else { "5s" })
        .env("KAFKA_SCALE", if quick { "5" } else { "1" })
        .env("SKIP_KAFKA", if kafka { "0" } else { "1" })
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    let mut records = hayate_records(
        &std::fs::read_to_string(out.join("hayate.jsonl")).context("hayate.jsonl")?,
    )?;
    if kafka {
        let text = std::fs::read_to_string(out.join("kafka.txt")).context("kafka.txt")?;
        records.extend(kafka_records(&text));
    }
    Ok(records)
}

#[derive(serde::Deserialize)]
struct Point {
    fsync: String,
    payload: usize,
    window: usize,
    confirmed_per_sec: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    lat_samples: usize,
}

fn hayate_records(jsonl: &str) -> anyhow::Result<Vec<Record>> {
    let mut out = Vec::new();
    for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
        let p: Point = serde_json::from_str(line).context("a hayate.jsonl line")?;
        let mut r = Record::new(
            "hayate",
            &format!("fsync {}", p.fsync),
            "durable",
            p.payload,
        );
        r.client = format!("hayate-client, {} confirms outstanding", p.window);
        r.msgs_per_sec = Some(p.confirmed_per_sec);
        r.bits_per_sec = Some(p.confirmed_per_sec * p.payload as f64 * 8.0);
        r.p50_us = Some(p.lat_p50_us);
        r.p99_us = Some(p.lat_p99_us);
        r.samples = p.lat_samples;
        out.push(r);
    }
    Ok(out)
}

/// Parses the script's Kafka lines: `kafka MODE SIZE B  throughput: <ProducerPerformance
/// summary>` and the same with `latency@500/s:`; a point is one throughput line and its
/// latency line.
fn kafka_records(text: &str) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let (Some("kafka"), Some(mode), Some(size)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Ok(size) = size.parse::<usize>() else {
            continue;
        };
        let mode = match mode {
            "default" => "acks=1",
            "flush1" => "acks=1 flush.messages=1",
            _ => continue,
        };
        let Some((kind, summary)) = line.split_once(": ") else {
            continue;
        };
        let i = match out
            .iter()
            .position(|r| r.mode == mode && r.payload_bytes == size)
        {
            Some(i) => i,
            None => {
                let mut r = Record::new("kafka", mode, "durable", size);
                r.client = "ProducerPerformance (Java client)".into();
                out.push(r);
                out.len() - 1
            }
        };
        let r = &mut out[i];
        if kind.ends_with("throughput") {
            if let Some(rate) = number_before(summary, " records/sec") {
                r.msgs_per_sec = Some(rate);
                r.bits_per_sec = Some(rate * size as f64 * 8.0);
            }
        } else if kind.ends_with("latency@500/s") {
            r.p50_us = number_before(summary, " ms 50th").map(|ms| ms * 1e3);
            r.p99_us = number_before(summary, " ms 99th").map(|ms| ms * 1e3);
            r.samples = number_before(summary, " records sent").map_or(0, |n| n as usize);
        }
    }
    for r in &mut out {
        if r.msgs_per_sec.is_none() {
            r.error = Some("no ProducerPerformance figures".into());
        }
    }
    out
}

/// The number that ends right before `marker` in `s`.
fn number_before(s: &str, marker: &str) -> Option<f64> {
    let end = s.find(marker)?;
    let head = &s[..end];
    let start = head
        .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or(0, |i| i + 1);
    head[start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_tools() {
        let k = "kafka default      64 B  throughput: 3000000 records sent, 471920.7 records/sec (28.80 MB/sec), 561.21 ms avg latency, 897.00 ms max latency, 559 ms 50th, 826 ms 95th, 881 ms 99th, 896 ms 99.9th.\n\
kafka default      64 B  latency@500/s: 5000 records sent, 499.4 records/sec (0.03 MB/sec), 3.76 ms avg latency, 196.00 ms max latency, 3 ms 50th, 6 ms 95th, 22 ms 99th, 24 ms 99.9th.\n\
kafka flush1     1024 B  throughput: 1000000 records sent, 30433.1 records/sec (29.72 MB/sec), 983.52 ms avg latency, 1524.00 ms max latency, 964 ms 50th, 1349 ms 95th, 1422 ms 99th, 1493 ms 99.9th.\n\
kafka 4.1.0\n";
        let r = kafka_records(k);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].mode.as_str(), r[0].payload_bytes), ("acks=1", 64));
        assert_eq!(r[0].msgs_per_sec, Some(471920.7));
        assert_eq!((r[0].p50_us, r[0].p99_us), (Some(3000.0), Some(22000.0)));
        assert_eq!(r[0].samples, 5000);
        assert_eq!(r[1].mode, "acks=1 flush.messages=1");
        assert_eq!(r[1].msgs_per_sec, Some(30433.1));
        assert_eq!(r[1].p50_us, None);
        let h = hayate_records(
            r#"{"fsync":"always","payload":64,"window":1024,"confirmed_per_sec":328794.9,"mb_per_sec":21.0,"lat_p50_us":262.0,"lat_p99_us":395.8,"lat_samples":2000}"#,
        )
        .unwrap();
        assert_eq!(h[0].label(), "hayate (fsync always)");
        assert_eq!(h[0].msgs_per_sec, Some(328794.9));
        assert_eq!(h[0].p50_us, Some(262.0));
    }
}
