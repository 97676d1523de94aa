//! Shared memory as a byte stream: a connection between two processes on one host made of two
//! hayate-shm rings, one per direction, each written by one side and read by the other, with
//! a doorbell per waiting party and a Unix socket kept open only to notice that the
//! other side is gone.
//!
//! Each side makes what it writes and what it waits on ([`Local`]: its ring's segment, the
//! doorbell it waits on for data and the one it waits on for room) and sends the three
//! descriptors over the Unix socket (`hayate_shm::announce`); [`join`] builds the
//! transport from its own [`Local`] and the other side's three descriptors. A write copies
//! up to one slot of bytes into the ring (one message; the reader sees a stream of bytes and
//! does not care where messages begin); a full ring is `WouldBlock`, and the writer waits on
//! its room doorbell, which the reader rings after reading on. The reader registers a cursor
//! in the other side's ring, waited for: nothing written is overwritten before it is read
//! (the reliable mode of the ring, like a socket's buffer).
//!
//! The end of the stream: [`WriteHalf::shutdown`] closes the ring (a flag in its header);
//! the reader, having read everything, returns end-of-file. If the other process dies
//! instead, its end of the Unix socket closes (the kernel does that however it died): the
//! reader returns what the ring still holds, then end-of-file; a writer waiting for room
//! gets `BrokenPipe`. The socket carries nothing after the set-up, so any readiness on it
//! means the end.
//!
//! Nothing the other side wrote is trusted: the segment must be sealed, its ring geometry
//! fit, slots at most [`MAX_SLOT_BYTES`], and every read is bounds-checked by the ring; a
//! ring that says what no writer produces (or a lost message, which a waited-for reader
//! cannot have) is an `InvalidData` error, which ends the connection.

use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hayate_shm::arena::{ArenaView, Release, ReleaseTable};
use hayate_shm::doorbell::Doorbell;
use hayate_shm::segment::Segment;
use hayate_shm::{ReadBuf, SharedReader, SharedRing, SharedWriter};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest};

use super::{Reader, WriteHalf, Writer};
use crate::sink::Sink;

/// The set-up messages' prefix (docs/protocol.md, *Shared memory with the broker*).
pub const PREFIX: &str = "HAYATE-SHM/1";

/// The capability word of CONNECT and OK for the broker's fan-out arena.
pub const FANOUT: &str = "fanout";

/// The capability word of CONNECT and OK, after [`FANOUT`], for reading entries in place:
/// the client sends its release table as a fourth descriptor, may hold an entry past its
/// connection's end, and the broker keeps it until the client releases it or its process
/// exits.
pub const HOLD: &str = "hold";

/// The largest slot accepted from the other side: a read appends at most this much.
pub const MAX_SLOT_BYTES: usize = 1 << 20;
/// What the read half keeps allocated for messages that did not fit the caller's buffer.
const KEEP_PENDING: usize = 64 * 1024;
/// The largest segment accepted from the other side.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// The geometry of the ring a side writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmGeometry {
    /// Slots (messages in flight).
    pub slots: usize,
    /// Bytes a slot holds (what one write moves at most).
    pub slot_bytes: usize,
}

impl Default for ShmGeometry {
    /// 32 slots of 64 KiB: 2 MiB a direction, resident once written through.
    fn default() -> Self {
        ShmGeometry {
            slots: 32,
            slot_bytes: 64 * 1024,
        }
    }
}

impl ShmGeometry {
    /// Bytes of the segment this geometry needs.
    pub fn segment_bytes(&self) -> usize {
        hayate_shm::region_words(self.slots, self.slot_bytes) * 8
    }
}

/// What one side makes: the ring it writes and the doorbells it waits on.
#[derive(Debug)]
pub struct Local {
    ring: SharedRing,
    /// Rung by the other side when it wrote (this side's reader sleeps on it).
    data: Doorbell,
    /// Rung by the other side when it read on (this side's writer waits on it).
    room: Doorbell,
}

