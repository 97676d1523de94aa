//! Shared memory between the broker and native clients on its host: clients move to it by
//! themselves, everything works on it as on TCP, and hostile or dead clients are refused or
//! noticed without disturbing anyone else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{TestBroker, start, start_default, within};
use hayate_client::peer::ShmMode;
use hayate_client::{Client, ConnectOptions, Key};
use hayate_io::transport::shm::{self, Local, PREFIX, ShmGeometry};
use hayate_io::transport::{Reader, Writer, write_all};
use hayate_native::{Frame, Hello, PROTOCOL_VERSION, encode};
use hayate_server::Config;
use hayate_server::shm::ShmOffer;
use hayate_shm::announce;
use hayate_shm::segment::Segment;
use tokio::io::AsyncReadExt;

fn offer(b: &TestBroker) -> &Arc<ShmOffer> {
    b.shm.as_ref().expect("native.shm is on by default")
}

/// Waits until the broker holds `n` shared-memory connections.
async fn wait_active(b: &TestBroker, n: usize) {
    let o = offer(b).clone();
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while o.active() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "{} shared-memory connections, expected {n}",
        o.active()
    );
}

/// A client on shared memory that copies what the arena fans out (`shm_in_place` off).
async fn copying(b: &TestBroker) -> Client {
    with(
        b,
        ConnectOptions {
            shm_in_place: false,
            ..Default::default()
        },
    )
    .await
}

/// A client that stays on TCP (`shm` off).
async fn on_tcp(b: &TestBroker) -> Client {
    with(
        b,
        ConnectOptions {
            shm: ShmMode::Off,
            ..Default::default()
        },
    )
    .await
}

async fn with(b: &TestBroker, opts: ConnectOptions) -> Client {
    Client::connect_with(&b.addr, opts).await.unwrap()
}

fn payload(i: u32, len: usize) -> Bytes {
    let mut v = vec![0u8; len.max(4)];
    v[..4].copy_from_slice(&i.to_be_bytes());
    for (j, b) in v.iter_mut().enumerate().skip(4) {
        *b = (j as u32 ^ i) as u8;
    }
    Bytes::from(v)
}

#[tokio::test]
async fn clients_on_this_host_move_to_shared_memory() {
    let b = start_default().await;
    let sub = Client::connect(&b.addr).await.unwrap();
    let publ = Client::connect(&b.addr).await.unwrap();
    assert_eq!(sub.transport(), "shm");
    assert_eq!(publ.transport(), "shm");
    wait_active(&b, 2).await;
    let mut s = sub.subscribe("shm/**").await.unwrap();
    sub.flush().await.unwrap();
    // Sizes from empty to several slots (a slot is 64 KiB): the byte stream has no message
    // boundaries of its own.
    let sizes = [0usize, 1, 100, 65_536, 70_000, 300_000, 7];
    let n = 700u32;
    let key = Key::new("shm/a").unwrap();
    let p = publ.clone();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            p.publish(&key, payload(i, sizes[i as usize % sizes.len()]))
                .await
                .unwrap();
        }
        p.flush().await.unwrap();
    });
    within(60, async {
        for i in 0..n {
            let m = s.next().await.unwrap();
            assert_eq!(m.payload, payload(i, sizes[i as usize % sizes.len()]));
        }
    })
    .await;
    sender.await.unwrap();
    // Request/reply over it.
    let mut svc = sub.subscribe("svc/echo").await.unwrap();
    sub.flush().await.unwrap();
    let serve = tokio::spawn({
        let sub = sub.clone();
        async move {
            let m = svc.next().await.unwrap();
            sub.reply(&m, m.payload.clone()).await.unwrap();
        }
    });
    let r = within(
        10,
        publ.request(
            &Key::new("svc/echo").unwrap(),
            "ping",
            Duration::from_secs(5),
        ),
    )
    .await
    .unwrap();
    assert_eq!(&r.payload[..], b"ping");
    serve.await.unwrap();
    sub.close().await.unwrap();
    publ.close().await.unwrap();
    wait_active(&b, 0).await;
}

