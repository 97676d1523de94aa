//! Config reload while the broker runs (`POST /api/reload` and SIGHUP): a limit and a
//! permission changed in the file take effect for new connections and logins, a new user
//! can log in, a bad file changes nothing, and the connection up all along is served
//! throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use hayate_client::{Client, ConnectOptions, Error, Key};
use hayate_server::Config;
use hayate_server::config::{Permissions, UserConfig};

fn config(per_address: usize, bob: Option<&UserConfig>) -> String {
    let mut c = Config::default();
    c.server.data_dir.clear();
    c.native.listen = vec!["127.0.0.1:0".into()];
    c.native.shm = false;
    c.mqtt.listen.clear();
    c.mqtt.ws.clear();
    c.stomp.listen.clear();
    c.admin.listen = vec!["127.0.0.1:0".into()];
    c.admin.users = vec!["alice".into()];
    c.auth.users.insert(
        "alice".into(),
        UserConfig::with_password("alice-pw").unwrap(),
    );
    if let Some(b) = bob {
        c.auth.users.insert("bob".into(), b.clone());
    }
    c.limits.max_connections_per_address = per_address;
    c.to_toml()
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
    let refused = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Error::Server { code, .. }) = b.last_error() {
                return code;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("bob's publish on secret/x refused");
    assert_eq!(format!("{refused:?}"), "NotAuthorized");

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
