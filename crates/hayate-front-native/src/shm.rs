//! Shared memory for native clients on the broker's host (docs/protocol.md, *Shared memory
//! with the broker*).
//!
//! A client on this host that sets HELLO's `SHM` flag gets, in WELCOME, the name of the
//! broker's abstract Unix socket and a ticket: 128 random bits, good once, for
//! [`TICKET_TTL`], issued only to an authenticated session that came in over loopback TCP or
//! a Unix socket. The client connects to the socket and sends `HAYATE-SHM/1 CONNECT
//! <ticket>` with its ring's segment and its two doorbells; the broker checks the ticket,
//! attaches, and answers `HAYATE-SHM/1 OK` with its own three descriptors (or `HAYATE-SHM/1
//! NO <reason>` and a close). The connection is then an ordinary native connection over
//! [`hayate_io::transport::shm`]: the client sends HELLO on it, and everything else is as
//! on TCP (limits, permissions, back-pressure, the slow-consumer rules).
//!
//! The socket's name has 128 random bits too, and is bound by the broker before any client
//! learns it: no other process can take it first and pose as the broker. The ticket keeps
//! processes that never authenticated from making the broker map memory: only
//! [`ShmOffer::max`] shared-memory connections exist at once, each holding a 2 MiB ring of the
//! broker's (and mapping the client's, at most [`shm::MAX_SEGMENT_BYTES`]).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hayate_io::memory::{Charge, Memory};
use hayate_io::transport::shm::{self, PREFIX};
use hayate_io::transport::{Reader, Writer};
use hayate_shm::announce;
use hayate_shm::arena::ReleaseTable;

use crate::fanout::{Fanout, FanoutClient, FanoutStats, Holding};
use tokio::net::UnixListener;

/// How long a ticket is good for.
pub const TICKET_TTL: Duration = Duration::from_secs(10);
/// Tickets outstanding at most (a client that asks and never comes back holds one for
/// [`TICKET_TTL`]); past it, no shared memory is offered until some expire.
const MAX_TICKETS: usize = 4096;
/// Connections to the broker's socket that have not shown a ticket yet, at most. The socket
/// is abstract (any process of the host may connect, whatever its user): past this, the
/// next are closed at once, so such connections cannot fill `limits.max_connections`.
const MAX_SETTING_UP: usize = 64;
/// How long a connection to the broker's socket has to send its CONNECT (a client sends it
/// at once), whatever the handshake timeout.
const SETUP_TIMEOUT: Duration = Duration::from_secs(2);

/// What a ticket stands for: the session it was issued to.
#[derive(Debug)]
struct Ticket {
    at: Instant,
    peer: Option<SocketAddr>,
    verified_name: Option<String>,
    /// The user the session was logged in as (`None`: anonymous): the fan-out arena is
    /// that user's.
    user: Option<Arc<str>>,
}

/// The broker's offer of shared memory: its socket's name and the tickets given out.
#[derive(Debug)]
pub struct ShmOffer {
    name: String,
    tickets: Mutex<HashMap<u128, Ticket>>,
    active: Arc<AtomicUsize>,
    max: usize,
    /// Connections not yet past their CONNECT.
    setting_up: AtomicUsize,
    /// The fan-out arenas, one per user with shared-memory clients that took one (an
    /// arena is readable by all of its clients: users do not share one), made when first
    /// needed and gone with their last client.
    arenas: Mutex<HashMap<Option<Arc<str>>, std::sync::Weak<Fanout>>>,
    /// Bytes of each arena (`native.shm_fanout_bytes`; 0: none).
    fanout_bytes: usize,
    /// The memory budget the arenas are charged to.
    memory: Arc<Memory>,
    /// What all arenas did.
    fanout_stats: Arc<FanoutStats>,
    /// An arena could not be made (warned once).
    fanout_failed: std::sync::atomic::AtomicBool,
}

/// A connection counted in [`ShmOffer::setting_up`] until dropped.
struct SettingUp<'a>(&'a AtomicUsize);

