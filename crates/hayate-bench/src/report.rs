//! Reporting: an aligned table on stdout and JSON files.

use std::path::Path;

use anyhow::Context;

use crate::Record;
use crate::size::{format_bits, format_rate, format_size};

/// Prints the records as aligned tables (throughput, then latency) with the machine they ran
/// on. `ratio` compares each system with the first one measured at the same payload size.
pub fn print_table(records: &[Record]) {
    print!("{}", format_table(records));
}

/// The text [`print_table`] prints.
pub fn format_table(records: &[Record]) -> String {
    let mut out = String::new();
    if let Some(r) = records.first() {
        out.push_str(&format!(
            "machine: {}, {} cores, {}, load {:.2} {:.2} {:.2}\n",
            r.hostname, r.cores, r.cpu_model, r.loadavg[0], r.loadavg[1], r.loadavg[2]
        ));
    }
    let thr: Vec<&Record> = records.iter().filter(|r| r.test == "thr").collect();
    if !thr.is_empty() {
        out.push('\n');
        out.push_str(&thr_table(&thr));
    }
    let lat: Vec<&Record> = records.iter().filter(|r| r.test == "lat").collect();
    if !lat.is_empty() {
        out.push('\n');
        out.push_str(&lat_table(&lat));
    }
    let rpc: Vec<&Record> = records.iter().filter(|r| r.test == "rpc").collect();
    if !rpc.is_empty() {
        out.push('\n');
        out.push_str(&rpc_table(&rpc));
    }
    let fan: Vec<&Record> = records.iter().filter(|r| r.test == "fanout").collect();
    if !fan.is_empty() {
        out.push('\n');
        out.push_str(&fanout_table(&fan));
    }
    out
}

/// Fan-out: aggregate msg/s and bit/s of N subscriber processes; `ratio` compares the
/// aggregate with the first system's one subscriber at the same payload.
fn fanout_table(records: &[&Record]) -> String {
    let headers = [
        "payload",
        "subs",
        "system",
        "msg/s (sum)",
        "bit/s (sum)",
        "per sub",
        "x one sub",
        "error",
    ];
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let n = r.concurrency.unwrap_or(1);
            let one = records
                .iter()
                .find(|o| {
                    o.payload_bytes == r.payload_bytes
                        && o.concurrency == Some(1)
                        && o.msgs_per_sec.is_some()
                })
                .and_then(|o| o.msgs_per_sec);
            vec![
                format_size(r.payload_bytes),
                n.to_string(),
                r.label(),
                r.msgs_per_sec.map(format_rate).unwrap_or_default(),
                r.bits_per_sec.map(format_bits).unwrap_or_default(),
                r.msgs_per_sec
                    .map(|v| format_rate(v / n as f64))
                    .unwrap_or_default(),
                ratio(r.msgs_per_sec, one),
                r.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    render(
        &headers,
        &rows,
        &[true, true, false, true, true, true, true, false],
    )
}

/// RPC: calls/s and whole-call percentiles; `ratio` compares calls/s with the first system
/// measured at the same concurrency.
fn rpc_table(records: &[&Record]) -> String {
    let headers = [
        "callers",
        "system",
        "calls",
        "calls/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "ratio",
        "client",
        "error",
    ];
    let us = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_default();
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let reference = records
                .iter()
                .find(|o| {
                    o.concurrency == r.concurrency
                        && o.msgs_per_sec.is_some()
                        && (r.concurrency.unwrap_or(1) > 1 || o.samples == r.samples)
                })
                .and_then(|o| o.msgs_per_sec);
            vec![
                r.concurrency.unwrap_or(1).to_string(),
                r.label(),
                r.samples.to_string(),
                r.msgs_per_sec
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default(),
                us(r.p50_us),
                us(r.p99_us),
                us(r.p999_us),
                ratio(r.msgs_per_sec, reference),
                r.client.clone(),
                r.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    render(
        &headers,
        &rows,
        &[
            true, false, true, true, true, true, true, true, false, false,
        ],
    )
}

fn ratio(value: Option<f64>, reference: Option<f64>) -> String {
    match (value, reference) {
        (Some(v), Some(r)) if r > 0.0 => format!("x{:.2}", v / r),
        _ => String::new(),
    }
}

/// Throughput: msg/s, bit/s and `ratio` to the first system at the same payload; with the
/// relay floor measured (`tcp (relay)`, `--baseline`), also each system's msg/s as a share of
/// the relay's at the same payload (`of relay`).
fn thr_table(records: &[&Record]) -> String {
    let relay = records.iter().any(|r| r.mode == "relay");
    let mut headers = vec!["payload", "system", "msg/s", "bit/s", "ratio"];
    let mut right = vec![true, false, true, true, true];
    if relay {
        headers.push("of relay");
        right.push(true);
    }
    headers.extend(["samples", "error"]);
    right.extend([true, false]);
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let at_payload = |o: &&&Record| o.payload_bytes == r.payload_bytes;
            let reference = records
                .iter()
                .find(|o| at_payload(o) && o.msgs_per_sec.is_some())
                .and_then(|o| o.msgs_per_sec);
            let mut row = vec![
                format_size(r.payload_bytes),
                r.label(),
                r.msgs_per_sec.map(format_rate).unwrap_or_default(),
                r.bits_per_sec.map(format_bits).unwrap_or_default(),
                ratio(r.msgs_per_sec, reference),
            ];
            if relay {
                let floor = records
                    .iter()
                    .find(|o| at_payload(o) && o.mode == "relay")
                    .and_then(|o| o.msgs_per_sec);
                row.push(match (r.msgs_per_sec, floor) {
                    (Some(v), Some(f)) if f > 0.0 && r.mode != "relay" => {
                        format!("{:.0}%", 100.0 * v / f)
                    }
                    _ => String::new(),
                });
            }
            row.extend([r.samples.to_string(), r.error.clone().unwrap_or_default()]);
            row
        })
        .collect();
    render(&headers, &rows, &right)
}

