//! Peer nodes that know nothing of each other meet through a broker (`NodeOptions::
//! rendezvous`) and then exchange messages directly: stopping the broker afterwards changes
//! nothing for them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use hayate_client::Key;
use hayate_client::peer::{Node, NodeOptions};
use hayate_server::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_meet_through_a_broker_then_talk_without_it() {
    let broker = common::start(Config::default()).await;
    let options = || NodeOptions {
        rendezvous: Some(broker.addr.clone()),
        ..NodeOptions::default()
    };
    let a = Node::start(options()).await.unwrap();
    let b = Node::start(options()).await.unwrap();
    let wait = Duration::from_secs(15);
    tokio::time::timeout(wait, a.wait_peers(1, wait))
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(wait, b.wait_peers(1, wait))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.peers(), vec![b.id()]);
    broker.shutdown().await;
    let mut sub = b.subscribe("direct/*").await.unwrap();
    a.publish(&Key::new("direct/1").unwrap(), "no broker")
        .await
        .unwrap();
    let m = tokio::time::timeout(wait, sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"no broker");
}
