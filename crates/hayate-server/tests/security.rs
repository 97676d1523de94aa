//! Authentication and permissions over the native protocol: credentials in HELLO (ERR 8 on
//! refusal), tokens, anonymous access, deny rules under wildcards, private reply inboxes,
//! the serve permission, `$SYS` read-only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{start, within};
use hayate_client::{Client, ConnectOptions, Error, Key};
use hayate_native::ErrorCode;
use hayate_server::Config;
use hayate_server::config::{Permissions, UserConfig};

fn config(token: &str) -> Config {
    let mut c = Config::default();
    let mut alice = UserConfig::with_password("wonderland").unwrap();
    alice.permissions = Permissions {
        deny_subscribe: vec!["secret/**".into()],
        ..Permissions::default()
    };
    alice.tokens = vec![hayate_server::auth::token_digest(token.as_bytes())];
    c.auth.users.insert("alice".into(), alice);
    let mut svc = UserConfig::with_password("svc-pw").unwrap();
    svc.groups = vec!["services".into()];
    c.auth.users.insert("svc".into(), svc);
    let mut bob = UserConfig::with_password("bob-pw").unwrap();
    bob.permissions = Permissions {
        serve: Some(vec!["nothing/here".into()]),
        ..Permissions::default()
    };
    c.auth.users.insert("bob".into(), bob);
    c.auth.groups.insert(
        "services".into(),
        Permissions {
            serve: Some(vec!["svc/**".into()]),
            ..Permissions::default()
        },
    );
    c
}

async fn login(addr: &str, user: &str, pw: &str) -> Result<Client, Error> {
    Client::connect_with(addr, ConnectOptions::default().password(user, pw)).await
}

/// Waits for the server to end the connection with an ERR, and returns its code.
async fn refused(c: &Client) -> ErrorCode {
    within(10, async {
        loop {
            if let Some(Error::Server { code, .. }) = c.last_error() {
                return code;
            }
            let _ = c.flush().await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

#[tokio::test]
async fn credentials_are_checked_in_hello() {
    let token = hayate_server::auth::new_token().unwrap();
    let b = start(config(&token)).await;
    // Anonymous access is off as soon as users exist.
    match Client::connect(&b.addr).await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::NotAuthorized),
        other => panic!("anonymous HELLO accepted: {other:?}"),
    }
    match login(&b.addr, "alice", "nope").await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::NotAuthorized),
        other => panic!("wrong password accepted: {other:?}"),
    }
    match login(&b.addr, "mallory", "x").await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::NotAuthorized),
        other => panic!("unknown user accepted: {other:?}"),
    }
    login(&b.addr, "alice", "wonderland").await.unwrap();
    Client::connect_with(&b.addr, ConnectOptions::default().token(&token))
        .await
        .unwrap();
    // The URL form.
    Client::connect(&format!("hayate://alice:wonderland@{}", b.addr))
        .await
        .unwrap();
    Client::connect(&format!("hayate://:{token}@{}", b.addr))
        .await
        .unwrap();
    match Client::connect_with(&b.addr, ConnectOptions::default().token("hyt_0123")).await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::NotAuthorized),
        other => panic!("unknown token accepted: {other:?}"),
    }
}