#[tokio::test]
async fn off_and_require_are_honoured() {
    let b = start_default().await;
    let off = ConnectOptions {
        shm: ShmMode::Off,
        ..Default::default()
    };
    let c = Client::connect_with(&b.addr, off).await.unwrap();
    assert_eq!(c.transport(), "tcp");
    let req = ConnectOptions {
        shm: ShmMode::Require,
        ..Default::default()
    };
    let c = Client::connect_with(&b.addr, req.clone()).await.unwrap();
    assert_eq!(c.transport(), "shm");
    // A broker that offers none: auto stays on TCP, require fails.
    let mut config = Config::default();
    config.native.shm = false;
    let nb = start(config).await;
    assert!(nb.shm.is_none());
    let c = Client::connect(&nb.addr).await.unwrap();
    assert_eq!(c.transport(), "tcp");
    let e = Client::connect_with(&nb.addr, req).await.unwrap_err();
    assert!(e.to_string().contains("shared memory"), "{e}");
    // At `native.shm_max_connections`, the next client stays on TCP.
    let mut config = Config::default();
    config.native.shm_max_connections = 1;
    let one = start(config).await;
    let a = Client::connect(&one.addr).await.unwrap();
    let b2 = Client::connect(&one.addr).await.unwrap();
    assert_eq!((a.transport(), b2.transport()), ("shm", "tcp"));
    a.close().await.unwrap();
    wait_active(&one, 0).await;
    let c = Client::connect(&one.addr).await.unwrap();
    assert_eq!(c.transport(), "shm");
    // One connection per address: the move to shared memory may find the first session's
    // count not yet given back; refused (`NO`), the client stays on TCP rather than failing.
    let mut config = Config::default();
    config.limits.max_connections_per_address = 1;
    let single = start(config).await;
    for _ in 0..5 {
        let c = Client::connect(&single.addr).await.unwrap();
        c.flush().await.unwrap();
        c.close().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broker-wide memory budget too small for the broker's 2 MiB ring: refused at the
    // set-up, the client connects again over TCP.
    let mut config = Config::default();
    config.limits.memory_budget = 1 << 20;
    let poor = start(config).await;
    let c = Client::connect(&poor.addr).await.unwrap();
    assert_eq!(c.transport(), "tcp");
    c.flush().await.unwrap();
    assert_eq!(offer(&poor).active(), 0);
}

/// Connects to the broker's socket and sends `message` with `fds`; the broker's answer (its
/// text and descriptors), or `None` when it closed without one.
fn set_up(
    offer: &ShmOffer,
    message: &str,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Option<(String, Vec<OwnedFd>)> {
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(offer.name().as_bytes()).unwrap();
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    announce::send_fds(&sock, fds, message.as_bytes()).unwrap();
    let (fds, answer) = announce::receive_any(&sock).ok()?;
    Some((String::from_utf8_lossy(&answer).into_owned(), fds))
}

fn ticket(offer: &ShmOffer) -> String {
    offer
        .issue(None, None, None)
        .split_once(' ')
        .unwrap()
        .1
        .to_owned()
}

#[tokio::test]
async fn hostile_set_ups_are_refused_and_the_broker_carries_on() {
    let mut config = Config::default();
    config.limits.handshake_timeout_ms = 300;
    let b = start(config).await;
    let o = offer(&b).clone();
    let (t1, t2) = (ticket(&o), ticket(&o));
    let blocking = tokio::task::spawn_blocking(move || {
        let local = Local::new("test", ShmGeometry::default()).unwrap();
        let fds = local.fds();
        let mut answers = Vec::new();
        // No ticket, a made-up ticket, garbage.
        for m in [
            format!("{PREFIX} CONNECT"),
            format!("{PREFIX} CONNECT {:032x}", 12345),
            "GET / HTTP/1.1".to_owned(),
        ] {
            answers.push(set_up(&o, &m, &fds).map(|a| a.0));
        }
        // A good ticket with descriptors that are not a segment and doorbells.
        let bells: Vec<OwnedFd> = (0..3)
            .map(|_| OwnedFd::from(hayate_shm::doorbell::Doorbell::new().unwrap()))
            .collect();
        let bells: Vec<_> = bells.iter().map(|f| f.as_fd()).collect();
        answers.push(set_up(&o, &format!("{PREFIX} CONNECT {t1}"), &bells).map(|a| a.0));
        // Too few descriptors.
        answers.push(set_up(&o, &format!("{PREFIX} CONNECT {t2}"), &fds[..1]).map(|a| a.0));
        // The ticket was spent by the refusal: once only.
        answers.push(set_up(&o, &format!("{PREFIX} CONNECT {t2}"), &fds).map(|a| a.0));
        // Oversized: a ring whose slots are 2 MiB (a read could append that much), and a
        // segment of 80 MiB (sparse: nothing is touched).
        let bell = hayate_shm::doorbell::Doorbell::new().unwrap();
        for (slots, slot) in [(2, 2 << 20), (1, 80 << 20)] {
            let words = hayate_shm::region_words(slots, slot);
            let seg = Segment::create("big", words * 8).unwrap();
            let ring = hayate_shm::SharedRing::init(seg, slots, slot).unwrap();
            let t = ticket(&o);
            let big = [ring.segment().fd(), bell.ringer(), bell.ringer()];
            answers.push(set_up(&o, &format!("{PREFIX} CONNECT {t}"), &big).map(|a| a.0));
        }
        // Holding in place with a release table that is not one: a segment of another size,
        // a doorbell, a segment not sealed against shrinking.
        let small = Segment::create("small-table", 4096).unwrap();
        let path = std::env::temp_dir().join(format!("hayate-table-{}", std::process::id()));
        let unsealed = std::fs::File::create(&path).unwrap();
        unsealed.set_len(4096 * 8).unwrap();
        std::fs::remove_file(&path).unwrap();
        for table in [small.fd(), bell.ringer(), unsealed.as_fd()] {
            let t = ticket(&o);
            let four = [fds[0], fds[1], fds[2], table];
            answers
                .push(set_up(&o, &format!("{PREFIX} CONNECT {t} fanout hold"), &four).map(|a| a.0));
        }
        answers
    });
    let answers = within(30, blocking).await.unwrap();
    for a in &answers {
        let a = a.as_deref().unwrap_or("(closed)");
        assert!(a.starts_with(&format!("{PREFIX} NO")), "accepted: {a}");
    }
    // A client that connects and says nothing is closed after the handshake timeout.
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(offer(&b).name().as_bytes()).unwrap();
    let silent = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    silent.set_nonblocking(true).unwrap();
    let mut silent = tokio::net::UnixStream::from_std(silent).unwrap();
    let mut buf = [0u8; 16];
    let n = within(5, silent.read(&mut buf)).await.unwrap_or(0);
    assert_eq!(n, 0);
    // Nobody was left attached, and a real client still gets shared memory.
    assert_eq!(offer(&b).active(), 0);
    let c = Client::connect(&b.addr).await.unwrap();
    assert_eq!(c.transport(), "shm");
    c.flush().await.unwrap();
}

/// A connection over shared memory set up by hand, keeping a handle on its own ring's words.
struct Raw {
    r: Reader,
    w: Writer,
    ring: Segment,
}

async fn raw(b: &TestBroker) -> Raw {
    raw_with(b, false).await.0
}

/// [`raw`], asking for the fan-out arena when `fanout`: the arena's descriptor, if given.
async fn raw_with(b: &TestBroker, fanout: bool) -> (Raw, Option<OwnedFd>) {
    let t = ticket(offer(b));
    raw_ticket(b, fanout, t, Bytes::new(), None).await
}

/// [`raw_with`] on ticket `t`, logging in with `auth` (HELLO's auth field); with `table`
/// (and `fanout`), asking to hold entries in place with that release table.
async fn raw_ticket(
    b: &TestBroker,
    fanout: bool,
    t: String,
    auth: Bytes,
    table: Option<OwnedFd>,
) -> (Raw, Option<OwnedFd>) {
    let o = offer(b).clone();
    let (local, mut fds, sock, ring) = tokio::task::spawn_blocking(move || {
        let local = Local::new("raw", ShmGeometry::default()).unwrap();
        let ring = Segment::open(local.fds()[0].try_clone_to_owned().unwrap()).unwrap();
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(o.name().as_bytes()).unwrap();
        let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        let ask = match (fanout, table.is_some()) {
            (true, true) => " fanout hold",
            (true, false) => " fanout",
            _ => "",
        };
        let mut mine = local.fds().to_vec();
        mine.extend(table.as_ref().map(|t| t.as_fd()));
        announce::send_fds(
            &sock,
            &mine,
            format!("{PREFIX} CONNECT {t}{ask}").as_bytes(),
        )
        .unwrap();
        let (fds, answer) = announce::receive_any(&sock).unwrap();
        let want = match ask {
            "" => "OK",
            a => &format!("OK{a}"),
        };
        assert_eq!(String::from_utf8_lossy(&answer), format!("{PREFIX} {want}"));
        (local, fds, sock, ring)
    })
    .await
    .unwrap();
    let arena = (fds.len() == 4).then(|| fds.remove(3));
    let (r, w) = shm::join(local, fds, sock).unwrap();
    let mut raw = Raw { r, w, ring };
    let mut out = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            flags: 0,
            name: "raw".into(),
            auth,
        }),
        &mut out,
    );
    write_all(&*raw.w, out.freeze()).await.unwrap();
    let mut buf = BytesMut::new();
    within(10, async {
        loop {
            if let Some(f) = hayate_native::decode(&mut buf, 1 << 20).unwrap() {
                assert!(matches!(f, Frame::Welcome(_)), "{f:?}");
                return;
            }
            assert!(raw.r.read_buf(&mut buf).await.unwrap() > 0);
        }
    })
    .await;
    (raw, arena)
}