impl Drop for SettingUp<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn random_u128() -> u128 {
    let mut b = [0u8; 16];
    // getrandom fails only without any entropy source; zeros then make the names
    // predictable, which the bind (first come) and one-use tickets still make harmless
    // to others: refuse to offer instead.
    if getrandom::fill(&mut b).is_err() {
        return 0;
    }
    u128::from_le_bytes(b)
}

impl ShmOffer {
    /// Binds the broker's abstract socket (`hayate-broker/<32 hex digits>`). Fan-out
    /// arenas of `fanout_bytes` (0: none) are charged to `memory`; one that cannot be made
    /// (a kernel without `F_SEAL_FUTURE_WRITE`, the budget spent) is not offered: the
    /// client's deliveries are copies.
    pub fn bind(
        max: usize,
        fanout_bytes: usize,
        memory: &Arc<Memory>,
    ) -> io::Result<(Arc<ShmOffer>, UnixListener)> {
        let id = random_u128();
        if id == 0 {
            return Err(io::Error::other("no randomness for the socket's name"));
        }
        let name = format!("hayate-broker/{id:032x}");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
        l.set_nonblocking(true)?;
        let offer = ShmOffer {
            name,
            tickets: Mutex::new(HashMap::new()),
            active: Arc::new(AtomicUsize::new(0)),
            max,
            setting_up: AtomicUsize::new(0),
            arenas: Mutex::new(HashMap::new()),
            fanout_bytes,
            memory: memory.clone(),
            fanout_stats: Arc::default(),
            fanout_failed: std::sync::atomic::AtomicBool::new(false),
        };
        Ok((Arc::new(offer), UnixListener::from_std(l)?))
    }

    /// The socket's abstract name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the fan-out arenas did (`None`: there are none, `native.shm_fanout_bytes` 0).
    pub fn fanout_stats(&self) -> Option<&FanoutStats> {
        (self.fanout_bytes > 0).then_some(&*self.fanout_stats)
    }

    /// The fan-out arenas now.
    pub fn arenas(&self) -> Vec<Arc<Fanout>> {
        let a = self.arenas.lock().unwrap_or_else(|p| p.into_inner());
        a.values().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// `user`'s arena: the one its clients have, or a new one.
    fn arena_for(&self, user: &Option<Arc<str>>) -> Option<Arc<Fanout>> {
        if self.fanout_bytes == 0 {
            return None;
        }
        let mut arenas = self.arenas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = arenas.get(user).and_then(std::sync::Weak::upgrade) {
            return Some(f);
        }
        arenas.retain(|_, w| w.strong_count() > 0);
        match fanout_arena(self.fanout_bytes, &self.memory, &self.fanout_stats) {
            Ok(f) => {
                arenas.insert(user.clone(), Arc::downgrade(&f));
                Some(f)
            }
            Err(e) => {
                if !self.fanout_failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!("no shared-memory fan-out arena: {e}");
                }
                None
            }
        }
    }

    /// Shared-memory connections now (set up and not yet ended).
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Shared-memory connections at once, at most.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Tickets given out and not yet used nor expired.
    pub fn tickets(&self) -> usize {
        self.tickets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// What WELCOME's `shm` field says to a session from `peer` that asked: `<socket>
    /// <ticket>`, or empty (not offered: the client is not on this host, or the broker is
    /// at its limits). `verified_name`: the user its TLS client certificate names, which
    /// the shared-memory connection inherits (it has no certificate of its own); `user`:
    /// the user the session logged in as, whose fan-out arena the connection may take.
    pub fn issue(
        &self,
        peer: Option<SocketAddr>,
        verified_name: Option<String>,
        user: Option<Arc<str>>,
    ) -> String {
        if peer.is_some_and(|a| !a.ip().is_loopback())
            || self.active.load(Ordering::Relaxed) >= self.max
        {
            return String::new();
        }
        let now = Instant::now();
        let mut t = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        if t.len() >= MAX_TICKETS {
            t.retain(|_, k| now.duration_since(k.at) < TICKET_TTL);
            if t.len() >= MAX_TICKETS {
                return String::new();
            }
        }
        let ticket = random_u128();
        if ticket == 0 {
            return String::new();
        }
        t.insert(
            ticket,
            Ticket {
                at: now,
                peer,
                verified_name,
                user,
            },
        );
        format!("{} {ticket:032x}", self.name)
    }

    /// Takes `ticket` (once): what it was issued for.
    fn redeem(&self, ticket: &str) -> Option<Ticket> {
        let ticket = u128::from_str_radix(ticket, 16).ok()?;
        let t = self
            .tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ticket)?;
        (t.at.elapsed() < TICKET_TTL).then_some(t)
    }
}

