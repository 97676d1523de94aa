//! What a message held for long really costs the process, for the memory budget.
//!
//! Holders that keep messages past their publish (MQTT retained messages and session queues,
//! queues) charge the broker-wide budget
//! (`hayate_flow::memory`) for each item they hold: not only its key and payload bytes but the
//! allocations they sit in and the holder's own slot for it. Before they did, one-byte
//! messages were charged a dozen bytes each while each took some 500 bytes of the process:
//! 7.7 M retained messages on distinct topics took a broker with a 128 MiB budget to 4.48 GB
//! of RSS while the budget said 68 MB.
//!
//! An item's charge is [`data`] (its bytes on the heap, allocations included) plus a slot
//! that each holder sizes for its container (the struct as stored there, times how much room
//! the container keeps per item at most, see each holder). The figures are upper bounds of
//! what glibc's allocator and the standard containers take, checked against the broker's
//! measured RSS (docs/performance.md, *Memory*).

use std::mem::size_of;

use bytes::Bytes;
use hayate_core::Message;

/// What one heap allocation costs beyond the bytes asked for, at most: glibc's `malloc`
/// gives a request of `n` bytes a chunk of `max(32, n + 8)` rounded up to 16, which is at
/// most `n + 31` bytes.
pub const ALLOC: usize = 32;

/// What the key and the payload of a message cost beyond their bytes, at most: their two
/// allocations and their two `Shared` headers (see [`data`]).
pub const KEY_AND_PAYLOAD: usize = 4 * ALLOC;

/// One part of a message (key, payload, reply-to, correlation id, header value) kept as
/// [`Message::compact`] makes it: its bytes in an allocation of their own, and the header
/// `bytes` gives that allocation the first time the `Bytes` is cloned (its `Shared`, one more
/// small allocation: a map's key, a delivery being written).
const fn part(n: usize) -> usize {
    if n == 0 { 0 } else { n + 2 * ALLOC }
}

/// The heap bytes of `m`'s data as a long-lived holder keeps it (`Message::compact`): key,
/// payload, reply-to, correlation id and headers, each with its allocations. A payload of
/// 32 KiB or more is shared rather than copied by `compact`; it is counted whole all the same
/// (each holder may be the last to hold it).
pub fn data(m: &Message) -> usize {
    part(m.key.as_bytes().len()) + part(m.payload.len()) + properties(m)
}

/// The part of [`data`] that is neither key nor payload: reply-to, correlation id and
/// headers with their allocations (0 for a plain message).
pub fn properties(m: &Message) -> usize {
    let mut n = 0;
    if let Some(r) = &m.reply_to {
        n += part(r.as_bytes().len());
    }
    if let Some(c) = &m.correlation_id {
        n += part(c.len());
    }
    if let Some(h) = &m.headers {
        n += header_slots(h.len()) * size_of::<(String, Bytes)>() + ALLOC;
        for (name, v) in h {
            n += name.len() + ALLOC + part(v.len());
        }
    }
    n
}

/// The slots a headers vector of `len` entries is charged for: a function of its length
/// alone, never of its capacity. A holder charges a message as it came in and gives the
/// charge back from the copy it kept (`Message::compact` and `clone` give the vector exactly
/// its length), so a charge that followed the capacity left the difference charged for good
/// (each replacement of a retained MQTT 5.0 message with user properties: 56 bytes, without
/// end). An upper bound of what the protocols' decoders build: pushed one by one (capacity
/// doubling from 4) or with one slot spare.
const fn header_slots(len: usize) -> usize {
    let n = (len + 1).next_power_of_two();
    if n < 4 { 4 } else { n }
}

/// The slot of one message in a `VecDeque<T>` that only grows (by doubling) or is emptied
/// whole: its capacity is at most twice its length, so two `T`s per item.
pub const fn deque_slot<T>() -> usize {
    2 * size_of::<T>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hayate_core::Key;

    #[test]
    fn a_one_byte_message_costs_far_more_than_its_bytes() {
        let m = Message::new(Key::new("a/b").unwrap_or_else(|e| panic!("{e}")), vec![1u8]);
        assert_eq!(data(&m), 3 + 1 + 4 * ALLOC);
        assert!(
            deque_slot::<Message>() >= 2 * 128,
            "the struct is not small"
        );
        let mut h = m.clone();
        h.headers = Some(vec![("n".into(), Bytes::from_static(b"v"))]);
        assert!(data(&h) > data(&m) + 2 + 2 * ALLOC);
    }

    /// What a holder charges for a message it took is what it gives back for the copy it
    /// kept: the charge does not follow the headers vector's spare capacity, which
    /// `Message::compact` and `clone` drop (review of issue 44 item 3: each replaced
    /// retained message with user properties left 56 bytes charged).
    #[test]
    fn a_kept_copy_is_charged_what_the_original_was() {
        for (len, cap) in [(1, 2), (1, 4), (5, 8), (8, 8), (9, 16), (3, 4)] {
            let mut m = Message::new(Key::new("a/b").unwrap_or_else(|e| panic!("{e}")), vec![1u8]);
            let mut h = Vec::with_capacity(cap);
            for i in 0..len {
                h.push((format!("h{i}"), Bytes::from_static(b"v")));
            }
            m.headers = Some(h);
            assert_eq!(data(&m.compact()), data(&m), "{len} of {cap}");
            assert_eq!(data(&m.clone()), data(&m), "{len} of {cap}");
            assert!(header_slots(len) >= cap, "{len} of {cap}: an upper bound");
        }
    }
}
