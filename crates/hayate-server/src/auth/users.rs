//! [`ConfigAuth`]: users, tokens, groups and permissions from the `[auth]` section, with
//! argon2 password checks off the async threads and failed-login throttling per address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use hayate_core::KeyExpr;
use sha2::{Digest, Sha256};

use super::Revoked;
use super::access::{Access, Grant, Rule};
use super::{AuthError, AuthFuture, Authenticator, Credentials, Identity};
use crate::config::{AuthSection, Permissions};

/// Bearer tokens start with this (a password that does is taken as a token).
pub const TOKEN_PREFIX: &str = "hyt_";

/// At most this many argon2 checks run at once (each takes a core for tens of ms); further
/// logins wait their turn.
const HASH_CHECKS: usize = 2;
/// Source addresses remembered for throttling; past it, the oldest entries go.
const MAX_TRACKED: usize = 65_536;

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
    hash: Option<String>,
    /// Kept across reloads while the user stays configured (its connections share it).
    access: Arc<Grant>,
}

#[derive(Debug, Default)]
struct Failures {
    count: u32,
    since: Option<Instant>,
    locked_until: Option<Instant>,
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
    checks: Arc<tokio::sync::Semaphore>,
    failures: Mutex<HashMap<IpAddr, Failures>>,
    max_failures: u32,
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
                PasswordHash::new(h).map_err(|e| {
                    format!("auth.users.{name}.password_hash: not a PHC hash string ({e}); make one with `hayate user add {name}`")
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
                    hash: u.password_hash.clone(),
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
            checks: Arc::new(tokio::sync::Semaphore::new(HASH_CHECKS)),
            failures: Mutex::new(HashMap::new()),
            max_failures: section.max_failures,
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
            checks: Arc::new(tokio::sync::Semaphore::new(1)),
            failures: Mutex::new(HashMap::new()),
            max_failures: 0,
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

    fn throttled(&self, peer: Option<IpAddr>) -> bool {
        let Some(ip) = peer else { return false };
        let f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.get(&ip)
            .and_then(|x| x.locked_until)
            .is_some_and(|t| Instant::now() < t)
    }

    fn failed(&self, peer: Option<IpAddr>) {
        let Some(ip) = peer else { return };
        if self.max_failures == 0 {
            return;
        }
        let now = Instant::now();
        let mut all = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_TRACKED && !all.contains_key(&ip) {
            // Forget addresses that are neither locked out nor recent; if none, any one.
            let stale: Vec<IpAddr> = all
                .iter()
                .filter(|(_, f)| {
                    f.locked_until.is_none_or(|t| t <= now)
                        && f.since.is_none_or(|s| now.duration_since(s) > self.window)
                })
                .map(|(k, _)| *k)
                .take(1024)
                .collect();
            if stale.is_empty()
                && let Some(k) = all.keys().next().copied()
            {
                all.remove(&k);
            }
            for k in stale {
                all.remove(&k);
            }
        }
        let f = all.entry(ip).or_default();
        if f.since.is_none_or(|s| now.duration_since(s) > self.window) {
            f.since = Some(now);
            f.count = 0;
        }
        f.count += 1;
        if f.count >= self.max_failures {
            f.locked_until = Some(now + self.lockout);
            f.count = 0;
            f.since = None;
            tracing::warn!(peer = %ip, secs = self.lockout.as_secs(), "too many failed logins: address locked out");
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

    async fn check_password(&self, u: &User, password: &[u8]) -> bool {
        let fp = self.fingerprint(&u.name, password);
        if self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&u.name)
            == Some(&fp)
        {
            return true;
        }
        let Ok(_permit) = self.checks.clone().acquire_owned().await else {
            return false;
        };
        let hash = u.hash.clone().unwrap_or_else(|| dummy_hash().to_owned());
        let has_hash = u.hash.is_some();
        let pw = password.to_vec();
        let ok = tokio::task::spawn_blocking(move || verify(&hash, &pw))
            .await
            .unwrap_or(false)
            && has_hash;
        if ok {
            self.verified
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(u.name.clone(), fp);
        }
        ok
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
        match t.users.get(name) {
            Some(u) => match creds.password {
                Some(p) if self.check_password(u, p).await => Ok(self.identity(u)),
                _ => Err(AuthError::BadCredentials),
            },
            None => {
                // The same work as for a known user: the answer's timing does not tell
                // which user names exist.
                let _ = self
                    .check_password(
                        &User {
                            name: "".into(),
                            hash: None,
                            access: Grant::all(),
                        },
                        creds.password.unwrap_or_default(),
                    )
                    .await;
                Err(AuthError::BadCredentials)
            }
        }
    }
}

fn verify(phc: &str, password: &[u8]) -> bool {
    PasswordHash::new(phc).is_ok_and(|h| Argon2::default().verify_password(password, &h).is_ok())
}

/// A hash nobody's password matches, checked for unknown users.
fn dummy_hash() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| hash_password("hayate: no such user").unwrap_or_default())
}

impl Authenticator for ConfigAuth {
    fn authenticate<'a>(&'a self, protocol: &'a str, creds: Credentials<'a>) -> AuthFuture<'a> {
        Box::pin(async move {
            if self.throttled(creds.peer) {
                // Not logged above debug: a locked-out address could flood the log.
                tracing::debug!(protocol, peer = ?creds.peer, "login refused: address locked out");
                return Err(AuthError::Throttled);
            }
            let r = self.check(creds).await.and_then(|id| self.take_slot(id));
            match &r {
                Ok(id) => {
                    tracing::debug!(protocol, user = id.name(), peer = ?creds.peer, "login");
                }
                Err(e) => {
                    if *e == AuthError::BadCredentials {
                        self.failed(creds.peer);
                    }
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
                password_hash: Some(hash_password("secret").unwrap_or_default()),
                tokens: vec![token_digest(token.as_bytes())],
                ..UserConfig::default()
            },
        );
        // Two failures below (token checks) plus the three wrong passwords further down.
        s.max_failures = 5;
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
        // Wrong passwords: the fifth failure locks the address out, even for the right
        // password.
        for _ in 0..2 {
            assert_eq!(
                rt.block_on(closed.authenticate("t", c(Some("alice"), Some(b"nope"))))
                    .err(),
                Some(AuthError::BadCredentials)
            );
        }
        assert_eq!(
            rt.block_on(closed.authenticate("t", c(Some("bob"), Some(b"x"))))
                .err(),
            Some(AuthError::BadCredentials)
        );
        assert_eq!(
            rt.block_on(closed.authenticate("t", c(Some("alice"), Some(b"secret"))))
                .err(),
            Some(AuthError::Throttled)
        );
        // Another address is not affected.
        let other = Credentials {
            peer: Some(IpAddr::from([10, 0, 0, 2])),
            ..c(Some("alice"), Some(b"secret"))
        };
        assert!(rt.block_on(closed.authenticate("t", other)).is_ok());
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
