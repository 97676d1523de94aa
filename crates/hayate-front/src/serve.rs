//! What every protocol's `serve` does around its own handshake and frames: the prologue (the
//! connection's entry among the server's live connections, its session's outbox attached to
//! the transport), the login, and the epilogue (unacknowledged deliveries given back, the
//! writer let flush and shut the transport down).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::BytesMut;
use hayate_broker::{Batch, Broker, Encoder, OutBuf, Outbox, Session};
use hayate_io::conn::{Accepted, Conn, READ_BUF};
use hayate_io::registry::{ConnEntry, ConnGuard};

use crate::auth::{AuthError, Authenticator, Credentials, Identity};

/// Who is at the other end of a connection, as its login needs it, and the connection's
/// entry among the server's live connections (admin API).
#[derive(Debug, Clone, Default)]
pub struct Peer {
    /// The client's address (TCP), for throttling and logs.
    pub addr: Option<SocketAddr>,
    /// The user a verified client certificate names (TLS with `tls.cert_user`).
    pub verified_name: Option<String>,
    /// The connection's entry among the server's live connections.
    pub entry: Option<Arc<ConnEntry>>,
}

impl Peer {
    /// The peer of connection `io`.
    pub fn of(io: &Accepted) -> Peer {
        Peer {
            addr: io.peer,
            verified_name: io.verified_name.clone(),
            entry: io.registered.as_ref().map(|g| g.entry().clone()),
        }
    }

    /// The client's IP address.
    pub fn ip(&self) -> Option<IpAddr> {
        self.addr.map(|a| a.ip())
    }

    /// The login step, the same for every protocol: checks what the client presented
    /// (`creds`' user name, password or token; where it comes from, its address and a
    /// verified certificate's user, is filled in here) with `auth`, which logs it under
    /// `protocol` and refuses, throttles (a locked-out user name and address) or reports
    /// itself busy (saturated password checks) as [`AuthError`] says. Once logged in, the
    /// connection's entry names the user. The protocol turns a refusal into its own answer.
    pub async fn login(
        &self,
        auth: &dyn Authenticator,
        protocol: &str,
        creds: Credentials<'_>,
    ) -> Result<Identity, AuthError> {
        let creds = Credentials {
            peer: self.ip(),
            verified: self.verified_name.as_deref(),
            ..creds
        };
        let identity = auth.authenticate(protocol, creds).await?;
        if let Some(e) = &self.entry {
            e.set_user(identity.user.as_deref());
        }
        Ok(identity)
    }

    /// Names the client's identifier (a native HELLO's name, an MQTT client id) in the
    /// connection's entry.
    pub fn set_client_id(&self, id: Option<&str>) {
        if let Some(e) = &self.entry {
            e.set_client_id(id);
        }
    }
}

/// A connection being served: the driver over its transport, its session's outbox, and its
/// entry among the server's live connections (kept until the connection ends).
pub struct Serving {
    /// The connection driver.
    pub conn: Conn,
    /// The session's outbox, which the driver's writer drains.
    pub outbox: Arc<Outbox>,
    _registered: Option<ConnGuard>,
}

impl Serving {
    /// The serve prologue: opens a session of `broker` for `io` (its deliveries encoded by
    /// `encoder`, its traffic counted in its listener's) and attaches it ([`Serving::attach`]).
    pub fn open(
        io: Accepted,
        broker: &Broker,
        encoder: Box<dyn Encoder>,
    ) -> (Peer, Session, Serving) {
        let peer = Peer::of(&io);
        let session = broker.open_session_in(encoder, io.class.as_ref());
        let serving = Serving::attach(io, BytesMut::with_capacity(READ_BUF), &session);
        (peer, session, serving)
    }

    /// Attaches `session`'s outbox to `io`'s transport (a writer task drains it; `buf` may
    /// hold input read during a handshake), then shows the session in the connection's
    /// entry: after the outbox has its sink, so that an admin close that came first cuts it
    /// for good. The entry stays registered until the connection ends.
    pub fn attach(mut io: Accepted, buf: BytesMut, session: &Session) -> Serving {
        let (registered, entry) = io.take_registered();
        let outbox = session.outbox().clone();
        let conn = Conn::new(io, buf, &outbox);
        if let Some(e) = &entry {
            e.attach(session.id(), outbox.clone());
        }
        Serving {
            conn,
            outbox,
            _registered: registered,
        }
    }

    /// The serve epilogue, once the protocol has queued its last words: deliveries not
    /// acknowledged go back (to other members of their queue groups), what is queued is
    /// flushed, the session is dropped (its subscriptions removed, its outbox closed) and the
    /// writer sends what is left and shuts the transport down.
    pub async fn close(self, mut session: Session) {
        session.release_unacked(None).await;
        session.flush();
        drop(session);
        self.conn.close(&*self.outbox).await;
    }
}

/// The encoder of a session that only publishes (a front-end's own publisher: MQTT wills
/// and retained messages, AMQP dead letters): it is never subscribed, so nothing is routed
/// to it.
#[derive(Debug, Default, Clone, Copy)]
pub struct PublishOnly;

impl Encoder for PublishOnly {
    fn encode(&mut self, _sid: u32, _batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {}
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}
}
