//! Hayate's TLS record layer reading any input: raw bytes and records sealed from the
//! fuzzer's bytes under a fixed key, mixed, then framed, opened (in place and into another
//! buffer by turns) and their alerts and handshake messages read, as the read half does:
//! no panic, and no record gives more than 2^14 bytes (`hayate_io::transport::tls::fuzz_records`
//! says how the input is read).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hayate_io::transport::tls::fuzz_records(data);
});
