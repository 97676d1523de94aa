//! Password guessing against a broker with users (issue 44, items 4 and 12): a lock-out is
//! kept per (address, user name), so one local process guessing one user's password locks
//! out no other user from the same address; past the global failure rate, pairs that have
//! failed lately are refused unchecked, whatever their address; and the argon2 checks'
//! memory is charged to the memory budget.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;

use argon2::password_hash::{PasswordHasher, SaltString};
use common::{http, start, within};
use hayate_client::peer::ShmMode;
use hayate_client::{Client, ConnectOptions};
use hayate_server::Config;
use hayate_server::config::UserConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A user whose password hash is cheap to check (1 MiB, one pass): tests make many checks.
fn user(password: &str) -> UserConfig {
    let params = argon2::Params::new(1024, 1, 1, None).unwrap();
    let a = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let salt = SaltString::encode_b64(b"hayate test salt").unwrap();
    UserConfig {
        password_hash: Some(
            a.hash_password(password.as_bytes(), &salt)
                .unwrap()
                .to_string(),
        ),
        ..UserConfig::default()
    }
}

fn mqtt_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&u16::try_from(s.len()).unwrap().to_be_bytes());
    out.extend_from_slice(s);
}

/// An MQTT 5.0 CONNECT with a user name and password from source address `from` (a
/// 127.0.0.0/8 address): the CONNACK reason code.
async fn mqtt_login(broker: &str, from: [u8; 4], user: &str, password: &str) -> u8 {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    let mut s = s.connect(broker.parse().unwrap()).await.unwrap();
    let mut body = Vec::new();
    mqtt_str(&mut body, b"MQTT");
    body.push(5); // 5.0
    body.push(0x80 | 0x40 | 0x02); // user name, password, clean start
    body.extend_from_slice(&30u16.to_be_bytes());
    body.push(0); // no properties
    mqtt_str(&mut body, b""); // the broker assigns an identifier
    mqtt_str(&mut body, user.as_bytes());
    mqtt_str(&mut body, password.as_bytes());
    let mut packet = vec![0x10, u8::try_from(body.len()).unwrap()];
    packet.extend_from_slice(&body);
    s.write_all(&packet).await.unwrap();
    let mut head = [0u8; 4];
    within(10, s.read_exact(&mut head)).await.unwrap();
    assert_eq!(head[0], 0x20, "not a CONNACK: {head:?}");
    head[3]
}

const ACCEPTED: u8 = 0x00;
const BAD_PASSWORD: u8 = 0x86;
const SERVER_BUSY: u8 = 0x89;

async fn native_login(addr: &str, user: &str, password: &str) -> Result<Client, String> {
    let mut o = ConnectOptions::default()
        .name("login")
        .password(user, password);
    o.shm = ShmMode::Off;
    Client::connect_with(addr, o)
        .await
        .map_err(|e| e.to_string())
}

/// Item 12: ten wrong admin passwords for root from 127.0.0.1 lock root out from there, and
/// nobody else: bob still logs in from 127.0.0.1 over MQTT, the native protocol and the admin
/// API.
#[tokio::test]
async fn one_users_lock_out_locks_out_no_other_user_from_the_address() {
    let mut c = Config::default();
    c.auth.users.insert("root".into(), user("root-pw"));
    c.auth.users.insert("bob".into(), user("bob-pw"));
    c.admin.users = vec!["root".into(), "bob".into()];
    assert_eq!(c.auth.max_failures, 10);
    let b = start(c).await;
    // root:wrong, root:root-pw, bob:bob-pw
    let wrong = ("Authorization", "Basic cm9vdDp3cm9uZw==");
    let root = ("Authorization", "Basic cm9vdDpyb290LXB3");
    let bob = ("Authorization", "Basic Ym9iOmJvYi1wdw==");
    for _ in 0..10 {
        assert_eq!(http(&b.admin, "GET", "/metrics", &[wrong]).await.0, 401);
    }
    // root is locked out from 127.0.0.1 (everywhere), even with the right password ...
    assert_eq!(http(&b.admin, "GET", "/metrics", &[root]).await.0, 429);
    assert_eq!(
        mqtt_login(&b.mqtt, [127, 0, 0, 1], "root", "root-pw").await,
        SERVER_BUSY
    );
    // ... but not from another address ...
    assert_eq!(
        mqtt_login(&b.mqtt, [127, 0, 0, 2], "root", "root-pw").await,
        ACCEPTED
    );
    // ... and bob is not locked out from 127.0.0.1.
    assert_eq!(
        mqtt_login(&b.mqtt, [127, 0, 0, 1], "bob", "bob-pw").await,
        ACCEPTED
    );
    let client = native_login(&b.addr, "bob", "bob-pw").await;
    assert!(client.is_ok(), "{:?}", client.err());
    assert_eq!(http(&b.admin, "GET", "/metrics", &[bob]).await.0, 200);
}

/// Item 4: wrong passwords spread over many addresses (none near its own lock-out) trip the
/// global limit: from then on an address that has failed lately is refused unchecked, and an
/// address that has not is still checked.
#[tokio::test]
async fn the_global_failure_limit_spans_addresses() {
    let mut c = Config::default();
    c.auth.users.insert("alice".into(), user("alice-pw"));
    c.auth.max_failures = 10;
    c.auth.global_max_failures = 20;
    let b = start(c).await;
    for i in 1..=20u8 {
        assert_eq!(
            mqtt_login(&b.mqtt, [127, 0, 0, i], "alice", "guess").await,
            BAD_PASSWORD,
            "127.0.0.{i}"
        );
    }
    for i in 1..=20u8 {
        assert_eq!(
            mqtt_login(&b.mqtt, [127, 0, 0, i], "alice", "guess-2").await,
            SERVER_BUSY,
            "127.0.0.{i}"
        );
    }
    // A right password from an address that has not failed is checked and let in.
    assert_eq!(
        mqtt_login(&b.mqtt, [127, 0, 0, 50], "alice", "alice-pw").await,
        ACCEPTED
    );
}

/// Item 4: the memory of the argon2 checks is charged to the memory budget (one block of the
/// hash's size per check thread, reused), not left uncounted.
#[tokio::test]
async fn password_checks_are_charged_to_the_memory_budget() {
    let mut c = Config::default();
    c.auth.users.insert("alice".into(), user("alice-pw"));
    let b = start(c).await;
    let pool = b.broker.config().memory.clone();
    let before = pool.used();
    assert_eq!(
        mqtt_login(&b.mqtt, [127, 0, 0, 1], "alice", "nope").await,
        BAD_PASSWORD
    );
    let after = pool.used();
    assert!(
        after >= before + 1024 * 1024,
        "{before} -> {after}: the check's 1 MiB is not charged"
    );
    // Further checks reuse it.
    for _ in 0..4 {
        mqtt_login(&b.mqtt, [127, 0, 0, 1], "alice", "nope").await;
    }
    assert!(pool.used() <= after + 1024 * 1024, "{}", pool.used());
}
