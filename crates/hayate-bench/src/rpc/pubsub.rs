//! Pub/sub request-reply, for the systems without a request/reply of their own here (MQTT,
//! Kafka): each caller subscribes to a reply topic of its own and sends `"<caller> <n>"` to
//! the request topic; the server publishes the answer to that caller's reply topic.

use bytes::Bytes;

use super::add_one;
use super::caller::Caller;
use super::server::Server;
use crate::driver::{Conn, Topic};
use crate::target::Target;

/// The pub/sub request-reply server's answer to `"<caller> <n>"`: `(caller, n + 1)`.
pub(super) fn pubsub_answer(req: &[u8]) -> Option<(u64, Bytes)> {
    let s = std::str::from_utf8(req).ok()?;
    let (caller, n) = s.split_once(' ')?;
    Some((caller.parse().ok()?, add_one(n.as_bytes())))
}

/// The server of pub/sub request-reply (MQTT, Kafka): answers `"<caller> <n>"` on
/// `<prefix>/rep/<caller>`.
pub(super) async fn start_pubsub_server(
    target: &Target,
    key: &str,
    prefix: &str,
    server: &mut Server,
) -> anyhow::Result<()> {
    let conn = Conn::connect(target, "bench-rpc-server", 64).await?;
    let mut sub = conn.subscribe(key).await?;
    conn.flush().await?;
    let srv = conn.clone();
    let prefix = prefix.to_string();
    server.tasks.push(tokio::spawn(async move {
        let mut topics: std::collections::HashMap<u64, Topic> = std::collections::HashMap::new();
        while let Some(req) = sub.next().await {
            let Some((caller, answer)) = pubsub_answer(&req) else {
                continue;
            };
            if let std::collections::hash_map::Entry::Vacant(e) = topics.entry(caller) {
                match srv.topic(&format!("{prefix}/rep/{caller}")).await {
                    Ok(t) => {
                        e.insert(t);
                    }
                    Err(_) => break,
                }
            }
            if srv.publish(&topics[&caller], answer).await.is_err() {
                break;
            }
        }
    }));
    server.conns.push(conn);
    Ok(())
}

/// A caller of pub/sub request-reply (MQTT, Kafka), with its reply topic subscribed.
pub(super) async fn connect_pubsub_caller(
    target: &Target,
    key: &str,
    prefix: &str,
    id: u64,
) -> anyhow::Result<Caller> {
    let conn = Conn::connect(target, &format!("bench-rpc-{id}"), 64).await?;
    let replies = conn.subscribe(&format!("{prefix}/rep/{id}")).await?;
    conn.flush().await?;
    let topic = conn.topic(key).await?;
    Ok(Caller::PubSub {
        conn,
        topic,
        replies,
        id,
    })
}