#[tokio::test]
async fn a_wildcard_does_not_reach_denied_keys_nor_other_inboxes() {
    let token = hayate_server::auth::new_token().unwrap();
    let b = start(config(&token)).await;
    let alice = login(&b.addr, "alice", "wonderland").await.unwrap();
    let mut all = alice.subscribe("**").await.unwrap();
    let svc = login(&b.addr, "svc", "svc-pw").await.unwrap();
    let mut requests = svc.queue_subscribe("svc/echo", "echo").await.unwrap();
    let caller = login(&b.addr, "bob", "bob-pw").await.unwrap();
    alice.flush().await.unwrap();
    svc.flush().await.unwrap();
    let server = tokio::spawn(async move {
        let req = requests.next().await.unwrap();
        svc.reply(&req, "the answer").await.unwrap();
        svc.flush().await.unwrap();
        svc
    });
    let reply = within(
        10,
        caller.request(&Key::new("svc/echo").unwrap(), "q", Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(&reply.payload[..], b"the answer");
    let _svc = server.await.unwrap();
    caller
        .publish(&Key::new("secret/x").unwrap(), "hidden")
        .await
        .unwrap();
    caller
        .publish(&Key::new("public/x").unwrap(), "seen")
        .await
        .unwrap();
    caller.flush().await.unwrap();
    // Alice's `**` got the request (svc/echo) and public/x; not the reply in bob's inbox,
    // not secret/x.
    let mut got = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), all.next()).await {
        if !m.key.as_str().starts_with("$SYS/") {
            got.push(m.key.as_str().to_owned()); // ($SYS status comes every few seconds)
        }
    }
    assert_eq!(got, ["svc/echo", "public/x"], "{got:?}");
    // Subscribing to the inboxes outright is refused.
    let snoop = login(&b.addr, "alice", "wonderland").await.unwrap();
    let _s = snoop.subscribe("_inbox/**").await.unwrap();
    assert_eq!(refused(&snoop).await, ErrorCode::NotAuthorized);
}

#[tokio::test]
async fn serving_needs_the_serve_permission_and_sys_is_read_only() {
    let token = hayate_server::auth::new_token().unwrap();
    let b = start(config(&token)).await;
    // Bob may serve nothing/here only: joining svc/echo's queue group is refused.
    let bob = login(&b.addr, "bob", "bob-pw").await.unwrap();
    let _s = bob.queue_subscribe("svc/echo", "echo").await.unwrap();
    assert_eq!(refused(&bob).await, ErrorCode::NotAuthorized);
    // A plain subscription on the same key is not serving (Bob may subscribe to anything).
    let bob = login(&b.addr, "bob", "bob-pw").await.unwrap();
    let _s = bob.subscribe("svc/echo").await.unwrap();
    bob.flush().await.unwrap();
    assert!(bob.last_error().is_none());
    // `$SYS` is read-only, whoever publishes.
    let alice = login(&b.addr, "alice", "wonderland").await.unwrap();
    alice
        .publish(&Key::new("$SYS/broker/uptime").unwrap(), "forged")
        .await
        .unwrap();
    assert_eq!(refused(&alice).await, ErrorCode::NotAuthorized);
}

#[tokio::test]
async fn without_users_anonymous_clients_may_do_everything_but_read_other_inboxes() {
    let b = start(Config::default()).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut all = c.subscribe("**").await.unwrap();
    let d = Client::connect(&b.addr).await.unwrap();
    let mut echo = d.subscribe("svc/x").await.unwrap();
    c.flush().await.unwrap();
    d.flush().await.unwrap();
    let e = Client::connect(&b.addr).await.unwrap();
    let answer = tokio::spawn(async move {
        let r = echo.next().await.unwrap();
        d.reply(&r, "ok").await.unwrap();
        d.flush().await.unwrap();
        d
    });
    let r = e
        .request(&Key::new("svc/x").unwrap(), "q", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(&r.payload[..], b"ok");
    let _d = answer.await.unwrap();
    let mut got = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), all.next()).await {
        if !m.key.as_str().starts_with("$SYS/") {
            got.push(m.key.as_str().to_owned()); // ($SYS status comes every few seconds)
        }
    }
    assert_eq!(got, ["svc/x"], "{got:?}");
    // Inbox names are not guessable: 24 hex digits after `_inbox/`.
    let inbox = r.key.as_str().to_owned();
    let id = inbox.split('/').nth(1).unwrap();
    assert_eq!(id.len(), 24, "{inbox}");
}

