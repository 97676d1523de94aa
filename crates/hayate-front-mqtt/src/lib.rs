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
mod journal;
pub mod persist;
mod registry;
mod retained;
mod sys;
pub mod translate;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hayate_broker::{Batch, Broker, Session};
use hayate_core::Message;
use hayate_core::sync::lock;
use tokio::sync::watch;

use delivery::{MqttDeliveries, MqttEncoder, SharedDeliveries};
use hayate_front::PublishOnly;
use hayate_front::auth::Authenticator;
use hayate_front::config::{Config, MqttSection};
use journal::{Durable, Journal};
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
    pub(crate) subs: hayate_front::SubTable,
}

impl Drop for MqttSession {
    /// A session dropped has ended: if it was persistent, the journal says so (after the
    /// checkpoint at shutdown the journal ignores it, so parked sessions stay saved).
    fn drop(&mut self) {
        lock(&self.out).end_persist();
    }
}

/// The checkpoints' state (under its lock: one checkpoint at a time).
#[derive(Debug, Default)]
struct Checkpoints {
    /// Bytes of the last checkpoint.
    last_bytes: u64,
    /// The next checkpoint's number.
    number: u64,
    /// Files of format 1 wait to be moved once a checkpoint is durable.
    legacy: bool,
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
    /// The `[mqtt]` settings.
    pub cfg: MqttSection,
    pub(crate) auth: Arc<dyn Authenticator>,
    pub(crate) handshake_timeout: Duration,
    /// Largest CONNECT accepted (`limits.max_preauth_bytes`).
    pub(crate) max_preauth: u32,
    data_dir: Option<PathBuf>,
    registry: Mutex<HashMap<String, Entry>>,
    pub(crate) retained: Mutex<Retained>,
    /// The log of persistent sessions and retained messages (with a data directory): their
    /// journal (unless `mqtt.journal` is off) and checkpoints.
    journal: Option<Arc<Journal>>,
    /// Whether changes are journaled (`mqtt.journal`).
    journaling: bool,
    /// Whether the saved state was read back ([`Mqtt::recover_state`]); until then nothing is
    /// journaled and no checkpoint is taken, so that a front-end that never recovered cannot
    /// write over the saved sessions and retained messages. True from the start without a log.
    recovered: AtomicBool,
    /// The next generation of a persistent session (see `persist`).
    next_sgen: AtomicU64,
    /// One checkpoint at a time; the size of the last one, the next one's number.
    checkpointing: Mutex<Checkpoints>,
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

impl Mqtt {
    /// The front-end for `broker` with `config`'s MQTT, auth and data settings. With a data
    /// directory it opens its log but reads nothing: [`Mqtt::recover_state`] restores the
    /// saved state (`Server::recover` calls it); until then the log is left as it is.
    pub fn new(broker: Broker, config: &Config, auth: Arc<dyn Authenticator>) -> Arc<Mqtt> {
        let memory = broker.config().memory.clone();
        let data_dir =
            (!config.server.data_dir.is_empty()).then(|| PathBuf::from(&config.server.data_dir));
        let journal = match &data_dir {
            Some(dir) => {
                let fsync = config
                    .mqtt
                    .journal_fsync
                    .parse()
                    .unwrap_or(hayate_log::FsyncPolicy::default());
                let root = broker.config().data.clone().unwrap_or_else(|| {
                    Arc::new(hayate_log::FsRoot(dir.clone())) as Arc<dyn hayate_log::Root>
                });
                match Journal::open(root, fsync) {
                    Ok(j) => Some(Arc::new(j)),
                    Err(e) => {
                        tracing::error!(
                            "mqtt: cannot open the log in {}: {e}; persistent sessions and \
                             retained messages are not saved",
                            dir.join(journal::DIR).display()
                        );
                        None
                    }
                }
            }
            None => None,
        };
        let recovered = AtomicBool::new(journal.is_none());
        Arc::new(Mqtt {
            broker,
            cfg: config.mqtt.clone(),
            auth,
            handshake_timeout: Duration::from_millis(config.limits.handshake_timeout_ms),
            max_preauth: config.limits.max_preauth_bytes.max(64),
            data_dir,
            registry: Mutex::new(HashMap::new()),
            retained: Mutex::new(
                Retained::new(
                    usize::try_from(config.mqtt.max_retained_bytes).unwrap_or(usize::MAX),
                )
                .with_memory(&memory),
            ),
            journal,
            journaling: config.mqtt.journal,
            recovered,
            next_sgen: AtomicU64::new(1),
            checkpointing: Mutex::new(Checkpoints::default()),
            stats: MqttStats::default(),
            next_conn: AtomicU64::new(1),
            started: Instant::now(),
        })
    }

