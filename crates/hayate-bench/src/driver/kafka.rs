//! Kafka driver (`kafka://HOST:PORT`, default 19092), through `rdkafka` (librdkafka 2.10.0,
//! built from source).
//!
//! - One topic per key and point, with 1 partition and replication factor 1, created by the
//!   subscriber with the admin client (a key `a/b` is the topic `a.b`) and deleted when the
//!   subscriber's connection closes.
//! - Producer (the seeds' settings): `linger.ms=0`, `batch.size=1 MiB`, no compression, a
//!   queue of up to 1 Mi messages / 1 GiB, and `acks=0` by default (`?acks=1` or `?acks=all`
//!   to wait for the leader / all replicas; the same setting serves throughput and latency).
//!   When librdkafka's queue is full, `publish` waits 1 ms and retries.
//! - Consumer: its own group (no commits), assigned partition 0 of the topic at its high
//!   watermark, read when the subscription is made: everything produced after `subscribe`
//!   returns is received; `fetch.wait.max.ms=10`, fetches of up to 64 MiB.
//! - Flush: the subscription is assigned at an explicit offset when `subscribe` returns; flush
//!   waits for the producer's queue to drain (`producer.flush`: with acks=0 a message is
//!   "delivered" once written to the socket).
//! - Payloads are limited by the broker's `message.max.bytes` (1 MiB by default).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use hayate_core::sync::lock;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "rdkafka 0.38 (librdkafka 2.10.0)";

/// The topic of a key: `/` -> `.`.
pub(crate) fn topic_name(key: &str) -> String {
    key.replace('/', ".")
}

#[derive(Clone)]
pub(crate) struct KafkaConn {
    bootstrap: String,
    producer: ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    admin: Arc<AdminClient<DefaultClientContext>>,
    created: Arc<Mutex<Vec<String>>>,
    readers: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    trouble: Arc<Mutex<Option<String>>>,
    name: String,
    cap: usize,
}

pub(crate) struct KafkaSub(mpsc::Receiver<Bytes>);

impl KafkaConn {
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        expect_payload: usize,
    ) -> anyhow::Result<KafkaConn> {
        let bootstrap = target.addr();
        let acks = target.param("acks").unwrap_or("0");
        if !matches!(acks, "0" | "1" | "all" | "-1") {
            bail!("kafka: acks={acks} (expected 0, 1 or all)");
        }
        let producer: ThreadedProducer<_> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("client.id", name)
            .set("acks", acks)
            .set("linger.ms", "0")
            .set("batch.size", "1048576")
            .set("compression.type", "none")
            .set("message.max.bytes", "100000000")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .create()
            .with_context(|| format!("kafka producer for {target}"))?;
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()?;
        // Fail early when no broker answers.
        let probe = producer.clone();
        tokio::task::spawn_blocking(move || {
            probe
                .client()
                .fetch_metadata(None, Duration::from_secs(10))
                .map(|_| ())
        })
        .await?
        .with_context(|| format!("connecting to {target}"))?;
        Ok(KafkaConn {
            bootstrap,
            producer,
            admin: Arc::new(admin),
            created: Arc::default(),
            readers: Arc::default(),
            trouble: Arc::default(),
            name: name.to_string(),
            cap: ((256usize << 20) / (expect_payload + 64)).clamp(16, 4096),
        })
    }

    #[inline]
    pub(crate) async fn publish(&self, topic: &str, payload: Bytes) -> anyhow::Result<()> {
        loop {
            let rec = BaseRecord::<(), [u8]>::to(topic).payload(&payload[..]);
            match self.producer.send(rec) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<KafkaSub> {
        let topic = topic_name(key);
        let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1));
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        for r in self.admin.create_topics([&new], &opts).await? {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, e)) => bail!("kafka: creating topic {t}: {e}"),
            }
        }
        lock(&self.created).push(topic.clone());
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("client.id", &self.name)
            .set(
                "group.id",
                format!("{}-{}", self.name, topic).replace(['/', ' '], "."),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest")
            .set("fetch.wait.max.ms", "10")
            .set("fetch.max.bytes", "67108864")
            .set("max.partition.fetch.bytes", "67108864")
            .set("receive.message.max.bytes", "100000000")
            .create()?;
        // The high watermark, once the new topic's leader is known (retried for up to 10 s).
        let (consumer, high) = {
            let topic = topic.clone();
            tokio::task::spawn_blocking(move || {
                let mut last = None;
                for _ in 0..50 {
                    match consumer.fetch_watermarks(&topic, 0, Duration::from_secs(2)) {
                        Ok((_, high)) => return Ok((consumer, high)),
                        Err(e) => last = Some(e),
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(anyhow::anyhow!(
                    "kafka: no watermarks for {topic}: {}",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ))
            })
            .await??
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(high))?;
        consumer.assign(&tpl)?;
        let (tx, rx) = mpsc::channel(self.cap);
        let trouble = self.trouble.clone();
        let reader = tokio::spawn(async move {
            loop {
                match consumer.recv().await {
                    Ok(m) => {
                        let p = Bytes::copy_from_slice(m.payload().unwrap_or_default());
                        if tx.send(p).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        lock(&trouble).get_or_insert(format!("kafka consumer: {e}"));
                        return;
                    }
                }
            }
        });
        lock(&self.readers).push(reader.abort_handle());
        Ok(KafkaSub(rx))
    }

    /// See the module docs.
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        let p = self.producer.clone();
        tokio::task::spawn_blocking(move || p.flush(timeout)).await??;
        Ok(())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.trouble).clone()
    }

    pub(crate) fn server_version(&self) -> Option<String> {
        None
    }

    pub(crate) async fn close(self) {
        for r in lock(&self.readers).drain(..) {
            r.abort();
        }
        let topics: Vec<String> = lock(&self.created).drain(..).collect();
        if !topics.is_empty() {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(5)));
            if let Err(e) = self.admin.delete_topics(&names, &opts).await {
                tracing::debug!("kafka: deleting topics: {e}");
            }
        }
        let p = self.producer.clone();
        let _ = tokio::task::spawn_blocking(move || p.flush(Duration::from_secs(2))).await;
    }
}

impl KafkaSub {
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv().await
    }
}
