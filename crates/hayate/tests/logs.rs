//! The broker's logs: JSON lines with `log_format = "json"`, and a filter that changes while it
//! runs, by SIGHUP (read again from the config file) and by `PUT /api/log`, without dropping
//! a connection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn json_logs_and_a_filter_changed_at_run_time() {
    let dir = std::env::temp_dir().join(format!("hayate-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("hayate.toml");
    let write_config = |level: &str| {
        std::fs::write(
            &cfg,
            format!(
                "[server]\ndata_dir = \"\"\nlog = \"{level}\"\nlog_format = \"json\"\n\
                 [native]\nlisten = [\"127.0.0.1:0\"]\nshm = false\n[mqtt]\nlisten = []\nws = []\n\
                 [stomp]\nlisten = []\n[amqp]\nlisten = []\n[admin]\nlisten = [\"127.0.0.1:0\"]\n"
            ),
        )
        .unwrap();
    };
    write_config("warn");
    let mut child = common::Broker::start(
        &[
            OsStr::new("broker"),
            OsStr::new("--config"),
            cfg.as_os_str(),
        ],
        true,
    );
    let (native, admin) = (child.native.clone(), child.admin.clone().unwrap());
    // Every line on stderr, as it comes.
    let (tx, rx) = mpsc::channel::<String>();
    let stderr = child.child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });

    assert_eq!(
        common::http(&admin, "GET", "/api/log", &[], ""),
        (200, r#"{"filter":"warn"}"#.into())
    );
    // A client that stays connected across both changes.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let o = hayate_client::ConnectOptions {
        shm: hayate_client::peer::ShmMode::Off,
        ..Default::default()
    };
    let kept = rt
        .block_on(hayate_client::Client::connect_with(&native, o))
        .unwrap();

    // SIGHUP: the filter is read again from the file.
    write_config("debug");
    let ok = Command::new("kill")
        .args(["-HUP", &child.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    wait_for("the SIGHUP reload", || {
        common::http(&admin, "GET", "/api/log", &[], "").1 == r#"{"filter":"debug"}"#
    });
    // A connection that ends logs at debug level now: a JSON line.
    drop(TcpStream::connect(&native).unwrap());
    let mut seen = Vec::new();
    wait_for("a debug line", || {
        seen.extend(rx.try_iter());
        seen.iter().any(|l| l.contains("\"DEBUG\""))
    });
    for l in &seen {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }

    // PUT /api/log: set, and a filter that does not parse is refused.
    let (status, body) = common::http(&admin, "PUT", "/api/log", &[], "info,hayate_server=trace");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hayate_server=trace"), "{body}");
    let (status, _) = common::http(&admin, "PUT", "/api/log", &[], "info,=[");
    assert_eq!(status, 400);
    assert!(
        common::http(&admin, "GET", "/api/log", &[], "")
            .1
            .contains("hayate_server=trace")
    );

    // The client connected at the start is still served: a round trip through the broker.
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), kept.flush())
            .await
            .expect("a round trip")
            .expect("the kept connection is served");
    });
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}
