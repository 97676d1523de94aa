//! TLS over TCP as a transport: the read half decrypts, the shared write half encrypts, both
//! around one rustls connection behind a mutex (held only for the non-blocking calls, never
//! across an `.await`). The handshake is done first with tokio-rustls ([`accept`],
//! [`connect`]), with a deadline; then the connection and the socket are split like plain TCP.
//!
//! Writes follow the transport contract: [`WriteHalf`]'s `try_write_vectored` hands plaintext
//! to rustls only while its outgoing buffer is below [`TLS_BUFFER`] (past it: `WouldBlock`),
//! and pushes the ciphertext to the socket without blocking; `poll_write_ready` waits for the
//! socket until that buffer has drained. So a client that stops reading holds at most
//! `TLS_BUFFER` bytes of ciphertext here, beyond the outbox's own budget.

use std::io::{self, BufRead as _, IoSlice, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::{Reader, WriteHalf, Writer};
use crate::sink::Sink;

pub use tokio_rustls::rustls;

/// Ciphertext the write half lets rustls hold before it reports `WouldBlock`.
pub const TLS_BUFFER: usize = 256 * 1024;

struct Shared {
    conn: Mutex<rustls::Connection>,
    tcp: OwnedWriteHalf,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

fn lock(m: &Mutex<rustls::Connection>) -> MutexGuard<'_, rustls::Connection> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `io::Write` over the socket's non-blocking writes.
struct SockW<'a>(&'a OwnedWriteHalf);
impl Write for SockW<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.try_write(b)
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Pushes rustls' pending ciphertext to the socket: `Ok(true)` when all of it went.
fn flush(conn: &mut rustls::Connection, tcp: &OwnedWriteHalf) -> io::Result<bool> {
    while conn.wants_write() {
        match conn.write_tls(&mut SockW(tcp)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The write half of a TLS connection.
#[derive(Debug)]
pub struct TlsWrite(Arc<Shared>);

impl Sink for TlsWrite {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut c = lock(&self.0.conn);
        flush(&mut c, &self.0.tcp)?;
        let n = c.writer().write_vectored(bufs)?;
        flush(&mut c, &self.0.tcp)?;
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn pending(&self) -> bool {
        lock(&self.0.conn).wants_write()
    }
}

impl WriteHalf for TlsWrite {
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            {
                let mut c = lock(&self.0.conn);
                if flush(&mut c, &self.0.tcp)? {
                    return Poll::Ready(Ok(()));
                }
            }
            match self.0.tcp.as_ref().poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
    fn shutdown(&self) {
        {
            let mut c = lock(&self.0.conn);
            c.send_close_notify();
            let _ = flush(&mut c, &self.0.tcp);
        }
        if let Err(e) =
            socket2::SockRef::from(self.0.tcp.as_ref()).shutdown(std::net::Shutdown::Write)
        {
            tracing::debug!("shutdown: {e}");
        }
    }
    fn name(&self) -> &'static str {
        "tls"
    }
}

/// The read half of a TLS connection.
pub struct TlsRead {
    shared: Arc<Shared>,
    tcp: OwnedReadHalf,
    eof: bool,
    /// Ciphertext read from the socket and not yet handed to rustls (from `pos` on). rustls
    /// reads at most 4 KiB from a socket per call, so a busy connection made a `recv` per
    /// 4 KiB; this reads up to [`READ_AHEAD`] per `recv` and feeds rustls from memory. It is
    /// freed as soon as rustls has taken all of it, so a connection that is not being read
    /// holds only ciphertext it has not fed yet, and an idle one none.
    cipher: Vec<u8>,
    pos: usize,
    /// An error met after this read had plaintext to give: that is given first, the
    /// error by the next read.
    failed: Option<io::Error>,
}

/// The most ciphertext one `recv` takes from the socket.
const READ_AHEAD: usize = 64 * 1024;

impl AsyncRead for TlsRead {
    /// Fills `out` with as much plaintext as rustls and the ciphertext read ahead hold (one
    /// read may span several records, as a plain TCP read spans several frames), and reads
    /// the socket only when it has given nothing yet.
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
        let this = self;
        if let Some(e) = this.failed.take() {
            return Poll::Ready(Err(e));
        }
        let start = out.filled().len();
        loop {
            if out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut c = lock(&this.shared.conn);
            // Copied from rustls' own buffer into the unfilled part of `out`, which is
            // neither zeroed first nor read.
            let r = {
                let mut rd = c.reader();
                rd.fill_buf()
                    .map(|chunk| {
                        let n = chunk.len().min(out.remaining());
                        out.put_slice(&chunk[..n]);
                        n
                    })
                    .inspect(|&n| rd.consume(n))
            };
            match r {
                // 0: the peer's close_notify (a clean end, given by the next read when this
                // one has data).
                Ok(0) => return Poll::Ready(Ok(())),
                Ok(_) => continue,
                Err(e) => {
                    // No plaintext left: an error met while decrypting ends the read now
                    // (after the plaintext of the good records before it).
                    if let Some(f) = this.failed.take() {
                        drop(c);
                        let got = out.filled().len() > start;
                        return this.fail(got, f);
                    }
                    match e.kind() {
                        io::ErrorKind::WouldBlock => {}
                        // The peer closed without close_notify: an end like TCP's.
                        io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(())),
                        _ => return Poll::Ready(Err(e)),
                    }
                }
            }
            let got = out.filled().len() > start;
            if this.pos < this.cipher.len() {
                // Feed rustls what an earlier `recv` brought.
                let mut rest = &this.cipher[this.pos..];
                match c.read_tls(&mut rest) {
                    // rustls takes nothing after the peer's close_notify: what follows it is
                    // not read.
                    Ok(0) => {
                        this.eof = true;
                        this.pos = this.cipher.len();
                    }
                    Ok(n) => this.pos += n,
                    Err(e) => {
                        // Given once the plaintext rustls holds is read (loop top).
                        this.failed = Some(e);
                        continue;
                    }
                }
                if this.pos == this.cipher.len() {
                    // All of it fed: freed now, not kept while the connection is not
                    // read (a connection held back by the memory budget, say).
                    this.cipher = Vec::new();
                    this.pos = 0;
                }
            } else if got || this.eof {
                return Poll::Ready(Ok(()));
            } else {
                if this.cipher.capacity() < READ_AHEAD {
                    this.cipher.reserve_exact(READ_AHEAD);
                }
                match this.tcp.try_read_buf(&mut this.cipher) {
                    Ok(0) => {
                        // Tell rustls the stream ended (a read of nothing).
                        this.eof = true;
                        c.read_tls(&mut io::empty())?;
                    }
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        // Nothing more for now: an idle connection keeps no buffer.
                        this.cipher = Vec::new();
                        drop(c);
                        match this.tcp.as_ref().poll_read_ready(cx) {
                            Poll::Ready(Ok(())) => continue,
                            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                            Poll::Pending => return Poll::Pending,
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            // After the peer's close_notify, the next read gives the clean end (0).
            if let Err(e) = c.process_new_packets() {
                // Send the alert rustls queued for the peer; the error is given once the
                // plaintext of the records before the bad one is read (loop top).
                let _ = flush(&mut c, &this.shared.tcp);
                this.failed = Some(io::Error::new(io::ErrorKind::InvalidData, e));
                continue;
            }
            // Answers rustls owes the peer (key updates, tickets): best effort here, the
            // writer pushes the rest.
            let _ = flush(&mut c, &this.shared.tcp);
        }
    }

    /// Ends a read with error `e`: at once when it has no plaintext (`got` false), else
    /// after the plaintext it has, at the next read.
    fn fail(&mut self, got: bool, e: io::Error) -> Poll<io::Result<()>> {
        if got {
            self.failed = Some(e);
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(Err(e))
    }
}

fn split(tcp: TcpStream, mut conn: rustls::Connection) -> (Reader, Writer) {
    conn.set_buffer_limit(Some(TLS_BUFFER));
    let (r, w) = tcp.into_split();
    let shared = Arc::new(Shared {
        conn: Mutex::new(conn),
        tcp: w,
    });
    (
        Box::new(TlsRead {
            shared: shared.clone(),
            tcp: r,
            eof: false,
            cipher: Vec::new(),
            pos: 0,
            failed: None,
        }),
        Arc::new(TlsWrite(shared)),
    )
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
    Ok(Arc::new(config))
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
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
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let s = tokio::time::timeout(deadline, acceptor.accept(tcp))
        .await
        .map_err(|_| timed_out())??;
    let (tcp, conn) = s.into_inner();
    let certs = conn.peer_certificates().map(<[_]>::to_vec);
    let (r, w) = split(tcp, rustls::Connection::Server(conn));
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
    let connector = tokio_rustls::TlsConnector::from(config);
    let s = tokio::time::timeout(deadline, connector.connect(server_name, tcp))
        .await
        .map_err(|_| timed_out())??;
    let (tcp, conn) = s.into_inner();
    Ok(split(tcp, rustls::Connection::Client(conn)))
}
