//! Hayate's JSON APIs on the bus: requests published on `$hayate/api/...` keys and their
//! replies, which the engine answers. They are native-protocol PUBs (docs/protocol.md, *The
//! stream API*; the same keys published from MQTT or STOMP are ordinary messages), sent by the
//! client library and `hayate stream`, or by any program that writes the JSON.
//!
//! - [`stream`]: the stream API's bodies (stream and consumer definitions, requests, replies).
//!
//! It depends on no other Hayate crate: the engine (`hayate-broker`) and the client library
//! (`hayate-client`) both use it without depending on each other or on a protocol's codec.

pub mod stream;
