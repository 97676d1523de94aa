//! End to end through a real broker: fan-out, wildcards, queue groups, request/reply.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{start_default, within};
use hayate_client::{Client, Error, Key};

#[tokio::test]
async fn wildcard_fanout_reaches_every_matching_subscriber() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut all = c.subscribe("demo/**").await.unwrap();
    let mut one = c.subscribe("demo/*").await.unwrap();
    let mut exact = c.subscribe("demo/a/b").await.unwrap();
    c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    p.publish(&Key::new("demo/x").unwrap(), "1").await.unwrap();
    p.publish(&Key::new("demo/a/b").unwrap(), "2")
        .await
        .unwrap();
    p.publish(&Key::new("other/x").unwrap(), "3").await.unwrap();
    p.flush().await.unwrap();
    within(10, async {
        assert_eq!(&all.next().await.unwrap().payload[..], b"1");
        assert_eq!(&all.next().await.unwrap().payload[..], b"2");
        assert_eq!(&one.next().await.unwrap().payload[..], b"1");
        let m = exact.next().await.unwrap();
        assert_eq!(m.key.as_str(), "demo/a/b");
        assert_eq!(&m.payload[..], b"2");
    })
    .await;
    // Nothing else arrived: a flush on the subscriber's connection is answered after every
    // delivery queued before it.
    c.flush().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), one.next())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let sub = c.subscribe("u/x").await.unwrap();
    c.flush().await.unwrap();
    assert_eq!(b.broker.subscription_count(), 2); // ours and the reply inbox
    drop(sub);
    c.flush().await.unwrap();
    assert_eq!(b.broker.subscription_count(), 1);
    c.close().await.unwrap();
}

#[tokio::test]
async fn queue_group_of_three_splits_evenly() {
    let b = start_default().await;
    let mut subs = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let c = Client::connect(&b.addr).await.unwrap();
        subs.push(c.queue_subscribe("work/*", "workers").await.unwrap());
        c.flush().await.unwrap();
        clients.push(c);
    }
    let p = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("work/item").unwrap();
    for i in 0..3000u32 {
        p.publish(&key, Bytes::copy_from_slice(&i.to_be_bytes()))
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    let mut counts = Vec::new();
    let mut seen = vec![false; 3000];
    for s in &mut subs {
        let mut n = 0;
        while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), s.next()).await {
            let i = u32::from_be_bytes(m.payload[..4].try_into().unwrap()) as usize;
            assert!(!seen[i], "message {i} delivered twice");
            seen[i] = true;
            n += 1;
        }
        counts.push(n);
    }
    assert_eq!(counts.iter().sum::<usize>(), 3000, "counts {counts:?}");
    for n in &counts {
        assert!((950..=1050).contains(n), "uneven split {counts:?}");
    }
}

