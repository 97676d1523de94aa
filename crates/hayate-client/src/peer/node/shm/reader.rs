//! Another node's ring, read: taking its offer, then reading its chunks and references
//! (in place, from its arena) and handing the messages to this node's subscriptions.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use hayate_core::Message;
use hayate_core::sync::lock;
use hayate_native::Frame;
use hayate_shm::announce;
use hayate_shm::arena::{ArenaView, EntryError, MAX_REFERENCE, Release, ReleaseTable};
use hayate_shm::doorbell::Doorbell;
use hayate_shm::segment::Segment;
use hayate_shm::{ReadError, SharedReader, SharedRing};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::inplace::Ref;
use super::super::{LocalTarget, NodeInner, server};
use super::{
    FIRST, FLAGS_REF, HANDSHAKE, MORE, REF, SHM_TO_HEADER, TRAILER, async_bell, closed,
    handshake_words,
};
use crate::{Error, Result};

/// Takes an offer: checks who offers, attaches the ring, registers a reader, answers, and
/// reads until the attachment or the node ends.
pub(super) async fn accept_offer(
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
    last_route: Option<(u64, hayate_core::Key, Arc<super::super::Route>)>,
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
