//! Hayate's JSON APIs on the bus: requests published on `$hayate/api/...` keys and their
//! replies, which the engine answers and any client sends, over any protocol (the native
//! client library, `hayate stream`, an MQTT or STOMP client publishing the same JSON).
//!
//! - [`stream`]: the stream API's bodies (stream and consumer definitions, requests, replies).
//!
//! It depends on no other Hayate crate: the engine (`hayate-broker`) and the client library
//! (`hayate-client`) both use it without depending on each other or on a protocol's codec.

pub mod stream;
