//! [`RpcError`]: why an RPC failed.

use super::Version;
use crate::Error;

/// Why an RPC failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The handler returned an error (its message), or the server reported an error this
    /// client does not classify.
    #[error("remote error: {message}")]
    Remote {
        /// The error message from the server.
        message: String,
    },
    /// The server does not speak a compatible version.
    #[error("unsupported version {requested}; server speaks {server}")]
    UnsupportedVersion {
        /// The version the request asked for.
        requested: Version,
        /// The version the server speaks.
        server: Version,
    },
    /// The request's namespace is not the server's.
    #[error(
        "namespace mismatch: requested {}, server has {}",
        show_ns(.requested),
        show_ns(.server)
    )]
    NamespaceMismatch {
        /// The request's namespace.
        requested: Option<String>,
        /// The server's namespace.
        server: Option<String>,
    },
    /// The server could not read the request (no method, malformed version, ...).
    #[error("bad request: {message}")]
    BadRequest {
        /// The server's explanation.
        message: String,
    },
    /// No reply within the timeout (no server, or a server too slow).
    #[error("RPC timed out")]
    Timeout,
    /// The reply does not follow the RPC convention.
    #[error("malformed reply: {0}")]
    BadReply(String),
    /// The target or method cannot be expressed on the wire (e.g. a topic with `/`), or a
    /// server was started without a name.
    #[error("invalid target: {0}")]
    InvalidTarget(String),
    /// The connection failed.
    #[error(transparent)]
    Client(Error),
}

fn show_ns(ns: &Option<String>) -> String {
    match ns {
        Some(n) => format!("{n:?}"),
        None => "none".into(),
    }
}

impl From<Error> for RpcError {
    fn from(e: Error) -> Self {
        match e {
            Error::Timeout => RpcError::Timeout,
            e => RpcError::Client(e),
        }
    }
}
