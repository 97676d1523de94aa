//! MQTT 3.1.1 driver through `rumqttc` (feature `peers`), selected with
//! `mqtt://HOST:PORT?client=rumqttc`; the default `mqtt://` driver is [`super::mqttc`] (over
//! the workspace's `hayate-mqtt` codec), which uses far less CPU per message.
//!
//! - Topics: a key `a/b` is the MQTT topic `a/b` as is.
//! - QoS 0 by default (the seeds' setting: best-effort, as fast as the broker goes); `?qos=1`
//!   publishes and subscribes with QoS 1 (each publication acknowledged by a PUBACK).
//! - The client does not throttle: in-flight window 65535 (QoS 1), a request channel of up to
//!   64 Ki publications (bounded by ~256 MiB of payload) between `publish` and the event loop,
//!   and max packet size 256 MiB in both directions.
//! - One task polls the event loop of each connection and hands each incoming PUBLISH to the
//!   subscription of its topic (topics are exact: no wildcards are used).
//! - Flush: a real round trip through the broker on this connection: subscribe a private topic,
//!   publish one message to it and wait for it. A broker handles one connection's packets in
//!   order, so once it is back every SUBSCRIBE and PUBLISH sent earlier has been processed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use hayate_core::sync::lock;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

use crate::target::Target;

/// The client library, for records.
pub(crate) const CLIENT: &str = "rumqttc 0.25";

type Routes = Arc<Mutex<HashMap<String, mpsc::Sender<Bytes>>>>;

#[derive(Clone)]
pub(crate) struct MqttConn {
    client: AsyncClient,
    qos: QoS,
    routes: Routes,
    trouble: Arc<Mutex<Option<String>>>,
    poller: Arc<tokio::task::JoinHandle<()>>,
    id: String,
    cap: usize,
}

pub(crate) struct MqttSub(mpsc::Receiver<Bytes>);

const MAX_PACKET: usize = 256 << 20;

impl MqttConn {
    pub(crate) async fn connect(
        target: &Target,
        name: &str,
        expect_payload: usize,
        timeout: Duration,
    ) -> anyhow::Result<MqttConn> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let qos = match target.param("qos").unwrap_or("0") {
            "0" => QoS::AtMostOnce,
            "1" => QoS::AtLeastOnce,
            q => bail!("mqtt: qos={q} is not supported (0 or 1)"),
        };
        if let Some(v) = target.param("version")
            && !matches!(v, "3.1.1" | "4")
        {
            bail!("mqtt: the rumqttc driver speaks MQTT 3.1.1 only (version={v})");
        }
        let id = format!(
            "{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut opts = MqttOptions::new(id.clone(), target.host.clone(), target.port);
        let cap = ((256usize << 20) / (expect_payload + 64)).clamp(16, 1 << 16);
        opts.set_keep_alive(Duration::from_secs(60))
            .set_clean_session(true)
            .set_max_packet_size(MAX_PACKET, MAX_PACKET)
            .set_inflight(u16::MAX)
            .set_request_channel_capacity(cap);
        let (client, mut eventloop) = AsyncClient::new(opts, cap);
        // Wait for the CONNACK before handing the connection out.
        let connected = tokio::time::timeout(timeout, async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(anyhow::Error::new(e)),
                }
            }
        })
        .await
        .with_context(|| format!("no CONNACK within {timeout:?}"))?;
        connected.with_context(|| format!("connecting to {target}"))?;
        let routes: Routes = Arc::default();
        let trouble: Arc<Mutex<Option<String>>> = Arc::default();
        let poller = {
            let (routes, trouble, who) = (routes.clone(), trouble.clone(), name.to_string());
            tokio::spawn(async move {
                loop {
                    match eventloop.poll().await {
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            let tx = lock(&routes).get(p.topic.as_str()).cloned();
                            if let Some(tx) = tx {
                                // A closed receiver is a subscription given up: drop.
                                let _ = tx.send(p.payload).await;
                            }
                        }
                        Ok(Event::Incoming(Packet::Disconnect)) => {
                            lock(&trouble).get_or_insert(format!("{who}: broker disconnected"));
                            break;
                        }
                        Ok(_) => {}
                        Err(rumqttc::ConnectionError::RequestsDone) => break,
                        Err(e) => {
                            lock(&trouble).get_or_insert(format!("{who}: mqtt: {e}"));
                            break;
                        }
                    }
                }
                // Ends every subscription.
                lock(&routes).clear();
            })
        };
        Ok(MqttConn {
            client,
            qos,
            routes,
            trouble,
            poller: Arc::new(poller),
            id,
            cap,
        })
    }

    #[inline]
    pub(crate) async fn publish(&self, topic: &str, payload: Bytes) -> anyhow::Result<()> {
        self.client
            .publish_bytes(topic, self.qos, false, payload)
            .await?;
        Ok(())
    }

    pub(crate) async fn subscribe(&self, key: &str) -> anyhow::Result<MqttSub> {
        let (tx, rx) = mpsc::channel(self.cap.min(4096));
        lock(&self.routes).insert(key.to_string(), tx);
        self.client.subscribe(key, self.qos).await?;
        Ok(MqttSub(rx))
    }

    /// A round trip through the broker (see the module docs).
    pub(crate) async fn flush(&self, timeout: Duration) -> anyhow::Result<()> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let topic = format!(
            "bench-flush/{}/{}",
            self.id,
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut probe = self.subscribe(&topic).await?;
        self.client
            .publish_bytes(topic.clone(), QoS::AtMostOnce, false, Bytes::new())
            .await?;
        let got = tokio::time::timeout(timeout, probe.next()).await;
        lock(&self.routes).remove(&topic);
        got.with_context(|| format!("no round trip to the mqtt broker within {timeout:?}"))?
            .context("the connection ended during a round trip")?;
        self.client.unsubscribe(topic).await?;
        Ok(())
    }

    pub(crate) fn trouble(&self) -> Option<String> {
        lock(&self.trouble).clone()
    }

    pub(crate) async fn close(self) {
        if let Err(e) = self.client.disconnect().await {
            tracing::debug!("mqtt disconnect: {e}");
        }
        // The poller ends when the broker closes or the client is gone.
        drop(self.client);
        if let Ok(poller) = Arc::try_unwrap(self.poller) {
            let abort = poller.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), poller)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl MqttSub {
    #[inline]
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        self.0.recv().await
    }
}