/// A fan-out arena of `bytes`, charged to `memory` while it lives.
fn fanout_arena(
    bytes: usize,
    memory: &Arc<Memory>,
    stats: &Arc<FanoutStats>,
) -> io::Result<Arc<Fanout>> {
    let mut charge = Charge::exact(memory);
    if !charge.cover(bytes) {
        return Err(io::Error::other(format!(
            "an arena of {bytes} bytes does not fit the memory budget"
        )));
    }
    let f = Fanout::new(bytes, stats.clone(), Some(charge)).map_err(io::Error::other)?;
    Ok(Arc::new(f))
}

/// One shared-memory connection counted against [`ShmOffer::max`] while it lives, and its
/// ring charged to the broker's memory budget.
#[derive(Debug)]
pub struct ShmSlot {
    active: Arc<AtomicUsize>,
    /// Given back to the budget when the connection ends.
    _ring: Charge,
}

impl Drop for ShmSlot {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection set up: its halves, the address its ticket was issued to, its slot, and what
/// the caller's `admit` gave for it.
pub struct Attached<G> {
    /// The read half.
    pub reader: Reader,
    /// The write half.
    pub writer: Writer,
    /// The address of the session that got the ticket.
    pub peer: Option<SocketAddr>,
    /// The user its verified TLS client certificate named, if any.
    pub verified_name: Option<String>,
    /// Counts the connection until dropped.
    pub slot: ShmSlot,
    /// What `admit` gave (the caller's own accounting for the connection).
    pub admitted: G,
    /// Its share of its user's fan-out arena, when it asked for it and the broker has one.
    pub fanout: Option<FanoutGrant>,
}

/// A shared-memory connection's share of a fan-out arena, and the user whose arena it is:
/// the connection must log in as that user to use it ([`FanoutClient::revoke`] otherwise).
#[derive(Debug)]
pub struct FanoutGrant {
    /// The share.
    pub client: Arc<FanoutClient>,
    /// The arena's user (`None`: anonymous).
    pub user: Option<Arc<str>>,
}

/// Sets up a connection accepted on the offer's socket: the client's CONNECT, within
/// `timeout`; refusals are answered `NO` and are errors here. `admit` is asked, with the
/// address the ticket was issued to, before anything is answered: `None` refuses (the
/// caller's per-address limit), so that a client is never told `OK` and then cut off.
pub async fn accept<G>(
    offer: &ShmOffer,
    sock: tokio::net::UnixStream,
    timeout: Duration,
    memory: &Arc<Memory>,
    admit: impl FnOnce(Option<SocketAddr>) -> Option<G>,
) -> io::Result<Attached<G>> {
    if offer.setting_up.fetch_add(1, Ordering::AcqRel) >= MAX_SETTING_UP {
        offer.setting_up.fetch_sub(1, Ordering::AcqRel);
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "too many connections setting up shared memory",
        ));
    }
    let _setting_up = SettingUp(&offer.setting_up);
    // A client sends its CONNECT in one write: once readable, it is all there (a partial
    // one is malformed, like any other garbage). Readiness can be a false alarm
    // (`WouldBlock`): wait again.
    let got = tokio::time::timeout(timeout.min(SETUP_TIMEOUT), async {
        loop {
            sock.readable().await?;
            match sock.try_io(tokio::io::Interest::READABLE, || {
                announce::receive_any(&sock).map_err(|e| match e {
                    announce::ReceiveError::Io(e) => e,
                    e => io::Error::new(io::ErrorKind::InvalidData, e),
                })
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no CONNECT in time"))?;
    let sock = sock.into_std()?;
    let (mut fds, message) = got?;
    let refuse = |why: &str| {
        let _ = announce::send_fds(&sock, &[], format!("{PREFIX} NO {why}").as_bytes());
        io::Error::new(io::ErrorKind::PermissionDenied, why.to_owned())
    };
    let text = std::str::from_utf8(&message).unwrap_or("");
    let Some(rest) = text
        .strip_prefix(PREFIX)
        .and_then(|r| r.strip_prefix(" CONNECT "))
    else {
        return Err(refuse("expected CONNECT <ticket>"));
    };
    // `<ticket>`, `<ticket> fanout` or `<ticket> fanout hold`; other capability words are
    // ignored.
    let mut words = rest.split_whitespace();
    let ticket = words.next().unwrap_or("");
    let words: Vec<&str> = words.collect();
    let wants_fanout = words.contains(&shm::FANOUT);
    // Holding in place: the client's release table comes after its three descriptors.
    let table = if wants_fanout && words.contains(&shm::HOLD) && fds.len() == 4 {
        let t = ReleaseTable::open(fds.remove(3));
        Some(t.map_err(|e| refuse(&format!("release table: {e}")))?)
    } else {
        None
    };
    let Some(Ticket {
        peer,
        verified_name,
        user,
        ..
    }) = offer.redeem(ticket)
    else {
        return Err(refuse("unknown or expired ticket"));
    };
    let Some(admitted) = admit(peer) else {
        return Err(refuse("too many connections from this address"));
    };
    if offer.active.fetch_add(1, Ordering::AcqRel) >= offer.max {
        offer.active.fetch_sub(1, Ordering::AcqRel);
        return Err(refuse("too many shared-memory connections"));
    }
    let active = offer.active.clone();
    let geometry = shm::ShmGeometry::default();
    // The ring the broker writes is its memory (resident once written through): charged to
    // the budget, or no shared memory (the client stays on TCP).
    let mut charge = Charge::exact(memory);
    if !charge.cover(geometry.segment_bytes()) {
        active.fetch_sub(1, Ordering::AcqRel);
        return Err(refuse("the broker's memory budget is spent"));
    }
    let slot = ShmSlot {
        active,
        _ring: charge,
    };
    let local = shm::Local::new("hayate-broker", geometry)?;
    // Copies of this side's descriptors for the answer, sent once this side is registered
    // in the client's ring (the client writes only after the answer).
    let ours = local
        .fds()
        .iter()
        .map(|f| f.try_clone_to_owned())
        .collect::<io::Result<Vec<_>>>()?;
    let (reader, writer, theirs) = match shm::join_ring(local, fds, sock.try_clone()?) {
        Ok(rw) => rw,
        Err(e) => return Err(refuse(&e.to_string())),
    };
    let arena = wants_fanout.then(|| offer.arena_for(&user)).flatten();
    // Holding in place needs the client's process watched (its exit frees what it held
    // past its connection), and room among the arena's departed holders.
    let holding = match (&arena, table) {
        (Some(f), Some(table)) if f.may_hold() => announce::PeerProcess::of(&sock)
            .inspect_err(|e| tracing::debug!("no pidfd for a shared-memory client: {e}"))
            .ok()
            .map(|process| Holding { table, process }),
        _ => None,
    };
    let mut ours: Vec<_> = ours.iter().map(|f| f.as_fd()).collect();
    let answer = match &arena {
        Some(f) => {
            ours.push(f.fd());
            match holding {
                Some(_) => format!("{PREFIX} OK {} {}", shm::FANOUT, shm::HOLD),
                None => format!("{PREFIX} OK {}", shm::FANOUT),
            }
        }
        None => format!("{PREFIX} OK"),
    };
    announce::send_fds(&sock, &ours, answer.as_bytes())?;
    let fanout = arena.map(|f| FanoutGrant {
        client: Arc::new(f.register(theirs, holding)),
        user,
    });
    Ok(Attached {
        reader,
        writer,
        peer,
        verified_name,
        slot,
        admitted,
        fanout,
    })
}
