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

use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hayate_core::Message;
use hayate_native::Frame;
use hayate_shm::announce::{self, PeerProcess};
use hayate_shm::arena::{ArenaView, Departures, EntryError, MAX_REFERENCE, Release, ReleaseTable};
use hayate_shm::doorbell::Doorbell;
use hayate_shm::segment::Segment;
use hayate_shm::{MAX_READERS, ReadError, SharedReader, SharedRing, SharedWriter};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::time::Instant;

use super::inplace::{Arena, Holder, Ref};
use super::{LocalTarget, NodeInner, lock, server};
use crate::{Client, Error, Result};

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

/// A node reading this node's ring.
#[derive(Debug, Clone)]
pub(super) struct ReaderEntry {
    peer: u64,
    bell: Arc<Doorbell>,
    /// This node's link to it.
    link: Client,
    /// What it says of the references it read in place (it reads in place).
    holder: Option<Arc<Holder>>,
}

/// This node's ring and the readers attached to it.
#[derive(Debug)]
pub(super) struct Outgoing {
    /// The writer, the encoding buffer and the arena; an async lock: a publication waits
    /// for room while holding it (the chunks of one message are consecutive).
    writer: tokio::sync::Mutex<(SharedWriter, BytesMut, Option<Arena>)>,
    /// The arena's descriptor (a copy), to offer while fewer than
    /// [`hayate_shm::arena::MAX_DEPARTED`] departed nodes are not yet let go of (`departed`).
    arena_fd: Option<std::os::fd::OwnedFd>,
    /// Departed nodes whose holders live on (counted by the holders themselves).
    departed: Departures,
    /// This writer's doorbell (readers ring it when it waits for them).
    doorbell: AsyncFd<Doorbell>,
    /// Per cursor entry: the node reading with it.
    readers: Mutex<Vec<Option<ReaderEntry>>>,
    /// The ring (to hand out and to evict readers without the writer's lock).
    ring: SharedRing,
    /// Frame bytes of a chunk (a slot less the chunk's trailer).
    chunk: usize,
}

impl Outgoing {
    pub(super) fn new(options: &ShmOptions, id: u64) -> Result<Outgoing> {
        // Bounds checked by `Node::start`.
        let slot = options.slot_bytes.max(64);
        let words = hayate_shm::region_words(options.slots.max(2), slot);
        let segment = Segment::create(&format!("hayate-peer-{id:016x}"), words * 8)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let ring = SharedRing::init(segment, options.slots.max(2), slot)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let writer = SharedWriter::new(ring.clone());
        let chunk = writer.max_payload() - TRAILER;
        // No arena is a warning, not a failed start (a kernel before 5.1 cannot seal one
        // against writing by its readers): large messages then go through the ring.
        let arena = (options.arena_bytes > 0)
            .then(|| Arena::new(id, options.arena_bytes))
            .and_then(|a| {
                a.inspect_err(|e| tracing::warn!("peer: no shared-memory arena: {e}"))
                    .ok()
            });
        let arena_fd = match &arena {
            Some(a) => Some(a.fd().try_clone_to_owned()?),
            None => None,
        };
        Ok(Outgoing {
            ring,
            writer: tokio::sync::Mutex::new((writer, BytesMut::new(), arena)),
            arena_fd,
            departed: Departures::default(),
            doorbell: async_bell(Doorbell::new()?)?,
            readers: Mutex::new(vec![None; MAX_READERS]),
            chunk,
        })
    }

