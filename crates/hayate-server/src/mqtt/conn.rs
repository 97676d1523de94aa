//! One MQTT connection: CONNECT, then packets until DISCONNECT, an error, a keep-alive
//! timeout, a takeover or shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hayate_broker::{Batch, Session};
use hayate_core::Message;
use hayate_io::transport::{read_some, write_chunks};
use hayate_mqtt::{
    Ack, ByteStr, ConnAck, DecodeError, Disconnect, Packet, ProtocolVersion, Publish, QoS,
    ReasonCode, RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe, decode, decode_connect,
    encode, shared_subscription,
};
use tokio::sync::mpsc;

use super::delivery::{Link, SubInfo, lock, put_packet};
use super::translate::{broker_qos, filter_to_expr, publish_message, will_message};
use super::{Mqtt, MqttSession, PendingWill};
use crate::auth::AuthError;
use crate::frontend::{self, Accepted, Handler, Stop};

const READ_BUF: usize = 64 * 1024;

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
    version: ProtocolVersion,
    /// Topic aliases the client set (alias → topic).
    aliases: HashMap<u16, ByteStr>,
    /// Session expiry interval (seconds; `u32::MAX` never).
    expiry: u32,
    expiry_at_connect: u32,
    /// Send reason strings (5.0 Request Problem Information).
    problem_info: bool,
}

/// The MQTT front-end as the connection driver sees it, once CONNECT is accepted.
struct Driven<'a> {
    conn: Conn<'a>,
    ms: MqttSession,
    kick_rx: mpsc::UnboundedReceiver<super::Handover>,
    /// A takeover received: where the session goes once the input that came before it is
    /// handled (a DISCONNECT there decides what is handed over).
    kicked: Option<super::Handover>,
    max_packet: u32,
    /// 1.5 times the keep alive, if any; the connection ends after that long without input.
    ka: Option<Duration>,
    idle_at: tokio::time::Instant,
    last_read: tokio::time::Instant,
}

impl Handler for Driven<'_> {
    type Frame = Packet;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, End> {
        decode(buf, self.conn.version, self.max_packet)
            .map_err(|e| End::Error(e.reason_code(), e.to_string()))
    }

    async fn handle(&mut self, p: Packet) -> Result<(), End> {
        // PUBLISH, the hot path, without a second level of future around it.
        if let Packet::Publish(p) = p {
            return self
                .conn
                .publish(p, &mut self.ms)
                .await
                .map_err(|(code, msg)| End::Error(code, msg));
        }
        match self.conn.handle(p, &mut self.ms).await {
            Ok(None) => Ok(()),
            Ok(Some(end)) => Err(end),
            Err((code, msg)) => Err(End::Error(code, msg)),
        }
    }

    fn session(&mut self) -> &mut Session {
        &mut self.ms.session
    }

    fn on_read(&mut self) {
        if self.ka.is_some() {
            // A clock read, not a timer move: the deadline catches up when it fires.
            self.last_read = tokio::time::Instant::now();
        }
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.ka.map(|_| self.idle_at)
    }

    async fn on_timer(&mut self) -> Result<(), End> {
        let Some(ka) = self.ka else {
            return Ok(());
        };
        if self.last_read + ka > tokio::time::Instant::now() {
            self.idle_at = self.last_read + ka;
            return Ok(());
        }
        Err(End::KeepAlive)
    }

    async fn event(&mut self) -> End {
        match self.kick_rx.recv().await {
            Some(h) => {
                self.kicked = Some(h);
                End::TakenOver
            }
            None => End::Closed,
        }
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Shutdown => End::Shutdown,
            Stop::Eof | Stop::Io | Stop::WriterGone => End::Closed,
        }
    }
}