impl Local {
    /// A new ring of `geometry` in a fresh segment (named `name` for /proc), and doorbells.
    pub fn new(name: &str, geometry: ShmGeometry) -> io::Result<Local> {
        if geometry.slot_bytes == 0 || geometry.slot_bytes > MAX_SLOT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a slot of {} bytes (1 to {MAX_SLOT_BYTES})",
                    geometry.slot_bytes
                ),
            ));
        }
        if geometry.segment_bytes() as u64 > MAX_SEGMENT_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a ring of {} slots of {} bytes is larger than {MAX_SEGMENT_BYTES} bytes",
                    geometry.slots, geometry.slot_bytes
                ),
            ));
        }
        let segment = Segment::create(name, geometry.segment_bytes()).map_err(io::Error::other)?;
        let ring = SharedRing::init(segment, geometry.slots, geometry.slot_bytes)
            .map_err(io::Error::other)?;
        Ok(Local {
            ring,
            data: Doorbell::new()?,
            room: Doorbell::new()?,
        })
    }

    /// The descriptors to send the other side, in the order [`join`] takes them: the
    /// segment, the data doorbell, the room doorbell.
    pub fn fds(&self) -> [BorrowedFd<'_>; 3] {
        [
            self.ring.segment().fd(),
            self.data.ringer(),
            self.room.ringer(),
        ]
    }
}

/// A doorbell the runtime's reactor watches.
pub fn async_bell(bell: Doorbell) -> io::Result<AsyncFd<Doorbell>> {
    // `with_interest` is deprecated because a type whose `as_raw_fd` may change or close
    // under the reactor makes it unsound; a `Doorbell` owns its descriptor (an `OwnedFd`,
    // never replaced) for as long as it lives, which is the condition the unsafe
    // `register_with_interest` asks its callers to uphold.
    #[allow(deprecated)]
    AsyncFd::with_interest(bell, Interest::READABLE)
}

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("shared memory: {what}"))
}

/// The transport over `local` (this side's) and the other side's descriptors (`remote`:
/// its segment, data doorbell and room doorbell, as [`Local::fds`] orders them), with
/// `sock` the Unix socket the two sides set up over (kept open, watched for the other
/// side's end). The other side's ring is checked (sealed, geometry, slot size) and this
/// side registers its cursor in it: call this before the other side writes anything.
pub fn join(
    local: Local,
    remote: Vec<OwnedFd>,
    sock: std::os::unix::net::UnixStream,
) -> io::Result<(Reader, Writer)> {
    join_ring(local, remote, sock).map(|(r, w, _)| (r, w))
}

/// [`join`], also giving the other side's ring (to read its owner word: the broker reads
/// there how many fan-out entries the client released, [`Fanout`]).
pub fn join_ring(
    local: Local,
    remote: Vec<OwnedFd>,
    sock: std::os::unix::net::UnixStream,
) -> io::Result<(Reader, Writer, SharedRing)> {
    let [segment, data, room]: [OwnedFd; 3] = remote
        .try_into()
        .map_err(|v: Vec<OwnedFd>| invalid(format!("{} descriptors, not 3", v.len())))?;
    let segment = Segment::open(segment).map_err(invalid)?;
    let size = segment.words().len() as u64 * 8;
    if size > MAX_SEGMENT_BYTES {
        return Err(invalid(format!("a segment of {size} bytes")));
    }
    let ring = SharedRing::attach(segment).map_err(invalid)?;
    if ring.ring().max_payload() > MAX_SLOT_BYTES {
        return Err(invalid(format!(
            "slots of {} bytes",
            ring.ring().max_payload()
        )));
    }
    let reader = SharedReader::register(ring.clone(), true)
        .map_err(|_| invalid("no free cursor in the other side's ring"))?;
    let peer_data = Doorbell::from_fd(data)?;
    let peer_room = Doorbell::from_fd(room)?;
    sock.set_nonblocking(true)?;
    let sock2 = sock.try_clone()?;
    let gone = Arc::new(AtomicBool::new(false));
    let r = ShmReader {
        gone: gone.clone(),
        ring: reader,
        bell: async_bell(local.data)?,
        peer_room,
        hangup: tokio::net::UnixStream::from_std(sock)?,
        pending: Vec::new(),
        pos: 0,
        last_look: false,
    };
    let w = ShmWriter {
        state: Mutex::new(WState {
            ring: SharedWriter::new(local.ring),
            peer_data,
        }),
        room: async_bell(local.room)?,
        hangup: tokio::net::UnixStream::from_std(sock2)?,
        gone,
    };
    Ok((Box::new(r), Arc::new(w), ring))
}

