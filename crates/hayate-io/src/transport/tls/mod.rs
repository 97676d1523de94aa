//! TLS over TCP as a transport. rustls runs the handshake ([`accept`], [`connect`], over
//! its unbuffered API: [`handshake`]); then the traffic keys are taken out of rustls and
//! each half runs its own direction of the record layer ([`record`]): the read half opens
//! records in place in its ciphertext buffer, the write half seals them straight from the
//! outbox's buffers into its outgoing one. The halves share a lock only for the rare
//! events that touch both: a TLS 1.3 key update (rustls computes the next keys), an alert.
//! rustls' buffered connection, which this replaced, copied every received byte three
//! times and every sent one once more, and put both directions behind one mutex.
//!
//! Writes follow the transport contract: [`WriteHalf`]'s `try_write_vectored` seals
//! plaintext only while its outgoing buffer holds less than [`TLS_BUFFER`] (past it:
//! `WouldBlock`), and pushes the ciphertext to the socket without blocking;
//! `poll_write_ready` waits for the socket until that buffer has drained. So a client that
//! stops reading holds at most `TLS_BUFFER` (plus one record) of ciphertext here, beyond
//! the outbox's own budget.
//!
//! After the handshake:
//! - TLS 1.3 keys are updated (RFC 8446 §4.6.3) when the peer asks, answering with our own
//!   update, and by this side every [`REKEY_AFTER`] records it sends (below every suite's
//!   confidentiality limit). A TLS 1.2 connection cannot update its keys and ends after 2^24
//!   records in one direction, as rustls' own does.
//! - A client takes the server's session tickets (rustls keeps them).
//! - The peer's `close_notify` ends the stream cleanly; any other alert, a record that does
//!   not verify, one longer than the protocol allows, a handshake message split across
//!   records or any handshake message but those two ends it with `InvalidData` (after the
//!   plaintext of the records before it), with the matching alert sent to the peer.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hayate_core::sync::lock;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::{Reader, WriteHalf, Writer};
use crate::sink::Sink;

mod handshake;
mod record;
#[cfg(test)]
mod tests;

use handshake::Kernel;
use record::{AlertMeaning, Cipher, MAX_DATA, OVERHEAD, PostHandshake, Refusal, Type};

pub use rustls;

/// Ciphertext the write half holds before it reports `WouldBlock`.
pub const TLS_BUFFER: usize = 256 * 1024;

/// Records a TLS 1.3 connection sends under one key before updating it: below 2^23, the
/// smallest confidentiality limit of its suites (AES-256-GCM's, in rustls' table).
pub const REKEY_AFTER: u64 = 1 << 22;

/// Records after the last one with data that a peer may send with no data (empty records,
/// key updates, tickets, warning alerts) before the connection is refused: such records
/// cost the reader work and give the read nothing (rustls allows 32 key updates or empty
/// records in a row, 4 warnings).
const MAX_IDLE_RECORDS: u32 = 32;

/// The outgoing buffer kept once empty when no larger (one full record): a connection that
/// sent a large message does not keep its buffer while idle. A larger one goes back to
/// [`SPARE`].
const RETAIN: usize = MAX_DATA + 2 * OVERHEAD;

/// Emptied send buffers larger than [`RETAIN`], for the next connection that needs one:
/// at most [`SPARE_BUFFERS`] of them, of at most [`SPARE_MAX`] bytes of capacity each (8 MiB
/// for the process). A buffer is initialised memory, so one taken from here is
/// sealed into without being zeroed again (zeroing a fresh 64 KiB buffer for each large
/// message cost as much as the copy the record layer saves).
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
const SPARE_BUFFERS: usize = 16;
/// The largest buffer kept in [`SPARE`] (its capacity).
const SPARE_MAX: usize = 2 * TLS_BUFFER;

/// A spare buffer of at least `len` bytes, if one is there.
fn take_spare(len: usize) -> Option<Vec<u8>> {
    let mut spare = lock(&SPARE);
    let i = spare.iter().position(|b| b.len() >= len)?;
    Some(spare.swap_remove(i))
}

fn give_spare(buf: Vec<u8>) {
    if buf.capacity() <= SPARE_MAX {
        let mut spare = lock(&SPARE);
        if spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
    }
}

