//! The accept path: admission under the connection limits, the transport set-up (TLS,
//! shared memory, the WebSocket upgrade) and the hand-over to the protocol's front-end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hayate_broker::Broker;
use hayate_io::busy::BusyPoll;
use hayate_io::transport;
use tokio::sync::watch;

use super::{LimitsCell, Listener, Protocol, current};
use crate::amqp::Amqp;
use crate::auth::Authenticator;
use crate::config::Limits;
use crate::frontend::{Accepted, InputBudget};
use crate::mqtt::Mqtt;
use crate::ops::ListenerStats;
use crate::shm::{FanoutGrant, ShmOffer, ShmSlot};
use crate::stomp::Stomp;
use crate::tls::ServerTls;
use crate::{mqtt, native, stomp, ws};

#[derive(Clone)]
pub(super) struct Ctx {
    /// Where reloads put `[limits]`; `limits` is the version of this connection.
    pub(super) cell: LimitsCell,
    pub(super) listener: Arc<ListenerStats>,
    pub(super) conns: Arc<hayate_io::registry::ConnRegistry>,
    pub(super) keepalive: native::Keepalive,
    pub(super) broker: Broker,
    pub(super) limits: Arc<Limits>,
    pub(super) name: Arc<str>,
    pub(super) stop: watch::Receiver<bool>,
    pub(super) busy: Option<BusyPoll>,
    pub(super) live: Arc<AtomicUsize>,
    pub(super) mqtt: Arc<Mqtt>,
    pub(super) stomp: Arc<Stomp>,
    pub(super) amqp: Arc<Amqp>,
    pub(super) auth: Arc<dyn Authenticator>,
    pub(super) tls: Option<Arc<ServerTls>>,
    pub(super) shm: Option<Arc<ShmOffer>>,
    pub(super) per_address: PerAddress,
    pub(super) rate: Arc<ConnRate>,
    pub(super) budget: InputBudget,
}

impl Ctx {
    /// How long this connection's TLS, WebSocket or shared-memory handshake may take.
    fn handshake(&self) -> Duration {
        Duration::from_millis(self.limits.handshake_timeout_ms.max(1))
    }
}

/// New connections per second per source address: a token bucket per address holding at
/// most `per_sec` tokens, refilled at `per_sec` a second.
pub(super) struct ConnRate {
    pub(super) per_sec: std::sync::atomic::AtomicU32,
    buckets: std::sync::Mutex<Buckets>,
}

#[derive(Default)]
pub(super) struct Buckets {
    map: std::collections::HashMap<std::net::IpAddr, (f64, Instant)>,
    swept: Option<Instant>,
}

/// Most source addresses tracked at once; past it, new addresses are not limited until a
/// sweep (at most once a second) forgets the refilled ones.
pub(super) const MAX_TRACKED: usize = 65_536;

impl ConnRate {
    pub(super) fn new(per_sec: u32) -> ConnRate {
        ConnRate {
            per_sec: std::sync::atomic::AtomicU32::new(per_sec),
            buckets: Default::default(),
        }
    }