/// What a client that took the broker's fan-out arena reads MSG_REFs with: the arena,
/// mapped read-only, and how it says it is done with them (docs/protocol.md, *Fan-out*).
///
/// A copying client copies each entry out ([`Fanout::get`]) and counts the MSG_REFs done
/// with in its own ring's owner word, in order. A holding client (`hold`, granted at the
/// set-up) reads entries in place ([`Fanout::get_bytes`]) and is done with one when the last
/// `Bytes` of it is dropped, whenever and on whatever thread: it says so in its release
/// table, in any order.
#[derive(Debug)]
pub struct Fanout {
    arena: Arc<ArenaView>,
    /// This client's ring: its owner word counts a copying client's MSG_REFs done with.
    ring: SharedRing,
    /// MSG_REFs received (the next one's number).
    received: u64,
    /// A holding client's release table.
    table: Option<Arc<ReleaseTable>>,
}

impl Fanout {
    /// Appends the entry a MSG_REF names to `out` (nothing on an error: the broker wrote
    /// the place again, which it does only when told it was released), and counts it done
    /// with: [`Fanout::publish_releases`] tells the broker (a holding client's table, at
    /// once).
    pub fn get<B: ReadBuf + ?Sized>(
        &mut self,
        at: u64,
        len: u64,
        tag: u64,
        out: &mut B,
    ) -> io::Result<()> {
        let n = self.received;
        self.received += 1;
        let got = self.arena.get(at, len, tag, out).map_err(invalid);
        if let Some(t) = &self.table {
            t.release(n);
        }
        got
    }

    /// The entry a MSG_REF names: read in place by a holding client (its bytes stay valid,
    /// and unwritten by the broker, until the last clone or slice of them is dropped,
    /// which releases it), else copied into `copy` and split off it ([`Fanout::get`]).
    pub fn get_bytes(
        &mut self,
        at: u64,
        len: u64,
        tag: u64,
        copy: &mut bytes::BytesMut,
    ) -> io::Result<bytes::Bytes> {
        if let Some(table) = &self.table
            && cfg!(target_endian = "little")
        {
            let hold = Release::new(table.clone(), self.received);
            self.received += 1;
            // On an error `hold` is dropped here: released (nothing holds the entry).
            if let Some(e) = self
                .arena
                .get_in_place(at, len, tag, hold)
                .map_err(invalid)?
            {
                return Ok(bytes::Bytes::from_owner(e));
            }
        }
        copy.clear();
        self.get(at, len, tag, copy)?;
        Ok(copy.split().freeze())
    }

    /// Whether entries are read in place (the broker granted `hold`).
    pub fn in_place(&self) -> bool {
        self.table.is_some()
    }

    /// Tells the broker how many MSG_REFs a copying client was done with so far (one
    /// store, for all the entries read since the last call): it may write their places
    /// again.
    pub fn publish_releases(&self) {
        let w = self.ring.owner_word();
        if self.table.is_none() && w.load(Ordering::Relaxed) != self.received {
            w.store(self.received, Ordering::Release);
        }
    }
}

