//! `hayate top --once` against a running broker: the frame lists the connected client and
//! its listener; an unreachable admin listener is a clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn top_once_shows_the_clients() {
    let mut broker = Kill(
        Command::new(env!("CARGO_BIN_EXE_hayate"))
            .args([
                "broker",
                "--listen",
                "127.0.0.1:0",
                "--mqtt",
                "off",
                "--ws",
                "off",
                "--stomp",
                "off",
                "--admin",
                "127.0.0.1:0",
                "--data",
                "",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (mut native, mut admin) = (None, None);
    let mut lines = BufReader::new(broker.0.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("hayate broker: native protocol on ") {
            native = Some(a.trim().to_string());
        }
        if let Some(a) = line.strip_prefix("hayate broker: admin http on ") {
            admin = Some(a.trim().to_string());
        }
        if line.contains("ready") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let (native, admin) = (native.unwrap(), admin.unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let o = hayate_client::ConnectOptions {
        shm: hayate_client::peer::ShmMode::Off,
        ..Default::default()
    }
    .name("top-probe");
    let client = rt
        .block_on(hayate_client::Client::connect_with(&native, o))
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hayate"))
        .args(["top", "--once", "--size", "130x30", "--admin", &admin])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{screen}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in ["HAYATE", "top-probe", "native", &native] {
        assert!(screen.contains(want), "{want} missing from\n{screen}");
    }
    drop(client);
    drop(broker);
    // Nothing listens there now (or ever): an error, not a hang or a panic.
    let out = Command::new(env!("CARGO_BIN_EXE_hayate"))
        .args(["top", "--once", "--admin", &admin])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to"));
}
