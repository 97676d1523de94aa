//! The content header (frame type 2) of the basic class, and its properties.
//!
//! `class-id (u16, 60) · weight (u16, 0) · body size (u64) · property flags (u16) ·
//! properties`: flag bit 15 is the first property, bit 0 says another flags word follows
//! (never, for basic: its 14 properties fit in one).

use bytes::BytesMut;

use crate::error::DecodeError;
use crate::method::BASIC;
use crate::types::{FieldTable, Reader, ShortStr, Writer};

/// The basic class's properties (all optional).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BasicProperties {
    /// MIME content type.
    pub content_type: Option<ShortStr>,
    /// MIME content encoding.
    pub content_encoding: Option<ShortStr>,
    /// Application headers.
    pub headers: Option<FieldTable>,
    /// 1: transient, 2: persistent.
    pub delivery_mode: Option<u8>,
    /// 0 to 9.
    pub priority: Option<u8>,
    /// Correlates a reply with its request.
    pub correlation_id: Option<ShortStr>,
    /// Where to reply.
    pub reply_to: Option<ShortStr>,
    /// Time to live, in milliseconds, as text.
    pub expiration: Option<ShortStr>,
    /// Application message id.
    pub message_id: Option<ShortStr>,
    /// Seconds since the Unix epoch.
    pub timestamp: Option<u64>,
    /// Application message type.
    pub kind: Option<ShortStr>,
    /// The publishing user (checked by RabbitMQ against the connection's).
    pub user_id: Option<ShortStr>,
    /// The publishing application.
    pub app_id: Option<ShortStr>,
    /// Deprecated; carried.
    pub cluster_id: Option<ShortStr>,
}

/// A content header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContentHeader {
    /// The size of the body that follows, in bytes (over any number of body frames).
    pub body_size: u64,
    /// Its properties.
    pub properties: BasicProperties,
}

const CONTENT_TYPE: u16 = 1 << 15;
const CONTENT_ENCODING: u16 = 1 << 14;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const PRIORITY: u16 = 1 << 11;
const CORRELATION_ID: u16 = 1 << 10;
const REPLY_TO: u16 = 1 << 9;
const EXPIRATION: u16 = 1 << 8;
const MESSAGE_ID: u16 = 1 << 7;
const TIMESTAMP: u16 = 1 << 6;
const TYPE: u16 = 1 << 5;
const USER_ID: u16 = 1 << 4;
const APP_ID: u16 = 1 << 3;
const CLUSTER_ID: u16 = 1 << 2;
/// Bits 1 and 0 (bit 0: another flags word): none is defined for basic.
const UNDEFINED: u16 = 0b11;

impl ContentHeader {
    /// Reads a content header.
    pub fn read(r: &mut Reader<'_>) -> Result<ContentHeader, DecodeError> {
        let class = r.u16()?;
        if class != BASIC {
            return Err(DecodeError::BadContentClass(class));
        }
        let weight = r.u16()?;
        if weight != 0 {
            return Err(DecodeError::BadWeight(weight));
        }
        let body_size = r.u64()?;
        let flags = r.u16()?;
        if flags & UNDEFINED != 0 {
            return Err(DecodeError::BadPropertyFlags(flags));
        }
        let s = |r: &mut Reader<'_>, bit: u16| -> Result<Option<ShortStr>, DecodeError> {
            (flags & bit != 0).then(|| r.shortstr()).transpose()
        };
        let p = BasicProperties {
            content_type: s(r, CONTENT_TYPE)?,
            content_encoding: s(r, CONTENT_ENCODING)?,
            headers: (flags & HEADERS != 0).then(|| r.table()).transpose()?,
            delivery_mode: (flags & DELIVERY_MODE != 0).then(|| r.u8()).transpose()?,
            priority: (flags & PRIORITY != 0).then(|| r.u8()).transpose()?,
            correlation_id: s(r, CORRELATION_ID)?,
            reply_to: s(r, REPLY_TO)?,
            expiration: s(r, EXPIRATION)?,
            message_id: s(r, MESSAGE_ID)?,
            timestamp: (flags & TIMESTAMP != 0).then(|| r.u64()).transpose()?,
            kind: s(r, TYPE)?,
            user_id: s(r, USER_ID)?,
            app_id: s(r, APP_ID)?,
            cluster_id: s(r, CLUSTER_ID)?,
        };
        Ok(ContentHeader {
            body_size,
            properties: p,
        })
    }

    /// Appends the header's payload (without the frame around it).
    pub fn encode(&self, out: &mut BytesMut) {
        let p = &self.properties;
        let mut flags = 0u16;
        let mut flag = |present: bool, bit: u16| {
            if present {
                flags |= bit;
            }
        };
        flag(p.content_type.is_some(), CONTENT_TYPE);
        flag(p.content_encoding.is_some(), CONTENT_ENCODING);
        flag(p.headers.is_some(), HEADERS);
        flag(p.delivery_mode.is_some(), DELIVERY_MODE);
        flag(p.priority.is_some(), PRIORITY);
        flag(p.correlation_id.is_some(), CORRELATION_ID);
        flag(p.reply_to.is_some(), REPLY_TO);
        flag(p.expiration.is_some(), EXPIRATION);
        flag(p.message_id.is_some(), MESSAGE_ID);
        flag(p.timestamp.is_some(), TIMESTAMP);
        flag(p.kind.is_some(), TYPE);
        flag(p.user_id.is_some(), USER_ID);
        flag(p.app_id.is_some(), APP_ID);
        flag(p.cluster_id.is_some(), CLUSTER_ID);
        let mut w = Writer::new(out);
        w.u16(BASIC);
        w.u16(0);
        w.u64(self.body_size);
        w.u16(flags);
        let s = |w: &mut Writer<'_>, v: &Option<ShortStr>| {
            if let Some(v) = v {
                w.shortstr(v);
            }
        };
        s(&mut w, &p.content_type);
        s(&mut w, &p.content_encoding);
        if let Some(h) = &p.headers {
            w.table(h);
        }
        if let Some(v) = p.delivery_mode {
            w.u8(v);
        }
        if let Some(v) = p.priority {
            w.u8(v);
        }
        s(&mut w, &p.correlation_id);
        s(&mut w, &p.reply_to);
        s(&mut w, &p.expiration);
        s(&mut w, &p.message_id);
        if let Some(v) = p.timestamp {
            w.u64(v);
        }
        s(&mut w, &p.kind);
        s(&mut w, &p.user_id);
        s(&mut w, &p.app_id);
        s(&mut w, &p.cluster_id);
    }
}
