//! The packets of a connected client: the connection driver's [`Handler`] (decode, handle,
//! keep-alive timer, takeover) and the handling of each packet (PUBLISH and its
//! acknowledgements, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT).

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use futures::{FutureExt, StreamExt};
use hayate_broker::{Batch, Session, Stored};
use hayate_core::Message;
use hayate_mqtt::{
    Ack, ByteStr, Packet, Publish, QoS, RawPacket, ReasonCode, RetainHandling, SubAck, Subscribe,
    UnsubAck, Unsubscribe, shared_subscription, split,
};

use super::{Conn, Driven, End, Fail, fail};
use crate::MqttSession;
use crate::delivery::{SubInfo, put_packet};
use crate::journal::Durable;
use crate::translate::{broker_qos, filter_to_expr, publish_message};
use hayate_core::sync::lock;
use hayate_front::{Handler, Stop};

/// The error a PUBLISH's acknowledgement carries when its retained copy was not kept for the
/// memory budget (a 5.0 client gets Quota exceeded; the message was routed all the same).
const QUOTA_EXCEEDED: &str = "retained message not kept: the memory budget is spent";

impl Handler for Driven<'_> {
    /// A packet split off the buffer, parsed by `handle`: what moves between the driver's
    /// decoding and handling (and into their futures) is a few words, not a `Packet`.
    type Frame = RawPacket;
    type End = End;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<RawPacket>, End> {
        split(buf, self.conn.version, self.max_packet)
            .map_err(|e| End::Error(e.reason_code(), e.to_string()))
    }

    async fn handle(&mut self, raw: RawPacket) -> Result<(), End> {
        let packet = raw
            .parse(self.conn.version)
            .map_err(|e| fail_end((e.reason_code(), e.to_string())))?;
        // PUBLISH, the hot path: checked and translated here, the packet dropped before the
        // broker's publish is awaited (so it is not part of this future), the message made
        // once and routed by reference.
        let p = match packet {
            Packet::Publish(p) => p,
            // Boxed: the other packets' handling would make every PUBLISH's future larger.
            other => {
                return match Box::pin(self.conn.handle(other, &mut self.ms)).await {
                    Ok(None) => Ok(()),
                    Ok(Some(end)) => Err(end),
                    Err(f) => Err(fail_end(f)),
                };
            }
        };
        let (qos, packet_id) = (p.qos, p.packet_id);
        let (msg, sys) = self.conn.incoming(p).map_err(fail_end)?;
        self.conn
            .publish(&msg, qos, packet_id, sys, &mut self.ms)
            .await
            .map_err(fail_end)
    }

    fn flush(&mut self) {
        // The PUBACKs / PUBRECs of this read wait for the journal: one write for all of
        // them (and for every other connection's records buffered meanwhile).
        self.conn.mqtt.flush_journal();
        self.ms.session.flush();
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

    fn read_limit(&mut self, _buf: &mut BytesMut) -> Option<usize> {
        (self.conn.acks().len() >= super::MAX_PENDING_ACKS).then_some(0)
    }

    async fn event(&mut self) -> Result<(), End> {
        let waiting = !self.conn.acks().is_empty();
        let acks = self
            .conn
            .acks
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kicked = tokio::select! {
            k = self.kick_rx.recv() => k,
            Some((pid, rec, r)) = acks.next(), if waiting => {
                self.conn.acked(&mut self.ms, pid, rec, r).map_err(fail_end)?;
                // Every acknowledgement the same commit made ready, in order, this turn.
                loop {
                    let acks = self.conn.acks.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let Some(Some((pid, rec, r))) = acks.next().now_or_never() else { break };
                    self.conn.acked(&mut self.ms, pid, rec, r).map_err(fail_end)?;
                }
                return Ok(());
            }
        };
        match kicked {
            Some(h) => {
                self.kicked = Some(h);
                Err(End::TakenOver)
            }
            None => Err(End::Closed),
        }
    }

    fn stopped(&mut self, why: Stop) -> End {
        match why {
            Stop::Shutdown => End::Shutdown,
            Stop::Eof | Stop::Io | Stop::WriterGone => End::Closed,
            Stop::Memory => End::Error(
                ReasonCode::QuotaExceeded,
                "memory budget spent: packet not read within limits.max_block_ms".into(),
            ),
        }
    }
}

