//! [`Items`]: the payloads of a MSG_BATCH, kept as they came on the wire.

use bytes::{Buf, Bytes, BytesMut};

use crate::codec::MAX_BATCH_ITEMS;

/// The payloads of a MSG_BATCH as they came: each a 4-byte big-endian length and that many
/// bytes. Checked whole when decoded ([`Items::parse`]: at least one payload, at most
/// [`MAX_BATCH_ITEMS`], every length within the frame, nothing left over), and kept as one
/// [`Bytes`]: a payload is sliced out only when it is taken. [`Items::iter`] gives `&[u8]`
/// and touches no reference count; iterating an owned `Items` gives each payload as a
/// [`Bytes`] (one reference count increment each, made by whoever takes it).
///
/// A client decoding a batch of many small messages thus pays, on its reader, one check of
/// the lengths, not one `Bytes` per message; a subscriber that takes the batch whole
/// (`Subscription::next_batch` in hayate-client) pays nothing per message at all.
#[derive(Clone, PartialEq, Eq)]
pub struct Items {
    wire: Bytes,
    count: usize,
}

impl Items {
    /// The items of `payloads` (encoded: each its length and bytes).
    pub fn new(payloads: &[Bytes]) -> Items {
        let mut w = BytesMut::with_capacity(payloads.iter().map(|p| 4 + p.len()).sum());
        for p in payloads {
            crate::encode_batch_item(p, &mut w);
        }
        Items {
            wire: w.freeze(),
            count: payloads.len(),
        }
    }

    /// Checks `wire` (a MSG_BATCH body after the key) as above.
    pub(crate) fn parse(wire: Bytes) -> Result<Items, &'static str> {
        let count = walk(&wire, |_| {})?;
        Ok(Items { wire, count })
    }

    /// How many payloads.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Never true for decoded items (a batch has at least one payload).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The items as on the wire (the bytes after the key).
    pub fn wire(&self) -> &Bytes {
        &self.wire
    }

    /// The payloads, borrowed.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            rest: &self.wire,
            left: self.count,
        }
    }

    /// The payloads as [`Bytes`] (slices of the one buffer).
    pub fn to_vec(&self) -> Vec<Bytes> {
        self.clone().into_iter().collect()
    }
}

impl std::fmt::Debug for Items {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Walks `wire`, batch items (each a 4-byte big-endian length and that many bytes), to its
/// end, showing `f` where each payload lies; how many. The rules of every batch on the
/// wire (PUB_BATCH and MSG_BATCH): at least one item, at most [`MAX_BATCH_ITEMS`], every
/// length within `wire`, nothing left over. The errors are the `what` of a malformed frame.
pub(crate) fn walk(
    wire: &[u8],
    mut f: impl FnMut(std::ops::Range<usize>),
) -> Result<usize, &'static str> {
    if wire.is_empty() {
        return Err("empty batch");
    }
    let (mut at, mut count) = (0usize, 0usize);
    while at < wire.len() {
        if count == MAX_BATCH_ITEMS {
            return Err("more than 65536 batch items");
        }
        let Some(len) = wire.get(at..at + 4) else {
            return Err("batch payload");
        };
        let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = at + 4;
        if wire.len() - start < n {
            return Err("batch payload");
        }
        f(start..start + n);
        at = start + n;
        count += 1;
    }
    Ok(count)
}

/// The borrowed payloads of [`Items`].
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    rest: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Checked whole by `parse` (or written by `new`): every length fits.
        let n = self.rest.get_u32() as usize;
        let (p, rest) = self.rest.split_at(n);
        self.rest = rest;
        Some(p)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

/// The owned payloads of [`Items`], each a [`Bytes`] slice of the one buffer.
#[derive(Debug, Clone)]
pub struct IntoIter {
    rest: Bytes,
    left: usize,
}

