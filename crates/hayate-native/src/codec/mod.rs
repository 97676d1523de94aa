//! Encoding and decoding of native frames.
//!
//! # Layout
//! - this module: the sizes both directions share ([`HEADER_LEN`], [`MAX_BATCH_ITEMS`]);
//! - `decoding`: [`decode`] and [`DecodeError`];
//! - `encoding`: [`encode`], the hot path's encoders ([`encode_pub`], [`encode_msg_head`],
//!   [`encode_msg_batch_head`], ...) and [`check_options`].

mod decoding;
mod encoding;

pub use decoding::{DecodeError, decode, decode_frame};
pub use encoding::{
    check_options, encode, encode_batch_item, encode_confirm, encode_msg, encode_msg_acked_head,
    encode_msg_batch_head, encode_msg_batch_item_head, encode_msg_head, encode_msg_ref,
    encode_ping, encode_pub, encode_pub_batch_head, encode_pub_head, encode_sub,
};

/// Bytes before the body: `length: u32` and `type: u8`.
pub const HEADER_LEN: usize = 5;

/// The most payloads one PUB_BATCH or MSG_BATCH may carry. Each item costs 4 bytes on the
/// wire but a whole `Bytes` (and a routing step) once decoded, so without a cap a frame of
/// empty items would multiply its size in memory many times over. 65,536 items of 4 bytes
/// make 256 KiB, the client library's batch size.
pub const MAX_BATCH_ITEMS: usize = 65_536;
