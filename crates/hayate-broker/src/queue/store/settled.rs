//! The values of a queue store's meta records (docs/log-format.md, *Queue stores*): what is
//! settled (`store/<ns>`) and the return counts (`returns/<ns>`), each a full value followed
//! by the additions written since ([`crate::meta::record::MORE_VALUE`]); the keys.

use std::collections::HashMap;

use crate::meta::record::{FULL_VALUE, MORE_VALUE, Reader};

/// A part of a name in a key: `%` and `/` as `%25` and `%2F` (so that `/` only separates).
pub fn key_part(s: &str) -> String {
    let mut k = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => k.push_str("%25"),
            '/' => k.push_str("%2F"),
            c => k.push(c),
        }
    }
    k
}

/// [`key_part`] undone.
pub fn name_of_part(k: &str) -> String {
    k.replace("%2F", "/").replace("%25", "%")
}

/// `ns/<ns>/` (every definition of namespace `ns`).
pub fn defs_prefix(ns: &str) -> String {
    format!("ns/{}/", key_part(ns))
}

/// `ns/<ns>/queue/<name>`: a durable queue (its number, then its front-end's bytes).
pub fn queue_key(ns: &str, name: &str) -> String {
    format!("{}queue/{}", defs_prefix(ns), key_part(name))
}

/// `next/<ns>`: the number the namespace's last durable queue got (`u64`).
pub fn next_key(ns: &str) -> String {
    format!("next/{}", key_part(ns))
}

/// `store/<ns>`: what is settled in the namespace's store.
pub fn settled_key(ns: &str) -> String {
    format!("store/{}", key_part(ns))
}

/// `returns/<ns>`: how often messages of the namespace's store were given back.
pub fn returns_key(ns: &str) -> String {
    format!("returns/{}", key_part(ns))
}

/// `ns/<ns>/imported`: the files of an older release were converted into this namespace's
/// records (written last, with them).
pub fn imported_key(ns: &str) -> String {
    format!("{}imported", defs_prefix(ns))
}

/// Settled offsets as ranges `[start, end)`, sorted and merged.
pub fn ranges_of(mut offsets: Vec<u64>) -> Vec<(u64, u64)> {
    offsets.sort_unstable();
    offsets.dedup();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for o in offsets {
        match out.last_mut() {
            Some((_, e)) if *e == o => *e = o + 1,
            _ => out.push((o, o + 1)),
        }
    }
    out
}

/// One part of a `store/` value: `u8` tag ([`FULL_VALUE`] or [`MORE_VALUE`]), `u64` floor
/// (everything below is settled), `u32` n, n × (`u64` start, `u64` end); big-endian.
pub fn encode_settled(full: bool, floor: u64, ranges: &[(u64, u64)], out: &mut Vec<u8>) {
    out.push(if full { FULL_VALUE } else { MORE_VALUE });
    out.extend_from_slice(&floor.to_be_bytes());
    out.extend_from_slice(&(ranges.len() as u32).to_be_bytes());
    for (s, e) in ranges {
        out.extend_from_slice(&s.to_be_bytes());
        out.extend_from_slice(&e.to_be_bytes());
    }
}

/// What a `store/` value says is settled: the floor and the ranges above it (sorted,
/// merged). A full part starts again; an added one raises the floor and adds ranges.
pub fn decode_settled(v: &[u8]) -> Result<(u64, Vec<(u64, u64)>), String> {
    let mut r = Reader(v);
    let mut floor = 0;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    while !r.0.is_empty() {
        let tag = r.u8()?;
        let f = r.u64()?;
        match tag {
            FULL_VALUE => {
                ranges.clear();
                floor = f;
            }
            MORE_VALUE => floor = floor.max(f),
            t => return Err(format!("settlement record of unknown kind {t}")),
        }
        let n = r.u32()? as usize;
        for _ in 0..n {
            let (s, e) = (r.u64()?, r.u64()?);
            if s < e {
                ranges.push((s, e));
            }
        }
    }
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (s, e) in ranges {
        let s = s.max(floor);
        if s >= e {
            continue;
        }
        match out.last_mut() {
            Some((_, end)) if *end >= s => *end = (*end).max(e),
            _ => out.push((s, e)),
        }
    }
    Ok((floor, out))
}

/// One part of a `returns/` value: `u8` tag, `u32` n, n × (`u64` message id, `u32`
/// count); big-endian. In a full part only the messages listed were ever given back.
pub fn encode_returns(full: bool, counts: &[(u64, u32)], out: &mut Vec<u8>) {
    out.push(if full { FULL_VALUE } else { MORE_VALUE });
    out.extend_from_slice(&(counts.len() as u32).to_be_bytes());
    for (id, n) in counts {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// The return counts a `returns/` value gives (the last count of each id).
pub fn decode_returns(v: &[u8]) -> Result<HashMap<u64, u32>, String> {
    let mut r = Reader(v);
    let mut counts = HashMap::new();
    while !r.0.is_empty() {
        match r.u8()? {
            FULL_VALUE => counts.clear(),
            MORE_VALUE => {}
            t => return Err(format!("returns record of unknown kind {t}")),
        }
        let n = r.u32()? as usize;
        for _ in 0..n {
            let (id, c) = (r.u64()?, r.u32()?);
            counts.insert(id, c);
        }
    }
    Ok(counts)
}

/// Is `o` in one of `ranges` (sorted)? `at` is a cursor for offsets asked in order.
pub(super) fn covered(ranges: &[(u64, u64)], at: &mut usize, o: u64) -> bool {
    while *at < ranges.len() && ranges[*at].1 <= o {
        *at += 1;
    }
    ranges.get(*at).is_some_and(|(s, _)| *s <= o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlement_parts_merge_and_damage_is_refused() {
        let mut v = Vec::new();
        encode_settled(true, 5, &[(7, 9), (20, 30)], &mut v);
        encode_settled(false, 8, &ranges_of(vec![9, 10, 12, 3]), &mut v);
        assert_eq!(
            decode_settled(&v).unwrap(),
            (8, vec![(8, 11), (12, 13), (20, 30)])
        );
        let mut w = v.clone();
        encode_settled(true, 1, &[(2, 3)], &mut w);
        assert_eq!(decode_settled(&w).unwrap(), (1, vec![(2, 3)]));
        assert!(decode_settled(&v[..v.len() - 1]).is_err());
        assert!(decode_settled(&[7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        let mut r = Vec::new();
        encode_returns(true, &[(1, 2), (3, 4)], &mut r);
        encode_returns(false, &[(1, 5)], &mut r);
        let c = decode_returns(&r).unwrap();
        assert_eq!((c[&1], c[&3]), (5, 4));
        assert!(decode_returns(&r[..r.len() - 2]).is_err());
        let mut at = 0;
        let ranges = [(2, 4), (8, 9)];
        let got: Vec<bool> = (0..10).map(|o| covered(&ranges, &mut at, o)).collect();
        assert_eq!(
            got,
            [
                false, false, true, true, false, false, false, false, true, false
            ]
        );
        assert_eq!(name_of_part(&key_part("a/b%2F")), "a/b%2F");
        assert_eq!(key_part("a/b%"), "a%2Fb%25");
    }
}
