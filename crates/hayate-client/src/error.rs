//! Client errors.

use hayate_core::KeyError;
use hayate_native::ErrorCode;

/// What can go wrong for a client.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting or an I/O operation failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// The server sent something this client does not understand.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server reported an error (and, for codes below 100, closed the connection).
    #[error("server error {code}: {message}", code = .code.code())]
    Server {
        /// Stable code.
        code: ErrorCode,
        /// Detail.
        message: String,
    },
    /// The connection is closed.
    #[error("connection closed")]
    Closed,
    /// No reply within the timeout.
    #[error("timed out")]
    Timeout,
    /// An invalid key or key expression.
    #[error("invalid key: {0}")]
    Key(#[from] KeyError),
    /// A message whose options do not fit the protocol (e.g. a header name over 64 KiB).
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// `reply` was called on a message without a reply-to key.
    #[error("the message has no reply-to key")]
    NoReplyTo,
    /// The payload is larger than the server accepts.
    #[error("payload of {size} bytes exceeds the server's maximum of {max}")]
    PayloadTooLarge {
        /// Payload size.
        size: usize,
        /// Server maximum.
        max: u64,
    },
    /// The broker's API refused the request (stream administration).
    #[error("refused: {0}")]
    Api(String),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