#[tokio::test]
async fn a_scribbled_ring_ends_only_that_connection() {
    let b = start_default().await;
    let other = Client::connect(&b.addr).await.unwrap();
    let mut s = other.subscribe("x").await.unwrap();
    other.flush().await.unwrap();
    let mut raw = raw(&b).await;
    wait_active(&b, 2).await;
    // `head` (word 8) jumps ahead of what the slots hold.
    raw.ring.words()[8].store(1 << 40, std::sync::atomic::Ordering::Release);
    // Wake the broker's reader (asleep on its doorbell): closing the ring rings it.
    raw.w.shutdown();
    // The broker ends the connection: the client reads to the end (an ERR first, maybe).
    let mut rest = Vec::new();
    let _ = within(10, raw.r.read_to_end(&mut rest)).await;
    wait_active(&b, 1).await;
    // The others carry on.
    other
        .publish(&Key::new("x").unwrap(), "still")
        .await
        .unwrap();
    let m = within(10, s.next()).await.unwrap();
    assert_eq!(&m.payload[..], b"still");
}

#[tokio::test]
async fn a_client_that_dies_is_noticed() {
    let b = start_default().await;
    let before = b.broker.subscription_count();
    let raw = raw(&b).await;
    wait_active(&b, 1).await;
    // What a SIGKILL does: every descriptor closed, nothing said.
    drop(raw);
    wait_active(&b, 0).await;
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while b.broker.subscription_count() != before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(r.is_ok(), "the dead client's session did not end");
}

/// Many clients at once against a small `native.shm_max_connections`: never more than that
/// many on shared memory, the rest on TCP, and all of them work.
#[tokio::test]
async fn many_clients_at_once_stay_within_the_shared_memory_limit() {
    let mut config = Config::default();
    config.native.shm_max_connections = 4;
    let b = start(config).await;
    let clients: Vec<Client> = futures::future::join_all((0..16).map(|_| Client::connect(&b.addr)))
        .await
        .into_iter()
        .map(|c| c.unwrap())
        .collect();
    let on_shm = clients.iter().filter(|c| c.transport() == "shm").count();
    assert!(on_shm <= 4, "{on_shm} clients on shared memory");
    assert!(offer(&b).active() <= 4);
    let mut s = clients[0].subscribe("many/x").await.unwrap();
    clients[0].flush().await.unwrap();
    for c in &clients {
        c.publish(&Key::new("many/x").unwrap(), c.transport())
            .await
            .unwrap();
        c.flush().await.unwrap();
    }
    for _ in 0..clients.len() {
        within(10, s.next()).await.unwrap();
    }
    for c in clients {
        c.close().await.unwrap();
    }
    wait_active(&b, 0).await;
}

/// Any process of the host can connect to the broker's (abstract) socket. Connections that
/// say nothing are capped (64) and closed after 2 s, whatever the handshake timeout: they
/// cannot fill `max_connections`, and once they are gone a real client gets shared memory
/// again.
#[tokio::test]
async fn silent_set_ups_are_capped_and_cut_short() {
    let mut config = Config::default();
    config.limits.handshake_timeout_ms = 60_000;
    config.limits.max_connections = 100;
    let b = start(config).await;
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(offer(&b).name().as_bytes()).unwrap();
    let started = std::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..90 {
        let s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        s.set_nonblocking(true).unwrap();
        silent.push(tokio::net::UnixStream::from_std(s).unwrap());
    }
    // Past the first 64 they are closed at once; the others after 2 s.
    let waits: Vec<_> = silent
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut buf = [0u8; 16];
                assert_eq!(within(10, s.read(&mut buf)).await.unwrap_or(0), 0);
                started.elapsed()
            })
        })
        .collect();
    let mut ended = Vec::new();
    for w in waits {
        ended.push(w.await.unwrap());
    }
    let quick = ended.iter().filter(|t| t.as_millis() < 1500).count();
    assert!(quick >= 26, "{quick} closed at once: {ended:?}");
    assert!(ended.iter().all(|t| t.as_secs() < 5), "{ended:?}");
    // Meanwhile, and after, TCP clients connect (max_connections was never reached), and a
    // client of this host gets shared memory again.
    let c = Client::connect(&b.addr).await.unwrap();
    assert_eq!(c.transport(), "shm");
    c.flush().await.unwrap();
}

