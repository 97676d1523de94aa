//! The configuration file: arbitrary bytes as TOML never panic `Config::from_toml` (which
//! validates: limits, streams, the `[auth]` section's hashes, token digests, groups and key
//! expressions, and loads `[tls]` files when named: read only), and a configuration that
//! parses prints (`to_toml`) to text that parses back to the same configuration.

#![no_main]

use hayate_server::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = Config::from_toml(text) else {
        return;
    };
    let again = Config::from_toml(&c.to_toml()).expect("a printed configuration parses");
    assert_eq!(again, c, "print and parse round trip");
});
