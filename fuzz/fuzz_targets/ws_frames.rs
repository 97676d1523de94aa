//! Parses arbitrary bytes as the client side of a WebSocket stream, frame after frame, as
//! the broker's WebSocket transport does: no panic, every accepted header lies within the
//! input and obeys the rules for client frames, and the parse stops at the first refusal.

#![no_main]

use hayate_server::ws::parse_header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut in_message = false;
    loop {
        match parse_header(rest, in_message) {
            Ok(Some(h)) => {
                assert!(h.header_len >= 6 && h.header_len <= rest.len());
                if h.opcode >= 8 {
                    assert!(h.fin && h.len <= 125, "control frames are whole and short");
                } else {
                    in_message = !h.fin;
                }
                let body = usize::try_from(h.len).unwrap_or(usize::MAX);
                let next = h.header_len.saturating_add(body);
                if next >= rest.len() {
                    break;
                }
                rest = &rest[next..];
            }
            Ok(None) | Err(_) => break,
        }
    }
});
