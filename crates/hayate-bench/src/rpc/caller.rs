//! The callers: one [`Caller`] per connection with one request in flight
//! ([`connect_caller`]), and the calls of a point spread over them ([`run_callers`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;

use super::amqp_queue;
use super::pubsub::connect_pubsub_caller;
use super::stomp_queue;
use super::{Outcome, RpcOptions, RpcPoint, check_reply};
use crate::driver::{Conn, Sub, Topic};
use crate::target::{System, Target};

/// One caller: a connection with one request in flight.
pub(super) enum Caller {
    Hayate(hayate_client::Client, hayate_core::Key),
    /// Hayate peer mode with nodes (`rpc=node`): this caller's node, linked to the server's.
    HayateNode(hayate_client::peer::Node, hayate_core::Key),
    Nats(async_nats::Client, async_nats::Subject),
    Stomp(
        crate::driver::stomp::StompConn,
        crate::driver::stomp::StompSub,
        String,
    ),
    PubSub {
        conn: Conn,
        topic: Topic,
        replies: Sub,
        id: u64,
    },
    #[cfg(feature = "peers")]
    Amqp(crate::driver::amqp::RpcCaller),
    /// `amqp://...?client=hayate`.
    Amqpc(crate::driver::amqpc::RpcCaller),
    /// `amqp://...?client=hayate&io=blocking`: calls block a thread of the caller's own.
    AmqpcBlocking(crate::driver::amqpc::BlockingCaller),
    #[cfg(feature = "peers")]
    Zmq(crate::driver::zmq::RpcCaller),
    #[cfg(feature = "peers")]
    Grpc(crate::driver::grpc::RpcCaller),
    #[cfg(feature = "peers")]
    Zenoh(::zenoh::Session, String),
}

impl Caller {
    async fn call(&mut self, n: u64, timeout: Duration) -> anyhow::Result<Bytes> {
        let req = Bytes::from(n.to_string());
        let fut = async {
            Ok(match self {
                Caller::Hayate(c, k) => c.request(k, req, timeout).await?.payload,
                Caller::HayateNode(n, k) => n.request(k, req, timeout).await?.payload,
                Caller::Nats(c, s) => c.request(s.clone(), req).await?.payload,
                Caller::Stomp(c, replies, dest) => {
                    c.send(dest, &[("reply-to", "/temp-queue/rpc")], &req)
                        .await?;
                    replies
                        .next_frame()
                        .await
                        .context("stomp: the connection ended")?
                        .body
                }
                Caller::PubSub {
                    conn,
                    topic,
                    replies,
                    id,
                } => {
                    let mut p = id.to_string().into_bytes();
                    p.push(b' ');
                    p.extend_from_slice(&req);
                    conn.publish(topic, Bytes::from(p)).await?;
                    replies
                        .next()
                        .await
                        .context("the reply subscription ended")?
                }
                #[cfg(feature = "peers")]
                Caller::Amqp(c) => c.call(&req).await?,
                Caller::Amqpc(c) => c.call(&req).await?,
                // Outside the measured loop (warm-up): that loop calls it on its own thread.
                Caller::AmqpcBlocking(c) => tokio::task::block_in_place(|| c.call(&req, timeout))?,
                #[cfg(feature = "peers")]
                Caller::Zmq(c) => c.call(req).await?,
                #[cfg(feature = "peers")]
                Caller::Grpc(c) => c.call(req).await?,
                #[cfg(feature = "peers")]
                Caller::Zenoh(s, key) => {
                    crate::driver::zenoh::rpc_call(s, key, req, timeout).await?
                }
            })
        };
        tokio::time::timeout(timeout, fut)
            .await
            .with_context(|| format!("rpc: no reply to request {n} within {timeout:?}"))?
    }

