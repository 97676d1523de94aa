//! Writing packets for the attached connection: its parameters ([`Link`]: version, Receive
//! Maximum, Maximum Packet Size, topic aliases), PUBLISH packets as the client accepts them,
//! and control packets ([`put_packet`]).

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use hayate_broker::OutBuf;
use hayate_core::{Key, Message};
use hayate_mqtt::{
    Packet, ProtocolVersion, PublishHead, PublishProperties, QoS, encode, encode_publish_head,
};

use super::Queued;
use crate::translate::{delivery_properties, key_to_topic};

/// The current connection's parameters, while the client is online.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) version: ProtocolVersion,
    /// The client's Receive Maximum (65,535 when it sent none).
    pub(crate) receive_max: u16,
    /// The client's Maximum Packet Size.
    pub(crate) max_packet: u32,
    /// The client's Topic Alias Maximum.
    pub(crate) alias_max: u16,
    aliases: HashMap<Bytes, u16>,
}

impl Link {
    pub(crate) fn new(
        version: ProtocolVersion,
        receive_max: u16,
        max_packet: u32,
        alias_max: u16,
    ) -> Link {
        Link {
            version,
            receive_max,
            max_packet,
            alias_max: if version.is_v5() { alias_max } else { 0 },
            aliases: HashMap::new(),
        }
    }
}
/// Writes one PUBLISH; false when it could not be sent (larger than the client accepts,
/// or not encodable) and nothing was written.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_publish(
    link: &mut Link,
    empty: &PublishProperties,
    key: &Key,
    payload: &Bytes,
    msg: Option<&Message>,
    qos: QoS,
    retain: bool,
    packet_id: Option<u16>,
    dup: bool,
    sub_id: Option<u32>,
    out: &mut OutBuf,
) -> bool {
    let v5 = link.version.is_v5();
    let now = msg.and_then(|m| m.attrs.expires).map(|_| Instant::now());
    let mut props = if v5 {
        delivery_properties(msg, sub_id, now)
    } else {
        None
    };
    let full_topic = key_to_topic(key.as_str());
    let mut topic: &str = &full_topic;
    // A new alias is remembered only once the packet that announces it is written.
    let mut new_alias = None;
    if link.alias_max > 0 {
        let p = props.get_or_insert_with(PublishProperties::default);
        if let Some(&a) = link.aliases.get(key.as_shared()) {
            p.topic_alias = Some(a);
            topic = "";
        } else if link.aliases.len() < usize::from(link.alias_max) {
            let a = u16::try_from(link.aliases.len() + 1).unwrap_or(u16::MAX);
            p.topic_alias = Some(a);
            new_alias = Some(a);
        }
    }
    let head = PublishHead {
        dup,
        qos,
        retain,
        topic,
        packet_id,
        properties: props.as_ref().unwrap_or(empty),
    };
    let tail = out.tail();
    let start = tail.len();
    if encode_publish_head(&head, payload.len(), link.version, tail).is_err() {
        tail.truncate(start);
        return false;
    }
    let size = tail.len() - start + payload.len();
    if size > link.max_packet as usize {
        // "The Server MUST NOT send packets exceeding Maximum Packet Size to the Client";
        // it discards them as if sent (3.1.2.11.4).
        tail.truncate(start);
        return false;
    }
    out.put_payload(payload);
    if let Some(a) = new_alias {
        link.aliases.insert(key.as_shared().clone(), a);
    }
    true
}

/// Writes a QoS 1 or 2 delivery with packet id `pid` (`dup` on a re-send).
pub(super) fn write_queued(
    link: &mut Link,
    empty: &PublishProperties,
    q: &Queued,
    pid: u16,
    dup: bool,
    out: &mut OutBuf,
) -> bool {
    write_publish(
        link,
        empty,
        &q.msg.key,
        &q.msg.payload,
        Some(&q.msg),
        q.qos,
        q.retain,
        Some(pid),
        dup,
        q.sub_id,
        out,
    )
}

/// Appends a control packet (acknowledgements, CONNACK, ...) in `version`.
pub(crate) fn put_packet(p: &Packet, version: ProtocolVersion, out: &mut OutBuf) {
    if let Err(e) = encode(p, version, out.tail()) {
        tracing::warn!("cannot encode {:?}: {e}", p.packet_type());
    }
}
