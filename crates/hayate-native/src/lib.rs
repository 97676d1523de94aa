//! Hayate's native binary protocol, version 1 (specified byte by byte in `docs/protocol.md`).
//!
//! # Layout
//! - [`frame`]: the [`Frame`] enum and its parts; [`ErrorCode`], the stable error codes.
//! - [`codec`]: [`decode`] (check the header, then parse; `Ok(None)` means "read more") and
//!   [`encode`], plus allocation-free encoders for the hot path ([`encode_pub`],
//!   [`encode_msg_head`], [`encode_msg_batch_head`], ...).
//!
//! The codec is sans-IO: it works on [`bytes::BytesMut`] only and never touches a socket or a
//! clock. Payloads are decoded as zero-copy slices of the read buffer.

pub mod codec;
pub mod frame;
pub mod items;
pub mod read;

pub use codec::{
    DecodeError, HEADER_LEN, MAX_BATCH_ITEMS, check_options, decode, decode_frame, encode,
    encode_batch_item, encode_confirm, encode_msg, encode_msg_acked_head, encode_msg_batch_head,
    encode_msg_batch_item_head, encode_msg_head, encode_msg_ref, encode_ping, encode_pub,
    encode_pub_batch_head, encode_pub_head, encode_sub,
};
pub use frame::{
    ConfirmOutcome, ErrorCode, Frame, HELLO_SHM, Hello, HelloAuth, MAGIC, PROTOCOL_VERSION, Sub,
    Welcome, check_hello, refusal,
};
pub use items::Items;
pub use read::{LARGE_FRAME, ReadPlanner};