    async fn close(self) {
        let t = Duration::from_secs(5);
        match self {
            Caller::Hayate(c, _) => {
                let _ = tokio::time::timeout(t, c.close()).await;
            }
            Caller::HayateNode(n, _) => {
                let _ = tokio::time::timeout(t, n.close()).await;
            }
            Caller::Nats(..) => {}
            Caller::Stomp(c, _, _) => {
                let _ = tokio::time::timeout(t, c.close()).await;
            }
            Caller::PubSub { conn, .. } => conn.close(t).await,
            #[cfg(feature = "peers")]
            Caller::Amqp(c) => c.close().await,
            Caller::Amqpc(c) => c.close().await,
            Caller::AmqpcBlocking(c) => {
                let _ = tokio::task::spawn_blocking(move || c.close()).await;
            }
            #[cfg(feature = "peers")]
            Caller::Zmq(_) | Caller::Grpc(_) => {}
            #[cfg(feature = "peers")]
            Caller::Zenoh(s, _) => {
                let _ = s.close().await;
            }
        }
    }
}

#[cfg_attr(not(feature = "peers"), allow(unused_variables))]
async fn connect_caller(
    target: &Target,
    prefix: &str,
    endpoint: Option<&str>,
    id: u64,
) -> anyhow::Result<Caller> {
    let key = format!("{prefix}/req");
    Ok(match target.system {
        System::Hayate if super::server::node_rpc(target) => {
            // A node of this caller's own, linked to the server's node (over shared memory
            // when the target's `shm` says so and both are on this host).
            let ep = endpoint.context("rpc=node: no server endpoint")?;
            let n = hayate_client::peer::Node::start(crate::driver::peer_node_options(
                target,
                vec![ep.to_string()],
            )?)
            .await?;
            n.wait_peers(1, Duration::from_secs(10))
                .await
                .context("rpc=node: the caller's node did not link to the server's")?;
            Caller::HayateNode(n, hayate_core::Key::new(&key)?)
        }
        System::Hayate => {
            let c = match endpoint {
                // A direct peer server (mode=peer-to-peer).
                Some(ep) => hayate_client::Client::connect(ep).await?,
                // Through the broker, with the target's settings (`shm`, `ca`).
                None => crate::driver::hayate_client(target, &format!("bench-rpc-{id}")).await?,
            };
            Caller::Hayate(c, hayate_core::Key::new(&key)?)
        }
        System::Nats => {
            let c = async_nats::connect(format!("nats://{}", target.addr())).await?;
            Caller::Nats(c, async_nats::Subject::from(key.replace('/', ".")))
        }
        System::Stomp => {
            let Conn::Stomp(c) = Conn::connect(target, &format!("bench-rpc-{id}"), 64).await?
            else {
                bail!("stomp: unexpected connection kind");
            };
            // Replies to a temp-queue come with `subscription:/temp-queue/rpc`.
            let replies = c.listen("/temp-queue/rpc");
            Caller::Stomp(c, replies, stomp_queue(prefix))
        }
        System::Amqp if super::amqp_blocking(target) => Caller::AmqpcBlocking(
            crate::driver::amqpc::BlockingCaller::connect(target, &amqp_queue(prefix)).await?,
        ),
        System::Amqp if target.param("client") == Some("hayate") => Caller::Amqpc(
            crate::driver::amqpc::RpcCaller::connect(target, &amqp_queue(prefix)).await?,
        ),
        #[cfg(feature = "peers")]
        System::Amqp => Caller::Amqp(
            crate::driver::amqp::RpcCaller::connect(target, &amqp_queue(prefix)).await?,
        ),
        #[cfg(feature = "peers")]
        System::Zmq => {
            let ep = endpoint.context("zmq: no server endpoint")?;
            Caller::Zmq(crate::driver::zmq::RpcCaller::connect(ep).await?)
        }
        #[cfg(feature = "peers")]
        System::Grpc => {
            let ep = endpoint.context("grpc: no server endpoint")?;
            Caller::Grpc(crate::driver::grpc::RpcCaller::connect(ep).await?)
        }
        #[cfg(feature = "peers")]
        System::Zenoh => {
            let s = crate::driver::zenoh::open_client(target, endpoint).await?;
            Caller::Zenoh(s, key)
        }
        System::Mqtt => connect_pubsub_caller(target, &key, prefix, id).await?,
        #[cfg(feature = "peers")]
        System::Kafka => connect_pubsub_caller(target, &key, prefix, id).await?,
        #[cfg(not(feature = "peers"))]
        other => bail!("rpc: the {} driver is not compiled in", other.name()),
    })
}

