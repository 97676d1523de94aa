//! The meta log's keys and the values that are not JSON (docs/log-format.md, *The meta
//! log*).

/// The format of the data directory this tree writes (the `format` record's value, `u32`
/// big-endian). 2: stream definitions, consumer definitions and positions in the meta log.
pub const FORMAT: u32 = 2;
/// Key of the format record: written last by a migration (or first in a new data
/// directory); a meta log without it is an interrupted migration.
pub const FORMAT_KEY: &str = "format";
/// Key of the record that ends a snapshot: its value (`u64`) is the offset where the
/// snapshot starts; everything before it may be removed.
pub const SNAP_KEY: &str = "snap";

/// First byte of a value that replaces what its key held (every record but those below).
pub const FULL_VALUE: u8 = 1;
/// First byte of a value that adds to what its key held: for keys where [`merges`] says so,
/// the catalog keeps the earlier value with this one appended (a queue store's settlement
/// and return counts: `store/<ns>`, `returns/<ns>`), until a [`FULL_VALUE`] replaces it.
pub const MORE_VALUE: u8 = 2;

/// Does a [`MORE_VALUE`] of `key` add to its value rather than replace it?
pub fn merges(key: &str) -> bool {
    key.starts_with("store/") || key.starts_with("returns/")
}

/// `value` as it stands after `more` was written over it (key `key`): appended to it when
/// `more` adds ([`merges`]), else `more` alone.
pub fn merged(key: &str, value: Option<&[u8]>, more: &[u8]) -> Option<Vec<u8>> {
    match value {
        Some(v) if merges(key) && more.first() == Some(&MORE_VALUE) => {
            let mut all = Vec::with_capacity(v.len() + more.len());
            all.extend_from_slice(v);
            all.extend_from_slice(more);
            Some(all)
        }
        _ => None,
    }
}

/// `stream/<name>`: the stream's [`crate::StreamConfig`] as JSON.
pub fn stream_key(name: &str) -> String {
    format!("stream/{name}")
}

/// `consumer/<stream>/<name>`: the consumer's [`crate::ConsumerConfig`] as JSON.
pub fn consumer_key(stream: &str, name: &str) -> String {
    format!("consumer/{stream}/{name}")
}

/// `pos/<stream>/<consumer>`: the consumer's [`Position`].
pub fn pos_key(stream: &str, consumer: &str) -> String {
    format!("pos/{stream}/{consumer}")
}

/// Tag of a full position record.
const FULL: u8 = 1;

/// A durable consumer's position: every offset below `floor` is done, `next` is the first
/// never handed out, `done` the ranges `[start, end)` done above the floor, `deliveries` the
/// delivery count of offsets not done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    /// Every offset below is done.
    pub floor: u64,
    /// The first offset never handed out.
    pub next: u64,
    /// Ranges done above the floor.
    pub done: Vec<(u64, u64)>,
    /// Deliveries so far of offsets not done.
    pub deliveries: Vec<(u64, u32)>,
}

impl Position {
    /// The record's value: `u8 1`, floor, next, `u32` n, n × (start, end), `u32` m,
    /// m × (offset `u64`, deliveries `u32`); big-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b =
            Vec::with_capacity(1 + 16 + 4 + self.done.len() * 16 + 4 + self.deliveries.len() * 12);
        b.push(FULL);
        b.extend_from_slice(&self.floor.to_be_bytes());
        b.extend_from_slice(&self.next.to_be_bytes());
        b.extend_from_slice(&(self.done.len() as u32).to_be_bytes());
        for (s, e) in &self.done {
            b.extend_from_slice(&s.to_be_bytes());
            b.extend_from_slice(&e.to_be_bytes());
        }
        b.extend_from_slice(&(self.deliveries.len() as u32).to_be_bytes());
        for (o, n) in &self.deliveries {
            b.extend_from_slice(&o.to_be_bytes());
            b.extend_from_slice(&n.to_be_bytes());
        }
        b
    }

    /// Reads a value written by [`Position::encode`].
    pub fn decode(v: &[u8]) -> Result<Position, String> {
        let mut r = Reader(v);
        match r.u8()? {
            FULL => {}
            t => return Err(format!("position record of unknown kind {t}")),
        }
        let floor = r.u64()?;
        let next = r.u64()?;
        let n = r.u32()? as usize;
        let mut done = Vec::with_capacity(n.min(v.len() / 16));
        for _ in 0..n {
            done.push((r.u64()?, r.u64()?));
        }
        let m = r.u32()? as usize;
        let mut deliveries = Vec::with_capacity(m.min(v.len() / 12));
        for _ in 0..m {
            deliveries.push((r.u64()?, r.u32()?));
        }
        if !r.0.is_empty() {
            return Err(format!("{} bytes after a position record", r.0.len()));
        }
        Ok(Position {
            floor,
            next,
            done,
            deliveries,
        })
    }
}

/// Reads big-endian fields off a record's value.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let Some((a, rest)) = self.0.split_first_chunk::<N>() else {
            return Err("meta record cut short".into());
        };
        self.0 = rest;
        Ok(*a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_read_back_and_damage_is_refused() {
        let p = Position {
            floor: 3,
            next: 90,
            done: vec![(5, 7), (10, 80)],
            deliveries: vec![(3, 2), (4, 1)],
        };
        let b = p.encode();
        assert_eq!(Position::decode(&b).unwrap(), p);
        assert!(Position::decode(&b[..b.len() - 1]).is_err());
        let mut more = b.clone();
        more.push(0);
        assert!(Position::decode(&more).is_err());
        assert!(Position::decode(&[9]).is_err());
        assert!(
            Position::decode(&[
                1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255
            ])
            .is_err()
        );
    }
}
