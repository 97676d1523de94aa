//! This node's ring and the nodes reading it: publishing into it (in chunks, or a reference
//! to the arena), waiting for reliable readers and evicting slow ones, and offering it to a
//! node just linked.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use hayate_core::Message;
use hayate_core::sync::lock;
use hayate_shm::announce::{self, PeerProcess};
use hayate_shm::arena::{Departures, ReleaseTable};
use hayate_shm::doorbell::Doorbell;
use hayate_shm::segment::Segment;
use hayate_shm::{MAX_READERS, SharedRing, SharedWriter};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use super::super::inplace::{Arena, Holder};
use super::super::{NodeInner, server};
use super::{
    FIRST, HANDSHAKE, MORE, REF, SHM_TO_HEADER, ShmOptions, TRAILER, async_bell, closed,
    handshake_words, unix_addr,
};
use crate::{Client, Error, Result};

/// A node reading this node's ring.
#[derive(Debug, Clone)]
struct ReaderEntry {
    peer: u64,
    bell: Arc<Doorbell>,
    /// This node's link to it.
    link: Client,
    /// What it says of the references it read in place (it reads in place).
    holder: Option<Arc<Holder>>,
}

/// This node's ring and the readers attached to it.
#[derive(Debug)]
pub(in crate::peer::node) struct Outgoing {
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
    pub(in crate::peer::node) fn new(options: &ShmOptions, id: u64) -> Result<Outgoing> {
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
    pub(in crate::peer::node) async fn flushed(&self, timeout: Duration) {
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
    pub(in crate::peer::node) async fn arena_held(&self) -> Option<(usize, usize)> {
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
    pub(in crate::peer::node) async fn shm_publish(
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
    pub(in crate::peer::node) async fn shm_offer(
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
