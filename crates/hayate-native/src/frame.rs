//! Frames of the native protocol.

use bytes::Bytes;

use crate::items::Items;
use hayate_core::{Key, KeyExpr, Message, Qos};

/// `"HYT1"`: the first four bytes of every HELLO body.
pub const MAGIC: u32 = 0x4859_5431;
/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Frame type bytes.
pub(crate) mod ty {
    pub(crate) const HELLO: u8 = 0x01;
    pub(crate) const WELCOME: u8 = 0x02;
    pub(crate) const PUB: u8 = 0x03;
    pub(crate) const SUB: u8 = 0x04;
    pub(crate) const UNSUB: u8 = 0x05;
    pub(crate) const MSG: u8 = 0x06;
    pub(crate) const PUB_BATCH: u8 = 0x07;
    pub(crate) const MSG_BATCH: u8 = 0x08;
    pub(crate) const PING: u8 = 0x09;
    pub(crate) const PONG: u8 = 0x0A;
    pub(crate) const LOST: u8 = 0x0B;
    pub(crate) const ERR: u8 = 0x0C;
    pub(crate) const CLOSE: u8 = 0x0D;
    pub(crate) const MSG_ACKED: u8 = 0x0E;
    pub(crate) const ACK: u8 = 0x0F;
    pub(crate) const NACK: u8 = 0x10;
    pub(crate) const PUB_CONFIRM: u8 = 0x11;
    pub(crate) const CONFIRM: u8 = 0x12;
    pub(crate) const CONSUME: u8 = 0x13;
    pub(crate) const MSG_REF: u8 = 0x14;
}

/// Option flag bits of PUB and MSG.
pub(crate) mod flag {
    pub(crate) const REPLY_TO: u8 = 0x01;
    pub(crate) const CORRELATION: u8 = 0x02;
    pub(crate) const HEADERS: u8 = 0x04;
    pub(crate) const ALL: u8 = REPLY_TO | CORRELATION | HEADERS;
    /// MSG_ACKED only: the message was delivered before (given back or left unacknowledged).
    pub(crate) const REDELIVERED: u8 = 0x80;
    /// MSG_ACKED only: delivered by a stream consumer; the stream offset (u64) and the
    /// delivery count (u32) follow the flags.
    pub(crate) const STREAM: u8 = 0x40;
}

/// HELLO: the client's opening frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version the client speaks.
    pub version: u16,
    /// [`HELLO_SHM`] or 0; other bits reserved (0, ignored).
    pub flags: u16,
    /// The client's name, for logs and admin views.
    pub name: String,
    /// Credentials, in one of the forms of [`HelloAuth`] (empty: anonymous).
    pub auth: Bytes,
}

/// What HELLO's `auth` field holds (docs/protocol.md, *Session*).
#[derive(Clone, PartialEq, Eq)]
pub enum HelloAuth {
    /// Empty: no credentials.
    Anonymous,
    /// `0x01`, `user: str16`, `password: bytes16`.
    Password {
        /// The user name.
        user: String,
        /// The password.
        password: Bytes,
    },
    /// `0x02`, then the token: the rest of the field.
    Token(Bytes),
}

impl std::fmt::Debug for HelloAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print secrets.
        match self {
            HelloAuth::Anonymous => f.write_str("Anonymous"),
            HelloAuth::Password { user, .. } => write!(f, "Password {{ user: {user:?}, .. }}"),
            HelloAuth::Token(_) => f.write_str("Token(..)"),
        }
    }
}

impl HelloAuth {
    /// The field's bytes.
    pub fn encode(&self) -> Bytes {
        match self {
            HelloAuth::Anonymous => Bytes::new(),
            HelloAuth::Password { user, password } => {
                let mut b = Vec::with_capacity(5 + user.len() + password.len());
                b.push(1);
                b.extend_from_slice(&(user.len().min(u16::MAX as usize) as u16).to_be_bytes());
                b.extend_from_slice(&user.as_bytes()[..user.len().min(u16::MAX as usize)]);
                let n = password.len().min(u16::MAX as usize);
                b.extend_from_slice(&(n as u16).to_be_bytes());
                b.extend_from_slice(&password[..n]);
                b.into()
            }
            HelloAuth::Token(t) => {
                let mut b = Vec::with_capacity(1 + t.len());
                b.push(2);
                b.extend_from_slice(t);
                b.into()
            }
        }
    }

