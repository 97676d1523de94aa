//! The MQTT 3.1, 3.1.1 and 5.0 front-end.
//!
//! # Shape
//! - [`Mqtt`] is shared by every MQTT connection of a server: the settings, the session
//!   registry (client identifier → session, online or parked), the retained messages, the
//!   statistics, and the background task (session expiry, delayed wills, `$SYS`, autosave).
//! - [`conn`]: one connection: CONNECT, then a reader loop over [`hayate_mqtt::decode`]
//!   and a writer task draining the session's outbox (as the native front-end does).
//! - [`out`]: the delivery state of a session and the outbox [`Encoder`](hayate_broker::Encoder)
//!   that turns broker deliveries into PUBLISH packets (QoS, packet ids, in-flight window,
//!   held messages, topic aliases).
//! - [`persist`]: saving and loading persistent sessions and retained messages.
//! - [`translate`]: every translation between MQTT and Hayate (topics and keys, filters and
//!   key expressions, QoS and guarantees, 5.0 properties and message metadata). The codec,
//!   [`hayate_mqtt`], knows nothing of Hayate; the other modules here call [`translate`]
//!   rather than convert anything themselves.
//!
//! # Sessions
//! An MQTT session is a [`hayate_broker::Session`] plus its [`delivery::MqttDeliveries`]. It belongs to
//! its connection while the client is online. When a persistent session's connection ends,
//! the session's outbox is *detached* (not closed): its subscriptions stay in the broker,
//! QoS 1 and 2 deliveries are held by the encoder, and the session is parked in the
//! registry until the client comes back or the session expires. A new connection with
//! the same client identifier takes the session over: the old connection is told
//! (5.0: DISCONNECT 0x8E) and hands the session through a channel.
//!
//! # Topics
//! MQTT topics map to Hayate keys as [`translate`] describes (`+` = `*`, `#` = `**`; empty
//! levels and `*`/`%` characters are escaped reversibly), so MQTT, native and STOMP
//! clients see each other's messages. Filters that start with a wildcard do not match
//! topics starting with `$` (`$SYS/...`).
//!
//! # Locks
//! Registry → broker registry (dropping a session); outbox → [`delivery::MqttDeliveries`]. The
//! registry and retained-message locks are never held across an await or while taking an
//! outbox lock.

pub mod conn;
pub mod delivery;
pub mod persist;
pub mod translate;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_broker::{Batch, Broker, Encoder, OutBuf, Session};
use hayate_core::{Key, KeyExpr, Message};
use hayate_mqtt::ProtocolVersion;
use tokio::sync::{mpsc, oneshot, watch};

use crate::auth::Authenticator;
use crate::config::{Config, MqttSection};
use delivery::{MqttDeliveries, MqttEncoder, SharedDeliveries};
pub use translate::CONTENT_TYPE;

/// Whether `topic` is in the broker's own `$SYS` tree.
pub(crate) fn is_sys(topic: &str) -> bool {
    topic == "$SYS" || topic.starts_with("$SYS/")
}

/// An MQTT session: the broker session, its delivery state and its subscriptions.
#[derive(Debug)]
pub struct MqttSession {
    pub(crate) session: Session,
    pub(crate) out: SharedDeliveries,
    /// Broker subscription id of each subscribed filter (as written, `$share/...` too).
    pub(crate) subs: crate::frontend::SubTable,
}

/// A will waiting for its delay, or for the end of its session.
#[derive(Debug)]
pub(crate) struct PendingWill {
    pub(crate) due: Instant,
    pub(crate) msg: Message,
}

/// Where a connection that is taken over sends its session, with its will if that waits
/// for a delay (published by the new connection if it starts clean, dropped otherwise).
type Handover = oneshot::Sender<(Option<MqttSession>, Option<PendingWill>)>;

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
struct Entry {
    online: Option<Online>,
    parked: Option<Parked>,
    /// For saving: the session's state, version and expiry interval.
    info: Option<(SharedDeliveries, ProtocolVersion, u32)>,
}

/// Counters for `$SYS`.
#[derive(Debug, Default)]
pub struct MqttStats {
    /// Clients connected now.
    pub connected: AtomicU64,
    /// PUBLISH packets received from clients.
    pub received: AtomicU64,
    /// Connections accepted over the broker's life.
    pub connections: AtomicU64,
}

/// Retained messages by key.
#[derive(Debug, Default)]
pub(crate) struct Retained {
    map: HashMap<Key, Message>,
}

impl Retained {
    /// Stores `msg` as the retained message of its key (an empty payload clears it).
    pub(crate) fn set(&mut self, msg: &Message) {
        if msg.payload.is_empty() {
            self.map.remove(&msg.key);
        } else {
            self.map.insert(msg.key.clone(), msg.clone());
        }
    }

