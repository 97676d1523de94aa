//! A connection's subscriptions: its protocol's names for them ([`SubTable`]) and its
//! memberships of stream consumers ([`Memberships`]).

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

/// A connection's memberships of stream consumers, by broker subscription id: the task that
/// delivers each consumer's messages into the session's outbox, and the mapping of the
/// protocol's acknowledgements back to the consumers. Shared by every front-end that joins
/// consumers (native CONSUME, STOMP `/queue/` on a stream).
#[derive(Default)]
pub struct Memberships {
    members: std::collections::HashMap<u32, Member>,
}

struct Member {
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
            Member {
                consumer,
                task,
                claimed,
            },
        );
    }

    /// Leaves the consumer of `sid`: its task stops (awaited: an aborted task may run on
    /// another thread until its next await), and what it held here goes back to the
    /// consumer for another member, at once.
    pub async fn leave(&mut self, session: &hayate_broker::Session, sid: u32) -> bool {
        use hayate_broker::stream::member;
        let Some(m) = self.members.remove(&sid) else {
            return false;
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

    /// Applies settled deliveries that belong to consumers (an ACK, or with `nack_delay` a
    /// NACK to be delivered again after that long); returns the others.
    pub fn settle(
        &self,
        settled: Vec<hayate_broker::Delivery>,
        nack_delay: Option<std::time::Duration>,
    ) -> Vec<hayate_broker::Delivery> {
        let mut rest = Vec::new();
        for d in settled {
            match (self.members.get(&d.sid), d.msg.attrs.stream_offset) {
                (Some(m), Some(o)) => match nack_delay {
                    None => m.consumer.ack(o),
                    Some(delay) => m.consumer.give_back(o, d.msg.attrs.deliveries, delay),
                },
                _ => rest.push(d),
            }
        }
        rest
    }
}
