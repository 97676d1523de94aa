//! `--io-threads N` (`[server] io_threads`): the broker runs its connections on N threads;
//! with busy-polling on, more than one is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::process::Command;

use common::{Broker, NATIVE_ONLY};

fn broker(extra: &[&str]) -> Broker {
    let args = [&NATIVE_ONLY[..], &["--admin", "off", "--data", ""], extra].concat();
    Broker::start(&args.iter().map(OsStr::new).collect::<Vec<_>>(), false)
}

#[test]
fn the_broker_runs_on_the_threads_it_is_given() {
    for n in [1, 3] {
        let b = broker(&["--io-threads", &n.to_string()]);
        assert_eq!(b.io_threads, Some(n), "--io-threads {n}");
    }
    // Busy-polling takes one thread.
    let b = broker(&["--busy-poll-us", "50"]);
    assert_eq!(b.io_threads, Some(1));
    drop(b);
    // By default, one per core.
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(broker(&[]).io_threads, Some(cores));
}

#[test]
fn more_than_one_thread_with_busy_polling_is_refused() {
    for (args, want) in [
        (
            &["--busy-poll-us", "50", "--io-threads", "2"][..],
            "io_threads must be 0 or 1",
        ),
        (
            &["--io-threads", "1025"][..],
            "io_threads must be at most 1024",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hayate"))
            .args(["config", "show"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "{args:?}: {err}"
        );
    }
}