/// Sets up shared memory with the broker whose WELCOME offered `offer` (`<socket>
/// <ticket>`): connects to its abstract socket, sends `CONNECT <ticket> fanout` (`fanout
/// hold` with `hold`: entries read in place) with this side's descriptors, and builds the
/// transport from the answer, all within `timeout`. The broker's fan-out arena comes too
/// when it has one (`OK fanout`, or `OK fanout hold` when it grants holding, and a fourth
/// descriptor).
pub async fn connect(
    offer: &str,
    geometry: ShmGeometry,
    timeout: std::time::Duration,
    hold: bool,
) -> io::Result<(Reader, Writer, Option<Fanout>)> {
    use std::os::linux::net::SocketAddrExt;
    let (name, ticket) = offer
        .split_once(' ')
        .ok_or_else(|| invalid(format!("offer {offer:?} is not <socket> <ticket>")))?;
    let (name, ticket) = (name.to_owned(), ticket.to_owned());
    // The socket calls block (briefly: the broker answers from its accept loop), so they run
    // off the runtime's threads, with the timeout as the socket's; the whole set-up (the
    // connect too, which a full backlog would hold) within `timeout` as well.
    let setup = tokio::task::spawn_blocking(move || -> io::Result<_> {
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let sock = std::os::unix::net::UnixStream::connect_addr(&addr)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let local = Local::new("hayate-client", geometry)?;
        // A holding client's release table goes with its ring, as a fourth descriptor.
        let table = match hold {
            true => Some(ReleaseTable::create("hayate-releases").map_err(invalid)?),
            false => None,
        };
        let mut fds = local.fds().to_vec();
        fds.extend(table.as_ref().map(ReleaseTable::fd));
        hayate_shm::announce::send_fds(
            &sock,
            &fds,
            if table.is_some() {
                format!("{PREFIX} CONNECT {ticket} {FANOUT} {HOLD}")
            } else {
                format!("{PREFIX} CONNECT {ticket} {FANOUT}")
            }
            .as_bytes(),
        )?;
        let (mut fds, answer) =
            hayate_shm::announce::receive_any(&sock).map_err(io::Error::other)?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let granted = table.is_some() && answer == format!("{PREFIX} OK {FANOUT} {HOLD}");
        let arena = if (granted || answer == format!("{PREFIX} OK {FANOUT}")) && fds.len() == 4 {
            let table = table.filter(|_| granted).map(Arc::new);
            Some((ArenaView::open(fds.remove(3)).map_err(invalid)?, table))
        } else if answer == format!("{PREFIX} OK") {
            None
        } else {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("the broker refused shared memory: {answer}"),
            ));
        };
        Ok((local, fds, sock, arena))
    });
    let (local, fds, sock, arena) = tokio::time::timeout(timeout, setup)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "shared-memory set-up timed out"))?
        .map_err(io::Error::other)??;
    let ring = local.ring.clone();
    let (r, w) = join(local, fds, sock)?;
    let fanout = arena.map(|(arena, table)| Fanout {
        arena: Arc::new(arena),
        ring,
        received: 0,
        table,
    });
    Ok((r, w, fanout))
}

/// The read half: the other side's ring.
struct ShmReader {
    ring: SharedReader,
    bell: AsyncFd<Doorbell>,
    /// The other side's writer waits on it for room.
    peer_room: Doorbell,
    /// Readable once the other side is gone.
    hangup: tokio::net::UnixStream,
    /// A message read that did not fit the caller's buffer, from `pos`.
    pending: Vec<u8>,
    pos: usize,
    /// The ring was closed or the other side is gone: one more look, then the end.
    last_look: bool,
    /// Set when the other side is seen gone (shared with the write half).
    gone: Arc<AtomicBool>,
}

/// A caller's buffer with room for a whole slot, which a read appends to directly.
struct Direct<'a, 'b>(&'a mut tokio::io::ReadBuf<'b>);

