//! The packets of a connected client: the connection driver's [`Handler`] (decode, handle,
//! keep-alive timer, takeover) and the handling of each packet (PUBLISH and its
//! acknowledgements, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT).

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use hayate_broker::{Batch, Session};
use hayate_core::Message;
use hayate_mqtt::{
    Ack, ByteStr, Packet, Publish, QoS, ReasonCode, RetainHandling, SubAck, Subscribe, UnsubAck,
    Unsubscribe, decode, shared_subscription,
};

use super::{Conn, Driven, End, Fail, fail};
use crate::frontend::{Handler, Stop};
use crate::mqtt::MqttSession;
use crate::mqtt::delivery::{SubInfo, lock, put_packet};
use crate::mqtt::translate::{broker_qos, filter_to_expr, publish_message};

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

/// Applies an acknowledgement from the client to the session's delivery state, under the
/// outbox lock (it may free the window and send held messages).
fn settle(
    ms: &mut MqttSession,
    f: impl FnOnce(&mut crate::mqtt::delivery::MqttDeliveries, &mut hayate_broker::OutBuf),
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
        let sys = crate::mqtt::is_sys(topic.as_str());
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