    /// Restores the saved persistent sessions and retained messages from the data directory
    /// (the last checkpoint and the journal after it, or the files of format 1 migrated),
    /// then takes a checkpoint; from then on changes are journaled and checkpointed. Once
    /// only (later calls do nothing), before connections are served. A log that cannot be
    /// read is logged and left alone: the front-end then serves without saving anything.
    pub fn recover_state(&self) {
        if self.is_recovered() {
            return;
        }
        if let Some(dir) = self.data_dir.clone() {
            self.recover(&dir);
        }
    }

    /// Whether the saved state was restored (or there is none to restore): only then are
    /// changes journaled and checkpoints taken.
    pub fn is_recovered(&self) -> bool {
        self.recovered.load(Ordering::Acquire)
    }

    /// Reads the log (its last complete checkpoint, the journal after it), or migrates the
    /// files of format 1 (`persist::legacy`), restores the result and takes a new checkpoint.
    fn recover(&self, dir: &std::path::Path) {
        let Some(j) = &self.journal else { return };
        let root = j.root();
        let legacy = persist::legacy::present(&**root, dir);
        let loaded = match j.load() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(
                    "mqtt: cannot read the log: {e}; it is left as it is and nothing is saved"
                );
                return;
            }
        };
        let migrate = legacy && !loaded.complete;
        let saved = if migrate {
            if loaded.any {
                tracing::warn!("mqtt: the migration of the earlier format was cut; doing it again");
                if let Err(e) = j.reset() {
                    tracing::error!("{e}");
                    return;
                }
            }
            tracing::info!(
                "mqtt: migrating {} and {}/",
                persist::legacy::FILE,
                persist::legacy::JOURNAL_DIR
            );
            persist::legacy::read(&**root, dir)
        } else {
            if loaded.replayed + loaded.skipped > 0 {
                tracing::info!(
                    "mqtt: replayed {} journal records ({} skipped)",
                    loaded.replayed,
                    loaded.skipped
                );
            }
            loaded.saved
        };
        {
            let mut c = lock(&self.checkpointing);
            c.number = loaded.next_number;
            // A move cut short is finished once a checkpoint is durable (now, below).
            c.legacy = legacy;
        }
        self.next_sgen
            .store(saved.next_sgen.max(1), Ordering::Relaxed);
        // The sessions restored journal their changes from now on.
        self.recovered.store(true, Ordering::Release);
        let (s, r) = persist::restore(self, saved);
        if s + r > 0 {
            tracing::info!("mqtt: restored {s} sessions and {r} retained messages");
        }
        self.save();
    }

    /// The journal, if persistent state is journaled (and was recovered).
    pub(crate) fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal
            .as_ref()
            .filter(|_| self.journaling && self.is_recovered())
    }

    /// Whether every change journaled so far is durable (writes the journal if needed): what
    /// an acknowledgement that promises something waits for.
    pub(crate) fn durable(&self) -> Durable {
        match self.journal() {
            Some(j) => j.durable(),
            None => Durable::Ready(Ok(())),
        }
    }

    /// As [`Mqtt::durable`], without writing: the answer comes once the journal is written
    /// (by this connection at the end of its read: [`Mqtt::flush_journal`]).
    pub(crate) fn durable_later(&self) -> Durable {
        match self.journal() {
            Some(j) => j.durable_later(),
            None => Durable::Ready(Ok(())),
        }
    }

    /// Writes what the journal has buffered, if anything.
    pub(crate) fn flush_journal(&self) {
        if let Some(j) = &self.journal {
            j.flush_buffered();
        }
    }

    /// A new generation for a session that becomes persistent.
    pub(crate) fn new_sgen(&self) -> u64 {
        self.next_sgen.fetch_add(1, Ordering::Relaxed)
    }

    fn next_conn(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh session.
    pub(crate) fn new_session(&self) -> MqttSession {
        self.new_session_in(None)
    }

    /// A fresh session whose traffic counts in `class` (its listener's).
    pub(crate) fn new_session_in(
        &self,
        class: Option<&Arc<hayate_io::traffic::TrafficClass>>,
    ) -> MqttSession {
        let out = Arc::new(Mutex::new(MqttDeliveries::new(
            0,
            self.cfg.max_queued_messages,
            usize::try_from(self.cfg.max_queued_bytes).unwrap_or(usize::MAX),
            self.cfg.max_inflight,
            &self.broker.config().memory,
            &self.stats.held,
        )));
        let session = self.broker.open_session_in(
            Box::new(MqttEncoder {
                out: out.clone(),
                held: lock(&out).held_counter(),
                skipped: (0, 0),
            }),
            class,
        );
        lock(&out).session_id = session.id();
        MqttSession {
            session,
            out,
            subs: Default::default(),
        }
    }

    /// Takes a checkpoint: appends persistent sessions and retained messages to the log,
    /// then removes the segments the checkpoint covers (logged if it fails).
    pub fn save(&self) {
        if let Err(e) = self.checkpoint() {
            tracing::warn!("mqtt: checkpoint not taken: {e}");
        }
    }

    fn checkpoint(&self) -> Result<(), String> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        if !self.is_recovered() {
            // It would hold none of the saved state, and replace it.
            tracing::debug!("mqtt: state not recovered: no checkpoint taken");
            return Ok(());
        }
        let mut c = lock(&self.checkpointing);
        let p = j.mark()?;
        let next_sgen = self.next_sgen.load(Ordering::Relaxed);
        let (recs, s, r) = persist::checkpoint::snapshot(self, c.number, p, next_sgen);
        j.write_checkpoint(&recs)?;
        tracing::debug!("mqtt: checkpoint {}: {s} sessions, {r} retained", c.number);
        c.number += 1;
        c.last_bytes = recs.bytes.len() as u64;
        j.checkpointed(p);
        if c.legacy {
            let root = j.root();
            let dir = self
                .data_dir
                .as_deref()
                .unwrap_or(std::path::Path::new("."));
            match persist::legacy::move_files(&**root, dir) {
                Ok(()) => c.legacy = false,
                Err(e) => tracing::error!(
                    "mqtt: cannot move the files of the earlier format to {}: {e}",
                    persist::legacy::LEGACY_DIR
                ),
            }
        }
        Ok(())
    }

    /// The last checkpoint at shutdown: later changes (sessions dropped as the process
    /// ends) are not journaled.
    pub fn save_final(&self) {
        self.save();
        if let Some(j) = &self.journal {
            j.close();
        }
    }

    /// Whether the journal grew enough since the last checkpoint to take one now.
    fn checkpoint_due(&self) -> bool {
        let Some(j) = &self.journal else { return false };
        let last = lock(&self.checkpointing).last_bytes;
        j.since_checkpoint() > persist::CHECKPOINT_AT.max(2 * last)
    }

    /// Publishes `msg` from `session` (a will, `$SYS`), storing it first if retained.
    pub(crate) async fn publish_from(&self, session: &mut Session, msg: &Message) {
        if msg.attrs.retain {
            self.retain(msg); // not kept past the budget: counted
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
        let mut session = self.broker.open_session(Box::new(PublishOnly));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sys: Option<Instant> = None;
        let mut last_save = Instant::now();
        let mut flush = tokio::time::interval(journal::FLUSH_EVERY);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = flush.tick() => {
                    // Records nobody waits for (acknowledgements from subscribers, QoS 0
                    // retained messages) are written within FLUSH_EVERY.
                    if let Some(j) = &self.journal
                        && j.has_buffered()
                    {
                        let _ = j.flush();
                    }
                    continue;
                }
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
            // A journal that failed is reopened by a checkpoint: tried every 10 s.
            let failed = self.journal.as_ref().is_some_and(|j| j.failed())
                && now.duration_since(last_save) >= Duration::from_secs(10);
            if (every > 0 && now.duration_since(last_save).as_secs() >= every)
                || self.checkpoint_due()
                || failed
            {
                last_save = now;
                let me = self.clone();
                // File I/O off the runtime's worker threads.
                let _ = tokio::task::spawn_blocking(move || me.save()).await;
            }
        }
    }
}

#[cfg(test)]
mod limits_tests {
    /// The shared layer writes MQTT's largest packet size out rather than depend on the codec.
    #[test]
    fn the_shared_layer_knows_the_largest_packet_size() {
        assert_eq!(
            hayate_front::config::MQTT_MAX_PACKET,
            hayate_mqtt::MAX_VAR_INT
        );
    }
}
