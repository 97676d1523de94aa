//! The admin HTTP listener: `/metrics` after known traffic on every protocol (counted
//! exactly, per listener, and still counted after the connections end), the JSON API's view
//! of connections and closing one, health checks, and who may use it when the broker has
//! users.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use common::{http, http_with_body, start, start_default, within};
use hayate_client::peer::ShmMode;
use hayate_client::{Client, ConnectOptions, Key};
use hayate_server::Config;
use hayate_server::config::UserConfig;
use rumqttc::{AsyncClient, Event, MqttOptions, QoS};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// Every sample of a scrape: `name{labels}` -> value.
async fn scrape(admin: &str) -> HashMap<String, f64> {
    let (status, body) = http(admin, "GET", "/metrics", &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

fn sample(m: &HashMap<String, f64>, name: &str, protocol: &str, listener: &str) -> f64 {
    let k = format!("{name}{{protocol=\"{protocol}\",listener=\"{listener}\"}}");
    *m.get(&k)
        .unwrap_or_else(|| panic!("no sample {k} in {:#?}", m.keys().collect::<Vec<_>>()))
}

async fn native(addr: &str, name: &str) -> Client {
    let mut o = ConnectOptions::default().name(name);
    o.shm = ShmMode::Off;
    Client::connect_with(addr, o).await.unwrap()
}

/// An MQTT client (rumqttc) whose event loop runs in a task; the task ends when the
/// connection does (its `JoinHandle` says when).
async fn mqtt(addr: &str, id: &str) -> (AsyncClient, tokio::task::JoinHandle<()>) {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new(id, host, port.parse().unwrap());
    o.set_keep_alive(Duration::from_secs(30));
    let (c, mut el) = AsyncClient::new(o, 100);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                    if let Some(t) = tx.take() {
                        let _ = t.send(());
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    within(10, rx).await.unwrap();
    (c, task)
}

/// A STOMP 1.2 connection (raw frames) that has had its CONNECTED.
async fn stomp(addr: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"CONNECT\naccept-version:1.2\nhost:t\n\n\0")
        .await
        .unwrap();
    let mut buf = BytesMut::new();
    within(10, async {
        loop {
            use tokio::io::AsyncReadExt;
            assert!(s.read_buf(&mut buf).await.unwrap() > 0);
            if buf.windows(9).any(|w| w == b"CONNECTED") && buf.contains(&0) {
                return;
            }
        }
    })
    .await;
    s
}

#[tokio::test]
async fn metrics_count_each_protocols_traffic_exactly() {
    let b = start_default().await;
    let sub_client = native(&b.addr, "adm-sub").await;
    let mut sub = sub_client.subscribe("m/**").await.unwrap();
    sub_client.flush().await.unwrap();
    // A STOMP subscriber to the native messages only (m/n), in place once its receipt came.
    let mut stomp_sub = stomp(&b.stomp).await;
    stomp_sub
        .write_all(b"SUBSCRIBE\nid:0\ndestination:/topic/m/n\nreceipt:r1\n\n\0")
        .await
        .unwrap();
    let mut got = BytesMut::new();
    within(10, async {
        use tokio::io::AsyncReadExt;
        while !got.windows(7).any(|w| w == b"RECEIPT") {
            assert!(stomp_sub.read_buf(&mut got).await.unwrap() > 0);
        }
    })
    .await;

    // Known traffic: 5 x 10 B native, 3 x 20 B MQTT, 2 x 30 B STOMP, all to the subscriber.
    let p = native(&b.addr, "adm-pub").await;
    for _ in 0..5 {
        p.publish(&Key::new("m/n").unwrap(), vec![1u8; 10])
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    let (m, m_task) = mqtt(&b.mqtt, "adm-mqtt").await;
    for _ in 0..3 {
        m.publish("m/q", QoS::AtMostOnce, false, vec![2u8; 20])
            .await
            .unwrap();
    }
    let mut st = stomp(&b.stomp).await;
    for _ in 0..2 {
        let body = [3u8; 30];
        let mut f = b"SEND\ndestination:/topic/m/s\ncontent-length:30\n\n".to_vec();
        f.extend_from_slice(&body);
        f.push(0);
        st.write_all(&f).await.unwrap();
    }
    let mut bytes = 0;
    for _ in 0..10 {
        let msg = within(10, sub.next()).await.expect("a message");
        bytes += msg.payload.len();
    }
    assert_eq!(bytes, 50 + 60 + 60);
    // The STOMP subscriber's 5 MESSAGE frames.
    within(10, async {
        use tokio::io::AsyncReadExt;
        while got.windows(7).filter(|w| w == b"MESSAGE").count() < 5 {
            assert!(stomp_sub.read_buf(&mut got).await.unwrap() > 0);
        }
    })
    .await;

    let s = scrape(&b.admin).await;
    let (n, q, t) = (&b.addr, &b.mqtt, &b.stomp);
    assert_eq!(
        sample(&s, "hayate_messages_received_total", "native", n),
        5.0
    );
    assert_eq!(
        sample(&s, "hayate_received_payload_bytes_total", "native", n),
        50.0
    );
    assert_eq!(sample(&s, "hayate_messages_received_total", "mqtt", q), 3.0);
    assert_eq!(
        sample(&s, "hayate_received_payload_bytes_total", "mqtt", q),
        60.0
    );
    assert_eq!(
        sample(&s, "hayate_messages_received_total", "stomp", t),
        2.0
    );
    assert_eq!(
        sample(&s, "hayate_received_payload_bytes_total", "stomp", t),
        60.0
    );
    assert_eq!(sample(&s, "hayate_messages_sent_total", "native", n), 10.0);
    assert_eq!(
        sample(&s, "hayate_sent_payload_bytes_total", "native", n),
        170.0
    );
    assert_eq!(sample(&s, "hayate_messages_sent_total", "mqtt", q), 0.0);
    assert_eq!(sample(&s, "hayate_messages_sent_total", "stomp", t), 5.0);
    assert_eq!(
        sample(&s, "hayate_sent_payload_bytes_total", "stomp", t),
        50.0
    );
    assert_eq!(sample(&s, "hayate_connections", "native", n), 2.0);
    assert_eq!(sample(&s, "hayate_connections", "mqtt", q), 1.0);
    assert_eq!(sample(&s, "hayate_connections", "stomp", t), 2.0);
    assert_eq!(
        sample(&s, "hayate_connections_accepted_total", "native", n),
        2.0
    );
    // m/**, each native client's reply inbox, and the STOMP subscriber's m/n.
    assert_eq!(s["hayate_subscriptions"], 4.0);
    assert_eq!(
        s["hayate_dropped_messages_total{reason=\"outbox_full\"}"],
        0.0
    );

    // The JSON API sees the same four connections, with their users and traffic.
    let (status, body) = http(&b.admin, "GET", "/api/connections", &[]).await;
    assert_eq!(status, 200, "{body}");
    let conns: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(conns.len(), 5, "{conns:#?}");
    let by_name = |id: &str| {
        conns
            .iter()
            .find(|c| c["client_id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {conns:#?}"))
            .clone()
    };
    let subc = by_name("adm-sub");
    assert_eq!(
        (subc["protocol"].as_str(), subc["subscriptions"].as_u64()),
        (Some("native"), Some(2))
    );
    assert_eq!(subc["msgs_out"], 10);
    assert_eq!(by_name("adm-pub")["msgs_in"], 5);
    let mq = by_name("adm-mqtt");
    assert_eq!(
        (mq["protocol"].as_str(), mq["msgs_in"].as_u64()),
        (Some("mqtt"), Some(3))
    );

    // Closing the MQTT connection from the API ends it; the others carry on.
    let id = mq["id"].as_u64().unwrap();
    let (status, body) = http(&b.admin, "DELETE", &format!("/api/connections/{id}"), &[]).await;
    assert_eq!(status, 202, "{body}");
    within(10, m_task).await.unwrap();
    within(10, async {
        loop {
            let (_, body) = http(&b.admin, "GET", "/api/connections", &[]).await;
            let v: Vec<Value> = serde_json::from_str(&body).unwrap();
            if v.len() == 4 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (status, _) = http(&b.admin, "GET", &format!("/api/connections/{id}"), &[]).await;
    assert_eq!(status, 404);
    p.publish(&Key::new("m/after").unwrap(), vec![0u8; 1])
        .await
        .unwrap();
    assert_eq!(
        within(10, sub.next()).await.unwrap().key.as_str(),
        "m/after"
    );

    // What ended connections did stays counted.
    drop(st);
    drop(stomp_sub);
    p.close().await.unwrap();
    within(10, async {
        loop {
            let s = scrape(&b.admin).await;
            if sample(&s, "hayate_connections", "stomp", t) == 0.0
                && sample(&s, "hayate_connections", "native", n) == 1.0
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let s = scrape(&b.admin).await;
    assert_eq!(
        sample(&s, "hayate_messages_received_total", "native", n),
        6.0
    );
    assert_eq!(sample(&s, "hayate_messages_received_total", "mqtt", q), 3.0);
    assert_eq!(
        sample(&s, "hayate_messages_received_total", "stomp", t),
        2.0
    );
    assert_eq!(sample(&s, "hayate_messages_sent_total", "native", n), 11.0);
}

#[tokio::test]
async fn rpc_calls_mqtt_held_messages_and_delivery_latency() {
    let b = start_default().await;
    let n = &b.addr;
    // A service answering on svc/echo, and a client calling it 4 times.
    let server = native(n, "adm-svc").await;
    let mut calls = server.queue_subscribe("svc/echo", "svc").await.unwrap();
    server.flush().await.unwrap();
    let srv = server.clone();
    let serving = tokio::spawn(async move {
        while let Some(req) = calls.next().await {
            srv.reply(&req, req.payload.clone()).await.unwrap();
        }
    });
    let caller = native(n, "adm-caller").await;
    for i in 0..4u8 {
        let r = caller
            .request(
                &Key::new("svc/echo").unwrap(),
                vec![i],
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(&r.payload[..], &[i]);
    }

    // An MQTT subscriber at QoS 1 that never acknowledges: what it is sent stays held.
    let (host, port) = b.mqtt.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new("adm-held", host, port.parse().unwrap());
    o.set_manual_acks(true);
    // A retained message (5 bytes, QoS 0) it gets on subscribing: counted as sent.
    let (rp, rp_task) = mqtt(&b.mqtt, "adm-retainer").await;
    rp.publish("h/r", QoS::AtMostOnce, true, vec![9u8; 5])
        .await
        .unwrap();
    rp.disconnect().await.unwrap();
    within(10, rp_task).await.unwrap();
    let (mc, mut el) = AsyncClient::new(o, 100);
    mc.subscribe("h/#", QoS::AtLeastOnce).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mtask = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(p)) => {
                    let _ = tx.send(p);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    within(10, async {
        loop {
            if let Some(rumqttc::Packet::SubAck(_)) = rx.recv().await {
                return;
            }
        }
    })
    .await;
    // 3 x (topic h/1, 3 bytes + 10 bytes of payload); then 40 messages to a native
    // subscriber, from one session: one publish in 16 is timed.
    let p = native(n, "adm-held-pub").await;
    for _ in 0..3 {
        p.publish(&Key::new("h/1").unwrap(), vec![7u8; 10])
            .await
            .unwrap();
    }
    let timed_client = native(n, "adm-timed").await;
    let mut timed = timed_client.subscribe("t/**").await.unwrap();
    timed_client.flush().await.unwrap();
    for _ in 0..40 {
        p.publish(&Key::new("t/x").unwrap(), vec![1u8; 8])
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    let mut got = 0;
    within(10, async {
        while got < 4 {
            if let Some(rumqttc::Packet::Publish(_)) = rx.recv().await {
                got += 1;
            }
        }
    })
    .await;
    for _ in 0..40 {
        within(10, timed.next()).await.unwrap();
    }

    // Who would receive a message on svc/echo: the service's queue-group subscription.
    let (status, body) = http(&b.admin, "GET", "/api/subscriptions?key=svc/echo", &[]).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total"], 1, "{v:#}");
    let sub0 = &v["subscriptions"][0];
    assert_eq!(
        (
            sub0["expr"].as_str(),
            sub0["group"].as_str(),
            sub0["congestion"].as_str()
        ),
        (Some("svc/echo"), Some("svc"), Some("block")),
        "{v:#}"
    );
    let (_, body) = http(&b.admin, "GET", "/api/connections", &[]).await;
    let conns: Vec<Value> = serde_json::from_str(&body).unwrap();
    let svc = conns.iter().find(|c| c["client_id"] == "adm-svc").unwrap();
    assert_eq!(sub0["connection"], svc["id"]);
    assert_eq!(svc["replies"], 4);
    let caller_view = conns
        .iter()
        .find(|c| c["client_id"] == "adm-caller")
        .unwrap();
    assert_eq!(caller_view["calls"], 4);
    // One connection's: its reply inbox and svc/echo.
    let (_, body) = http(
        &b.admin,
        "GET",
        &format!("/api/subscriptions?connection={}", svc["id"]),
        &[],
    )
    .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total"], 2, "{v:#}");
    // Those whose expression meets h/** (the MQTT subscriber's h/#), and a limit.
    let (_, body) = http(&b.admin, "GET", "/api/subscriptions?expr=h/**", &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total"], 1, "{v:#}");
    assert_eq!(v["subscriptions"][0]["expr"], "h/**");
    let (_, body) = http(&b.admin, "GET", "/api/subscriptions?group=svc", &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total"], 1, "{v:#}");
    assert_eq!(v["subscriptions"][0]["connection"], svc["id"]);
    let (_, body) = http(&b.admin, "GET", "/api/subscriptions?group=nobody", &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["total"], 0, "{v:#}");
    assert!(svc["msgs_in_rate"].is_number(), "{svc:#}");
    let (_, body) = http(&b.admin, "GET", "/api/subscriptions?limit=1", &[]).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["subscriptions"].as_array().unwrap().len(), 1);
    assert!(v["total"].as_u64().unwrap() >= 5, "{v:#}");
    assert_eq!(
        http(&b.admin, "GET", "/api/subscriptions?key=a/*", &[])
            .await
            .0,
        400,
        "a wildcard is not a key"
    );
    assert_eq!(
        http(&b.admin, "GET", "/api/subscriptions?connection=999999", &[])
            .await
            .0,
        404
    );

    let s = scrape(&b.admin).await;
    assert_eq!(sample(&s, "hayate_rpc_calls_total", "native", n), 4.0);
    assert_eq!(sample(&s, "hayate_rpc_replies_total", "native", n), 4.0);
    assert_eq!(sample(&s, "hayate_rpc_calls_total", "mqtt", &b.mqtt), 0.0);
    // The retained message and the 3 live ones.
    assert_eq!(
        sample(&s, "hayate_messages_sent_total", "mqtt", &b.mqtt),
        4.0
    );
    assert_eq!(
        sample(&s, "hayate_sent_payload_bytes_total", "mqtt", &b.mqtt),
        35.0
    );
    assert_eq!(s["hayate_mqtt_held_messages"], 3.0);
    assert_eq!(s["hayate_mqtt_held_bytes"], 39.0);
    let count = s["hayate_delivery_latency_seconds_count"];
    assert!(
        count >= 2.0,
        "the 40 publishes (and the RPCs) timed: {count}"
    );
    assert_eq!(
        s["hayate_delivery_latency_seconds_bucket{le=\"+Inf\"}"],
        count
    );
    assert!(s["hayate_delivery_latency_seconds_sum"] > 0.0);
    assert!(s["hayate_delivery_latency_seconds_bucket{le=\"10.0\"}"] <= count);

    // The MQTT client goes (clean session): nothing is held any more.
    mc.disconnect().await.unwrap();
    within(10, mtask).await.unwrap();
    within(10, async {
        while scrape(&b.admin).await["hayate_mqtt_held_messages"] != 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(scrape(&b.admin).await["hayate_mqtt_held_bytes"], 0.0);
    serving.abort();
}

#[tokio::test]
async fn health_checks_and_bad_requests() {
    let b = start_default().await;
    assert_eq!(
        http(&b.admin, "GET", "/healthz", &[]).await,
        (200, "ok\n".into())
    );
    within(10, async {
        while http(&b.admin, "GET", "/readyz", &[]).await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(http(&b.admin, "GET", "/nowhere", &[]).await.0, 404);
    assert_eq!(
        http(&b.admin, "GET", "/api/connections/x", &[]).await.0,
        400
    );
    assert_eq!(
        http(&b.admin, "DELETE", "/api/connections/999999", &[])
            .await
            .0,
        404
    );
    assert_eq!(http(&b.admin, "GET", "/api/streams/none", &[]).await.0, 404);
    let (status, body) = http(&b.admin, "GET", "/api/overview", &[]).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true);
    assert!(v["listeners"].as_array().unwrap().len() >= 3, "{v}");
    // Garbage instead of HTTP: that connection is answered 400 or dropped; the listener
    // carries on.
    let mut s = tokio::net::TcpStream::connect(&b.admin).await.unwrap();
    s.write_all(b"\x00\x01\x02 garbage\r\n\r\n").await.unwrap();
    drop(s);
    assert_eq!(http(&b.admin, "GET", "/healthz", &[]).await.0, 200);
}

#[tokio::test]
async fn with_users_only_admin_users_may_use_it() {
    let mut c = Config::default();
    let mut root = UserConfig::with_password("root-pw").unwrap();
    let token = hayate_server::auth::new_token().unwrap();
    root.tokens = vec![hayate_server::auth::token_digest(token.as_bytes())];
    c.auth.users.insert("root".into(), root);
    c.auth
        .users
        .insert("bob".into(), UserConfig::with_password("bob-pw").unwrap());
    c.auth.max_failures = 3;
    c.admin.users = vec!["root".into()];
    let b = start(c).await;
    // root:root-pw, bob:bob-pw, root:wrong
    let root = ("Authorization", "Basic cm9vdDpyb290LXB3");
    let bob = ("Authorization", "basic Ym9iOmJvYi1wdw==");
    let wrong = ("Authorization", "Basic cm9vdDp3cm9uZw==");
    let bearer = format!("Bearer {token}");
    let bearer = ("Authorization", bearer.as_str());
    // Every guarded route (the event stream only refused: served, it never ends).
    for path in [
        "/",
        "/dashboard",
        "/api/dashboard",
        "/metrics",
        "/api/overview",
        "/api/connections",
        "/api/connections/1",
        "/api/log",
        "/api/groups",
        "/api/queues",
        "/api/streams",
        "/api/streams/none",
        "/api/events",
    ] {
        assert_eq!(http(&b.admin, "GET", path, &[]).await.0, 401, "{path}");
        assert_eq!(http(&b.admin, "GET", path, &[bob]).await.0, 403, "{path}");
        if path == "/api/events" {
            continue;
        }
        let ok = http(&b.admin, "GET", path, &[root]).await.0;
        assert!(ok == 200 || ok == 404, "{path}: {ok}");
        assert_eq!(http(&b.admin, "GET", path, &[bearer]).await.0, ok, "{path}");
    }
    for (method, path) in [
        ("DELETE", "/api/connections/1"),
        ("PUT", "/api/log"),
        ("POST", "/api/streams"),
        ("DELETE", "/api/streams/x"),
    ] {
        assert_eq!(
            http(&b.admin, method, path, &[]).await.0,
            401,
            "{method} {path}"
        );
        assert_eq!(
            http(&b.admin, method, path, &[bob]).await.0,
            403,
            "{method} {path}"
        );
    }
    // The health checks stay open.
    assert_eq!(http(&b.admin, "GET", "/healthz", &[]).await.0, 200);
    // Wrong passwords count toward the address's lock-out, as on every protocol: after
    // auth.max_failures of them even the right one is refused for a while.
    for _ in 0..3 {
        assert_eq!(http(&b.admin, "GET", "/metrics", &[wrong]).await.0, 401);
    }
    assert_eq!(http(&b.admin, "GET", "/metrics", &[root]).await.0, 429);
}

#[tokio::test]
async fn without_users_only_local_hosts_and_json_posts() {
    let b = start_default().await;
    let evil = ("Host", "rebind.example:4780");
    assert_eq!(http(&b.admin, "GET", "/api/overview", &[evil]).await.0, 403);
    assert_eq!(
        http(&b.admin, "GET", "/api/overview", &[("Host", "localhost:1")])
            .await
            .0,
        200
    );
    assert_eq!(
        http(&b.admin, "GET", "/api/overview", &[("Host", "[::1]:1")])
            .await
            .0,
        200
    );
    // The health checks answer whatever the Host.
    assert_eq!(http(&b.admin, "GET", "/healthz", &[evil]).await.0, 200);
    // A POST without a JSON body type: refused before anything is done.
    assert_eq!(http(&b.admin, "POST", "/api/streams", &[]).await.0, 415);
    let form = ("Content-Type", "application/x-www-form-urlencoded");
    assert_eq!(http(&b.admin, "POST", "/api/streams", &[form]).await.0, 415);
}

/// An admin close that comes while an MQTT client is still in its handshake (no session
/// yet) ends the connection once the session opens.
#[tokio::test]
async fn a_close_before_the_session_is_kept() {
    use tokio::io::AsyncReadExt;
    let b = start_default().await;
    let mut raw = tokio::net::TcpStream::connect(&b.mqtt).await.unwrap();
    let id = within(10, async {
        loop {
            let (_, body) = http(&b.admin, "GET", "/api/connections", &[]).await;
            let v: Vec<Value> = serde_json::from_str(&body).unwrap();
            if let Some(c) = v.iter().find(|c| c["protocol"] == "mqtt") {
                assert!(c["session"].is_null(), "{c}");
                return c["id"].as_u64().unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let (status, _) = http(&b.admin, "DELETE", &format!("/api/connections/{id}"), &[]).await;
    assert_eq!(status, 202);
    // CONNECT (3.1.1, client id "late"): the session opens, and the close takes effect.
    raw.write_all(&[
        0x10, 16, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 4, b'l', b'a', b't', b'e',
    ])
    .await
    .unwrap();
    within(10, async {
        let mut buf = [0u8; 256];
        while raw.read(&mut buf).await.unwrap_or(0) > 0 {}
    })
    .await;
    within(10, async {
        loop {
            let (_, body) = http(&b.admin, "GET", "/api/connections", &[]).await;
            let v: Vec<Value> = serde_json::from_str(&body).unwrap();
            if v.iter().all(|c| c["id"] != id) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn the_log_filter_can_be_read_and_set() {
    use std::sync::{Arc, Mutex};
    // A stand-in for the binary's control: the filter as text, "bad" refused.
    let current = Arc::new(Mutex::new("info".to_string()));
    let c = current.clone();
    let control: hayate_server::admin::LogControl = Arc::new(move |new: Option<&str>| {
        let mut cur = c.lock().unwrap();
        if let Some(n) = new {
            if n == "bad" {
                return Err("log filter \"bad\": invalid".into());
            }
            *cur = n.to_string();
        }
        Ok(cur.clone())
    });
    let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = a.local_addr().unwrap().to_string();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = Config::default();
    config.server.data_dir.clear();
    let server =
        hayate_server::Server::from_listeners(vec![(l, hayate_server::Protocol::Native)], &config)
            .with_admin(a)
            .with_log_control(control);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let (status, body) = http(&admin, "GET", "/api/log", &[]).await;
    assert_eq!((status, body.as_str()), (200, r#"{"filter":"info"}"#));
    let (status, body) =
        http_with_body(&admin, "PUT", "/api/log", &[], "debug,hayate_server=trace").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(*current.lock().unwrap(), "debug,hayate_server=trace");
    let (status, body) = http_with_body(&admin, "PUT", "/api/log", &[], "bad").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(*current.lock().unwrap(), "debug,hayate_server=trace");
    // The test brokers have no control: 404.
    let b = start_default().await;
    assert_eq!(http(&b.admin, "GET", "/api/log", &[]).await.0, 404);
    let _ = tx.send(());
    run.await.unwrap();
}

#[tokio::test]
async fn the_dashboard_and_its_event_stream() {
    use tokio::io::AsyncReadExt;
    let b = start_default().await;
    let (status, body) = http(&b.admin, "GET", "/dashboard", &[]).await;
    assert_eq!(status, 200);
    assert!(body.contains("<title>Hayate</title>") && body.contains("api/events"));
    // Known traffic: the counts the events carry are those of the traffic.
    let c = native(&b.addr, "dash").await;
    let mut sub = c.subscribe("d/**").await.unwrap();
    c.flush().await.unwrap();
    for _ in 0..20 {
        c.publish(&Key::new("d/x/y").unwrap(), vec![0u8; 8])
            .await
            .unwrap();
    }
    for _ in 0..20 {
        within(10, sub.next()).await.unwrap();
    }
    // The event stream: its first event is the dashboard document, at once.
    let mut s = tokio::net::TcpStream::connect(&b.admin).await.unwrap();
    s.write_all(
        format!(
            "GET /api/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
            b.admin
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let events = within(10, async {
        let mut events = Vec::new();
        // Two events: the first at once, the next a second later.
        while events.len() < 2 {
            let mut chunk = [0u8; 16384];
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the event stream ended");
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            events = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .collect();
        }
        events
    })
    .await;
    let head = String::from_utf8_lossy(&buf).to_string();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/event-stream")
    );
    let last = events.last().unwrap();
    assert_eq!(last["overview"]["connections"], 1, "{last}");
    let conns = last["connections"].as_array().unwrap();
    assert_eq!(conns[0]["client_id"], "dash");
    assert_eq!(conns[0]["msgs_in"], 20);
    assert!(last["history"].is_array() && last["top_keys"].is_array());
}

/// Hostile admin clients: a body announced past the limit, an event stream never read, and
/// every admin connection slot held by idle clients. Each gets its answer or waits; the
/// broker's own clients carry on, and the API answers again once the slots free.
#[tokio::test]
async fn hostile_admin_clients() {
    use tokio::io::AsyncReadExt;
    let b = start_default().await;
    let connect = || tokio::net::TcpStream::connect(b.admin.clone());

    // 100 MiB announced: refused (413) at once, not read.
    let mut s = connect().await.unwrap();
    s.write_all(
        format!(
            "POST /api/streams HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: 104857600\r\n\r\n{{",
            b.admin
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = [0u8; 12];
    within(10, s.read_exact(&mut head)).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 413");
    drop(s);

    // A request head past 16 KiB: 431, and the connection closed.
    let mut s = connect().await.unwrap();
    let big = format!(
        "GET /api/overview HTTP/1.1\r\nHost: {}\r\nX-Big: {}\r\n\r\n",
        b.admin,
        "a".repeat(32 * 1024)
    );
    let _ = s.write_all(big.as_bytes()).await;
    let mut head = [0u8; 12];
    within(10, s.read_exact(&mut head)).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 431");
    drop(s);

    // An event stream its client never reads, and all other slots held by idle clients: a
    // further request is answered at once, in the slot of the oldest idle client, which is
    // closed to make room.
    let mut sse = connect().await.unwrap();
    sse.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {}\r\n\r\n", b.admin).as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 12];
    within(10, sse.read_exact(&mut head)).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let mut idle = Vec::new();
    for _ in 0..hayate_server::admin::MAX_CONNECTIONS - 1 {
        idle.push(connect().await.unwrap());
    }
    let answered = tokio::time::timeout(
        Duration::from_secs(1),
        http(&b.admin, "GET", "/healthz", &[]),
    )
    .await
    .expect("/healthz answered within 1 s with every slot taken");
    assert_eq!(answered, (200, "ok\n".into()));
    let mut byte = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(1), idle[0].read(&mut byte))
        .await
        .expect("the oldest idle connection is closed to make room");
    assert_eq!(n.unwrap_or(0), 0);
    assert_eq!(http(&b.admin, "GET", "/api/overview", &[]).await.0, 200);

    // Meanwhile the broker serves its clients as ever.
    let c = native(&b.addr, "busy-admin").await;
    let mut sub = c.subscribe("h/**").await.unwrap();
    c.flush().await.unwrap();
    c.publish(&Key::new("h/x").unwrap(), "still here")
        .await
        .unwrap();
    assert_eq!(
        &within(10, sub.next()).await.unwrap().payload[..],
        b"still here"
    );

    // Every slot in a request (64 event streams, none read): the spare slots still answer
    // the health checks; anything else gets 503 and a close.
    drop(idle);
    let mut streams = vec![sse];
    for _ in 1..hayate_server::admin::MAX_CONNECTIONS {
        let mut s = connect().await.unwrap();
        s.write_all(format!("GET /api/events HTTP/1.1\r\nHost: {}\r\n\r\n", b.admin).as_bytes())
            .await
            .unwrap();
        let mut head = [0u8; 12];
        within(10, s.read_exact(&mut head)).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        streams.push(s);
    }
    for path in ["/healthz", "/readyz"] {
        let (status, _) =
            tokio::time::timeout(Duration::from_secs(1), http(&b.admin, "GET", path, &[]))
                .await
                .expect("a health check answered within 1 s with every slot in a request");
        assert_eq!(status, 200, "{path}");
    }
    let (status, body) = http(&b.admin, "GET", "/api/overview", &[]).await;
    assert_eq!(status, 503, "{body}");
    drop(streams);
    assert_eq!(http(&b.admin, "GET", "/healthz", &[]).await.0, 200);
    within(10, async {
        while http(&b.admin, "GET", "/api/overview", &[]).await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn slow_admin_clients_are_cut_off() {
    use tokio::io::AsyncReadExt;
    let b = start_default().await;
    let connect = || tokio::net::TcpStream::connect(b.admin.clone());
    let limit = hayate_server::admin::HEADER_TIMEOUT + Duration::from_secs(5);
    // Reads until the server closes the connection; what it sent before.
    async fn until_closed(mut s: tokio::net::TcpStream) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    }

    // Every slot taken by a client that never sends a byte...
    let mut idle = Vec::new();
    for _ in 0..hayate_server::admin::MAX_CONNECTIONS - 2 {
        idle.push(connect().await.unwrap());
    }
    // ... one that sends half a request head ...
    let mut half = connect().await.unwrap();
    half.write_all(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    // ... and one that sends its head and then a byte of a 20-byte body.
    let mut trickle = connect().await.unwrap();
    trickle
        .write_all(
            b"POST /api/reload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
              Content-Length: 20\r\n\r\n{",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // A request meanwhile is answered at once: the oldest idle client is closed to make
    // room for it (before, it waited in the accept queue until the slots were cut off).
    let answered = tokio::time::timeout(
        Duration::from_secs(1),
        http(&b.admin, "GET", "/healthz", &[]),
    )
    .await
    .expect("/healthz answered within 1 s with every slot taken");
    assert_eq!(answered, (200, "ok\n".into()));
    let mut idle = idle.into_iter();
    tokio::time::timeout(Duration::from_secs(1), until_closed(idle.next().unwrap()))
        .await
        .expect("the oldest idle connection is closed to make room");

    // Nobody else wants a slot: each of the others is cut off after the timeout (the body
    // with a 408), not before.
    let trickled = tokio::time::timeout(limit, until_closed(trickle))
        .await
        .expect("the trickling body is cut off");
    assert!(
        trickled.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&trickled)
    );
    tokio::time::timeout(limit, until_closed(half))
        .await
        .expect("the half head is cut off");
    for s in idle {
        tokio::time::timeout(limit, until_closed(s))
            .await
            .expect("an idle connection is cut off");
    }
    assert!(
        started.elapsed() >= hayate_server::admin::HEADER_TIMEOUT - Duration::from_secs(1),
        "not cut off before the timeout"
    );
    assert_eq!(http(&b.admin, "GET", "/healthz", &[]).await.0, 200);
}

#[tokio::test]
async fn offline_mqtt_sessions_count_only_what_they_keep() {
    let b = start_default().await;
    let (host, port) = b.mqtt.rsplit_once(':').unwrap();
    let mut o = MqttOptions::new("adm-offline", host, port.parse().unwrap());
    o.set_clean_session(false);
    let (mc, mut el) = AsyncClient::new(o, 100);
    mc.subscribe("o/#", QoS::AtMostOnce).await.unwrap();
    mc.subscribe("p/#", QoS::AtLeastOnce).await.unwrap();
    let task = tokio::spawn(async move {
        let mut subacks = 0;
        loop {
            match el.poll().await {
                Ok(Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                    subacks += 1;
                    if subacks == 2 {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    });
    within(10, task).await.unwrap();
    drop(mc);
    // The connection is gone (its event loop dropped): the session is offline.
    within(10, async {
        while scrape(&b.admin).await["hayate_mqtt_clients_connected"] != 0.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // 3 x 4 bytes at QoS 0 (an offline session cannot keep them) and 2 x 6 bytes that the
    // QoS 1 subscription keeps for it.
    let p = native(&b.addr, "adm-offline-pub").await;
    for _ in 0..3 {
        p.publish(&Key::new("o/x").unwrap(), vec![0u8; 4])
            .await
            .unwrap();
    }
    for _ in 0..2 {
        p.publish(&Key::new("p/x").unwrap(), vec![0u8; 6])
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    let s = scrape(&b.admin).await;
    assert_eq!(
        sample(&s, "hayate_messages_received_total", "native", &b.addr),
        5.0
    );
    assert_eq!(
        sample(&s, "hayate_messages_sent_total", "mqtt", &b.mqtt),
        2.0
    );
    assert_eq!(
        sample(&s, "hayate_sent_payload_bytes_total", "mqtt", &b.mqtt),
        12.0
    );
    assert_eq!(s["hayate_mqtt_held_messages"], 2.0);
}

/// Issue 44, item 11: 80 idle clients that never send a byte, each reopened as soon as the
/// listener cuts it, cannot starve the health checks. Each `/healthz` and `/readyz` (and an
/// API request) is answered within 1 s, idle clients are cut to make room long before the
/// head timeout, and the listener's open connections stay within its slots. Before, the
/// idle clients held all 64 slots and a health check waited up to HEADER_TIMEOUT (10 s) in
/// the accept queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_floods_do_not_starve_health_checks() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use tokio::io::AsyncReadExt;
    const FLOOD: usize = 80;
    let b = start_default().await;
    let connected = Arc::new(AtomicUsize::new(0));
    let reopened = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..FLOOD {
        let (admin, connected, reopened) = (b.admin.clone(), connected.clone(), reopened.clone());
        let mut stopped = stopped.clone();
        flood.spawn(async move {
            // Bounded: at most 500 connections in turn for each of the 80.
            for round in 0..500 {
                let Ok(mut s) = tokio::net::TcpStream::connect(&admin).await else {
                    continue;
                };
                if round == 0 {
                    connected.fetch_add(1, Relaxed);
                } else {
                    reopened.fetch_add(1, Relaxed);
                }
                let mut byte = [0u8; 1];
                tokio::select! {
                    _ = s.read(&mut byte) => {} // cut by the listener: open another
                    _ = stopped.changed() => return,
                }
            }
        });
    }
    within(10, async {
        while connected.load(Relaxed) < FLOOD {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    for round in 0..5 {
        for path in ["/healthz", "/readyz", "/api/overview"] {
            let (status, body) =
                tokio::time::timeout(Duration::from_secs(1), http(&b.admin, "GET", path, &[]))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("{path} not answered within 1 s under the flood (round {round})")
                    });
            assert_eq!(status, 200, "{path}: {body}");
        }
    }
    let m = tokio::time::timeout(Duration::from_secs(1), scrape(&b.admin))
        .await
        .expect("/metrics answered within 1 s under the flood");
    let open = m["hayate_admin_connections"];
    let limit = (hayate_server::admin::MAX_CONNECTIONS + hayate_server::admin::SPARE_SLOTS) as f64;
    assert!(open <= limit, "{open} admin connections open");
    assert!(m["hayate_admin_connections_cut_total"] >= 1.0);
    assert!(
        reopened.load(Relaxed) >= FLOOD - hayate_server::admin::MAX_CONNECTIONS,
        "idle clients were cut to make room: {} reopened",
        reopened.load(Relaxed)
    );
    stop.send(true).unwrap();
    within(10, async { while flood.join_next().await.is_some() {} }).await;
}

/// Clients that pipeline requests and never read the answers: once the server's writes to
/// them block, none waits for a request head, so none was ever cut for room, and they held
/// every slot (/api/overview and /metrics got 503 for as long as they stayed). Now one whose
/// writes have been blocked for `WRITE_BLOCKED_CUT` is closed for a new connection, and each
/// is closed once its writes have made no progress for `WRITE_TIMEOUT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelining_non_readers_do_not_hold_the_slots() {
    use hayate_server::admin::{MAX_CONNECTIONS, WRITE_TIMEOUT};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let b = start_default().await;
    // 64 health checks a write (about 2.5 KiB).
    let chunk = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", b.admin).repeat(64);
    let started = Arc::new(AtomicUsize::new(0));
    let mut attack = tokio::task::JoinSet::new();
    for _ in 0..MAX_CONNECTIONS {
        let (admin, chunk, started) = (b.admin.clone(), chunk.clone(), started.clone());
        attack.spawn(async move {
            // Small buffers on this side (the server's are its own).
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.set_send_buffer_size(16 * 1024).unwrap();
            let mut s = sock.connect(admin.parse().unwrap()).await.unwrap();
            // Writes requests for as long as the server takes them (at most 40,000 writes),
            // never reads; stops when the server closes the connection.
            for i in 0..40_000 {
                if s.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
                if i == 0 {
                    started.fetch_add(1, Relaxed);
                }
            }
        });
    }
    within(10, async {
        while started.load(Relaxed) < MAX_CONNECTIONS {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Every slot is held by a client that pipelines and reads nothing: the API still
    // answers, within a few seconds.
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if http(&b.admin, "GET", "/api/overview", &[]).await.0 == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("/api/overview answered 200 within 5 s while non-readers held every slot");
    let m = scrape(&b.admin).await;
    assert!(m["hayate_admin_connections_cut_total"] >= 1.0);
    // And the others are closed once their writes have been blocked for WRITE_TIMEOUT.
    tokio::time::timeout(WRITE_TIMEOUT + Duration::from_secs(5), async {
        while scrape(&b.admin).await["hayate_admin_connections"] > 1.0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .expect("the non-readers are closed after WRITE_TIMEOUT");
    within(10, async { while attack.join_next().await.is_some() {} }).await;
}

/// A runtime shut down while the admin listener accepts connections: a task spawned then is
/// dropped at once, inside `spawn`, and its slot's release takes the slot table's lock. The
/// listener spawned under that lock, so the shutdown deadlocked (a `cargo test` run hung in
/// `idle_floods_do_not_starve_health_checks`'s runtime drop). Shutdowns under a flood of
/// connections, each within a watchdog.
#[test]
fn the_admin_listener_shuts_down_under_a_flood_of_connections() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    // The old code hung in the first round, every time.
    for round in 0..5 {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let b = rt.block_on(start_default());
            let stop = Arc::new(AtomicBool::new(false));
            let floods: Vec<_> = (0..4)
                .map(|_| {
                    let (admin, stop) = (b.admin.clone(), stop.clone());
                    std::thread::spawn(move || {
                        // Bounded: at most 20,000 connections each.
                        for _ in 0..20_000 {
                            if stop.load(Relaxed) {
                                break;
                            }
                            let _ = std::net::TcpStream::connect(&admin);
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(30));
            drop(b);
            drop(rt);
            stop.store(true, Relaxed);
            for f in floods {
                let _ = f.join();
            }
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("round {round}: the runtime's shutdown hung"));
    }
}