    /// Waits until every node reading the ring has handed on what was published before
    /// the call (or has gone), at most `timeout`.
    pub(super) async fn flushed(&self, timeout: Duration) {
        let upto = self.ring.head();
        // Readers asleep over messages that were not for them: up, to read on and commit.
        self.wake(self.ring.take_sleepers(u64::MAX));
        let until = Instant::now() + timeout;
        loop {
            let waiting = {
                let readers = lock(&self.readers);
                (0..MAX_READERS).any(|i| readers[i].is_some() && !self.ring.has_read(i, upto))
            };
            if !waiting || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The entries of the arena still held, and their bytes, after freeing those every node
    /// is done with; `None` without an arena. Waits for the writer's lock.
    pub(super) async fn arena_held(&self) -> Option<(usize, usize)> {
        let mut guard = self.writer.lock().await;
        let arena = guard.2.as_mut()?;
        arena.reclaim(&self.ring);
        Some(arena.held())
    }

    /// The holders of the nodes of `to`, if every one of them reads in place.
    fn holders(&self, to: u64) -> Option<Vec<Arc<Holder>>> {
        let readers = lock(&self.readers);
        let mut out = Vec::with_capacity(to.count_ones() as usize);
        for (i, r) in readers.iter().enumerate() {
            if to & (1 << i) != 0 {
                out.push(r.as_ref()?.holder.clone()?);
            }
        }
        Some(out)
    }

    fn wake(&self, mask: u64) {
        if mask == 0 {
            return;
        }
        let readers = lock(&self.readers);
        for (i, r) in readers.iter().enumerate() {
            if mask & (1 << i) != 0
                && let Some(r) = r
            {
                r.bell.ring();
            }
        }
    }
}

impl NodeInner {
    /// Writes `msg` once into this node's ring, naming the queue-group members `named`
    /// (node, subscription, group) chosen on local nodes. Waits while a reliable reader is a
    /// ring behind, at most `max_block`; then that reader is evicted (a slow consumer: its
    /// link closes).
    pub(super) async fn shm_publish(
        &self,
        out: &Outgoing,
        msg: &Message,
        named: &[(u64, u32, Arc<str>)],
        to: u64,
    ) {
        let mut guard = out.writer.lock().await;
        let (writer, head, arena) = &mut *guard;
        head.clear();
        if named.is_empty() {
            hayate_native::encode_pub_head(msg, head);
        } else {
            let m = server::with_named(
                msg,
                SHM_TO_HEADER,
                named.iter().map(|(node, sid, g)| (Some(*node), *sid, &**g)),
            );
            hayate_native::encode_pub_head(&m, head);
        }
        let payload = &msg.payload[..];
        let total = head.len() + payload.len();
        let mut since: Option<Instant> = None;
        let mut trailer = [0u8; TRAILER];
        trailer[..8].copy_from_slice(&to.to_le_bytes());
        // A frame larger than a slot, for nodes that all read in place: written once into
        // the arena, and only its reference into the ring (the arena's room and the nodes'
        // quotas allowing; else copied through the ring below). The reference will be the
        // ring message numbered `head` (the writer's lock is held until it is written).
        if total > out.chunk
            && let Some(arena) = arena
            && let Some(holders) = out.holders(to)
            && let Some(r) = arena.put(&[head, payload], holders, out.ring.head() + 1, &out.ring)
        {
            trailer[8] = FIRST | REF;
            let r = r.encode();
            let parts: [&[u8]; 3] = [&r, &[], &trailer];
            self.shm_put(out, writer, &parts, &mut since).await;
            self.stats.shm_refs_sent.fetch_add(1, Ordering::Relaxed);
            out.wake(writer.sleepers_among(to));
            return;
        }
        // The frame is the head then the payload, copied once, straight into the slots: a
        // chunk is the frame's bytes from `at` to `end` (from the head, the payload or both)
        // and the trailer: `to`, the readers it is for, and the flag byte.
        let mut at = 0;
        while at < total {
            let end = (at + out.chunk).min(total);
            trailer[8] = if end < total { MORE } else { 0 } | if at == 0 { FIRST } else { 0 };
            let h = &head[at.min(head.len())..end.min(head.len())];
            let p = &payload[at.max(head.len()) - head.len()..end.max(head.len()) - head.len()];
            let parts: [&[u8]; 3] = [h, p, &trailer];
            self.shm_put(out, writer, &parts, &mut since).await;
            at = end;
        }
        // Only the nodes this message is for are woken: the others sleep on (they read it
        // and the rest when something is for them, or when the writer needs room).
        out.wake(writer.sleepers_among(to));
    }

    /// Writes one ring message: waits while a reliable reader is a ring behind, at most
    /// `max_block` from the publication's first wait (`since`); then that reader is evicted.
    async fn shm_put(
        &self,
        out: &Outgoing,
        writer: &mut SharedWriter,
        parts: &[&[u8]; 3],
        since: &mut Option<Instant>,
    ) {
        loop {
            match writer.try_publish_parts(parts) {
                Ok(Some(_)) => return,
                Ok(None) => {}
                Err(_) => unreachable!("a chunk fits its slot"),
            }
            // A reliable reader is a ring behind: wake whoever sleeps, then wait for it.
            out.wake(writer.sleepers());
            writer.prepare_wait();
            if writer.try_publish_parts(parts).ok().flatten().is_some() {
                return;
            }
            let deadline = *since.get_or_insert_with(Instant::now) + self.options.max_block;
            match tokio::time::timeout_at(deadline, out.doorbell.readable()).await {
                Ok(Ok(mut g)) => {
                    if !g.get_inner().drain() {
                        g.clear_ready();
                    }
                }
                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(1)).await,
                Err(_) => {
                    if let Some(i) = writer.blocking_reader() {
                        out.ring.evict(i);
                        let reader = lock(&out.readers)[i].take();
                        self.shm_slow_reader(reader);
                    }
                    *since = None;
                }
            }
        }
    }

    /// A reader of this node's ring held it past `max_block`: it is evicted, and its link
    /// closed (the node redials or is redialled, and attaches again).
    fn shm_slow_reader(&self, reader: Option<ReaderEntry>) {
        tracing::warn!(
            peer = ?reader.as_ref().map(|r| format!("{:016x}", r.peer)),
            "peer: a node held this node's ring past max_block: evicted as a slow consumer"
        );
        self.stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = reader {
            if let Some(h) = &r.holder {
                h.depart();
            }
            tokio::spawn(async move { r.link.close().await });
        }
    }

    /// Offers this node's ring to node `rid`, just linked by `link`: `Ok(Some(entry))` (its
    /// cursor entry) once it reads it, `Ok(None)` when it is not on this host (its socket
    /// does not answer) or refuses. The attachment lasts as long as `link`.
    pub(super) async fn shm_offer(
        self: &Arc<Self>,
        rid: u64,
        link: &Client,
    ) -> Result<Option<usize>> {
        let Some(out) = self.outgoing.clone() else {
            return Ok(None);
        };
        let me = self.id;
        let timeout = self.options.handshake_timeout;
        let writer_bell = out.doorbell.get_ref().ringer().try_clone_to_owned()?;
        let segment_fd = out.ring.segment().fd().try_clone_to_owned()?;
        let arena_fd = match &out.arena_fd {
            Some(fd) if out.departed.may_hold() => Some(fd.try_clone()?),
            _ => None,
        };
        let departed = out.departed.clone();
        let done = tokio::task::spawn_blocking(move || -> std::io::Result<Option<_>> {
            let Ok(sock) = UnixStream::connect_addr(&unix_addr(rid)?) else {
                return Ok(None); // not on this host, or shared memory off there
            };
            sock.set_read_timeout(Some(timeout))?;
            sock.set_write_timeout(Some(timeout))?;
            if !announce::same_user(&sock)? {
                return Ok(None);
            }
            let mut fds = vec![segment_fd.as_fd(), writer_bell.as_fd()];
            let mut offer = format!("{HANDSHAKE} OFFER {me:016x} {rid:016x}");
            if let Some(fd) = &arena_fd {
                fds.push(fd.as_fd());
                offer.push_str(" arena");
            }
            announce::send_fds(&sock, &fds, offer.as_bytes())?;
            let Ok((mut fds, answer)) = announce::receive_any(&sock) else {
                return Ok(None); // refused: the socket closed
            };
            let answer = String::from_utf8_lossy(&answer).into_owned();
            // `hold`: it reads in place, and says what it holds in the table it sent; only
            // when the arena was offered.
            let (entry, holds) = match handshake_words(&answer)[..] {
                ["OK", entry] => (entry, false),
                ["OK", entry, "hold"] if arena_fd.is_some() => (entry, true),
                _ => return Ok(None),
            };
            let Some(entry) = entry.parse::<usize>().ok().filter(|e| *e < MAX_READERS) else {
                return Ok(None);
            };
            if fds.len() != 1 + usize::from(holds) {
                return Ok(None);
            }
            let holder = match holds {
                true => {
                    let table = fds.pop().map(ReleaseTable::open).transpose();
                    let Ok(Some(table)) = table else {
                        return Ok(None);
                    };
                    let departed = departed.clone();
                    let process = PeerProcess::of(&sock)?;
                    Some(Arc::new(Holder::new(entry, table, process, &departed)))
                }
                false => None,
            };
            let Some(fd) = fds.pop() else {
                return Ok(None);
            };
            let bell = Doorbell::from_fd(fd)?;
            sock.set_read_timeout(None)?;
            sock.set_nonblocking(true)?;
            Ok(Some((sock, entry, bell, holder)))
        })
        .await
        .map_err(|e| Error::Protocol(format!("shm offer: {e}")))??;
        let Some((sock, entry, bell, holder)) = done else {
            return Ok(None);
        };
        let bell = Arc::new(bell);
        lock(&out.readers)[entry] = Some(ReaderEntry {
            peer: rid,
            bell: bell.clone(),
            link: link.clone(),
            holder: holder.clone(),
        });
        // When the attachment or the link ends (or the node stops): stop waiting for that
        // reader, and end both.
        let sock = tokio::net::UnixStream::from_std(sock)?;
        let link = link.clone();
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = closed(&sock) => {}
                () = link.inner.closed() => {}
                _ = stop.changed() => {}
            }
            let mine = {
                let mut readers = lock(&out.readers);
                let mine = readers[entry]
                    .as_ref()
                    .is_some_and(|r| Arc::ptr_eq(&r.bell, &bell));
                if mine {
                    readers[entry] = None;
                }
                mine
            };
            if mine {
                // Not through the writer, which may be waiting for this very reader: wake
                // it to look again.
                out.ring.evict(entry);
                out.doorbell.get_ref().ring();
            }
            // What it holds in place stays held until released or its process exits.
            if let Some(h) = &holder {
                h.depart();
            }
            drop(sock);
            let _ = tokio::time::timeout(Duration::from_secs(5), link.close()).await;
        });
        Ok(Some(entry))
    }
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

