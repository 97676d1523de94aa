//! One copy of a message for all of a user's shared-memory clients (docs/shm.md, *Fan-out
//! to the broker's local clients*).
//!
//! The broker writes a message for a user's shared-memory clients once, into that user's
//! arena (a memfd only the broker can write, and every client of the arena can read:
//! `hayate_shm::arena`; `crate::shm::ShmOffer` keeps one per user), and sends each subscriber a small
//! MSG_REF frame naming the entry instead of the message. A client copies the entry out,
//! then counts it released in a word of its own ring's header (the *owner word*, a plain
//! counter of MSG_REFs done, in the order received); or, holding in place (`hold`, granted
//! at the set-up), reads it where it is until the application drops it, then says so in its
//! release table (in any order, [`Holding`]). An entry is written again only when every
//! reference to it has been released, or its client is gone: a copying client's connection
//! ended [`DEPARTED_GRACE`] ago, a holding client's process exited.
//!
//! Nothing a client says is trusted beyond its own references: a counter that goes back is
//! ignored, one that claims more than was sent releases only what was sent (a client that
//! releases early reads a place written again: the tag check makes that its own protocol
//! error), and one that never releases holds at most its quota (a quarter of the arena):
//! past it, and whenever the arena has no room, deliveries go the ordinary way (the whole
//! message copied into the client's ring), so nobody ever waits for the arena.
//!
//! Lock order: a session's outbox, then this module's state (deliveries are encoded
//! under the outbox's lock, [`crate::native::NativeEncoder`]); this module takes no other
//! lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_core::sync::lock;
use hayate_shm::SharedRing;
use hayate_shm::announce::PeerProcess;
use hayate_shm::arena::{
    ArenaWriter, Departures, Fit, Held, Holder as InPlaceHolder, Places, Policy, RELEASE_SLOTS,
    ReleaseTable, entry_words,
};
use hayate_shm::segment::SegmentError;

/// Payloads from this size on go through the arena; smaller ones are copied to each
/// client as before (a reference and the client's extra copy cost more than they save).
pub const MIN_PAYLOAD: usize = 512;
/// Entries remembered as recently written: a message fanned out to many subscribers is
/// found among them while publishers on other threads write theirs.
const RECENT: usize = 4;

/// What the fan-out did, for the stats and tests.
#[derive(Debug, Default)]
pub struct FanoutStats {
    /// Entries written to the arena.
    pub entries: AtomicU64,
    /// MSG_REFs handed out (deliveries by reference).
    pub refs: AtomicU64,
    /// Deliveries of eligible size sent as copies: the arena had no room, or the client
    /// held its quota.
    pub copies: AtomicU64,
}

/// The broker's fan-out arena and who holds what in it.
#[derive(Debug)]
pub struct Fanout {
    state: Mutex<State>,
    /// The arena's descriptor, for the clients (a copy of the writer's).
    fd: std::os::fd::OwnedFd,
    /// Counted with every other arena of the broker.
    stats: Arc<FanoutStats>,
    /// The arena's charge to the memory budget, given back with the arena.
    _charge: Option<hayate_io::memory::Charge>,
}

#[derive(Debug)]
struct Recent {
    at: usize,
    tag: u64,
    /// The frame head (sid 0) the entry starts with, and the payloads after it: held, so
    /// their addresses are not reused for other bytes while remembered.
    head: Vec<u8>,
    body: Vec<Bytes>,
    items: bool,
}

/// A reference handed out: the entry's place, tag and size.
type Ref = (usize, u64, usize);

/// How long the references of a connection the broker ended stay valid: its client is
/// still reading what was sent before the end (the MSG_REFs in its ring, then ERR or the
/// end of the stream), and counts them released as it goes; what it has not released by
/// then is freed.
const DEPARTED_GRACE: Duration = Duration::from_secs(2);

/// How the fan-out places entries (docs/shm.md, *Room, quota and copies*): next fit, as
/// always (entries are freed only when a client's releases are next applied, not at each
/// placement, so first fit's reuse of a place just freed is less sure here; nothing
/// measured compares the two for the fan-out), and a client's quota a quarter of the arena
/// (one user's many clients share it; a client that never releases takes at most that).
const POLICY: Policy = Policy {
    fit: Fit::Next,
    quota_share: 4,
};

