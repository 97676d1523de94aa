//! The self-contained HTML report of `hayate bench compare` (inline SVG, inline CSS, no JS).

use std::fmt::Write as _;

use crate::size::{format_bits, format_rate, format_size};
use crate::{MachineInfo, Record};

/// One peer's line in the report.
#[derive(Debug, Clone)]
pub(crate) struct PeerRow {
    pub(crate) name: String,
    pub(crate) version: String,
    pub(crate) client: String,
    pub(crate) settings: String,
    pub(crate) skipped: Option<String>,
}

/// Everything the page shows.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub(crate) title: String,
    /// (label, value) facts about the machine.
    pub(crate) machine: Vec<(String, String)>,
    pub(crate) peers: Vec<PeerRow>,
    /// (label, value) settings of the run.
    pub(crate) settings: Vec<(String, String)>,
    pub(crate) thr: Vec<Record>,
    pub(crate) lat: Vec<Record>,
    pub(crate) rpc: Vec<Record>,
    /// Durable publishing (test `"durable"`).
    pub(crate) durable: Vec<Record>,
    /// Fan-out (test `"fanout"`).
    pub(crate) fanout: Vec<Record>,
    /// (file name, SVG text).
    pub(crate) charts: Vec<(String, String)>,
}

pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            _ => o.push(c),
        }
    }
    o
}

/// Machine facts: CPU, cores, memory, kernel, load at the start and the end.
pub(crate) fn machine_facts(start: &MachineInfo, end: &MachineInfo) -> Vec<(String, String)> {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let load = |m: &MachineInfo| {
        format!(
            "{:.2} {:.2} {:.2}",
            m.loadavg[0], m.loadavg[1], m.loadavg[2]
        )
    };
    vec![
        ("host".into(), start.hostname.clone()),
        ("cpu".into(), start.cpu_model.clone()),
        ("cores".into(), start.cores.to_string()),
        ("memory".into(), mem),
        ("kernel".into(), format!("Linux {kernel}")),
        ("load at start".into(), load(start)),
        ("load at end".into(), load(end)),
    ]
}

const CSS: &str = "body{font-family:sans-serif;margin:24px;max-width:1300px;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}\
th,td{border:1px solid #ccc;padding:3px 8px;vertical-align:top}th{background:#f0f0f0}\
td.n{text-align:right;white-space:nowrap}td.err{color:#b00}small{color:#666}\
.charts{display:flex;flex-wrap:wrap;gap:12px}.charts div{flex:0 1 calc(50% - 12px);min-width:560px}\
.charts svg{width:100%;height:auto;border:1px solid #ddd}\
dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dt{font-weight:bold}dd{margin:0}";

