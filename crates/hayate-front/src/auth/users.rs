//! [`ConfigAuth`]: users, tokens, groups and permissions from the `[auth]` section, with
//! argon2 password checks on a bounded pool of their own (`hashing.rs`), failed-login
//! lock-outs per (address, user name) and a global failed-login rate past which pairs that
//! have failed lately are refused unchecked.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, SaltString};
use hayate_core::KeyExpr;
use hayate_io::memory::Memory;
use sha2::{Digest, Sha256};

use super::Revoked;
use super::access::{Access, Grant, Rule};
use super::hashing::{HashStats, Hashers, Lane};
use super::{AuthError, AuthFuture, Authenticator, Credentials, Identity};
use crate::config::{AuthSection, Permissions};

/// Bearer tokens start with this (a password that does is taken as a token).
pub const TOKEN_PREFIX: &str = "hyt_";

/// (address, user name) pairs remembered for throttling; past it, stale entries go first.
const MAX_TRACKED: usize = 65_536;

/// What a failed-login count is kept under: the source address and a keyed digest of the
/// user name given (so that a 64 KiB name costs what a short one does).
type Pair = (IpAddr, [u8; 16]);

/// An argon2id hash (PHC string) of `password`, with a random salt: what `[auth.users.NAME]
/// password_hash` holds (`hayate user add` writes it).
pub fn hash_password(password: &str) -> Result<String, String> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt).map_err(|e| format!("no randomness: {e}"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

/// A new random bearer token (`hyt_` and 64 hex digits: 256 bits).
pub fn new_token() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("no randomness: {e}"))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&b)))
}

/// What the configuration keeps of a token: `sha256:<hex>` (a token is random and long, so a
/// fast digest is safe to keep; the token itself is shown once).
pub fn token_digest(token: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(token)))
}

/// The address a failed login is counted under for the lanes: an IPv4 address as it is, an
/// IPv6 one by its /64 (one host's usual allocation: a guesser cannot step through it).
fn addr_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

#[derive(Debug)]
struct User {
    name: Arc<str>,
    /// PHC string, checked at load.
    hash: Option<Arc<str>>,
    /// Kept across reloads while the user stays configured (its connections share it).
    access: Arc<Grant>,
}

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
struct Throttle {
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
    fn new() -> Throttle {
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

/// Connections open per user.
type PerUser = Arc<Mutex<HashMap<Arc<str>, usize>>>;

/// One connection of a user, counted while it lives.
#[derive(Debug)]
pub struct Slot {
    user: Arc<str>,
    counts: PerUser,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.user);
            }
        }
    }
}

/// The `[auth]` section as an [`Authenticator`].
#[derive(Debug)]
pub struct ConfigAuth {
    /// Users, tokens and whether anonymous clients may connect: replaced whole by
    /// [`ConfigAuth::reload`] (a login reads one version from start to end).
    table: std::sync::RwLock<Arc<Table>>,
    /// Successful password checks, so that a reconnect does not pay argon2 again: user →
    /// SHA-256(process secret, user, password).
    verified: Mutex<HashMap<Arc<str>, [u8; 32]>>,
    secret: [u8; 32],
    hashers: Hashers,
    throttle: Mutex<Throttle>,
    max_failures: u32,
    /// Failed password logins per `window` across all addresses past which pairs that have
    /// failed within the window are refused unchecked (0: no such limit).
    global_max_failures: u32,
    window: Duration,
    lockout: Duration,
    per_user: PerUser,
    max_per_user: usize,
}

/// What `[auth]` says of who may log in (the part [`ConfigAuth::reload`] replaces).
#[derive(Debug)]
struct Table {
    anonymous: bool,
    /// No user and no token configured: a user name is only a label.
    open: bool,
    users: HashMap<String, User>,
    tokens: HashMap<String, Arc<str>>,
    /// What anonymous and open-mode clients get (everything): revoked when a reload ends
    /// open access.
    open_grant: Arc<Grant>,
}

fn exprs(list: &[String], what: &str) -> Result<Vec<KeyExpr>, String> {
    list.iter()
        .map(|s| KeyExpr::new(s).map_err(|e| format!("{what}: {s:?}: {e}")))
        .collect()
}