    /// Takes a token for a connection from `ip`; false if it has none left.
    pub(super) fn allow(&self, ip: std::net::IpAddr) -> bool {
        let per_sec = self.per_sec.load(Ordering::Relaxed);
        if per_sec == 0 {
            return true;
        }
        let now = Instant::now();
        let full = f64::from(per_sec);
        let ip = crate::auth::address_group(ip);
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if b.map.len() >= MAX_TRACKED && !b.map.contains_key(&ip) {
            if b.swept
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
            {
                // Buckets refilled by now are the same as none: forget them.
                b.map
                    .retain(|_, (_, at)| now.duration_since(*at) < Duration::from_secs(1));
                b.swept = Some(now);
            }
            if b.map.len() >= MAX_TRACKED {
                return true; // not tracked: the per-address connection limit still applies
            }
        }
        let (tokens, at) = b.map.entry(ip).or_insert((full, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * full).min(full);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Connections open per source address (shared by every listener of a server).
pub(super) type PerAddress =
    Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>;

/// Counts a connection in `live` until it ends (and its address, see [`AddressGuard`]).
pub(super) struct LiveGuard {
    live: Arc<AtomicUsize>,
    _address: AddressGuard,
}
impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's count against `limits.max_connections_per_address`, given back on drop.
pub(super) struct AddressGuard(Option<(PerAddress, std::net::IpAddr)>);
impl Drop for AddressGuard {
    fn drop(&mut self) {
        if let Some((map, ip)) = &self.0 {
            let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = m.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    m.remove(ip);
                }
            }
        }
    }
}

/// Counts a connection from `peer` against `limits.max_connections_per_address`: what the
/// connection's guard gives back when it ends, or `Err` when the address is at its limit.
pub(super) fn claim_address(
    ctx: &Ctx,
    peer: Option<std::net::SocketAddr>,
) -> Result<AddressGuard, ()> {
    match peer.map(|a| a.ip()) {
        Some(ip) if ctx.limits.max_connections_per_address > 0 => {
            let mut m = ctx.per_address.lock().unwrap_or_else(|p| p.into_inner());
            let n = m.entry(ip).or_insert(0);
            if *n >= ctx.limits.max_connections_per_address {
                drop(m);
                tracing::warn!(peer = %ip, "connection refused: max_connections_per_address reached");
                return Err(());
            }
            *n += 1;
            Ok(AddressGuard(Some((ctx.per_address.clone(), ip))))
        }
        _ => Ok(AddressGuard(None)),
    }
}

pub(super) async fn accept_loop(l: Listener, ctx: Ctx) {
    loop {
        let accepted = match &l {
            Listener::Tcp(t, p) => t.accept().await.map(|(s, a)| {
                let _ = s.set_nodelay(true);
                (Stream::Tcp(s), *p, Some(a))
            }),
            Listener::Unix(u, _) => u
                .accept()
                .await
                .map(|(s, _)| (Stream::Unix(s), Protocol::Native, None)),
            Listener::Shm(u) => u
                .accept()
                .await
                .map(|(s, _)| (Stream::Shm(s), Protocol::Native, None)),
        };
        let (stream, proto, peer) = match accepted {
            Ok(rw) => rw,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // This connection's limits: the version current now (a reload changes the next ones).
        let mut c = ctx.clone();
        c.limits = current(&ctx.cell);
        let Some(guard) = admit(&c, peer) else {
            ctx.listener.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        // Detached: a connection outlives the accept loop long enough to flush on shutdown;
        // `live` counts it until it ends.
        tokio::spawn(async move {
            let _guard = guard;
            serve_stream(stream, proto, peer, c).await;
        });
    }
}

/// Admits a new connection under the limits (`max_connections`, the per-address rate and
/// count), counting it as accepted and live; `None` when refused (the caller counts it).
pub(super) fn admit(c: &Ctx, peer: Option<SocketAddr>) -> Option<LiveGuard> {
    if c.live.load(Ordering::Acquire) >= c.limits.max_connections {
        tracing::warn!("connection refused: max_connections reached");
        return None;
    }
    if let Some(ip) = peer.map(|a| a.ip())
        && !c.rate.allow(ip)
    {
        tracing::debug!(peer = %ip, "connection refused: max_connection_rate_per_address reached");
        return None;
    }
    let per_address = claim_address(c, peer).ok()?;
    c.listener.accepted.fetch_add(1, Ordering::Relaxed);
    c.live.fetch_add(1, Ordering::AcqRel);
    Some(LiveGuard {
        live: c.live.clone(),
        _address: per_address,
    })
}

/// What the transport set-up of one accepted stream gives besides the transport's halves:
/// who is at the other end, and what the connection holds while it lives.
pub(super) struct Opened {
    peer: Option<SocketAddr>,
    verified_name: Option<String>,
    offer: Option<Arc<ShmOffer>>,
    fanout: Option<FanoutGrant>,
    _held: Option<(ShmSlot, AddressGuard)>,
}

/// Turns an accepted stream into a transport: the TLS handshake on a TLS listener, the
/// shared-memory set-up on the shared-memory socket; `None` when that fails (logged).
pub(super) async fn open_transport(
    stream: Stream,
    proto: Protocol,
    peer: Option<SocketAddr>,
    c: &Ctx,
) -> Option<(transport::Reader, transport::Writer, Opened)> {
    let mut opened = Opened {
        peer,
        verified_name: None,
        offer: c.shm.clone(),
        fanout: None,
        _held: None,
    };
    let (r, w) = match stream {
        Stream::Tcp(s) if proto.is_tls() => {
            let Some(tls) = c.tls.clone() else {
                tracing::warn!(
                    ?peer,
                    "TLS connection refused: no usable [tls] configuration"
                );
                return None;
            };
            match transport::tls::accept(s, tls.config(), c.handshake()).await {
                Ok((r, w, certs)) => {
                    if tls.cert_user() {
                        opened.verified_name = certs
                            .as_ref()
                            .and_then(|c| c.first())
                            .and_then(|c| crate::tls::subject_cn(c));
                    }
                    (r, w)
                }
                Err(e) => {
                    tracing::debug!(?peer, "TLS handshake failed: {e}");
                    return None;
                }
            }
        }
        Stream::Tcp(s) => transport::tcp(s),
        Stream::Unix(s) => transport::unix(s),
        Stream::Shm(s) => {
            let o = opened.offer.take()?;
            let admit = |peer| claim_address(c, peer).ok();
            match crate::shm::accept(&o, s, c.handshake(), &c.budget.memory, admit).await {
                Ok(a) => {
                    // Counted against the address of the session that got the ticket, as a
                    // TCP connection from there is.
                    opened._held = Some((a.slot, a.admitted));
                    opened.peer = a.peer;
                    opened.verified_name = a.verified_name;
                    opened.fanout = a.fanout;
                    (a.reader, a.writer)
                }
                Err(e) => {
                    tracing::debug!("shared-memory set-up refused: {e}");
                    return None;
                }
            }
        }
    };
    Some((r, w, opened))
}

/// Serves one admitted connection to its end: transport, WebSocket upgrade for MQTT over
/// WebSocket, then the protocol's front-end.
pub(super) async fn serve_stream(
    stream: Stream,
    proto: Protocol,
    peer: Option<SocketAddr>,
    c: Ctx,
) {
    let Some((r, w, opened)) = open_transport(stream, proto, peer, &c).await else {
        return;
    };
    let Opened {
        peer,
        verified_name,
        offer,
        fanout,
        _held,
    } = opened;
    let proto = proto.inner();
    let (r, w) = if proto == Protocol::MqttWs {
        let max = c.mqtt.cfg.max_packet_size as usize;
        match ws::accept(r, w, "mqtt", max.saturating_add(1024), c.handshake()).await {
            Ok(rw) => rw,
            Err(e) => {
                tracing::debug!("websocket handshake failed: {e}");
                return;
            }
        }
    } else {
        (r, w)
    };
    let registered = c
        .conns
        .register(c.listener.protocol, c.listener.addr.clone(), peer);
    let io = Accepted {
        reader: r,
        writer: w,
        shutdown: c.stop,
        busy: c.busy,
        peer,
        verified_name,
        budget: c.budget,
        registered: Some(registered),
        class: Some(c.listener.traffic.clone()),
    };
    match proto {
        Protocol::Native => {
            let shm = native::Shm { offer, fanout };
            native::serve(io, c.broker, c.limits, c.name, c.keepalive, c.auth, shm).await;
        }
        Protocol::Mqtt | Protocol::MqttWs => mqtt::conn::serve(io, c.mqtt).await,
        Protocol::Stomp => stomp::conn::serve(io, c.stomp).await,
        Protocol::Amqp => crate::amqp::conn::serve(io, c.amqp).await,
        // `inner()` took the TLS variants off.
        Protocol::NativeTls
        | Protocol::MqttTls
        | Protocol::MqttWss
        | Protocol::StompTls
        | Protocol::AmqpTls => {}
    }
}

pub(super) enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Shm(tokio::net::UnixStream),
}
