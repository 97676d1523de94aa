//! The Hayate brokers a comparison starts: the default one and the busy-polling one, each
//! with its native, MQTT, STOMP and AMQP listeners, started on first use.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use hayate_core::sync::lock;

use super::MAX_PAYLOAD;
use super::process::{Cleanup, Running};

/// The busy-polling window of the `*-busy` Hayate peers, in microseconds.
const BUSY_POLL_US: u32 = 300;

/// The listeners of the hayate brokers this comparison started (the default one and the
/// busy-polling one): protocol label → address.
static HAYATE: Mutex<[Option<HashMap<String, String>>; 2]> = Mutex::new([None, None]);

/// The address of a started hayate broker's `label` listener (`native protocol`, `mqtt`,
/// `stomp`), starting that broker on first use.
pub(super) fn hayate_addr(
    exe: &Path,
    cleanup: &Cleanup,
    label: &str,
    busy: bool,
) -> anyhow::Result<String> {
    let mut h = lock(&HAYATE);
    let slot = &mut h[usize::from(busy)];
    if slot.is_none() {
        *slot = Some(start_hayate(exe, cleanup, busy)?);
    }
    slot.as_ref()
        .and_then(|m| m.get(label).cloned())
        .with_context(|| format!("the hayate broker reported no {label} listener"))
}

/// Spawns `hayate broker` with its native, MQTT, STOMP and AMQP listeners on kernel-chosen ports
/// (no WebSocket, nothing kept on disk), busy-polling if `busy`, and returns their addresses
/// by protocol label.
fn start_hayate(
    exe: &Path,
    cleanup: &Cleanup,
    busy: bool,
) -> anyhow::Result<HashMap<String, String>> {
    let busy_poll = if busy { BUSY_POLL_US } else { 0 };
    let mut child = Command::new(exe)
        .args([
            "broker",
            "--listen",
            "127.0.0.1:0",
            "--mqtt",
            "127.0.0.1:0",
            "--stomp",
            "127.0.0.1:0",
            "--amqp",
            "127.0.0.1:0",
            "--ws",
            "off",
            "--admin",
            "off",
            "--data",
            "",
            "--max-payload",
        ])
        .arg(MAX_PAYLOAD.to_string())
        .arg("--busy-poll-us")
        .arg(busy_poll.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {} broker", exe.display()))?;
    let stdout = child.stdout.take().context("broker stdout")?;
    cleanup.push(Running::Child("hayate broker".into(), child));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut found = HashMap::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("ready") {
                let _ = tx.send(std::mem::take(&mut found));
            } else if let Some(rest) = line.strip_prefix("hayate broker: ")
                && let Some((label, addr)) = rest.split_once(" on ")
            {
                found.insert(label.to_string(), addr.trim().to_string());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("the hayate broker did not report its addresses within 10 s")
}
