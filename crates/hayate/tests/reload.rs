//! Config reload while the broker runs (`POST /api/reload` and SIGHUP): a limit and a
//! permission changed in the file take effect for new connections and logins, a new user
//! can log in, a bad file changes nothing, and the connection up all along is served
//! throughout. A user's permissions changed by a reload apply to its connections already
//! logged in (next publish, and what its subscriptions deliver); a removed user's
//! connections are closed, and nobody else's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use hayate_client::{Client, ConnectOptions, Error, Key};
use hayate_server::Config;
use hayate_server::config::{Permissions, UserConfig};

fn config(per_address: usize, bob: Option<&UserConfig>) -> String {
    config_with(per_address, bob, None)
}

fn config_with(per_address: usize, bob: Option<&UserConfig>, carol: Option<&UserConfig>) -> String {
    let mut c = Config::default();
    c.server.data_dir.clear();
    c.native.listen = vec!["127.0.0.1:0".into()];
    c.native.shm = false;
    c.mqtt.listen.clear();
    c.mqtt.ws.clear();
    c.stomp.listen.clear();
    c.amqp.listen.clear();
    c.admin.listen = vec!["127.0.0.1:0".into()];
    c.admin.users = vec!["alice".into()];
    c.auth.users.insert(
        "alice".into(),
        UserConfig::with_password("alice-pw").unwrap(),
    );
    if let Some(b) = bob {
        c.auth.users.insert("bob".into(), b.clone());
    }
    if let Some(u) = carol {
        c.auth.users.insert("carol".into(), u.clone());
    }
    c.limits.max_connections_per_address = per_address;
    c.to_toml()
}

/// Waits (10 s at most) for the server's refusal of what `c` did: NOT_AUTHORIZED.
async fn assert_refused(c: &Client, what: &str) {
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Error::Server { code, .. }) = c.last_error() {
                return code;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: not refused"));
    assert_eq!(format!("{refused:?}"), "NotAuthorized", "{what}");
}

/// POST /api/reload as alice (off the runtime's threads: the helper blocks).
async fn reload(admin: &str) -> (u16, String) {
    let admin = admin.to_string();
    tokio::task::spawn_blocking(move || {
        common::http(
            &admin,
            "POST",
            "/api/reload",
            // alice:alice-pw
            &[
                ("Authorization", "Basic YWxpY2U6YWxpY2UtcHc="),
                ("Content-Type", "application/json"),
            ],
            "{}",
        )
    })
    .await
    .unwrap()
}

async fn login(addr: &str, user: &str, pw: &str) -> Result<Client, Error> {
    let o = ConnectOptions {
        shm: hayate_client::peer::ShmMode::Off,
        ..Default::default()
    }
    .password(user, pw);
    tokio::time::timeout(Duration::from_secs(10), Client::connect_with(addr, o))
        .await
        .unwrap_or(Err(Error::Closed))
}

#[tokio::test]
async fn reload_changes_limits_and_users_for_new_connections() {
    let dir = std::env::temp_dir().join(format!("hayate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("hayate.toml");
    std::fs::write(&cfg, config(10, None)).unwrap();
    let broker = common::Broker::start(
        &[
            OsStr::new("broker"),
            OsStr::new("--config"),
            cfg.as_os_str(),
        ],
        false,
    );
    let (addr, admin) = (broker.native.clone(), broker.admin.clone().unwrap());
    let kept = login(&addr, "alice", "alice-pw").await.unwrap();
    assert!(login(&addr, "bob", "bob-pw").await.is_err(), "no bob yet");

    // One connection per address from now on, and a user bob who may not publish secret/**.
    let mut bob = UserConfig::with_password("bob-pw").unwrap();
    bob.permissions = Permissions {
        deny_publish: vec!["secret/**".into()],
        ..Permissions::default()
    };
    std::fs::write(&cfg, config(1, Some(&bob))).unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("limits"), "{body}");
    // alice's connection counts as the one: bob's is refused before its handshake.
    assert!(
        login(&addr, "bob", "bob-pw").await.is_err(),
        "the new limit"
    );
    kept.flush()
        .await
        .expect("the connection up all along is served");

    // SIGHUP: the limit back to 10. Bob, added by the first reload, logs in now.
    std::fs::write(&cfg, config(10, Some(&bob))).unwrap();
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &broker.child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        if let Ok(c) = login(&addr, "bob", "bob-pw").await {
            break c;
        }
        assert!(Instant::now() < deadline, "bob never got in after SIGHUP");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The permission the reload gave bob.
    b.publish(&Key::new("open/x").unwrap(), "ok").await.unwrap();
    b.flush().await.unwrap();
    let _ = b.publish(&Key::new("secret/x").unwrap(), "no").await;
    let _ = b.flush().await;
    assert_refused(&b, "bob's publish on secret/x").await;

    // A file that does not parse: refused, nothing changes.
    std::fs::write(&cfg, "[limits\nnot toml").unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 400, "{body}");
    let again = login(&addr, "bob", "bob-pw").await;
    assert!(again.is_ok(), "bob still in after a bad reload");
    kept.flush().await.expect("still served");
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The next message of `sub` within 10 s.
async fn next_key(sub: &mut hayate_client::Subscription) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .ok()
        .flatten()
        .map(|m| m.key.as_str().to_owned())
}

