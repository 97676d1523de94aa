//! The machine a point was measured on: host, cores, CPU model, load.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Machine information stamped on every [`Record`](crate::Record).
#[derive(Debug, Clone, PartialEq)]
pub struct MachineInfo {
    /// Host name.
    pub hostname: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// CPU model ("model name" in /proc/cpuinfo), or "unknown".
    pub cpu_model: String,
    /// Load average over 1, 5 and 15 minutes (zeros where unavailable).
    pub loadavg: [f64; 3],
    /// Unix time in seconds.
    pub timestamp: u64,
}

struct Static {
    hostname: String,
    cores: usize,
    cpu_model: String,
}

fn static_info() -> &'static Static {
    static INFO: OnceLock<Static> = OnceLock::new();
    INFO.get_or_init(|| Static {
        hostname: hostname(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: cpu_model(),
    })
}

impl MachineInfo {
    /// The current information (load average and time read now).
    pub fn current() -> MachineInfo {
        let s = static_info();
        MachineInfo {
            hostname: s.hostname.clone(),
            cores: s.cores,
            cpu_model: s.cpu_model.clone(),
            loadavg: loadavg(),
            timestamp: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_string())
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    parse_cpu_model(&info).unwrap_or_else(|| "unknown".to_string())
}

fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    // x86: "model name"; some ARM kernels: "Model" or "Processor"; fall back to "cpu model".
    ["model name", "Model", "Processor", "cpu model"]
        .iter()
        .find_map(|want| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == *want && !v.trim().is_empty()).then(|| v.trim().to_string())
            })
        })
}

fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    parse_loadavg(&s)
}

fn parse_loadavg(s: &str) -> [f64; 3] {
    let mut out = [0.0; 3];
    for (slot, v) in out.iter_mut().zip(s.split_whitespace()) {
        *slot = v.parse().unwrap_or(0.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let cpu =
            "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) @ 2.20GHz\n";
        assert_eq!(
            parse_cpu_model(cpu).as_deref(),
            Some("Intel(R) Xeon(R) @ 2.20GHz")
        );
        assert_eq!(parse_cpu_model("nothing here"), None);
        assert_eq!(
            parse_loadavg("0.51 0.45 0.25 3/101 5981\n"),
            [0.51, 0.45, 0.25]
        );
        let m = MachineInfo::current();
        assert!(m.cores >= 1);
        assert!(m.timestamp > 1_600_000_000);
    }
}
