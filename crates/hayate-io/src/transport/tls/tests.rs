//! The record layer against rustls' own, both ways round: every suite of both versions,
//! key updates asked for by the peer and started by this side, a server's session tickets,
//! and a clean close.

use std::io::{self, Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use rustls::crypto::aws_lc_rs::cipher_suite as cs;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};
use tokio::io::AsyncReadExt;

/// Records this side sends per key in tests (0: [`super::REKEY_AFTER`]).
pub(super) static REKEY_AFTER: AtomicU64 = AtomicU64::new(0);

fn provider(suite: SupportedCipherSuite) -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    p.cipher_suites = vec![suite];
    Arc::new(p)
}

struct Certs {
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

fn certs() -> Certs {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Certs {
        cert: c.cert.der().clone(),
        key: PrivateKeyDer::Pkcs8(c.signing_key.serialize_der().into()),
    }
}

fn server_config(
    c: &Certs,
    suite: SupportedCipherSuite,
    v: &'static SupportedProtocolVersion,
) -> Arc<rustls::ServerConfig> {
    let cfg = rustls::ServerConfig::builder_with_provider(provider(suite))
        .with_protocol_versions(&[v])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![c.cert.clone()], c.key.clone_key())
        .unwrap();
    // Session tickets stay on (rustls sends two after a TLS 1.3 handshake).
    Arc::new(cfg)
}

fn client_config(
    c: &Certs,
    suite: SupportedCipherSuite,
    v: &'static SupportedProtocolVersion,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.cert.clone()).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider(suite))
            .with_protocol_versions(&[v])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn pattern(n: usize, k: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(k) % 251) as u8)
        .collect()
}

/// One read of the socket into `conn` (nothing after a short timeout is fine): false at the
/// end of the stream.
fn read_some(conn: &mut rustls::Connection, tcp: &mut std::net::TcpStream) -> bool {
    match conn.read_tls(tcp) {
        Ok(0) => false,
        Ok(_) => {
            conn.process_new_packets().unwrap();
            true
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            true
        }
        Err(e) => panic!("{e}"),
    }
}

/// The rustls end, blocking, on its own thread: sends `send` in pieces of many sizes
/// (asking for a key update three times along the way, in TLS 1.3) while taking what the
/// other side sends, until it has `expect` bytes; then closes with close_notify.
fn rustls_peer(
    mut conn: rustls::Connection,
    mut tcp: std::net::TcpStream,
    send: Vec<u8>,
    expect: usize,
) -> Vec<u8> {
    tcp.set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap();
    conn.set_buffer_limit(None);
    let mut got = Vec::new();
    let mut at = 0;
    let mut updates = 0;
    let sizes = [1usize, 700, 20_000, 5, 70_000, 16_384];
    let mut buf = vec![0u8; 100_000];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while at < send.len() || got.len() < expect || conn.is_handshaking() {
        assert!(
            std::time::Instant::now() < deadline,
            "stuck: sent {at}, got {}",
            got.len()
        );
        if !conn.is_handshaking() && at < send.len() {
            let end = (at + sizes[at % sizes.len()]).min(send.len());
            if let Err(e) = conn.writer().write_all(&send[at..end]) {
                panic!("{e}: sent {at}, {:?}", conn.process_new_packets());
            }
            at = end;
            let tls13 = conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
            if tls13 && updates < 3 && at * 4 > send.len() * (updates + 1) {
                conn.refresh_traffic_keys().unwrap();
                updates += 1;
            }
        }
        while conn.wants_write() {
            conn.write_tls(&mut tcp).unwrap();
        }
        if !read_some(&mut conn, &mut tcp) {
            break;
        }
        loop {
            match conn.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    let tls13 = conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3);
    assert_eq!(updates, if tls13 { 3 } else { 0 }, "key updates asked for");
    conn.send_close_notify();
    while conn.wants_write() {
        conn.write_tls(&mut tcp).unwrap();
    }
    // Then read to the other side's close_notify and end of stream: closing with its
    // records unread would reset the connection under them.
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no end after close_notify"
        );
        if !read_some(&mut conn, &mut tcp) {
            break;
        }
    }
    got
}

