//! `kill -9` of the broker while a publisher waits for confirms: every confirmed message is
//! still there afterwards and reaches a durable consumer (at least once; duplicates are
//! counted and reported, never an error).
//!
//! Short by default (CI). The long run (documented in docs/streams.md):
//! `HAYATE_CRASH_KILLS=100 HAYATE_CRASH_MESSAGES=20000 cargo test --release -p hayate --test crash -- --nocapture`

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hayate_client::streams::{ConsumerConfig, StreamConfig};
use hayate_client::{Client, ConfirmOutcome, Key, Message};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Starts the broker on an ephemeral port; returns it and its native address.
fn start(dir: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hayate"))
        .args(common::NATIVE_ONLY)
        .args(["--admin", "off", "--data"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("hayate broker: native protocol on ") {
            addr = Some(a.trim().to_owned());
        }
        if line.contains("ready") {
            break;
        }
    }
    // Keep draining stdout so the broker never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, addr.expect("the broker printed its address"))
}

async fn connect(addr: &Arc<Mutex<String>>) -> Client {
    loop {
        let a = addr.lock().unwrap().clone();
        if let Ok(c) = Client::connect(&a).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn run(fsync: &str) {
    let kills = env_or("HAYATE_CRASH_KILLS", 5);
    let n = env_or("HAYATE_CRASH_MESSAGES", 3000);
    let dir = std::env::temp_dir().join(format!(
        "hayate-crash-{}-{}",
        fsync.replace('=', "-"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let (child, a) = start(&dir);
    let child = Arc::new(Mutex::new(child));
    let addr = Arc::new(Mutex::new(a));
    {
        let c = connect(&addr).await;
        let mut s = StreamConfig::new("crash", &["crash/*"]);
        s.fsync = fsync.into();
        c.streams().add(&s).await.unwrap();
        let mut cc = ConsumerConfig::new("crash", "check");
        cc.ack_wait_ms = 5_000;
        c.streams().consumer_add(&cc).await.unwrap();
        c.close().await.unwrap();
    }
    // The publisher: each message until it is confirmed, reconnecting after each kill.
    let confirmed: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default(); // payload -> offset
    // The publisher sends at least `n` messages, and goes on until every kill is done.
    let kills_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let (addr, confirmed, kills_done) = (addr.clone(), confirmed.clone(), kills_done.clone());
        tokio::spawn(async move {
            let mut c = connect(&addr).await;
            let mut i = 0;
            while i < n || !kills_done.load(std::sync::atomic::Ordering::Acquire) {
                let m = Message::new(Key::new("crash/x").unwrap(), i.to_string());
                match tokio::time::timeout(Duration::from_secs(5), c.publish_confirmed(&m)).await {
                    Ok(Ok(ConfirmOutcome::Stored { offset, .. })) => {
                        confirmed.lock().unwrap().insert(i, offset);
                        i += 1;
                    }
                    Ok(Ok(other)) => panic!("message {i}: {other:?}"),
                    // Killed: send it again on a new connection (it may be stored twice).
                    Ok(Err(_)) | Err(_) => c = connect(&addr).await,
                }
            }
        })
    };
    // The killer.
    let mut restarts = 0;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    while restarts < kills {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(30 + seed % 150)).await;
        {
            let mut ch = child.lock().unwrap();
            ch.kill().unwrap(); // SIGKILL
            ch.wait().unwrap();
        }
        let (c2, a2) = start(&dir);
        *child.lock().unwrap() = c2;
        *addr.lock().unwrap() = a2;
        restarts += 1;
    }
    kills_done.store(true, std::sync::atomic::Ordering::Release);
    tokio::time::timeout(Duration::from_secs(300), publisher)
        .await
        .expect("publisher finished")
        .unwrap();
    let confirmed = confirmed.lock().unwrap().clone();
    let n = confirmed.len() as u64;
    assert!(n >= env_or("HAYATE_CRASH_MESSAGES", 3000));
    // Everything confirmed reaches the durable consumer.
    let c = connect(&addr).await;
    let mut sub = c.consume("crash", "check").await.unwrap();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    let t = Instant::now();
    while (seen.len() as u64) < n {
        let m = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .expect("consumer stalled")
            .unwrap();
        let i: u64 = std::str::from_utf8(&m.payload).unwrap().parse().unwrap();
        *seen.entry(i).or_default() += 1;
        c.ack(&m).unwrap();
        assert!(t.elapsed() < Duration::from_secs(120));
    }
    let lost: Vec<u64> = confirmed
        .keys()
        .filter(|i| !seen.contains_key(i))
        .copied()
        .collect();
    let stored = c.streams().info("crash").await.unwrap().records;
    let duplicates = stored - n;
    eprintln!(
        "crash test (fsync {fsync}): {n} confirmed messages, {restarts} kill -9 + restart, {} lost, {stored} stored ({duplicates} duplicates from resends)",
        lost.len()
    );
    assert!(lost.is_empty(), "lost confirmed messages: {lost:?}");
    c.close().await.unwrap();
    let _ = child.lock().unwrap().kill();
    let _ = child.lock().unwrap().wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_confirmed_message_fsync_always() {
    run("always").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_confirmed_message_fsync_interval() {
    run("interval=100").await;
}
