//! `hayate bench durable`: what a publisher that waits for confirms gets from a stream, per
//! fsync policy and payload: confirmed messages per second with a window of outstanding
//! confirms (throughput), and the confirm latency of one message at a time (latency).
//!
//! Each point uses a stream of its own (created, measured, deleted) capturing
//! `bench/durable/<n>/**`; the broker must have a data directory. The same figures for Kafka
//! come from its own `ProducerPerformance` (bench/durable-vs-kafka.sh runs both).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use hayate_client::streams::StreamConfig;
use hayate_client::{Client, ConfirmOutcome, Key, Message};

/// One measured point.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Point {
    pub(crate) fsync: String,
    pub(crate) payload: usize,
    pub(crate) window: usize,
    pub(crate) confirmed_per_sec: f64,
    pub(crate) mb_per_sec: f64,
    pub(crate) lat_p50_us: f64,
    pub(crate) lat_p99_us: f64,
    pub(crate) lat_samples: usize,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

async fn one(c: &Client, key: &Key, payload: &Bytes) -> Result<()> {
    match c
        .publish_confirmed(&Message::new(key.clone(), payload.clone()))
        .await?
    {
        ConfirmOutcome::Stored { .. } => Ok(()),
        other => bail!("not stored: {other:?}"),
    }
}

/// Measures one fsync policy and payload size.
pub(crate) async fn point(
    server: &str,
    n: usize,
    fsync: &str,
    payload: usize,
    window: usize,
    duration: Duration,
    lat_samples: usize,
) -> Result<Point> {
    let admin = Client::connect(server).await?;
    let name = format!("bench-durable-{}-{n}", std::process::id());
    let mut cfg = StreamConfig::new(&name, &[&format!("bench/durable/{n}/**")]);
    cfg.fsync = fsync.to_owned();
    admin.streams().add(&cfg).await?;
    let key = Key::new(&format!("bench/durable/{n}/x"))?;
    let body = Bytes::from(vec![0x5a; payload]);
    // Throughput: `window` confirms outstanding on one connection.
    let c = Client::connect(server).await?;
    for _ in 0..100 {
        one(&c, &key, &body).await?; // warm-up
    }
    let mut inflight = FuturesUnordered::new();
    let (start, mut done) = (Instant::now(), 0u64);
    while start.elapsed() < duration {
        while inflight.len() < window {
            let (c, key, body) = (&c, &key, &body);
            inflight.push(async move { one(c, key, body).await });
        }
        if let Some(r) = inflight.next().await {
            r?;
            done += 1;
        }
    }
    while let Some(r) = inflight.next().await {
        r?;
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    // Latency: one message at a time.
    let mut lat = Vec::with_capacity(lat_samples);
    for _ in 0..lat_samples {
        let t = Instant::now();
        one(&c, &key, &body).await?;
        lat.push(t.elapsed());
    }
    lat.sort_unstable();
    c.close().await?;
    admin.streams().remove(&name).await?;
    admin.close().await?;
    let rate = done as f64 / secs;
    Ok(Point {
        fsync: fsync.to_owned(),
        payload,
        window,
        confirmed_per_sec: rate,
        mb_per_sec: rate * payload as f64 / 1e6,
        lat_p50_us: pct(&lat, 0.5),
        lat_p99_us: pct(&lat, 0.99),
        lat_samples: lat.len(),
    })
}

/// Runs every point and prints a table; returns the points.
pub(crate) async fn run(
    server: &str,
    policies: &[String],
    payloads: &[usize],
    window: usize,
    duration: Duration,
    lat_samples: usize,
) -> Result<Vec<Point>> {
    let mut points = Vec::new();
    println!(
        "{:<14} {:>9} {:>7} {:>14} {:>10} {:>10} {:>10}",
        "fsync", "payload", "window", "confirmed/s", "MB/s", "p50 us", "p99 us"
    );
    let mut n = 0;
    for payload in payloads {
        for fsync in policies {
            n += 1;
            let p = point(server, n, fsync, *payload, window, duration, lat_samples).await?;
            println!(
                "{:<14} {:>9} {:>7} {:>14.0} {:>10.1} {:>10.1} {:>10.1}",
                p.fsync,
                p.payload,
                p.window,
                p.confirmed_per_sec,
                p.mb_per_sec,
                p.lat_p50_us,
                p.lat_p99_us
            );
            points.push(p);
        }
    }
    Ok(points)
}

/// What a catch-up run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct CatchUp {
    pub(crate) stream: String,
    pub(crate) payload: usize,
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) fill_secs: f64,
    pub(crate) read_secs: f64,
    pub(crate) read_mb_per_sec: f64,
}

/// Fills a stream with `total` bytes of `payload`-byte messages, then has a durable consumer
/// read all of it from the start (acknowledging every 256 messages cumulatively). The stream
/// is left in place (its name is printed) for comparing with `dd` of its files; remove it with
/// `hayate stream rm`.
pub(crate) async fn catchup(
    server: &str,
    total: u64,
    payload: usize,
    window: usize,
) -> Result<CatchUp> {
    let c = Client::connect(server).await?;
    let name = format!("bench-catchup-{}", std::process::id());
    let mut cfg = StreamConfig::new(
        &name,
        &[&format!("bench/catchup/{}/**", std::process::id())],
    );
    cfg.fsync = "interval=100".into();
    c.streams().add(&cfg).await?;
    let key = Key::new(&format!("bench/catchup/{}/x", std::process::id()))?;
    let body = Bytes::from(vec![0x5a; payload]);
    let n = total.div_ceil(payload as u64);
    let t = Instant::now();
    let mut inflight = FuturesUnordered::new();
    let mut sent = 0u64;
    while sent < n || !inflight.is_empty() {
        while sent < n && inflight.len() < window {
            let (c, key, body) = (&c, &key, &body);
            inflight.push(async move { one(c, key, body).await });
            sent += 1;
        }
        if let Some(r) = inflight.next().await {
            r?;
        }
    }
    let fill_secs = t.elapsed().as_secs_f64();
    println!("filled {name}: {n} messages of {payload} B in {fill_secs:.1} s");
    let mut cc = hayate_client::streams::ConsumerConfig::new(&name, "catchup");
    cc.max_in_flight = 4096;
    c.streams().consumer_add(&cc).await?;
    let reader = Client::connect(server).await?;
    let mut sub = reader.consume(&name, "catchup").await?;
    let t = Instant::now();
    let (mut got, mut bytes) = (0u64, 0u64);
    while got < n {
        let Ok(next) = tokio::time::timeout(Duration::from_secs(30), sub.next()).await else {
            bail!("no message for 30 s after {got} of {n}");
        };
        let Some(m) = next else {
            bail!("the consumer stopped after {got} messages");
        };
        got += 1;
        bytes += m.payload.len() as u64;
        if got % 256 == 0 || got == n {
            reader.ack_through(&m)?;
        }
    }
    let read_secs = t.elapsed().as_secs_f64();
    reader.close().await?;
    c.close().await?;
    Ok(CatchUp {
        stream: name,
        payload,
        messages: n,
        bytes,
        fill_secs,
        read_secs,
        read_mb_per_sec: bytes as f64 / read_secs / 1e6,
    })
}
