//! `ConfigAuth`'s tests: users, tokens, anonymous logins, throttling and the password-check
//! lanes, reloads, and refused sections.

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
    let auth = ConfigAuth::from_section(&AuthSection::default()).unwrap_or_else(|e| panic!("{e}"));
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