/// Renders the page.
pub(crate) fn render(p: &Page) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>{CSS}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(&p.title)
    );
    h.push_str(
        "<p>One run, one machine, every system measured by the same harness \
         (<code>hayate bench compare</code>, method in <code>shared/BENCH.md</code>). \
         Ratios measured side by side in this run are the figures that count; the machine is \
         shared and noisy.</p>\n",
    );
    h.push_str("<h2>Machine</h2>\n");
    h.push_str(&facts(&p.machine));

    h.push_str(
        "<h2>Systems, versions and settings</h2>\n<table><tr><th>system</th>\
        <th>version</th><th>client library</th><th>settings</th><th>status</th></tr>\n",
    );
    for r in &p.peers {
        let status = match &r.skipped {
            Some(why) => format!("<td class=\"err\">skipped: {}</td>", esc(why)),
            None => "<td>measured</td>".into(),
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{status}</tr>",
            esc(&r.name),
            esc(&r.version),
            esc(&r.client),
            esc(&r.settings)
        );
    }
    h.push_str("</table>\n");

    h.push_str("<h2>Settings of the run</h2>\n");
    h.push_str(&facts(&p.settings));

    if !p.charts.is_empty() {
        h.push_str("<h2>Charts</h2>\n<div class=\"charts\">\n");
        for (name, svg) in &p.charts {
            let svg = svg
                .find("<svg")
                .map_or(svg.as_str(), |i| &svg[i..])
                .to_string();
            let _ = writeln!(
                h,
                "<div><small>{}</small>\n{}</div>",
                esc(name),
                responsive_svg(&svg)
            );
        }
        h.push_str("</div>\n");
    }

    h.push_str("<h2>Throughput</h2>\n");
    h.push_str(&thr_tables(&p.thr));
    h.push_str("<h2>Latency (64 B, half round trip, µs)</h2>\n");
    h.push_str(&lat_table(&p.lat));
    h.push_str("<h2>RPC (request/reply, concurrency 1)</h2>\n");
    h.push_str(&rpc_table(&p.rpc, &p.peers));
    if !p.fanout.is_empty() {
        h.push_str(
            "<h2>Fan-out (one publisher, N subscriber processes on this host, 1 KiB)</h2>\n",
        );
        h.push_str(&fanout_table(&p.fanout));
    }
    if !p.durable.is_empty() {
        h.push_str("<h2>Durable publishing (confirmed once stored)</h2>\n");
        h.push_str(&durable_table(&p.durable));
    }

    let skipped: Vec<&PeerRow> = p.peers.iter().filter(|r| r.skipped.is_some()).collect();
    if !skipped.is_empty() {
        h.push_str("<h2>Skipped</h2>\n<ul>\n");
        for r in skipped {
            let _ = writeln!(
                h,
                "<li><b>{}</b>: {}</li>",
                esc(&r.name),
                esc(r.skipped.as_deref().unwrap_or(""))
            );
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</body></html>\n");
    h
}

/// Makes a fixed-size plotters SVG scale with its container (adds a viewBox).
fn responsive_svg(svg: &str) -> String {
    let attr = |name: &str| -> Option<String> {
        let head = &svg[..svg.find('>')?];
        let i = head.find(&format!(" {name}=\""))? + name.len() + 3;
        let rest = &head[i..];
        Some(rest[..rest.find('"')?].to_string())
    };
    match (attr("width"), attr("height")) {
        (Some(w), Some(hgt)) if !svg[..svg.find('>').unwrap_or(0)].contains("viewBox") => {
            svg.replacen("<svg ", &format!("<svg viewBox=\"0 0 {w} {hgt}\" "), 1)
        }
        _ => svg.to_string(),
    }
}

fn facts(items: &[(String, String)]) -> String {
    let mut h = String::from("<dl>\n");
    for (k, v) in items {
        let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v));
    }
    h.push_str("</dl>\n");
    h
}

