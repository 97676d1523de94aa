//! The stream administration API, over request/reply to `$hayate/api/stream/<op>`.

use std::time::Duration;

use bytes::Bytes;
use hayate_api::stream::{
    ApiReply, CONSUMER_API, ConsumerRequest, NameRequest, RemovedInfo, STREAM_API,
};
pub use hayate_api::stream::{
    ConsumerConfig, ConsumerInfo, ConsumerView, Start, StreamConfig, StreamInfo,
};
use hayate_core::{Key, Message};

use crate::{Client, Error, Result};

/// How long an API call waits for its answer (creating a stream syncs files).
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// Stream administration through one client (see [`Client::streams`]).
#[derive(Debug)]
pub struct Streams<'a> {
    pub(crate) client: &'a Client,
}

impl Streams<'_> {
    async fn call(&self, op: &str, body: Vec<u8>) -> Result<ApiReply> {
        self.call_at(STREAM_API, op, body).await
    }

    async fn call_at(&self, api: &str, op: &str, body: Vec<u8>) -> Result<ApiReply> {
        let key = Key::new(&format!("{api}{op}"))?;
        let reply = self
            .client
            .request_message(Message::new(key, Bytes::from(body)), API_TIMEOUT)
            .await?;
        let r: ApiReply = serde_json::from_slice(&reply.payload)
            .map_err(|e| Error::Protocol(format!("stream API {op}: bad reply: {e}")))?;
        if r.ok {
            Ok(r)
        } else {
            Err(Error::Api(
                r.error.unwrap_or_else(|| format!("stream API {op} failed")),
            ))
        }
    }

    fn name(name: &str) -> Vec<u8> {
        serde_json::to_vec(&NameRequest {
            name: name.to_owned(),
        })
        .unwrap_or_default()
    }

    /// Creates a stream (or finds it, if it exists with this definition: `false`).
    pub async fn add(&self, config: &StreamConfig) -> Result<(StreamInfo, bool)> {
        let body = serde_json::to_vec(config).map_err(|e| Error::Protocol(e.to_string()))?;
        let r = self.call("add", body).await?;
        let info = r
            .info
            .ok_or_else(|| Error::Protocol("stream API add: no info".into()))?;
        Ok((info, r.created.unwrap_or(false)))
    }

    /// Deletes a stream and its records.
    pub async fn remove(&self, name: &str) -> Result<()> {
        self.call("rm", Self::name(name)).await.map(drop)
    }

    /// Every stream, by name.
    pub async fn list(&self) -> Result<Vec<StreamInfo>> {
        Ok(self
            .call("ls", b"{}".to_vec())
            .await?
            .streams
            .unwrap_or_default())
    }

    /// One stream's state.
    pub async fn info(&self, name: &str) -> Result<StreamInfo> {
        self.call("info", Self::name(name))
            .await?
            .info
            .ok_or_else(|| Error::Protocol("stream API info: no info".into()))
    }

    /// Removes every record of a stream (offsets go on).
    pub async fn purge(&self, name: &str) -> Result<RemovedInfo> {
        self.call("purge", Self::name(name))
            .await?
            .removed
            .ok_or_else(|| Error::Protocol("stream API purge: no result".into()))
    }

    fn consumer_body(stream: &str, name: &str) -> Vec<u8> {
        serde_json::to_vec(&ConsumerRequest {
            stream: stream.to_owned(),
            name: name.to_owned(),
        })
        .unwrap_or_default()
    }

    /// Creates a durable consumer (or finds it, if it exists with this definition: `false`).
    pub async fn consumer_add(&self, config: &ConsumerConfig) -> Result<(ConsumerView, bool)> {
        let body = serde_json::to_vec(config).map_err(|e| Error::Protocol(e.to_string()))?;
        let r = self.call_at(CONSUMER_API, "add", body).await?;
        let view = r
            .consumer
            .ok_or_else(|| Error::Protocol("consumer API add: no consumer".into()))?;
        Ok((view, r.created.unwrap_or(false)))
    }

    /// Deletes a consumer (its members stop receiving).
    pub async fn consumer_remove(&self, stream: &str, name: &str) -> Result<()> {
        self.call_at(CONSUMER_API, "rm", Self::consumer_body(stream, name))
            .await
            .map(drop)
    }

    /// One consumer's definition and state.
    pub async fn consumer_info(&self, stream: &str, name: &str) -> Result<ConsumerView> {
        self.call_at(CONSUMER_API, "info", Self::consumer_body(stream, name))
            .await?
            .consumer
            .ok_or_else(|| Error::Protocol("consumer API info: no consumer".into()))
    }

    /// The consumers of `stream`.
    pub async fn consumer_list(&self, stream: &str) -> Result<Vec<ConsumerView>> {
        Ok(self
            .call_at(CONSUMER_API, "ls", Self::name(stream))
            .await?
            .consumers
            .unwrap_or_default())
    }
}
