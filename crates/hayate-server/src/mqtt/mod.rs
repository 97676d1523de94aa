//! The MQTT 3.1, 3.1.1 and 5.0 front-end.
//!
//! # Layout
//! - this module: [`Mqtt`], shared by every MQTT connection of a server: the settings, the
//!   session registry, the retained messages, the statistics, and the background task
//!   (session expiry, delayed wills, `$SYS`, autosave).
//! - `registry`: the session registry (client identifier → session, online or parked):
//!   acquiring, releasing, parking and expiring sessions.
//! - `retained`: the retained messages.
//! - `sys`: the statistics ([`MqttStats`]) and the `$SYS` messages made of them.
//! - [`conn`]: one connection: CONNECT, then a reader loop over [`hayate_mqtt::decode`]
//!   and a writer task draining the session's outbox (as the native front-end does).
//! - [`delivery`]: the delivery state of a session and the outbox [`Encoder`] that turns
//!   broker deliveries into PUBLISH packets (QoS, packet ids, in-flight window, held
//!   messages, topic aliases).
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
mod registry;
mod retained;
mod sys;
pub mod translate;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hayate_broker::{Batch, Broker, Encoder, OutBuf, Session};
use hayate_core::Message;
use tokio::sync::watch;

use crate::auth::Authenticator;
use crate::config::{Config, MqttSection};
use delivery::{MqttDeliveries, MqttEncoder, SharedDeliveries};
use registry::Entry;
use retained::Retained;
pub use sys::MqttStats;
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

    /// Saves persistent sessions and retained messages to the data directory.
    pub fn save(&self) {
        let Some(dir) = &self.data_dir else { return };
        match persist::save(self, dir) {
            Ok(Some((s, r))) => tracing::debug!("mqtt: saved {s} sessions, {r} retained"),
            Ok(None) => {}
            Err(e) => tracing::warn!("mqtt: cannot save state in {}: {e}", dir.display()),
        }
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