impl ReadBuf for Direct<'_, '_> {
    fn len(&self) -> usize {
        self.0.filled().len()
    }
    fn reserve(&mut self, additional: usize) {
        debug_assert!(additional <= self.0.remaining());
    }
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.put_slice(bytes);
    }
    fn truncate(&mut self, len: usize) {
        if len < self.0.filled().len() {
            self.0.set_filled(len);
        }
    }
    fn append_region(&mut self, region: hayate_shm::Region<'_>) {
        // Straight into the caller's buffer: zeroed only where it never was initialised.
        let n = region.len();
        region.copy_to(0, &mut self.0.initialize_unfilled_to(n)[..n]);
        self.0.advance(n);
    }
}

impl ShmReader {
    /// Reads the next message into `buf` (directly when a whole slot fits) or into
    /// `pending`: `true` when one was read.
    fn read_one(&mut self, buf: &mut tokio::io::ReadBuf<'_>) -> io::Result<bool> {
        let slot_room = self.ring.max_payload().div_ceil(8) * 8;
        let got = if buf.remaining() >= slot_room {
            let before = buf.filled().len();
            let r = self.ring.read_append(&mut Direct(buf));
            debug_assert!(r.is_ok() || buf.filled().len() == before);
            r
        } else {
            self.pending.clear();
            self.pos = 0;
            self.ring.read_append(&mut self.pending)
        };
        match got {
            Ok(Some(_)) => {
                if self.ring.writer_waits() {
                    self.peer_room.ring();
                }
                Ok(true)
            }
            Ok(None) => Ok(false),
            // A waited-for reader loses nothing: a lost message is a writer breaking the
            // ring's rules.
            Err(e) => Err(invalid(e)),
        }
    }

    fn take_pending(&mut self, buf: &mut tokio::io::ReadBuf<'_>) -> bool {
        if self.pos >= self.pending.len() {
            return false;
        }
        let n = buf.remaining().min(self.pending.len() - self.pos);
        buf.put_slice(&self.pending[self.pos..self.pos + n]);
        self.pos += n;
        // A message of a large slot (up to MAX_SLOT_BYTES, the other side's choice) is not
        // kept allocated once given: a connection holds that much only while it reads it.
        if self.pos == self.pending.len() && self.pending.capacity() > KEEP_PENDING {
            self.pending = Vec::new();
            self.pos = 0;
        }
        true
    }
}

impl AsyncRead for ShmReader {
    /// Each read spends the task's Tokio budget ([`super::poll_read_budgeted`]): a ring
    /// that always has more would otherwise never let the task yield.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        super::poll_read_budgeted(cx, |cx| this.poll_read_inner(cx, buf))
    }
}

impl ShmReader {
    fn poll_read_inner(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if this.take_pending(buf) {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            if this.read_one(buf)? {
                if buf.filled().len() > before || this.take_pending(buf) {
                    return Poll::Ready(Ok(()));
                }
                // No writer writes an empty message: a stream of them would keep this loop
                // from ever returning.
                return Poll::Ready(Err(invalid("an empty message")));
            }
            if this.last_look {
                return Poll::Ready(Ok(())); // end of stream
            }
            if this.ring.closed() {
                this.last_look = true;
                continue;
            }
            if !this.ring.prepare_sleep() {
                if this.ring.cursor().is_none() {
                    // The other side took this reader's cursor (its ring, its words): it
                    // could no longer sleep, and would spin.
                    return Poll::Ready(Err(invalid("this reader's cursor was taken")));
                }
                continue;
            }
            if this.ring.closed() {
                // Closed between the look above and the sleepers' bit going up: the writer's
                // wake-up after its close may have missed the bit (the read-modify-writes of
                // the sleepers word order the two: this look sees the flag).
                this.ring.end_sleep();
                this.last_look = true;
                continue;
            }
            if let Poll::Ready(g) = this.bell.poll_read_ready(cx) {
                let mut g = g?;
                // Cleared before draining: a ring after the drain raises readiness anew.
                g.clear_ready();
                this.bell.get_ref().drain();
                this.ring.end_sleep();
                continue;
            }
            if this.hangup.poll_read_ready(cx).is_ready() {
                this.ring.end_sleep();
                this.gone.store(true, Ordering::Relaxed);
                this.last_look = true;
                continue;
            }
            // Asleep: the other side's writer rings the bell after its next write (or its
            // close), or its socket closes.
            return Poll::Pending;
        }
    }
}