/// The most ciphertext one `recv` takes from the socket.
const READ_AHEAD: usize = 64 * 1024;

fn refused(r: Refusal) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, r.to_string())
}

/// The sending direction.
struct Tx {
    cipher: Cipher,
    /// Sealed records from `sent` to `filled`; the bytes past `filled` are initialised
    /// room (so a record is sealed into it without zeroing it first).
    buf: Vec<u8>,
    filled: usize,
    sent: usize,
    /// close_notify or a fatal alert went out: nothing more is sealed.
    closed: bool,
    /// The socket's write direction is to be shut once the buffer has drained.
    shutdown: bool,
    /// The peer asked for our key update: sent before our next record. Any number of
    /// requests before it make one update (as rustls does), so a peer that asks and never
    /// reads does not fill the buffer with answers.
    answer_due: bool,
    /// [`REKEY_AFTER`] (smaller in tests).
    rekey_after: u64,
}

impl Tx {
    /// `BrokenPipe` once close_notify or a fatal alert has gone out.
    fn check_open(&self) -> io::Result<()> {
        if self.closed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "TLS connection closed",
            ));
        }
        Ok(())
    }

    /// Seals one record into the buffer, updating a TLS 1.3 key first when it is due.
    fn seal(&mut self, kernel: &Mutex<Kernel>, typ: Type, parts: &[&[u8]]) -> io::Result<()> {
        self.check_open()?;
        if self.cipher.is_tls13() {
            if self.answer_due || self.cipher.seq() >= self.rekey_after {
                self.answer_due = false;
                self.update_key(kernel)?;
            }
        } else if self.cipher.exhausted() {
            self.closed = true;
            return Err(refused(Refusal::Exhausted));
        }
        self.push(typ, parts)
    }

    /// Room for `len` more bytes at `filled`: the records not yet sent move to the front
    /// first when the buffer lacks it (so a reader that drains slowly while writers keep
    /// adding does not make the buffer grow past [`TLS_BUFFER`] and a call's records).
    fn reserve(&mut self, len: usize) {
        if self.buf.len() < self.filled + len && self.sent > 0 {
            self.buf.copy_within(self.sent..self.filled, 0);
            self.filled -= self.sent;
            self.sent = 0;
        }
        if self.buf.len() < self.filled + len {
            if self.filled == 0
                && let Some(b) = take_spare(len)
            {
                self.buf = b;
                return;
            }
            self.buf.resize(self.filled + len, 0);
        }
    }

    /// Seals one record at `filled`.
    fn push(&mut self, typ: Type, parts: &[&[u8]]) -> io::Result<()> {
        let data: usize = parts.iter().map(|p| p.len()).sum();
        let len = self.cipher.sealed_len(data);
        self.reserve(len);
        let at = self.filled;
        let n = self
            .cipher
            .seal(typ, parts, &mut self.buf[at..at + len])
            .map_err(refused)?;
        self.filled += n;
        Ok(())
    }

    /// Sends a KeyUpdate (not asking the peer for one) under the current key and moves to
    /// the next (RFC 8446 §4.6.3).
    fn update_key(&mut self, kernel: &Mutex<Kernel>) -> io::Result<()> {
        self.push(Type::Handshake, &[&[24, 0, 0, 1, 0]])?;
        let (seq, secrets) = match &mut *lock(kernel) {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.cipher = Cipher::new(rustls::ProtocolVersion::TLSv1_3, seq, secrets)
            .ok_or_else(|| io::Error::other("TLS key update gave an unknown suite"))?;
        Ok(())
    }

    /// Seals an alert (`close_notify` is 0) and closes this direction.
    fn alert(&mut self, kernel: &Mutex<Kernel>, description: u8) {
        let level = if description == 0 { 1 } else { 2 };
        let _ = self.seal(kernel, Type::Alert, &[&[level, description]]);
        self.closed = true;
    }

    /// Pushes sealed records to the socket: `Ok(true)` when all of them went.
    fn flush(&mut self, tcp: &OwnedWriteHalf) -> io::Result<bool> {
        while self.sent < self.filled {
            match tcp.try_write(&self.buf[self.sent..self.filled]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.sent = 0;
        self.filled = 0;
        if self.buf.len() > RETAIN {
            give_spare(std::mem::take(&mut self.buf));
        }
        if std::mem::take(&mut self.shutdown)
            && let Err(e) = socket2::SockRef::from(tcp.as_ref()).shutdown(std::net::Shutdown::Write)
        {
            tracing::debug!("shutdown: {e}");
        }
        Ok(true)
    }

    fn pending(&self) -> usize {
        self.filled - self.sent
    }
}

struct Shared {
    tx: Mutex<Tx>,
    tcp: OwnedWriteHalf,
    kernel: Mutex<Kernel>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// Slices of plaintext at least this long are sealed in records of their own, straight
/// from their buffer; shorter ones are gathered (copied) into records with their
/// neighbours.
const LONG: usize = 4096;

/// Most slices gathered into one record.
const PARTS: usize = 64;

/// The parts of the next record from `bufs` (at slice `i`, offset `off`), moving past them.
fn next_record<'a>(
    bufs: &'a [IoSlice<'_>],
    i: &mut usize,
    off: &mut usize,
    parts: &mut [&'a [u8]; PARTS],
) -> usize {
    let mut k = 0;
    let mut total = 0;
    while *i < bufs.len() && k < parts.len() && total < MAX_DATA {
        let rest = &bufs[*i][*off..];
        if rest.is_empty() {
            *i += 1;
            *off = 0;
            continue;
        }
        let long = rest.len() >= LONG;
        if long && k > 0 {
            break;
        }
        let n = rest.len().min(MAX_DATA - total);
        parts[k] = &rest[..n];
        k += 1;
        total += n;
        *off += n;
        if long {
            break;
        }
    }
    k
}

/// The write half of a TLS connection.
#[derive(Debug)]
pub struct TlsWrite(Arc<Shared>);

impl Sink for TlsWrite {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let sh = &*self.0;
        let mut tx = lock(&sh.tx);
        tx.flush(&sh.tcp)?;
        tx.check_open()?;
        if tx.pending() >= TLS_BUFFER {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let (mut i, mut off, mut n) = (0, 0, 0);
        // Room for every record this call may seal, made once (one allocation, no copies
        // as it grows record by record).
        let plain = bufs.iter().map(|b| b.len()).sum::<usize>();
        let plain = plain.min(TLS_BUFFER.saturating_sub(tx.pending()) + MAX_DATA);
        tx.reserve(plain + (plain / MAX_DATA + 2 * bufs.len().min(PARTS) + 1) * OVERHEAD);
        let mut parts: [&[u8]; PARTS] = [&[]; PARTS];
        while tx.pending() < TLS_BUFFER {
            let k = next_record(bufs, &mut i, &mut off, &mut parts);
            if k == 0 {
                break;
            }
            if let Err(e) = tx.seal(&sh.kernel, Type::Data, &parts[..k]) {
                // What was sealed before counts; the error comes again with the next call.
                return if n > 0 { Ok(n) } else { Err(e) };
            }
            n += parts[..k].iter().map(|p| p.len()).sum::<usize>();
        }
        match tx.flush(&sh.tcp) {
            // The records stay sealed; a failed socket fails the next call too.
            Err(e) if n == 0 => return Err(e),
            _ => {}
        }
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        lock(&self.0.tx).pending() > 0
    }
}

impl WriteHalf for TlsWrite {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if lock(&self.0.tx).flush(&self.0.tcp)? {
                return Poll::Ready(Ok(()));
            }
            match self.0.tcp.as_ref().poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
    /// Sends close_notify after the records before it, then ends the socket's write
    /// direction: at once when they all go now, else when a later flush drains them.
    fn shutdown(&self) {
        let mut tx = lock(&self.0.tx);
        if !tx.closed {
            tx.alert(&self.0.kernel, 0);
        }
        tx.shutdown = true;
        let _ = tx.flush(&self.0.tcp);
    }
    fn name(&self) -> &'static str {
        "tls"
    }
}

/// The read half of a TLS connection.
pub struct TlsRead {
    shared: Arc<Shared>,
    tcp: OwnedReadHalf,
    rx: Cipher,
    /// Ciphertext read from the socket: whole and partial records from `start` on; the
    /// current record's plaintext, opened in place, at `plain`. Freed when empty and the
    /// socket has nothing more (an idle connection keeps none), and read only when the
    /// plaintext before it is taken (a connection not being read takes no more).
    buf: Vec<u8>,
    start: usize,
    plain: std::ops::Range<usize>,
    /// Plaintext rustls decrypted during the handshake, given first.
    early: Vec<u8>,
    /// The socket ended.
    eof: bool,
    /// The peer's close_notify came: the stream has ended cleanly.
    closed: bool,
    /// An error met after this read had plaintext to give: that is given first, the error
    /// by the next read.
    failed: Option<io::Error>,
    /// The error given ended the stream: every later read gives it again (a refused record
    /// is not looked at a second time).
    dead: Option<io::ErrorKind>,
    /// Records that gave no data since the last that did ([`MAX_IDLE_RECORDS`]).
    idle: u32,
}

impl AsyncRead for TlsRead {
    /// Fills `out` with as much plaintext as the records read ahead hold (one read may span
    /// several records, as a plain TCP read spans several frames), and reads the socket only
    /// when it has given nothing yet.
    ///
    /// Each read spends the task's Tokio budget ([`super::poll_read_budgeted`]): the socket
    /// is read with `try_read`, and a publisher's reader that never yielded once held a
    /// subscriber's writer off for seconds.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        super::poll_read_budgeted(cx, |cx| self.poll_read_inner(cx, out))
    }
}

