//! HELLO's `auth` field: `HelloAuth::decode` on arbitrary bytes never panics, and whatever it
//! accepts encodes back to the same bytes (so there is one reading of every field).

#![no_main]

use bytes::Bytes;
use hayate_native::HelloAuth;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    if let Some(a) = HelloAuth::decode(&b) {
        assert_eq!(a.encode(), b, "{a:?}");
    }
});
