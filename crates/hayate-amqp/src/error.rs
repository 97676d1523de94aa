//! Decoding errors and the AMQP reply codes a broker answers them with.

/// AMQP reply codes (spec section 1.2, "Constants"; RabbitMQ uses the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ReplyCode {
    /// 200: success (a normal close).
    Success = 200,
    /// 311 (soft): the content is too large.
    ContentTooLarge = 311,
    /// 312 (soft): a mandatory message could not be routed.
    NoRoute = 312,
    /// 313 (soft): an immediate message had no consumer.
    NoConsumers = 313,
    /// 320 (hard): the server closed the connection (an operator, a shutdown).
    ConnectionForced = 320,
    /// 402 (hard): the virtual host does not exist.
    InvalidPath = 402,
    /// 403 (soft): the user may not do this.
    AccessRefused = 403,
    /// 404 (soft): no such exchange or queue.
    NotFound = 404,
    /// 405 (soft): the queue is exclusive to another connection.
    ResourceLocked = 405,
    /// 406 (soft): a declaration differs from what exists, or a delivery tag is unknown.
    PreconditionFailed = 406,
    /// 501 (hard): a malformed frame.
    FrameError = 501,
    /// 502 (hard): a malformed method or field.
    SyntaxError = 502,
    /// 503 (hard): a method not allowed now.
    CommandInvalid = 503,
    /// 504 (hard): a channel that is not open, or out of range.
    ChannelError = 504,
    /// 505 (hard): a frame of the wrong type at this point.
    UnexpectedFrame = 505,
    /// 506 (hard): the server lacks the resources.
    ResourceError = 506,
    /// 530 (hard): not allowed (a reserved name, a feature off).
    NotAllowed = 530,
    /// 540 (hard): a method the server does not implement.
    NotImplemented = 540,
    /// 541 (hard): the server failed.
    InternalError = 541,
}

impl ReplyCode {
    /// The numeric code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The text RabbitMQ prefixes its reply text with (`NOT_FOUND - no queue 'q'`).
    pub fn name(self) -> &'static str {
        match self {
            ReplyCode::Success => "OK",
            ReplyCode::ContentTooLarge => "CONTENT_TOO_LARGE",
            ReplyCode::NoRoute => "NO_ROUTE",
            ReplyCode::NoConsumers => "NO_CONSUMERS",
            ReplyCode::ConnectionForced => "CONNECTION_FORCED",
            ReplyCode::InvalidPath => "INVALID_PATH",
            ReplyCode::AccessRefused => "ACCESS_REFUSED",
            ReplyCode::NotFound => "NOT_FOUND",
            ReplyCode::ResourceLocked => "RESOURCE_LOCKED",
            ReplyCode::PreconditionFailed => "PRECONDITION_FAILED",
            ReplyCode::FrameError => "FRAME_ERROR",
            ReplyCode::SyntaxError => "SYNTAX_ERROR",
            ReplyCode::CommandInvalid => "COMMAND_INVALID",
            ReplyCode::ChannelError => "CHANNEL_ERROR",
            ReplyCode::UnexpectedFrame => "UNEXPECTED_FRAME",
            ReplyCode::ResourceError => "RESOURCE_ERROR",
            ReplyCode::NotAllowed => "NOT_ALLOWED",
            ReplyCode::NotImplemented => "NOT_IMPLEMENTED",
            ReplyCode::InternalError => "INTERNAL_ERROR",
        }
    }

    /// A hard error closes the connection; a soft one only the channel.
    pub fn is_hard(self) -> bool {
        self.code() >= 320 && !matches!(self.code(), 403..=406)
    }
}

/// Why bytes are not valid AMQP 0-9-1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The connection did not start with `AMQP 0 0 9 1`; the header to answer with (the
    /// version this server speaks) follows.
    #[error("not an AMQP 0-9-1 protocol header")]
    BadProtocolHeader,
    /// A frame larger than the negotiated maximum.
    #[error("frame of {size} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Its announced size (payload and the 8 bytes around it).
        size: u64,
        /// The maximum.
        max: u32,
    },
    /// A frame not ended by 0xCE.
    #[error("frame end octet is 0x{0:02x}, not 0xce")]
    BadFrameEnd(u8),
    /// An unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// A method (class id, method id) this codec does not know.
    #[error("unknown method {class}.{method}")]
    UnknownMethod {
        /// Class id.
        class: u16,
        /// Method id.
        method: u16,
    },
    /// A field runs past the end of its frame.
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// Bytes left after the last field of a method or header.
    #[error("{0} bytes after the last field")]
    TrailingBytes(usize),
    /// An unknown field-table value type.
    #[error("unknown field value type {0:?}")]
    UnknownFieldType(char),
    /// Tables or arrays nested deeper than [`crate::MAX_TABLE_DEPTH`].
    #[error("field tables nested deeper than {}", crate::MAX_TABLE_DEPTH)]
    TooDeep,
    /// A content header for a class other than basic.
    #[error("content header for class {0}, not basic (60)")]
    BadContentClass(u16),
    /// A content header with a non-zero weight.
    #[error("content header weight {0}, not 0")]
    BadWeight(u16),
    /// Property flags with bits this version does not define.
    #[error("undefined content property flags 0x{0:04x}")]
    BadPropertyFlags(u16),
}

impl DecodeError {
    /// The reply code a broker closes the connection with for this error.
    pub fn reply_code(&self) -> ReplyCode {
        match self {
            DecodeError::BadProtocolHeader => ReplyCode::FrameError,
            DecodeError::FrameTooLarge { .. }
            | DecodeError::BadFrameEnd(_)
            | DecodeError::UnknownFrameType(_) => ReplyCode::FrameError,
            DecodeError::UnknownMethod { .. } => ReplyCode::NotImplemented,
            DecodeError::Truncated(_)
            | DecodeError::TrailingBytes(_)
            | DecodeError::UnknownFieldType(_)
            | DecodeError::TooDeep
            | DecodeError::BadPropertyFlags(_) => ReplyCode::SyntaxError,
            DecodeError::BadContentClass(_) | DecodeError::BadWeight(_) => ReplyCode::FrameError,
        }
    }
}