/// A key with a control character (here a NUL and a line feed, which would end a STOMP frame
/// or header) is refused at the edge: ERR 6, nothing reaches a STOMP subscriber.
#[tokio::test]
async fn keys_with_control_characters_are_refused() {
    use bytes::{Bytes, BytesMut};
    use hayate_native::{Frame, Hello, codec};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = start(Config::default()).await;
    let mut s = tokio::net::TcpStream::connect(&b.addr).await.unwrap();
    let mut out = BytesMut::new();
    codec::encode(
        &Frame::Hello(Hello {
            version: hayate_native::PROTOCOL_VERSION,
            flags: 0,
            name: "t".into(),
            auth: Bytes::new(),
        }),
        &mut out,
    );
    // Encoded with a placeholder key of the same length, then patched (the library will
    // not build such a key).
    let at = out.len();
    codec::encode(
        &Frame::Pub(hayate_client::Message::new(
            Key::new("a__ERROR_x").unwrap(),
            "boom",
        )),
        &mut out,
    );
    let i = at
        + out[at..]
            .windows(10)
            .position(|w| w == b"a__ERROR_x")
            .unwrap();
    out[i..i + 10].copy_from_slice(b"a\0\nERROR\nx");
    s.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    let code = within(10, async {
        loop {
            while let Some(f) = codec::decode(&mut buf, 1 << 20).unwrap() {
                if let Frame::Err { code, .. } = f {
                    return code;
                }
            }
            assert!(
                s.read_buf(&mut buf).await.unwrap() > 0,
                "closed without ERR"
            );
        }
    })
    .await;
    assert_eq!(code, ErrorCode::BadKey);
}