/// Merges the permissions of a user and its groups into one [`Access`]: the allow lists of
/// one kind are joined (none anywhere: every key), deny lists joined.
fn merge(parts: &[&Permissions], who: &str) -> Result<Access, String> {
    let allow = |get: fn(&Permissions) -> &Option<Vec<String>>, what: &str| {
        let mut out: Option<Vec<KeyExpr>> = None;
        for p in parts {
            if let Some(l) = get(p) {
                out.get_or_insert_with(Vec::new)
                    .extend(exprs(l, &format!("{who}: {what}"))?);
            }
        }
        Ok::<_, String>(out)
    };
    let mut deny_pub = Vec::new();
    let mut deny_sub = Vec::new();
    for p in parts {
        deny_pub.extend(exprs(&p.deny_publish, &format!("{who}: deny_publish"))?);
        deny_sub.extend(exprs(&p.deny_subscribe, &format!("{who}: deny_subscribe"))?);
    }
    let publish = allow(|p| &p.publish, "publish")?;
    let subscribe = allow(|p| &p.subscribe, "subscribe")?;
    let serve = allow(|p| &p.serve, "serve")?;
    let call = allow(|p| &p.call, "call")?;
    Ok(Access {
        serve: Rule {
            allow: serve.or_else(|| subscribe.clone()),
            deny: deny_sub.clone(),
        },
        call: Rule {
            allow: call.or_else(|| publish.clone()),
            deny: deny_pub.clone(),
        },
        publish: Rule {
            allow: publish,
            deny: deny_pub,
        },
        subscribe: Rule {
            allow: subscribe,
            deny: deny_sub,
        },
    })
}

impl ConfigAuth {
    /// The authenticator of an `[auth]` section, or why the section is wrong.
    pub fn from_section(section: &AuthSection) -> Result<ConfigAuth, String> {
        let has_users = !section.users.is_empty();
        if has_users && section.allow_anonymous == Some(true) {
            return Err(
                "auth.allow_anonymous = true with users configured: anonymous access \
                 is off whenever users exist (remove the setting, or the users)"
                    .into(),
            );
        }
        let mut users = HashMap::new();
        let mut tokens = HashMap::new();
        for (name, u) in &section.users {
            if name.is_empty() {
                return Err("auth.users: an empty user name".into());
            }
            let mut parts = vec![&u.permissions];
            for g in &u.groups {
                parts.push(section.groups.get(g).ok_or_else(|| {
                    format!("auth.users.{name}: group {g:?} is not in [auth.groups]")
                })?);
            }
            let access = merge(&parts, &format!("auth.users.{name}"))?;
            if let Some(h) = &u.password_hash {
                let parsed = PasswordHash::new(h).map_err(|e| {
                    format!("auth.users.{name}.password_hash: not a PHC hash string ({e}); make one with `hayate user add {name}`")
                })?;
                argon2::Algorithm::try_from(parsed.algorithm)
                    .and_then(|_| argon2::Params::try_from(&parsed))
                    .map_err(|e| {
                        format!("auth.users.{name}.password_hash: not an argon2 hash this broker can check ({e}); make one with `hayate user add {name}`")
                    })?;
            }
            if u.password_hash.is_none() && u.tokens.is_empty() {
                return Err(format!(
                    "auth.users.{name}: neither a password_hash nor a token: nobody could log in as it"
                ));
            }
            let name_arc: Arc<str> = name.as_str().into();
            for t in &u.tokens {
                let ok = t
                    .strip_prefix("sha256:")
                    .is_some_and(|h| h.len() == 64 && h.bytes().all(|c| c.is_ascii_hexdigit()));
                if !ok {
                    return Err(format!(
                        "auth.users.{name}.tokens: {t:?} is not sha256:<64 hex digits> (`hayate user token {name}` makes one)"
                    ));
                }
                if tokens
                    .insert(t.to_ascii_lowercase(), name_arc.clone())
                    .is_some()
                {
                    return Err(format!(
                        "auth.users.{name}.tokens: {t} belongs to two users"
                    ));
                }
            }
            users.insert(
                name.clone(),
                User {
                    name: name_arc,
                    hash: u.password_hash.as_deref().map(Arc::from),
                    access: Grant::user(access),
                },
            );
        }
        for (g, p) in &section.groups {
            merge(&[p], &format!("auth.groups.{g}"))?;
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| format!("no randomness: {e}"))?;
        Ok(ConfigAuth {
            table: std::sync::RwLock::new(Arc::new(Table {
                anonymous: !has_users && section.allow_anonymous != Some(false),
                open: !has_users,
                users,
                tokens,
                open_grant: Grant::all(),
            })),
            verified: Mutex::new(HashMap::new()),
            secret,
            hashers: Hashers::new(super::hashing::workers()),
            throttle: Mutex::new(Throttle::new()),
            max_failures: section.max_failures,
            global_max_failures: section.global_max_failures,
            window: Duration::from_secs(60),
            lockout: Duration::from_secs(section.lockout_secs),
            per_user: PerUser::default(),
            max_per_user: section.max_connections_per_user,
        })
    }

