//! STOMP protocol versions, commands, frames and decoded items.

use std::fmt;

use bytes::Bytes;

/// A STOMP protocol version. Versions are ordered, so negotiation is "the highest common one".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Version {
    /// STOMP 1.0: LF line ends, no header escaping, no heart-beats in the spec.
    V1_0,
    /// STOMP 1.1: header escaping (`\n`, `\c`, `\\`), heart-beats, NACK.
    V1_1,
    /// STOMP 1.2: `\r\n` line ends and the `\r` escape, first repeated header wins.
    V1_2,
}

impl Version {
    /// Every version, oldest first.
    pub const ALL: [Version; 3] = [Version::V1_0, Version::V1_1, Version::V1_2];

    /// The version as it appears in `accept-version` and `version` headers, e.g. `"1.2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1_0 => "1.0",
            Version::V1_1 => "1.1",
            Version::V1_2 => "1.2",
        }
    }

    /// Parses one version string (`"1.0"`, `"1.1"` or `"1.2"`, surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<Version> {
        match s.trim_matches([' ', '\t']) {
            "1.0" => Some(Version::V1_0),
            "1.1" => Some(Version::V1_1),
            "1.2" => Some(Version::V1_2),
            _ => None,
        }
    }

    /// Negotiates from a CONNECT frame's `accept-version` header (a comma-separated list):
    /// the highest version both the peer and this codec support, or `None` if there is none.
    /// Unknown entries are ignored.
    ///
    /// A CONNECT without an `accept-version` header speaks 1.0; that case is the caller's.
    ///
    /// ```
    /// use hayate_stomp::Version;
    /// assert_eq!(Version::parse_accept("1.0,1.1,1.2"), Some(Version::V1_2));
    /// assert_eq!(Version::parse_accept("1.1, 2.0"), Some(Version::V1_1));
    /// assert_eq!(Version::parse_accept("2.0"), None);
    /// ```
    pub fn parse_accept(s: &str) -> Option<Version> {
        s.split(',').filter_map(Version::parse).max()
    }

    /// Whether header names and values are escaped in this version (1.1 and later).
    pub fn escapes(self) -> bool {
        self >= Version::V1_1
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A STOMP command: the first line of a frame.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Command {
    /// Client: open a session (all versions).
    Connect,
    /// Client: open a session (1.1+; same as CONNECT, but not mistakable for HTTP's CONNECT).
    Stomp,
    /// Server: the session is open.
    Connected,
    /// Client: publish to a destination.
    Send,
    /// Client: subscribe to a destination.
    Subscribe,
    /// Client: cancel a subscription.
    Unsubscribe,
    /// Client: acknowledge a message.
    Ack,
    /// Client: reject a message (1.1+).
    Nack,
    /// Client: start a transaction.
    Begin,
    /// Client: commit a transaction.
    Commit,
    /// Client: roll back a transaction.
    Abort,
    /// Client: close the session.
    Disconnect,
    /// Server: a message for a subscription.
    Message,
    /// Server: a frame with a `receipt` header was processed.
    Receipt,
    /// Server: something went wrong; the server closes the connection after it.
    Error,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 15] = [
        Command::Connect,
        Command::Stomp,
        Command::Connected,
        Command::Send,
        Command::Subscribe,
        Command::Unsubscribe,
        Command::Ack,
        Command::Nack,
        Command::Begin,
        Command::Commit,
        Command::Abort,
        Command::Disconnect,
        Command::Message,
        Command::Receipt,
        Command::Error,
    ];

    /// The command as it appears on the wire, e.g. `"SEND"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Connect => "CONNECT",
            Command::Stomp => "STOMP",
            Command::Connected => "CONNECTED",
            Command::Send => "SEND",
            Command::Subscribe => "SUBSCRIBE",
            Command::Unsubscribe => "UNSUBSCRIBE",
            Command::Ack => "ACK",
            Command::Nack => "NACK",
            Command::Begin => "BEGIN",
            Command::Commit => "COMMIT",
            Command::Abort => "ABORT",
            Command::Disconnect => "DISCONNECT",
            Command::Message => "MESSAGE",
            Command::Receipt => "RECEIPT",
            Command::Error => "ERROR",
        }
    }

    /// Parses a command line (without its line end). Commands are case-sensitive.
    pub fn from_bytes(b: &[u8]) -> Option<Command> {
        Some(match b {
            b"SEND" => Command::Send,
            b"MESSAGE" => Command::Message,
            b"ACK" => Command::Ack,
            b"NACK" => Command::Nack,
            b"SUBSCRIBE" => Command::Subscribe,
            b"UNSUBSCRIBE" => Command::Unsubscribe,
            b"RECEIPT" => Command::Receipt,
            b"CONNECT" => Command::Connect,
            b"STOMP" => Command::Stomp,
            b"CONNECTED" => Command::Connected,
            b"BEGIN" => Command::Begin,
            b"COMMIT" => Command::Commit,
            b"ABORT" => Command::Abort,
            b"DISCONNECT" => Command::Disconnect,
            b"ERROR" => Command::Error,
            _ => return None,
        })
    }

    /// Whether header names and values of this command are escaped in `version`.
    ///
    /// Never in 1.0, and never in CONNECT and CONNECTED frames (they are exchanged before the
    /// version is agreed, so STOMP 1.2 exempts them).
    pub fn escapes_headers(self, version: Version) -> bool {
        version.escapes() && !matches!(self, Command::Connect | Command::Connected)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One STOMP frame: a command, ordered headers (repeats allowed) and a body.
///
/// Header names and values are held *unescaped*; the codec escapes them on the wire.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    /// The command.
    pub command: Command,
    /// Headers in wire order. Repeated names are kept; [`Frame::get`] returns the first.
    pub headers: Vec<(String, String)>,
    /// The body (empty for most commands). Decoded bodies are slices of the read buffer.
    pub body: Bytes,
}

impl Frame {
    /// A frame with no headers and an empty body.
    pub fn new(command: Command) -> Frame {
        Frame {
            command,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// Appends a header (builder style). Does not replace an earlier header of that name.
    pub fn header(mut self, name: &str, value: &str) -> Frame {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body (builder style).
    pub fn body(mut self, body: impl Into<Bytes>) -> Frame {
        self.body = body.into();
        self
    }

    /// The value of the first header called `name` (STOMP 1.2: the first repeat wins).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What [`decode`](fn@crate::decode) found at the front of the buffer.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Item {
    /// A complete frame.
    Frame(Frame),
    /// A bare end-of-line (`"\n"` or `"\r\n"`) between frames: a heart-beat, or the optional
    /// EOLs a peer may send after a frame's NUL.
    HeartBeat,
}
