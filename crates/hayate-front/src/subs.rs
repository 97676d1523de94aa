//! A connection's subscriptions: its protocol's names for them ([`SubTable`]) and its
//! memberships of stream consumers and queues ([`Memberships`]).

/// A connection's subscriptions as its protocol names them (an MQTT filter, a STOMP
/// subscription id), each with the broker subscription id it was given. Set the protocol's
/// options for a subscription before `Session::subscribe` (a delivery may arrive as soon as
/// the broker knows it), bind the name after it succeeded.
#[derive(Debug, Default)]
pub struct SubTable {
    ids: std::collections::HashMap<String, u32>,
    next: u32,
}

impl SubTable {
    /// The broker subscription id of `name`.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Whether `name` is subscribed.
    pub fn contains(&self, name: &str) -> bool {
        self.ids.contains_key(name)
    }

    /// A broker subscription id not used yet on this connection.
    pub fn next_sid(&mut self) -> u32 {
        self.next = self.next.max(1);
        let sid = self.next;
        self.next += 1;
        sid
    }

    /// Binds `name` to `sid` (a restored subscription may bring its own id).
    pub fn bind(&mut self, name: String, sid: u32) {
        self.next = self.next.max(sid.saturating_add(1));
        self.ids.insert(name, sid);
    }

    /// Unbinds `name`; returns its broker subscription id.
    pub fn remove(&mut self, name: &str) -> Option<u32> {
        self.ids.remove(name)
    }
}

/// Most consumer memberships one connection may hold (each is a task).
pub const MAX_MEMBERSHIPS: usize = 256;

/// A connection's memberships of stream consumers and queues, by broker subscription id:
/// the task that delivers each stream consumer's messages into the session's outbox (a
/// queue writes its own, through [`crate::queues::OutboxSink`]), and the mapping of the
/// protocol's acknowledgements back to the consumers and queues. Shared by every
/// front-end that joins them (native CONSUME, STOMP `/queue/`).
#[derive(Default)]
pub struct Memberships {
    members: std::collections::HashMap<u32, Member>,
}

enum Member {
    Stream(StreamMember),
    Queue(crate::queues::QueueMember),
}

struct StreamMember {
    consumer: std::sync::Arc<hayate_broker::Consumer>,
    task: tokio::task::JoinHandle<()>,
    claimed: hayate_broker::stream::member::Claimed,
}

impl Memberships {
    /// Whether `sid` is a membership.
    pub fn contains(&self, sid: u32) -> bool {
        self.members.contains_key(&sid)
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Joins `consumer` as subscription `sid` of `session`: acknowledged deliveries, or with
    /// `auto_ack` plain ones that count as acknowledged once queued for the socket.
    pub fn join(
        &mut self,
        session: &hayate_broker::Session,
        sid: u32,
        consumer: std::sync::Arc<hayate_broker::Consumer>,
        auto_ack: bool,
    ) {
        use hayate_broker::stream::member;
        let outbox = session.outbox().clone();
        if !auto_ack {
            outbox.set_acked(sid, true);
        }
        let claimed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(member::NONE));
        let task = tokio::spawn(member::run(
            consumer.clone(),
            session.broker().clone(),
            outbox,
            sid,
            member::Options {
                claimed: claimed.clone(),
                auto_ack,
            },
        ));
        self.members.insert(
            sid,
            Member::Stream(StreamMember {
                consumer,
                task,
                claimed,
            }),
        );
    }

    /// Joins `queue` as subscription `sid` of `session`: acknowledged deliveries (at most
    /// `prefetch` unacknowledged, 0: no limit), or with `auto_ack` plain ones, settled as
    /// written. False: the queue is deleted, or has an exclusive consumer.
    pub fn join_queue(
        &mut self,
        session: &hayate_broker::Session,
        sid: u32,
        queue: std::sync::Arc<hayate_broker::queue::Queue>,
        auto_ack: bool,
        prefetch: usize,
    ) -> bool {
        match crate::queues::QueueMember::join(session.outbox(), sid, queue, auto_ack, prefetch) {
            Ok(m) => {
                self.members.insert(sid, Member::Queue(m));
                true
            }
            Err(()) => false,
        }
    }

    /// The queue subscription `sid` consumes, if it is a queue membership.
    pub fn queue_of(&self, sid: u32) -> Option<&std::sync::Arc<hayate_broker::queue::Queue>> {
        match self.members.get(&sid) {
            Some(Member::Queue(m)) => Some(&m.queue),
            _ => None,
        }
    }

    /// Leaves the consumer or queue of `sid`: a stream consumer's task stops (awaited: an
    /// aborted task may run on another thread until its next await), and what it held here
    /// goes back to the consumer or queue for another member, at once.
    pub async fn leave(&mut self, session: &hayate_broker::Session, sid: u32) -> bool {
        use hayate_broker::stream::member;
        let m = match self.members.remove(&sid) {
            None => return false,
            Some(Member::Queue(q)) => {
                q.leave(session.broker(), session.outbox());
                return true;
            }
            Some(Member::Stream(m)) => m,
        };
        m.task.abort();
        let _ = m.task.await;
        let claimed = m.claimed.load(std::sync::atomic::Ordering::Acquire);
        if claimed != member::NONE {
            let (o, n) = member::unpack(claimed);
            m.consumer.give_back(o, n, std::time::Duration::ZERO);
        }
        for d in session.outbox().take_unacked(Some(sid)) {
            if let Some(o) = d.msg.attrs.stream_offset {
                m.consumer
                    .give_back(o, d.msg.attrs.deliveries, std::time::Duration::ZERO);
            }
        }
        session.outbox().set_acked(sid, false);
        // Saved now, not within 100 ms: this may be the consumer's last change for a while.
        if let Err(e) = m.consumer.persist_now() {
            tracing::warn!("saving consumer state: {e}");
        }
        true
    }

    /// Leaves every consumer (the connection ends).
    pub async fn leave_all(&mut self, session: &hayate_broker::Session) {
        let sids: Vec<u32> = self.members.keys().copied().collect();
        for sid in sids {
            self.leave(session, sid).await;
        }
    }

    /// Applies settled deliveries that belong to consumers and queues (an ACK, or with
    /// `nack_delay` a NACK: a stream consumer delivers it again after that long, a queue
    /// puts it back in its place, at once or after that long); returns the others.
    pub fn settle(
        &self,
        settled: Vec<hayate_broker::Delivery>,
        nack_delay: Option<std::time::Duration>,
    ) -> Vec<hayate_broker::Delivery> {
        let mut rest = Vec::new();
        let mut back = Vec::new();
        let mut later = Vec::new();
        for d in settled {
            match (self.members.get(&d.sid), d.msg.attrs.stream_offset) {
                (Some(Member::Stream(m)), Some(o)) => match nack_delay {
                    None => m.consumer.ack(o),
                    Some(delay) => m.consumer.give_back(o, d.msg.attrs.deliveries, delay),
                },
                (Some(Member::Queue(q)), Some(_)) => {
                    if let Some(u) = q.take(&d) {
                        match nack_delay {
                            None => u.queue.clone().settled(&u),
                            Some(delay) if delay.is_zero() => back.push(u),
                            Some(_) => later.push(u),
                        }
                    }
                }
                _ => rest.push(d),
            }
        }
        // All back in place before any is delivered again (their original order).
        hayate_broker::queue::give_back_all(back, true);
        if let Some(delay) = nack_delay {
            hayate_broker::queue::give_back_after(later, delay);
        }
        rest
    }
}
