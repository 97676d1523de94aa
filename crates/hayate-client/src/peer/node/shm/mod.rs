//! Shared memory between nodes on one host (docs/shm.md, "The transport").
//!
//! Each node that publishes to local nodes has one ring (`hayate_shm`, a sealed memfd): it
//! writes each publication for any of them once, whatever their number, and every local
//! node it is linked to reads the ring and keeps what its own subscriptions match (queue
//! group members are named in the message, with the node's id). The ring is offered when a
//! node dials another: over the other node's Unix socket (abstract name
//! `hayate-peer/<id>`, so it exists only while the node runs and only in its network
//! namespace) the dialler sends the segment and its doorbell (an eventfd); the other node
//! registers a reader and answers with its cursor entry and its own doorbell. No socket, no
//! shared memory: the link carries the node's publications over TCP as before.
//!
//! The Unix connection stays open as long as the attachment: when either end closes (or its
//! process dies), the other learns it at once. A writer then evicts the reader (it no longer
//! waits for it) and closes the link; a reader reads what the ring still holds, then stops.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener};
use std::sync::Arc;
use std::time::Duration;

use hayate_shm::doorbell::Doorbell;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use super::NodeInner;
use crate::Result;

mod outgoing;
mod reader;

pub(super) use outgoing::Outgoing;
use reader::accept_offer;

/// The header naming queue-group members in a ring message: one per member, its value the
/// node's id (u64), the subscription id (u32), both big-endian, then the group's name.
pub const SHM_TO_HEADER: &str = "hayate-peer-shm-to";

/// First word of both handshake messages.
/// (Version 3: a ring message may be a reference to an entry of the writer's arena, flag
/// `REF`; version 2 had no arena, version 1 no mask of the readers a chunk is for.)
const HANDSHAKE: &str = "HAYATE-SHM/3";

/// A chunk's flag (its last byte): more chunks of the same frame follow.
const MORE: u8 = 1;
/// A chunk's flag: the frame's first chunk.
const FIRST: u8 = 2;
/// A ring message's flag: not a chunk but a reference to the whole frame, in the writer's
/// arena (with `FIRST`, and never `MORE`).
const REF: u8 = 4;

/// Every chunk ends with a trailer: the mask of the cursor entries (reading nodes) its frame
/// is for (u64, little-endian), then the flag byte. A reader passes over the chunks of frames
/// not for it without copying them (`read_append_if` shows it the trailer in place).
const TRAILER: usize = 9;

/// How a node uses shared memory with local nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShmMode {
    /// Never: every link is TCP.
    Off,
    /// With every node that is on this host (its Unix socket answers); TCP otherwise.
    #[default]
    Auto,
    /// With every node: a link to a node that cannot take the ring is refused (and redialled
    /// like an unreachable one).
    Require,
}

impl std::str::FromStr for ShmMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "off" => Ok(ShmMode::Off),
            "auto" => Ok(ShmMode::Auto),
            "require" | "on" => Ok(ShmMode::Require),
            _ => Err(format!("shm mode {s:?}: expected off, auto or require")),
        }
    }
}

/// Settings of a node's shared memory.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// When to use it.
    pub mode: ShmMode,
    /// Slots of this node's ring: messages a reliable reader may be behind before the
    /// publisher waits (default 1024).
    pub slots: usize,
    /// Bytes of a slot (default 16 KiB); a larger message takes several consecutive slots.
    /// The ring's size is about `slots` x `slot_bytes` (16 MiB by default, of which only
    /// the pages written are backed by memory). A ring that fits the processor's last-level
    /// cache moves large messages about twice as fast as one that does not (docs/shm.md,
    /// *Defaults and limits*).
    pub slot_bytes: usize,
    /// How long a reader that finds its ring empty keeps looking (yielding to other tasks)
    /// before it sleeps until the writer's wake-up: lower latency for a core kept busy
    /// (default 0: sleeps at once).
    pub spin: Duration,
    /// Bytes of this node's arena (default 16 MiB; 0: none): a message larger than a slot
    /// is written there once and the local nodes it is for read it in place, its payload a
    /// slice of the arena, instead of copying it out of the ring (docs/shm.md, *Messages
    /// read in place*). Only the pages written are backed by memory.
    pub arena_bytes: usize,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            mode: ShmMode::Auto,
            slots: 1024,
            slot_bytes: 16 * 1024,
            spin: Duration::ZERO,
            arena_bytes: 16 << 20,
        }
    }
}

/// A doorbell the runtime's reactor watches.
fn async_bell(bell: Doorbell) -> Result<AsyncFd<Doorbell>> {
    Ok(hayate_io::transport::shm::async_bell(bell)?)
}

/// The abstract Unix socket name of node `id`.
fn socket_name(id: u64) -> String {
    format!("hayate-peer/{id:016x}")
}

fn unix_addr(id: u64) -> std::io::Result<UnixAddr> {
    UnixAddr::from_abstract_name(socket_name(id).as_bytes())
}

/// Serves offers of rings from nodes dialling this one.
pub(super) fn listen(node: Arc<NodeInner>, stop: watch::Receiver<bool>) {
    let listener = match UnixListener::bind_addr(&match unix_addr(node.id) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("peer: no shared memory (socket name: {e})");
            return;
        }
    }) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("peer: no shared memory (cannot listen on its Unix socket: {e})");
            return;
        }
    };
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("peer: no shared memory ({e})");
            return;
        }
    };
    tokio::spawn(async move {
        let mut stop2 = stop.clone();
        loop {
            tokio::select! {
                r = listener.accept() => {
                    let Ok((sock, _)) = r else { continue };
                    let node = node.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        if let Err(e) = accept_offer(node, sock, stop).await {
                            tracing::debug!("peer: shm offer refused: {e}");
                        }
                    });
                }
                _ = stop2.changed() => return,
            }
        }
    });
}

/// Resolves when the other end of `sock` has closed (or the socket failed); what it sends
/// is read and ignored.
async fn closed(sock: &tokio::net::UnixStream) {
    let mut b = [0u8; 64];
    loop {
        if sock.readable().await.is_err() {
            return;
        }
        match sock.try_read(&mut b) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// The words of a handshake message after its first, [`HANDSHAKE`]; none if it starts
/// otherwise, or has more than five.
fn handshake_words(text: &str) -> Vec<&str> {
    let mut words = text.split(' ');
    if words.next() != Some(HANDSHAKE) {
        return Vec::new();
    }
    let rest: Vec<&str> = words.take(6).collect();
    if rest.len() > 5 { Vec::new() } else { rest }
}

/// The flags of a reference: one whole frame.
const FLAGS_REF: u8 = FIRST | REF;
