//! Counting received messages and turning the counts into rate samples.
//!
//! The receiving side ([`Tally`]) publishes snapshots `(count, arrival time of that message)`.
//! The sampler takes a snapshot at the end of each window; a sample's rate is
//! `(count_b - count_a) / (at_b - at_a)`: messages between two arrivals over the time between
//! them. Windows are `duration / samples` long but are extended until they hold at least
//! [`MIN_MSGS_PER_SAMPLE`] messages, so a 64 MiB point at a few dozen msg/s is still measured
//! exactly (it just takes longer than `duration`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use hayate_core::sync::lock;

/// A sample holds at least this many messages; its window is extended until it does.
pub const MIN_MSGS_PER_SAMPLE: u64 = 10;

/// A point fails when no message arrives for this long (while one is expected).
const STALL: Duration = Duration::from_secs(10);

/// How often the sampler wakes up to check for failures while waiting.
const TICK: Duration = Duration::from_millis(20);

/// A snapshot: `count` messages received, the last of them at `at`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snap {
    pub(crate) count: u64,
    pub(crate) at: Instant,
}

/// Shared between the receiver (writes) and the sampler (reads).
#[derive(Debug)]
pub(crate) struct Counter {
    snap: Mutex<Snap>,
    failure: Mutex<Option<String>>,
}

impl Counter {
    pub(crate) fn new() -> Arc<Counter> {
        Arc::new(Counter {
            snap: Mutex::new(Snap {
                count: 0,
                at: Instant::now(),
            }),
            failure: Mutex::new(None),
        })
    }

    /// Records that `count` messages were received, the last one at `at`.
    pub(crate) fn store(&self, count: u64, at: Instant) {
        *lock(&self.snap) = Snap { count, at };
    }

    pub(crate) fn snap(&self) -> Snap {
        *lock(&self.snap)
    }

    /// Marks the point failed (the first failure wins).
    pub(crate) fn fail(&self, msg: impl Into<String>) {
        let mut f = lock(&self.failure);
        if f.is_none() {
            *f = Some(msg.into());
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }
}

/// The receiver's side: counts messages, publishing a snapshot every message for payloads of
/// 16 KiB and more, every 16 from 1 KiB, every 64 below (so that small messages pay ~nothing
/// for it).
pub(crate) struct Tally {
    counter: Arc<Counter>,
    n: u64,
    mask: u64,
}

impl Tally {
    pub(crate) fn new(counter: Arc<Counter>, payload: usize) -> Tally {
        // The snapshot (a lock and a clock read) costs tens of nanoseconds: small enough to
        // take every 16th message at mid sizes, and every message only where messages are
        // large and few.
        let mask = match payload {
            0..1024 => 63,
            1024..16384 => 15,
            _ => 0,
        };
        Tally {
            counter,
            n: 0,
            mask,
        }
    }

    #[inline]
    pub(crate) fn one(&mut self) {
        self.n += 1;
        if self.n & self.mask == 0 {
            self.counter.store(self.n, Instant::now());
        }
    }

    /// Adds `k` messages that arrived now (used by the raw TCP reader, per read call).
    #[inline]
    pub(crate) fn many(&mut self, k: u64) {
        if k > 0 {
            self.n += k;
            self.counter.store(self.n, Instant::now());
        }
    }
}

/// Warms up, then takes `samples` rate samples over `duration` (see the module docs).
/// `check` reports asynchronous failures (e.g. a slow-consumer disconnect); it and the
/// counter's own failure end the point with an error.
pub(crate) async fn sample(
    counter: &Counter,
    warmup: Duration,
    duration: Duration,
    samples: usize,
    check: impl Fn() -> Option<String>,
) -> anyhow::Result<Vec<f64>> {
    let failed = || counter.failure().or_else(&check);
    let samples = samples.max(1);
    let window = (duration / samples as u32).max(Duration::from_millis(1));

    // Warm-up, then wait for the first message if none came yet.
    let start = Instant::now();
    while start.elapsed() < warmup {
        if let Some(e) = failed() {
            bail!(e);
        }
        tokio::time::sleep(TICK.min(warmup - start.elapsed().min(warmup))).await;
    }
    let mut prev = wait_for(counter, 1, &failed, Instant::now()).await?;

    let mut rates = Vec::with_capacity(samples);
    for _ in 0..samples {
        let end = Instant::now() + window;
        while Instant::now() < end {
            if let Some(e) = failed() {
                bail!(e);
            }
            tokio::time::sleep(TICK.min(end.saturating_duration_since(Instant::now()))).await;
        }
        let s = wait_for(counter, prev.count + MIN_MSGS_PER_SAMPLE, &failed, prev.at).await?;
        let secs = s.at.duration_since(prev.at).as_secs_f64();
        if secs > 0.0 {
            rates.push((s.count - prev.count) as f64 / secs);
        }
        prev = s;
    }
    if rates.is_empty() {
        bail!("no usable samples");
    }
    Ok(rates)
}

/// Waits until at least `count` messages were received. Fails when nothing arrives for
/// [`STALL`] (counting from the last arrival, or from `since` when none arrived yet).
async fn wait_for(
    counter: &Counter,
    count: u64,
    failed: &impl Fn() -> Option<String>,
    since: Instant,
) -> anyhow::Result<Snap> {
    let mut last_progress = since;
    let mut last_count = counter.snap().count;
    loop {
        if let Some(e) = failed() {
            bail!(e);
        }
        let s = counter.snap();
        if s.count >= count {
            return Ok(s);
        }
        if s.count != last_count {
            last_count = s.count;
            last_progress = Instant::now();
        }
        if last_progress.elapsed() > STALL {
            bail!(
                "stalled: no message for {}s ({} received)",
                STALL.as_secs(),
                s.count
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn samples_a_steady_stream() {
        let counter = Counter::new();
        let c = counter.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        // 1000 msg/s, one message per ms (payload >= 1 KiB: a snapshot per message).
        let producer = tokio::spawn(async move {
            let mut t = Tally::new(c, 4096);
            let mut iv = tokio::time::interval(Duration::from_millis(1));
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                iv.tick().await;
                t.one();
            }
        });
        let rates = sample(
            &counter,
            Duration::from_millis(50),
            Duration::from_millis(300),
            3,
            || None,
        )
        .await
        .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        producer.await.unwrap();
        assert_eq!(rates.len(), 3);
        for r in rates {
            assert!(r > 300.0 && r < 3000.0, "{r}");
        }
    }

    #[tokio::test]
    async fn reports_failures() {
        let counter = Counter::new();
        counter.fail("slow consumer");
        counter.fail("second");
        let e = sample(
            &counter,
            Duration::ZERO,
            Duration::from_millis(10),
            1,
            || None,
        )
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "slow consumer");
        let counter = Counter::new();
        let e = sample(
            &counter,
            Duration::ZERO,
            Duration::from_millis(10),
            1,
            || Some("disconnected".to_string()),
        )
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "disconnected");
    }
}
