//! Cyclone DDS' `ddsperf`: a throughput sweep and a latency point, and the parsing of its
//! per-second reports.

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use hayate_core::sync::lock;

use super::process::KillOnDrop;
use crate::Record;

/// The Cyclone DDS config from `cyclonedds.sh config` (loopback, no multicast).
pub(super) static DDS_CONFIG: Mutex<Option<String>> = Mutex::new(None);

pub(crate) fn ddsperf_cmd() -> Command {
    let mut c = Command::new("ddsperf");
    let config = lock(&DDS_CONFIG).clone();
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
pub(super) fn ddsperf_thr(payload: usize, secs: u64, version: &str) -> Record {
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
pub(super) fn ddsperf_lat(secs: u64, version: &str) -> Record {
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
}