/// Serves one MQTT connection until it closes.
pub async fn serve(io: Accepted, mqtt: Arc<Mqtt>) {
    let Accepted {
        mut reader,
        writer,
        mut shutdown,
        busy,
    } = io;
    let mut buf = BytesMut::with_capacity(READ_BUF);
    let max_packet = mqtt.cfg.max_packet_size;

    // CONNECT, within the handshake timeout.
    let connect = {
        let deadline = tokio::time::sleep(mqtt.handshake_timeout);
        tokio::pin!(deadline);
        loop {
            match decode_connect(&mut buf, max_packet) {
                Ok(Some(c)) => break c,
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!("mqtt: bad CONNECT: {e}");
                    if matches!(e, DecodeError::UnsupportedProtocolVersion { .. }) {
                        // The 3.1.1 CONNACK "unacceptable protocol version" (rc 1), which
                        // every version reads.
                        let mut q = std::collections::VecDeque::from([Bytes::from_static(&[
                            0x20, 2, 0, 1,
                        ])]);
                        let _ = write_chunks(&*writer, &mut q).await;
                    }
                    writer.shutdown();
                    return;
                }
            }
            tokio::select! {
                r = read_some(&mut reader, &mut buf, None, busy.as_ref()) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                },
                _ = &mut deadline => {
                    writer.shutdown();
                    return;
                }
                _ = shutdown.changed() => return,
            }
        }
    };
    let version = connect.protocol_version;

    // Authentication and the client identifier.
    let w = &writer;
    let refuse = |code: ReasonCode| async move {
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
            let mut q = std::collections::VecDeque::from([out.freeze()]);
            let _ = write_chunks(&**w, &mut q).await;
        }
        w.shutdown();
    };
    if connect.properties.authentication_method.is_some() {
        refuse(ReasonCode::BadAuthenticationMethod).await;
        return;
    }
    if let Err(e) = mqtt.auth.authenticate(
        "mqtt",
        connect.username.as_deref(),
        connect.password.as_deref(),
    ) {
        refuse(match e {
            AuthError::NotAuthorized => ReasonCode::NotAuthorized,
            AuthError::BadCredentials => ReasonCode::BadUserNameOrPassword,
        })
        .await;
        return;
    }
    let mut assigned = None;
    let client_id = if connect.client_id.is_empty() {
        if !version.is_v5() && !connect.clean_start {
            refuse(ReasonCode::ClientIdentifierNotValid).await;
            return;
        }
        let id = format!("hayate-{:016x}", rand_id());
        assigned = Some(id.clone());
        id
    } else {
        connect.client_id.as_str().to_string()
    };
    let will = match will_message(connect.will.as_ref()) {
        Ok(w) => w,
        Err(_) => {
            refuse(ReasonCode::TopicNameInvalid).await;
            return;
        }
    };
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

    // The session: new, parked, or taken over from another connection.
    let conn_id = mqtt.next_conn();
    let (kick_tx, kick_rx) = mpsc::unbounded_channel();
    let (prior, prior_will) = mqtt.acquire(&client_id, conn_id, kick_tx).await;
    let (mut ms, present) = match prior {
        Some(s) if !connect.clean_start => (s, true),
        Some(mut old) => {
            // A clean start ends the old session now: its delayed will is due now.
            if let Some(w) = prior_will {
                mqtt.publish_will(&mut old.session, &w.msg).await;
            }
            drop(old);
            (mqtt.new_session(), false)
        }
        None => (mqtt.new_session(), false),
    };
    mqtt.set_info(&client_id, conn_id, ms.out.clone(), version, expiry);
    mqtt.stats.connected.fetch_add(1, Ordering::Relaxed);
    mqtt.stats.connections.fetch_add(1, Ordering::Relaxed);

    // CONNACK, then what the session has in flight and held.
    let mut keep_alive = connect.keep_alive;
    let mut ack = ConnAck::new(ReasonCode::Success);
    ack.session_present = present;
    if version.is_v5() {
        let max_ka = mqtt.cfg.max_keep_alive;
        if max_ka > 0 && (keep_alive == 0 || keep_alive > max_ka) {
            keep_alive = max_ka;
            ack.properties.server_keep_alive = Some(max_ka);
        }
        let p = &mut ack.properties;
        p.receive_maximum = Some(mqtt.cfg.receive_maximum);
        p.maximum_packet_size = Some(max_packet);
        p.topic_alias_maximum = Some(mqtt.cfg.topic_alias_maximum);
        p.assigned_client_identifier = assigned.map(ByteStr::from);
        if connect.properties.session_expiry_interval.unwrap_or(0) != expiry {
            p.session_expiry_interval = Some(expiry);
        }
    }
    let link = Link::new(
        version,
        connect.properties.receive_maximum.unwrap_or(u16::MAX),
        connect
            .properties
            .maximum_packet_size
            .unwrap_or(hayate_mqtt::MAX_PACKET_SIZE),
        connect.properties.topic_alias_maximum.unwrap_or(0),
    );
    let outbox = ms.session.outbox().clone();
    let accepted = Accepted {
        reader,
        writer,
        shutdown,
        busy,
    };
    let mut io = frontend::Conn::new(accepted, buf, &outbox);
    outbox.push_reply_unbudgeted(|o| {
        put_packet(&Packet::ConnAck(Box::new(ack)), version, o);
        lock(&ms.out).go_online(link, o);
    });
    ms.session.mark_own_output();
    ms.session.flush();
    tracing::debug!(client_id, ?version, present, "mqtt: connected");

    let conn = Conn {
        mqtt: &mqtt,
        version,
        aliases: HashMap::new(),
        expiry,
        expiry_at_connect: expiry,
        problem_info: connect
            .properties
            .request_problem_information
            .unwrap_or(true),
    };
    let ka = (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
    let mut h = Driven {
        conn,
        ms,
        kick_rx,
        kicked: None,
        max_packet,
        ka,
        idle_at: tokio::time::Instant::now() + ka.unwrap_or_default(),
        last_read: tokio::time::Instant::now(),
    };
    let end = io.drive(&mut h).await;
    let Driven {
        conn,
        mut ms,
        mut kick_rx,
        kicked,
        ..
    } = h;
    // Deliveries made by the packets handled last still have to leave.
    ms.session.flush();
    tracing::debug!(client_id, ?end, "mqtt: connection ends");
    mqtt.stats.connected.fetch_sub(1, Ordering::Relaxed);

    // A last word to a 5.0 client.
    let last = match &end {
        End::Error(code, msg) => Some((*code, msg.clone())),
        End::KeepAlive => Some((ReasonCode::KeepAliveTimeout, "keep alive timeout".into())),
        End::TakenOver => Some((ReasonCode::SessionTakenOver, "session taken over".into())),
        End::Shutdown => Some((
            ReasonCode::ServerShuttingDown,
            "server shutting down".into(),
        )),
        End::Disconnect { .. } | End::Closed => None,
    };
    if let Some((code, msg)) = last
        && version.is_v5()
    {
        let mut d = Disconnect::new(code);
        if conn.problem_info && !msg.is_empty() {
            d.properties.reason_string = Some(truncate(&msg).into());
        }
        outbox.push_reply_unbudgeted(|o| put_packet(&Packet::Disconnect(d), version, o));
        ms.session.mark_own_output();
        ms.session.flush();
    }
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

    let persistent = expiry > 0 || matches!(end, End::TakenOver);
    if persistent {
        // Let the writer send what is queued (a last DISCONNECT) before detaching, which
        // discards it; not for long: the client may have stopped reading.
        for _ in 0..100 {
            match outbox.backlog() {
                (0, false) => break,
                _ if io.writer_done() => break,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
        // Keep the subscriptions; hold deliveries for the next connection.
        outbox.detach(|| lock(&ms.out).go_offline());
    } else {
        outbox.close();
    }
    io.finish().await;
    if expiry != conn.expiry_at_connect {
        // Changed by the DISCONNECT: what is saved must say so.
        mqtt.set_info(&client_id, conn_id, ms.out.clone(), version, expiry);
    }
    let dropped = match (end, kicked) {
        (End::TakenOver, Some(to)) => to.send((Some(ms), parked_will)).err().and_then(|(s, _)| s),
        (_, kicked) => mqtt.release(
            &client_id,
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

/// Applies an acknowledgement from the client to the session's delivery state, under the
/// outbox lock (it may free the window and send held messages).
fn settle(
    ms: &mut MqttSession,
    f: impl FnOnce(&mut super::delivery::MqttDeliveries, &mut hayate_broker::OutBuf),
) {
    let out = ms.out.clone();
    ms.session
        .outbox()
        .push_reply_unbudgeted(|o| f(&mut lock(&out), o));
    ms.session.mark_own_output();
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

impl Conn<'_> {
    /// Handles one packet: `Ok(Some(end))` ends the connection.
    async fn handle(&mut self, p: Packet, ms: &mut MqttSession) -> Result<Option<End>, Fail> {
        let v = self.version;
        match p {
            Packet::Publish(p) => self.publish(p, ms).await?,
            Packet::PubAck(a) => settle(ms, |st, o| {
                st.puback(a.packet_id, o);
            }),
            Packet::PubRec(a) => settle(ms, |st, o| {
                st.pubrec(a.packet_id, a.reason_code.is_error(), o);
            }),
            Packet::PubComp(a) => settle(ms, |st, o| {
                st.pubcomp(a.packet_id, o);
            }),
            Packet::PubRel(a) => {
                let known = lock(&ms.out).incoming.remove(&a.packet_id);
                let ack = if known || !v.is_v5() {
                    Ack::new(a.packet_id)
                } else {
                    Ack::with_reason(a.packet_id, ReasonCode::PacketIdentifierNotFound)
                };
                self.reply(ms, &Packet::PubComp(ack));
            }
            Packet::Subscribe(s) => self.subscribe(s, ms)?,
            Packet::Unsubscribe(u) => self.unsubscribe(u, ms),
            Packet::PingReq => self.reply(ms, &Packet::PingResp),
            Packet::Disconnect(d) => {
                if let Some(e) = d.properties.session_expiry_interval {
                    if self.expiry == 0 && e > 0 {
                        return Err(fail(
                            ReasonCode::ProtocolError,
                            "session expiry set on DISCONNECT after 0 on CONNECT",
                        ));
                    }
                    self.expiry = e.min(self.mqtt.cfg.max_session_expiry);
                }
                // Only a normal disconnection (0x00) deletes the will (MQTT-3.1.2-8).
                return Ok(Some(End::Disconnect {
                    publish_will: d.reason_code != ReasonCode::Success,
                }));
            }
            Packet::Connect(_) => {
                return Err(fail(ReasonCode::ProtocolError, "second CONNECT"));
            }
            Packet::Auth(_) => {
                return Err(fail(
                    ReasonCode::ProtocolError,
                    "AUTH without an authentication method",
                ));
            }
            other => {
                return Err(fail(
                    ReasonCode::ProtocolError,
                    format!("a client may not send {}", other.packet_type().name()),
                ));
            }
        }
        Ok(None)
    }

    /// Queues a control packet for this client (sent at the end of the read).
    fn reply(&self, ms: &mut MqttSession, p: &Packet) {
        let v = self.version;
        ms.session
            .outbox()
            .push_reply_unbudgeted(|o| put_packet(p, v, o));
        ms.session.mark_own_output();
    }

    async fn publish(&mut self, p: Publish, ms: &mut MqttSession) -> Result<(), Fail> {
        let topic = match p.properties.topic_alias {
            Some(a) => {
                if a == 0 || a > self.mqtt.cfg.topic_alias_maximum {
                    return Err(fail(
                        ReasonCode::TopicAliasInvalid,
                        format!("topic alias {a} is out of range"),
                    ));
                }
                if p.topic.is_empty() {
                    match self.aliases.get(&a) {
                        Some(t) => t.clone(),
                        None => {
                            return Err(fail(
                                ReasonCode::ProtocolError,
                                format!("topic alias {a} was never set"),
                            ));
                        }
                    }
                } else {
                    // Copied: an alias outlives the read buffer the topic is in.
                    let t = ByteStr::from(p.topic.as_str());
                    self.aliases.insert(a, t.clone());
                    t
                }
            }
            None if p.topic.is_empty() => {
                return Err(fail(ReasonCode::ProtocolError, "empty topic name"));
            }
            None => p.topic.clone(),
        };
        let msg = publish_message(&topic, &p)
            .map_err(|e| fail(ReasonCode::TopicNameInvalid, e.to_string()))?;
        self.mqtt.stats.received.fetch_add(1, Ordering::Relaxed);
        // Clients may not publish into the broker's own `$SYS` tree; acknowledged, dropped.
        let sys = super::is_sys(topic.as_str());
        match (p.qos, p.packet_id) {
            (QoS::AtMostOnce, _) => {
                if !sys {
                    self.route(&msg, &mut ms.session).await;
                }
            }
            (QoS::AtLeastOnce, Some(pid)) => {
                if !sys {
                    self.route(&msg, &mut ms.session).await;
                }
                self.reply(ms, &Packet::PubAck(Ack::new(pid)));
            }
            (QoS::ExactlyOnce, Some(pid)) => {
                let first = {
                    let mut st = lock(&ms.out);
                    if st.incoming.contains(&pid) {
                        false
                    } else if st.incoming.len() >= usize::from(self.mqtt.cfg.receive_maximum) {
                        return Err(fail(
                            ReasonCode::ReceiveMaximumExceeded,
                            "too many QoS 2 messages unreleased",
                        ));
                    } else {
                        st.incoming.insert(pid);
                        true
                    }
                };
                if first && !sys {
                    self.route(&msg, &mut ms.session).await;
                }
                self.reply(ms, &Packet::PubRec(Ack::new(pid)));
            }
            (_, None) => {
                return Err(fail(ReasonCode::ProtocolError, "QoS > 0 without packet id"));
            }
        }
        Ok(())
    }

    async fn route(&self, msg: &Message, session: &mut Session) {
        if msg.attrs.retain {
            self.mqtt.retain(msg);
        }
        session.publish(Batch::One(msg)).await;
    }

    fn subscribe(&mut self, s: Subscribe, ms: &mut MqttSession) -> Result<(), Fail> {
        let v = self.version;
        let sub_id = s.properties.subscription_identifier;
        let mut codes = Vec::with_capacity(s.subscriptions.len());
        let mut retained = Vec::new();
        for sub in &s.subscriptions {
            let o = sub.options;
            let (group, filter) = match shared_subscription(&sub.filter) {
                Some(sh) => (Some(sh.group), sh.filter),
                None => (None, sub.filter.as_str()),
            };
            if group.is_some() && o.no_local {
                return Err(fail(
                    ReasonCode::ProtocolError,
                    "no local on a shared subscription",
                ));
            }
            let Ok(expr) = filter_to_expr(filter) else {
                codes.push(if v.is_v5() {
                    ReasonCode::TopicFilterInvalid
                } else {
                    ReasonCode::UnspecifiedError
                });
                continue;
            };
            let skip_dollar = filter.starts_with('+') || filter.starts_with('#');
            let info = SubInfo {
                filter: sub.filter.as_str().to_string(),
                qos: o.qos,
                no_local: o.no_local,
                retain_as_published: o.retain_as_published,
                retain_handling: o.retain_handling,
                id: sub_id,
                skip_dollar,
            };
            let existed = ms.subs.get(sub.filter.as_str());
            let sid = match existed {
                Some(sid) => {
                    let before = lock(&ms.out).subs.insert(sid, info).map(|i| i.qos);
                    // QoS 0 drops under congestion, QoS 1/2 block: a change between them
                    // re-registers the subscription with the broker (same id).
                    if before.map(broker_qos) != Some(broker_qos(o.qos)) {
                        ms.session.unsubscribe(sid);
                        if let Err(e) =
                            ms.session
                                .subscribe(sid, expr.clone(), group, broker_qos(o.qos))
                        {
                            tracing::warn!("mqtt: subscribe failed: {e}");
                        }
                    }
                    sid
                }
                None => {
                    let sid = ms.subs.next_sid();
                    // Options first: a delivery may arrive as soon as the broker knows.
                    lock(&ms.out).subs.insert(sid, info);
                    if let Err(e) =
                        ms.session
                            .subscribe(sid, expr.clone(), group, broker_qos(o.qos))
                    {
                        lock(&ms.out).subs.remove(&sid);
                        tracing::warn!("mqtt: subscribe failed: {e}");
                        codes.push(ReasonCode::UnspecifiedError);
                        continue;
                    }
                    ms.subs.bind(sub.filter.as_str().to_string(), sid);
                    sid
                }
            };
            codes.push(ReasonCode::granted(o.qos));
            let send_retained = group.is_none()
                && match o.retain_handling {
                    RetainHandling::SendAtSubscribe => true,
                    RetainHandling::SendAtSubscribeIfNew => existed.is_none(),
                    RetainHandling::DoNotSend => false,
                };
            if send_retained {
                retained.push((sid, self.mqtt.retained_matching(&expr, skip_dollar)));
            }
        }
        self.reply(ms, &Packet::SubAck(SubAck::new(s.packet_id, codes)));
        if retained.iter().any(|(_, m)| !m.is_empty()) {
            let out = ms.out.clone();
            ms.session.outbox().push_reply_unbudgeted(|o| {
                let mut st = lock(&out);
                for (sid, msgs) in &retained {
                    for m in msgs {
                        st.deliver(*sid, &m.key, &m.payload, Some(m), 0, true, o);
                    }
                }
            });
            ms.session.mark_own_output();
        }
        Ok(())
    }

    fn unsubscribe(&mut self, u: Unsubscribe, ms: &mut MqttSession) {
        let mut codes = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            match ms.subs.remove(f.as_str()) {
                Some(sid) => {
                    ms.session.unsubscribe(sid);
                    lock(&ms.out).subs.remove(&sid);
                    codes.push(ReasonCode::Success);
                }
                None => codes.push(ReasonCode::NoSubscriptionExisted),
            }
        }
        if !self.version.is_v5() {
            codes.clear();
        }
        self.reply(ms, &Packet::UnsubAck(UnsubAck::new(u.packet_id, codes)));
    }
}