/// A front-end failure (reason code, message) as the connection's end.
fn fail_end((code, msg): Fail) -> End {
    End::Error(code, msg)
}

/// Applies an acknowledgement from the client to the session's delivery state, under the
/// outbox lock (it may free the window and send held messages).
fn settle(
    ms: &mut MqttSession,
    f: impl FnOnce(&mut crate::delivery::MqttDeliveries, &mut hayate_broker::OutBuf),
) {
    let out = ms.out.clone();
    ms.session
        .outbox()
        .push_reply_unbudgeted(|o| f(&mut lock(&out), o));
    ms.session.mark_own_output();
}

impl Conn<'_> {
    /// Handles one packet: `Ok(Some(end))` ends the connection.
    async fn handle(&mut self, p: Packet, ms: &mut MqttSession) -> Result<Option<End>, Fail> {
        let v = self.version;
        match p {
            Packet::Publish(p) => {
                let (qos, packet_id) = (p.qos, p.packet_id);
                let (msg, sys) = self.incoming(p)?;
                self.publish(&msg, qos, packet_id, sys, ms).await?;
            }
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
                let known = lock(&ms.out).set_incoming(a.packet_id, false);
                // The release is durable before PUBCOMP: the client may reuse the packet id
                // once it has PUBCOMP, and a release forgotten in a crash would make that
                // new PUBLISH look like a duplicate.
                if known {
                    self.mqtt.durable().wait().await.map_err(|e| {
                        fail(
                            ReasonCode::UnspecifiedError,
                            format!("release not stored: {e}"),
                        )
                    })?;
                }
                let ack = if known || !v.is_v5() {
                    Ack::new(a.packet_id)
                } else {
                    Ack::with_reason(a.packet_id, ReasonCode::PacketIdentifierNotFound)
                };
                self.reply(ms, &Packet::PubComp(ack));
            }
            Packet::Subscribe(s) => self.subscribe(s, ms).await?,
            Packet::Unsubscribe(u) => self.unsubscribe(u, ms).await?,
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

    /// Checks a PUBLISH and translates it (topic alias, message); counts it received. Also
    /// says whether it was published into `$SYS` (acknowledged, not routed: clients may not
    /// publish into the broker's own tree).
    fn incoming(&mut self, mut p: Publish) -> Result<(Message, bool), Fail> {
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
            // Moved out (the message takes it): no reference count taken.
            None => std::mem::take(&mut p.topic),
        };
        let sys = crate::is_sys(topic.as_str());
        let msg = publish_message(topic, p)
            .map_err(|e| fail(ReasonCode::TopicNameInvalid, e.to_string()))?;
        // A PUBLISH the user may not make (or into `$SYS`) is acknowledged and dropped, as
        // `$SYS` always was: 5.0 acknowledgements say Not authorized (`publish`).
        let sys = sys
            || hayate_front::check_publish(&self.identity, &msg.key, msg.reply_to.is_some())
                .is_err();
        self.mqtt.stats.received.fetch_add(1, Ordering::Relaxed);
        Ok((msg, sys))
    }

    /// Routes a PUBLISH (see [`Conn::incoming`]) as its QoS says and acknowledges it.
    async fn publish(
        &mut self,
        msg: &Message,
        qos: QoS,
        packet_id: Option<u16>,
        sys: bool,
        ms: &mut MqttSession,
    ) -> Result<(), Fail> {
        if sys
            && self.version.is_v5()
            && let Some(pid) = packet_id
            && qos != QoS::AtMostOnce
        {
            let ack = Ack::with_reason(pid, ReasonCode::NotAuthorized);
            let p = if qos == QoS::AtLeastOnce {
                Packet::PubAck(ack)
            } else {
                Packet::PubRec(ack)
            };
            self.reply(ms, &p);
            return Ok(());
        }
        match (qos, packet_id) {
            (QoS::AtMostOnce, _) => {
                if !sys {
                    if msg.attrs.retain {
                        // Not kept past the memory budget: counted; nothing to tell.
                        self.mqtt.retain(msg);
                    }
                    // Nothing to confirm: the plain publish path.
                    ms.session.publish(Batch::One(msg)).await;
                }
            }
            (QoS::AtLeastOnce, Some(pid)) => {
                let (stored, kept) = if sys {
                    (Stored::default(), true)
                } else {
                    self.route(msg, &mut ms.session).await
                };
                let journaled = self.mqtt.durable_later();
                self.ack_when_stored(ms, pid, false, stored, journaled, kept)?;
            }
            (QoS::ExactlyOnce, Some(pid)) => {
                let first = {
                    let st = lock(&ms.out);
                    if st.incoming.contains(&pid) {
                        false
                    } else if st.incoming.len() >= usize::from(self.mqtt.cfg.receive_maximum) {
                        return Err(fail(
                            ReasonCode::ReceiveMaximumExceeded,
                            "too many QoS 2 messages unreleased",
                        ));
                    } else {
                        true
                    }
                };
                let (stored, kept) = if first && !sys {
                    self.route(msg, &mut ms.session).await
                } else {
                    (Stored::default(), true)
                };
                // Marked received only once routed: the journal's record of it then follows
                // every delivery it made, so a crash cannot keep the mark (which makes the
                // client's resend look like a duplicate) without the deliveries.
                if first {
                    lock(&ms.out).set_incoming(pid, true);
                }
                let journaled = self.mqtt.durable_later();
                self.ack_when_stored(ms, pid, true, stored, journaled, kept)?;
            }
            (_, None) => {
                return Err(fail(ReasonCode::ProtocolError, "QoS > 0 without packet id"));
            }
        }
        Ok(())
    }

    /// Routes `msg` (storing it first if retained); also says whether a retained message
    /// was kept (false: the memory budget had no room for it).
    async fn route(&self, msg: &Message, session: &mut Session) -> (Stored, bool) {
        let kept = !msg.attrs.retain || self.mqtt.retain(msg);
        (session.publish_stored(Batch::One(msg)).await.1, kept)
    }

    /// Sends the PUBACK (or PUBREC, `rec`) of `pid` now if the streams that captured the
    /// message and the MQTT journal (which has it if it was queued for a persistent session
    /// or retained) already count it as durable and no earlier acknowledgement waits, or
    /// queues it behind the earlier ones until they do (see [`Conn::acked`]).
    fn ack_when_stored(
        &mut self,
        ms: &mut MqttSession,
        pid: u16,
        rec: bool,
        stored: Stored,
        journaled: Durable,
        kept: bool,
    ) -> Result<(), Fail> {
        // A retained message the memory budget had no room for: Quota exceeded for 5.0.
        let quota = move |r: Result<(), String>| match r {
            Ok(()) if !kept => Err(QUOTA_EXCEEDED.to_owned()),
            r => r,
        };
        if self.acks().is_empty()
            && let Some(r) = stored.ready()
            && let Some(j) = journaled.ready()
        {
            return self.acked(ms, pid, rec, quota(r.map(drop).and(j)));
        }
        self.acks().push_back(Box::pin(async move {
            let r = stored.confirmed().await.map(drop);
            let j = journaled.wait().await;
            (pid, rec, quota(r.and(j)))
        }));
        Ok(())
    }

    /// Sends the acknowledgement of a stored (or not) message: on a storage failure, 5.0
    /// clients get the failure reason code (the message was delivered live but not kept),
    /// 3.1.1 clients are disconnected without an acknowledgement, so they publish it again.
    pub(super) fn acked(
        &mut self,
        ms: &mut MqttSession,
        pid: u16,
        rec: bool,
        r: Result<(), String>,
    ) -> Result<(), Fail> {
        let code = match r {
            Ok(()) => ReasonCode::Success,
            // Routed, but the retained copy was not kept: 3.1.1 cannot say so (counted).
            Err(why) if why == QUOTA_EXCEEDED => {
                if !self.version.is_v5() {
                    ReasonCode::Success
                } else {
                    if rec {
                        lock(&ms.out).set_incoming(pid, false);
                    }
                    ReasonCode::QuotaExceeded
                }
            }
            Err(why) if self.version.is_v5() => {
                tracing::warn!(pid, "PUBLISH not stored: {why}");
                if rec {
                    lock(&ms.out).set_incoming(pid, false);
                }
                ReasonCode::UnspecifiedError
            }
            Err(why) => {
                return Err(fail(
                    ReasonCode::UnspecifiedError,
                    format!("message not stored: {why}"),
                ));
            }
        };
        let ack = Ack::with_reason(pid, code);
        self.reply(
            ms,
            &if rec {
                Packet::PubRec(ack)
            } else {
                Packet::PubAck(ack)
            },
        );
        Ok(())
    }

    async fn subscribe(&mut self, s: Subscribe, ms: &mut MqttSession) -> Result<(), Fail> {
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
                    let before = lock(&ms.out).set_sub(sid, info).map(|i| i.qos);
                    // QoS 0 drops under congestion, QoS 1/2 block: a change between them
                    // re-registers the subscription with the broker (same id).
                    if before.map(broker_qos) != Some(broker_qos(o.qos)) {
                        ms.session.unsubscribe(sid);
                        if let Err(e) = hayate_front::subscribe_checked(
                            &mut ms.session,
                            &self.identity,
                            sid,
                            expr.clone(),
                            group,
                            broker_qos(o.qos),
                        ) {
                            tracing::warn!("mqtt: subscribe failed: {e}");
                        }
                    }
                    sid
                }
                None => {
                    let sid = ms.subs.next_sid();
                    // Options first: a delivery may arrive as soon as the broker knows.
                    lock(&ms.out).set_sub(sid, info);
                    if let Err(e) = hayate_front::subscribe_checked(
                        &mut ms.session,
                        &self.identity,
                        sid,
                        expr.clone(),
                        group,
                        broker_qos(o.qos),
                    ) {
                        lock(&ms.out).remove_sub(sid);
                        codes.push(match e {
                            hayate_front::SubFail::Denied(_) if v.is_v5() => {
                                ReasonCode::NotAuthorized
                            }
                            hayate_front::SubFail::Denied(_) => ReasonCode::UnspecifiedError,
                            hayate_front::SubFail::Broker(
                                hayate_broker::SubscribeError::TooMany(_),
                            ) if v.is_v5() => ReasonCode::QuotaExceeded,
                            hayate_front::SubFail::Broker(e) => {
                                tracing::warn!("mqtt: subscribe failed: {e}");
                                ReasonCode::UnspecifiedError
                            }
                        });
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
        // A persistent session's subscriptions are durable before SUBACK.
        self.mqtt.durable().wait().await.map_err(|e| {
            fail(
                ReasonCode::UnspecifiedError,
                format!("subscription not stored: {e}"),
            )
        })?;
        self.reply(ms, &Packet::SubAck(SubAck::new(s.packet_id, codes)));
        if retained.iter().any(|(_, m)| !m.is_empty()) {
            // Delivered to this session like any other message: counted as sent (those it
            // takes: a QoS 0 one while it has no connection is not).
            let out = ms.out.clone();
            let mut sent = (0u64, 0u64);
            ms.session.outbox().push_reply_unbudgeted(|o| {
                let mut st = lock(&out);
                for (sid, msgs) in &retained {
                    for m in msgs {
                        if st.deliver(*sid, &m.key, &m.payload, Some(m), 0, true, o) {
                            sent.0 += 1;
                            sent.1 += m.payload.len() as u64;
                        }
                    }
                }
            });
            ms.session.outbox().traffic().note_out(sent.0, sent.1);
            ms.session.mark_own_output();
        }
        Ok(())
    }

    async fn unsubscribe(&mut self, u: Unsubscribe, ms: &mut MqttSession) -> Result<(), Fail> {
        let mut codes = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            match ms.subs.remove(f.as_str()) {
                Some(sid) => {
                    ms.session.unsubscribe(sid);
                    lock(&ms.out).remove_sub(sid);
                    codes.push(ReasonCode::Success);
                }
                None => codes.push(ReasonCode::NoSubscriptionExisted),
            }
        }
        if !self.version.is_v5() {
            codes.clear();
        }
        self.mqtt.durable().wait().await.map_err(|e| {
            fail(
                ReasonCode::UnspecifiedError,
                format!("unsubscription not stored: {e}"),
            )
        })?;
        self.reply(ms, &Packet::UnsubAck(UnsubAck::new(u.packet_id, codes)));
        Ok(())
    }
}