/// System labels in first-appearance order.
fn systems(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in records {
        let l = r.label();
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out
}

fn thr_tables(thr: &[Record]) -> String {
    let measured: Vec<&Record> = thr.iter().filter(|r| r.mode != "ideal").collect();
    if measured.is_empty() {
        return "<p>No throughput measured.</p>\n".into();
    }
    let owned: Vec<Record> = measured.iter().map(|r| (*r).clone()).collect();
    let systems = systems(&owned);
    // Cyclone DDS' 12 B point goes in the 8 B row when the others measured 8 B.
    let others_have_8 = owned
        .iter()
        .any(|r| r.system != "cyclonedds" && r.payload_bytes < 12);
    let mut payloads: Vec<usize> = owned
        .iter()
        .filter(|r| !(others_have_8 && r.system == "cyclonedds" && r.payload_bytes == 12))
        .map(|r| r.payload_bytes)
        .collect();
    payloads.sort_unstable();
    payloads.dedup();
    let mut h = String::new();
    if let Some(i) = thr.iter().find(|r| r.mode == "ideal") {
        let _ = writeln!(
            h,
            "<p>Ideal: {} over loopback: {}.</p>",
            esc(&i.system),
            i.bits_per_sec.map(format_bits).unwrap_or_default()
        );
    }
    h.push_str(
        "<p>Measured at the subscriber; bit/s counts payload bits only. The ratio is to \
         Hayate at the same payload. Cyclone DDS' smallest payload is 12 B (shown in the 8 B \
         row).</p>\n",
    );
    for (title, get, fmt) in [
        (
            "msg/s",
            (|r: &Record| r.msgs_per_sec) as fn(&Record) -> Option<f64>,
            format_rate as fn(f64) -> String,
        ),
        ("bit/s", |r: &Record| r.bits_per_sec, format_bits),
    ] {
        let _ = write!(h, "<h3>{title}</h3>\n<table>");
        h.push_str(&header_row(&systems));
        for &p in &payloads {
            let reference = thr_at(&owned, "hayate", p).and_then(get);
            let _ = write!(h, "<tr><td class=\"n\">{}</td>", format_size(p));
            for s in &systems {
                h.push_str(&thr_cell(thr_at(&owned, s, p), s, reference, get, fmt));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str(&relay_share_table(&owned, &systems, &payloads));
    h
}

/// `<tr><th>payload</th><th>SYSTEM</th>...</tr>`.
fn header_row(systems: &[String]) -> String {
    let mut h = String::from("<tr><th>payload</th>");
    for s in systems {
        let _ = write!(h, "<th>{}</th>", esc(s));
    }
    h.push_str("</tr>\n");
    h
}

/// The record of system label `s` at payload `p` (Cyclone DDS' 12 B point in rows below
/// 12 B).
fn thr_at<'a>(owned: &'a [Record], s: &str, p: usize) -> Option<&'a Record> {
    owned.iter().find(|r| {
        r.label() == s
            && (r.payload_bytes == p
                || (r.system == "cyclonedds" && p < 12 && r.payload_bytes == 12))
    })
}

/// One cell of a throughput table: the figure `get` of `rec` with its ratio to `reference`
/// (Hayate's), its error, or nothing.
fn thr_cell(
    rec: Option<&Record>,
    s: &str,
    reference: Option<f64>,
    get: fn(&Record) -> Option<f64>,
    fmt: fn(f64) -> String,
) -> String {
    match rec {
        Some(r) if r.error.is_some() => format!(
            "<td class=\"n err\" title=\"{}\">failed: {}</td>",
            esc(r.error.as_deref().unwrap_or("")),
            esc(&truncate(r.error.as_deref().unwrap_or(""), 40))
        ),
        Some(r) => match get(r) {
            Some(v) => {
                let ratio = match reference {
                    Some(x) if x > 0.0 && s != "hayate" => {
                        format!(" <small>×{:.2}</small>", v / x)
                    }
                    _ => String::new(),
                };
                format!("<td class=\"n\">{}{ratio}</td>", fmt(v))
            }
            None => "<td></td>".into(),
        },
        None => "<td></td>".into(),
    }
}

/// Every system's msg/s as a share of the relay floor's (`tcp (relay)`) at the same payload:
/// what part of the most a brokered path reaches on this machine. Empty without a relay.
fn relay_share_table(owned: &[Record], systems: &[String], payloads: &[usize]) -> String {
    const RELAY: &str = "tcp (relay)";
    if !systems.iter().any(|s| s == RELAY) {
        return String::new();
    }
    let others: Vec<String> = systems.iter().filter(|s| *s != RELAY).cloned().collect();
    let mut h = String::from(
        "<h3>% of relay</h3>\n<p>msg/s as a share of the relay floor's at the same payload: \
         publisher → a thread that only copies bytes → subscriber, over loopback TCP, the \
         most any brokered path reaches on this machine (raw TCP is one hop, above it).</p>\n\
         <table>",
    );
    h.push_str(&header_row(&others));
    for &p in payloads {
        let floor = thr_at(owned, RELAY, p).and_then(|r| r.msgs_per_sec);
        let _ = write!(h, "<tr><td class=\"n\">{}</td>", format_size(p));
        for s in &others {
            let v = thr_at(owned, s, p).and_then(|r| r.msgs_per_sec);
            match (v, floor) {
                (Some(v), Some(f)) if f > 0.0 => {
                    let _ = write!(h, "<td class=\"n\">{:.0}% of relay</td>", 100.0 * v / f);
                }
                _ => h.push_str("<td></td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    h
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn us(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "–".into())
}

/// Like the seeds' Tab. 2: one row per system, the raw TCP baseline last.
fn lat_table(lat: &[Record]) -> String {
    if lat.is_empty() {
        return "<p>No latency measured.</p>\n".into();
    }
    let mut rows: Vec<&Record> = lat.iter().filter(|r| r.mode != "raw").collect();
    rows.extend(lat.iter().filter(|r| r.mode == "raw"));
    let mut h = String::from(
        "<table><tr><th>system</th><th>p50</th><th>p99</th><th>p99.9</th><th>round trips/s</th>\
         <th>runs</th><th>load (1 min)</th><th>note</th></tr>\n",
    );
    for r in rows {
        let note = match (&r.error, r.mode.as_str(), r.system.as_str()) {
            (Some(e), _, _) => format!("failed: {e}"),
            (None, "raw", _) => "raw TCP ping-pong, one hop, no broker (the baseline)".into(),
            (None, _, "cyclonedds") => "ddsperf's own figures (median of its 1 s reports)".into(),
            _ => String::new(),
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.2}</td><td{}>{}</td></tr>",
            esc(&r.label()),
            us(r.p50_us),
            us(r.p99_us),
            us(r.p999_us),
            r.msgs_per_sec
                .map(|v| format!("{v:.0}"))
                .unwrap_or_default(),
            r.runs,
            r.loadavg[0],
            if r.error.is_some() {
                " class=\"err\""
            } else {
                ""
            },
            esc(&note)
        );
    }
    h.push_str("</table>\n");
    h
}

fn fanout_table(fan: &[Record]) -> String {
    let mut h = String::from(
        "<table><tr><th>subscribers</th><th>system</th><th>msg/s (sum)</th>\
         <th>bit/s (sum)</th><th>msg/s per subscriber</th><th>note</th></tr>\n",
    );
    for r in fan {
        let n = r.concurrency.unwrap_or(1);
        let _ = writeln!(
            h,
            "<tr><td class=\"n\">{n}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td{}>{}</td></tr>",
            esc(&r.label()),
            r.msgs_per_sec.map(crate::format_rate).unwrap_or_default(),
            r.bits_per_sec.map(crate::format_bits).unwrap_or_default(),
            r.msgs_per_sec
                .map(|v| crate::format_rate(v / n as f64))
                .unwrap_or_default(),
            if r.error.is_some() {
                " class=\"err\""
            } else {
                ""
            },
            esc(r.error.as_deref().unwrap_or(""))
        );
    }
    h.push_str("</table>\n");
    h
}

fn rpc_table(rpc: &[Record], peers: &[PeerRow]) -> String {
    let mut h = String::from(
        "<table><tr><th>system</th><th>calls/s</th><th>p50 µs per call</th>\
         <th>p99 µs</th><th>calls</th><th>client (method)</th><th>note</th></tr>\n",
    );
    for r in rpc {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td>{}</td><td{}>{}</td></tr>",
            esc(&r.label()),
            r.msgs_per_sec
                .map(|v| format!("{v:.0}"))
                .unwrap_or_default(),
            us(r.p50_us),
            us(r.p99_us),
            r.samples,
            esc(&r.client),
            if r.error.is_some() {
                " class=\"err\""
            } else {
                ""
            },
            esc(r.error.as_deref().unwrap_or("every reply checked"))
        );
    }
    for p in peers {
        if p.skipped.is_none()
            && !rpc.iter().any(|r| r.system == p.name)
            && !matches!(p.name.as_str(), "iperf3")
        {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td></td><td></td><td></td><td></td><td>not yet</td></tr>",
                esc(&p.name)
            );
        }
    }
    h.push_str("</table>\n");
    h
}

/// One row per system and setting, a column group per payload: confirmed messages per second
/// (with the ratio to Hayate's `interval` setting at that payload) and the confirm latency.
fn durable_table(rows: &[Record]) -> String {
    let systems = systems(rows);
    let mut payloads: Vec<usize> = rows.iter().map(|r| r.payload_bytes).collect();
    payloads.sort_unstable();
    payloads.dedup();
    let mut h = String::from(
        "<p>A publisher that waits for each message to be stored: Hayate's confirm (a stream \
         captured the key and its fsync policy is met) against Kafka's acks=1. Throughput with \
         many confirms outstanding; latency p50 / p99 of one message at a time (Kafka's tool \
         reports whole milliseconds). The ratio is to Hayate with <code>fsync \
         interval=100</code> at the same payload.</p>\n<table><tr><th>system</th>",
    );
    for &p in &payloads {
        let _ = write!(
            h,
            "<th>{} msg/s</th><th>{} p50 / p99 µs</th>",
            format_size(p),
            format_size(p)
        );
    }
    h.push_str("</tr>\n");
    for s in &systems {
        let _ = write!(h, "<tr><td>{}</td>", esc(s));
        for &p in &payloads {
            let at = |label: &str| {
                rows.iter()
                    .find(|r| r.label() == label && r.payload_bytes == p)
            };
            match at(s) {
                Some(r) if r.error.is_some() => {
                    let _ = write!(
                        h,
                        "<td class=\"n err\" colspan=\"2\">failed: {}</td>",
                        esc(&truncate(r.error.as_deref().unwrap_or(""), 40))
                    );
                }
                Some(r) => {
                    let reference = at("hayate (fsync interval=100)").and_then(|x| x.msgs_per_sec);
                    let ratio = match (r.msgs_per_sec, reference) {
                        (Some(v), Some(x)) if x > 0.0 && r.system != "hayate" => {
                            format!(" <small>×{:.2}</small>", v / x)
                        }
                        _ => String::new(),
                    };
                    let _ = write!(
                        h,
                        "<td class=\"n\">{}{ratio}</td><td class=\"n\">{} / {}</td>",
                        r.msgs_per_sec.map(format_rate).unwrap_or_default(),
                        us(r.p50_us),
                        us(r.p99_us)
                    );
                }
                None => h.push_str("<td></td><td></td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_record as rec;

    #[test]
    fn page_has_the_tables() {
        let mut lat = rec("hayate", "brokered", "lat", 64, 1e4);
        (lat.p50_us, lat.p99_us, lat.p999_us) = (Some(21.5), Some(40.0), Some(80.0));
        let mut raw = rec("tcp", "raw", "lat", 64, 4e4);
        raw.p50_us = Some(6.0);
        let mut failed = rec("nats", "brokered", "thr", 64, 0.0);
        failed.msgs_per_sec = None;
        failed.error = Some("slow <consumer>".into());
        let mut ideal = Record::new("iperf3", "ideal", "thr", 64);
        ideal.bits_per_sec = Some(24.9e9);
        let page = Page {
            title: "T & co".into(),
            machine: vec![("cpu".into(), "Xeon".into())],
            peers: vec![
                PeerRow {
                    name: "hayate".into(),
                    version: "hayate 0.1.0".into(),
                    client: "hayate-client".into(),
                    settings: "reliable".into(),
                    skipped: None,
                },
                PeerRow {
                    name: "mosquitto".into(),
                    version: String::new(),
                    client: String::new(),
                    settings: "QoS 0".into(),
                    skipped: Some("driver not compiled in".into()),
                },
                PeerRow {
                    name: "nats".into(),
                    version: "v2.15.2".into(),
                    client: "async-nats".into(),
                    settings: String::new(),
                    skipped: None,
                },
            ],
            settings: vec![("run".into(), "quick".into())],
            thr: vec![
                rec("hayate", "brokered", "thr", 64, 2e6),
                failed,
                rec("tcp", "raw", "thr", 64, 8e6),
                rec("tcp", "relay", "thr", 64, 4e6),
                ideal,
            ],
            lat: vec![raw, lat],
            rpc: vec![rec("hayate", "brokered", "rpc", 0, 30_000.0)],
            durable: vec![
                rec("hayate", "fsync interval=100", "durable", 1024, 300_000.0),
                rec("kafka", "acks=1", "durable", 1024, 150_000.0),
            ],
            fanout: vec![{
                let mut r = rec("hayate", "peer-to-peer", "fanout", 1024, 2.5e6);
                r.concurrency = Some(20);
                r
            }],
            charts: vec![(
                "thr-msgs.svg".into(),
                "<svg width=\"1000\" height=\"650\" xmlns=\"x\"></svg>".into(),
            )],
        };
        let h = render(&page);
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(h.contains("<title>T &amp; co</title>"));
        assert!(h.contains("2.00M msg/s"), "{h}");
        assert!(h.contains("×4.00"), "{h}");
        // Every system as a share of the relay floor (the relay itself left out).
        assert!(h.contains("<h3>% of relay</h3>"), "{h}");
        assert!(h.contains("<td class=\"n\">50% of relay</td>"), "{h}");
        assert!(h.contains("<td class=\"n\">200% of relay</td>"), "{h}");
        assert!(!h.contains("100% of relay"), "{h}");
        assert!(h.contains("failed: slow &lt;consumer&gt;"), "{h}");
        assert!(
            h.contains("24.9 Gbit/s") || h.contains("24.90 Gbit/s"),
            "{h}"
        );
        assert!(
            h.contains("<td>hayate</td><td class=\"n\">21.5</td>"),
            "{h}"
        );
        // The raw baseline comes last in the latency table.
        assert!(h.find("21.5").unwrap() < h.find(">6.0<").unwrap());
        assert!(h.contains("skipped: driver not compiled in"));
        assert!(h.contains("<td>nats</td><td></td><td></td><td></td><td></td><td>not yet</td>"));
        assert!(h.contains("viewBox=\"0 0 1000 650\""));
        assert!(h.contains("Durable publishing"));
        assert!(
            h.contains("<td>kafka (acks=1)</td><td class=\"n\">150k msg/s <small>×0.50</small>"),
            "{h}"
        );
        assert!(!h.contains("<script"));
    }
}
