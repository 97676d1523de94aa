//! The broker's streams: creating, opening, deleting and purging them, and what a publish
//! stored.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_log::Removed;

use super::consumer::{Consumer, ConsumerConfig};
use super::{Stream, StreamConfig, StreamError};
use crate::broker::Broker;
use crate::meta::Meta;
use crate::meta::record::{self, Position};

/// What one publish appended to streams.
#[derive(Debug, Default)]
pub struct Stored {
    /// Streams that appended the messages, with their offsets.
    pub appended: Vec<(Arc<Stream>, Range<u64>)>,
    /// Streams that failed to append them.
    pub failed: Vec<(String, hayate_log::Error)>,
}

impl Stored {
    /// True when no stream captured the messages.
    pub fn is_empty(&self) -> bool {
        self.appended.is_empty() && self.failed.is_empty()
    }

    /// The confirm's answer if it is known without waiting: no stream captured the
    /// messages, an append failed, or every stream already counts them as durable (fsync
    /// `interval` and `never` confirm once written).
    pub fn ready(&self) -> Option<Result<Option<(String, u64)>, String>> {
        if let Some((name, e)) = self.failed.first() {
            return Some(Err(format!("stream {name}: {e}")));
        }
        if self
            .appended
            .iter()
            .all(|(s, r)| s.log().confirmed_offset() >= r.end)
        {
            return Some(Ok(self
                .appended
                .first()
                .map(|(s, r)| (s.name().to_owned(), r.start))));
        }
        None
    }

    /// Resolves once every append is durable under its stream's policy: `Ok` with the first
    /// stream's name and the offset of the first message (`None` when no stream captured
    /// them), `Err` with the reason when an append or its sync failed.
    pub async fn confirmed(self) -> Result<Option<(String, u64)>, String> {
        {
            if let Some((name, e)) = self.failed.into_iter().next() {
                return Err(format!("stream {name}: {e}"));
            }
            for (s, r) in &self.appended {
                if r.end > r.start {
                    s.log()
                        .confirmed(r.end - 1)
                        .await
                        .map_err(|e| format!("stream {}: {e}", s.name()))?;
                }
            }
            Ok(self
                .appended
                .first()
                .map(|(s, r)| (s.name().to_owned(), r.start)))
        }
    }
}

impl Broker {
    fn root(&self) -> Result<&Arc<dyn hayate_log::Root>, StreamError> {
        self.shared
            .config
            .data
            .as_ref()
            .ok_or(StreamError::NoDataDir)
    }

    /// The meta log: opened on first use, after which files of an older format are
    /// migrated into it (`meta::migrate`).
    pub fn meta(&self) -> Result<Arc<Meta>, StreamError> {
        let mut m = self.shared.meta.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(meta) = &*m {
            return Ok(meta.clone());
        }
        let root = self.root()?;
        let meta = Arc::new(Meta::open(&**root).map_err(|source| StreamError::Log {
            name: crate::meta::DIR.to_owned(),
            source,
        })?);
        crate::meta::migrate::run(&meta, root.path())?;
        *m = Some(meta.clone());
        Ok(meta)
    }

    /// Opens every stream the meta log defines, with their consumers (at start-up); returns
    /// their names.
    pub fn open_streams(&self) -> Result<Vec<String>, StreamError> {
        let Ok(root) = self.root() else {
            return Ok(Vec::new());
        };
        let meta = self.meta()?;
        let mut names = Vec::new();
        for (key, json) in meta.scan("stream/") {
            let config: StreamConfig = serde_json::from_slice(&json)
                .map_err(|e| StreamError::Invalid(format!("meta log {key}: {e}")))?;
            if key != record::stream_key(&config.name) {
                return Err(StreamError::Invalid(format!(
                    "meta log {key}: names stream {}",
                    config.name
                )));
            }
            let s = Arc::new(Stream::open(&**root, config)?);
            self.load_consumers(&meta, &s)?;
            names.push(s.name().to_owned());
            self.shared
                .streams
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(s.name().to_owned(), s);
        }
        self.bump();
        Ok(names)
    }

