//! TLS listeners: the native protocol over TLS with the client library (small and large
//! messages both ways), a client that does not trust the server's CA, client certificates
//! naming the user (`tls.cert_user`), a reload, and hostile handshakes (garbage, silence)
//! cut off within the handshake timeout while a TLS client carries on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::within;
use hayate_client::{Client, ConnectOptions, Key};
use hayate_server::config::UserConfig;
use hayate_server::{Config, Protocol, Server};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Files {
    dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    alice_cert: PathBuf,
    alice_key: PathBuf,
    other_ca: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, text: String) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A CA, a server certificate for localhost / 127.0.0.1, a client certificate with CN alice,
/// and an unrelated CA.
fn files(tag: &str) -> Files {
    let dir = std::env::temp_dir().join(format!("hayate-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "hayate test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let alice_key = KeyPair::generate().unwrap();
    let mut ap = CertificateParams::new(Vec::<String>::new()).unwrap();
    ap.distinguished_name.push(DnType::CommonName, "alice");
    ap.distinguished_name
        .push(DnType::OrganizationName, "hayate tests");
    let alice = ap.signed_by(&alice_key, &issuer).unwrap();
    let other_key = KeyPair::generate().unwrap();
    let mut op = CertificateParams::new(Vec::<String>::new()).unwrap();
    op.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other = op.self_signed(&other_key).unwrap();
    Files {
        ca: write(&dir, "ca.pem", ca_cert.pem()),
        cert: write(&dir, "server.pem", server.pem()),
        key: write(&dir, "server.key", server_key.serialize_pem()),
        alice_cert: write(&dir, "alice.pem", alice.pem()),
        alice_key: write(&dir, "alice.key", alice_key.serialize_pem()),
        other_ca: write(&dir, "other.pem", other.pem()),
        dir,
    }
}

/// A broker with a plain and a TLS native listener; returns (plain, tls) addresses.
async fn start(config: Config) -> (String, String, tokio::sync::oneshot::Sender<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (plain, tls) = (
        l.local_addr().unwrap().to_string(),
        t.local_addr().unwrap().to_string(),
    );
    let mut config = config;
    config.server.data_dir.clear();
    config.validate().unwrap();
    let server = Server::from_listeners(
        vec![(l, Protocol::Native), (t, Protocol::NativeTls)],
        &config,
    );
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    (plain, tls, tx)
}

fn tls_config(f: &Files) -> Config {
    let mut c = Config::default();
    c.tls.cert = f.cert.display().to_string();
    c.tls.key = f.key.display().to_string();
    c
}

#[tokio::test]
async fn the_native_protocol_runs_over_tls() {
    let f = files("native");
    let (plain, tls, _stop) = start(tls_config(&f)).await;
    let opts = || ConnectOptions::default().tls_ca(&f.ca);
    let sub = Client::connect_with(&format!("tls://{tls}"), opts())
        .await
        .unwrap();
    let mut s = sub.subscribe("t/**").await.unwrap();
    sub.flush().await.unwrap();
    // A TLS publisher and a plain one reach the TLS subscriber; payloads up to 4 MiB (past
    // the 256 KiB ciphertext buffer of the write half).
    let p = Client::connect_with(
        &format!("tls://localhost:{}", tls.rsplit_once(':').unwrap().1),
        opts(),
    )
    .await
    .unwrap();
    let q = Client::connect(&plain).await.unwrap();
    let sizes = [0usize, 1, 1000, 70_000, 4 << 20];
    for (i, n) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..*n).map(|j| (j * 7 + i) as u8).collect();
        let c = if i % 2 == 0 { &p } else { &q };
        c.publish(&Key::new(&format!("t/{i}")).unwrap(), body)
            .await
            .unwrap();
    }
    p.flush().await.unwrap();
    q.flush().await.unwrap();
    // (Two publishers: no order between them.)
    let mut got = Vec::new();
    for _ in &sizes {
        got.push(within(20, s.next()).await.unwrap());
    }
    got.sort_by(|a, b| a.key.as_str().cmp(b.key.as_str()));
    for (i, n) in sizes.iter().enumerate() {
        let m = &got[i];
        assert_eq!(m.key.as_str(), format!("t/{i}"));
        assert_eq!(m.payload.len(), *n);
        assert!(
            m.payload
                .iter()
                .enumerate()
                .all(|(j, b)| *b == (j * 7 + i) as u8)
        );
    }
    // A request/reply over TLS.
    let mut svc = sub.subscribe("svc").await.unwrap();
    sub.flush().await.unwrap();
    let server = tokio::spawn(async move {
        let r = svc.next().await.unwrap();
        sub.reply(&r, "pong").await.unwrap();
        sub.flush().await.unwrap();
        sub
    });
    let r = within(
        10,
        p.request(&Key::new("svc").unwrap(), "ping", Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(&r.payload[..], b"pong");
    let _ = server.await;
    // A client that does not trust the server's CA fails the handshake.
    let bad = Client::connect_with(
        &format!("tls://{tls}"),
        ConnectOptions::default().tls_ca(&f.other_ca),
    )
    .await;
    assert!(bad.is_err());
    // And tls:// without a CA is refused by the library with a reason.
    match Client::connect(&format!("tls://{tls}")).await {
        Err(e) => assert!(e.to_string().contains("CA"), "{e}"),
        Ok(_) => panic!("tls:// without a CA connected"),
    }
}

#[tokio::test]
async fn a_client_certificate_names_the_user() {
    let f = files("mtls");
    let mut c = tls_config(&f);
    c.tls.client_ca = f.ca.display().to_string();
    c.tls.cert_user = true;
    c.auth
        .users
        .insert("alice".into(), UserConfig::with_password("pw").unwrap());
    let (_plain, tls, _stop) = start(c).await;
    let addr = format!("tls://{tls}");
    // Without a certificate or a password: anonymous, refused (users exist).
    assert!(
        Client::connect_with(&addr, ConnectOptions::default().tls_ca(&f.ca))
            .await
            .is_err()
    );
    // With the password: fine.
    Client::connect_with(
        &addr,
        ConnectOptions::default()
            .tls_ca(&f.ca)
            .password("alice", "pw"),
    )
    .await
    .unwrap();
    // With alice's certificate and no password: logged in as alice.
    let opts = ConnectOptions::default()
        .tls_ca(&f.ca)
        .tls_client_cert(&f.alice_cert, &f.alice_key);
    Client::connect_with(&addr, opts.clone()).await.unwrap();
    // The certificate and another user name: refused.
    assert!(
        Client::connect_with(&addr, opts.password("bob", "x"))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn hostile_handshakes_are_cut_off_and_reload_keeps_serving() {
    let f = files("hostile");
    let mut c = tls_config(&f);
    c.limits.handshake_timeout_ms = 500;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = l.local_addr().unwrap().to_string();
    c.server.data_dir.clear();
    let server = Server::from_listeners(vec![(l, Protocol::NativeTls)], &c);
    let handle = server.tls().expect("tls loaded");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server.run(async {
        let _ = rx.await;
    }));
    let started = Instant::now();
    // Garbage instead of a ClientHello, a half ClientHello, and silence.
    let mut garbage = tokio::net::TcpStream::connect(&tls).await.unwrap();
    garbage.write_all(&[0xff; 300]).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(&tls).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00, 0x01])
        .await
        .unwrap();
    let mut silent = tokio::net::TcpStream::connect(&tls).await.unwrap();
    let opts = ConnectOptions::default().tls_ca(&f.ca);
    let good = Client::connect_with(&format!("tls://{tls}"), opts.clone())
        .await
        .unwrap();
    for s in [&mut garbage, &mut half, &mut silent] {
        let mut b = Vec::new();
        within(5, s.read_to_end(&mut b)).await.ok();
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // The good client was served meanwhile, and still is after a reload.
    handle.reload().unwrap();
    good.flush().await.unwrap();
    Client::connect_with(&format!("tls://{tls}"), opts)
        .await
        .unwrap();
    // A reload with a broken file keeps the current certificate.
    std::fs::write(&f.key, "not a key").unwrap();
    assert!(handle.reload().is_err());
    Client::connect_with(
        &format!("tls://{tls}"),
        ConnectOptions::default().tls_ca(&f.ca),
    )
    .await
    .unwrap();
    let _ = tx.send(());
}

/// A TLS subscriber that never reads holds nobody up for long: a publisher keeps going (the
/// stalled subscriber is cut after `max_block_ms`, its TLS buffer being bounded), and another
/// subscriber receives everything.
#[tokio::test]
async fn a_tls_subscriber_that_never_reads_is_cut_off() {
    let f = files("stall");
    let mut c = tls_config(&f);
    c.limits.max_block_ms = 300;
    let (plain, tls, _stop) = start(c).await;
    // Subscribes over raw TLS, then never reads again.
    let stalled = Client::connect_with(
        &format!("tls://{tls}"),
        ConnectOptions::default().tls_ca(&f.ca),
    )
    .await
    .unwrap();
    let _never_read = stalled.subscribe("flood").await.unwrap();
    stalled.flush().await.unwrap();
    let good = Client::connect(&plain).await.unwrap();
    let mut s = good.subscribe("flood").await.unwrap();
    good.flush().await.unwrap();
    let p = Client::connect(&plain).await.unwrap();
    let body = bytes::Bytes::from(vec![7u8; 64 << 10]);
    let n = 1024; // 64 MiB: well past the outbox and TLS buffers of the stalled subscriber
    let reader = tokio::spawn(async move {
        for _ in 0..n {
            let m = s.next().await.unwrap();
            assert_eq!(m.payload.len(), 64 << 10);
        }
    });
    within(60, async {
        for _ in 0..n {
            p.publish(&Key::new("flood").unwrap(), body.clone())
                .await
                .unwrap();
        }
        p.flush().await.unwrap();
    })
    .await;
    within(60, reader).await.unwrap();
}

/// A server config for the TLS transport on its own (`files`' certificate), without session
/// tickets: a client that reads nothing then closes its socket with a FIN, not a reset.
fn transport_server_config(
    f: &Files,
) -> std::sync::Arc<hayate_io::transport::tls::rustls::ServerConfig> {
    use hayate_io::transport::tls::{self as t, rustls};
    use rustls::pki_types::pem::PemObject;
    let mut c = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        t::load_certs(&f.cert).unwrap(),
        rustls::pki_types::PrivateKeyDer::from_pem_file(&f.key).unwrap(),
    )
    .unwrap();
    c.send_tls13_tickets = 0;
    std::sync::Arc::new(c)
}

/// The TLS transport's read half on its own: it reads up to 64 KiB of ciphertext per `recv`
/// (many records) and hands out their plaintext whole or in pieces, in order, to buffers of
/// any size; then the end of the stream, with the peer's close_notify and without it.
#[tokio::test]
async fn tls_reads_span_records_and_end_cleanly() {
    use hayate_io::transport::tls::{self as t, rustls};
    use tokio::io::AsyncReadExt;

    let f = files("reads");
    let server_cfg = transport_server_config(&f);
    let client_cfg = t::client_config(&f.ca, None).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    for close_notify in [true, false] {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let cfg = server_cfg.clone();
        let reader = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (mut r, _w, _) = t::accept(s, cfg, Duration::from_secs(5)).await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 200_000];
            // Small and large reads in turn: a read smaller than a record leaves the rest
            // of its plaintext for the next one.
            for i in 0usize.. {
                let want = [100, 200_000, 1, 17_000][i % 4];
                let n = r.read(&mut buf[..want]).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let (r, w) = t::connect(tcp, client_cfg.clone(), name, Duration::from_secs(5))
            .await
            .unwrap();
        let mut q = std::collections::VecDeque::new();
        let mut at = 0;
        for size in [1usize, 100, 5_000, 70_000].iter().cycle() {
            if at == data.len() {
                break;
            }
            let end = (at + size).min(data.len());
            q.push_back(bytes::Bytes::copy_from_slice(&data[at..end]));
            at = end;
        }
        hayate_io::transport::write_chunks(&*w, &mut q)
            .await
            .unwrap();
        std::future::poll_fn(|cx| w.poll_write_ready(cx))
            .await
            .unwrap();
        if close_notify {
            w.shutdown();
        } else {
            // The socket closes with no close_notify: an end like TCP's.
            drop(r);
            drop(w);
        }
        let got = within(20, reader).await.unwrap();
        assert_eq!(got.len(), data.len(), "close_notify: {close_notify}");
        assert!(got == data, "close_notify: {close_notify}");
    }
}

/// Hostile input after a good start: a client sends 200 KB of valid records, then a record
/// that does not decrypt, or one whose length is past TLS's largest. The read half gives
/// every byte of plaintext that came before, then an error (the connection ends), and the
/// same server then serves the next connection as before.
#[tokio::test]
async fn a_bad_record_after_good_ones_ends_only_that_connection() {
    use hayate_io::transport::tls::{self as t, rustls};
    use std::io::Write as _;
    use tokio::io::AsyncReadExt;

    let f = files("badrec");
    let server_cfg = transport_server_config(&f);
    let client_cfg = t::client_config(&f.ca, None).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 % 251) as u8).collect();
    // A forged application-data record (its tag cannot verify), one announcing 65,535 bytes
    // (past the 16 KiB + 256 a TLS 1.3 record may carry), and none (a good connection).
    let tails: [Option<Vec<u8>>; 3] = [
        Some([&[0x17, 3, 3, 0, 40][..], &[0xA5; 40][..]].concat()),
        Some([&[0x17, 3, 3, 0xFF, 0xFF][..], &[0; 64][..]].concat()),
        None,
    ];
    for tail in tails {
        let cfg = server_cfg.clone();
        let accept = async {
            let (s, _) = l.accept().await.unwrap();
            let (mut r, _w, _) = t::accept(s, cfg, Duration::from_secs(5)).await.unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            let end = loop {
                match r.read(&mut buf).await {
                    Ok(0) => break None,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) => break Some(e.kind()),
                }
            };
            (got, end)
        };
        let (cc, d, bad) = (client_cfg.clone(), data.clone(), tail.clone());
        let client = tokio::task::spawn_blocking(move || {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let conn = rustls::ClientConnection::new(cc, name).unwrap();
            let tcp = std::net::TcpStream::connect(addr).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            tls.write_all(&d).unwrap();
            tls.flush().unwrap();
            match bad {
                // Straight onto the socket, after the good records.
                Some(b) => tls.sock.write_all(&b).unwrap(),
                None => tls.conn.send_close_notify(),
            }
            let _ = tls.flush();
            // Keep the socket open a moment: the end must come from the bad record.
            std::thread::sleep(Duration::from_millis(300));
        });
        let (got, end) = within(20, accept).await;
        client.await.unwrap();
        assert!(
            got == data,
            "every byte before the bad record ({} of {})",
            got.len(),
            data.len()
        );
        match tail {
            Some(_) => assert_eq!(end, Some(std::io::ErrorKind::InvalidData)),
            None => assert_eq!(end, None, "a good connection ends cleanly"),
        }
    }
}

