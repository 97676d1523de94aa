//! [`ByteStr`]: a UTF-8 string held in [`Bytes`], so a decoded string can be a slice of the
//! read buffer and a string can be shared without copying.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

/// An immutable UTF-8 string in [`Bytes`]: cheap to clone (a reference count), and, in a
/// decoded PUBLISH, a zero-copy slice of the read buffer.
///
/// The type only guarantees UTF-8. MQTT's further rules for strings (no U+0000, at most
/// 65,535 bytes) are checked by the codec: [`decode`](crate::decode()) rejects such strings
/// and [`encode`](crate::encode()) refuses to write them.
///
/// ```
/// use hayate_mqtt::ByteStr;
/// let topic = ByteStr::from("sensors/1/temp");
/// assert_eq!(topic, "sensors/1/temp");
/// assert_eq!(topic.split('/').count(), 3); // derefs to &str
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteStr(Bytes);

impl ByteStr {
    /// The empty string.
    pub const fn new() -> ByteStr {
        ByteStr(Bytes::new())
    }

    /// A string pointing at static memory, without allocating.
    pub const fn from_static(s: &'static str) -> ByteStr {
        ByteStr(Bytes::from_static(s.as_bytes()))
    }

    /// Validates `bytes` as UTF-8 without copying them.
    pub fn from_utf8(bytes: Bytes) -> Result<ByteStr, std::str::Utf8Error> {
        std::str::from_utf8(&bytes)?;
        Ok(ByteStr(bytes))
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Validated as UTF-8 on construction (the workspace denies `unsafe`, so this checks
        // again; MQTT strings are short).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The string's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The string as shared bytes.
    pub fn as_shared(&self) -> &Bytes {
        &self.0
    }

    /// The string's bytes, without copying.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// A copy in its own allocation: keep this rather than a slice of a read buffer when the
    /// string outlives the packet, so it does not keep the whole buffer alive.
    pub fn detached(&self) -> ByteStr {
        ByteStr(Bytes::copy_from_slice(&self.0))
    }
}

impl Deref for ByteStr {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ByteStr {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<[u8]> for ByteStr {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for ByteStr {
    /// Copies the string.
    fn from(s: &str) -> ByteStr {
        ByteStr(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl From<String> for ByteStr {
    /// Takes over the string's allocation.
    fn from(s: String) -> ByteStr {
        ByteStr(Bytes::from(s.into_bytes()))
    }
}

impl From<ByteStr> for Bytes {
    fn from(s: ByteStr) -> Bytes {
        s.0
    }
}

impl TryFrom<Bytes> for ByteStr {
    type Error = std::str::Utf8Error;
    fn try_from(bytes: Bytes) -> Result<ByteStr, std::str::Utf8Error> {
        ByteStr::from_utf8(bytes)
    }
}

impl PartialEq<str> for ByteStr {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for ByteStr {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<ByteStr> for str {
    fn eq(&self, other: &ByteStr) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<ByteStr> for &str {
    fn eq(&self, other: &ByteStr) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl fmt::Display for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ByteStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