fn lat_table(records: &[&Record]) -> String {
    let headers = [
        "payload",
        "system",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "rt/s",
        "runs",
        "ratio",
        "error",
    ];
    let us = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_default();
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let reference = records
                .iter()
                .find(|o| o.payload_bytes == r.payload_bytes && o.p50_us.is_some())
                .and_then(|o| o.p50_us);
            vec![
                format_size(r.payload_bytes),
                r.label(),
                us(r.p50_us),
                us(r.p99_us),
                us(r.p999_us),
                r.msgs_per_sec
                    .map(|v| format!("{v:.0}"))
                    .unwrap_or_default(),
                r.runs.to_string(),
                ratio(r.p50_us, reference),
                r.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    render(
        &headers,
        &rows,
        &[true, false, true, true, true, true, true, true, false],
    )
}

/// Renders columns padded to their widest cell; `right[i]` right-aligns column `i`.
/// Trailing empty columns are trimmed from each line.
fn render(headers: &[&str], rows: &[Vec<String>], right: &[bool]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if right[i] {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            }
        }
        let mut s = s.trim_end().to_string();
        s.push('\n');
        s
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Writes the records as a pretty JSON array (creating parent directories).
pub fn write_json(path: &Path, records: &[Record]) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(records)?;
    write_file(path, json + "\n")
}

/// Writes `contents` to `path`, creating its parent directories.
pub(crate) fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// The CSV columns, in order: every field of [`Record`].
const CSV_HEADER: &str = "system,mode,test,target,client,server_version,payload_bytes,\
msgs_per_sec,bits_per_sec,p50_us,p99_us,p999_us,samples,runs,error,hostname,cores,cpu_model,\
load1,load5,load15,timestamp";

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The records as CSV: a header line, then one line per record.
pub fn format_csv(records: &[Record]) -> String {
    let num = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for r in records {
        let cells = [
            csv_field(&r.system),
            csv_field(&r.mode),
            csv_field(&r.test),
            csv_field(&r.target),
            csv_field(&r.client),
            csv_field(r.server_version.as_deref().unwrap_or("")),
            r.payload_bytes.to_string(),
            num(r.msgs_per_sec),
            num(r.bits_per_sec),
            num(r.p50_us),
            num(r.p99_us),
            num(r.p999_us),
            r.samples.to_string(),
            r.runs.to_string(),
            csv_field(r.error.as_deref().unwrap_or("")),
            csv_field(&r.hostname),
            r.cores.to_string(),
            csv_field(&r.cpu_model),
            r.loadavg[0].to_string(),
            r.loadavg[1].to_string(),
            r.loadavg[2].to_string(),
            r.timestamp.to_string(),
        ];
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// Writes [`format_csv`] to `path` (creating parent directories).
pub fn write_csv(path: &Path, records: &[Record]) -> anyhow::Result<()> {
    write_file(path, format_csv(records))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_record as rec;

    #[test]
    fn table_has_ratios_and_units() {
        let mut failed = rec("nats", "brokered", "thr", 8, 0.0);
        failed.msgs_per_sec = None;
        failed.bits_per_sec = None;
        failed.error = Some("slow consumer".into());
        let mut lat = rec("tcp", "raw", "lat", 64, 40_000.0);
        lat.p50_us = Some(12.5);
        lat.p99_us = Some(20.0);
        lat.p999_us = Some(40.0);
        let t = format_table(&[
            rec("hayate", "brokered", "thr", 8, 2_000_000.0),
            failed,
            rec("tcp", "raw", "thr", 8, 10_000_000.0),
            lat,
        ]);
        assert!(t.contains("2.00M msg/s"), "{t}");
        assert!(t.contains("x5.00"), "{t}");
        assert!(t.contains("tcp (raw)"), "{t}");
        assert!(t.contains("slow consumer"), "{t}");
        assert!(t.contains("12.50"), "{t}");
        assert!(t.contains("128 Mbit/s"), "{t}");
        assert!(!t.contains("of relay"), "{t}");
        // With the relay floor measured: each system's share of it.
        let t = format_table(&[
            rec("hayate", "brokered", "thr", 8, 2_000_000.0),
            rec("tcp", "raw", "thr", 8, 10_000_000.0),
            rec("tcp", "relay", "thr", 8, 4_000_000.0),
        ]);
        assert!(t.contains("of relay"), "{t}");
        assert!(t.contains(" 50% "), "{t}");
        assert!(t.contains(" 250% "), "{t}");
        assert!(!t.contains("100%"), "{t}");
    }

    #[test]
    fn csv_has_one_row_per_record() {
        let mut failed = rec("nats", "brokered", "thr", 8, 0.0);
        failed.msgs_per_sec = None;
        failed.error = Some("slow consumer, \"disconnected\"".into());
        let csv = format_csv(&[rec("hayate", "brokered", "thr", 64, 1e6), failed]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        let cols = lines[0].split(',').count();
        assert_eq!(cols, 22);
        assert!(lines[1].starts_with("hayate,brokered,thr,,,,64,1000000,512000000,,,,8,1,"));
        assert!(
            lines[2].contains(",\"slow consumer, \"\"disconnected\"\"\","),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn json_round_trips() {
        let dir = std::env::temp_dir().join(format!("hayate-bench-json-{}", std::process::id()));
        let path = dir.join("sub/r.json");
        let recs = vec![rec("hayate", "brokered", "thr", 64, 1e6)];
        write_json(&path, &recs).unwrap();
        let back: Vec<Record> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, recs);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