    /// Opens the consumers of `s` the meta log defines. One that cannot be used is left out
    /// (logged; the broker still starts and the consumer can be made again).
    fn load_consumers(&self, meta: &Arc<Meta>, s: &Arc<Stream>) -> Result<(), StreamError> {
        let mut map = s.consumers.lock().unwrap_or_else(|p| p.into_inner());
        for (key, json) in meta.scan(&format!("consumer/{}/", s.name())) {
            let config = serde_json::from_slice::<ConsumerConfig>(&json)
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    if key == record::consumer_key(s.name(), &c.name) && c.stream == s.name() {
                        Ok(c)
                    } else {
                        Err(format!("names consumer {}/{}", c.stream, c.name))
                    }
                });
            let pos = config.and_then(|c| {
                let pos = match meta.get(&record::pos_key(s.name(), &c.name)) {
                    Some(v) => Position::decode(&v)?,
                    None => Position::default(),
                };
                Ok((c, pos))
            });
            let loaded = pos.and_then(|(c, pos)| {
                Consumer::load(s.clone(), meta.clone(), c, pos).map_err(|e| e.to_string())
            });
            match loaded {
                Ok(c) => {
                    map.insert(c.config().name.clone(), Arc::new(c));
                }
                Err(e) => {
                    tracing::error!(stream = %s.name(), record = %key, "consumer unusable ({e}): left out");
                }
            }
        }
        Ok(())
    }

    /// Creates a stream, or returns the existing one if its definition is the same
    /// (`false`: it existed).
    pub fn create_stream(&self, config: StreamConfig) -> Result<(Arc<Stream>, bool), StreamError> {
        super::check(&config)?;
        let root = self.root()?;
        let meta = self.meta()?;
        // Creations and deletions one at a time; the table itself is locked only to look and
        // to insert, not across the file work (directories, fsyncs, opening the log).
        let _admin = self
            .shared
            .stream_admin
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        {
            let streams = self
                .shared
                .streams
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(s) = streams.get(&config.name) {
                // Owned by someone else: not theirs to define. Otherwise the owner is not
                // part of the comparison (a stream of the config file re-made through the
                // API by a user must not stop the next start).
                let existing = s.config();
                if let Some(caller) = &config.owner {
                    super::check_owner(existing.owner.as_deref(), Some(caller), || {
                        format!("stream {}", config.name)
                    })?;
                }
                let same = StreamConfig {
                    owner: existing.owner.clone(),
                    ..config.clone()
                } == *existing;
                return if same {
                    Ok((s.clone(), false))
                } else {
                    Err(StreamError::Exists(config.name))
                };
            }
            if streams.len() >= self.shared.config.max_streams {
                return Err(StreamError::Invalid(format!(
                    "the broker keeps at most {} streams (limits.max_streams)",
                    self.shared.config.max_streams
                )));
            }
            // One user cannot take every stream: counted under the admin lock, so two
            // creations at once do not both pass.
            if let Some(u) = &config.owner {
                let max = self.shared.config.max_streams_per_user;
                let held = streams
                    .values()
                    .filter(|s| s.config().owner.as_ref() == Some(u))
                    .count();
                if held >= max {
                    return Err(StreamError::Invalid(format!(
                        "user {u} owns {held} streams, the most allowed ({max}, limits.max_streams_per_user)"
                    )));
                }
            }
        }
        let rel = format!("streams/{}", config.name);
        // Left by a deletion that did not finish: start afresh.
        root.remove_dir(&rel).map_err(|source| StreamError::Io {
            name: config.name.clone(),
            source,
        })?;
        let json = serde_json::to_vec(&config).map_err(|e| StreamError::Invalid(e.to_string()))?;
        let s = Arc::new(Stream::open(&**root, config.clone())?);
        meta.put_durable(&[(&record::stream_key(&config.name), &json)])
            .map_err(|source| StreamError::Log {
                name: config.name.clone(),
                source,
            })?;
        self.shared
            .streams
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(config.name.clone(), s.clone());
        self.bump();
        tracing::info!(stream = %config.name, capture = ?config.capture, fsync = %config.fsync, "stream created");
        Ok((s, true))
    }

    /// Deletes a stream and its files.
    pub fn delete_stream(&self, name: &str) -> Result<(), StreamError> {
        self.delete_stream_as(name, None, false)
    }

    /// Deletes a stream and its files for `caller`, who must be its owner if it has one
    /// (checked under the same locks as the removal).
    pub fn delete_stream_by(&self, name: &str, caller: Option<&str>) -> Result<(), StreamError> {
        self.delete_stream_as(name, caller, true)
    }

    fn delete_stream_as(
        &self,
        name: &str,
        caller: Option<&str>,
        check: bool,
    ) -> Result<(), StreamError> {
        let meta = self.meta()?;
        let _admin = self
            .shared
            .stream_admin
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let s = {
            let mut streams = self
                .shared
                .streams
                .write()
                .unwrap_or_else(|p| p.into_inner());
            if check && let Some(s) = streams.get(name) {
                super::check_owner(s.config().owner.as_deref(), caller, || {
                    format!("stream {name}")
                })?;
            }
            streams
                .remove(name)
                .ok_or_else(|| StreamError::NotFound(name.to_owned()))?
        };
        self.bump();
        s.deleted.store(true, Ordering::Release);
        // No file of the old log is touched after this (a stream of the same name may be
        // created in the same directory right after), whoever still holds the stream.
        s.log().discard();
        // The definitions go first, in one record batch: a crash part-way leaves files that
        // are not a stream (removed when a stream of that name is made).
        let consumers = s.consumer_list();
        let mut keys = vec![record::stream_key(name)];
        for c in &consumers {
            c.stop();
            keys.push(record::consumer_key(name, &c.config().name));
            keys.push(record::pos_key(name, &c.config().name));
        }
        let gone: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &[][..])).collect();
        meta.put_durable(&gone).map_err(|source| StreamError::Log {
            name: name.to_owned(),
            source,
        })?;
        self.root()?
            .remove_dir(&format!("streams/{name}"))
            .map_err(|source| StreamError::Io {
                name: name.to_owned(),
                source,
            })?;
        tracing::info!(stream = %name, "stream deleted");
        Ok(())
    }

    /// Removes every record of a stream (offsets go on).
    pub fn purge_stream(&self, name: &str) -> Result<Removed, StreamError> {
        self.purge_stream_as(name, None, false)
    }

    /// Purges a stream for `caller`, who must be its owner if it has one.
    pub fn purge_stream_by(
        &self,
        name: &str,
        caller: Option<&str>,
    ) -> Result<Removed, StreamError> {
        self.purge_stream_as(name, caller, true)
    }

    fn purge_stream_as(
        &self,
        name: &str,
        caller: Option<&str>,
        check: bool,
    ) -> Result<Removed, StreamError> {
        let s = self
            .stream(name)
            .ok_or_else(|| StreamError::NotFound(name.to_owned()))?;
        if check {
            // The stream purged is the one checked (the same `Arc`).
            super::check_owner(s.config().owner.as_deref(), caller, || {
                format!("stream {name}")
            })?;
        }
        s.log().purge().map_err(|source| StreamError::Log {
            name: name.to_owned(),
            source,
        })
    }

    /// The stream named `name`.
    pub fn stream(&self, name: &str) -> Option<Arc<Stream>> {
        self.shared
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// Every stream, by name.
    pub fn streams(&self) -> Vec<Arc<Stream>> {
        self.shared
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Creates a durable consumer, or returns the existing one if its definition is the
    /// same (`false`: it existed).
    pub fn create_consumer(
        &self,
        config: ConsumerConfig,
    ) -> Result<(Arc<Consumer>, bool), StreamError> {
        // A user's consumers are counted over every stream: creations by users one at a
        // time (under the admin lock, taken before any consumer table), so two at once do
        // not both pass. Deletions only lower the count.
        let _admin = config.creator.as_ref().map(|_| {
            self.shared
                .stream_admin
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        });
        let held = match &config.creator {
            Some(u) => self
                .streams()
                .iter()
                .flat_map(|s| s.consumer_list())
                .filter(|c| c.config().made_by() == Some(u.as_str()))
                .count(),
            None => 0,
        };
        let s = self
            .stream(&config.stream)
            .ok_or_else(|| StreamError::NotFound(config.stream.clone()))?;
        let mut map = s.consumers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = map.get(&config.name) {
            let existing = c.config();
            if let Some(caller) = &config.owner {
                super::check_owner(existing.owner.as_deref(), Some(caller), || {
                    format!("consumer {}/{}", config.stream, config.name)
                })?;
            }
            let same = ConsumerConfig {
                owner: existing.owner.clone(),
                creator: existing.creator.clone(),
                ..config.clone()
            } == *existing;
            return if same {
                Ok((c.clone(), false))
            } else {
                Err(StreamError::Exists(format!(
                    "{}/{}",
                    config.stream, config.name
                )))
            };
        }
        if map.len() >= self.shared.config.max_consumers {
            return Err(StreamError::Invalid(format!(
                "stream {} has the most consumers allowed ({}, limits.max_consumers)",
                config.stream, self.shared.config.max_consumers
            )));
        }
        if let Some(u) = &config.creator
            && held >= self.shared.config.max_consumers_per_user
        {
            return Err(StreamError::Invalid(format!(
                "user {u} has created {held} consumers, the most allowed ({}, limits.max_consumers_per_user)",
                self.shared.config.max_consumers_per_user
            )));
        }
        if let Some(dl) = &config.dead_letter {
            let target = self
                .stream(dl)
                .ok_or_else(|| StreamError::NotFound(dl.clone()))?;
            // A user's dead letters go into a stream of that user's, or one without an
            // owner (the server checks its capture against the user's publish rule): never
            // into another user's.
            if let Some(u) = &config.creator {
                super::check_owner(target.config().owner.as_deref(), Some(u), || {
                    format!("dead-letter stream {dl}")
                })?;
            }
        }
        let name = config.name.clone();
        let c = Arc::new(Consumer::create(s.clone(), self.meta()?, config)?);
        map.insert(name, c.clone());
        Ok((c, true))
    }

    /// Deletes a consumer (its members stop).
    pub fn delete_consumer(&self, stream: &str, name: &str) -> Result<(), StreamError> {
        self.delete_consumer_as(stream, name, None, false)
    }

    /// Deletes a durable consumer for `caller`, who must be its owner if it has one
    /// (checked under the lock of the removal).
    pub fn delete_consumer_by(
        &self,
        stream: &str,
        name: &str,
        caller: Option<&str>,
    ) -> Result<(), StreamError> {
        self.delete_consumer_as(stream, name, caller, true)
    }

    fn delete_consumer_as(
        &self,
        stream: &str,
        name: &str,
        caller: Option<&str>,
        check: bool,
    ) -> Result<(), StreamError> {
        let s = self
            .stream(stream)
            .ok_or_else(|| StreamError::NotFound(stream.to_owned()))?;
        let c = {
            let mut map = s.consumers.lock().unwrap_or_else(|p| p.into_inner());
            if check && let Some(c) = map.get(name) {
                super::check_owner(c.config().owner.as_deref(), caller, || {
                    format!("consumer {stream}/{name}")
                })?;
            }
            map.remove(name)
                .ok_or_else(|| StreamError::NotFound(format!("{stream}/{name}")))?
        };
        c.delete()
    }

    /// Applies each stream's retention now.
    pub fn apply_retention(&self) {
        let now = super::codec::now_ms();
        for s in self.streams() {
            if s.config().work_queue {
                let floor = s.consumer_list().iter().map(|c| c.info().floor).min();
                if let Some(floor) = floor
                    && let Err(e) = s.log().delete_before(floor)
                {
                    tracing::warn!(stream = %s.name(), "work-queue retention: {e}");
                }
            }
            match s.log().apply_retention(now) {
                Ok(r) if r.segments > 0 => {
                    tracing::debug!(stream = %s.name(), records = r.records, bytes = r.bytes, "retention removed segments");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(stream = %s.name(), "retention: {e}"),
            }
        }
    }
}

pub(crate) type StreamMap = BTreeMap<String, Arc<Stream>>;
