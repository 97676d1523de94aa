//! Interest announcements between peer nodes: what a node's subscriptions are, sent to every
//! node it links to, as PUB frames on [`INTEREST_KEY`] (docs/protocol.md, "Peer mode").
//!
//! Payload, big-endian:
//! ```text
//! u8 version (1) | u8 op | u32 sid | (op ADD only:) u8 qos bits | u16 group length | group
//!                                                   | u16 expression length | expression
//! ```
//! `op`: 1 ADD (a subscription, its id on the announcing node, its QoS bits as in SUB, its
//! queue group (length 0: none) and key expression), 2 REMOVE (sid), 3 RESET (forget every
//! subscription announced on this connection; sid 0). Anything else, a short or long
//! payload, a bad expression or group, is a protocol error: the connection is closed.

use bytes::{BufMut, Bytes, BytesMut};
use hayate_core::{KeyExpr, Qos};

/// The key interest announcements are published on (over a link, never routed).
pub const INTEREST_KEY: &str = "_peer/interest";

const VERSION: u8 = 1;
const ADD: u8 = 1;
const REMOVE: u8 = 2;
const RESET: u8 = 3;

/// One announcement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Interest {
    /// A subscription of the announcing node.
    Add {
        sid: u32,
        qos: Qos,
        group: Option<String>,
        expr: KeyExpr,
    },
    /// The subscription is gone.
    Remove { sid: u32 },
    /// Forget what this connection announced (sent first on every link).
    Reset,
}

impl Interest {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16);
        b.put_u8(VERSION);
        match self {
            Interest::Add {
                sid,
                qos,
                group,
                expr,
            } => {
                b.put_u8(ADD);
                b.put_u32(*sid);
                b.put_u8(qos.to_bits());
                let g = group.as_deref().unwrap_or("");
                b.put_u16(g.len() as u16);
                b.put_slice(g.as_bytes());
                b.put_u16(expr.as_str().len() as u16);
                b.put_slice(expr.as_str().as_bytes());
            }
            Interest::Remove { sid } => {
                b.put_u8(REMOVE);
                b.put_u32(*sid);
            }
            Interest::Reset => {
                b.put_u8(RESET);
                b.put_u32(0);
            }
        }
        b.freeze()
    }

    pub(crate) fn decode(p: &[u8]) -> Result<Interest, String> {
        let take = |p: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
            if p.len() < n {
                return Err("interest announcement cut short".into());
            }
            let (a, b) = p.split_at(n);
            *p = b;
            Ok(a.to_vec())
        };
        let mut p = p;
        let head = take(&mut p, 6)?;
        if head[0] != VERSION {
            return Err(format!("interest announcement version {} unknown", head[0]));
        }
        let sid = u32::from_be_bytes([head[2], head[3], head[4], head[5]]);
        let i = match head[1] {
            ADD => {
                let q = take(&mut p, 1)?[0];
                let qos = Qos::from_bits(q).ok_or_else(|| format!("bad QoS bits {q:#04x}"))?;
                let gl = take(&mut p, 2)?;
                let group = take(&mut p, usize::from(u16::from_be_bytes([gl[0], gl[1]])))?;
                let group = if group.is_empty() {
                    None
                } else {
                    Some(String::from_utf8(group).map_err(|_| "group is not UTF-8")?)
                };
                let el = take(&mut p, 2)?;
                let expr = take(&mut p, usize::from(u16::from_be_bytes([el[0], el[1]])))?;
                let expr = std::str::from_utf8(&expr).map_err(|_| "expression is not UTF-8")?;
                let expr = KeyExpr::new(expr).map_err(|e| e.to_string())?;
                Interest::Add {
                    sid,
                    qos,
                    group,
                    expr,
                }
            }
            REMOVE => Interest::Remove { sid },
            RESET => Interest::Reset,
            op => return Err(format!("interest operation {op} unknown")),
        };
        if !p.is_empty() {
            return Err("interest announcement has trailing bytes".into());
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        for i in [
            Interest::Add {
                sid: 7,
                qos: Qos::BEST_EFFORT_DROP,
                group: Some("workers".into()),
                expr: KeyExpr::new("a/*/c/**").unwrap(),
            },
            Interest::Add {
                sid: u32::MAX,
                qos: Qos::default(),
                group: None,
                expr: KeyExpr::new("x").unwrap(),
            },
            Interest::Remove { sid: 3 },
            Interest::Reset,
        ] {
            assert_eq!(Interest::decode(&i.encode()).unwrap(), i);
        }
    }

    #[test]
    fn refuses_damage() {
        let good = Interest::Add {
            sid: 1,
            qos: Qos::default(),
            group: None,
            expr: KeyExpr::new("a/b").unwrap(),
        }
        .encode();
        for n in 0..good.len() {
            assert!(Interest::decode(&good[..n]).is_err(), "cut at {n}");
        }
        let mut long = good.to_vec();
        long.push(0);
        assert!(Interest::decode(&long).is_err());
        let mut v = good.to_vec();
        v[0] = 2;
        assert!(Interest::decode(&v).is_err());
        let mut op = good.to_vec();
        op[1] = 9;
        assert!(Interest::decode(&op).is_err());
        let mut q = good.to_vec();
        q[6] = 0xff;
        assert!(Interest::decode(&q).is_err());
        // An expression that is not one: "a//b".
        let bad = [1u8, 1, 0, 0, 0, 1, 0, 0, 0, 0, 4, b'a', b'/', b'/', b'b'];
        assert!(Interest::decode(&bad).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(p in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Interest::decode(&p);
        }
    }
}
