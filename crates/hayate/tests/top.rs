//! `hayate top --once` against a running broker: the frame lists the connected client and
//! its listener; an unreachable admin listener is a clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::process::Command;

use common::{Broker, NATIVE_ONLY};

#[test]
fn top_once_shows_the_clients() {
    let args = [&NATIVE_ONLY[..], &["--admin", "127.0.0.1:0", "--data", ""]].concat();
    let broker = Broker::start(&args.iter().map(OsStr::new).collect::<Vec<_>>(), false);
    let (native, admin) = (broker.native.clone(), broker.admin.clone().unwrap());
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
