//! The calling side: [`Client::call`], [`Client::cast`], [`Client::fanout`], and the reading
//! of a reply.

use std::time::Duration;

use bytes::Bytes;
use hayate_core::Message;

use super::{
    HEADER_ERROR, HEADER_NAMESPACE, HEADER_STATUS, HEADER_VERSION, RpcError, Target, header,
    header_str,
};
use crate::Client;

/// Turns a reply into the call's result.
fn read_reply(reply: Message, requested: &Target) -> Result<Bytes, RpcError> {
    let text = |p: &Bytes| String::from_utf8_lossy(p).into_owned();
    match header(&reply, HEADER_STATUS).map(|v| &v[..]) {
        Some(b"ok") => Ok(reply.payload),
        Some(b"error") => {
            let message = text(&reply.payload);
            Err(match header_str(&reply, HEADER_ERROR) {
                Some("unsupported-version") => {
                    match header_str(&reply, HEADER_VERSION).map(str::parse) {
                        Some(Ok(server)) => RpcError::UnsupportedVersion {
                            requested: requested.version,
                            server,
                        },
                        _ => RpcError::BadReply(format!(
                            "unsupported-version error without a valid {HEADER_VERSION}: \
                             {message}"
                        )),
                    }
                }
                Some("namespace-mismatch") => RpcError::NamespaceMismatch {
                    requested: requested.namespace.clone(),
                    server: header_str(&reply, HEADER_NAMESPACE)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                },
                Some("bad-request") => RpcError::BadRequest { message },
                _ => RpcError::Remote { message },
            })
        }
        Some(other) => Err(RpcError::BadReply(format!(
            "{HEADER_STATUS} is {:?}",
            String::from_utf8_lossy(other)
        ))),
        None => Err(RpcError::BadReply(format!("no {HEADER_STATUS} header"))),
    }
}

impl Client {
    /// Calls `method` on one server of `target` and waits up to `timeout` for the result:
    /// the server named by `target.server`, or else the next server of the topic in
    /// round-robin order.
    pub async fn call(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Bytes, RpcError> {
        let m = target.request(target.direct_key()?, method, payload.into())?;
        let reply = self.request_message(m, timeout).await?;
        read_reply(reply, target)
    }

    /// Sends `method` to one server of `target` (as [`call`](Client::call) chooses it)
    /// without waiting for anything: returns once the request is buffered for sending.
    /// Nobody is told if no server receives it, or if the server rejects it.
    pub async fn cast(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
    ) -> Result<(), RpcError> {
        let m = target.request(target.direct_key()?, method, payload.into())?;
        Ok(self.publish_message(&m).await?)
    }

    /// Sends `method` to every server of `target.topic` (`target.server` is ignored),
    /// without a reply.
    pub async fn fanout(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
    ) -> Result<(), RpcError> {
        let m = target.request(target.fanout_key()?, method, payload.into())?;
        Ok(self.publish_message(&m).await?)
    }
}