    /// Parses the field; `None` when it is none of the forms (ERR 8).
    pub fn decode(b: &Bytes) -> Option<HelloAuth> {
        let Some((&kind, rest)) = b.split_first() else {
            return Some(HelloAuth::Anonymous);
        };
        match kind {
            1 => {
                let ulen = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
                let user = std::str::from_utf8(rest.get(2..2 + ulen)?).ok()?.to_owned();
                let rest = &rest[2 + ulen..];
                let plen = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
                if rest.len() != 2 + plen {
                    return None;
                }
                let at = 1 + 2 + ulen + 2;
                Some(HelloAuth::Password {
                    user,
                    password: b.slice(at..at + plen),
                })
            }
            2 => Some(HelloAuth::Token(b.slice(1..))),
            _ => None,
        }
    }
}

/// HELLO's `flags` bit asking for shared memory (a client on the broker's host): WELCOME
/// then carries its `shm` field.
pub const HELLO_SHM: u16 = 0x0001;

/// WELCOME: the server's answer to HELLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    /// Protocol version the server will speak.
    pub version: u16,
    /// The session id the server assigned.
    pub session: u64,
    /// Largest payload the server accepts.
    pub max_payload: u64,
    /// The server's name and version.
    pub server: String,
    /// This session's reply-inbox prefix, `_inbox/<session>`.
    pub inbox: String,
    /// Present only when HELLO set [`HELLO_SHM`]: `<socket> <ticket>` where the client may
    /// set up shared memory, or empty (not offered).
    pub shm: Option<String>,
}

/// SUB: a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sub {
    /// Client-chosen subscription id.
    pub sid: u32,
    /// Quality of service.
    pub qos: Qos,
    /// Queue group, or `None` for fan-out.
    pub group: Option<String>,
    /// What to select.
    pub expr: KeyExpr,
}

/// A frame of the native protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client opening frame.
    Hello(Hello),
    /// Server answer to HELLO.
    Welcome(Welcome),
    /// Publish one message.
    Pub(Message),
    /// Subscribe.
    Sub(Sub),
    /// Unsubscribe.
    Unsub {
        /// Subscription id.
        sid: u32,
    },
    /// Deliver one message to a subscription.
    Msg {
        /// Subscription id.
        sid: u32,
        /// The message.
        msg: Message,
    },
    /// Publish many plain messages on one key.
    PubBatch {
        /// Key of every message.
        key: Key,
        /// Payloads, at least one.
        payloads: Vec<Bytes>,
    },
    /// Deliver many plain messages on one key to a subscription.
    MsgBatch {
        /// Subscription id.
        sid: u32,
        /// Key of every message.
        key: Key,
        /// Payloads, at least one, as they came ([`Items`]: sliced out when taken).
        payloads: Items,
    },
    /// Ping with a token.
    Ping(u64),
    /// Answer to a ping.
    Pong(u64),
    /// Messages dropped for a subscription since the last report.
    Lost {
        /// Subscription id.
        sid: u32,
        /// How many were dropped.
        count: u64,
    },
    /// An error; codes below 100 are followed by a close.
    Err {
        /// Stable error code.
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
    },
    /// Graceful close.
    Close,
    /// Deliver one message to an acknowledged subscription: the receiver answers ACK or
    /// NACK with `delivery`.
    MsgAcked {
        /// Subscription id.
        sid: u32,
        /// Delivery id (per session, increasing, never reused).
        delivery: u64,
        /// The message (`attrs.redelivered` set when it was delivered before).
        msg: Message,
    },
    /// Acknowledge a delivery, or every delivery up to it.
    Ack {
        /// Delivery id.
        delivery: u64,
        /// Every delivery of the session with an id up to and including `delivery`.
        cumulative: bool,
    },
    /// Give a delivery back for redelivery.
    Nack {
        /// Delivery id.
        delivery: u64,
        /// For a stream consumer's delivery: deliver it again no sooner than this many ms
        /// from now (0: at once). Sent only when above 0.
        delay_ms: u32,
    },
    /// Publish one message and ask for a CONFIRM once the streams capturing its key keep it
    /// durably (under their fsync policy).
    PubConfirm {
        /// Client-chosen id, echoed in the CONFIRM.
        id: u64,
        /// The message.
        msg: Message,
    },
    /// Join a stream's durable consumer as a member (or, with an empty `stream`, consume
    /// the broker's queue `consumer`): its messages arrive as MSG_ACKED on subscription
    /// `sid`, shared with the consumer's (the queue's) other members.
    Consume {
        /// Client-chosen subscription id (as for SUB).
        sid: u32,
        /// The stream (empty: a queue).
        stream: String,
        /// The consumer (created beforehand through the stream API), or the queue.
        consumer: String,
        /// A queue's most unacknowledged deliveries to this member (0: absent on the wire,
        /// `limits.max_unacked`); ignored for a stream's consumer.
        prefetch: u32,
    },
    /// The answer to PUB_CONFIRM.
    Confirm {
        /// The PUB_CONFIRM's id.
        id: u64,
        /// What became of the message.
        outcome: ConfirmOutcome,
    },
    /// Deliver one message to a subscription by reference to the broker's fan-out arena
    /// (shared memory; sent only to a client that took the arena at its shared-memory
    /// set-up): the entry at byte `at`, of `len` bytes, tagged `tag`, holds a whole MSG
    /// frame whose `sid` is 0. The client reads it, delivers it to `sid`, and counts it
    /// released (docs/protocol.md, *Fan-out*).
    MsgRef {
        /// Subscription id.
        sid: u32,
        /// Byte offset of the entry in the arena (a multiple of 8).
        at: u64,
        /// Bytes of the entry (the MSG frame).
        len: u32,
        /// The entry's tag (never 0).
        tag: u64,
    },
}