pub(super) async fn run_callers(
    target: &Target,
    prefix: &str,
    endpoint: Option<&str>,
    point: RpcPoint,
    opts: &RpcOptions,
) -> anyhow::Result<Outcome> {
    let mut callers = Vec::with_capacity(point.concurrency);
    for id in 0..point.concurrency as u64 {
        let mut c = connect_caller(target, prefix, endpoint, id).await?;
        // Warm-up and readiness: a first call must succeed (the server's subscription or
        // queryable has reached the caller's side). Retried for up to 10 s.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = u64::MAX / 2;
            match c.call(probe, Duration::from_secs(1)).await {
                Ok(r) if check_reply(probe, &r).is_ok() => break,
                Ok(r) => bail!("rpc: warm-up call got {r:?}"),
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context("rpc: the server never answered"));
                }
                // A reply that was late for the probe could arrive with the next call:
                // reconnect to start clean.
                Err(_) => {
                    c.close().await;
                    c = connect_caller(target, prefix, endpoint, id).await?;
                }
            }
        }
        for i in 0..20 {
            let r = c.call(i, opts.call_timeout).await?;
            check_reply(i, &r)?;
        }
        callers.push(c);
    }
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let stop_at = t0 + opts.max_time;
    let mut tasks = Vec::new();
    for c in callers {
        let next = next.clone();
        let timeout = opts.call_timeout;
        let calls = point.calls;
        let take = move || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            (i < calls && Instant::now() <= stop_at).then_some(i)
        };
        tasks.push(match c {
            // Its own thread, blocked in its socket's reads.
            Caller::AmqpcBlocking(mut c) => tokio::task::spawn_blocking(move || {
                let mut tally = Tally::new()?;
                let res = (|| {
                    while let Some(i) = take() {
                        let t = Instant::now();
                        let r = c.call(i.to_string().as_bytes(), timeout)?;
                        tally.record(i, &r, t.elapsed())?;
                    }
                    anyhow::Ok(())
                })();
                let end = t0.elapsed();
                c.close();
                res.map(|()| (tally, end))
            }),
            mut c => tokio::spawn(async move {
                let mut tally = Tally::new()?;
                let res: anyhow::Result<()> = async {
                    while let Some(i) = take() {
                        let t = Instant::now();
                        let r = c.call(i, timeout).await?;
                        tally.record(i, &r, t.elapsed())?;
                    }
                    Ok(())
                }
                .await;
                // The point's time ends with the last call, not with the connection's close.
                let end = t0.elapsed();
                c.close().await;
                res.map(|()| (tally, end))
            }),
        });
    }
    let mut hist = crate::lat::new_histogram()?;
    let mut calls = 0;
    let mut elapsed = Duration::ZERO;
    let mut first_err = None;
    for t in tasks {
        match t.await.context("rpc caller task")? {
            Ok((tally, end)) => {
                hist.add(&tally.hist)?;
                calls += tally.done;
                elapsed = elapsed.max(end);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok(Outcome {
        version: None,
        calls,
        elapsed,
        hist,
    })
}

/// The calls one caller made: their times, checked replies only.
struct Tally {
    hist: hdrhistogram::Histogram<u64>,
    done: u64,
}

impl Tally {
    fn new() -> anyhow::Result<Tally> {
        Ok(Tally {
            hist: crate::lat::new_histogram()?,
            done: 0,
        })
    }

    /// Call `i` answered `r` after `took`: an error if the answer is wrong.
    fn record(&mut self, i: u64, r: &[u8], took: Duration) -> anyhow::Result<()> {
        check_reply(i, r)?;
        self.hist.saturating_record((took.as_nanos() as u64).max(1));
        self.done += 1;
        Ok(())
    }
}