/// This side: sends `send` through the write half while reading everything from the read
/// half to its clean end.
async fn hayate_side(r: super::Reader, w: super::Writer, send: Vec<u8>) -> Vec<u8> {
    let writer = tokio::spawn(async move {
        let mut q = std::collections::VecDeque::new();
        for (i, c) in send.chunks(33_000).enumerate() {
            // A long chunk sealed straight from its buffer, short ones gathered.
            if i % 2 == 0 {
                q.push_back(bytes::Bytes::copy_from_slice(c));
            } else {
                q.extend(c.chunks(300).map(bytes::Bytes::copy_from_slice));
            }
        }
        crate::transport::write_chunks(&*w, &mut q).await.unwrap();
        std::future::poll_fn(|cx| w.poll_write_ready(cx))
            .await
            .unwrap();
        w
    });
    let mut r = r;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 50_000];
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let w = writer.await.unwrap();
    w.shutdown();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_suite_interoperates_with_rustls_through_key_updates_and_tickets() {
    // This side updates its own key every 8 records.
    REKEY_AFTER.store(8, std::sync::atomic::Ordering::Relaxed);
    let c = certs();
    let v13 = &rustls::version::TLS13;
    let v12 = &rustls::version::TLS12;
    let cases = [
        (cs::TLS13_AES_128_GCM_SHA256, v13),
        (cs::TLS13_AES_256_GCM_SHA384, v13),
        (cs::TLS13_CHACHA20_POLY1305_SHA256, v13),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, v12),
        (cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, v12),
        (cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, v12),
    ];
    let ours = pattern(600_000, 7);
    let theirs = pattern(500_000, 13);
    for (suite, v) in cases {
        for hayate_is_server in [true, false] {
            let what = format!(
                "{:?} {:?}, hayate server: {hayate_is_server}",
                suite.suite(),
                v.version
            );
            eprintln!("{what}");
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let (sc, cc) = (server_config(&c, suite, v), client_config(&c, suite, v));
            let (t, o) = (theirs.clone(), ours.len());
            let name = ServerName::try_from("localhost").unwrap();
            let (peer_got, our_got) = if hayate_is_server {
                let peer = std::thread::spawn(move || {
                    let tcp = std::net::TcpStream::connect(addr).unwrap();
                    let conn = rustls::ClientConnection::new(cc, name).unwrap();
                    rustls_peer(conn.into(), tcp, t, o)
                });
                let (s, _) = l.accept().await.unwrap();
                let (r, w, _) = super::accept(s, sc, Duration::from_secs(5)).await.unwrap();
                let got = hayate_side(r, w, ours.clone()).await;
                (
                    tokio::task::spawn_blocking(move || peer.join().unwrap())
                        .await
                        .unwrap(),
                    got,
                )
            } else {
                let peer = std::thread::spawn(move || {
                    let l = l.into_std().unwrap();
                    l.set_nonblocking(false).unwrap();
                    let (tcp, _) = l.accept().unwrap();
                    tcp.set_nonblocking(false).unwrap();
                    let conn = rustls::ServerConnection::new(sc).unwrap();
                    rustls_peer(conn.into(), tcp, t, o)
                });
                let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (r, w) = super::connect(tcp, cc, name, Duration::from_secs(5))
                    .await
                    .unwrap();
                let got = hayate_side(r, w, ours.clone()).await;
                (
                    tokio::task::spawn_blocking(move || peer.join().unwrap())
                        .await
                        .unwrap(),
                    got,
                )
            };
            assert!(
                peer_got == ours,
                "{what}: rustls got {} of {}",
                peer_got.len(),
                ours.len()
            );
            assert!(
                our_got == theirs,
                "{what}: hayate got {} of {}",
                our_got.len(),
                theirs.len()
            );
        }
    }
}

/// A client that finishes a TLS 1.3 handshake with rustls and then writes records of its
/// own making under the live key: `(socket, sending cipher, receiving cipher)`.
fn raw_client(
    addr: std::net::SocketAddr,
    c: &Certs,
) -> (std::net::TcpStream, super::Cipher, super::Cipher) {
    let mut cfg =
        (*client_config(c, cs::TLS13_AES_128_GCM_SHA256, &rustls::version::TLS13)).clone();
    cfg.enable_secret_extraction = true;
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    while conn.wants_write() {
        conn.write_tls(&mut tcp).unwrap();
    }
    let s = conn.dangerous_extract_secrets().unwrap();
    let v = rustls::ProtocolVersion::TLSv1_3;
    (
        tcp,
        super::Cipher::new(v, s.tx.0, s.tx.1).unwrap(),
        super::Cipher::new(v, s.rx.0, s.rx.1).unwrap(),
    )
}