#[derive(Debug)]
struct Holder {
    /// The client's ring: its owner word counts the MSG_REFs a copying client is done with.
    release: SharedRing,
    /// A client that reads entries in place (`hold`): its table and process.
    holding: Option<InPlaceHolder>,
    /// Of the owner word's count, what was applied here.
    seen: u64,
    /// MSG_REFs sent to it so far (the next one's number).
    sent: u64,
    /// The references handed out and not yet released, with their numbers, in the order
    /// sent.
    refs: VecDeque<(u64, Ref)>,
    /// Arena words its references hold, against its quota.
    held: Held,
}

/// What a client reading in place says and is: the release table it says what it is
/// done with in (in any order), and its process, whose exit alone ends its references
/// once its connection ended (it may hold entries past the end).
#[derive(Debug)]
pub struct Holding {
    /// Its release table.
    pub table: ReleaseTable,
    /// Its process.
    pub process: PeerProcess,
}

impl Holder {
    /// Applies what the client says it released: a copying client's count; a holding
    /// client's releases from the oldest reference on, and with `all` every one of them
    /// (each looked up: done when there is need of room).
    fn apply_releases(&mut self, entries: &mut Entries, all: bool) {
        let Holder {
            release,
            holding,
            seen,
            refs,
            held,
            ..
        } = self;
        let mut free = |r: Ref| {
            held.sub(r.2);
            entries.unref(r);
        };
        let Some(h) = holding else {
            let said = release.owner_word().load(Ordering::Acquire);
            if said <= *seen {
                return;
            }
            let n = (said - *seen).min(refs.len() as u64);
            for (_, r) in refs.drain(..n as usize) {
                free(r);
            }
            *seen += n;
            return;
        };
        while let Some(&(n, r)) = refs.front() {
            if !h.released(n) {
                break;
            }
            refs.pop_front();
            free(r);
        }
        if all {
            refs.retain(|&(n, r)| {
                let done = h.released(n);
                if done {
                    free(r);
                }
                !done
            });
        }
    }
}

/// The arena's entries.
#[derive(Debug)]
struct Entries {
    /// Entries written and still referenced, by place, each with its count of references
    /// (`hayate_shm::arena::Places`). An entry is freed as soon as its last reference goes
    /// (whatever its age: a client holding old entries leaves holes, not a wall).
    places: Places<u32>,
    recent: [Option<Recent>; RECENT],
    recent_next: usize,
    /// The length prefixes of a batch entry's items, kept between entries.
    lens: Vec<[u8; 4]>,
}

impl Entries {
    /// Drops one reference to the entry `r` names; the last one frees it, and clears its
    /// tag in the arena (a client holding its name then reads it as stale).
    fn unref(&mut self, r: Ref) {
        let (at, tag, _) = r;
        let Some(e) = self.places.get_mut(at).filter(|e| e.tag == tag) else {
            return;
        };
        e.data -= 1;
        if e.data == 0 {
            self.places.free(at);
            // Its payloads go; the slot's buffers stay for the next entry (tag 0 is never
            // an entry's, so the slot matches nothing until then).
            for r in self.recent.iter_mut().flatten().filter(|r| r.at == at) {
                r.tag = 0;
                r.body.clear();
            }
        }
    }

    fn recent_ref(&self, head: &[u8], body: &Body<'_>) -> Option<(usize, u64)> {
        let same = |a: &Bytes, b: &Bytes| a.as_ptr() == b.as_ptr() && a.len() == b.len();
        self.recent.iter().flatten().find_map(|r| {
            (r.items == body.items
                && r.head == head
                && r.body.len() == body.payloads.len()
                && r.body.iter().zip(body.payloads).all(|(a, b)| same(a, b))
                && self.places.get(r.at).is_some_and(|e| e.tag == r.tag))
            .then_some((r.at, r.tag))
        })
    }

