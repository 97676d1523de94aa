//! iperf3 over loopback: the ideal line of the throughput chart.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;

use super::process::{KillOnDrop, free_port, run_script};

/// iperf3 over loopback: bits per second, via `iperf3.sh` when it exists, else `iperf3`.
pub(super) fn iperf3(script: &Path, secs: u64) -> anyhow::Result<f64> {
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

pub(crate) fn parse_bits_per_second(s: &str) -> Option<f64> {
    s.lines()
        .find_map(|l| l.trim().strip_prefix("bits_per_second"))
        .and_then(|v| v.trim().parse().ok())
}