fn record(tx: &mut super::Cipher, typ: super::Type, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; tx.sealed_len(data.len())];
    let n = tx.seal(typ, &[data], &mut out).unwrap();
    out.truncate(n);
    out
}

/// The alert the server sent, if any, among the records it wrote before closing.
fn alert_from(tcp: &mut std::net::TcpStream, rx: &mut super::Cipher) -> Option<u8> {
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut all = Vec::new();
    let _ = tcp.read_to_end(&mut all);
    let mut at = 0;
    while let Ok(Some(len)) = super::record::record_len(&all[at..], rx.max_body()) {
        if at + len > all.len() {
            break;
        }
        let (typ, r) = rx.open(&mut all[at..at + len]).ok()?;
        if typ == super::Type::Alert {
            return Some(all[at..][r][1]);
        }
        at += len;
    }
    None
}

/// Hostile records after a good handshake, each on its own connection: the read half gives
/// the data before them, then an error (again at every later read), and sends the peer the
/// alert rustls would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_records_after_the_handshake_are_refused() {
    use super::Type::{Alert, ChangeCipherSpec, Data, Handshake};
    let c = certs();
    let mut sc =
        (*server_config(&c, cs::TLS13_AES_128_GCM_SHA256, &rustls::version::TLS13)).clone();
    sc.send_tls13_tickets = 0;
    let sc = Arc::new(sc);
    // (what the client sends after "hello", the alert expected back)
    type Make = fn(&mut super::Cipher) -> Vec<u8>;
    let cases: [(&str, Make, Option<u8>); 9] = [
        // Records that give no data (key updates, empty records, warnings) share one count.
        (
            "a flood of user_canceled warnings",
            |tx| (0..40).flat_map(|_| record(tx, Alert, &[1, 90])).collect(),
            Some(10),
        ),
        (
            "a flood of empty records",
            |tx| (0..40).flat_map(|_| record(tx, Data, &[])).collect(),
            Some(10),
        ),
        ("a fatal alert", |tx| record(tx, Alert, &[2, 40]), None),
        (
            "a change_cipher_spec inside",
            |tx| record(tx, ChangeCipherSpec, &[1]),
            Some(10),
        ),
        (
            "a key update not ending its record",
            |tx| record(tx, Handshake, &[24, 0, 0, 1, 0, 24, 0, 0, 1, 0]),
            Some(10),
        ),
        (
            "an empty handshake record",
            |tx| record(tx, Handshake, &[]),
            Some(10),
        ),
        // Bodies too short to hold a tag: framed, then refused before any decryption.
        (
            "a record with an empty body",
            |_| vec![23, 3, 3, 0, 0],
            Some(50),
        ),
        (
            "a record shorter than a tag",
            |_| [&[23u8, 3, 3, 0, 15][..], &[0; 15]].concat(),
            Some(50),
        ),
        (
            "a key update with an undefined value",
            |tx| record(tx, Handshake, &[24, 0, 0, 1, 7]),
            Some(47),
        ),
    ];
    for (what, make, alert) in cases {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let c2 = Certs {
            cert: c.cert.clone(),
            key: c.key.clone_key(),
        };
        let client = std::thread::spawn(move || {
            let (mut tcp, mut tx, mut rx) = raw_client(addr, &c2);
            let mut bytes = record(&mut tx, Data, b"hello");
            bytes.extend(make(&mut tx));
            tcp.write_all(&bytes).unwrap();
            alert_from(&mut tcp, &mut rx)
        });
        let (s, _) = l.accept().await.unwrap();
        let (mut r, w, _) = super::accept(s, sc.clone(), Duration::from_secs(5))
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        let err = loop {
            let read = tokio::time::timeout(Duration::from_secs(10), r.read(&mut buf));
            match read.await.unwrap_or_else(|_| panic!("{what}: not refused")) {
                Ok(0) => panic!("{what}: a clean end"),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => break e,
            }
        };
        assert_eq!(got, b"hello", "{what}");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
        // Refused for good: the next read fails too.
        assert!(r.read(&mut buf).await.is_err(), "{what}: read again");
        drop((r, w));
        let sent = tokio::task::spawn_blocking(move || client.join().unwrap())
            .await
            .unwrap();
        assert_eq!(sent, alert, "{what}: the alert sent");
    }
}
