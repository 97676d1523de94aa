//! Decodes arbitrary bytes as a stream of STOMP items, in every protocol version and with
//! small and default limits. The decoder must never panic; `Ok(Some)` must consume input
//! and `Ok(None)` or an error nothing; every decoded frame must respect the limits; and in
//! 1.1/1.2 every escaped frame must re-encode and decode again to the same frame (plus the
//! `content-length` the encoder adds to a body that came without one). Fed a few bytes at a
//! time to `decode_resuming` (as a connection reads), the input gives the same items, and
//! ends in an error exactly when it does whole.

#![no_main]

use bytes::BytesMut;
use hayate_stomp::{Frame, Item, Limits, Scanned, Version, decode, decode_resuming, encode};
use libfuzzer_sys::fuzz_target;

/// Every item of `data` decoded whole, and whether it ended in an error.
fn whole(data: &[u8], version: Version, limits: &Limits) -> (Vec<Item>, bool) {
    let mut buf = BytesMut::from(data);
    let mut items = Vec::new();
    loop {
        match decode(&mut buf, version, limits) {
            Ok(Some(i)) => items.push(i),
            Ok(None) => return (items, false),
            Err(_) => return (items, true),
        }
    }
}

/// The same, fed `step` bytes at a time to one `decode_resuming`.
fn trickled(data: &[u8], step: usize, version: Version, limits: &Limits) -> (Vec<Item>, bool) {
    let (mut buf, mut scanned, mut items) = (BytesMut::new(), Scanned::default(), Vec::new());
    for chunk in data.chunks(step.max(1)) {
        buf.extend_from_slice(chunk);
        loop {
            match decode_resuming(&mut buf, version, limits, &mut scanned) {
                Ok(Some(i)) => items.push(i),
                Ok(None) => break,
                Err(_) => return (items, true),
            }
        }
    }
    (items, false)
}

fn check(data: &[u8], version: Version, limits: &Limits) {
    let step = usize::from(data.first().copied().unwrap_or(1) % 7) + 1;
    assert_eq!(
        trickled(data, step, version, limits),
        whole(data, version, limits),
        "fed {step} bytes at a time"
    );
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        match decode(&mut buf, version, limits) {
            Ok(Some(Item::HeartBeat)) => assert!(buf.len() < before, "a heart-beat consumes"),
            Ok(Some(Item::Frame(frame))) => {
                let consumed = before - buf.len();
                // The shortest frame is "ACK\n\n\0".
                assert!(consumed >= 6, "a frame consumes at least 6 bytes");
                assert!(frame.headers.len() <= limits.max_headers);
                assert!(frame.body.len() <= limits.max_body);
                if frame.command.escapes_headers(version) {
                    round_trip(&frame, version);
                }
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "Ok(None) consumes nothing");
                break;
            }
            // A decode error closes the connection: nothing after it is read.
            Err(e) => {
                assert_eq!(buf.len(), before, "an error consumes nothing");
                assert!(!e.to_string().is_empty());
                break;
            }
        }
    }
}

fn round_trip(frame: &Frame, version: Version) {
    let mut again = BytesMut::new();
    encode(frame, version, &mut again);
    let Some(Item::Frame(decoded)) =
        decode(&mut again, version, &Limits::default()).expect("a re-encoded frame decodes")
    else {
        panic!("a re-encoded frame is one complete frame");
    };
    assert!(again.is_empty());
    let mut expect = frame.clone();
    if !frame.body.is_empty() && frame.get("content-length").is_none() {
        expect
            .headers
            .push(("content-length".into(), frame.body.len().to_string()));
    }
    assert_eq!(decoded, expect);
}

fuzz_target!(|data: &[u8]| {
    let small = Limits {
        max_headers: 4,
        max_header_bytes: 64,
        max_body: 32,
    };
    for version in Version::ALL {
        check(data, version, &Limits::default());
        check(data, version, &small);
    }
});