/// A HELLO that asks for shared memory but speaks another protocol version is refused
/// (ERR 7) without a ticket being given out for it (before, one was, and held a slot of
/// the 4096 for 10 s).
#[tokio::test]
async fn a_hello_of_another_version_gets_no_ticket() {
    let b = start_default().await;
    let mut s = tokio::net::TcpStream::connect(&b.addr).await.unwrap();
    let mut hello = BytesMut::new();
    encode(
        &Frame::Hello(Hello {
            version: PROTOCOL_VERSION + 1,
            flags: hayate_native::HELLO_SHM,
            name: "old".into(),
            auth: Default::default(),
        }),
        &mut hello,
    );
    tokio::io::AsyncWriteExt::write_all(&mut s, &hello)
        .await
        .unwrap();
    let mut got = Vec::new();
    within(10, s.read_to_end(&mut got)).await.unwrap();
    let mut got = BytesMut::from(&got[..]);
    let f = hayate_native::decode(&mut got, 1 << 20).unwrap();
    assert!(
        matches!(f, Some(Frame::Err { code, .. }) if code == hayate_native::ErrorCode::UnsupportedVersion),
        "{f:?}"
    );
    assert_eq!(offer(&b).tickets(), 0);
}

/// What the broker's fan-out arenas did.
fn fanout(b: &TestBroker) -> &hayate_server::fanout::FanoutStats {
    offer(b)
        .fanout_stats()
        .expect("native.shm_fanout_bytes is on by default")
}

/// Entries live and references held in all arenas now.
fn held(b: &TestBroker) -> (usize, usize) {
    offer(b)
        .arenas()
        .iter()
        .map(|a| a.held())
        .fold((0, 0), |(e, r), (e2, r2)| (e + e2, r + r2))
}

/// Waits until no fan-out entry is live nor referenced (every client released what it
/// read, or is gone).
async fn wait_released(b: &TestBroker) {
    let r = tokio::time::timeout(Duration::from_secs(10), async {
        while held(b) != (0, 0) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(r.is_ok(), "still held (entries, references): {:?}", held(b));
}

/// Messages for several local subscribers are written to the arena once each, every
/// subscriber gets every one intact and in order, small ones and large ones mixed, and the
/// entries are free once read.
#[tokio::test]
async fn fan_out_writes_each_message_once_for_every_local_subscriber() {
    let b = start_default().await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let mut subs = Vec::new();
    for _ in 0..5 {
        // Copying: all is published before anything is read, which in place would hold
        // more than a client's quota (`reading_in_place_...` below).
        let c = copying(&b).await;
        assert_eq!(c.transport(), "shm");
        let s = c.subscribe("fan/**").await.unwrap();
        c.flush().await.unwrap();
        subs.push((c, s));
    }
    // A subscriber on TCP gets copies, as before.
    let tcp = on_tcp(&b).await;
    let mut tcp_sub = tcp.subscribe("fan/**").await.unwrap();
    tcp.flush().await.unwrap();
    // Below the fan-out's 512 bytes, at it, and well past it.
    let sizes = [100usize, 512, 2000, 70_000, 10];
    let n = 300u32;
    let key = Key::new("fan/a").unwrap();
    for i in 0..n {
        publ.publish(&key, payload(i, sizes[i as usize % sizes.len()]))
            .await
            .unwrap();
    }
    publ.flush().await.unwrap();
    let large = (0..n)
        .filter(|i| sizes[*i as usize % sizes.len()] >= 512)
        .count() as u64;
    for s in subs.iter_mut().map(|(_, s)| s).chain([&mut tcp_sub]) {
        within(30, async {
            for i in 0..n {
                let m = s.next().await.unwrap();
                assert_eq!(
                    m.payload,
                    payload(i, sizes[i as usize % sizes.len()]),
                    "{i}"
                );
                assert_eq!(m.key.as_str(), "fan/a");
            }
        })
        .await;
    }
    let st = fanout(&b);
    let entries = st.entries.load(std::sync::atomic::Ordering::Relaxed);
    let refs = st.refs.load(std::sync::atomic::Ordering::Relaxed);
    // A publisher's batch that goes to the arena is one entry: at most one per message.
    assert!((1..=large).contains(&entries), "{entries} entries");
    assert_eq!(
        refs,
        5 * entries,
        "each entry written once for the 5 subscribers"
    );
    assert_eq!(st.copies.load(std::sync::atomic::Ordering::Relaxed), 0);
    // The same figures in /metrics.
    let (status, body) = common::http(&b.admin, "GET", "/metrics", &[]).await;
    assert_eq!(status, 200);
    for (name, v) in [
        ("hayate_shm_fanout_entries_total", entries),
        ("hayate_shm_fanout_refs_total", refs),
        ("hayate_shm_fanout_copies_total", 0),
        ("hayate_shm_connections", 6),
    ] {
        let line = format!("{name} {v}");
        assert!(
            body.lines().any(|l| l == line || l == format!("{line}.0")),
            "no {line:?} in /metrics"
        );
    }
    wait_released(&b).await;
    // Request/reply: a large reply to a shared-memory client arrives whole (a copy: replies
    // never go to the arena).
    let responder = subs[0].0.clone();
    let mut requests = responder.subscribe("svc").await.unwrap();
    responder.flush().await.unwrap();
    let serve = tokio::spawn(async move {
        let m = requests.next().await.unwrap();
        let reply_to = m.reply_to.clone().unwrap();
        responder
            .publish(&reply_to, m.payload.clone())
            .await
            .unwrap();
        responder.flush().await.unwrap();
    });
    let big = payload(7, 5000);
    let reply = within(
        10,
        subs[1].0.request(
            &Key::new("svc").unwrap(),
            big.clone(),
            Duration::from_secs(5),
        ),
    )
    .await
    .unwrap();
    assert_eq!(reply.payload, big);
    serve.await.unwrap();
    drop(subs);
    wait_released(&b).await;
}

/// A subscriber that stops reading holds at most its quota of the arena (a quarter); the
/// others get everything, by reference or by copy, and its entries are free once it is
/// gone.
#[tokio::test]
async fn a_stuck_subscriber_holds_at_most_its_quota() {
    let mut config = Config::default();
    config.native.shm_fanout_bytes = 1 << 20;
    let b = start(config).await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let stuck = Client::connect(&b.addr).await.unwrap();
    let never_read = stuck
        .subscribe_with(
            "st/**",
            hayate_client::SubscribeOptions {
                group: None,
                qos: hayate_client::Qos::BEST_EFFORT_DROP,
            },
        )
        .await
        .unwrap();
    stuck.flush().await.unwrap();
    let mut good = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(&b.addr).await.unwrap();
        let s = c.subscribe("st/**").await.unwrap();
        c.flush().await.unwrap();
        good.push((c, s));
    }
    let n = 3000u32;
    let key = Key::new("st/a").unwrap();
    let p = publ.clone();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            p.publish(&key, payload(i, 4000)).await.unwrap();
        }
        p.flush().await.unwrap();
    });
    for (_, s) in &mut good {
        within(60, async {
            for i in 0..n {
                let m = s.next().await.unwrap();
                assert_eq!(m.payload, payload(i, 4000), "{i}");
            }
        })
        .await;
    }
    sender.await.unwrap();
    // 12 MB went by an arena of 1 MiB: the stuck client holds at most a quarter of it.
    let (entries, refs) = held(&b);
    let per_entry = 4000 + 64;
    assert!(
        refs * per_entry <= (1 << 20) / 4 + per_entry,
        "{refs} references held"
    );
    assert!(
        entries * per_entry <= (1 << 20) / 4 + per_entry,
        "{entries} entries"
    );
    let copies = fanout(&b).copies.load(std::sync::atomic::Ordering::Relaxed);
    assert!(copies > 0, "the stuck client's quota never ran out");
    drop(never_read);
    drop(stuck);
    wait_released(&b).await;
}

