//! Failed password logins: the lock-out per (address, user name) pair, the global failure
//! limit, and which waiting lane of the password checks a login goes to (docs/security.md).

use super::*;

/// (address, user name) pairs remembered for throttling; past it, stale entries go first.
const MAX_TRACKED: usize = 65_536;

/// What a failed-login count is kept under: the source address and a keyed digest of the
/// user name given (so that a 64 KiB name costs what a short one does).
pub(super) type Pair = (IpAddr, [u8; 16]);

#[derive(Debug, Default)]
struct Failures {
    count: u32,
    since: Option<Instant>,
    locked_until: Option<Instant>,
}

/// Failed password logins: per (address, user name) pair, and across all of them (counted
/// in fixed windows, read as a sliding one: the previous window's count weighted by how much
/// of it the sliding window still covers, plus the current one's).
#[derive(Debug)]
pub(super) struct Throttle {
    pairs: HashMap<Pair, Failures>,
    /// When each address (an IPv6 address by its /64) last had a failed login: a login of
    /// a pair that has not failed, from an address that has, waits in the failed lane, so
    /// a guesser that changes user name at each guess cannot keep the clean lane full.
    /// At most `MAX_TRACKED`; stale entries go first.
    addrs: HashMap<IpAddr, Instant>,
    cur: u32,
    prev: u32,
    start: Instant,
    /// The global limit was passed in the current window (logged once a window).
    braked: bool,
}

impl Throttle {
    pub(super) fn new() -> Throttle {
        Throttle {
            pairs: HashMap::new(),
            addrs: HashMap::new(),
            cur: 0,
            prev: 0,
            start: Instant::now(),
            braked: false,
        }
    }

    fn roll(&mut self, now: Instant, window: Duration) {
        let e = now.saturating_duration_since(self.start);
        if e >= window * 2 {
            (self.prev, self.cur, self.start) = (0, 0, now);
            self.braked = false;
        } else if e >= window {
            (self.prev, self.cur) = (self.cur, 0);
            self.start += window;
            self.braked = false;
        }
    }

    /// Failures over the last `window`, as estimated.
    fn rate(&mut self, now: Instant, window: Duration) -> u32 {
        self.roll(now, window);
        let into = now.saturating_duration_since(self.start).as_secs_f64() / window.as_secs_f64();
        // Truncation is meant: an estimate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let prev = (f64::from(self.prev) * (1.0 - into).max(0.0)) as u32;
        prev.saturating_add(self.cur)
    }
}

impl ConfigAuth {
    pub(super) fn throttle(&self) -> std::sync::MutexGuard<'_, Throttle> {
        hayate_core::sync::lock(&self.throttle)
    }

    /// The pair a password login from `peer` as `name` is counted under (none over Unix
    /// sockets and in-process transports: those are never throttled).
    pub(super) fn pair(&self, peer: Option<IpAddr>, name: &str) -> Option<Pair> {
        let ip = peer?;
        let mut h = Sha256::new();
        h.update(self.secret);
        h.update(b"pair\0");
        h.update(name.as_bytes());
        let d: [u8; 32] = h.finalize().into();
        let mut k = [0u8; 16];
        k.copy_from_slice(&d[..16]);
        Some((ip, k))
    }

    /// Whether a password login of `pair` may be checked, and in which lane: refused while
    /// the pair is locked out, and while the global failure rate is past its limit if the
    /// pair has failed within the window.
    pub(super) fn gate(&self, pair: Option<Pair>) -> Result<Lane, AuthError> {
        let Some(p) = pair else {
            return Ok(Lane::Clean);
        };
        let now = Instant::now();
        let mut t = self.throttle();
        let addr_failed = t
            .addrs
            .get(&crate::auth::address_group(p.0))
            .is_some_and(|&at| now.duration_since(at) <= self.window);
        let lane = if addr_failed {
            Lane::Failed
        } else {
            Lane::Clean
        };
        let Some(f) = t.pairs.get(&p) else {
            return Ok(lane);
        };
        if f.locked_until.is_some_and(|u| now < u) {
            return Err(AuthError::Throttled);
        }
        let failed_lately = f.count > 0
            && f.since
                .is_some_and(|s| now.duration_since(s) <= self.window);
        if !failed_lately {
            return Ok(lane);
        }
        if self.global_max_failures > 0 && t.rate(now, self.window) >= self.global_max_failures {
            return Err(AuthError::Throttled);
        }
        Ok(Lane::Failed)
    }

    /// A good password: the pair's failures are forgotten.
    pub(super) fn succeeded(&self, pair: Option<Pair>) {
        if let Some(p) = pair {
            self.throttle().pairs.remove(&p);
        }
    }

    /// A wrong password (or unknown user): counted for the pair and globally.
    pub(super) fn failed(&self, pair: Option<Pair>) {
        let Some(p) = pair else { return };
        let now = Instant::now();
        let mut all = self.throttle();
        all.roll(now, self.window);
        all.cur = all.cur.saturating_add(1);
        if self.global_max_failures > 0
            && !all.braked
            && all.rate(now, self.window) >= self.global_max_failures
        {
            all.braked = true;
            tracing::warn!(
                limit = self.global_max_failures,
                "too many failed logins across all addresses: (address, user) pairs that failed in the last minute are refused unchecked"
            );
        }
        // Counted even without lock-outs (`max_failures = 0`): the lane and the global
        // limit ask whether a pair has failed lately.
        if all.pairs.len() >= MAX_TRACKED && !all.pairs.contains_key(&p) {
            // Forget pairs that are neither locked out nor recent; if none, any one.
            let stale: Vec<Pair> = all
                .pairs
                .iter()
                .filter(|(_, f)| {
                    f.locked_until.is_none_or(|t| t <= now)
                        && f.since.is_none_or(|s| now.duration_since(s) > self.window)
                })
                .map(|(k, _)| *k)
                .take(1024)
                .collect();
            if stale.is_empty()
                && let Some(k) = all.pairs.keys().next().copied()
            {
                all.pairs.remove(&k);
            }
            for k in stale {
                all.pairs.remove(&k);
            }
        }
        let group = crate::auth::address_group(p.0);
        if all.addrs.len() >= MAX_TRACKED && !all.addrs.contains_key(&group) {
            let window = self.window;
            all.addrs.retain(|_, at| now.duration_since(*at) <= window);
            if all.addrs.len() >= MAX_TRACKED
                && let Some(k) = all.addrs.keys().next().copied()
            {
                all.addrs.remove(&k);
            }
        }
        all.addrs.insert(group, now);
        let f = all.pairs.entry(p).or_default();
        if f.since.is_none_or(|s| now.duration_since(s) > self.window) {
            f.since = Some(now);
            f.count = 0;
        }
        f.count += 1;
        if self.max_failures > 0 && f.count >= self.max_failures {
            f.locked_until = Some(now + self.lockout);
            f.count = 0;
            f.since = None;
            tracing::warn!(peer = %p.0, secs = self.lockout.as_secs(), "too many failed logins: this user name locked out from this address");
        }
    }
}
