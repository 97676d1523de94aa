//! [`Target`]: where an RPC goes, or what a server is; the keys and requests it makes.

use bytes::Bytes;
use hayate_core::{Key, Message};

use super::{HEADER_METHOD, HEADER_NAMESPACE, HEADER_VERSION, KEY_PREFIX, RpcError, Version};
#[cfg(doc)]
use crate::Client;

/// Where an RPC goes (for [`Client::call`], [`Client::cast`], [`Client::fanout`]) or what a
/// server is (for [`Client::serve`]).
///
/// `topic` and `server` must each be one valid key segment: non-empty, without `/`, and not
/// `*` or `**`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The topic: the interface the servers implement.
    pub topic: String,
    /// A server name: a call or cast goes to this server only; required to serve.
    pub server: Option<String>,
    /// The namespace; requests and servers must agree on it (`None` matches only `None`).
    pub namespace: Option<String>,
    /// For a request, the version the caller needs; for a server, the version it speaks.
    pub version: Version,
}

impl Target {
    /// A target for `topic`: any server, no namespace, version 1.0.
    pub fn new(topic: impl Into<String>) -> Target {
        Target {
            topic: topic.into(),
            server: None,
            namespace: None,
            version: Version::default(),
        }
    }

    /// Sets the server name.
    pub fn server(mut self, server: impl Into<String>) -> Target {
        self.server = Some(server.into());
        self
    }

    /// Sets the namespace (an empty one is the same as none).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Target {
        let ns = namespace.into();
        self.namespace = (!ns.is_empty()).then_some(ns);
        self
    }

    /// Sets the version.
    pub fn version(mut self, version: Version) -> Target {
        self.version = version;
        self
    }

    /// `rpc/<topic>`: the key of calls and casts to any server of the topic, and the queue
    /// group its servers join on it.
    pub fn topic_key(&self) -> Result<Key, RpcError> {
        make_key(&format!("{KEY_PREFIX}/{}", segment("topic", &self.topic)?))
    }

    /// `rpc/<topic>/server/<server>`: the key of calls and casts to one server.
    pub fn server_key(&self) -> Result<Key, RpcError> {
        let server = self
            .server
            .as_deref()
            .ok_or_else(|| RpcError::InvalidTarget("no server name".into()))?;
        make_key(&format!(
            "{KEY_PREFIX}/{}/server/{}",
            segment("topic", &self.topic)?,
            segment("server", server)?
        ))
    }

    /// `rpc/<topic>/fanout`: the key of fan-out casts to every server of the topic.
    pub fn fanout_key(&self) -> Result<Key, RpcError> {
        make_key(&format!(
            "{KEY_PREFIX}/{}/fanout",
            segment("topic", &self.topic)?
        ))
    }

    /// Where a call or cast goes: the server key when a server is named, else the topic key.
    pub(super) fn direct_key(&self) -> Result<Key, RpcError> {
        if self.server.is_some() {
            self.server_key()
        } else {
            self.topic_key()
        }
    }

    pub(super) fn request(
        &self,
        key: Key,
        method: &str,
        payload: Bytes,
    ) -> Result<Message, RpcError> {
        if method.is_empty() {
            return Err(RpcError::InvalidTarget("empty method name".into()));
        }
        let mut headers = vec![
            (
                HEADER_METHOD.to_string(),
                Bytes::copy_from_slice(method.as_bytes()),
            ),
            (
                HEADER_VERSION.to_string(),
                Bytes::from(self.version.to_string()),
            ),
        ];
        if let Some(ns) = &self.namespace {
            headers.push((
                HEADER_NAMESPACE.to_string(),
                Bytes::copy_from_slice(ns.as_bytes()),
            ));
        }
        let mut m = Message::new(key, payload);
        m.headers = Some(headers);
        Ok(m)
    }
}

fn segment<'a>(what: &str, s: &'a str) -> Result<&'a str, RpcError> {
    if s.is_empty() || s.contains('/') || s == "*" || s == "**" {
        return Err(RpcError::InvalidTarget(format!(
            "the {what} {s:?} is not one key segment (non-empty, no `/`, not `*` or `**`)"
        )));
    }
    Ok(s)
}

fn make_key(s: &str) -> Result<Key, RpcError> {
    Key::new(s).map_err(|e| RpcError::InvalidTarget(format!("{s:?}: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keys_follow_the_convention_and_reject_bad_segments() {
        let t = Target::new("calc").server("c1");
        assert_eq!(t.topic_key().unwrap().as_str(), "rpc/calc");
        assert_eq!(t.server_key().unwrap().as_str(), "rpc/calc/server/c1");
        assert_eq!(t.fanout_key().unwrap().as_str(), "rpc/calc/fanout");
        for bad in ["", "a/b", "*", "**", "/a"] {
            assert!(Target::new(bad).topic_key().is_err(), "topic {bad:?}");
            assert!(
                Target::new("t").server(bad).server_key().is_err(),
                "server {bad:?}"
            );
        }
        assert!(Target::new("t").server_key().is_err());
        assert_eq!(Target::new("t").namespace("").namespace, None);
    }
}
