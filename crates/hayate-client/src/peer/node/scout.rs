//! UDP multicast scouting: every node sends a short announcement to a multicast group now
//! and then, and dials the nodes it hears (docs/peer.md).
//!
//! Datagram (ASCII, at most [`MAX_DATAGRAM`] bytes): `HAYATE/1 SCOUT <id> <address>`, the
//! node's id in 16 hex digits and the `HOST:PORT` it listens on; an unspecified host
//! (`0.0.0.0`) means "the address this datagram came from". Anything else is ignored. A node
//! announces itself every [`ScoutOptions::interval`], and at once (at most every 100 ms) when
//! it hears a node it has no link to, so that a newcomer is answered without waiting.
//!
//! A socket that cannot be opened, bound or joined to the group (no multicast route, no
//! such interface, the port taken without `SO_REUSEPORT`) is logged as a warning and the
//! node carries on without scouting.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use super::{NodeInner, lock, resolve_advertised};

/// The longest datagram sent or accepted.
pub const MAX_DATAGRAM: usize = 512;

const MAGIC: &str = "HAYATE/1 SCOUT ";

/// Multicast scouting settings.
#[derive(Debug, Clone)]
pub struct ScoutOptions {
    /// The multicast group (default 239.255.47.1, administratively scoped).
    pub group: Ipv4Addr,
    /// The UDP port (default 4701).
    pub port: u16,
    /// The address of the interface to send and listen on (`None`: the system's choice,
    /// which needs a route for the group).
    pub interface: Option<Ipv4Addr>,
    /// How often a node announces itself.
    pub interval: Duration,
}

impl Default for ScoutOptions {
    fn default() -> Self {
        ScoutOptions {
            group: Ipv4Addr::new(239, 255, 47, 1),
            port: 4701,
            interface: None,
            interval: Duration::from_secs(1),
        }
    }
}

fn open(o: &ScoutOptions) -> std::io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, o.port)).into())?;
    let iface = o.interface.unwrap_or(Ipv4Addr::UNSPECIFIED);
    s.join_multicast_v4(&o.group, &iface)?;
    if let Some(i) = o.interface {
        s.set_multicast_if_v4(&i)?;
    }
    s.set_multicast_loop_v4(true)?;
    s.set_multicast_ttl_v4(1)?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s.into())
}

/// Parses an announcement: the node's id and address.
pub(crate) fn parse(d: &[u8]) -> Option<(u64, String)> {
    if d.len() > MAX_DATAGRAM {
        return None;
    }
    let s = std::str::from_utf8(d).ok()?.strip_prefix(MAGIC)?;
    let (id, addr) = s.split_once(' ')?;
    if id.len() != 16 || addr.contains(' ') {
        return None;
    }
    Some((u64::from_str_radix(id, 16).ok()?, addr.to_string()))
}

/// Starts scouting for `node` (a warning, and nothing else, if the socket cannot be
/// opened).
pub(super) fn start(node: Arc<NodeInner>, o: ScoutOptions) {
    let socket = match open(&o) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(
                group = %o.group,
                port = o.port,
                "peer node: multicast scouting is off: cannot open its socket: {e}"
            );
            return;
        }
    };
    tokio::spawn(run(node, o, socket));
}

async fn run(node: Arc<NodeInner>, o: ScoutOptions, socket: UdpSocket) {
    let me = format!("{MAGIC}{:016x} {}", node.id, node.advertise);
    let to = SocketAddr::V4(SocketAddrV4::new(o.group, o.port));
    let mut stop = node.stop.subscribe();
    let mut tick = tokio::time::interval(o.interval.max(Duration::from_millis(10)));
    let mut last_sent = tokio::time::Instant::now();
    let mut warned = false;
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    loop {
        let send_now = tokio::select! {
            _ = tick.tick() => true,
            r = socket.recv_from(&mut buf) => match r {
                Ok((n, from)) => {
                    let Some((id, addr)) = parse(&buf[..n]) else { continue };
                    if id == node.id {
                        continue;
                    }
                    let known = lock(&node.state).links.contains_key(&id);
                    if !known && let Some(a) = resolve_advertised(&addr, from.ip()) {
                        node.discovered(id, a);
                    }
                    !known && last_sent.elapsed() >= Duration::from_millis(100)
                }
                Err(_) => false,
            },
            _ = stop.changed() => return,
        };
        if send_now {
            last_sent = tokio::time::Instant::now();
            if let Err(e) = socket.send_to(me.as_bytes(), to).await
                && !warned
            {
                warned = true;
                tracing::warn!(%to, "peer node: cannot send a scouting datagram: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_announcements() {
        assert_eq!(
            parse(b"HAYATE/1 SCOUT 00000000000000ff 10.0.0.1:4702"),
            Some((255, "10.0.0.1:4702".into()))
        );
        for bad in [
            &b""[..],
            b"HAYATE/1 SCOUT ff 10.0.0.1:1",
            b"HAYATE/2 SCOUT 00000000000000ff 10.0.0.1:1",
            b"HAYATE/1 SCOUT 00000000000000fg 10.0.0.1:1",
            b"HAYATE/1 SCOUT 00000000000000ff 10.0.0.1:1 extra",
            b"\xff\xfe",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        let long = format!("HAYATE/1 SCOUT 00000000000000ff {}", "a".repeat(600));
        assert_eq!(parse(long.as_bytes()), None);
    }
}