    /// The retained messages matching `expr` (not `$` keys when `skip_dollar`).
    pub(crate) fn matching(&mut self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        let now = Instant::now();
        self.map
            .retain(|_, m| m.attrs.expires.is_none_or(|at| at > now));
        self.map
            .values()
            .filter(|m| !(skip_dollar && m.key.as_bytes().first() == Some(&b'$')))
            .filter(|m| expr.matches(&m.key))
            .cloned()
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Message> {
        self.map.values()
    }
}

/// The MQTT front-end's shared state.
pub struct Mqtt {
    pub(crate) broker: Broker,
    pub(crate) cfg: MqttSection,
    pub(crate) auth: Arc<dyn Authenticator>,
    pub(crate) handshake_timeout: Duration,
    data_dir: Option<PathBuf>,
    registry: Mutex<HashMap<String, Entry>>,
    pub(crate) retained: Mutex<Retained>,
    /// Statistics.
    pub stats: MqttStats,
    next_conn: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for Mqtt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mqtt").finish_non_exhaustive()
    }
}

use crate::lock as locked;

/// An encoder for the front-end's own publishing session: it is never subscribed.
#[derive(Debug)]
struct NoEncoder;

impl Encoder for NoEncoder {
    fn encode(&mut self, _sid: u32, _batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {}
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}
}