/// What a CONFIRM says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// Kept durably: by `stream` (the first capturing stream by name) at `offset`.
    Stored {
        /// The stream's name.
        stream: String,
        /// The message's offset in it.
        offset: u64,
    },
    /// No stream captures the key: the message was delivered live only.
    NotCaptured,
    /// A capturing stream failed to keep it (the message was still delivered live).
    Failed(String),
}

/// Stable error codes of ERR frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Unknown frame type.
    UnknownFrame,
    /// A frame's body does not match its type.
    Malformed,
    /// Frame length above the receiver's maximum.
    FrameTooLarge,
    /// Frame not allowed in this state.
    Protocol,
    /// Duplicate subscription id.
    BadSubscription,
    /// Invalid key or key expression.
    BadKey,
    /// Unsupported protocol version or magic.
    UnsupportedVersion,
    /// Refused credentials, or an operation the user's permissions do not allow.
    NotAuthorized,
    /// No input from the peer through `max_pings_out` PINGs: the connection is presumed dead.
    Stale,
    /// CONSUME named a stream or consumer that does not exist, or a subscription id in use.
    BadConsumer,
    /// The broker's memory budget is spent: a frame larger than the connection's free input
    /// allowance could not be read within `limits.max_block_ms`.
    ServerBusy,
    /// A code this version does not know.
    Other(u16),
}

impl ErrorCode {
    /// The numeric code on the wire.
    pub fn code(self) -> u16 {
        match self {
            ErrorCode::UnknownFrame => 1,
            ErrorCode::Malformed => 2,
            ErrorCode::FrameTooLarge => 3,
            ErrorCode::Protocol => 4,
            ErrorCode::BadSubscription => 5,
            ErrorCode::BadKey => 6,
            ErrorCode::UnsupportedVersion => 7,
            ErrorCode::NotAuthorized => 8,
            ErrorCode::Stale => 9,
            ErrorCode::BadConsumer => 10,
            ErrorCode::ServerBusy => 11,
            ErrorCode::Other(c) => c,
        }
    }

    /// The code for a number read from the wire.
    pub fn from_code(c: u16) -> ErrorCode {
        match c {
            1 => ErrorCode::UnknownFrame,
            2 => ErrorCode::Malformed,
            3 => ErrorCode::FrameTooLarge,
            4 => ErrorCode::Protocol,
            5 => ErrorCode::BadSubscription,
            6 => ErrorCode::BadKey,
            7 => ErrorCode::UnsupportedVersion,
            8 => ErrorCode::NotAuthorized,
            9 => ErrorCode::Stale,
            10 => ErrorCode::BadConsumer,
            11 => ErrorCode::ServerBusy,
            c => ErrorCode::Other(c),
        }
    }

    /// True if the sender closes the connection after this error.
    pub fn is_fatal(self) -> bool {
        self.code() < 100
    }
}

/// What a listener answers (an ERR, then it closes) to a frame it does not take after
/// WELCOME: a second HELLO, a frame only a server sends (WELCOME, MSG, MSG_BATCH, MSG_REF,
/// MSG_ACKED, CONFIRM, LOST), or one the listener has no use for (a peer node's CONSUME).
pub fn refusal(frame: &Frame) -> (ErrorCode, &'static str) {
    match frame {
        Frame::Hello(_) => (ErrorCode::Protocol, "HELLO was already received"),
        _ => (ErrorCode::Protocol, "a client may not send this frame"),
    }
}

/// The HELLO a listener's first frame must be, checked: `Err` with the ERR code and message
/// to send (`who` names the listener in the message: "server", "node", ...).
pub fn check_hello(frame: Frame, who: &str) -> Result<Hello, (ErrorCode, String)> {
    let Frame::Hello(h) = frame else {
        return Err((ErrorCode::Protocol, "the first frame must be HELLO".into()));
    };
    if h.version != PROTOCOL_VERSION {
        return Err((
            ErrorCode::UnsupportedVersion,
            format!(
                "protocol version {} is not supported (this {who} speaks {PROTOCOL_VERSION})",
                h.version
            ),
        ));
    }
    Ok(h)
}
