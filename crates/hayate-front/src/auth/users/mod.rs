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

mod throttle;
use crate::config::{AuthSection, Permissions};
use throttle::Throttle;

/// Bearer tokens start with this (a password that does is taken as a token).
pub const TOKEN_PREFIX: &str = "hyt_";

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
    hash: Option<Arc<str>>,
    /// Kept across reloads while the user stays configured (its connections share it).
    access: Arc<Grant>,
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
mod tests;