impl Mqtt {
    /// The front-end for `broker` with `config`'s MQTT, auth and data settings; loads
    /// saved sessions and retained messages from the data directory.
    pub fn new(broker: Broker, config: &Config, auth: Arc<dyn Authenticator>) -> Arc<Mqtt> {
        let data_dir =
            (!config.server.data_dir.is_empty()).then(|| PathBuf::from(&config.server.data_dir));
        let mqtt = Arc::new(Mqtt {
            broker,
            cfg: config.mqtt.clone(),
            auth,
            handshake_timeout: Duration::from_millis(config.limits.handshake_timeout_ms),
            data_dir,
            registry: Mutex::new(HashMap::new()),
            retained: Mutex::new(Retained::default()),
            stats: MqttStats::default(),
            next_conn: AtomicU64::new(1),
            started: Instant::now(),
        });
        if let Some(dir) = &mqtt.data_dir {
            match persist::load(&mqtt, dir) {
                Ok((s, r)) if s + r > 0 => {
                    tracing::info!("mqtt: restored {s} sessions and {r} retained messages");
                }
                Ok(_) => {}
                Err(e) => {
                    // Keep the file for inspection rather than overwrite it at the next save.
                    let aside = dir.join(format!(
                        "mqtt.state.bad-{}",
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0)
                    ));
                    let _ = std::fs::rename(dir.join("mqtt.state"), &aside);
                    tracing::warn!(
                        "mqtt: cannot load saved state ({e}); moved it to {}",
                        aside.display()
                    );
                }
            }
        }
        mqtt
    }

    fn next_conn(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh session.
    pub(crate) fn new_session(&self) -> MqttSession {
        let out = Arc::new(Mutex::new(MqttDeliveries::new(
            0,
            self.cfg.max_queued_messages,
            usize::try_from(self.cfg.max_queued_bytes).unwrap_or(usize::MAX),
            self.cfg.max_inflight,
        )));
        let session = self.broker.open_session(Box::new(MqttEncoder {
            out: out.clone(),
            held: delivery::lock(&out).held_counter(),
        }));
        delivery::lock(&out).session_id = session.id();
        MqttSession {
            session,
            out,
            subs: Default::default(),
        }
    }

    /// Claims `client_id` for connection `conn`: returns the client's existing session,
    /// taken from the registry or from the connection that has it now (which is told to
    /// hand it over), if any.
    pub(crate) async fn acquire(
        &self,
        client_id: &str,
        conn: u64,
        kick: mpsc::UnboundedSender<Handover>,
    ) -> (Option<MqttSession>, Option<PendingWill>) {
        let me = Online { conn, kick };
        let handover = {
            let mut reg = locked(&self.registry);
            let e = reg.entry(client_id.to_string()).or_insert(Entry {
                online: None,
                parked: None,
                info: None,
            });
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
                    return match e.parked.take() {
                        Some(p) => (Some(p.session), p.will),
                        None => (None, None),
                    };
                }
            }
        };
        let Some(rx) = handover else {
            return (None, None);
        };
        match tokio::time::timeout(Duration::from_secs(5), rx).await {
            Ok(Ok(handed)) => handed,
            _ => {
                tracing::warn!(client_id, "mqtt: session takeover timed out");
                (None, None)
            }
        }
    }

    /// Records what is needed to save the session of `client_id`.
    pub(crate) fn set_info(
        &self,
        client_id: &str,
        conn: u64,
        out: SharedDeliveries,
        version: ProtocolVersion,
        expiry: u32,
    ) {
        let mut reg = locked(&self.registry);
        if let Some(e) = reg.get_mut(client_id)
            && e.online.as_ref().is_some_and(|o| o.conn == conn)
        {
            e.info = Some((out, version, expiry));
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
        let mut reg = locked(&self.registry);
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
        version: ProtocolVersion,
        expiry: u32,
    ) {
        let out = session.out.clone();
        locked(&self.registry).insert(
            client_id,
            Entry {
                online: None,
                parked: Some(Parked {
                    session,
                    expires: (expiry != u32::MAX)
                        .then(|| Instant::now() + Duration::from_secs(u64::from(expiry))),
                    will: None,
                }),
                info: Some((out, version, expiry)),
            },
        );
    }

    /// Sessions to save: client id, version, expiry interval, state.
    pub(crate) fn saved_sessions(&self) -> Vec<(String, ProtocolVersion, u32, SharedDeliveries)> {
        locked(&self.registry)
            .iter()
            .filter_map(|(id, e)| {
                let (out, v, exp) = e.info.as_ref()?;
                (*exp > 0).then(|| (id.clone(), *v, *exp, out.clone()))
            })
            .collect()
    }

    /// Stores or clears a retained message.
    pub(crate) fn retain(&self, msg: &Message) {
        locked(&self.retained).set(msg);
    }

    /// The retained messages matching `expr`.
    pub(crate) fn retained_matching(&self, expr: &KeyExpr, skip_dollar: bool) -> Vec<Message> {
        locked(&self.retained).matching(expr, skip_dollar)
    }

    /// Saves persistent sessions and retained messages to the data directory.
    pub fn save(&self) {
        let Some(dir) = &self.data_dir else { return };
        match persist::save(self, dir) {
            Ok(Some((s, r))) => tracing::debug!("mqtt: saved {s} sessions, {r} retained"),
            Ok(None) => {}
            Err(e) => tracing::warn!("mqtt: cannot save state in {}: {e}", dir.display()),
        }
    }

    /// Expires parked sessions and collects wills that are due.
    fn sweep(&self, now: Instant) -> (Vec<Message>, Vec<MqttSession>) {
        let mut wills = Vec::new();
        let mut ended = Vec::new();
        let mut reg = locked(&self.registry);
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

    /// Publishes `msg` from `session` (a will, `$SYS`), storing it first if retained.
    pub(crate) async fn publish_from(&self, session: &mut Session, msg: &Message) {
        if msg.attrs.retain {
            self.retain(msg);
        }
        session.publish(Batch::One(msg)).await;
        session.flush();
    }

    /// Publishes a will, unless it names the broker's own `$SYS` tree (which clients may
    /// not publish to).
    pub(crate) async fn publish_will(&self, session: &mut Session, msg: &Message) {
        if is_sys(msg.key.as_str()) {
            tracing::debug!("mqtt: will on {} not published", msg.key.as_str());
            return;
        }
        self.publish_from(session, msg).await;
    }

    async fn publish_sys(&self, session: &mut Session) {
        let reg_count = locked(&self.registry).len();
        let retained = locked(&self.retained).len();
        let s = &self.stats;
        let items = [
            (
                "$SYS/broker/version",
                format!("hayate {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "$SYS/broker/uptime",
                format!("{} seconds", self.started.elapsed().as_secs()),
            ),
            (
                "$SYS/broker/clients/connected",
                s.connected.load(Ordering::Relaxed).to_string(),
            ),
            ("$SYS/broker/clients/total", reg_count.to_string()),
            (
                "$SYS/broker/messages/received",
                s.received.load(Ordering::Relaxed).to_string(),
            ),
            (
                "$SYS/broker/subscriptions/count",
                self.broker.subscription_count().to_string(),
            ),
            ("$SYS/broker/retained messages/count", retained.to_string()),
            (
                "$SYS/broker/messages/dropped",
                self.broker
                    .stats()
                    .dropped
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "$SYS/broker/clients/slow",
                self.broker
                    .stats()
                    .slow_consumers
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
        ];
        for (topic, value) in items {
            let Ok(key) = translate::topic_to_key(topic) else {
                continue;
            };
            let mut m = Message::new(key, Bytes::from(value));
            m.attrs.retain = true;
            m.attrs.utf8 = true;
            self.publish_from(session, &m).await;
        }
    }

    /// Runs session expiry, delayed wills, `$SYS` statistics and autosave until `stop`.
    pub async fn background(self: Arc<Mqtt>, mut stop: watch::Receiver<bool>) {
        let mut session = self.broker.open_session(Box::new(NoEncoder));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sys: Option<Instant> = None;
        let mut last_save = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            let (wills, ended) = self.sweep(now);
            drop(ended);
            // A subscriber that does not read must not stop this loop: a publication that
            // waits for room longer than this is abandoned.
            let patience = Duration::from_secs(2);
            for w in &wills {
                let _ = tokio::time::timeout(patience, self.publish_will(&mut session, w)).await;
            }
            let sys = self.cfg.sys_interval_secs;
            if sys > 0 && last_sys.is_none_or(|t| now.duration_since(t).as_secs() >= sys) {
                last_sys = Some(now);
                let _ = tokio::time::timeout(patience * 2, self.publish_sys(&mut session)).await;
            }
            let every = self.cfg.autosave_secs;
            if every > 0 && now.duration_since(last_save).as_secs() >= every {
                last_save = now;
                let me = self.clone();
                // File I/O off the runtime's worker threads.
                let _ = tokio::task::spawn_blocking(move || me.save()).await;
            }
        }
    }
}
