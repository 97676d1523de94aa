//! A connection's output queue as its writer sees it: the [`Outgoing`] trait (implemented by
//! the [`Outbox`](crate::Outbox)) and what a take gives ([`Taken`]). hayate-io's connection
//! driver attaches one to a transport and runs its writer task over it.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::sink::Sink;

/// What a writer took from an [`Outgoing`] queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Chunks were appended to the writer's queue.
    Data,
    /// The queue is closed and empty (or was detached from this writer): shut down.
    Closed,
}

/// A connection's output queue as its writer task sees it (the broker's `Outbox`).
pub trait Outgoing: Send + Sync + 'static {
    /// Sets the transport that inline flushes write to (a new connection).
    fn set_sink(&self, sink: Arc<dyn Sink>);
    /// The queue's current epoch: a writer drains it until it changes (a detach).
    fn epoch(&self) -> u64;
    /// Waits for data and moves it into `into` (the writer then writes it and calls
    /// [`Outgoing::release`]), or says the queue is closed.
    fn take<'a>(
        &'a self,
        into: &'a mut VecDeque<Bytes>,
        epoch: u64,
    ) -> impl Future<Output = Taken> + Send + 'a;
    /// The data from [`Outgoing::take`] is written.
    fn release(&self, epoch: u64);
    /// Resolves when the connection is cut off (a slow consumer): a write that cannot
    /// finish is abandoned.
    fn cut_off(&self) -> impl Future<Output = ()> + Send + '_;
    /// Nothing more is queued: the writer drains what is there, then shuts down.
    fn close(&self);
    /// The queued output is over the queue's budget: the peer is not reading what it is
    /// sent, so the driver stops reading it (it cannot make the server queue answers without
    /// bound) until [`Outgoing::drained`].
    fn backed_up(&self) -> bool;
    /// Resolves once the output is no longer backed up (or the queue closed).
    fn drained(&self) -> impl Future<Output = ()> + Send + '_;
}
