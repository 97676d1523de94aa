//! The connection class (channel 0): connection.start, start-ok (SASL and login), tune,
//! open, close, update-secret; connection.blocked; the connection's end.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use hayate_amqp::{FieldTable, FieldValue, Method, ReplyCode, ShortStr};
use hayate_broker::Session;

use super::error::{End, err, refuse_syntax};
use super::queue::delete_queue;
use super::{Conn, Stage};
use hayate_front::auth::Credentials;

impl Conn<'_> {
    /// connection.start.
    pub(super) fn start(&mut self, session: &mut Session) {
        let mut caps = FieldTable::default();
        for c in [
            "publisher_confirms",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "authentication_failure_close",
            "per_consumer_qos",
            "direct_reply_to",
        ] {
            caps.insert(c, FieldValue::Bool(true));
        }
        caps.insert("exchange_exchange_bindings", FieldValue::Bool(true));
        let mut props = FieldTable::default();
        props.insert(
            "product",
            FieldValue::LongStr(Bytes::from_static(b"Hayate")),
        );
        props.insert(
            "version",
            FieldValue::LongStr(Bytes::from_static(env!("CARGO_PKG_VERSION").as_bytes())),
        );
        props.insert("platform", FieldValue::LongStr(Bytes::from_static(b"Rust")));
        props.insert("capabilities", FieldValue::Table(caps));
        // EXTERNAL (the user a verified client certificate names: `[tls] cert_user`) when
        // the connection has one, as RabbitMQ's rabbitmq_auth_mechanism_ssl offers it.
        let mechanisms: &[u8] = match (self.peer.verified_name.is_some(), self.amqp.auth.required())
        {
            (true, true) => b"EXTERNAL PLAIN AMQPLAIN",
            (true, false) => b"EXTERNAL PLAIN AMQPLAIN ANONYMOUS",
            (false, true) => b"PLAIN AMQPLAIN",
            (false, false) => b"PLAIN AMQPLAIN ANONYMOUS",
        };
        self.send(
            session,
            0,
            Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: props,
                mechanisms: Bytes::from_static(mechanisms),
                locales: Bytes::from_static(b"en_US"),
            },
        );
        self.stage = Stage::StartOk;
    }

    pub(super) async fn connection_method(
        &mut self,
        m: Method,
        session: &mut Session,
    ) -> Result<(), End> {
        let hard = |code, text: String, m: &Method| Err(End::Hard(err(code, text).on(m)));
        match (self.stage, m) {
            (
                Stage::StartOk,
                Method::ConnectionStartOk {
                    client_properties,
                    mechanism,
                    response,
                    ..
                },
            ) => {
                self.wants_blocked = matches!(
                    client_properties.get("capabilities"),
                    Some(FieldValue::Table(t)) if t.get("connection.blocked").and_then(FieldValue::as_bool) == Some(true)
                );
                self.login(mechanism.as_str().unwrap_or(""), &response)
                    .await?;
                self.send(
                    session,
                    0,
                    Method::ConnectionTune {
                        channel_max: self.amqp.cfg.channel_max,
                        frame_max: self.amqp.cfg.frame_max,
                        heartbeat: self.amqp.cfg.heartbeat_secs,
                    },
                );
                self.stage = Stage::TuneOk;
                Ok(())
            }
            (Stage::TuneOk, m @ Method::ConnectionTuneOk { .. }) => {
                let Method::ConnectionTuneOk {
                    channel_max,
                    frame_max,
                    heartbeat,
                } = m
                else {
                    return Ok(());
                };
                let server = self.amqp.cfg.frame_max;
                let fm = if frame_max == 0 { server } else { frame_max };
                if fm < hayate_amqp::FRAME_MIN_SIZE || fm > server {
                    return hard(
                        ReplyCode::NotAllowed,
                        format!(
                            "negotiated frame_max = {fm} is outside {}..={server}",
                            hayate_amqp::FRAME_MIN_SIZE
                        ),
                        &m,
                    );
                }
                self.frame_max.store(fm as usize, Ordering::Relaxed);
                let cm = self.amqp.cfg.channel_max;
                self.channel_max = if channel_max == 0 {
                    cm
                } else {
                    channel_max.min(cm)
                };
                self.heartbeat = (heartbeat > 0).then(|| Duration::from_secs(u64::from(heartbeat)));
                self.stage = Stage::Open;
                Ok(())
            }
            (Stage::Open, m @ Method::ConnectionOpen { .. }) => {
                let Method::ConnectionOpen { virtual_host, .. } = &m else {
                    return Ok(());
                };
                let Some(vh) = virtual_host
                    .as_str()
                    .and_then(|v| self.amqp.vhosts.get(v))
                    .cloned()
                else {
                    return hard(
                        ReplyCode::NotAllowed,
                        format!("vhost {virtual_host} not found"),
                        &m,
                    );
                };
                self.vhost = vh;
                self.publish_keys.clear();
                self.send(
                    session,
                    0,
                    Method::ConnectionOpenOk {
                        known_hosts: ShortStr::lit(""),
                    },
                );
                self.stage = Stage::Ready;
                Ok(())
            }
            (_, Method::ConnectionClose { .. }) => {
                // Channels close now (nothing is delivered after close-ok); the connection
                // ends when the client closes the socket.
                self.release_all(session).await;
                self.send(session, 0, Method::ConnectionCloseOk {});
                self.stage = Stage::Closed;
                Ok(())
            }
            (_, Method::ConnectionCloseOk {}) => Err(End::Done),
            (Stage::Ready, Method::ConnectionUpdateSecret { .. }) => {
                self.send(session, 0, Method::ConnectionUpdateSecretOk {});
                Ok(())
            }
            (_, m) => hard(
                ReplyCode::CommandInvalid,
                format!("{} is not allowed on channel 0 now", m.name()),
                &m,
            ),
        }
    }

    /// SASL PLAIN (`\0user\0password`), AMQPLAIN (a table of LOGIN and PASSWORD),
    /// ANONYMOUS or EXTERNAL (a verified client certificate), through the server's
    /// authenticator.
    async fn login(&mut self, mechanism: &str, response: &[u8]) -> Result<(), End> {
        let refused = |why: String| {
            End::Hard(err(
                ReplyCode::AccessRefused,
                format!("Login was refused using authentication mechanism {mechanism}: {why}"),
            ))
        };
        let (user, password): (Option<String>, Option<Vec<u8>>) = match mechanism {
            "PLAIN" => {
                let mut parts = response.splitn(3, |&b| b == 0);
                let _authzid = parts.next();
                let user = parts
                    .next()
                    .map(|u| String::from_utf8_lossy(u).into_owned());
                let pw = parts.next().map(<[u8]>::to_vec);
                (user, pw)
            }
            "AMQPLAIN" => {
                // A field table without its length prefix.
                let mut framed = Vec::with_capacity(response.len() + 4);
                framed.extend_from_slice(&(response.len() as u32).to_be_bytes());
                framed.extend_from_slice(response);
                let t = hayate_amqp::types::Reader::new(&framed)
                    .table()
                    .map_err(|e| refuse_syntax(e.to_string()))?;
                let get = |k: &str| -> Option<Vec<u8>> {
                    match t.get(k) {
                        Some(FieldValue::LongStr(b)) => Some(b.to_vec()),
                        _ => None,
                    }
                };
                (
                    get("LOGIN").map(|u| String::from_utf8_lossy(&u).into_owned()),
                    get("PASSWORD"),
                )
            }
            "ANONYMOUS" => (None, None),
            // The certificate's user; a response names the user (authzid) it must be.
            "EXTERNAL" if self.peer.verified_name.is_some() => {
                (Some(String::from_utf8_lossy(response).into_owned()), None)
            }
            other => return Err(refused(format!("mechanism {other} is not offered"))),
        };
        let creds = Credentials {
            user: user.as_deref().filter(|u| !u.is_empty()),
            password: password.as_deref(),
            ..Credentials::default()
        };
        self.identity = self
            .peer
            .login(&*self.amqp.auth, "amqp", creds)
            .await
            .map_err(|e| refused(e.to_string()))?;
        Ok(())
    }

    /// connection.blocked while the memory budget is nearly spent (90%), unblocked below
    /// 80%, for clients that said they understand it.
    pub(super) fn check_blocked(&mut self, session: &mut Session) {
        if !self.wants_blocked || self.stage != Stage::Ready {
            return;
        }
        let mem = &self.amqp.broker.config().memory;
        let (used, limit) = (mem.used() as u128, mem.limit() as u128);
        if limit == 0 || limit >= usize::MAX as u128 {
            return;
        }
        if !self.blocked && used * 10 >= limit * 9 {
            self.blocked = true;
            self.send(
                session,
                0,
                Method::ConnectionBlocked {
                    reason: ShortStr::lit("low on memory"),
                },
            );
        } else if self.blocked && used * 10 < limit * 8 {
            self.blocked = false;
            self.send(session, 0, Method::ConnectionUnblocked {});
        }
    }

    /// The connection ends: every channel closes, exclusive queues go.
    pub(super) async fn release_all(&mut self, session: &mut Session) {
        let chans: Vec<u16> = self.channels.keys().copied().collect();
        for ch in chans {
            self.release_channel(ch, session).await;
        }
        for q in std::mem::take(&mut self.exclusive) {
            delete_queue(&q);
        }
    }
}
