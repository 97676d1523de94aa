//! How long deliveries take: a sampled histogram of the time from a publish reaching the
//! broker (the publishing session hands it over, after decoding) to its bytes being written
//! to a subscriber's socket, for the admin API's `hayate_delivery_latency_seconds`.
//!
//! The publish that a session offers to the key sampler (one in `hayate_broker::keys::EVERY`)
//! is also timed: each outbox that takes it keeps the instant as its probe (one at a time;
//! a probe already pending is kept), and the writer that writes the bytes holding it records
//! the time elapsed when the write completes. A subscriber that does not read shows up as a
//! long tail: its probe waits in its outbox with the rest of its output. Messages held back
//! by an encoder (an MQTT session's in-flight window, an offline session) are timed to the
//! write that follows their offer, not to their own later write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds (the last bucket, `+Inf`, is implicit).
pub const BOUNDS: [f64; 20] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A fixed-bucket histogram of durations, updated with relaxed atomics (no lock).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

/// A histogram's figures at one moment, as Prometheus shows them.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySnapshot {
    /// Sum of the observations, in seconds.
    pub sum: f64,
    /// Observations.
    pub count: u64,
    /// `(upper bound in seconds, observations in this bucket)`, not cumulative; the last
    /// bound is `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
}

impl LatencySnapshot {
    /// The upper bound of the bucket holding quantile `q` (0 to 1): an over-estimate by at
    /// most one bucket; `None` without observations or when it falls in `+Inf`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.buckets.iter().map(|b| b.1).sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for &(bound, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return bound.is_finite().then_some(bound);
            }
        }
        None
    }
}

impl LatencyHistogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = BOUNDS.partition_point(|&b| b < secs);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures now (read bucket by bucket: an observation made meanwhile may show in
    /// its bucket and not yet in the count; the count given is never below the buckets').
    pub fn snapshot(&self) -> LatencySnapshot {
        let buckets: Vec<(f64, u64)> = BOUNDS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.buckets)
            .map(|(b, n)| (b, n.load(Ordering::Relaxed)))
            .collect();
        let in_buckets = buckets.iter().map(|b| b.1).sum();
        LatencySnapshot {
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count: self.count.load(Ordering::Relaxed).max(in_buckets),
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_bounds_inclusive_and_quantiles() {
        let h = LatencyHistogram::default();
        assert_eq!(h.snapshot().quantile(0.5), None);
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert!((s.sum - 60.007_013).abs() < 1e-9, "{}", s.sum);
        let at = |b: f64| {
            s.buckets
                .iter()
                .find(|(x, _)| *x == b || (*x - b).abs() < 1e-12)
                .map(|x| x.1)
        };
        assert_eq!(at(0.000_005), Some(1));
        assert_eq!(at(0.000_01), Some(1), "a bound is inclusive");
        assert_eq!(at(0.01), Some(1));
        assert_eq!(at(10.0), Some(0));
        assert_eq!(at(f64::INFINITY), Some(1), "60 s is only in +Inf");
        assert_eq!(s.buckets.len(), BOUNDS.len() + 1);
        assert_eq!(s.quantile(0.25), Some(0.000_005));
        assert_eq!(s.quantile(0.5), Some(0.000_01));
        assert_eq!(s.quantile(0.75), Some(0.01));
        assert_eq!(s.quantile(1.0), None);
    }
}
