//! AMQP 0-9-1, sans IO: the protocol header, frames, every method of the classes a broker
//! serves (connection, channel, exchange, queue, basic, confirm, tx), the basic class's
//! content header and its properties, and field tables with every value type RabbitMQ and
//! its clients use.
//!
//! Decoding never trusts a length: every one is checked against what is left of the frame
//! (itself bounded by the negotiated frame size) before anything is allocated, and tables
//! nest at most [`MAX_TABLE_DEPTH`] deep. Errors carry the AMQP reply code a broker answers
//! with ([`ReplyCode`]).
//!
//! # Layout
//! - [`frame`]: the protocol header, frames (method, header, body, heartbeat) and their
//!   decoder;
//! - [`types`]: short and long strings, field values and tables, the reader and writer of
//!   primitive types;
//! - [`method`]: [`Method`], every class's methods, encoded and decoded;
//! - [`content`]: the content header and [`BasicProperties`];
//! - [`error`]: [`DecodeError`] and [`ReplyCode`].

pub mod content;
pub mod error;
pub mod frame;
pub mod method;
pub mod types;

pub use content::{BasicProperties, ContentHeader};
pub use error::{DecodeError, ReplyCode};
pub use frame::{Frame, FrameDecoder, FrameType, PROTOCOL_HEADER, ProtocolHeader};
pub use method::Method;
pub use types::{FieldTable, FieldValue, ShortStr};

/// Deepest nesting of tables and arrays a decoder accepts.
pub const MAX_TABLE_DEPTH: usize = 16;

/// The smallest frame size a peer may ask for (the spec's `frame-min-size`).
pub const FRAME_MIN_SIZE: u32 = 4096;