#[tokio::test]
async fn reload_changes_permissions_of_connections_logged_in() {
    let dir = std::env::temp_dir().join(format!("hayate-reload-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("hayate.toml");
    let bob_open = UserConfig::with_password("bob-pw").unwrap();
    let carol = UserConfig::with_password("carol-pw").unwrap();
    std::fs::write(&cfg, config_with(10, Some(&bob_open), Some(&carol))).unwrap();
    let broker = common::Broker::start(
        &[
            OsStr::new("broker"),
            OsStr::new("--config"),
            cfg.as_os_str(),
        ],
        false,
    );
    let (addr, admin) = (broker.native.clone(), broker.admin.clone().unwrap());
    let alice = login(&addr, "alice", "alice-pw").await.unwrap();
    let bob = login(&addr, "bob", "bob-pw").await.unwrap();
    let carol_c = login(&addr, "carol", "carol-pw").await.unwrap();
    let mut bob_sub = bob.subscribe("data/**").await.unwrap();
    let mut carol_sub = carol_c.subscribe("data/**").await.unwrap();
    // A flush answered: the subscriptions are in place.
    bob.flush().await.unwrap();
    carol_c.flush().await.unwrap();
    let publish = |k: &'static str| {
        let alice = &alice;
        async move {
            alice.publish(&Key::new(k).unwrap(), "x").await.unwrap();
            alice.flush().await.unwrap();
        }
    };
    publish("data/secret/1").await;
    assert_eq!(
        next_key(&mut bob_sub).await.as_deref(),
        Some("data/secret/1")
    );
    assert_eq!(
        next_key(&mut carol_sub).await.as_deref(),
        Some("data/secret/1")
    );
    bob.publish(&Key::new("out/1").unwrap(), "ok")
        .await
        .unwrap();
    bob.flush().await.unwrap();
    assert!(bob.last_error().is_none());

    // Bob may no longer read data/secret/** nor publish on out/**: his connection, already
    // logged in, gets the new rules.
    let mut narrowed = bob_open.clone();
    narrowed.permissions = Permissions {
        deny_subscribe: vec!["data/secret/**".into()],
        deny_publish: vec!["out/**".into()],
        ..Permissions::default()
    };
    std::fs::write(&cfg, config_with(10, Some(&narrowed), Some(&carol))).unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 200, "{body}");
    publish("data/secret/2").await;
    publish("data/open/3").await;
    assert_eq!(
        next_key(&mut bob_sub).await.as_deref(),
        Some("data/open/3"),
        "the subscription made before the reload no longer delivers data/secret/**"
    );
    assert_eq!(
        next_key(&mut carol_sub).await.as_deref(),
        Some("data/secret/2")
    );
    assert_eq!(
        next_key(&mut carol_sub).await.as_deref(),
        Some("data/open/3")
    );

    // Widened again: the same subscription delivers data/secret/** once more.
    std::fs::write(&cfg, config_with(10, Some(&bob_open), Some(&carol))).unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 200, "{body}");
    publish("data/secret/4").await;
    assert_eq!(
        next_key(&mut bob_sub).await.as_deref(),
        Some("data/secret/4")
    );
    assert_eq!(
        next_key(&mut carol_sub).await.as_deref(),
        Some("data/secret/4")
    );

    // Narrowed again: bob's next publish on out/** is refused (ERR 8 ends a native
    // connection).
    std::fs::write(&cfg, config_with(10, Some(&narrowed), Some(&carol))).unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 200, "{body}");
    let _ = bob.publish(&Key::new("out/2").unwrap(), "no").await;
    let _ = bob.flush().await;
    assert_refused(&bob, "bob's publish on out/2 after the reload").await;
    drop(bob_sub);
    let bob = login(&addr, "bob", "bob-pw").await.unwrap();
    let mut bob_sub = bob.subscribe("data/**").await.unwrap();
    bob.flush().await.unwrap();

    // Bob removed: his connection is closed; alice's and carol's carry on.
    std::fs::write(&cfg, config_with(10, None, Some(&carol))).unwrap();
    let (status, body) = reload(&admin).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        next_key(&mut bob_sub).await,
        None,
        "the removed user's subscription ends with its connection"
    );
    publish("data/open/5").await;
    assert_eq!(
        next_key(&mut carol_sub).await.as_deref(),
        Some("data/open/5")
    );
    assert!(!carol_c.is_closed());
    assert!(bob.is_closed() || bob.flush().await.is_err());
    assert!(login(&addr, "bob", "bob-pw").await.is_err(), "bob is gone");
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}
