//! Decodes arbitrary bytes as a stream of native frames. Every frame that decodes must
//! re-encode to exactly the bytes it came from and decode again to an equal frame. The
//! same bytes as one fan-out entry read in place (`decode_frame`) decode to the frame the
//! stream decoder takes when it is exactly one whole frame, and are refused otherwise.

#![no_main]

use bytes::{Bytes, BytesMut};
use hayate_native::{Frame, HEADER_LEN, decode, decode_frame, encode};
use libfuzzer_sys::fuzz_target;

const MAX_FRAME: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let whole = decode_frame(Bytes::copy_from_slice(data), MAX_FRAME);
    let mut one = BytesMut::from(data);
    match decode(&mut one, MAX_FRAME) {
        Ok(Some(f)) if one.is_empty() => assert_eq!(whole, Ok(f)),
        _ => assert!(whole.is_err(), "decode_frame took what decode did not: {whole:?}"),
    }
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        match decode(&mut buf, MAX_FRAME) {
            Ok(Some(frame)) => {
                let consumed = before - buf.len();
                assert!(consumed >= HEADER_LEN, "a frame consumes at least its header");
                let at = data.len() - before;

                let mut again = BytesMut::new();
                encode(&frame, &mut again);
                // Two frames have two legal encodings: NACK's `delay_ms` and CONSUME's
                // `prefetch` may be absent or an explicit 0 (docs/protocol.md); the encoder
                // writes the short one.
                let explicit_zero_delay = matches!(
                    frame,
                    Frame::Nack { delay_ms: 0, .. } | Frame::Consume { prefetch: 0, .. }
                ) && consumed == again.len() + 4;
                if !explicit_zero_delay {
                    assert_eq!(&again[..], &data[at..at + consumed], "re-encoding differs");
                }

                let decoded = decode(&mut again, MAX_FRAME)
                    .expect("a re-encoded frame decodes")
                    .expect("a re-encoded frame is complete");
                assert_eq!(decoded, frame);
                assert!(again.is_empty());
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "Ok(None) consumes nothing");
                break;
            }
            // A decode error closes the connection: nothing after it is read.
            Err(_) => break,
        }
    }
});
