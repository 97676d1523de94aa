//! A sans-IO codec for STOMP 1.0, 1.1 and 1.2 frames, shared by Hayate's STOMP front-end and
//! the benchmark's STOMP client. It works on [`bytes::BytesMut`] only and never touches a
//! socket or a clock.
//!
//! # Layout
//! - [`frame`]: [`Version`] (with `accept-version` negotiation), [`Command`], [`Frame`] and
//!   [`Item`] (a frame or a heart-beat).
//! - [`decode`](mod@decode): [`decode()`] (check, then parse; `Ok(None)` means "read more"),
//!   [`Limits`] and [`DecodeError`].
//! - [`encode`](mod@encode): [`encode()`] for any frame, and the allocation-free hot-path
//!   encoders [`encode_send`], [`encode_message`] and [`encode_message_head`].
//! - [`escape`](mod@escape): header [`escape()`] and [`unescape`].
//!
//! # The frame format
//!
//! ```text
//! COMMAND EOL
//! name:value EOL        (zero or more header lines)
//! EOL                   (a blank line ends the headers)
//! body NUL              (then optionally more EOLs)
//! ```
//!
//! - **Line ends.** An EOL is LF or CR LF. STOMP 1.2 introduced CR LF; the decoder accepts it
//!   in every version (what real 1.0/1.1 peers send anyway), the encoder writes LF.
//! - **Heart-beats.** A bare EOL between frames is a heart-beat; [`decode()`] returns it as
//!   [`Item::HeartBeat`]. EOLs a peer sends after a frame's NUL come back the same way.
//! - **Headers.** A header line is split at its first `:`; the value may contain further
//!   `:`s. Nothing is trimmed. Repeated headers are kept in order and [`Frame::get`] returns
//!   the first (the STOMP 1.2 rule). Names and values must be UTF-8.
//! - **Body.** With a `content-length` header (the first one counts) the body is exactly that
//!   many bytes, NULs included, and must be followed by a NUL. Without one, the body runs to
//!   the first NUL. [`encode()`] always adds `content-length` to a non-empty body.
//!
//! # Escaping
//!
//! In STOMP 1.1 and 1.2, header names and values are escaped: `\\` is a backslash, `\n` an
//! LF, `\c` a colon and (1.2) `\r` a CR. Any other sequence after a backslash, such as `\t`,
//! is an error ([`DecodeError::BadEscape`]). The `\r` escape is accepted in 1.1 as well, and
//! [`escape()`] writes it for CR in both versions, since a raw CR before an LF would read as
//! a line end.
//!
//! Two exceptions: STOMP 1.0 has no escaping at all, and CONNECT and CONNECTED frames are
//! never escaped (they are exchanged before the version is agreed). In those frames a
//! backslash is just a backslash, and the encoder writes CR and LF inside a header as spaces.
//!
//! # Limits
//!
//! [`Limits`] bounds the number of header lines, the bytes of the command and header section,
//! and the bytes of a body. [`decode()`] reports an excess as soon as the buffered bytes show
//! it: a header section that has not ended within `max_header_bytes`, a `content-length`
//! above `max_body`, no NUL within `max_body` bytes of body. So a peer cannot make the reader
//! buffer more than about `max_header_bytes + max_body` bytes for one frame.
//!
//! A body without `content-length` is searched for its NUL. [`decode()`] searches from the
//! body's start on every call, so a huge body of that kind arriving in many small reads costs
//! quadratic time (bounded by `max_body`); a connection should use [`decode_resuming`], which
//! keeps how far it searched ([`Scanned`]) and searches each byte once. Bodies with
//! `content-length` are not scanned at all.
//!
//! # Quick start
//!
//! ```
//! use bytes::BytesMut;
//! use hayate_stomp::{Command, Frame, Item, Limits, Version, decode, encode, encode_send};
//!
//! let mut wire = BytesMut::new();
//! encode(&Frame::new(Command::Connect).header("accept-version", "1.2").header("host", "/"),
//!        Version::V1_2, &mut wire);
//! encode_send("prices/eur", &[("x-id", "a:1")], b"42\0binary", Version::V1_2, &mut wire);
//! wire.extend_from_slice(b"\n"); // a heart-beat
//!
//! let limits = Limits::default();
//! let Some(Item::Frame(connect)) = decode(&mut wire, Version::V1_2, &limits).unwrap() else {
//!     panic!("expected CONNECT")
//! };
//! assert_eq!(Version::parse_accept(connect.get("accept-version").unwrap()), Some(Version::V1_2));
//!
//! let Some(Item::Frame(send)) = decode(&mut wire, Version::V1_2, &limits).unwrap() else {
//!     panic!("expected SEND")
//! };
//! assert_eq!(send.command, Command::Send);
//! assert_eq!(send.get("x-id"), Some("a:1"));
//! assert_eq!(&send.body[..], b"42\0binary");
//!
//! assert_eq!(decode(&mut wire, Version::V1_2, &limits).unwrap(), Some(Item::HeartBeat));
//! assert_eq!(decode(&mut wire, Version::V1_2, &limits).unwrap(), None); // read more
//! ```

#![warn(missing_docs)]

pub mod decode;
pub mod encode;
pub mod escape;
pub mod frame;

pub use decode::{DecodeError, Limits, Scanned, decode, decode_resuming};
pub use encode::{encode, encode_message, encode_message_head, encode_send};
pub use escape::{escape, unescape};
pub use frame::{Command, Frame, Item, Version};
