//! The registry of sessions: client identifier → session, online (with the connection that
//! has it) or parked (with its expiry and delayed will). Acquiring a session (taking it
//! over from another connection), releasing it at the end of a connection, parking
//! restored sessions, the sessions to save, and expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hayate_core::Message;
use hayate_mqtt::ProtocolVersion;
use tokio::sync::{mpsc, oneshot};

use super::delivery::{Persist, SharedDeliveries};
use super::{Mqtt, MqttSession, PendingWill};
use hayate_core::sync::lock;

/// Where a connection that is taken over sends its session, with its will if that waits
/// for a delay (published by the new connection if it starts clean, dropped otherwise).
pub(super) type Handover = oneshot::Sender<(Option<MqttSession>, Option<PendingWill>)>;

#[derive(Debug)]
struct Online {
    conn: u64,
    kick: mpsc::UnboundedSender<Handover>,
}

#[derive(Debug)]
struct Parked {
    session: MqttSession,
    expires: Option<Instant>,
    will: Option<PendingWill>,
}

/// What survives in the registry about one client identifier.
#[derive(Debug)]
pub(super) struct Entry {
    online: Option<Online>,
    parked: Option<Parked>,
    /// For checkpoints: the session's delivery state (which says whether it is persistent).
    info: Option<SharedDeliveries>,
    /// The user whose client id this is (when users are configured): another user may not
    /// take the session over. A persistent session keeps it in the journal and checkpoint,
    /// so it survives a restart.
    owner: Option<Arc<str>>,
}

/// `acquire` refused: the client id belongs to another user.
#[derive(Debug)]
pub(crate) struct NotOwner;

impl Mqtt {
    /// Claims `client_id` for connection `conn`: returns the client's existing session,
    /// taken from the registry or from the connection that has it now (which is told to
    /// hand it over), if any.
    ///
    /// `owner`: the authenticated user connecting (`None`: no ownership enforced, as when no
    /// users are configured); a client id another user owns is refused ([`NotOwner`]).
    pub(crate) async fn acquire(
        &self,
        client_id: &str,
        conn: u64,
        kick: mpsc::UnboundedSender<Handover>,
        owner: Option<&Arc<str>>,
    ) -> Result<(Option<MqttSession>, Option<PendingWill>), NotOwner> {
        let me = Online { conn, kick };
        let handover = {
            let mut reg = lock(&self.registry);
            if let (Some(me), Some(Some(o))) = (owner, reg.get(client_id).map(|e| e.owner.as_ref()))
                && o != me
            {
                return Err(NotOwner);
            }
            let e = reg.entry(client_id.to_string()).or_insert(Entry {
                online: None,
                parked: None,
                info: None,
                owner: None,
            });
            if let Some(me) = owner {
                e.owner = Some(me.clone());
            }
            match e.online.replace(me) {
                Some(old) => {
                    let (tx, rx) = oneshot::channel();
                    if old.kick.send(tx).is_err() {
                        // The old connection is gone and released nothing: nothing to take.
                        None
                    } else {
                        Some(rx)
                    }
                }
                None => {
                    return Ok(match e.parked.take() {
                        Some(p) => (Some(p.session), p.will),
                        None => (None, None),
                    });
                }
            }
        };
        let Some(rx) = handover else {
            return Ok((None, None));
        };
        Ok(
            match tokio::time::timeout(Duration::from_secs(5), rx).await {
                Ok(Ok(handed)) => handed,
                _ => {
                    tracing::warn!(client_id, "mqtt: session takeover timed out");
                    (None, None)
                }
            },
        )
    }