    /// Writes `head` + `body` at `at` as a new entry (no reference yet): its tag.
    fn write(&mut self, at: usize, head: &[u8], body: &Body<'_>) -> u64 {
        // The items' length prefixes, in a buffer kept between entries: no allocation per
        // entry once it has grown.
        self.lens.clear();
        if body.items {
            let lens = body.payloads.iter().map(|p| (p.len() as u32).to_be_bytes());
            self.lens.extend(lens);
        }
        let lens = &self.lens;
        let items = body.payloads.iter().enumerate().flat_map(move |(i, p)| {
            let len = lens.get(i).map(|l| &l[..]);
            len.into_iter().chain(std::iter::once(&p[..]))
        });
        let tag = self
            .places
            .put(at, std::iter::once(head).chain(items), 0)
            .tag;
        // The slot's buffers are reused.
        let r = self.recent[self.recent_next].get_or_insert_with(|| Recent {
            at,
            tag,
            head: Vec::new(),
            body: Vec::new(),
            items: body.items,
        });
        (r.at, r.tag, r.items) = (at, tag, body.items);
        r.head.clear();
        r.head.extend_from_slice(head);
        r.body.clear();
        r.body.extend_from_slice(body.payloads);
        self.recent_next = (self.recent_next + 1) % RECENT;
        tag
    }
}

#[derive(Debug)]
struct State {
    entries: Entries,
    holders: HashMap<u64, Holder>,
    /// Holders whose connection ended, with the moment their references are freed
    /// whatever they released ([`DEPARTED_GRACE`]).
    departed: Vec<(Holder, Instant)>,
    /// Holding clients among them (counted by their holders).
    departures: Departures,
    next_holder: u64,
}

impl State {
    /// Applies every client's releases (and ends departed holders past their grace).
    fn apply_all_releases(&mut self) {
        let State {
            entries,
            holders,
            departed,
            ..
        } = self;
        for h in holders.values_mut() {
            h.apply_releases(entries, true);
        }
        if departed.is_empty() {
            return;
        }
        let now = Instant::now();
        departed.retain_mut(|(h, until)| {
            h.apply_releases(entries, true);
            if h.refs.is_empty() {
                return false;
            }
            let alive = match &h.holding {
                // Holding in place: until its process exits, whatever the time.
                Some(hold) => !hold.gone(),
                None => now < *until,
            };
            if alive {
                return true;
            }
            for (_, r) in h.refs.drain(..) {
                entries.unref(r);
            }
            false
        });
    }
}