struct WState {
    ring: SharedWriter,
    /// The other side's reader sleeps on it.
    peer_data: Doorbell,
}

/// The write half: this side's ring.
struct ShmWriter {
    state: Mutex<WState>,
    room: AsyncFd<Doorbell>,
    hangup: tokio::net::UnixStream,
    /// Set when the other side is seen gone (by either half): writes then fail.
    gone: Arc<AtomicBool>,
}

impl ShmWriter {
    fn state(&self) -> std::sync::MutexGuard<'_, WState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn broken() -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "shared memory: the other side is gone",
        )
    }
}

impl Sink for ShmWriter {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(ShmWriter::broken());
        }
        let mut st = self.state();
        let max = st.ring.max_payload();
        let mut parts: [&[u8]; crate::chunks::MAX_IOV] = [&[]; crate::chunks::MAX_IOV];
        let (mut k, mut total) = (0, 0);
        for b in bufs {
            if total == max || k == parts.len() {
                break;
            }
            let take = b.len().min(max - total);
            if take == 0 {
                continue;
            }
            parts[k] = &b[..take];
            k += 1;
            total += take;
        }
        if total == 0 {
            return Ok(0);
        }
        match st.ring.try_publish_parts(&parts[..k]) {
            Ok(Some(_)) => {
                if st.ring.sleepers() != 0 {
                    st.peer_data.ring();
                }
                Ok(total)
            }
            Ok(None) => Err(io::ErrorKind::WouldBlock.into()),
            Err(e) => Err(io::Error::other(e)), // cannot be: at most `max` bytes
        }
    }
}

