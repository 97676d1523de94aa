//! The outbox as a connection's output queue: what hayate-io's connection driver and its
//! writer task need of it.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{Outbox, Taken};
use crate::Sink;
use crate::outgoing::Outgoing;
use bytes::Bytes;

impl Outgoing for Outbox {
    fn set_sink(&self, sink: Arc<dyn Sink>) {
        Outbox::set_sink(self, sink);
    }

    fn epoch(&self) -> u64 {
        Outbox::epoch(self)
    }

    fn take<'a>(
        &'a self,
        into: &'a mut VecDeque<Bytes>,
        epoch: u64,
    ) -> impl Future<Output = Taken> + Send + 'a {
        Outbox::take(self, into, epoch)
    }

    fn release(&self, epoch: u64) {
        Outbox::release(self, epoch);
    }

    fn cut_off(&self) -> impl Future<Output = ()> + Send + '_ {
        Outbox::cut_off(self)
    }

    fn close(&self) {
        Outbox::close(self);
    }

    fn backed_up(&self) -> bool {
        Outbox::backed_up(self)
    }

    async fn drained(&self) {
        // Registered before looking again, so a take in between is not missed.
        let space = self.wait_space();
        tokio::pin!(space);
        space.as_mut().enable();
        if Outbox::backed_up(self) {
            space.await;
        }
    }
}
