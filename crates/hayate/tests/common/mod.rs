//! Test helpers: the `hayate` binary as a broker, killed when the test ends.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `hayate broker` with the native protocol only, on an ephemeral port: add `--admin` and
/// `--data`.
pub const NATIVE_ONLY: [&str; 11] = [
    "broker",
    "--listen",
    "127.0.0.1:0",
    "--mqtt",
    "off",
    "--ws",
    "off",
    "--stomp",
    "off",
    "--amqp",
    "off",
];

/// A broker process and the addresses it printed; killed on drop (passed or not).
pub struct Broker {
    pub child: Child,
    /// The native protocol's address.
    pub native: String,
    /// The admin listener's address, when it has one.
    pub admin: Option<String>,
    /// The MQTT listener's address, when it has one.
    pub mqtt: Option<String>,
    /// The threads that run its connections, as it said.
    pub io_threads: Option<usize>,
}

impl Broker {
    /// `hayate ARGS` (`broker ...`), its standard error piped when `stderr` is set; returns
    /// once it has printed "ready".
    pub fn start(args: &[&std::ffi::OsStr], stderr: bool) -> Broker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hayate"))
            .args(args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(if stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap();
        let (mut native, mut admin, mut mqtt, mut io_threads) = (None, None, None, None);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(a) = line.strip_prefix("hayate broker: native protocol on ") {
                native = Some(a.trim().to_string());
            }
            if let Some(a) = line.strip_prefix("hayate broker: mqtt on ") {
                mqtt = Some(a.trim().to_string());
            }
            if let Some(a) = line.strip_prefix("hayate broker: admin http on ") {
                admin = Some(a.trim().to_string());
            }
            if let Some(n) = line
                .strip_prefix("hayate broker: ")
                .and_then(|l| l.strip_suffix(" I/O threads"))
            {
                io_threads = n.parse().ok();
            }
            if line.contains("ready") {
                break;
            }
        }
        // Keep draining stdout so the broker never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        Broker {
            child,
            native: native.expect("the broker printed its native address"),
            admin,
            mqtt,
            io_threads,
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on a connection of its own: the status and the body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}
