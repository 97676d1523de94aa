//! Hayate's native front-end: the server side of the native protocol, and the shared memory
//! it offers local clients.
//!
//! - [`native`]: one reader loop and one writer task per connection ([`native::serve`]), and
//!   the encoder that turns deliveries into MSG / MSG_BATCH / MSG_REF frames
//!   ([`native::NativeEncoder`]).
//! - [`shm`]: the shared-memory offer ([`shm::ShmOffer`]): the abstract Unix socket, the
//!   tickets, and a fan-out arena per user.
//! - [`fanout`]: the fan-out arena (one copy of a message for all of a user's shared-memory
//!   clients).

pub mod fanout;
pub mod native;
pub mod shm;