    /// Refuses everyone (what a server gets when its `[auth]` section is invalid and it was
    /// not validated first: failing closed).
    pub fn deny_all() -> ConfigAuth {
        ConfigAuth {
            table: std::sync::RwLock::new(Arc::new(Table {
                anonymous: false,
                open: false,
                users: HashMap::new(),
                tokens: HashMap::new(),
                open_grant: Grant::all(),
            })),
            verified: Mutex::new(HashMap::new()),
            secret: [0; 32],
            hashers: Hashers::new(1),
            throttle: Mutex::new(Throttle::new()),
            max_failures: 0,
            global_max_failures: 0,
            window: Duration::from_secs(60),
            lockout: Duration::ZERO,
            per_user: PerUser::default(),
            max_per_user: 0,
        }
    }

    fn table(&self) -> Arc<Table> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the users, tokens, groups and anonymous access with those of `section`
    /// (checked first: a bad section changes nothing). Logins from now on use them, and
    /// the cache of verified passwords is emptied (a changed password takes effect). A user
    /// still configured keeps its [`Grant`], given the new permissions: its connections
    /// see them at their next operation. Removed users' grants, and the open grant when
    /// anonymous access ends, are revoked and returned for their connections to be closed.
    /// The lock-out and per-user connection settings stay as they were at start.
    pub fn reload(&self, section: &AuthSection) -> Result<Revoked, String> {
        let fresh = ConfigAuth::from_section(section)?;
        let mut new = Arc::into_inner(
            fresh
                .table
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .ok_or("auth reload: the new table is shared")?;
        let mut slot = self
            .table
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = slot.clone();
        let mut revoked = Revoked::default();
        for (name, u) in &old.users {
            match new.users.get_mut(name) {
                Some(n) => {
                    // The same grant, given the new permissions, so that connections
                    // logged in see them.
                    u.access.set(n.access.current().as_ref().clone());
                    n.access = u.access.clone();
                }
                None => {
                    u.access.revoke();
                    revoked.users.push(name.clone());
                }
            }
        }
        if old.open && new.open && new.anonymous == old.anonymous {
            new.open_grant = old.open_grant.clone();
        } else if old.anonymous {
            old.open_grant.revoke();
            revoked.all = true;
        }
        *slot = Arc::new(new);
        drop(slot);
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        revoked.users.sort();
        Ok(revoked)
    }

    fn identity(&self, u: &User) -> Identity {
        Identity {
            user: Some(u.name.clone()),
            access: u.access.clone(),
            slot: None,
        }
    }

    /// Counts one more connection of `id`'s user (configured users only), or refuses it.
    fn take_slot(&self, mut id: Identity) -> Result<Identity, AuthError> {
        let open = self.table().open;
        let Some(user) = id.user.clone().filter(|_| !open) else {
            return Ok(id);
        };
        let mut m = self.per_user.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(user.clone()).or_insert(0);
        if self.max_per_user > 0 && *n >= self.max_per_user {
            return Err(AuthError::TooManyConnections);
        }
        *n += 1;
        drop(m);
        id.slot = Some(Arc::new(Slot {
            user,
            counts: self.per_user.clone(),
        }));
        Ok(id)
    }

    /// Charges the memory of the argon2 checks to `pool` (the broker's memory budget): call
    /// before the first login.
    pub fn charge_to(&self, pool: &Arc<Memory>) {
        self.hashers.charge_to(pool);
    }

    /// What the argon2 pool has done (checks at once, their peak, busy refusals, memory).
    pub fn hash_stats(&self) -> HashStats {
        self.hashers.stats()
    }

    fn throttle(&self) -> std::sync::MutexGuard<'_, Throttle> {
        self.throttle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pair a password login from `peer` as `name` is counted under (none over Unix
    /// sockets and in-process transports: those are never throttled).
    fn pair(&self, peer: Option<IpAddr>, name: &str) -> Option<Pair> {
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
    fn gate(&self, pair: Option<Pair>) -> Result<Lane, AuthError> {
        let Some(p) = pair else {
            return Ok(Lane::Clean);
        };
        let now = Instant::now();
        let mut t = self.throttle();
        let addr_failed = t
            .addrs
            .get(&addr_group(p.0))
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
    fn succeeded(&self, pair: Option<Pair>) {
        if let Some(p) = pair {
            self.throttle().pairs.remove(&p);
        }
    }

    /// A wrong password (or unknown user): counted for the pair and globally.
    fn failed(&self, pair: Option<Pair>) {
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
        let group = addr_group(p.0);
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

    fn fingerprint(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(self.secret);
        h.update(user.as_bytes());
        h.update([0]);
        h.update(password);
        h.finalize().into()
    }

    /// Whether `password` is `u`'s (a user without a password hash, or an unknown user as
    /// `None`, runs the same check against a dummy hash and is refused).
    async fn check_password(
        &self,
        u: Option<&User>,
        password: &[u8],
        lane: Lane,
    ) -> Result<bool, AuthError> {
        let hashed = u.and_then(|u| u.hash.clone().map(|h| (u, h)));
        let Some((u, hash)) = hashed else {
            // The same work as for a known user: the answer's timing does not tell which
            // user names exist.
            self.hashers
                .verify(dummy_hash(), password, lane)
                .await
                .map_err(|_| AuthError::Busy)?;
            return Ok(false);
        };
        let fp = self.fingerprint(&u.name, password);
        if self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&u.name)
            == Some(&fp)
        {
            return Ok(true);
        }
        let ok = self
            .hashers
            .verify(hash, password, lane)
            .await
            .map_err(|_| AuthError::Busy)?;
        if ok {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(u.name.clone(), fp);
        }
        Ok(ok)
    }

    async fn check(&self, creds: Credentials<'_>) -> Result<Identity, AuthError> {
        let t = self.table();
        if let Some(name) = creds.verified {
            // A verified client certificate: its CN must be a user, and the user name given
            // (if any) the same.
            return match t.users.get(name) {
                Some(u) if creds.user.is_none_or(|n| n.is_empty() || n == name) => {
                    Ok(self.identity(u))
                }
                _ => Err(AuthError::BadCredentials),
            };
        }
        let token = creds.token.or_else(|| {
            creds
                .password
                .filter(|p| p.starts_with(TOKEN_PREFIX.as_bytes()))
        });
        if let Some(tok) = token {
            // 256 random bits, looked up by digest: nothing to guess, nothing to throttle.
            let user = t
                .tokens
                .get(&token_digest(tok))
                .and_then(|name| t.users.get(&**name));
            return match user {
                Some(u) if creds.user.is_none_or(|n| n.is_empty() || n == &*u.name) => {
                    Ok(self.identity(u))
                }
                _ => Err(AuthError::BadCredentials),
            };
        }
        let Some(name) = creds.user.filter(|n| !n.is_empty()) else {
            return if t.anonymous {
                Ok(Identity {
                    user: None,
                    access: t.open_grant.clone(),
                    slot: None,
                })
            } else {
                Err(AuthError::NotAuthorized)
            };
        };
        if t.open {
            return if t.anonymous {
                // No users: a user name is only a label (as in Mosquitto without a
                // password file).
                Ok(Identity {
                    user: Some(name.into()),
                    access: t.open_grant.clone(),
                    slot: None,
                })
            } else {
                Err(AuthError::BadCredentials)
            };
        }
        // A password login: throttled per (address, user name) and globally.
        let pair = self.pair(creds.peer, name);
        let lane = self.gate(pair)?;
        let user = t.users.get(name);
        let ok = match creds.password {
            Some(p) => self.check_password(user, p, lane).await?,
            None => false,
        };
        match user {
            Some(u) if ok => {
                self.succeeded(pair);
                Ok(self.identity(u))
            }
            _ => {
                self.failed(pair);
                Err(AuthError::BadCredentials)
            }
        }
    }
}

/// A hash nobody's password matches (its output is no argon2 output anyone knows a password
/// for), checked for unknown users and users without a password: the default parameters, so
/// the check costs what a real one does.
fn dummy_hash() -> Arc<str> {
    static H: OnceLock<Arc<str>> = OnceLock::new();
    H.get_or_init(|| {
        "$argon2id$v=19$m=19456,t=2,p=1$aGF5YXRlOiBubyB1c2Vy$bm8gc3VjaCB1c2VyOiBubyBwYXNzd29yZCBtYXRjaGVz".into()
    })
    .clone()
}

impl Authenticator for ConfigAuth {
    fn authenticate<'a>(&'a self, protocol: &'a str, creds: Credentials<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            let r = self.check(creds).await.and_then(|id| self.take_slot(id));
            match &r {
                Ok(id) => {
                    tracing::debug!(protocol, user = id.name(), peer = ?creds.peer, "login");
                }
                Err(AuthError::Throttled | AuthError::Busy) => {
                    // Not logged above debug: a flood of them could flood the log.
                    tracing::debug!(protocol, user = creds.user.unwrap_or("-"), peer = ?creds.peer, "login refused unchecked: {}", r.as_ref().err().map(ToString::to_string).unwrap_or_default());
                }
                Err(e) => {
                    tracing::info!(protocol, user = creds.user.unwrap_or("-"), peer = ?creds.peer, "login refused: {e}");
                }
            }
            r
        })
    }

    fn required(&self) -> bool {
        !self.table().anonymous
    }

    fn reload(&self, section: &AuthSection) -> Result<Revoked, String> {
        ConfigAuth::reload(self, section)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UserConfig;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn users_tokens_anonymous_and_throttling() {
        let token = new_token().unwrap_or_default();
        let mut s = AuthSection::default();
        let open = ConfigAuth::from_section(&s).unwrap_or_else(|e| panic!("{e}"));
        let rt = rt();
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        let c = |user, password: Option<&'static [u8]>| Credentials {
            user,
            password,
            token: None,
            peer,
            verified: None,
        };
        assert!(rt.block_on(open.authenticate("t", c(None, None))).is_ok());
        assert!(
            rt.block_on(open.authenticate("t", c(Some("x"), Some(b"y"))))
                .is_ok()
        );
        s.users.insert(
            "alice".into(),
            UserConfig {
                password_hash: Some(cheap_hash("secret")),
                tokens: vec![token_digest(token.as_bytes())],
                ..UserConfig::default()
            },
        );
        s.users.insert(
            "carol".into(),
            UserConfig {
                password_hash: Some(cheap_hash("carol-pw")),
                ..UserConfig::default()
            },
        );
        // Per (address, user name): wrong tokens do not count.
        s.max_failures = 3;
        s.lockout_secs = 60;
        let closed = ConfigAuth::from_section(&s).unwrap_or_else(|e| panic!("{e}"));
        assert!(closed.required());
        assert_eq!(
            rt.block_on(closed.authenticate("t", c(None, None))).err(),
            Some(AuthError::NotAuthorized)
        );
        let id = rt
            .block_on(closed.authenticate("t", c(Some("alice"), Some(b"secret"))))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(id.name(), "alice");
        // The token, as a token or as a password, with or without the user name.
        let tok: &'static [u8] = Box::leak(token.clone().into_bytes().into_boxed_slice());
        assert!(
            rt.block_on(closed.authenticate("t", c(None, Some(tok))))
                .is_ok()
        );
        assert!(
            rt.block_on(closed.authenticate("t", c(Some("alice"), Some(tok))))
                .is_ok()
        );
        assert!(
            rt.block_on(closed.authenticate("t", c(Some("bob"), Some(tok))))
                .is_err()
        );
        let as_token = Credentials {
            token: Some(tok),
            ..c(None, None)
        };
        assert!(rt.block_on(closed.authenticate("t", as_token)).is_ok());
        assert!(
            rt.block_on(closed.authenticate("t", c(None, Some(b"hyt_0000"))))
                .is_err()
        );
        // Wrong passwords for alice: a good login forgets the earlier ones; then the third
        // locks alice out from this address, even with the right password.
        let wrong = |user| {
            rt.block_on(closed.authenticate("t", c(Some(user), Some(b"nope"))))
                .err()
        };
        for _ in 0..2 {
            assert_eq!(wrong("alice"), Some(AuthError::BadCredentials));
        }
        assert!(
            rt.block_on(closed.authenticate("t", c(Some("alice"), Some(b"secret"))))
                .is_ok()
        );
        for _ in 0..2 {
            assert_eq!(wrong("alice"), Some(AuthError::BadCredentials));
        }
        // Another name's failures are its own.
        assert_eq!(wrong("bob"), Some(AuthError::BadCredentials));
        assert_eq!(wrong("alice"), Some(AuthError::BadCredentials));
        assert_eq!(
            rt.block_on(closed.authenticate("t", c(Some("alice"), Some(b"secret"))))
                .err(),
            Some(AuthError::Throttled)
        );
        // Another user from the same address, and alice from another address, are not
        // affected.
        assert!(
            rt.block_on(closed.authenticate("t", c(Some("carol"), Some(b"carol-pw"))))
                .is_ok()
        );
        let other = Credentials {
            peer: Some(IpAddr::from([10, 0, 0, 2])),
            ..c(Some("alice"), Some(b"secret"))
        };
        assert!(rt.block_on(closed.authenticate("t", other)).is_ok());
    }

    /// A cheap argon2id hash (1 MiB, one pass), so that tests can make many checks.
    fn cheap_hash(password: &str) -> String {
        let params = argon2::Params::new(1024, 1, 1, None).unwrap_or_else(|e| panic!("{e}"));
        let a = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap_or_else(|e| panic!("{e}"));
        a.hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn peer(a: u8, b: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, a, b]))
    }

    /// A guesser that changes user name at each guess: none of its (address, user) pairs
    /// has failed, but its addresses have, so its guesses wait in the failed lane and a
    /// first login from another address still goes ahead of them. (Keyed by pair alone,
    /// they filled the clean lane and the right password waited behind all of them.)
    #[test]
    fn a_guesser_changing_user_names_does_not_hold_the_clean_lane() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut s = AuthSection::default();
        // Checks slow enough (4 MiB each) that 16 guesses take a while on two threads.
        let params = argon2::Params::new(4096, 1, 1, None).unwrap_or_else(|e| panic!("{e}"));
        let a = Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let salt = SaltString::encode_b64(b"0123456789abcdef").unwrap_or_else(|e| panic!("{e}"));
        let hash = a
            .hash_password(b"right", &salt)
            .map(|h| h.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        for i in 0..25 {
            s.users.insert(
                format!("u{i}"),
                UserConfig {
                    password_hash: Some(hash.clone()),
                    ..UserConfig::default()
                },
            );
        }
        s.max_failures = 0;
        s.global_max_failures = 0;
        let auth = Arc::new(ConfigAuth::from_section(&s).unwrap_or_else(|e| panic!("{e}")));
        let login = |auth: &Arc<ConfigAuth>, user: String, pw: &'static [u8], peer| {
            let auth = auth.clone();
            async move {
                auth.authenticate(
                    "t",
                    Credentials {
                        user: Some(&user),
                        password: Some(pw),
                        token: None,
                        peer,
                        verified: None,
                    },
                )
                .await
                .map(|_| ())
            }
        };
        rt.block_on(async {
            // Eight addresses fail once each, each with a name of its own.
            for i in 0..8u8 {
                assert_eq!(
                    login(&auth, format!("u{i}"), b"wrong", peer(0, i)).await,
                    Err(AuthError::BadCredentials)
                );
            }
            // Then 16 guesses at once, each under a name not tried before.
            let guesses: Vec<_> = (0..16u8)
                .map(|i| {
                    tokio::spawn(login(
                        &auth,
                        format!("u{}", 8 + i),
                        b"wrong",
                        peer(0, i % 8),
                    ))
                })
                .collect();
            let workers = auth.hash_stats().workers;
            while auth.hash_stats().running < workers {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(
                login(&auth, "u24".into(), b"right", peer(1, 1)).await,
                Ok(())
            );
            let waiting = guesses.iter().filter(|g| !g.is_finished()).count();
            assert!(
                waiting >= 8,
                "only {waiting} of 16 guesses still waiting: the right password waited behind them"
            );
            for g in guesses {
                assert_eq!(g.await.ok(), Some(Err(AuthError::BadCredentials)));
            }
        });
    }

    /// Issue 44, item 4: guesses from many addresses at once neither run more argon2 checks
    /// at once than the pool has, nor keep a right password waiting behind them, and past
    /// the waiting room they are refused as busy (not as wrong, not counted).
    #[test]
    fn checks_are_capped_and_a_clean_login_goes_first() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut s = AuthSection::default();
        s.users.insert(
            "alice".into(),
            UserConfig {
                password_hash: Some(cheap_hash("right")),
                ..UserConfig::default()
            },
        );
        s.max_failures = 0;
        s.global_max_failures = 0;
        let auth = Arc::new(ConfigAuth::from_section(&s).unwrap_or_else(|e| panic!("{e}")));
        let login = |auth: &Arc<ConfigAuth>, pw: &'static [u8], peer| {
            let auth = auth.clone();
            async move {
                auth.authenticate(
                    "t",
                    Credentials {
                        user: Some("alice"),
                        password: Some(pw),
                        token: None,
                        peer,
                        verified: None,
                    },
                )
                .await
                .map(|_| ())
            }
        };
        rt.block_on(async {
            // Eight addresses fail once each: their pairs have failed lately.
            for i in 0..8 {
                assert_eq!(
                    login(&auth, b"wrong", peer(0, i)).await,
                    Err(AuthError::BadCredentials)
                );
            }
            // Then they guess at once: 16 in flight, which fit the waiting room.
            let guesses: Vec<_> = (0..16u8)
                .map(|i| tokio::spawn(login(&auth, b"wrong", peer(0, i % 8))))
                .collect();
            let workers = auth.hash_stats().workers;
            while auth.hash_stats().running < workers {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // The right password from an address that has not failed goes ahead of the
            // waiting guesses: when it is in, most of them are still waiting.
            assert_eq!(login(&auth, b"right", peer(1, 1)).await, Ok(()));
            let waiting = guesses.iter().filter(|g| !g.is_finished()).count();
            assert!(
                waiting >= 8,
                "only {waiting} of 16 guesses still waiting: the right password waited behind them"
            );
            for g in guesses {
                assert_eq!(g.await.ok(), Some(Err(AuthError::BadCredentials)));
            }
            // 40 at once: the waiting room takes 16; the others are refused as busy.
            let guesses: Vec<_> = (0..40u8)
                .map(|i| tokio::spawn(login(&auth, b"wrong", peer(0, i % 8))))
                .collect();
            let mut busy = 0;
            for g in guesses {
                match g.await.ok() {
                    Some(Err(AuthError::Busy)) => busy += 1,
                    Some(Err(AuthError::BadCredentials)) => {}
                    r => panic!("{r:?}"),
                }
            }
            assert!(busy >= 10, "{busy} busy of 40");
        });
        let st = auth.hash_stats();
        assert!(st.peak >= 1 && st.peak <= st.workers, "{st:?}");
        assert!(st.workers <= 2, "{st:?}");
        assert_eq!(st.running, 0, "{st:?}");
        // The pool's memory: one 1 MiB block per thread that ran, reused.
        assert!(st.memory <= st.workers * 1024 * 1024, "{st:?}");
    }

    /// Issue 44, item 4: past the global failure rate, a pair that has failed lately is
    /// refused unchecked from any address; a pair that has not is still checked.
    #[test]
    fn the_global_failure_limit_spans_addresses() {
        let rt = rt();
        let mut s = AuthSection::default();
        s.users.insert(
            "alice".into(),
            UserConfig {
                password_hash: Some(cheap_hash("right")),
                ..UserConfig::default()
            },
        );
        s.max_failures = 10;
        s.global_max_failures = 5;
        let auth = ConfigAuth::from_section(&s).unwrap_or_else(|e| panic!("{e}"));
        let login = |pw: &'static [u8], peer| {
            rt.block_on(auth.authenticate(
                "t",
                Credentials {
                    user: Some("alice"),
                    password: Some(pw),
                    token: None,
                    peer,
                    verified: None,
                },
            ))
            .map(|_| ())
        };
        for i in 0..8 {
            assert_eq!(login(b"wrong", peer(0, i)), Err(AuthError::BadCredentials));
        }
        let done = auth.hash_stats().done;
        for i in 0..8 {
            assert_eq!(
                login(b"wrong", peer(0, i)),
                Err(AuthError::Throttled),
                "address {i}"
            );
        }
        assert_eq!(auth.hash_stats().done, done, "refused unchecked");
        assert_eq!(login(b"right", peer(1, 1)), Ok(()));
    }

    #[test]
    fn reload_changes_grants_in_place_and_revokes() {
        use hayate_core::{Key, KeyExpr};
        let rt = rt();
        let c = |user: Option<&'static str>, password: Option<&'static [u8]>| Credentials {
            user,
            password,
            token: None,
            peer: None,
            verified: None,
        };
        let k = |s: &str| Key::new(s).unwrap_or_else(|e| panic!("{e}"));
        let e = |s: &str| KeyExpr::new(s).unwrap_or_else(|e| panic!("{e}"));
        // Open: an anonymous client and a labelled one share the open grant.
        let auth =
            ConfigAuth::from_section(&AuthSection::default()).unwrap_or_else(|e| panic!("{e}"));
        let anon = rt
            .block_on(auth.authenticate("t", c(None, None)))
            .unwrap_or_else(|e| panic!("{e}"));
        let label = rt
            .block_on(auth.authenticate("t", c(Some("x"), None)))
            .unwrap_or_else(|e| panic!("{e}"));
        // Reloading the same open section keeps them.
        let r = auth
            .reload(&AuthSection::default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r, Revoked::default());
        assert!(anon.access.check_publish(&k("a"), false).is_ok());
        // Users appear: open access ends, every earlier login is revoked.
        let user = |deny: &[&str]| UserConfig {
            password_hash: Some(hash_password("pw").unwrap_or_default()),
            permissions: crate::config::Permissions {
                deny_publish: deny.iter().map(|s| s.to_string()).collect(),
                deny_subscribe: deny.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
            ..UserConfig::default()
        };
        let mut s = AuthSection::default();
        s.users.insert("alice".into(), user(&[]));
        s.users.insert("bob".into(), user(&[]));
        let r = auth.reload(&s).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.all && r.users.is_empty(), "{r:?}");
        for id in [&anon, &label] {
            assert_eq!(
                id.access.check_publish(&k("a"), false),
                Err(crate::auth::Denied::Revoked)
            );
        }
        let alice = rt
            .block_on(auth.authenticate("t", c(Some("alice"), Some(b"pw"))))
            .unwrap_or_else(|e| panic!("{e}"));
        let bob = rt
            .block_on(auth.authenticate("t", c(Some("bob"), Some(b"pw"))))
            .unwrap_or_else(|e| panic!("{e}"));
        let guard = alice
            .access
            .check_subscribe(&e("s/**"), false, "_inbox/a")
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("a configured user's subscription is guarded"));
        assert!(guard.admits(&k("s/secret/1")));
        // alice narrowed, bob removed: alice's identity and guard see the new rules.
        s.users.insert("alice".into(), user(&["s/secret/**"]));
        s.users.remove("bob");
        let r = auth.reload(&s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.users, vec!["bob".to_string()]);
        assert!(!r.all);
        assert!(alice.access.check_publish(&k("s/secret/1"), false).is_err());
        assert!(alice.access.check_publish(&k("s/open"), false).is_ok());
        assert!(!guard.admits(&k("s/secret/1")));
        assert!(guard.admits(&k("s/open")));
        assert_eq!(
            bob.access.check_publish(&k("s/open"), false),
            Err(crate::auth::Denied::Revoked)
        );
        assert!(
            rt.block_on(auth.authenticate("t", c(Some("bob"), Some(b"pw"))))
                .is_err()
        );
        // Widened again.
        s.users.insert("alice".into(), user(&[]));
        auth.reload(&s).unwrap_or_else(|e| panic!("{e}"));
        assert!(guard.admits(&k("s/secret/1")));
        // A bad section changes nothing.
        s.users.insert("alice".into(), user(&["a//b"]));
        assert!(auth.reload(&s).is_err());
        assert!(alice.access.check_publish(&k("s/secret/1"), false).is_ok());
    }

    #[test]
    fn bad_sections_are_refused_with_a_reason() {
        let mut s = AuthSection::default();
        s.users.insert(
            "alice".into(),
            UserConfig {
                password_hash: Some("secret".into()),
                ..UserConfig::default()
            },
        );
        let e = ConfigAuth::from_section(&s).err().unwrap_or_default();
        assert!(e.contains("hayate user add alice"), "{e}");
        s.users.insert(
            "alice".into(),
            UserConfig {
                tokens: vec!["abc".into()],
                ..UserConfig::default()
            },
        );
        let e = ConfigAuth::from_section(&s).err().unwrap_or_default();
        assert!(e.contains("sha256:"), "{e}");
        s.users.insert(
            "alice".into(),
            UserConfig {
                tokens: vec![token_digest(b"hyt_x")],
                groups: vec!["ops".into()],
                ..UserConfig::default()
            },
        );
        let e = ConfigAuth::from_section(&s).err().unwrap_or_default();
        assert!(e.contains("ops"), "{e}");
        if let Some(u) = s.users.get_mut("alice") {
            u.groups.clear();
        }
        s.allow_anonymous = Some(true);
        let e = ConfigAuth::from_section(&s).err().unwrap_or_default();
        assert!(e.contains("allow_anonymous"), "{e}");
    }
}
