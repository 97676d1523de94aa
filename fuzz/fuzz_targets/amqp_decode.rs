//! Decodes arbitrary bytes as an AMQP 0-9-1 connection: the protocol header, then frames
//! under a small and a large frame limit. The decoder must never panic nor claim a frame
//! without consuming input; every decoded method and content header must encode to bytes
//! that decode and encode again to the same bytes (decoding normalises only the spec's `U`
//! field type to RabbitMQ's `s`).

#![no_main]

use bytes::BytesMut;
use hayate_amqp::frame::decode_protocol_header;
use hayate_amqp::types::Reader;
use hayate_amqp::{ContentHeader, Frame, FrameDecoder, Method};
use libfuzzer_sys::fuzz_target;

fn stable(f: &Frame) {
    let mut once = BytesMut::new();
    f.encode(&mut once);
    let again = FrameDecoder::new(u32::MAX)
        .decode(&mut once.clone())
        .expect("an encoded frame decodes")
        .expect("an encoded frame is complete");
    let mut twice = BytesMut::new();
    again.encode(&mut twice);
    assert_eq!(once, twice);
}

fn frames(data: &[u8], max: u32) {
    let d = FrameDecoder::new(max);
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        match d.decode(&mut buf) {
            Ok(Some(f)) => {
                assert!(buf.len() < before, "a frame consumes");
                stable(&f);
            }
            Ok(None) | Err(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let _ = decode_protocol_header(&mut buf);
    frames(data, 4096);
    frames(data, 1 << 20);
    let b = bytes::Bytes::copy_from_slice(data);
    if let Ok(m) = Method::decode(&b) {
        stable(&Frame::Method(1, m));
    }
    if let Ok(h) = ContentHeader::read(&mut Reader::new(data)) {
        stable(&Frame::Header(1, Box::new(h)));
    }
});
