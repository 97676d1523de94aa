//! One MQTT connection: CONNECT, then packets until DISCONNECT, an error, a keep-alive
//! timeout, a takeover or shutdown.
//!
//! # Layout
//! - this module: [`serve`], the connection's life: the CONNECT handshake (authentication,
//!   client identifier, will, session expiry), the session (new, parked or taken over) and
//!   CONNACK, then the end (a last DISCONNECT, the will, parking, handing over or dropping
//!   the session);
//! - `packets`: the packets between: the connection driver's handler and each packet's
//!   handling.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hayate_broker::Outbox;
use hayate_core::Message;
use hayate_core::sync::lock;
use hayate_io::conn::READ_BUF;
use hayate_io::traffic::TrafficClass;
use hayate_io::transport::{Writer, read_some, write_chunks};
use hayate_mqtt::{
    ByteStr, ConnAck, Connect, DecodeError, Disconnect, Packet, ProtocolVersion, ReasonCode,
    decode_connect, encode,
};
use tokio::sync::mpsc;

use super::delivery::{Link, put_packet};
use super::registry::Handover;
use super::translate::will_message;
use super::{Mqtt, MqttSession, PendingWill};
use hayate_front::auth::{AuthError, Credentials, Identity};
use hayate_front::{Accepted, Peer, Serving};

mod packets;

/// A refusal: the reason code and a reason string (sent to 5.0 clients).
type Fail = (ReasonCode, String);

fn fail(code: ReasonCode, msg: impl Into<String>) -> Fail {
    (code, msg.into())
}

/// Why the connection ends.
#[derive(Debug)]
enum End {
    /// DISCONNECT from the client.
    Disconnect {
        /// The reason code was not 0x00 (normal disconnection): the will is published.
        publish_will: bool,
    },
    /// A protocol error: tell a 5.0 client, publish the will.
    Error(ReasonCode, String),
    /// No packet within 1.5 times the keep alive.
    KeepAlive,
    /// EOF or an I/O error.
    Closed,
    /// Another connection took the session over (the handover is in `Driven::kicked`).
    TakenOver,
    /// The server is shutting down.
    Shutdown,
}

/// The connection's settings and per-connection state.
struct Conn<'a> {
    mqtt: &'a Mqtt,
    /// Who the client is: its permissions.
    identity: hayate_front::auth::Identity,
    version: ProtocolVersion,
    /// Topic aliases the client set (alias → topic).
    aliases: HashMap<u16, ByteStr>,
    /// Session expiry interval (seconds; `u32::MAX` never).
    expiry: u32,
    expiry_at_connect: u32,
    /// Send reason strings (5.0 Request Problem Information).
    problem_info: bool,
    /// PUBACKs / PUBRECs waiting for the streams that captured their message to keep it
    /// durably, in the order of their PUBLISHes (as MQTT requires).
    /// (In a mutex only to be `Sync`, as the handler's futures borrow `Conn`; never
    /// contended: reached through `&mut`.)
    acks: std::sync::Mutex<futures::stream::FuturesOrdered<PendingAck>>,
}

impl Conn<'_> {
    fn acks(&mut self) -> &mut futures::stream::FuturesOrdered<PendingAck> {
        self.acks
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A PUBACK or PUBREC (`true`) for a packet id, once its message is stored (or failed).
pub(crate) type PendingAck = futures::future::BoxFuture<'static, (u16, bool, Result<(), String>)>;

/// At this many PUBACKs / PUBRECs waiting for their streams, the connection's input is held.
pub(crate) const MAX_PENDING_ACKS: usize = 4096;

/// The MQTT front-end as the connection driver sees it, once CONNECT is accepted.
struct Driven<'a> {
    conn: Conn<'a>,
    ms: MqttSession,
    kick_rx: mpsc::UnboundedReceiver<super::registry::Handover>,
    /// A takeover received: where the session goes once the input that came before it is
    /// handled (a DISCONNECT there decides what is handed over).
    kicked: Option<super::registry::Handover>,
    max_packet: u32,
    /// 1.5 times the keep alive, if any; the connection ends after that long without input.
    ka: Option<Duration>,
    idle_at: tokio::time::Instant,
    last_read: tokio::time::Instant,
}

/// What CONNECT settles once it is accepted: who the client is and its session's terms.
struct Hello {
    identity: Identity,
    client_id: String,
    /// The identifier the server gave a client that sent an empty one (5.0).
    assigned: Option<String>,
    /// The will and its delay (seconds).
    will: Option<(Message, u32)>,
    /// The session expiry interval granted (seconds; `u32::MAX` never).
    expiry: u32,
}