/// Before login a client cannot make the broker buffer more than `max_preauth_bytes`: a
/// 200 KiB HELLO (native) is ERR 3, an MQTT CONNECT announcing 100 MiB and a STOMP CONNECT
/// with a 200 KiB body are closed; and one address gets at most
/// `max_connections_per_address` connections while others carry on.
#[tokio::test]
async fn unauthenticated_clients_are_bounded() {
    use bytes::{Bytes, BytesMut};
    use hayate_native::{Frame, Hello, codec};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut config = Config::default();
    config.limits.max_connections_per_address = 3;
    let b = start(config).await;
    // Native: a HELLO of 200 KiB.
    let mut s = tokio::net::TcpStream::connect(&b.addr).await.unwrap();
    let mut out = BytesMut::new();
    codec::encode(
        &Frame::Hello(Hello {
            version: hayate_native::PROTOCOL_VERSION,
            flags: 0,
            name: "big".into(),
            auth: Bytes::from(vec![2u8; 200 << 10]),
        }),
        &mut out,
    );
    let _ = s.write_all(&out).await;
    let mut buf = BytesMut::new();
    // ERR 3, or a reset: the broker closed with most of the frame unread (had it read the
    // whole HELLO it would have answered its bad auth field with ERR 8).
    let code = within(10, async {
        loop {
            while let Some(f) = codec::decode(&mut buf, 1 << 20).unwrap() {
                if let Frame::Err { code, .. } = f {
                    return Some(code);
                }
            }
            match s.read_buf(&mut buf).await {
                Ok(0) => panic!("closed without ERR"),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await;
    assert!(
        matches!(code, None | Some(ErrorCode::FrameTooLarge)),
        "{code:?}"
    );
    drop(s);
    // MQTT: CONNECT with a remaining length of 100 MiB; the broker closes at the header.
    let mut m = tokio::net::TcpStream::connect(&b.mqtt).await.unwrap();
    m.write_all(&[0x10, 0x80, 0x80, 0x80, 0x32]).await.unwrap();
    let _ = m.write_all(&[0u8; 1024]).await;
    let mut sink = Vec::new();
    within(10, m.read_to_end(&mut sink)).await.ok();
    drop(m);
    // STOMP: CONNECT with a 200 KiB body.
    let mut st = tokio::net::TcpStream::connect(&b.stomp).await.unwrap();
    let mut frame = b"CONNECT\naccept-version:1.2\ncontent-length:204800\n\n".to_vec();
    frame.extend(std::iter::repeat_n(b'x', 200 << 10));
    frame.push(0);
    let _ = st.write_all(&frame).await;
    let mut answer = Vec::new();
    // An ERROR, or a reset (closed with the body unread).
    let _ = within(10, st.read_to_end(&mut answer)).await;
    assert!(
        answer.is_empty() || answer.starts_with(b"ERROR"),
        "{:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(200)])
    );
    drop(st);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Three connections from 127.0.0.1 at most: the fourth is closed at once.
    let keep: Vec<_> = futures::future::join_all((0..3).map(|_| Client::connect(&b.addr)))
        .await
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    assert!(Client::connect(&b.addr).await.is_err());
    for c in &keep {
        c.close().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Client::connect(&b.addr).await.unwrap();
}

/// A connection holds at most `max_subscriptions` (the client library's inbox included):
/// the next SUB is ERR 5.
#[tokio::test]
async fn subscriptions_per_connection_are_bounded() {
    let mut config = Config::default();
    config.limits.max_subscriptions = 3;
    let b = start(config).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut held = Vec::new();
    let code = within(10, async {
        for i in 0..10 {
            match c.subscribe(&format!("k/{i}")).await {
                Ok(s) => held.push(s),
                Err(Error::Server { code, .. }) => return code,
                Err(e) => panic!("{e}"),
            }
            let _ = c.flush().await;
            if let Some(Error::Server { code, .. }) = c.last_error() {
                return code;
            }
        }
        panic!("10 subscriptions accepted");
    })
    .await;
    assert_eq!(code, ErrorCode::BadSubscription);
    assert!(held.len() <= 3, "{}", held.len());
}

/// A user has at most `auth.max_connections_per_user` connections open: the next login is
/// ERR 8; one closes, and the user may log in again.
#[tokio::test]
async fn connections_per_user_are_bounded() {
    let token = hayate_server::auth::new_token().unwrap();
    let mut config = config(&token);
    config.auth.max_connections_per_user = 2;
    let b = start(config).await;
    let one = login(&b.addr, "alice", "wonderland").await.unwrap();
    let _two = Client::connect_with(&b.addr, ConnectOptions::default().token(&token))
        .await
        .unwrap();
    match login(&b.addr, "alice", "wonderland").await {
        Err(Error::Server { code, message }) => {
            assert_eq!(code, ErrorCode::NotAuthorized);
            assert!(message.contains("max_connections_per_user"), "{message}");
        }
        other => panic!("a third connection of alice: {other:?}"),
    }
    // Another user is not affected.
    login(&b.addr, "bob", "bob-pw").await.unwrap();
    one.close().await.unwrap();
    within(10, async {
        while login(&b.addr, "alice", "wonderland").await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Connects with rumqttc (3.1.1, persistent session) as `user`; the CONNACK's outcome:
/// `Ok(session_present)` or the refusal.
async fn mqtt_login(addr: &str, id: &str, user: &str, pw: &str) -> Result<bool, String> {
    use rumqttc::{AsyncClient, ConnectionError, Event, MqttOptions, Packet};
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new(id, host, port.parse().unwrap());
    o.set_clean_session(false).set_credentials(user, pw);
    let (c, mut el) = AsyncClient::new(o, 10);
    let r = within(10, async {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(a))) => return Ok(a.session_present),
                Ok(_) => {}
                Err(ConnectionError::ConnectionRefused(code)) => return Err(format!("{code:?}")),
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await;
    if r.is_ok() {
        let _ = c.disconnect().await;
        for _ in 0..5 {
            if el.poll().await.is_err() {
                break;
            }
        }
    }
    r
}

/// An MQTT client id belongs to the user whose persistent session it is, across a restart
/// (the owner is journaled with the session and kept in the checkpoint).
#[tokio::test]
async fn mqtt_client_id_ownership_survives_a_restart() {
    let d = std::env::temp_dir().join(format!("hayate-owner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let token = hayate_server::auth::new_token().unwrap();
    let mut c = config(&token);
    c.server.data_dir = d.to_string_lossy().into_owned();
    for restart in [false, true] {
        let b = start(c.clone()).await;
        if !restart {
            assert_eq!(
                mqtt_login(&b.mqtt, "alices-id", "alice", "wonderland").await,
                Ok(false)
            );
        }
        let refused = mqtt_login(&b.mqtt, "alices-id", "bob", "bob-pw").await;
        assert!(
            refused.is_err(),
            "restart {restart}: bob took alice's client id: {refused:?}"
        );
        assert_eq!(
            mqtt_login(&b.mqtt, "alices-id", "alice", "wonderland").await,
            Ok(true),
            "restart {restart}: alice's session is there"
        );
        b.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A stream and a durable consumer created through the API by a user belong to that user:
/// another user cannot join the consumer (ERR 8), delete it, nor delete or purge the stream;
/// the owner can. The owner is set by the broker, whatever the request says.
#[tokio::test]
async fn streams_and_consumers_belong_to_their_creator() {
    let d = std::env::temp_dir().join(format!("hayate-sec-owner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let mut cfg = config(&hayate_server::auth::new_token().unwrap());
    cfg.server.data_dir = d.to_string_lossy().into_owned();
    let b = start(cfg).await;
    let alice = login(&b.addr, "alice", "wonderland").await.unwrap();
    let bob = login(&b.addr, "bob-admin", "x").await;
    assert!(bob.is_err(), "no such user");
    let bob = login(&b.addr, "svc", "svc-pw").await.unwrap();

    let mut s = hayate_client::streams::StreamConfig::new("orders", &["svc/orders/**"]);
    s.owner = Some("svc".into()); // ignored: the broker sets the caller
    let (info, created) = alice.streams().add(&s).await.unwrap();
    assert!(created);
    assert_eq!(info.config.owner.as_deref(), Some("alice"));
    let c = hayate_client::streams::ConsumerConfig::new("orders", "billing");
    let (view, _) = alice.streams().consumer_add(&c).await.unwrap();
    assert_eq!(view.config.owner.as_deref(), Some("alice"));

    // svc may serve svc/** but the consumer is alice's.
    let mut sub = bob.consume("orders", "billing").await.unwrap();
    assert!(within(10, sub.next()).await.is_none());
    assert_eq!(refused(&bob).await, ErrorCode::NotAuthorized);
    let bob = login(&b.addr, "svc", "svc-pw").await.unwrap();
    for r in [
        bob.streams().consumer_remove("orders", "billing").await,
        bob.streams().remove("orders").await,
        bob.streams().purge("orders").await.map(|_| ()),
    ] {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("belongs to user alice"), "{e}");
    }
    // Re-adding it under another owner is refused too (not a silent takeover).
    assert!(bob.streams().add(&s).await.is_err());
    // Making or deleting a consumer needs the serve permission on what it delivers: svc
    // serves svc/** only.
    let p = hayate_client::streams::StreamConfig::new("private", &["alice/**"]);
    alice.streams().add(&p).await.unwrap();
    let e = bob
        .streams()
        .consumer_add(&hayate_client::streams::ConsumerConfig::new(
            "private", "spy",
        ))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not authorized to serve on alice/**"), "{e}");
    // The owner joins, and deletes.
    let mut mine = alice.consume("orders", "billing").await.unwrap();
    bob.publish(&Key::new("svc/orders/1").unwrap(), "o1")
        .await
        .unwrap();
    bob.flush().await.unwrap();
    assert_eq!(&within(10, mine.next()).await.unwrap().payload[..], b"o1");
    drop(mine);
    alice
        .streams()
        .consumer_remove("orders", "billing")
        .await
        .unwrap();
    alice.streams().remove("orders").await.unwrap();
    drop(b);
    let _ = std::fs::remove_dir_all(&d);
}
