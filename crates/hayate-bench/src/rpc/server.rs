//! The serving side of a point in this process ([`Server`]) and how each system serves
//! ([`start_server`]).

use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;

use super::amqp_queue;
use super::pubsub::start_pubsub_server;
use super::{add_one, stomp_queue};
use crate::driver::Conn;
use crate::target::{System, Target};

/// The serving side of a point; stopped by [`Server::stop`].
#[cfg_attr(not(feature = "peers"), allow(dead_code))]
pub(super) struct Server {
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(super) conns: Vec<Conn>,
    /// Where callers find the server (ZeroMQ's endpoint; Zenoh peer mode's listener; the
    /// Hayate peer's address).
    pub(super) endpoint: Option<String>,
    /// Hayate peer to peer: the direct listener.
    peer: Option<hayate_client::peer::PeerServer>,
    /// Hayate peer mode with nodes (`rpc=node`): the server's node.
    node: Option<hayate_client::peer::Node>,
    #[cfg(feature = "peers")]
    amqp: Option<crate::driver::amqp::RpcServer>,
    /// `amqp://...?client=hayate`: the server on our own AMQP client.
    amqpc: Option<crate::driver::amqpc::RpcServer>,
    #[cfg(feature = "peers")]
    zenoh: Option<::zenoh::Session>,
}

impl Server {
    fn new() -> Server {
        Server {
            tasks: Vec::new(),
            conns: Vec::new(),
            endpoint: None,
            peer: None,
            node: None,
            #[cfg(feature = "peers")]
            amqp: None,
            amqpc: None,
            #[cfg(feature = "peers")]
            zenoh: None,
        }
    }

    /// The server's version, when its connection says (Hayate, STOMP, MQTT, Kafka).
    pub(super) fn version(&self) -> Option<String> {
        self.conns.first().and_then(Conn::server_version)
    }

    pub(super) async fn stop(self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some(p) = self.peer {
            p.close().await;
        }
        if let Some(n) = self.node {
            let _ = tokio::time::timeout(Duration::from_secs(5), n.close()).await;
        }
        for c in self.conns {
            c.close(Duration::from_secs(5)).await;
        }
        #[cfg(feature = "peers")]
        if let Some(a) = self.amqp {
            a.close().await;
        }
        if let Some(a) = self.amqpc {
            a.close().await;
        }
        #[cfg(feature = "peers")]
        if let Some(z) = self.zenoh {
            let _ = z.close().await;
        }
    }
}

/// Whether `target` asks for RPC between peer nodes (`hayate://HOST?mode=peer&rpc=node`)
/// rather than through a `PeerServer`.
pub(super) fn node_rpc(target: &Target) -> bool {
    target.system == System::Hayate
        && target.mode() == "peer-to-peer"
        && target.param("rpc") == Some("node")
}

pub(super) async fn start_server(target: &Target, prefix: &str) -> anyhow::Result<Server> {
    let mut server = Server::new();
    let key = format!("{prefix}/req");
    match target.system {
        System::Hayate if node_rpc(target) => {
            // A peer node that callers' nodes link to; requests come through its
            // subscription (over shared memory from callers on this host, as `shm` says).
            let n = hayate_client::peer::Node::start(crate::driver::peer_node_options(
                target,
                Vec::new(),
            )?)
            .await?;
            let mut sub = n.subscribe(&key).await?;
            let srv = n.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if srv.reply(&m, add_one(&m.payload)).await.is_err() {
                        break;
                    }
                }
            }));
            server.endpoint = Some(n.local_addr().to_string());
            server.node = Some(n);
        }
        System::Hayate if target.mode() == "peer-to-peer" => {
            // Direct: a PeerServer on the target's host (a free port) that callers connect to.
            let host = if target.host.contains(':') {
                format!("[{}]", target.host)
            } else {
                target.host.clone()
            };
            let peer = hayate_client::peer::PeerServer::bind(
                &format!("{host}:0"),
                &[&key],
                |m: hayate_core::Message| async move { m.reply(add_one(&m.payload)) },
            )
            .await?;
            server.endpoint = Some(peer.local_addr().to_string());
            server.peer = Some(peer);
        }
        System::Hayate => {
            let c = crate::driver::hayate_client(target, "bench-rpc-server").await?;
            let mut sub = c.subscribe(&key).await?;
            c.flush().await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if srv.reply(&m, add_one(&m.payload)).await.is_err() {
                        break;
                    }
                }
            }));
            server.conns.push(Conn::Hayate(c));
        }
        System::Nats => {
            let c = async_nats::connect(format!("nats://{}", target.addr())).await?;
            let mut sub = c.subscribe(key.replace('/', ".")).await?;
            c.flush().await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(m) = sub.next().await {
                    if let Some(reply) = m.reply
                        && srv.publish(reply, add_one(&m.payload)).await.is_err()
                    {
                        break;
                    }
                }
            }));
            let _ = c.flush().await;
        }
        System::Stomp => {
            let Conn::Stomp(c) = Conn::connect(target, "bench-rpc-server", 64).await? else {
                bail!("stomp: unexpected connection kind");
            };
            let mut sub = c.subscribe_destination(&stomp_queue(prefix)).await?;
            c.flush(Duration::from_secs(10)).await?;
            let srv = c.clone();
            server.tasks.push(tokio::spawn(async move {
                while let Some(f) = sub.next_frame().await {
                    let Some(reply_to) = f.get("reply-to") else {
                        continue;
                    };
                    let mut headers = Vec::new();
                    if let Some(id) = f.get("correlation-id") {
                        headers.push(("correlation-id", id));
                    }
                    if srv
                        .send(reply_to, &headers, &add_one(&f.body))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }));
            server.conns.push(Conn::Stomp(c));
        }
        System::Amqp if target.param("client") == Some("hayate") => {
            server.amqpc = Some(
                crate::driver::amqpc::RpcServer::start(
                    target,
                    &amqp_queue(prefix),
                    add_one,
                    super::amqp_blocking(target),
                )
                .await?,
            );
        }
        #[cfg(feature = "peers")]
        System::Amqp => {
            server.amqp = Some(
                crate::driver::amqp::RpcServer::start(target, &amqp_queue(prefix), add_one).await?,
            );
        }
        #[cfg(feature = "peers")]
        System::Zmq => {
            let (endpoint, task) = crate::driver::zmq::rpc_serve(target, add_one).await?;
            server.endpoint = Some(endpoint);
            server.tasks.push(task);
        }
        #[cfg(feature = "peers")]
        System::Grpc => {
            let (endpoint, task) = crate::driver::grpc::rpc_serve(target, add_one).await?;
            server.endpoint = Some(endpoint);
            server.tasks.push(task);
        }
        #[cfg(feature = "peers")]
        System::Zenoh => {
            let (session, endpoint) = crate::driver::zenoh::open_server(target).await?;
            let task =
                crate::driver::zenoh::rpc_serve(session.clone(), key.clone(), add_one).await?;
            server.tasks.push(task);
            server.endpoint = endpoint;
            server.zenoh = Some(session);
        }
        System::Mqtt => start_pubsub_server(target, &key, prefix, &mut server).await?,
        #[cfg(feature = "peers")]
        System::Kafka => start_pubsub_server(target, &key, prefix, &mut server).await?,
        #[cfg(not(feature = "peers"))]
        other => bail!("rpc: the {} driver is not compiled in", other.name()),
    }
    Ok(server)
}