    /// Records the session of `client_id` that connection `conn` has, with the version and
    /// session expiry interval it has now: the session becomes persistent (journaled under a
    /// new generation) if `expiry` > 0, or stops being persistent if 0. Under the registry
    /// lock, so that a checkpoint (which lists sessions under it) sees every session whose
    /// journal records precede it.
    pub(crate) fn set_info(
        &self,
        client_id: &str,
        conn: u64,
        out: SharedDeliveries,
        version: ProtocolVersion,
        expiry: u32,
    ) {
        let mut reg = lock(&self.registry);
        if let Some(e) = reg.get_mut(client_id)
            && e.online.as_ref().is_some_and(|o| o.conn == conn)
        {
            {
                let mut st = lock(&out);
                match (st.persist().is_some(), expiry > 0) {
                    (false, true) => st.begin_persist(Persist {
                        journal: self.journal().cloned(),
                        client: client_id.into(),
                        sgen: self.new_sgen(),
                        version,
                        expiry,
                        owner: e.owner.clone(),
                    }),
                    (true, true) => st.update_persist(version, expiry),
                    (true, false) => st.end_persist(),
                    (false, false) => {}
                }
            }
            e.info = Some(out);
        }
    }

    /// Called by connection `conn` of `client_id` as it ends: hands the session to a
    /// connection that took it over, parks it (`expiry` seconds, `u32::MAX` = never), or
    /// drops it (returned, so the caller drops it outside the lock). `kicked` is a takeover
    /// the connection received before it ended for another reason (its DISCONNECT came
    /// first).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &self,
        client_id: &str,
        conn: u64,
        kicked: Option<Handover>,
        kick: &mut mpsc::UnboundedReceiver<Handover>,
        session: MqttSession,
        expiry: u32,
        will: Option<PendingWill>,
    ) -> Option<MqttSession> {
        let mut reg = lock(&self.registry);
        // A takeover asked under this lock cannot be missed.
        if let Some(to) = kicked.or_else(|| kick.try_recv().ok()) {
            drop(reg);
            if expiry == 0 {
                // This connection ended its session on its own (a DISCONNECT with expiry 0
                // crossed the new CONNECT): its outbox is closed and there is nothing to hand
                // over; the new connection starts a new session.
                let _ = to.send((None, will));
                return Some(session);
            }
            return to.send((Some(session), will)).err().and_then(|(s, _)| s);
        }
        let Some(e) = reg.get_mut(client_id) else {
            return Some(session);
        };
        if e.online.as_ref().is_none_or(|o| o.conn != conn) {
            return Some(session);
        }
        e.online = None;
        if expiry == 0 {
            reg.remove(client_id);
            return Some(session);
        }
        e.parked = Some(Parked {
            session,
            expires: (expiry != u32::MAX)
                .then(|| Instant::now() + Duration::from_secs(u64::from(expiry))),
            will,
        });
        None
    }

    /// Parks a restored session (at startup).
    pub(crate) fn park_restored(
        &self,
        client_id: String,
        session: MqttSession,
        expiry: u32,
        owner: Option<Arc<str>>,
    ) {
        let out = session.out.clone();
        lock(&self.registry).insert(
            client_id,
            Entry {
                online: None,
                parked: Some(Parked {
                    session,
                    expires: (expiry != u32::MAX)
                        .then(|| Instant::now() + Duration::from_secs(u64::from(expiry))),
                    will: None,
                }),
                info: Some(out),
                owner,
            },
        );
    }

    /// The delivery state of every session known (the persistent ones say so).
    pub(crate) fn session_states(&self) -> Vec<SharedDeliveries> {
        lock(&self.registry)
            .values()
            .filter_map(|e| e.info.clone())
            .collect()
    }
    /// Expires parked sessions and collects wills that are due.
    pub(super) fn sweep(&self, now: Instant) -> (Vec<Message>, Vec<MqttSession>) {
        let mut wills = Vec::new();
        let mut ended = Vec::new();
        let mut reg = lock(&self.registry);
        reg.retain(|_, e| {
            let Some(p) = &mut e.parked else { return true };
            if p.will.as_ref().is_some_and(|w| w.due <= now)
                && let Some(w) = p.will.take()
            {
                wills.push(w.msg);
            }
            if p.expires.is_some_and(|t| t <= now) {
                if let Some(w) = p.will.take() {
                    wills.push(w.msg);
                }
                if let Some(p) = e.parked.take() {
                    ended.push(p.session);
                }
                return false;
            }
            true
        });
        (wills, ended)
    }
}