/// A client that lies about what it released frees only its own references: what others
/// read stays intact, and the liar reads a stale reference as an error, never as another
/// message's bytes. The arena cannot be mapped writable nor written by a client.
#[tokio::test]
async fn a_client_lying_about_releases_harms_only_itself() {
    let mut config = Config::default();
    config.native.shm_fanout_bytes = 256 << 10;
    let b = start(config).await;
    let (mut liar, arena) = raw_with(&b, true).await;
    let arena = arena.expect("the arena is offered");
    assert!(
        Segment::open(arena.try_clone().unwrap()).is_err(),
        "a client mapped the arena writable"
    );
    {
        use std::io::Write;
        let mut f = std::fs::File::from(arena.try_clone().unwrap());
        assert!(
            f.write_all(b"scribble").is_err(),
            "a client wrote the arena"
        );
    }
    let view = hayate_shm::arena::ArenaView::open(arena).unwrap();
    raw_subscribe(&liar, "lie/**", hayate_client::Qos::BEST_EFFORT_DROP).await;
    // Copying: in place it would hold the liar's first entry until read, below.
    let honest = copying(&b).await;
    let (mut hs, publ) = honest_beside_raw(&b, &honest, "lie/**").await;
    let key = Key::new("lie/a").unwrap();
    // The first message; the liar takes its reference and claims everything released.
    publ.publish(&key, payload(0, 3000)).await.unwrap();
    publ.flush().await.unwrap();
    let mut buf = BytesMut::new();
    let first = within(10, async {
        loop {
            if let Some(f) = hayate_native::decode(&mut buf, 1 << 20).unwrap() {
                return f;
            }
            assert!(liar.r.read_buf(&mut buf).await.unwrap() > 0);
        }
    })
    .await;
    let Frame::MsgRef { sid, at, len, tag } = first else {
        panic!("expected MSG_REF, got {first:?}")
    };
    assert_eq!(sid, 1);
    liar.ring.words()[4].store(u64::MAX, std::sync::atomic::Ordering::Release);
    // Enough traffic to write the arena over several times (one message at a time: one
    // entry each).
    for i in 1..400u32 {
        publ.publish(&key, payload(i, 3000)).await.unwrap();
        publ.flush().await.unwrap();
    }
    let written = fanout(&b)
        .entries
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(written * 3000 > 3 * (256 << 10), "{written} entries");
    within(30, async {
        for i in 0..400u32 {
            let m = hs.next().await.unwrap();
            assert_eq!(m.payload, payload(i, 3000), "{i}");
        }
    })
    .await;
    // The liar's first reference now names a place written again: an error, nothing read.
    let mut got = Vec::new();
    assert!(view.get(at, u64::from(len), tag, &mut got).is_err());
    assert!(got.is_empty());
    // A counter that goes back is ignored; the broker carries on.
    liar.ring.words()[4].store(1, std::sync::atomic::Ordering::Release);
    publ.publish(&key, payload(400, 3000)).await.unwrap();
    let m = within(10, hs.next()).await.unwrap();
    assert_eq!(m.payload, payload(400, 3000));
}

/// A client holding in place that lies in its release table: it says its first 4096
/// references released before it even gets them, later fills the table with garbage. Only
/// its own entries suffer (its first one, read after the arena was written over, is
/// `Stale`); an honest client gets every message, and the broker carries on.
#[tokio::test]
async fn a_holding_client_lying_in_its_release_table_harms_only_itself() {
    let mut config = Config::default();
    config.native.shm_fanout_bytes = 256 << 10;
    let b = start(config).await;
    let table = hayate_shm::arena::ReleaseTable::create("liar").unwrap();
    let t = ticket(offer(&b));
    let mine = Some(table.fd().try_clone_to_owned().unwrap());
    let (mut liar, arena) = raw_ticket(&b, true, t, Bytes::new(), mine).await;
    let view = hayate_shm::arena::ArenaView::open(arena.expect("the arena")).unwrap();
    raw_subscribe(&liar, "tlie/**", hayate_client::Qos::BEST_EFFORT_DROP).await;
    let honest = Client::connect(&b.addr).await.unwrap();
    let (mut hs, publ) = honest_beside_raw(&b, &honest, "tlie/**").await;
    let key = Key::new("tlie/a").unwrap();
    publ.publish(&key, payload(0, 3000)).await.unwrap();
    publ.flush().await.unwrap();
    assert_eq!(
        within(10, hs.next()).await.unwrap().payload,
        payload(0, 3000)
    );
    let mut buf = BytesMut::new();
    let Frame::MsgRef { at, len, tag, .. } = next_delivery(&mut liar, &mut buf).await else {
        panic!("expected a MSG_REF")
    };
    for n in 0..4096 {
        table.release(n);
    }
    traffic(&publ, &key, 1..400, &mut [&mut hs]).await;
    let written = fanout(&b)
        .entries
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(written * 3000 > 3 * (256 << 10), "{written} entries");
    let mut got = Vec::new();
    assert!(view.get(at, u64::from(len), tag, &mut got).is_err());
    // Garbage: nothing more of its is released; it holds its quota, then gets copies.
    let words = Segment::open(table.fd().try_clone_to_owned().unwrap()).unwrap();
    for w in words.words() {
        w.store(u64::MAX, std::sync::atomic::Ordering::Release);
    }
    traffic(&publ, &key, 400..600, &mut [&mut hs]).await;
    let (_, refs) = held(&b);
    assert!(
        refs * 3000 <= (256 << 10) / 4 + 8192,
        "{refs} references held"
    );
}

