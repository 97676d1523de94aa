//! RPC over the bus, in the style of oslo.messaging.
//!
//! Servers listen on a *topic*; each has a *server name* and speaks one *version*
//! (`MAJOR.MINOR`) of the topic's interface, optionally within a *namespace*. Clients address
//! a [`Target`] and:
//! - [`Client::call`]: send a request to one server and wait for its reply (round-robin among
//!   the topic's servers, or the one named in the target);
//! - [`Client::cast`]: the same without a reply;
//! - [`Client::fanout`]: send to every server of the topic, without a reply.
//!
//! [`Client::serve`] runs a server: an async handler `(method, payload) -> Result<Bytes, E>`
//! called for every accepted request, until the returned [`RpcServer`] is closed or dropped.
//!
//! A request carries the version it needs; a server whose major version is the same and
//! whose minor version is at least the requested one handles it, any other server answers a
//! call with an "unsupported version" error ([`RpcError::UnsupportedVersion`]). A namespace
//! mismatch is answered the same way ([`RpcError::NamespaceMismatch`]). Errors returned by
//! the handler travel back as [`RpcError::Remote`]. What an unknown method does is up to the
//! handler (returning an error is the usual answer).
//!
//! ```no_run
//! # async fn demo() -> Result<(), hayate_client::rpc::RpcError> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use hayate_client::Client;
//! use hayate_client::rpc::{Target, Version};
//!
//! let client = Client::connect("127.0.0.1:4700").await?;
//! let spec = Target::new("calc").server("calc-1").version(Version::new(1, 2));
//! let server = client
//!     .serve(&spec, |method: String, payload: Bytes| async move {
//!         match method.as_str() {
//!             "echo" => Ok(payload),
//!             other => Err(format!("unknown method {other}")),
//!         }
//!     })
//!     .await?;
//! let reply = client
//!     .call(&Target::new("calc"), "echo", "hi", Duration::from_secs(1))
//!     .await?;
//! assert_eq!(&reply[..], b"hi");
//! server.close().await;
//! # Ok(()) }
//! ```
//!
//! The wire convention (keys, queue groups, headers, replies) is specified in `docs/rpc.md`
//! so that clients and servers in any language interoperate.
//!
//! # Layout
//! - this module: the wire names (the key prefix, the headers);
//! - `version`: [`Version`];
//! - `target`: [`Target`], and the keys and requests it makes;
//! - `error`: [`RpcError`];
//! - `call`: the calling side ([`Client::call`], [`Client::cast`], [`Client::fanout`]) and
//!   the reading of replies;
//! - `serve`: the serving side ([`Client::serve`], [`Client::serve_with`], [`serve_peer`],
//!   [`RpcServer`]);
//! - `answer`: what a server answers: the checks of a request (method, version, namespace)
//!   and the handler's result turned into a reply.

use bytes::Bytes;
use hayate_core::Message;

#[cfg(doc)]
use crate::Client;

mod answer;
mod call;
mod error;
mod serve;
mod target;
mod version;

pub use error::RpcError;
pub use serve::{RpcServer, ServeOptions, serve_peer};
pub use target::Target;
pub use version::{Version, VersionError};

/// First segment of every RPC key.
pub const KEY_PREFIX: &str = "rpc";
/// Request header: the method name (UTF-8, required).
pub const HEADER_METHOD: &str = "rpc-method";
/// Request header: the requested version, `MAJOR.MINOR` (absent = `1.0`). In an
/// `unsupported-version` error reply: the version the server speaks.
pub const HEADER_VERSION: &str = "rpc-version";
/// Request header: the namespace (absent or empty = none). In a `namespace-mismatch` error
/// reply: the server's namespace (absent = none).
pub const HEADER_NAMESPACE: &str = "rpc-namespace";
/// Reply header: `ok` or `error`.
pub const HEADER_STATUS: &str = "rpc-status";
/// Error reply header: what went wrong (`remote`, `unsupported-version`,
/// `namespace-mismatch`, `bad-request`).
pub const HEADER_ERROR: &str = "rpc-error";

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a Bytes> {
    m.headers
        .as_ref()?
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

fn header_str<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    header(m, name).and_then(|v| std::str::from_utf8(v).ok())
}