#[tokio::test]
async fn request_gets_its_reply_and_times_out_without_a_server() {
    let b = start_default().await;
    let server = Client::connect(&b.addr).await.unwrap();
    let mut reqs = server.subscribe("svc/add1").await.unwrap();
    server.flush().await.unwrap();
    let s2 = server.clone();
    tokio::spawn(async move {
        while let Some(m) = reqs.next().await {
            let n: u64 = std::str::from_utf8(&m.payload).unwrap().parse().unwrap();
            s2.reply(&m, (n + 1).to_string()).await.unwrap();
        }
    });
    let c = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("svc/add1").unwrap();
    for n in 0..100u64 {
        let r = c
            .request(&key, n.to_string(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&r.payload).unwrap(),
            (n + 1).to_string()
        );
    }
    // Concurrent requests on one connection are matched to their own replies.
    let mut tasks = Vec::new();
    for n in 0..50u64 {
        let c = c.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let r = c
                .request(&key, n.to_string(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(
                std::str::from_utf8(&r.payload).unwrap(),
                (n + 1).to_string()
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let none = c
        .request(
            &Key::new("svc/nobody").unwrap(),
            "x",
            Duration::from_millis(200),
        )
        .await;
    assert!(matches!(none, Err(Error::Timeout)), "{none:?}");
}

/// A responder that publishes its answer to the request's `reply_to` as a plain message (no
/// correlation id: the client sends it in a PUB_BATCH, delivered as a MSG_BATCH to the
/// requester's inbox) answers the request.
#[tokio::test]
async fn a_plain_publish_to_reply_to_answers_the_request() {
    let b = start_default().await;
    let tcp = || hayate_client::ConnectOptions {
        shm: hayate_client::peer::ShmMode::Off,
        ..Default::default()
    };
    let server = Client::connect_with(&b.addr, tcp()).await.unwrap();
    let mut reqs = server.subscribe("svc/plain").await.unwrap();
    server.flush().await.unwrap();
    let s2 = server.clone();
    tokio::spawn(async move {
        while let Some(m) = reqs.next().await {
            let to = m.reply_to.clone().unwrap();
            s2.publish(&to, m.payload.clone()).await.unwrap();
        }
    });
    let c = Client::connect_with(&b.addr, tcp()).await.unwrap();
    // Many at once: the responder's publishes go out in batches.
    let mut tasks = Vec::new();
    for n in 0..200u32 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let key = Key::new("svc/plain").unwrap();
            let r = c
                .request(&key, n.to_string(), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(r.payload, n.to_string().as_bytes());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn messages_with_metadata_keep_it() {
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut s = c.subscribe("meta/x").await.unwrap();
    c.flush().await.unwrap();
    let mut m = hayate_client::Message::new(Key::new("meta/x").unwrap(), "body");
    m.reply_to = Some(Key::new("meta/reply").unwrap());
    m.correlation_id = Some(Bytes::from_static(b"c-1"));
    m.headers = Some(vec![("h".to_string(), Bytes::from_static(b"v"))]);
    c.publish_message(&m).await.unwrap();
    let got = within(10, s.next()).await.unwrap();
    assert_eq!(got, m);
}

#[tokio::test]
async fn unix_socket_listener_works() {
    let dir = std::env::temp_dir().join(format!("hayate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broker.sock");
    let mut config = hayate_server::Config::default();
    config.native.listen.clear();
    config.native.unix = vec![path.display().to_string()];
    config.mqtt.listen.clear();
    config.mqtt.ws.clear();
    config.stomp.listen.clear();
    config.amqp.listen.clear();
    config.admin.listen.clear();
    let server = hayate_server::Server::bind(&config).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let addr = format!("unix:{}", path.display());
    let c = Client::connect(&addr).await.unwrap();
    let mut s = c.subscribe("x").await.unwrap();
    c.flush().await.unwrap();
    c.publish(&Key::new("x").unwrap(), "via unix")
        .await
        .unwrap();
    assert_eq!(
        &within(10, s.next()).await.unwrap().payload[..],
        b"via unix"
    );
    c.close().await.unwrap();
    let _ = tx.send(());
    within(10, h).await.unwrap();
    assert!(!path.exists(), "socket file removed on shutdown");
}

#[tokio::test]
async fn large_payload_passes_beside_small_traffic() {
    let mut config = hayate_server::Config::default();
    config.limits.max_payload = 48 * 1024 * 1024;
    let b = common::start(config).await;
    let big_sub = Client::connect(&b.addr).await.unwrap();
    let small_sub = Client::connect(&b.addr).await.unwrap();
    let mut big = big_sub.subscribe("big").await.unwrap();
    let mut small = small_sub.subscribe("small").await.unwrap();
    big_sub.flush().await.unwrap();
    small_sub.flush().await.unwrap();
    let payload: Bytes = (0..40 * 1024 * 1024)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let p1 = Client::connect(&b.addr).await.unwrap();
    let p2 = Client::connect(&b.addr).await.unwrap();
    let big_key = Key::new("big").unwrap();
    let pl = payload.clone();
    let t = tokio::spawn(async move {
        p1.publish(&big_key, pl).await.unwrap();
        p1.flush().await.unwrap();
    });
    let small_key = Key::new("small").unwrap();
    for i in 0..1000u32 {
        p2.publish(&small_key, i.to_string()).await.unwrap();
    }
    p2.flush().await.unwrap();
    within(60, async {
        for i in 0..1000u32 {
            assert_eq!(small.next().await.unwrap().payload, i.to_string());
        }
        let m = big.next().await.unwrap();
        assert_eq!(m.payload.len(), payload.len());
        assert!(m.payload == payload);
        t.await.unwrap();
    })
    .await;
    // Above the limit: refused with an error, the connection closed, the broker fine.
    let p3 = Client::connect(&b.addr).await.unwrap();
    let too_big = Bytes::from(vec![0u8; 48 * 1024 * 1024 + 1]);
    let r = p3.publish(&Key::new("big").unwrap(), too_big).await;
    assert!(matches!(r, Err(Error::PayloadTooLarge { .. })), "{r:?}");
}

/// A subscriber taking a publisher's batches whole (`next_batch`) or one message at a time
/// (`next`), in turns, gets every message once, in order, with its key; a batch taken after
/// `next` began it is the rest of it.
#[tokio::test]
async fn batches_are_taken_whole_or_one_by_one_in_order() {
    const N: u32 = 20_000;
    let b = start_default().await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut sub = c.subscribe("nb/*").await.unwrap();
    c.flush().await.unwrap();
    let p = Client::connect(&b.addr).await.unwrap();
    let (plain, with_options) = (Key::new("nb/a").unwrap(), Key::new("nb/b").unwrap());
    let publisher = tokio::spawn(async move {
        for i in 0..N {
            let payload = Bytes::from(i.to_be_bytes().repeat(25));
            if i % 1000 == 999 {
                // A message with options goes as a MSG, between the batches.
                let mut m = hayate_client::Message::new(with_options.clone(), payload);
                m.correlation_id = Some(Bytes::from_static(b"c"));
                p.publish_message(&m).await.unwrap();
            } else {
                p.publish(&plain, payload).await.unwrap();
            }
        }
        p.flush().await.unwrap();
        p
    });
    let (mut next, mut whole, mut plain_batches) = (0u32, false, 0usize);
    let seq = |p: &[u8]| u32::from_be_bytes(p[..4].try_into().unwrap());
    within(30, async {
        while next < N {
            if whole {
                let batch = sub.next_batch().await.unwrap();
                assert!(!batch.is_empty());
                let payloads: Vec<Vec<u8>> = batch.payloads().map(<[u8]>::to_vec).collect();
                assert_eq!(payloads.len(), batch.len());
                if let hayate_client::Batch::Plain { key, .. } = &batch {
                    assert_eq!(key.as_str(), "nb/a");
                    plain_batches += usize::from(batch.len() > 1);
                }
                for (m, p) in batch.into_messages().zip(&payloads) {
                    assert_eq!(&m.payload[..], &p[..]);
                    assert_eq!(seq(&m.payload), next, "out of order");
                    let want = if next % 1000 == 999 { "nb/b" } else { "nb/a" };
                    assert_eq!(m.key.as_str(), want);
                    next += 1;
                }
            } else {
                let m = sub.next().await.unwrap();
                assert_eq!(seq(&m.payload), next, "out of order");
                assert_eq!(m.payload.len(), 100);
                next += 1;
            }
            whole = !whole;
        }
    })
    .await;
    assert_eq!(next, N);
    assert!(
        plain_batches > 0,
        "no batch of several plain messages was taken whole"
    );
    publisher.await.unwrap();
}