impl TlsRead {
    fn poll_read_inner(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.early.is_empty() {
            let n = self.early.len().min(out.remaining());
            out.put_slice(&self.early[..n]);
            self.early.drain(..n);
            if self.early.is_empty() {
                self.early = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        let start = out.filled().len();
        loop {
            if !self.plain.is_empty() {
                let n = self.plain.len().min(out.remaining());
                out.put_slice(&self.buf[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                if out.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let got = out.filled().len() > start;
            if self.closed {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = self.failed.take() {
                self.dead = Some(e.kind());
                self.buf = Vec::new();
                self.start = 0;
                if got {
                    self.failed = Some(e);
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(e));
            }
            if let Some(kind) = self.dead {
                if got {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(io::Error::new(kind, "TLS connection failed")));
            }
            match record::record_len(&self.buf[self.start..], self.rx.max_body()) {
                Err(r) => {
                    self.refuse(r);
                    continue;
                }
                Ok(Some(len)) if self.buf.len() - self.start >= len => {
                    let at = self.start;
                    self.start += len;
                    if let Err(r) = self.open(at, len, out) {
                        self.refuse(r);
                    }
                    continue;
                }
                Ok(_) => {}
            }
            if got {
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                if self.start < self.buf.len() {
                    // A record cut short by the end of the stream.
                    self.failed = Some(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "TLS record cut short by the end of the stream",
                    ));
                    self.start = self.buf.len();
                    continue;
                }
                // The peer closed without close_notify: an end like TCP's.
                return Poll::Ready(Ok(()));
            }
            match self.fill(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Reads the socket once into the buffer (after the partial record at its end).
    fn fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            if self.start == self.buf.len() {
                self.buf.clear();
                self.start = 0;
            } else if self.buf.capacity() - self.buf.len() < MAX_DATA + 2 * OVERHEAD {
                // Too little room left for a record: move the partial one to the front.
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let want = READ_AHEAD.max(self.rx.max_body() + 2 * OVERHEAD);
            if self.buf.capacity() < want {
                self.buf.reserve_exact(want - self.buf.len());
            }
            match self.tcp.try_read_buf(&mut self.buf) {
                Ok(0) => {
                    self.eof = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.start == self.buf.len() {
                        // Nothing more for now: an idle connection keeps no buffer.
                        self.buf = Vec::new();
                        self.start = 0;
                    }
                    match self.tcp.as_ref().poll_read_ready(cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Opens the record at `buf[at..at + len]` and acts on it. Its data is decrypted
    /// straight into `out` when `out` has room for the whole record, else in place (and
    /// copied out from there).
    fn open(&mut self, at: usize, len: usize, out: &mut ReadBuf<'_>) -> Result<(), Refusal> {
        let room = self.rx.room_for(len);
        let (typ, control) = if out.remaining() >= room {
            let dst = out.initialize_unfilled_to(room);
            let (typ, n) = self.rx.open_into(&self.buf[at..at + len], dst)?;
            self.count(typ, n)?;
            if typ == Type::Data {
                out.advance(n);
                return Ok(());
            }
            (typ, dst[..n].to_vec())
        } else {
            let (typ, r) = self.rx.open(&mut self.buf[at..at + len])?;
            let r = at + r.start..at + r.end;
            self.count(typ, r.len())?;
            if typ == Type::Data {
                self.plain = r;
                return Ok(());
            }
            (typ, self.buf[r].to_vec())
        };
        match typ {
            Type::Data => Ok(()),
            Type::Alert => self.alert(&control),
            Type::Handshake => {
                if control.is_empty() {
                    return Err(Refusal::Unexpected);
                }
                if self.handshake_message(&control)? {
                    // The peer asked for our key update: sent before our next record.
                    lock(&self.shared.tx).answer_due = true;
                }
                Ok(())
            }
            Type::ChangeCipherSpec => Err(Refusal::Unexpected),
        }
    }

    /// Counts a record that gave no data ([`MAX_IDLE_RECORDS`]); one that did resets it.
    fn count(&mut self, typ: Type, len: usize) -> Result<(), Refusal> {
        if typ == Type::Data && len > 0 {
            self.idle = 0;
        } else {
            self.idle += 1;
            if self.idle > MAX_IDLE_RECORDS {
                return Err(Refusal::Unexpected);
            }
        }
        Ok(())
    }

    /// An alert from the peer.
    fn alert(&mut self, a: &[u8]) -> Result<(), Refusal> {
        match record::read_alert(a, self.rx.is_tls13())? {
            // The clean end; what follows it is not read.
            AlertMeaning::Close => {
                self.closed = true;
                self.buf = Vec::new();
                self.start = 0;
            }
            AlertMeaning::Warning => {}
            AlertMeaning::Fatal(d) => {
                self.failed = Some(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("TLS alert {d} from the peer"),
                ));
                self.start = self.buf.len();
            }
        }
        Ok(())
    }

    /// A handshake record after the handshake: key updates (TLS 1.3) and a server's
    /// session tickets, each whole within the record. True when the peer asked for our key
    /// update (sent by the caller: the kernel lock is taken after the write half's, never
    /// before it).
    fn handshake_message(&mut self, msg: &[u8]) -> Result<bool, Refusal> {
        let msgs = record::post_handshake(msg, self.rx.is_tls13())?;
        // Each message after a record's first counts as a record with no data (a record
        // can carry hundreds of tickets).
        for _ in 1..msgs.len() {
            self.count(Type::Handshake, 0)?;
        }
        let mut answer = false;
        for m in msgs {
            let sh = &*self.shared;
            match (m, &mut *lock(&sh.kernel)) {
                (PostHandshake::Ticket(body), Kernel::Client(k)) => {
                    k.handle_new_session_ticket(body)
                        .map_err(|_| Refusal::Decode)?;
                }
                (PostHandshake::KeyUpdate { asked }, kernel) => {
                    let (seq, secrets) = match kernel {
                        Kernel::Client(k) => k.update_rx_secret(),
                        Kernel::Server(k) => k.update_rx_secret(),
                    }
                    .map_err(|_| Refusal::Unexpected)?;
                    self.rx = Cipher::new(rustls::ProtocolVersion::TLSv1_3, seq, secrets)
                        .ok_or(Refusal::Unexpected)?;
                    answer = asked;
                }
                _ => return Err(Refusal::Unexpected),
            }
        }
        Ok(answer)
    }

    /// Refuses the connection's input: the alert goes to the peer, the error to the next
    /// read once the plaintext before it is taken.
    fn refuse(&mut self, r: Refusal) {
        let sh = &*self.shared;
        {
            let mut tx = lock(&sh.tx);
            if !tx.closed {
                tx.alert(&sh.kernel, r.alert());
            }
            let _ = tx.flush(&sh.tcp);
        }
        self.failed = Some(refused(r));
        self.start = self.buf.len();
    }
}

fn invalid(path: &std::path::Path, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {e}", path.display()),
    )
}

/// The certificates of a PEM file (at least one).
pub fn load_certs(
    path: &std::path::Path,
) -> io::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(path, e))?;
    if certs.is_empty() {
        return Err(invalid(path, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

/// A client configuration (ring, safe protocol versions) trusting the CA certificates in
/// PEM file `ca`, presenting `client_cert` (chain and key, PEM) to servers that ask.
pub fn client_config(
    ca: &std::path::Path,
    client_cert: Option<(&std::path::Path, &std::path::Path)>,
) -> io::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in load_certs(ca)? {
        roots.add(c).map_err(|e| invalid(ca, e))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(io::Error::other)?
    .with_root_certificates(roots);
    let config = match client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = load_certs(cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid(key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(io::Error::other)?
        }
    };
    let mut config = config;
    // The record layer after the handshake is this module's (see the module's docs).
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

/// The fuzz target `tls_records`' entry: the record layer's reading of any input
/// (`record::fuzz` says how the input is read).
#[doc(hidden)]
pub fn fuzz_records(data: &[u8]) {
    record::fuzz(data);
}

fn rekey_after() -> u64 {
    #[cfg(test)]
    if let n @ 1.. = tests::REKEY_AFTER.load(std::sync::atomic::Ordering::Relaxed) {
        return n;
    }
    REKEY_AFTER
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
}

/// The connection after its handshake, as transport halves.
fn split(tcp: TcpStream, done: handshake::Done) -> io::Result<(Reader, Writer)> {
    let unknown = || io::Error::new(io::ErrorKind::InvalidData, "TLS suite not supported");
    let (tx_seq, tx_secrets) = done.secrets.tx;
    let (rx_seq, rx_secrets) = done.secrets.rx;
    let tx = Cipher::new(done.version, tx_seq, tx_secrets).ok_or_else(unknown)?;
    let rx = Cipher::new(done.version, rx_seq, rx_secrets).ok_or_else(unknown)?;
    let (r, w) = tcp.into_split();
    let shared = Arc::new(Shared {
        tx: Mutex::new(Tx {
            cipher: tx,
            buf: Vec::new(),
            filled: 0,
            sent: 0,
            closed: false,
            shutdown: false,
            answer_due: false,
            rekey_after: rekey_after(),
        }),
        tcp: w,
        kernel: Mutex::new(done.kernel),
    });
    Ok((
        Box::new(TlsRead {
            shared: shared.clone(),
            tcp: r,
            rx,
            buf: done.rest,
            start: 0,
            plain: 0..0,
            early: done.early,
            eof: false,
            closed: false,
            failed: None,
            dead: None,
            idle: 0,
        }),
        Arc::new(TlsWrite(shared)),
    ))
}

/// The server side of a TLS handshake on `tcp` (within `deadline`), then the connection as
/// transport halves, with the client's certificate chain if it sent one.
pub async fn accept(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    deadline: Duration,
) -> io::Result<(
    Reader,
    Writer,
    Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
)> {
    // The keys are taken out after the handshake; no early data (0-RTT) is taken.
    let config = if config.enable_secret_extraction && config.max_early_data_size == 0 {
        config
    } else {
        let mut c = (*config).clone();
        c.enable_secret_extraction = true;
        c.max_early_data_size = 0;
        Arc::new(c)
    };
    let conn = rustls::server::UnbufferedServerConnection::new(config)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let mut done = tokio::time::timeout(deadline, handshake::drive(&tcp, conn))
        .await
        .map_err(|_| timed_out())??;
    let certs = done.peer_certificates.take();
    let (r, w) = split(tcp, done)?;
    Ok((r, w, certs))
}

/// The client side of a TLS handshake with `server_name` on `tcp` (within `deadline`), then
/// the connection as transport halves.
pub async fn connect(
    tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
    server_name: rustls::pki_types::ServerName<'static>,
    deadline: Duration,
) -> io::Result<(Reader, Writer)> {
    let config = if config.enable_secret_extraction {
        config
    } else {
        let mut c = (*config).clone();
        c.enable_secret_extraction = true;
        Arc::new(c)
    };
    let conn = rustls::client::UnbufferedClientConnection::new(config, server_name)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let done = tokio::time::timeout(deadline, handshake::drive(&tcp, conn))
        .await
        .map_err(|_| timed_out())??;
    split(tcp, done)
}
