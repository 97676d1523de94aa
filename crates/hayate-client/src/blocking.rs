//! A synchronous wrapper around [`Client`](crate::Client) for programs without an async
//! runtime. It owns a small current-thread runtime.

use std::time::Duration;

use bytes::Bytes;
use hayate_core::{Key, Message};

use crate::{Error, Result};

/// A blocking client.
#[derive(Debug)]
pub struct Client {
    rt: tokio::runtime::Runtime,
    inner: crate::Client,
}

/// A blocking subscription.
#[derive(Debug)]
pub struct Subscription<'a> {
    rt: &'a tokio::runtime::Runtime,
    inner: crate::Subscription,
}

impl Client {
    /// Connects to `addr` (`HOST:PORT` or `unix:PATH`).
    pub fn connect(addr: &str) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(Error::from)?;
        let inner = rt.block_on(crate::Client::connect(addr))?;
        Ok(Client { rt, inner })
    }

    /// Publishes `payload` on `key`.
    pub fn publish(&self, key: &Key, payload: impl Into<Bytes>) -> Result<()> {
        self.rt.block_on(self.inner.publish(key, payload))
    }

    /// Subscribes to `expr`.
    pub fn subscribe(&self, expr: &str) -> Result<Subscription<'_>> {
        let inner = self.rt.block_on(self.inner.subscribe(expr))?;
        Ok(Subscription {
            rt: &self.rt,
            inner,
        })
    }

    /// Sends a request and waits for its reply.
    pub fn request(
        &self,
        key: &Key,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Message> {
        self.rt.block_on(self.inner.request(key, payload, timeout))
    }

    /// Waits until the server has processed everything sent so far.
    pub fn flush(&self) -> Result<()> {
        self.rt.block_on(self.inner.flush())
    }

    /// Closes the connection.
    pub fn close(self) -> Result<()> {
        self.rt.block_on(self.inner.close())
    }
}

impl Subscription<'_> {
    /// The next message, waiting at most `timeout`; `Ok(None)` if the subscription ended.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Message>> {
        self.rt
            .block_on(tokio::time::timeout(timeout, self.inner.next()))
            .map_err(|_| Error::Timeout)
    }
}
