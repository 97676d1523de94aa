//! Decodes arbitrary bytes as a stream of MQTT packets, in MQTT 3.1, 3.1.1 and 5.0, with no
//! size limit of its own and with a small one, and once more through `decode_connect`. The
//! decoder must never panic; `Ok(Some)` must consume exactly the packet `packet_len`
//! announced, `Ok(None)` and errors nothing; no packet may exceed the limit; every error
//! maps to a failure reason code; and every decoded packet must re-encode (the encoder
//! accepts whatever the decoder does) and decode again to an equal packet.

#![no_main]

use bytes::BytesMut;
use hayate_mqtt::{
    MAX_PACKET_SIZE, Packet, ProtocolVersion, decode, decode_connect, encode, encoded_len,
    packet_len,
};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8], version: ProtocolVersion, max: u32) {
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.clone();
        let announced = packet_len(&buf, version, max);
        match decode(&mut buf, version, max) {
            Ok(Some(packet)) => {
                let consumed = before.len() - buf.len();
                assert_eq!(
                    announced,
                    Ok(Some(consumed)),
                    "packet_len agrees with decode"
                );
                assert!(
                    consumed as u64 <= u64::from(max),
                    "a packet respects the limit"
                );
                assert_eq!(&before[consumed..], &buf[..], "only the packet is consumed");
                round_trip(&packet, version);
            }
            Ok(None) => {
                assert_eq!(buf, before, "Ok(None) consumes nothing");
                match announced {
                    Ok(None) => {}
                    Ok(Some(n)) => assert!(n > buf.len(), "a whole packet was there"),
                    Err(e) => panic!("packet_len failed ({e}) where decode wants more"),
                }
                break;
            }
            Err(e) => {
                assert_eq!(buf, before, "an error consumes nothing");
                assert!(e.reason_code().is_error());
                assert!(!e.to_string().is_empty());
                if let Err(early) = announced {
                    assert_eq!(early, e, "the fixed header error comes first");
                }
                break;
            }
        }
    }
}

fn round_trip(packet: &Packet, version: ProtocolVersion) {
    let mut again = BytesMut::new();
    if let Err(e) = encode(packet, version, &mut again) {
        panic!("{packet:?} decoded in {version} but does not encode: {e}");
    }
    assert_eq!(encoded_len(packet, version), Ok(again.len()));
    let decoded =
        decode(&mut again, version, MAX_PACKET_SIZE).expect("a re-encoded packet decodes");
    assert_eq!(decoded.as_ref(), Some(packet));
    assert!(again.is_empty());
}

fuzz_target!(|data: &[u8]| {
    for version in ProtocolVersion::ALL {
        check(data, version, MAX_PACKET_SIZE);
        check(data, version, 64);
    }
    let mut buf = BytesMut::from(data);
    match decode_connect(&mut buf, MAX_PACKET_SIZE) {
        Ok(Some(connect)) => round_trip(&Packet::from(connect), ProtocolVersion::V5),
        Ok(None) | Err(_) => assert_eq!(&buf[..], data),
    }
});