/// A task reading a TLS peer that always has more to send still yields to the runtime, as
/// a TCP read does: before, the read half read its socket with `try_read` and spent no task
/// budget, so such a task never yielded; a task it woke into its worker's LIFO slot then
/// waited until the flood stopped (a subscriber's writer woken by a publisher's reader:
/// MQTT QoS 1 over TLS at 64 B ran at 5k msg/s, QoS 0 stalled for seconds). On a
/// single-threaded runtime, the flood's reader here must let a timer task run.
#[test]
fn a_flooding_tls_peer_does_not_starve_other_tasks() {
    use hayate_io::transport::tls::{self as t, rustls};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let f = files("flood-yield");
    let server_cfg = transport_server_config(&f);
    let client_cfg = t::client_config(&f.ca, None).unwrap();
    // The flooding client runs on a runtime of its own, on another thread.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let client = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let addr: std::net::SocketAddr = addr_rx.recv().unwrap();
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let (_r, w) = t::connect(tcp, client_cfg, name, Duration::from_secs(5))
                .await
                .unwrap();
            let chunk = bytes::Bytes::from(vec![7u8; 1024]);
            while !stop2.load(Ordering::Relaxed) {
                let mut q: std::collections::VecDeque<bytes::Bytes> =
                    std::iter::repeat_n(chunk.clone(), 64).collect();
                if hayate_io::transport::write_chunks(&*w, &mut q)
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ticks, read) = rt.block_on(async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addr_tx.send(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().await.unwrap();
        let (mut r, _w, _) = t::accept(s, server_cfg, Duration::from_secs(5))
            .await
            .unwrap();
        let ticks = Arc::new(AtomicU64::new(0));
        let t2 = ticks.clone();
        tokio::spawn(async move {
            loop {
                tokio::task::yield_now().await;
                t2.fetch_add(1, Ordering::Relaxed);
            }
        });
        // Read the flood for a second without awaiting anything else, in small reads, so
        // that the socket always has more (the reader is the slower side).
        let mut buf = vec![0u8; 64];
        let mut read = 0u64;
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            read += r.read(&mut buf).await.unwrap() as u64;
        }
        (ticks.load(Ordering::Relaxed), read)
    });
    stop.store(true, Ordering::Relaxed);
    drop(rt);
    let _ = client.join();
    assert!(read > 1 << 16, "the flood was read ({read} bytes)");
    assert!(
        ticks > 10,
        "the other task ran {ticks} times while the flood was read"
    );
}
