//! The TLS handshake, driven over rustls' unbuffered API so that this side owns the bytes:
//! once rustls reports the handshake done, the ciphertext it has not processed (records the
//! peer sent right after its Finished) and any plaintext it decrypted on the way are handed
//! to the read half, and the traffic keys are taken out of rustls
//! (`dangerous_into_kernel_connection`) for [`super::record`].

use std::io;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ExtractedSecrets, ProtocolVersion};
use tokio::net::TcpStream;

/// Most handshake ciphertext held at once: a handshake message (a certificate chain) may
/// span records and is joined in this buffer, up to rustls' own limit of 64 KiB.
const MAX_HANDSHAKE_BUFFER: usize = 72 * 1024;

/// One side's connection during the handshake.
pub(super) trait Handshaking: Send {
    type Data;
    fn common(&self) -> &rustls::CommonState;
    fn process<'c, 'i>(&'c mut self, buf: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

/// What rustls keeps after the handshake: it computes the next keys of a TLS 1.3 key update
/// and takes the session tickets a server sends.
pub(super) enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Handshaking for UnbufferedServerConnection {
    type Data = ServerConnectionData;
    fn common(&self) -> &rustls::CommonState {
        self
    }
    fn process<'c, 'i>(&'c mut self, buf: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(buf)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Server(k)))
    }
}

impl Handshaking for UnbufferedClientConnection {
    type Data = ClientConnectionData;
    fn common(&self) -> &rustls::CommonState {
        self
    }
    fn process<'c, 'i>(&'c mut self, buf: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(buf)
    }
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection()
            .map(|(s, k)| (s, Kernel::Client(k)))
    }
}

/// A finished handshake.
pub(super) struct Done {
    pub version: ProtocolVersion,
    pub secrets: ExtractedSecrets,
    pub kernel: Kernel,
    /// Ciphertext read past the handshake, not yet processed.
    pub rest: Vec<u8>,
    /// Plaintext rustls decrypted from records after the handshake's last.
    pub early: Vec<u8>,
    pub peer_certificates: Option<Vec<rustls::pki_types::CertificateDer<'static>>>,
}

fn invalid(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Encodes one `EncodeTlsData` into `out`, growing it as rustls asks.
fn encode(
    out: &mut Vec<u8>,
    mut f: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>,
) -> io::Result<()> {
    let at = out.len();
    out.resize(at + 4096, 0);
    let n = match f(&mut out[at..]) {
        Ok(n) => n,
        Err(EncodeError::InsufficientSize(s)) => {
            out.resize(at + s.required_size, 0);
            f(&mut out[at..]).map_err(invalid)?
        }
        Err(e) => return Err(invalid(e)),
    };
    out.truncate(at + n);
    Ok(())
}

async fn send(tcp: &TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    let mut at = 0;
    while at < out.len() {
        tcp.writable().await?;
        match tcp.try_write(&out[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    out.clear();
    Ok(())
}

/// Sends what rustls queued after an error (its alert), without waiting for the socket.
/// `buf` is the handshake's buffer as the failed call left it (rustls keeps offsets into it).
fn send_alert<C: Handshaking>(conn: &mut C, buf: &mut [u8], tcp: &TcpStream) {
    let mut out = Vec::new();
    for _ in 0..4 {
        match conn.process(buf).state {
            Ok(ConnectionState::EncodeTlsData(mut e)) => {
                if encode(&mut out, |b| e.encode(b)).is_err() {
                    break;
                }
            }
            Ok(ConnectionState::TransmitTlsData(t)) => t.done(),
            _ => break,
        }
    }
    let _ = tcp.try_write(&out);
}

/// The end of the first whole record in `buf` after `from`, if it is all there.
fn next_record_end(buf: &[u8], from: usize) -> Option<usize> {
    let h = buf.get(from..from + 5)?;
    let end = from + 5 + u16::from_be_bytes([h[3], h[4]]) as usize;
    (end <= buf.len()).then_some(end)
}

/// Runs the handshake of `conn` on `tcp` to its end (the caller bounds it in time).
///
/// rustls is shown one more whole record at a time (`buf[..given]`), and no more once the
/// handshake is over: it would process every record it is given, and what it does with
/// records after the handshake (a key update it answers, a close_notify) would be lost when
/// its keys are taken out. Those records stay in `buf` for the record layer.
pub(super) async fn drive<C: Handshaking>(tcp: &TcpStream, mut conn: C) -> io::Result<Done> {
    let mut buf: Vec<u8> = Vec::new();
    let mut given = 0;
    // Set once the input is not TLS records: from then on rustls is given all of it.
    let mut raw = false;
    let mut out: Vec<u8> = Vec::new();
    let mut early: Vec<u8> = Vec::new();
    loop {
        let (discard, step) = {
            let UnbufferedStatus { discard, state } = conn.process(&mut buf[..given]);
            let step = match state {
                Err(e) => Err(e),
                Ok(ConnectionState::ReadTraffic(mut r)) => {
                    while let Some(rec) = r.next_record() {
                        early.extend_from_slice(rec.map_err(invalid)?.payload);
                    }
                    Ok(Step::Again)
                }
                Ok(ConnectionState::EncodeTlsData(mut e)) => {
                    encode(&mut out, |b| e.encode(b))?;
                    Ok(Step::Again)
                }
                Ok(ConnectionState::TransmitTlsData(t)) => {
                    t.done();
                    Ok(Step::Send)
                }
                Ok(ConnectionState::BlockedHandshake) => Ok(Step::Read),
                // A TLS 1.3 server may send before the client's Finished: not done yet.
                Ok(ConnectionState::WriteTraffic(_)) => Ok(Step::Traffic),
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the TLS handshake",
                    ));
                }
                Ok(_) => return Err(invalid("unexpected TLS handshake state")),
            };
            (discard, step)
        };
        buf.drain(..discard);
        given -= discard;
        let step = match step {
            Ok(s) => s,
            Err(e) => {
                send_alert(&mut conn, &mut buf[..given], tcp);
                return Err(invalid(e));
            }
        };
        match step {
            Step::Again => {}
            Step::Send => send(tcp, &mut out).await?,
            Step::Traffic if !conn.common().is_handshaking() => break,
            Step::Read | Step::Traffic => {
                if raw {
                    if given < buf.len() {
                        given = buf.len();
                        continue;
                    }
                } else if let Some(end) = next_record_end(&buf, given) {
                    given = end;
                    continue;
                }
                if super::record::record_len(&buf[given..], super::record::MAX_DATA + 2048).is_err()
                {
                    // Not a TLS record (an HTTP request, say): rustls sees it at once and
                    // refuses it with its alert, not after the record's announced length.
                    raw = true;
                    given = buf.len();
                    continue;
                }
                if buf.len() >= MAX_HANDSHAKE_BUFFER {
                    return Err(invalid("TLS handshake message too large"));
                }
                buf.reserve(16 * 1024);
                tcp.readable().await?;
                match tcp.try_read_buf(&mut buf) {
                    Ok(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the peer closed the TLS handshake",
                        ));
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    send(tcp, &mut out).await?;
    let version = conn
        .common()
        .protocol_version()
        .ok_or_else(|| invalid("TLS handshake ended without a version"))?;
    let peer_certificates = conn.common().peer_certificates().map(<[_]>::to_vec);
    let (secrets, kernel) = conn.into_kernel().map_err(invalid)?;
    Ok(Done {
        version,
        secrets,
        kernel,
        rest: buf,
        early,
        peer_certificates,
    })
}

enum Step {
    Again,
    Send,
    Read,
    Traffic,
}
