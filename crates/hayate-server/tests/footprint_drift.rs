//! The memory budget gets back all it charged for a retained message (review of fdc57e5,
//! issue 44 item 3). A retained message's charge (`hayate_broker::footprint`) counted its
//! headers vector's capacity: charged as the PUBLISH made it (MQTT 5.0 user properties: room
//! for one more, a content type) and given back for the copy the store kept
//! (`Message::compact`: exactly as long as its headers). Each replacement or clear of a
//! retained message with user properties left 56 bytes charged for good, so one anonymous
//! client replacing a retained message in a loop spent the whole budget (then no retained
//! message was kept and offline sessions dropped their messages). Raw MQTT 5.0 packets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{start, within};
use hayate_server::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Replacements of the one retained message.
const N: usize = 2000;

fn string(s: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&u16::try_from(s.len()).unwrap().to_be_bytes());
    out.extend_from_slice(s);
}

/// A packet whose remaining length is under 128.
fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![first, u8::try_from(body.len()).unwrap()];
    assert!(body.len() < 128);
    p.extend_from_slice(body);
    p
}

/// A QoS 0 retained PUBLISH on `r/1` with one user property.
fn retained(payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    string(b"r/1", &mut body);
    let mut props = vec![0x26];
    string(b"k", &mut props);
    string(b"v", &mut props);
    body.push(u8::try_from(props.len()).unwrap());
    body.extend_from_slice(&props);
    body.extend_from_slice(payload);
    packet(0x31, &body)
}

/// Sends PINGREQ and reads to its PINGRESP: what was sent before it has been handled.
async fn handled(s: &mut TcpStream) {
    s.write_all(&[0xc0, 0]).await.unwrap();
    let mut resp = [0u8; 2];
    within(10, s.read_exact(&mut resp)).await.unwrap();
    assert_eq!(resp, [0xd0, 0], "PINGRESP");
}

#[tokio::test]
async fn replacing_a_retained_message_with_user_properties_gives_its_charge_back() {
    let mut cfg = Config::default();
    cfg.mqtt.sys_interval_secs = 0; // no $SYS retained messages changing meanwhile
    let b = start(cfg).await;
    let memory = b.broker.config().memory.clone();
    let mut s = TcpStream::connect(&b.mqtt).await.unwrap();
    let mut body = Vec::new();
    string(b"MQTT", &mut body);
    body.extend_from_slice(&[5, 0x02, 0, 60, 0]);
    string(b"drift", &mut body);
    s.write_all(&packet(0x10, &body)).await.unwrap();
    let mut head = [0u8; 2];
    within(10, s.read_exact(&mut head)).await.unwrap();
    let mut rest = vec![0u8; usize::from(head[1])];
    within(10, s.read_exact(&mut rest)).await.unwrap();
    assert_eq!((head[0], rest[1]), (0x20, 0), "CONNACK, accepted");
    handled(&mut s).await;
    let before = memory.used();

    let mut burst = Vec::new();
    for _ in 0..N {
        burst.extend_from_slice(&retained(b"x"));
    }
    s.write_all(&burst).await.unwrap();
    handled(&mut s).await;
    let held = memory.used();
    assert!(held > before, "the retained message is charged");
    assert!(
        held - before < 2048,
        "one retained message held, charged {} bytes after {N} replacements",
        held - before
    );
    // Cleared: nothing held, nothing charged.
    s.write_all(&retained(b"")).await.unwrap();
    handled(&mut s).await;
    assert_eq!(
        memory.used(),
        before,
        "a cleared retained message left its charge"
    );
    b.shutdown().await;
}