/// Subscribes `honest` to `expr` beside a raw client on shared memory, waits until the
/// broker holds both connections, and connects a publisher.
async fn honest_beside_raw(
    b: &TestBroker,
    honest: &Client,
    expr: &str,
) -> (hayate_client::Subscription, Client) {
    let hs = honest.subscribe(expr).await.unwrap();
    honest.flush().await.unwrap();
    wait_active(b, 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    (hs, Client::connect(&b.addr).await.unwrap())
}

/// Subscribes a raw connection to `expr` as subscription 1.
async fn raw_subscribe(raw: &Raw, expr: &str, qos: hayate_client::Qos) {
    let mut out = BytesMut::new();
    encode(
        &Frame::Sub(hayate_native::Sub {
            sid: 1,
            qos,
            group: None,
            expr: hayate_core::KeyExpr::new(expr).unwrap(),
        }),
        &mut out,
    );
    write_all(&*raw.w, out.freeze()).await.unwrap();
}

/// Reads frames from a raw connection until one is a delivery: it.
async fn next_delivery(raw: &mut Raw, buf: &mut BytesMut) -> Frame {
    within(10, async {
        loop {
            while let Some(f) = hayate_native::decode(buf, 1 << 20).unwrap() {
                if matches!(
                    f,
                    Frame::Msg { .. } | Frame::MsgBatch { .. } | Frame::MsgRef { .. }
                ) {
                    return f;
                }
            }
            assert!(raw.r.read_buf(buf).await.unwrap() > 0);
        }
    })
    .await
}

/// An arena is readable by every client that took it, so each user has its own, replies
/// never go there, and a connection that logs in as another user than its ticket's gets
/// copies (the arena it took is its ticket's user's).
#[tokio::test]
async fn an_arena_is_one_user_s_and_replies_never_go_there() {
    let mut config = Config::default();
    for u in ["alice", "bob"] {
        config.auth.users.insert(
            u.into(),
            hayate_server::config::UserConfig::with_password("alice-and-bob").unwrap(),
        );
    }
    let b = start(config).await;
    let as_user = |u: &str| ConnectOptions::default().password(u, "alice-and-bob");
    let alice = Client::connect_with(&b.addr, as_user("alice"))
        .await
        .unwrap();
    let bob = Client::connect_with(&b.addr, as_user("bob")).await.unwrap();
    let (mut sa, mut sb) = (
        alice.subscribe("u/**").await.unwrap(),
        bob.subscribe("u/**").await.unwrap(),
    );
    alice.flush().await.unwrap();
    bob.flush().await.unwrap();
    // Logs in as bob on a ticket issued for alice.
    let t = offer(&b)
        .issue(None, None, Some("alice".into()))
        .split_once(' ')
        .unwrap()
        .1
        .to_owned();
    let bob_auth = hayate_native::HelloAuth::Password {
        user: "bob".into(),
        password: Bytes::from_static(b"alice-and-bob"),
    }
    .encode();
    let (mut impostor, arena) = raw_ticket(&b, true, t, bob_auth, None).await;
    assert!(
        arena.is_some(),
        "alice's arena was handed out on her ticket"
    );
    raw_subscribe(&impostor, "u/**", hayate_client::Qos::RELIABLE).await;
    wait_active(&b, 3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let publ = Client::connect_with(&b.addr, as_user("bob")).await.unwrap();
    publ.publish(&Key::new("u/x").unwrap(), payload(1, 2000))
        .await
        .unwrap();
    publ.flush().await.unwrap();
    for s in [&mut sa, &mut sb] {
        let m = within(10, s.next()).await.unwrap();
        assert_eq!(m.payload, payload(1, 2000));
    }
    // One entry in each user's arena; the impostor got a copy.
    assert_eq!(offer(&b).arenas().len(), 2, "one arena per user");
    assert_eq!(
        fanout(&b)
            .entries
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(
        fanout(&b).refs.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    let mut buf = BytesMut::new();
    let f = next_delivery(&mut impostor, &mut buf).await;
    assert!(
        matches!(&f, Frame::Msg { .. } | Frame::MsgBatch { .. }),
        "the impostor got {f:?}"
    );
    // A large reply to alice goes as a copy: other alice connections must not read it.
    let mut svc = bob.subscribe("svc").await.unwrap();
    bob.flush().await.unwrap();
    let responder = bob.clone();
    tokio::spawn(async move {
        let m = svc.next().await.unwrap();
        responder.reply(&m, payload(2, 4000)).await.unwrap();
        responder.flush().await.unwrap();
    });
    let r = within(
        10,
        alice.request(&Key::new("svc").unwrap(), "q", Duration::from_secs(5)),
    )
    .await
    .unwrap();
    assert_eq!(r.payload, payload(2, 4000));
    assert_eq!(
        fanout(&b).refs.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// The arena's size is 0 (none) or within bounds: a tiny one would copy everything (its
/// quota too small for a message), a huge one could not be made.
#[test]
fn the_arena_size_is_checked() {
    let mut config = Config::default();
    for ok in [0, 256 << 10, 16 << 20, 1 << 34] {
        config.native.shm_fanout_bytes = ok;
        config.validate().unwrap();
    }
    for bad in [1, (256 << 10) - 1, (1 << 34) + 1] {
        config.native.shm_fanout_bytes = bad;
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains("shm_fanout_bytes"), "{e}");
    }
}

/// A connection the broker ends (here for a bad frame) still reads everything sent before
/// the end: the MSG_REFs in its ring name entries that stay valid while it reads them (the
/// departed holder's grace), then the ERR.
#[tokio::test]
async fn a_connection_the_broker_ends_reads_its_references_then_the_error() {
    let b = start_default().await;
    let (mut raw, arena) = raw_with(&b, true).await;
    let view = hayate_shm::arena::ArenaView::open(arena.unwrap()).unwrap();
    raw_subscribe(&raw, "gone/**", hayate_client::Qos::RELIABLE).await;
    wait_active(&b, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("gone/a").unwrap();
    for i in 0..50u32 {
        publ.publish(&key, payload(i, 2000)).await.unwrap();
        publ.flush().await.unwrap();
    }
    // A frame type that does not exist: ERR, and the broker ends the connection.
    write_all(&*raw.w, Bytes::from_static(&[0, 0, 0, 1, 0x7F]))
        .await
        .unwrap();
    // Everything the broker sent is read off the ring first (the MSG_REFs kept, not yet
    // resolved), to the ERR and the end; the broker is then done with the connection (its
    // encoder, the holder of its references, gone) before any entry is read here.
    let mut buf = BytesMut::new();
    let mut refs = Vec::new();
    let err = within(10, async {
        loop {
            while let Some(f) = hayate_native::decode(&mut buf, 1 << 20).unwrap() {
                match f {
                    Frame::MsgRef { at, len, tag, .. } => refs.push((at, len, tag)),
                    Frame::Err { code, .. } => return code,
                    _ => {}
                }
            }
            assert!(raw.r.read_buf(&mut buf).await.unwrap() > 0, "no ERR");
        }
    })
    .await;
    assert_eq!(err, hayate_native::ErrorCode::UnknownFrame);
    raw.w.shutdown();
    wait_active(&b, 1).await;
    // The publisher's cached route held the ended session's outbox (and so its encoder):
    // the next publish on the key lets it go.
    publ.publish(&key, payload(99, 2000)).await.unwrap();
    publ.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut got = 0u32;
    for (at, len, tag) in refs {
        let mut entry = BytesMut::new();
        view.get(at, u64::from(len), tag, &mut entry)
            .unwrap_or_else(|e| panic!("reference {got}: {e}"));
        let payloads = match hayate_native::decode(&mut entry, 1 << 20).unwrap() {
            Some(Frame::Msg { msg, .. }) => vec![msg.payload],
            Some(Frame::MsgBatch { payloads, .. }) => payloads.to_vec(),
            other => panic!("not a MSG: {other:?}"),
        };
        for p in payloads {
            assert_eq!(p, payload(got, 2000));
            got += 1;
        }
    }
    assert_eq!(got, 50);
}

/// CONNECT's words after the ticket: `fanout` anywhere among them, in any spacing, with
/// words this broker does not know (ignored), gets the arena; none gets the plain set-up.
#[tokio::test]
async fn connect_words_past_the_ticket() {
    let b = start_default().await;
    let o = offer(&b).clone();
    let (t1, t2) = (ticket(&o), ticket(&o));
    let answers = tokio::task::spawn_blocking(move || {
        let local = Local::new("words", ShmGeometry::default()).unwrap();
        let fds = local.fds();
        let with = set_up(
            &o,
            &format!("{PREFIX} CONNECT {t1}  later-word\tfanout \n"),
            &fds,
        );
        let local = Local::new("words", ShmGeometry::default()).unwrap();
        let without = set_up(
            &o,
            &format!("{PREFIX} CONNECT {t2} later-word"),
            &local.fds(),
        );
        [with, without].map(|a| a.map(|(text, fds)| (text, fds.len())))
    })
    .await
    .unwrap();
    assert_eq!(
        answers[0],
        Some((format!("{PREFIX} OK fanout"), 4)),
        "with fanout"
    );
    assert_eq!(answers[1], Some((format!("{PREFIX} OK"), 3)), "without");
}

/// An arena that does not fit the memory budget is not made: shared-memory clients get
/// the plain set-up and copies, and everything is delivered.
#[tokio::test]
async fn no_arena_past_the_memory_budget() {
    let mut config = Config::default();
    config.limits.memory_budget = 12 << 20;
    let b = start(config).await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let mut subs = Vec::new();
    for _ in 0..2 {
        let c = Client::connect(&b.addr).await.unwrap();
        assert_eq!(c.transport(), "shm");
        let s = c.subscribe("budget/**").await.unwrap();
        c.flush().await.unwrap();
        subs.push((c, s));
    }
    let key = Key::new("budget/a").unwrap();
    for i in 0..100u32 {
        publ.publish(&key, payload(i, 3000)).await.unwrap();
    }
    publ.flush().await.unwrap();
    for (_, s) in &mut subs {
        within(30, async {
            for i in 0..100u32 {
                assert_eq!(s.next().await.unwrap().payload, payload(i, 3000));
            }
        })
        .await;
    }
    assert!(offer(&b).arenas().is_empty(), "an arena past the budget");
    assert_eq!(
        fanout(&b).refs.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// Read in place (the client's default): a message's payload is the arena's bytes, held,
/// unwritten by the broker, for as long as the application keeps it, past its connection's
/// end and its grace too; dropped, the entry is free. Meanwhile the arena is written over
/// many times for what is read and dropped, by reference, with no copies.
#[tokio::test]
async fn reading_in_place_holds_an_entry_until_dropped_even_past_the_connection() {
    let mut config = Config::default();
    config.native.shm_fanout_bytes = 256 << 10;
    let b = start(config).await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let sub = Client::connect(&b.addr).await.unwrap();
    let other = Client::connect(&b.addr).await.unwrap();
    let (mut s, mut o) = (
        sub.subscribe("held/**").await.unwrap(),
        other.subscribe("held/**").await.unwrap(),
    );
    sub.flush().await.unwrap();
    other.flush().await.unwrap();
    let key = Key::new("held/a").unwrap();
    publ.publish(&key, payload(0, 3000)).await.unwrap();
    publ.flush().await.unwrap();
    let kept = within(10, s.next()).await.unwrap();
    assert_eq!(
        within(10, o.next()).await.unwrap().payload,
        payload(0, 3000)
    );
    // Traffic that writes the 256 KiB arena over several times, read and dropped as it
    // comes: by reference, and the kept entry's place is never taken.
    traffic(&publ, &key, 1..301, &mut [&mut s, &mut o]).await;
    let st = fanout(&b);
    let entries = st.entries.load(std::sync::atomic::Ordering::Relaxed);
    assert!(entries * 3000 > 3 * (256 << 10), "{entries} entries");
    assert_eq!(st.copies.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(
        kept.payload,
        payload(0, 3000),
        "a held entry was written over"
    );
    // Its connection ends; past the grace a copying client's references get, the entry is
    // still held while more traffic goes to the other subscriber.
    drop(s);
    sub.close().await.unwrap();
    wait_active(&b, 2).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    traffic(&publ, &key, 301..601, &mut [&mut o]).await;
    assert_eq!(
        kept.payload,
        payload(0, 3000),
        "written over after the connection"
    );
    assert!(
        held(&b).1 >= 1,
        "the kept entry is not held: {:?}",
        held(&b)
    );
    // Dropped: free (the other subscriber dropped all it read).
    drop(kept);
    wait_released(&b).await;
}

/// Publishes messages of 3000 bytes numbered `range`, one at a time, each read (and
/// dropped) by every one of `subs` before the next.
async fn traffic(
    publ: &Client,
    key: &Key,
    range: std::ops::Range<u32>,
    subs: &mut [&mut hayate_client::Subscription],
) {
    for i in range {
        publ.publish(key, payload(i, 3000)).await.unwrap();
        publ.flush().await.unwrap();
        for s in subs.iter_mut() {
            assert_eq!(
                within(10, s.next()).await.unwrap().payload,
                payload(i, 3000)
            );
        }
    }
}

/// The child of `a_holder_killed_with_entries_held_frees_them`: connects in place,
/// subscribes, says so, keeps every message it gets, and waits to be killed.
#[tokio::test]
#[ignore = "run by a_holder_killed_with_entries_held_frees_them, in a process of its own"]
async fn holder_child() {
    let Ok(addr) = std::env::var("HAYATE_TEST_HOLDER_ADDR") else {
        return;
    };
    let c = Client::connect(&addr).await.unwrap();
    assert_eq!(c.transport(), "shm");
    let mut s = c.subscribe("kill/**").await.unwrap();
    c.flush().await.unwrap();
    println!("SUBSCRIBED");
    let mut kept = Vec::new();
    while let Some(m) = s.next().await {
        kept.push(m);
        println!("KEPT {}", kept.len());
    }
}

/// A process reading in place, killed (SIGKILL) while it holds entries past its quota's
/// worth of traffic: the broker sees the process gone and frees what it held; the others
/// carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_entries_held_frees_them() {
    use std::io::BufRead;
    let mut config = Config::default();
    config.native.shm_fanout_bytes = 256 << 10;
    let b = start(config).await;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["holder_child", "--exact", "--ignored", "--nocapture"])
        .env("HAYATE_TEST_HOLDER_ADDR", &b.addr)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut wait_for = move |what: &str| {
        for l in lines.by_ref() {
            if l.unwrap().starts_with(what) {
                return;
            }
        }
        panic!("the holder ended before {what}");
    };
    tokio::task::block_in_place(|| wait_for("SUBSCRIBED"));
    let publ = Client::connect(&b.addr).await.unwrap();
    let key = Key::new("kill/a").unwrap();
    for i in 0..10 {
        publ.publish(&key, payload(i, 3000)).await.unwrap();
        publ.flush().await.unwrap();
    }
    tokio::task::block_in_place(|| wait_for("KEPT 10"));
    // Each message one entry or several in one (a publisher's batch): all held.
    let (entries, refs) = held(&b);
    assert!(entries >= 1 && refs == entries, "{:?}", held(&b));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_active(&b, 1).await;
    // Gone: its entries are freed (when the arena's state is next looked at).
    wait_released(&b).await;
    let c = Client::connect(&b.addr).await.unwrap();
    let mut s = c.subscribe("kill/**").await.unwrap();
    c.flush().await.unwrap();
    publ.publish(&key, payload(11, 3000)).await.unwrap();
    publ.flush().await.unwrap();
    assert_eq!(
        within(10, s.next()).await.unwrap().payload,
        payload(11, 3000)
    );
}

/// Large payloads published back to back go out in PUB_BATCHes of several (by reference,
/// while the writer is busy): every subscriber, in place on shared memory or on TCP, gets
/// every one intact and in order.
#[tokio::test]
async fn large_payloads_back_to_back_arrive_whole_and_in_order() {
    let b = start_default().await;
    let publ = Client::connect(&b.addr).await.unwrap();
    let shm_sub = Client::connect(&b.addr).await.unwrap();
    let tcp_sub = on_tcp(&b).await;
    let mut subs = Vec::new();
    for c in [&shm_sub, &tcp_sub] {
        subs.push(c.subscribe("big/**").await.unwrap());
        c.flush().await.unwrap();
    }
    let key = Key::new("big/a").unwrap();
    let n = 60u32;
    let send = async {
        for i in 0..n {
            publ.publish(&key, payload(i, 70_000 + i as usize))
                .await
                .unwrap();
        }
        publ.flush().await.unwrap();
    };
    let receive = async {
        for s in subs.iter_mut() {
            for i in 0..n {
                let m = s.next().await.unwrap();
                assert_eq!(m.payload, payload(i, 70_000 + i as usize), "{i}");
            }
        }
    };
    within(30, futures::future::join(send, receive)).await;
}