/// The session a connection took, and its turn in the registry.
struct Taken {
    ms: MqttSession,
    /// The session was kept from before (CONNACK's Session Present).
    present: bool,
    conn_id: u64,
    /// Where a later connection with the same client id asks for the session.
    kick_rx: mpsc::UnboundedReceiver<Handover>,
}

/// Serves one MQTT connection until it closes.
pub async fn serve(mut io: Accepted, mqtt: Arc<Mqtt>) {
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let Some(connect) = read_connect(&mut io, &mut buf, &mqtt).await else {
        return;
    };
    let version = connect.protocol_version;
    let peer = Peer::of(&io);
    let (mut hello, taken) = match hello(&connect, &mqtt, &peer).await {
        Ok(hello) => match take_session(&connect, &hello, &mqtt, io.class.as_ref()).await {
            Ok(taken) => (hello, taken),
            Err(code) => return refuse(&io.writer, version, code).await,
        },
        Err(code) => return refuse(&io.writer, version, code).await,
    };
    let Taken {
        mut ms,
        present,
        conn_id,
        kick_rx,
    } = taken;
    peer.set_client_id(Some(&hello.client_id));
    let client_id = hello.client_id.clone();
    mqtt.set_info(&client_id, conn_id, ms.out.clone(), version, hello.expiry);
    mqtt.stats.connected.fetch_add(1, Ordering::Relaxed);
    mqtt.stats.connections.fetch_add(1, Ordering::Relaxed);

    // CONNACK, then what the session has in flight and held.
    let (ack, keep_alive) = connack(&connect, &mqtt, &mut hello, present);
    let mut serving = Serving::attach(io, buf, &ms.session);
    serving.outbox.push_reply_unbudgeted(|o| {
        put_packet(&Packet::ConnAck(Box::new(ack)), version, o);
        lock(&ms.out).go_online(link(&connect), o);
    });
    ms.session.mark_own_output();
    ms.session.flush();
    tracing::debug!(client_id, ?version, present, "mqtt: connected");

    let conn = Conn {
        mqtt: &mqtt,
        identity: hello.identity,
        version,
        aliases: HashMap::new(),
        expiry: hello.expiry,
        expiry_at_connect: hello.expiry,
        problem_info: connect
            .properties
            .request_problem_information
            .unwrap_or(true),
        acks: std::sync::Mutex::new(futures::stream::FuturesOrdered::new()),
    };
    let ka = (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
    let mut h = Driven {
        conn,
        ms,
        kick_rx,
        kicked: None,
        max_packet: mqtt.cfg.max_packet_size,
        ka,
        idle_at: tokio::time::Instant::now() + ka.unwrap_or_default(),
        last_read: tokio::time::Instant::now(),
    };
    let end = serving.conn.drive(&mut h).await;
    finish(h, end, serving, &client_id, conn_id, hello.will).await;
}

/// Reads CONNECT within the handshake timeout. `None`: the connection is over (a bad
/// CONNECT, one of a version this server does not speak, EOF, the timeout or shutdown).
async fn read_connect(io: &mut Accepted, buf: &mut BytesMut, mqtt: &Mqtt) -> Option<Connect> {
    let max = mqtt.cfg.max_packet_size.min(mqtt.max_preauth);
    let deadline = tokio::time::sleep(mqtt.handshake_timeout);
    tokio::pin!(deadline);
    loop {
        match decode_connect(buf, max) {
            Ok(Some(c)) => return Some(c),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!("mqtt: bad CONNECT: {e}");
                if matches!(e, DecodeError::UnsupportedProtocolVersion { .. }) {
                    // The 3.1.1 CONNACK "unacceptable protocol version" (rc 1), which
                    // every version reads.
                    let mut q = VecDeque::from([Bytes::from_static(&[0x20, 2, 0, 1])]);
                    let _ = write_chunks(&*io.writer, &mut q).await;
                }
                io.writer.shutdown();
                return None;
            }
        }
        tokio::select! {
            r = read_some(&mut io.reader, buf, None, io.busy.as_ref()) => match r {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
            _ = &mut deadline => {
                io.writer.shutdown();
                return None;
            }
            _ = io.shutdown.changed() => return None,
        }
    }
}

/// Refuses CONNECT with `code` (to a 3.1.1 client only if 3.1.1 has it) and closes.
async fn refuse(w: &Writer, version: ProtocolVersion, code: ReasonCode) {
    let mut out = BytesMut::new();
    let code = if version.is_v5() {
        Some(code)
    } else {
        code.to_v3_connack().map(|_| code)
    };
    if let Some(code) = code
        && encode(
            &Packet::ConnAck(Box::new(ConnAck::new(code))),
            version,
            &mut out,
        )
        .is_ok()
    {
        let mut q = VecDeque::from([out.freeze()]);
        let _ = write_chunks(&**w, &mut q).await;
    }
    w.shutdown();
}

/// Checks CONNECT: the login, the client identifier (one is assigned for an empty one),
/// the will (may the client publish it?) and the session expiry granted. `Err`: the
/// reason code that refuses it.
async fn hello(connect: &Connect, mqtt: &Mqtt, peer: &Peer) -> Result<Hello, ReasonCode> {
    let version = connect.protocol_version;
    if connect.properties.authentication_method.is_some() {
        return Err(ReasonCode::BadAuthenticationMethod);
    }
    let creds = Credentials {
        user: connect.username.as_deref(),
        password: connect.password.as_deref(),
        ..Credentials::default()
    };
    let identity = peer
        .login(&*mqtt.auth, "mqtt", creds)
        .await
        .map_err(|e| match e {
            AuthError::NotAuthorized => ReasonCode::NotAuthorized,
            AuthError::BadCredentials => ReasonCode::BadUserNameOrPassword,
            AuthError::Throttled | AuthError::Busy => ReasonCode::ServerBusy,
            AuthError::TooManyConnections => ReasonCode::QuotaExceeded,
        })?;
    let mut assigned = None;
    let client_id = if connect.client_id.is_empty() {
        if !version.is_v5() && !connect.clean_start {
            return Err(ReasonCode::ClientIdentifierNotValid);
        }
        let id = format!("hayate-{:016x}", rand_id());
        assigned = Some(id.clone());
        id
    } else {
        connect.client_id.as_str().to_string()
    };
    let will = will_message(connect.will.as_ref()).map_err(|_| ReasonCode::TopicNameInvalid)?;
    if let Some(w) = &will
        && hayate_front::check_publish(&identity, &w.0.key, w.0.reply_to.is_some()).is_err()
    {
        return Err(ReasonCode::NotAuthorized);
    }
    let expiry = if version.is_v5() {
        connect
            .properties
            .session_expiry_interval
            .unwrap_or(0)
            .min(mqtt.cfg.max_session_expiry)
    } else if connect.clean_start {
        0
    } else {
        // 3.1.1 sessions never expire, unless the configuration caps them.
        mqtt.cfg.max_session_expiry
    };
    Ok(Hello {
        identity,
        client_id,
        assigned,
        will,
        expiry,
    })
}

/// Takes the client's session: parked, or taken over from another connection, or a new
/// one (a clean start ends an old one now, and its delayed will is due now). `Err`: the
/// client id is another user's.
async fn take_session(
    connect: &Connect,
    hello: &Hello,
    mqtt: &Mqtt,
    class: Option<&Arc<TrafficClass>>,
) -> Result<Taken, ReasonCode> {
    let conn_id = mqtt.next_conn();
    let (kick_tx, kick_rx) = mpsc::unbounded_channel();
    // With users configured a client id belongs to the user whose session it is.
    let owner = mqtt
        .auth
        .required()
        .then(|| hello.identity.user.clone())
        .flatten();
    let Ok((prior, prior_will)) = mqtt
        .acquire(&hello.client_id, conn_id, kick_tx, owner.as_ref())
        .await
    else {
        tracing::info!(
            client_id = hello.client_id,
            user = hello.identity.name(),
            "mqtt: client id owned by another user"
        );
        return Err(ReasonCode::NotAuthorized);
    };
    let (ms, present) = match prior {
        Some(s) if !connect.clean_start => (s, true),
        Some(mut old) => {
            // A clean start ends the old session now: its delayed will is due now.
            if let Some(w) = prior_will {
                mqtt.publish_will(&mut old.session, &w.msg).await;
            }
            drop(old);
            (mqtt.new_session_in(class), false)
        }
        None => (mqtt.new_session_in(class), false),
    };
    Ok(Taken {
        ms,
        present,
        conn_id,
        kick_rx,
    })
}

/// CONNACK for `connect`, and the keep alive in force (the server's cap, for a 5.0
/// client).
fn connack(connect: &Connect, mqtt: &Mqtt, hello: &mut Hello, present: bool) -> (ConnAck, u16) {
    let mut keep_alive = connect.keep_alive;
    let mut ack = ConnAck::new(ReasonCode::Success);
    ack.session_present = present;
    if connect.protocol_version.is_v5() {
        let max_ka = mqtt.cfg.max_keep_alive;
        if max_ka > 0 && (keep_alive == 0 || keep_alive > max_ka) {
            keep_alive = max_ka;
            ack.properties.server_keep_alive = Some(max_ka);
        }
        let p = &mut ack.properties;
        p.receive_maximum = Some(mqtt.cfg.receive_maximum);
        p.maximum_packet_size = Some(mqtt.cfg.max_packet_size);
        p.topic_alias_maximum = Some(mqtt.cfg.topic_alias_maximum);
        p.assigned_client_identifier = hello.assigned.take().map(ByteStr::from);
        if connect.properties.session_expiry_interval.unwrap_or(0) != hello.expiry {
            p.session_expiry_interval = Some(hello.expiry);
        }
    }
    (ack, keep_alive)
}

/// What the client said it takes: its receive maximum, largest packet and topic aliases.
fn link(connect: &Connect) -> Link {
    let p = &connect.properties;
    Link::new(
        connect.protocol_version,
        p.receive_maximum.unwrap_or(u16::MAX),
        p.maximum_packet_size
            .unwrap_or(hayate_mqtt::MAX_PACKET_SIZE),
        p.topic_alias_maximum.unwrap_or(0),
    )
}

/// The end of a connection: a last word to a 5.0 client, the will (published now, or
/// parked with a session that outlives the connection), then the session parked, handed
/// over to the connection that took it over, or dropped.
async fn finish(
    h: Driven<'_>,
    end: End,
    serving: Serving,
    client_id: &str,
    conn_id: u64,
    will: Option<(Message, u32)>,
) {
    let Driven {
        conn,
        mut ms,
        mut kick_rx,
        kicked,
        ..
    } = h;
    let mqtt = conn.mqtt;
    // Deliveries made by the packets handled last still have to leave.
    ms.session.flush();
    tracing::debug!(client_id, ?end, "mqtt: connection ends");
    mqtt.stats.connected.fetch_sub(1, Ordering::Relaxed);
    last_word(&end, &conn, &mut ms, &serving.outbox);
    let publish_will = !matches!(
        end,
        End::Disconnect {
            publish_will: false
        } | End::Shutdown
    );
    let expiry = conn.expiry;

    // The will: now, or after its delay if the session outlives the connection.
    let mut parked_will = None;
    if publish_will && let Some((msg, delay)) = will {
        if delay == 0 || expiry == 0 {
            mqtt.publish_will(&mut ms.session, &msg).await;
        } else {
            // Parked with the session, or handed over with it on a takeover.
            parked_will = Some(PendingWill {
                due: Instant::now() + Duration::from_secs(u64::from(delay.min(expiry))),
                msg,
            });
        }
    }

    let outbox = &serving.outbox;
    if expiry > 0 || matches!(end, End::TakenOver) {
        // Let the writer send what is queued (a last DISCONNECT) before detaching, which
        // discards it; not for long: the client may have stopped reading.
        for _ in 0..100 {
            match outbox.backlog() {
                (0, false) => break,
                _ if serving.conn.writer_done() => break,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        // Keep the subscriptions; hold deliveries for the next connection.
        outbox.detach(|| lock(&ms.out).go_offline());
    } else {
        outbox.close();
    }
    // The connection's entry (in `serving`) stays until the session is settled.
    serving.conn.finish().await;
    if expiry != conn.expiry_at_connect {
        // Changed by the DISCONNECT: what is saved must say so.
        mqtt.set_info(client_id, conn_id, ms.out.clone(), conn.version, expiry);
    }
    let dropped = match (end, kicked) {
        (End::TakenOver, Some(to)) => to.send((Some(ms), parked_will)).err().and_then(|(s, _)| s),
        (_, kicked) => mqtt.release(
            client_id,
            conn_id,
            kicked,
            &mut kick_rx,
            ms,
            expiry,
            parked_will,
        ),
    };
    drop(dropped);
}

/// A last DISCONNECT to a 5.0 client, saying why the server ends the connection.
fn last_word(end: &End, conn: &Conn<'_>, ms: &mut MqttSession, outbox: &Outbox) {
    let (code, msg) = match end {
        End::Error(code, msg) => (*code, msg.clone()),
        End::KeepAlive => (ReasonCode::KeepAliveTimeout, "keep alive timeout".into()),
        End::TakenOver => (ReasonCode::SessionTakenOver, "session taken over".into()),
        End::Shutdown => (
            ReasonCode::ServerShuttingDown,
            "server shutting down".into(),
        ),
        End::Disconnect { .. } | End::Closed => return,
    };
    let version = conn.version;
    if !version.is_v5() {
        return;
    }
    let mut d = Disconnect::new(code);
    if conn.problem_info && !msg.is_empty() {
        d.properties.reason_string = Some(truncate(&msg).into());
    }
    outbox.push_reply_unbudgeted(|o| put_packet(&Packet::Disconnect(d), version, o));
    ms.session.mark_own_output();
    ms.session.flush();
}

/// Reason strings are capped (a reason string may not make a packet too large).
fn truncate(s: &str) -> &str {
    let mut n = s.len().min(200);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// A random-enough identifier for assigned client ids.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}