/// Takes an offer: checks who offers, attaches the ring, registers a reader, answers, and
/// reads until the attachment or the node ends.
async fn accept_offer(
    node: Arc<NodeInner>,
    sock: tokio::net::UnixStream,
    stop: watch::Receiver<bool>,
) -> Result<()> {
    let sock = sock.into_std()?;
    sock.set_nonblocking(false)?;
    let timeout = node.options.handshake_timeout;
    let me = node.id;
    let waits = !node.all_drop();
    let node2 = node.clone();
    // The blocking part of the handshake (SCM_RIGHTS on a std socket, with timeouts).
    let (sock, from, reader, bell, writer_bell, in_place) =
        tokio::task::spawn_blocking(move || -> std::result::Result<_, String> {
            sock.set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            sock.set_write_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            if !announce::same_user(&sock).map_err(|e| e.to_string())? {
                return Err("an offer from another user".into());
            }
            let (mut fds, offer) = announce::receive_any(&sock).map_err(|e| e.to_string())?;
            let offer = String::from_utf8_lossy(&offer).into_owned();
            // ` arena`: a third descriptor, the writer's arena (messages read in place).
            let (from, to, arena) = match handshake_words(&offer)[..] {
                ["OFFER", from, to] => (from, to, false),
                ["OFFER", from, to, "arena"] => (from, to, true),
                _ => return Err(format!("a malformed offer {offer:?}")),
            };
            if fds.len() != 2 + usize::from(arena) {
                return Err(format!("an offer with {} descriptors", fds.len()));
            }
            let from = u64::from_str_radix(from, 16).map_err(|_| "a malformed offer id")?;
            if u64::from_str_radix(to, 16).ok() != Some(me) {
                return Err("an offer meant for another node".into());
            }
            // Only from a node linked to this one (its HELLO came on the TCP listener
            // first), before anything is mapped or answered.
            if !lock(&node2.state).inbound.values().any(|i| i.peer == from) {
                return Err(format!(
                    "an offer from {from:016x}, which has no link to this node"
                ));
            }
            // Mapped read-only, and only if sealed against writing by anyone but its maker:
            // what this node reads in place no other process can change.
            let view = match arena {
                true => {
                    let fd = fds.pop().ok_or("an offer without its descriptors")?;
                    Some(ArenaView::open(fd).map_err(|e| format!("the offered arena: {e}"))?)
                }
                false => None,
            };
            let (Some(bell_fd), Some(seg_fd)) = (fds.pop(), fds.pop()) else {
                return Err("an offer without its descriptors".into());
            };
            let segment = Segment::open(seg_fd).map_err(|e| e.to_string())?;
            let ring = SharedRing::attach(segment).map_err(|e| e.to_string())?;
            let writer_bell = Doorbell::from_fd(bell_fd).map_err(|e| e.to_string())?;
            let reader = SharedReader::register(ring, waits).map_err(|e| e.to_string())?;
            let entry = reader.cursor().ok_or("no cursor")?;
            let bell = Doorbell::new().map_err(|e| e.to_string())?;
            // Reads in place when offered the arena and a table can be made.
            let in_place = view.and_then(|v| {
                let table = ReleaseTable::create(&format!("hayate-peer-holds-{me:016x}"));
                table
                    .inspect_err(|e| tracing::warn!("peer: arena entries copied: {e}"))
                    .ok()
                    .map(|t| (Arc::new(v), Arc::new(t)))
            });
            let answer = match &in_place {
                Some(_) => format!("{HANDSHAKE} OK {entry} hold"),
                None => format!("{HANDSHAKE} OK {entry}"),
            };
            let mut fds = vec![bell.ringer()];
            if let Some((_, t)) = &in_place {
                fds.push(t.fd());
            }
            announce::send_fds(&sock, &fds, answer.as_bytes()).map_err(|e| e.to_string())?;
            sock.set_nonblocking(true).map_err(|e| e.to_string())?;
            Ok((sock, from, reader, bell, writer_bell, in_place))
        })
        .await
        .map_err(|e| Error::Protocol(e.to_string()))?
        .map_err(Error::Protocol)?;
    let sock = tokio::net::UnixStream::from_std(sock)?;
    let bell = async_bell(bell)?;
    tracing::debug!(peer = %format_args!("{from:016x}"), "peer: reading its ring");
    RingReader {
        node,
        from,
        reader,
        bell,
        writer_bell,
        sock,
        assembling: Assembly(BytesMut::new()),
        in_place,
        expect: 0,
        last_route: None,
        waits_checked: None,
    }
    .run(stop)
    .await;
    Ok(())
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

/// Bytes allocated at a time for the frames read from a ring.
const ASSEMBLY_BLOCK: usize = 64 * 1024;

/// The frame being put together (a `BytesMut`, so that decoded payloads are slices of it).
struct Assembly(BytesMut);

impl hayate_shm::ReadBuf for Assembly {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn reserve(&mut self, additional: usize) {
        // Frames are cut from one allocation until it is used up (not one each).
        if self.0.capacity() - self.0.len() < additional {
            self.0.reserve(additional.max(ASSEMBLY_BLOCK));
        }
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
    fn append_region(&mut self, region: hayate_shm::Region<'_>) {
        // Straight into the allocation `reserve` made room in.
        self.0.append_region(region);
    }
}

impl Assembly {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn clear(&mut self) {
        self.0.clear();
    }
}

struct RingReader {
    node: Arc<NodeInner>,
    from: u64,
    reader: SharedReader,
    bell: AsyncFd<Doorbell>,
    writer_bell: Doorbell,
    sock: tokio::net::UnixStream,
    /// The frame being put together from chunks.
    assembling: Assembly,
    /// The writer's arena and this node's release table, when it reads in place.
    in_place: Option<(Arc<ArenaView>, Arc<ReleaseTable>)>,
    /// Its length, from its first chunk's header.
    expect: usize,
    /// The route of the last key read, and the routes' generation it was looked up at.
    last_route: Option<(u64, hayate_core::Key, Arc<super::Route>)>,
    /// The routes' generation at which whether to be waited for was last decided.
    waits_checked: Option<u64>,
}

/// Messages read in one go before they are handed over.
const READ_BURST: usize = 256;
/// Bytes taken in one go before they are handed over (a burst ends after the chunk that
/// reaches it): what one burst gives a subscription is at most this, or one message.
const BURST_BYTES: usize = 1024 * 1024;

impl RingReader {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let max_frame = usize::try_from(self.node.options.max_payload)
            .unwrap_or(usize::MAX)
            .saturating_add(64 * 1024);
        let spin = self.node.options.shm.spin;
        let mut pending: Vec<(LocalTarget, Vec<Message>)> = Vec::new();
        let mut closing = false;
        // The cursor moves on once a burst is handed to the subscriptions: the writer's
        // `block` waits for the subscriptions, and `Node::flush` for the handing over.
        self.reader.set_deferred(true);
        loop {
            let (mut got, mut taken) = (0, 0);
            while got < READ_BURST && taken < BURST_BYTES {
                let before = self.assembling.len();
                // This node's bit in the chunks' masks (every chunk is taken while it has
                // no cursor entry).
                let me = self.reader.cursor().map(|i| 1u64 << i);
                let take = |t: &[u8]| match (me, t.len().checked_sub(TRAILER)) {
                    (Some(me), Some(at)) => {
                        let mut mask = [0u8; 8];
                        mask.copy_from_slice(&t[at..at + 8]);
                        u64::from_le_bytes(mask) & me != 0
                    }
                    // Shorter than a trailer: taken, and found corrupt.
                    _ => true,
                };
                match self.reader.read_append_if(&mut self.assembling, take) {
                    Ok(Some((_, true))) => {
                        got += 1;
                        taken += self.assembling.len() - before;
                        match self.on_chunk(before, max_frame, &mut pending) {
                            // A message read in place counts its bytes in the burst.
                            Ok(in_place) => taken += in_place,
                            Err(()) => return self.corrupt(),
                        }
                    }
                    // Part of a frame for other nodes: passed over, not copied.
                    Ok(Some((_, false))) => {
                        got += 1;
                        if self.assembling.len() != 0 {
                            // The chunks of one frame are consecutive: the frame being put
                            // together was given up half written (its publish cancelled).
                            // It is lost, as when the next frame's first chunk comes.
                            self.assembling.clear();
                            self.node.stats.shm_lost.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(None) => break,
                    Err(ReadError::Lost(k)) => {
                        // A frame cut by the loss is lost with it.
                        got += 1;
                        self.assembling.clear();
                        self.node.stats.shm_lost.fetch_add(k, Ordering::Relaxed);
                    }
                    Err(ReadError::Corrupt) => return self.corrupt(),
                }
            }
            if got > 0 {
                for (t, batch) in pending.drain(..) {
                    self.node.deliver(&t, batch).await;
                }
                // A node that gains or loses its last `block` subscription is waited for,
                // or not, from the next burst on.
                self.update_waits();
                self.reader.commit();
                if self.reader.writer_waits() {
                    self.writer_bell.ring();
                }
                // Let the subscribers just woken run before reading on. A task woken from
                // here goes to this worker's LIFO slot, which no other worker may take,
                // and while the writer keeps the ring from running dry nothing above
                // waits: the subscribers would never run (a hang, found at 1 MiB messages
                // back to back; test `a_ring_kept_full_still_lets_its_subscribers_run`).
                // An empty ring is waited on below, which lets them run as well.
                if self.has_more() {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            if closing || self.node.is_stopped() {
                return;
            }
            // Nothing new: keep looking for `spin`, then sleep until the writer rings.
            if !spin.is_zero() {
                let until = Instant::now() + spin;
                let mut found = false;
                while Instant::now() < until {
                    tokio::task::yield_now().await;
                    if self.has_more() {
                        found = true;
                        break;
                    }
                }
                if found {
                    continue;
                }
            }
            self.update_waits();
            if !self.reader.prepare_sleep() {
                if self.reader.cursor().is_none() {
                    // Evicted: this node is no longer read from; the writer closes the link.
                    return;
                }
                continue;
            }
            tokio::select! {
                r = self.bell.readable() => {
                    if let Ok(mut g) = r && !g.get_inner().drain() {
                        g.clear_ready();
                    }
                }
                // The writer closed or died: read what the ring holds, then stop.
                () = closed(&self.sock) => closing = true,
                _ = stop.changed() => {}
            }
            self.reader.end_sleep();
        }
    }

    fn has_more(&mut self) -> bool {
        self.reader.pending()
    }

    /// Makes the writer wait for this node, or not, as its subscriptions ask (waited for
    /// unless every one is `drop`). Looked up again only when the node's routes changed
    /// (subscriptions are part of them), not under the node's lock every time.
    fn update_waits(&mut self) {
        let generation = self.node.generation.load(Ordering::Acquire);
        if self.waits_checked != Some(generation) {
            self.waits_checked = Some(generation);
            let waits = !self.node.all_drop();
            if self.reader.waited_for() != waits {
                self.reader.set_waited_for(waits);
            }
        }
    }

    /// One chunk read (appended to `assembling` from `before` on, its trailer last): a
    /// complete frame is decoded and dispatched. `Ok` with the bytes of the frame read in
    /// place, if the message was a reference.
    fn on_chunk(
        &mut self,
        before: usize,
        max_frame: usize,
        pending: &mut Vec<(LocalTarget, Vec<Message>)>,
    ) -> std::result::Result<usize, ()> {
        let Some(data) = self
            .assembling
            .len()
            .checked_sub(TRAILER)
            .filter(|d| *d >= before)
        else {
            return Err(()); // not even the trailer
        };
        let flag = self.assembling.0[self.assembling.0.len() - 1];
        self.assembling.0.truncate(data);
        // Unknown bits, or the reference flag on anything but a whole message (on_ref).
        if flag & !(MORE | FIRST | REF) != 0 || (flag & REF != 0 && flag != FLAGS_REF) {
            return Err(());
        }
        if flag & FIRST == 0 && before == 0 {
            // The rest of a frame whose start this node did not take: published before it
            // attached, cut by a loss, or too large for it.
            self.assembling.clear();
            return Ok(0);
        }
        if flag & FIRST != 0 {
            if before != 0 {
                // A frame started before the last one ended: its publisher gave up on it
                // half written (a publish cancelled by its caller). It is lost; this one
                // starts afresh.
                let _ = self.assembling.0.split_to(before);
                self.node.stats.shm_lost.fetch_add(1, Ordering::Relaxed);
            }
            if flag & REF != 0 {
                return self.on_ref(max_frame, pending);
            }
            if self.assembling.len() < 4 {
                return Err(());
            }
            // Room for the whole frame at once, after its length is checked.
            let a = &self.assembling.0;
            let len = u32::from_be_bytes([a[0], a[1], a[2], a[3]]) as usize;
            if len > max_frame {
                // Larger than this node accepts (nodes may set different limits): this
                // message is not for it; the ring stays good.
                tracing::debug!(
                    len,
                    max_frame,
                    "peer: a ring message larger than max_payload skipped"
                );
                self.node
                    .stats
                    .shm_too_large
                    .fetch_add(1, Ordering::Relaxed);
                self.assembling.clear();
                return Ok(0);
            }
            self.expect = 4 + len;
            // Frames are cut from one allocation until it is used up (not one each). The
            // last chunk's trailer is read into the buffer too before it is cut off: without
            // room for it, that chunk would move the whole frame into a larger allocation.
            let need = self.expect.saturating_sub(a.len()) + TRAILER;
            if self.assembling.0.capacity() - self.assembling.0.len() < need {
                self.assembling.0.reserve(need.max(ASSEMBLY_BLOCK));
            }
        }
        if self.assembling.len() > self.expect {
            return Err(()); // longer than its frame said
        }
        if flag & MORE != 0 {
            return Ok(0);
        }
        let mut frame = self.assembling.0.split();
        let m = match hayate_native::decode(&mut frame, max_frame) {
            Ok(Some(Frame::Pub(m))) if frame.is_empty() => m,
            _ => return Err(()),
        };
        self.on_message(m, pending);
        Ok(0)
    }

    /// A reference to a frame in the writer's arena (the whole ring message, `assembling`
    /// holding its bytes less the trailer): the frame read in place (or copied, by a node
    /// evicted meanwhile), decoded and dispatched. `Ok` with its length.
    fn on_ref(
        &mut self,
        max_frame: usize,
        pending: &mut Vec<(LocalTarget, Vec<Message>)>,
    ) -> std::result::Result<usize, ()> {
        let r = Ref::decode(&self.assembling.0);
        self.assembling.clear();
        // One whole frame (its flags checked by on_chunk), to a node that said it reads in
        // place (a writer sends none to others).
        let (Some(r), Some((view, table))) = (r, &self.in_place) else {
            return Err(());
        };
        // A number the release table cannot hold is no writer's (they count from 0).
        if r.number > MAX_REFERENCE {
            return Err(());
        }
        // Marked taken before anything else, so that the writer, which frees a reference
        // not taken once this node's cursor is past it (or this node is evicted), keeps it.
        table.take(r.number);
        let hold = Release::new(table.clone(), r.number);
        if r.len > max_frame as u64 + 4 {
            // Larger than this node accepts, as a frame in chunks would be.
            self.node
                .stats
                .shm_too_large
                .fetch_add(1, Ordering::Relaxed);
            return Ok(0);
        }
        let registered = self.reader.registered();
        let bytes = match registered.then(|| view.get_in_place(r.at, r.len, r.tag, hold)) {
            Some(Ok(Some(e))) => Bytes::from_owner(e),
            // A live reader's entry is never written again before it releases it: an
            // error is a writer that does not keep to the protocol.
            Some(Err(_)) => return Err(()),
            // Evicted (the writer may write the place again at any time) or a big-endian
            // host: copied, checked against the tag after the copy, and released.
            _ => {
                let mut copy = BytesMut::new();
                match view.get(r.at, r.len, r.tag, &mut copy) {
                    Ok(()) => copy.freeze(),
                    // Released before the copy (the hold went unused): a place written
                    // again meanwhile is a loss, found by the tag after the copy.
                    Err(EntryError::Stale(_)) => {
                        self.node.stats.shm_lost.fetch_add(1, Ordering::Relaxed);
                        return Ok(0);
                    }
                    Err(_) => return Err(()),
                }
            }
        };
        let m = match hayate_native::decode_frame(bytes, max_frame) {
            Ok(Frame::Pub(m)) => m,
            _ => return Err(()),
        };
        self.node
            .stats
            .shm_refs_read
            .fetch_add(1, Ordering::Relaxed);
        self.on_message(m, pending);
        Ok(r.len as usize)
    }

    /// A message read from the ring (copied out or in place): dispatched to this node's
    /// subscriptions.
    fn on_message(&mut self, mut m: Message, pending: &mut Vec<(LocalTarget, Vec<Message>)>) {
        if m.payload.len() as u64 > self.node.options.max_payload {
            // As over TCP, a node takes no payload larger than its max_payload.
            self.node
                .stats
                .shm_too_large
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.node.stats.shm_received.fetch_add(1, Ordering::Relaxed);
        let named = take_named_shm(&mut m, self.node.id);
        // The last key's route, while routes have not changed (one key in a row is the
        // common case): no lock per message.
        let generation = self.node.generation.load(Ordering::Acquire);
        let route = match &self.last_route {
            Some((g, k, r)) if *g == generation && *k == m.key => r.clone(),
            _ => {
                let r = self.node.route(&m.key);
                // The key in an allocation of its own: one still in the frame's buffer (an
                // arena entry read in place, or an assembly block) would keep that alive for
                // as long as the key is cached.
                self.last_route = Some((generation, m.key.compact(), r.clone()));
                r
            }
        };
        server::dispatch(&self.node, &route, m, Some(named), &mut |t, m| {
            server::push(pending, t, m)
        });
    }

    /// The ring holds what a Hayate writer cannot produce: it is no longer read, and the
    /// attachment closes (the writer then closes its link to this node).
    fn corrupt(self) {
        tracing::warn!(
            peer = %format_args!("{:016x}", self.from),
            "peer: the ring of this node is corrupt: no longer read"
        );
        self.node.stats.shm_corrupt.fetch_add(1, Ordering::Relaxed);
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

/// The queue-group members named for node `me` in `m` (every such header is removed).
fn take_named_shm(m: &mut Message, me: u64) -> Vec<(u32, Bytes)> {
    server::take_named_by(m, SHM_TO_HEADER, |v| {
        (v.len() >= 12 && v[..8] == me.to_be_bytes()).then(|| {
            (
                u32::from_be_bytes([v[8], v[9], v[10], v[11]]),
                v.slice(12..),
            )
        })
    })
}