impl Iterator for IntoIter {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let n = self.rest.get_u32() as usize;
        Some(if self.left == 0 {
            std::mem::take(&mut self.rest) // the last one: no reference count touched
        } else {
            self.rest.split_to(n)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for IntoIter {}

impl IntoIter {
    /// The payloads not taken yet.
    pub fn rest(self) -> Items {
        Items {
            wire: self.rest,
            count: self.left,
        }
    }
}

impl IntoIterator for Items {
    type Item = Bytes;
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        IntoIter {
            rest: self.wire,
            left: self.count,
        }
    }
}

impl<'a> IntoIterator for &'a Items {
    type Item = &'a [u8];
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_parse_and_iterate_agree() {
        let ps = [
            Bytes::from_static(b"a"),
            Bytes::new(),
            Bytes::from_static(b"xyz"),
        ];
        let items = Items::new(&ps);
        assert_eq!(items.len(), 3);
        assert_eq!(Items::parse(items.wire().clone()), Ok(items.clone()));
        let borrowed: Vec<&[u8]> = items.iter().collect();
        assert_eq!(borrowed, [&b"a"[..], b"", b"xyz"]);
        assert_eq!(items.to_vec(), ps);
        assert_eq!(items.clone().into_iter().len(), 3);
    }

    #[test]
    fn the_rest_is_what_was_not_taken() {
        let ps: Vec<Bytes> = (0u8..5)
            .map(|i| Bytes::from(vec![i; usize::from(i)]))
            .collect();
        let mut it = Items::new(&ps).into_iter();
        assert_eq!(it.next(), Some(ps[0].clone()));
        assert_eq!(it.next(), Some(ps[1].clone()));
        let rest = it.rest();
        assert_eq!(rest.len(), 3);
        assert_eq!(rest.to_vec(), &ps[2..]);
        let mut it = Items::new(&ps).into_iter();
        it.by_ref().for_each(drop);
        assert!(it.rest().is_empty());
    }

    proptest::proptest! {
        /// `parse` takes exactly what reading length-prefixed payloads one by one to the
        /// end takes (at least one, at most MAX_BATCH_ITEMS), and gives the same payloads.
        #[test]
        fn parse_agrees_with_reading_one_by_one(
            payloads in proptest::collection::vec(proptest::collection::vec(0u8..=255, 0..8), 0..5),
            cut in 0usize..64,
            junk in proptest::collection::vec(0u8..=255, 0..6),
            how in 0u8..3,
        ) {
            // Well formed, cut short, or with bytes after it.
            let ps: Vec<Bytes> = payloads.into_iter().map(Bytes::from).collect();
            let mut wire = Items::new(&ps).wire().to_vec();
            match how {
                0 => {}
                1 => wire.truncate(cut.min(wire.len())),
                _ => wire.extend_from_slice(&junk),
            }
            let mut rest = &wire[..];
            let mut want = Vec::new();
            let ok = loop {
                if rest.is_empty() {
                    break !want.is_empty();
                }
                if rest.len() < 4 {
                    break false;
                }
                let n = rest.get_u32() as usize;
                if rest.len() < n {
                    break false;
                }
                want.push(Bytes::copy_from_slice(&rest[..n]));
                rest = &rest[n..];
            };
            match Items::parse(Bytes::from(wire.clone())) {
                Ok(items) => {
                    proptest::prop_assert!(ok);
                    proptest::prop_assert_eq!(items.len(), want.len());
                    proptest::prop_assert_eq!(items.iter().collect::<Vec<_>>(),
                        want.iter().map(|b| &b[..]).collect::<Vec<_>>());
                    proptest::prop_assert_eq!(items.to_vec(), want);
                }
                Err(_) => proptest::prop_assert!(!ok),
            }
        }
    }

    #[test]
    fn bad_wire_is_refused() {
        assert_eq!(Items::parse(Bytes::new()), Err("empty batch"));
        assert!(Items::parse(Bytes::from_static(&[0, 0, 1])).is_err());
        assert!(Items::parse(Bytes::from_static(&[0, 0, 0, 2, 9])).is_err());
        assert!(Items::parse(Bytes::from_static(&[0, 0, 0, 1, 9, 0])).is_err());
        let many = Items::new(&vec![Bytes::new(); MAX_BATCH_ITEMS + 1]);
        assert_eq!(
            Items::parse(many.wire().clone()),
            Err("more than 65536 batch items")
        );
        let most = Items::new(&vec![Bytes::new(); MAX_BATCH_ITEMS]);
        assert_eq!(
            Items::parse(most.wire().clone()).map(|i| i.len()),
            Ok(MAX_BATCH_ITEMS)
        );
    }
}