impl Fanout {
    /// An arena of `bytes` bytes, counting into `stats`, holding `charge` (its share of the
    /// memory budget) while it lives. Fails where the kernel cannot seal it against the
    /// clients' writes (before Linux 5.1).
    pub fn new(
        bytes: usize,
        stats: Arc<FanoutStats>,
        charge: Option<hayate_io::memory::Charge>,
    ) -> Result<Fanout, SegmentError> {
        let arena = ArenaWriter::create("hayate-fanout", bytes)?;
        let fd = arena.fd().try_clone_to_owned()?;
        Ok(Fanout {
            state: Mutex::new(State {
                entries: Entries {
                    places: Places::new(arena, POLICY),
                    recent: Default::default(),
                    recent_next: 0,
                    lens: Vec::new(),
                },
                holders: HashMap::new(),
                departed: Vec::new(),
                departures: Departures::default(),
                next_holder: 0,
            }),
            fd,
            stats,
            _charge: charge,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The arena's descriptor, to send a client.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// What it did so far.
    pub fn stats(&self) -> &FanoutStats {
        &self.stats
    }

    /// Entries live and references held, now (releases applied first; for tests: both 0
    /// once every client has released everything, or is gone past its grace).
    pub fn held(&self) -> (usize, usize) {
        let mut st = self.lock();
        st.apply_all_releases();
        let refs = st.holders.values().map(|h| h.refs.len()).sum::<usize>()
            + st.departed.iter().map(|(h, _)| h.refs.len()).sum::<usize>();
        (st.entries.places.len(), refs)
    }

    /// A new client whose releases its ring's owner word counts (from 0). With `process`
    /// it reads entries in place (`hold`): once its connection ends, its references are
    /// kept until it releases them or that process exits, not only for
    /// [`DEPARTED_GRACE`].
    pub fn register(
        self: &Arc<Fanout>,
        release: SharedRing,
        holding: Option<Holding>,
    ) -> FanoutClient {
        let mut st = self.lock();
        let id = st.next_holder;
        st.next_holder += 1;
        let holding = holding.map(|h| InPlaceHolder::new(h.table, h.process, &st.departures));
        st.holders.insert(
            id,
            Holder {
                release,
                holding,
                sent: 0,
                seen: 0,
                refs: VecDeque::new(),
                held: Held::default(),
            },
        );
        FanoutClient {
            fanout: self.clone(),
            id,
            revoked: AtomicBool::new(false),
        }
    }

    /// Whether a new client may hold entries in place: fewer than [`hayate_shm::arena::MAX_DEPARTED`] clients
    /// whose connection ended still hold entries, waiting for their processes (each keeps
    /// its ring mapped here). Past it, new clients copy.
    pub fn may_hold(&self) -> bool {
        let mut st = self.lock();
        st.apply_all_releases();
        st.departures.may_hold()
    }

    /// Places the frame `head` + `body` (its `sid` 0) in the arena for client `id`, or
    /// finds it placed already: the MSG_REF's `(at, len, tag)`. `None`: send a copy
    /// instead.
    fn place(&self, id: u64, head: &[u8], body: &Body<'_>) -> Option<(u64, u32, u64)> {
        let len = head.len() + body.bytes();
        let words = entry_words(len);
        let mut guard = self.lock();
        let st = &mut *guard;
        let h = st.holders.get_mut(&id)?;
        h.apply_releases(&mut st.entries, false);
        if h.holding.is_some() && !st.entries.places.within_quota(&h.held, words) {
            // Held out of order: looked up one by one only now.
            h.apply_releases(&mut st.entries, true);
        }
        // A holding client's table tells apart fewer than RELEASE_SLOTS references.
        let placed =
            if !st.entries.places.within_quota(&h.held, words) || h.refs.len() >= RELEASE_SLOTS {
                None
            } else if let Some(r) = st.entries.recent_ref(head, body) {
                Some(r)
            } else {
                // Finding no room, entries as large are not searched for again until one is
                // freed (`Places::room`).
                let at = st.entries.places.room(words).or_else(|| {
                    st.apply_all_releases();
                    st.entries.places.room(words)
                });
                at.map(|at| {
                    self.stats.entries.fetch_add(1, Ordering::Relaxed);
                    (at, st.entries.write(at, head, body))
                })
            };
        let Some((at, tag)) = placed else {
            self.stats.copies.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        st.entries.places.get_mut(at)?.data += 1;
        let h = st.holders.get_mut(&id)?;
        h.refs.push_back((h.sent, (at, tag, words)));
        h.sent += 1;
        h.held.add(words);
        self.stats.refs.fetch_add(1, Ordering::Relaxed);
        Some((at as u64 * 8, len as u32, tag))
    }

    /// Client `id`'s connection ended (or its share was revoked): nothing more is placed
    /// for it, and its references stay valid for [`DEPARTED_GRACE`] while it reads what was
    /// sent before the end.
    fn unregister(&self, id: u64) {
        let mut st = self.lock();
        if let Some(mut h) = st.holders.remove(&id) {
            if let Some(hold) = &h.holding {
                // Counted among the departed until dropped (its last reference freed).
                hold.depart();
            }
            h.apply_releases(&mut st.entries, true);
            if !h.refs.is_empty() {
                st.departed.push((h, Instant::now() + DEPARTED_GRACE));
            }
        }
    }
}

/// What follows an entry's frame head: a MSG's payload, or a MSG_BATCH's items (each
/// payload after its 32-bit length).
#[derive(Debug, Clone, Copy)]
pub struct Body<'a> {
    payloads: &'a [Bytes],
    items: bool,
    bytes: usize,
}

impl<'a> Body<'a> {
    /// `payloads`, each after its length when `items`.
    pub fn new(payloads: &'a [Bytes], items: bool) -> Body<'a> {
        let n = payloads.iter().map(Bytes::len).sum::<usize>();
        let bytes = if items { n + 4 * payloads.len() } else { n };
        Body {
            payloads,
            items,
            bytes,
        }
    }

    /// Bytes of the body.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// One client of the fan-out (its references are released when dropped, with its
/// connection).
#[derive(Debug)]
pub struct FanoutClient {
    fanout: Arc<Fanout>,
    id: u64,
    /// Its share was revoked: nothing more is placed for it (checked before any lock).
    revoked: AtomicBool,
}

impl FanoutClient {
    /// See [`Fanout::place`].
    pub fn place(&self, head: &[u8], body: &Body<'_>) -> Option<(u64, u32, u64)> {
        if self.revoked.load(Ordering::Relaxed) {
            return None;
        }
        self.fanout.place(self.id, head, body)
    }

    /// Ends this client's use of the arena now: its references are released, and nothing
    /// more is placed for it (its deliveries are copies). Dropping it does the same.
    pub fn revoke(&self) {
        self.revoked.store(true, Ordering::Relaxed);
        self.fanout.unregister(self.id);
    }
}

#[cfg(test)]
impl Fanout {
    /// Ends the grace of every departed holder now.
    fn end_graces(&self) {
        let mut st = self.lock();
        let now = Instant::now();
        for (_, until) in &mut st.departed {
            *until = now;
        }
    }
}

impl Drop for FanoutClient {
    fn drop(&mut self) {
        self.fanout.unregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_shm::arena::MAX_DEPARTED;

    /// An arena of `bytes`, its stats its own.
    fn arena(bytes: usize) -> Arc<Fanout> {
        Arc::new(Fanout::new(bytes, Default::default(), None).unwrap())
    }

    /// A client ring whose owner word the test sets (as the client would).
    fn ring() -> SharedRing {
        let seg =
            hayate_shm::segment::Segment::create("t", hayate_shm::region_words(2, 64) * 8).unwrap();
        SharedRing::init(seg, 2, 64).unwrap()
    }

    fn one(p: &Bytes) -> Body<'_> {
        Body::new(std::slice::from_ref(p), false)
    }

    fn release(r: &SharedRing, n: u64) {
        r.owner_word().store(n, Ordering::Release);
    }

    fn view(f: &Fanout) -> hayate_shm::arena::ArenaView {
        hayate_shm::arena::ArenaView::open(f.fd().try_clone_to_owned().unwrap()).unwrap()
    }

    fn read(v: &hayate_shm::arena::ArenaView, r: (u64, u32, u64)) -> Vec<u8> {
        let mut out = Vec::new();
        v.get(r.0, u64::from(r.1), r.2, &mut out).unwrap();
        out
    }

    #[test]
    fn one_entry_serves_every_client_until_all_release() {
        let f = arena(64 * 1024);
        let v = view(&f);
        let rings: Vec<_> = (0..3).map(|_| ring()).collect();
        let clients: Vec<_> = rings.iter().map(|r| f.register(r.clone(), None)).collect();
        let payload = Bytes::from(vec![7u8; 1000]);
        let refs: Vec<_> = clients
            .iter()
            .map(|c| c.place(b"head", &one(&payload)).unwrap())
            .collect();
        assert!(refs.windows(2).all(|w| w[0] == w[1]), "one entry for all");
        // Tags are not a count a client could predict (and write into a payload of its own).
        assert!(refs[0].2 > 1 << 20, "tag {}", refs[0].2);
        assert_eq!(f.stats().entries.load(Ordering::Relaxed), 1);
        let mut want = b"head".to_vec();
        want.extend_from_slice(&payload);
        assert_eq!(read(&v, refs[0]), want);
        release(&rings[0], 1);
        release(&rings[1], 1);
        assert_eq!(f.held(), (1, 1));
        release(&rings[2], 1);
        assert_eq!(f.held(), (0, 0));
    }

    #[test]
    fn a_client_that_never_releases_holds_its_quota_then_gets_copies() {
        // 64 KiB: a quota of 16 KiB.
        let f = arena(64 * 1024);
        let (hog, good) = (ring(), ring());
        let (hc, gc) = (
            f.register(hog.clone(), None),
            f.register(good.clone(), None),
        );
        let mut hog_refs = 0;
        let mut good_released = 0;
        for i in 0..200u32 {
            let payload = Bytes::from(vec![i as u8; 1000]);
            if hc.place(b"h", &one(&payload)).is_some() {
                hog_refs += 1;
            }
            // The good client gets every one by reference, releasing as it goes.
            assert!(gc.place(b"h", &one(&payload)).is_some(), "message {i}");
            good_released += 1;
            release(&good, good_released);
        }
        // 16 KiB of ~1 KiB entries.
        assert!((10..=16).contains(&hog_refs), "{hog_refs}");
        assert!(f.stats().copies.load(Ordering::Relaxed) >= 180);
        // The hog's connection ends: its references stay valid for the grace (it may
        // still be reading what was sent), then everything is free.
        drop(hc);
        assert!(f.held().1 >= 10);
        f.end_graces();
        assert_eq!(f.held(), (0, 0));
    }

    #[test]
    fn lies_about_releases_free_only_the_liar_s_references() {
        let f = arena(64 * 1024);
        let v = view(&f);
        let (liar, honest) = (ring(), ring());
        let (lc, hc) = (
            f.register(liar.clone(), None),
            f.register(honest.clone(), None),
        );
        let p = Bytes::from(vec![1u8; 600]);
        let r = lc.place(b"x", &one(&p)).unwrap();
        assert_eq!(hc.place(b"x", &one(&p)), Some(r));
        // Claims a billion released: only its one reference goes.
        release(&liar, 1_000_000_000);
        assert_eq!(f.held(), (1, 1));
        // The honest client's entry is intact after much more traffic.
        for i in 0..500u32 {
            let p = Bytes::from(vec![i as u8; 600]);
            let _ = lc.place(b"y", &one(&p));
        }
        let mut want = b"x".to_vec();
        want.extend_from_slice(&p);
        assert_eq!(read(&v, r), want);
        // A counter that goes back is ignored.
        release(&liar, 3);
        assert!(lc.place(b"z", &one(&Bytes::from(vec![0u8; 600]))).is_some());
        drop(hc);
        drop(lc);
        f.end_graces();
        assert_eq!(f.held(), (0, 0));
    }

    #[test]
    fn a_batch_is_one_entry_of_items_found_again_by_its_payloads() {
        let f = arena(64 * 1024);
        let v = view(&f);
        let (r1, r2) = (ring(), ring());
        let (c1, c2) = (f.register(r1, None), f.register(r2, None));
        let batch = [Bytes::from_static(b"ab"), Bytes::from(vec![9u8; 700])];
        let body = Body::new(&batch, true);
        let got = c1.place(b"H", &body).unwrap();
        assert_eq!(c2.place(b"H", &body), Some(got));
        let mut want = b"H".to_vec();
        for p in &batch {
            want.extend_from_slice(&(p.len() as u32).to_be_bytes());
            want.extend_from_slice(p);
        }
        assert_eq!(read(&v, got), want);
        // The same bytes elsewhere are another message: another entry.
        let copy = [batch[0].clone(), Bytes::from(vec![9u8; 700])];
        let other = Body::new(&copy, true);
        assert_ne!(c1.place(b"H", &other).unwrap().2, got.2);
        // The same payloads without items framing, or under another head, too.
        let plain = Body::new(&batch, false);
        assert_ne!(c1.place(b"H", &plain).unwrap().2, got.2);
        assert_ne!(c1.place(b"G", &body).unwrap().2, got.2);
        assert_eq!(f.stats().entries.load(Ordering::Relaxed), 4);
    }

    /// A connection the broker ended keeps its references valid for the grace: its client
    /// still reads what was sent before the end, and what it releases meanwhile is freed.
    #[test]
    fn a_departed_client_s_entries_outlive_its_connection_for_the_grace() {
        let f = arena(64 * 1024);
        let v = view(&f);
        let r = ring();
        let c = f.register(r.clone(), None);
        let sent: Vec<_> = (0..5u8)
            .map(|i| {
                let p = Bytes::from(vec![i; 600]);
                (c.place(b"", &one(&p)).unwrap(), p)
            })
            .collect();
        drop(c);
        // Another client's traffic does not take their places meanwhile.
        let other = ring();
        let oc = f.register(other.clone(), None);
        for i in 0..200u64 {
            let _ = oc.place(b"", &one(&Bytes::from(vec![9u8; 600])));
            release(&other, i + 1);
        }
        for (i, (got, p)) in sent.iter().enumerate() {
            assert_eq!(read(&v, *got), p.to_vec(), "entry {i}");
            release(&r, i as u64 + 1);
        }
        // All released: nothing held for the departed client, before its grace ends.
        assert_eq!(f.held().1, 0);
    }

    /// A client reading in place (`hold`): its table and the broker's view of it, watching
    /// `process`.
    fn holding(process: PeerProcess) -> (ReleaseTable, Holding) {
        let mine = ReleaseTable::create("releases").unwrap();
        let table = ReleaseTable::open(mine.fd().try_clone_to_owned().unwrap()).unwrap();
        (mine, Holding { table, process })
    }

    /// A client reading in place (`hold`) releases in any order, and one entry it keeps
    /// does not hold up the others; it may hold entries past its connection's end: they
    /// stay unwritten past the grace, until it releases them or its process exits.
    #[test]
    fn a_holding_client_s_entries_stay_until_released_or_its_process_exits() {
        let f = arena(64 * 1024);
        let v = view(&f);
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let (t, h) = holding(PeerProcess::pid(child.id()).unwrap());
        let (t2, h2) = holding(PeerProcess::pid(std::process::id()).unwrap());
        let c = f.register(ring(), Some(h));
        let c2 = f.register(ring(), Some(h2));
        // The first entry kept, every later one released as it comes: far more than the
        // quota's worth goes by reference.
        let p = Bytes::from(vec![1u8; 600]);
        let kept = c.place(b"", &one(&p)).unwrap();
        for n in 1..200u64 {
            assert!(
                c.place(b"", &one(&Bytes::from(vec![3u8; 600]))).is_some(),
                "{n}"
            );
            t.release(n);
        }
        assert_eq!(f.stats().copies.load(Ordering::Relaxed), 0);
        assert_eq!(f.held().1, 1);
        let b = c2.place(b"", &one(&p)).unwrap();
        let q = Bytes::from(vec![2u8; 600]);
        let only_c = c.place(b"", &one(&q)).unwrap();
        drop((c, c2));
        f.end_graces();
        // Other traffic fills the arena many times over: the held places are kept.
        let other = ring();
        let oc = f.register(other.clone(), None);
        for i in 0..500u64 {
            let _ = oc.place(b"", &one(&Bytes::from(vec![9u8; 600])));
            release(&other, i + 1);
        }
        assert_eq!(read(&v, kept), p.to_vec());
        assert_eq!(read(&v, b), vec![1u8; 600]);
        assert_eq!(read(&v, only_c), q.to_vec());
        assert_eq!(f.held().1, 3);
        assert!(f.may_hold());
        // The second releases its one; the first's process exits: all are gone.
        t2.release(0);
        assert_eq!(f.held().1, 2);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(f.held(), (0, 0), "a dead holder's entries were kept");
    }

    /// Clients that leave holding entries while their processes live are kept, up to 64
    /// per arena: past that a new client may not hold (it copies); released, room again.
    #[test]
    fn at_most_64_departed_holders_are_kept_waiting() {
        let f = arena(1 << 20);
        let tables: Vec<ReleaseTable> = (0..MAX_DEPARTED)
            .map(|_| {
                let (t, h) = holding(PeerProcess::pid(std::process::id()).unwrap());
                let c = f.register(ring(), Some(h));
                c.place(b"", &one(&Bytes::from(vec![5u8; 600]))).unwrap();
                assert!(f.may_hold());
                drop(c);
                t
            })
            .collect();
        f.end_graces();
        assert!(!f.may_hold(), "a 65th client may hold");
        assert_eq!(f.held().1, MAX_DEPARTED);
        tables[0].release(0);
        assert!(f.may_hold());
        for t in &tables {
            t.release(0);
        }
        assert_eq!(f.held(), (0, 0));
    }

    #[test]
    fn entries_wrap_around_the_arena() {
        let f = arena(16 * 1024);
        let v = view(&f);
        let r = ring();
        let c = f.register(r.clone(), None);
        for i in 0..1000u64 {
            let p = Bytes::from(vec![(i % 251) as u8; 500 + (i as usize * 37) % 700]);
            let got = c.place(b"", &one(&p)).expect("room after each release");
            assert_eq!(read(&v, got), p.to_vec());
            release(&r, i + 1);
        }
        assert_eq!(f.stats().copies.load(Ordering::Relaxed), 0);
        assert_eq!(f.held(), (0, 0));
    }
}