impl WriteHalf for ShmWriter {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.gone.load(Ordering::Relaxed) {
                return Poll::Ready(Err(ShmWriter::broken()));
            }
            {
                let mut st = self.state();
                if st.ring.blocking_reader().is_none() {
                    return Poll::Ready(Ok(()));
                }
                // Flag the wait, then look again: a reader that read on before the flag
                // was up does not ring.
                st.ring.prepare_wait();
                if st.ring.blocking_reader().is_none() {
                    return Poll::Ready(Ok(()));
                }
            }
            if let Poll::Ready(g) = self.room.poll_read_ready(cx) {
                let mut g = g?;
                g.clear_ready();
                self.room.get_ref().drain();
                continue;
            }
            if self.hangup.poll_read_ready(cx).is_ready() {
                self.gone.store(true, Ordering::Relaxed);
                continue;
            }
            return Poll::Pending;
        }
    }

    fn shutdown(&self) {
        let mut st = self.state();
        st.ring.close();
        if st.ring.sleepers() != 0 {
            st.peer_data.ring();
        }
    }

    fn name(&self) -> &'static str {
        "shm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Copies of the descriptors a side would send the other.
    fn dup(l: &Local) -> Vec<OwnedFd> {
        l.fds()
            .iter()
            .map(|f| f.try_clone_to_owned().unwrap())
            .collect()
    }

    /// Both ends of a transport in one process, set up as two processes would.
    fn pair(g: ShmGeometry) -> ((Reader, Writer), (Reader, Writer)) {
        let (sa, sb) = std::os::unix::net::UnixStream::pair().unwrap();
        let (la, lb) = (Local::new("a", g).unwrap(), Local::new("b", g).unwrap());
        let (fa, fb) = (dup(&la), dup(&lb));
        let a = join(la, fb, sa).unwrap();
        let b = join(lb, fa, sb).unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn bytes_arrive_in_order_through_a_small_ring() {
        let g = ShmGeometry {
            slots: 4,
            slot_bytes: 64,
        };
        let ((_ra, wa), (mut rb, _wb)) = pair(g);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 255) as u8).collect();
        let expect = data.clone();
        let writer = tokio::spawn(async move {
            let mut q = std::collections::VecDeque::from([bytes::Bytes::from(data)]);
            super::super::write_chunks(&*wa, &mut q).await.unwrap();
            wa.shutdown();
        });
        let mut got = Vec::new();
        rb.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), expect.len());
        assert!(got == expect);
    }

    #[tokio::test]
    async fn the_other_side_gone_ends_both_halves() {
        let g = ShmGeometry {
            slots: 2,
            slot_bytes: 64,
        };
        let ((ra, wa), (rb, wb)) = pair(g);
        drop((rb, wb));
        // Its socket is closed: a read ends, and a writer fills the ring, then breaks.
        let mut ra = ra;
        let mut got = Vec::new();
        ra.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
        let mut q = std::collections::VecDeque::from([bytes::Bytes::from(vec![1u8; 1000])]);
        let e = super::super::write_chunks(&*wa, &mut q).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[tokio::test]
    async fn a_ring_scribbled_on_is_an_error_not_a_crash() {
        let g = ShmGeometry {
            slots: 4,
            slot_bytes: 64,
        };
        let (sa, sb) = std::os::unix::net::UnixStream::pair().unwrap();
        let (la, lb) = (Local::new("a", g).unwrap(), Local::new("b", g).unwrap());
        // The hostile side keeps a handle on its own ring's words.
        let seg = Segment::open(lb.fds()[0].try_clone_to_owned().unwrap()).unwrap();
        let fb = dup(&lb);
        let (mut ra, _wa) = join(la, fb, sa).unwrap();
        // `head` says 3 messages, but their slots never held them.
        seg.words()[8].store(3, std::sync::atomic::Ordering::Release);
        let mut buf = vec![0u8; 16];
        let e = ra.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        drop((sb, lb));
    }

    #[tokio::test]
    async fn a_reader_whose_cursor_is_taken_errs_instead_of_spinning() {
        let g = ShmGeometry {
            slots: 4,
            slot_bytes: 64,
        };
        let (sa, sb) = std::os::unix::net::UnixStream::pair().unwrap();
        let (la, lb) = (Local::new("a", g).unwrap(), Local::new("b", g).unwrap());
        let seg = Segment::open(lb.fds()[0].try_clone_to_owned().unwrap()).unwrap();
        let (fa, fb) = (dup(&la), dup(&lb));
        let (mut ra, _wa) = join(la, fb, sa).unwrap();
        let (_rb, wb) = join(lb, fa, sb).unwrap();
        // The writer's side wipes the cursor table of its own ring (words 16..80).
        for w in &seg.words()[16..80] {
            w.store(0, std::sync::atomic::Ordering::Release);
        }
        let mut q = std::collections::VecDeque::from([bytes::Bytes::from_static(b"x")]);
        super::super::write_chunks(&*wb, &mut q).await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(ra.read(&mut buf).await.unwrap(), 1);
        let e = tokio::time::timeout(std::time::Duration::from_secs(5), ra.read(&mut buf))
            .await
            .expect("the reader spun or slept instead of failing")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn descriptors_that_are_not_a_sealed_segment_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _e = rt.enter();
        let g = ShmGeometry::default();
        let (sa, _sb) = std::os::unix::net::UnixStream::pair().unwrap();
        let la = Local::new("a", g).unwrap();
        // Three doorbell sockets instead of a segment and two doorbells.
        let fds: Vec<OwnedFd> = (0..3)
            .map(|_| OwnedFd::from(Doorbell::new().unwrap()))
            .collect();
        assert!(join(la, fds, sa).is_err());
        let (sa, _sb) = std::os::unix::net::UnixStream::pair().unwrap();
        let la = Local::new("a", g).unwrap();
        assert!(join(la, Vec::new(), sa).is_err());
    }
}
