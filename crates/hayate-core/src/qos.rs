//! Quality of service of a subscription.

/// Whether the broker may lose a message for this subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Reliability {
    /// Delivered at most once; may be dropped under congestion if the congestion mode allows.
    #[default]
    BestEffort,
    /// Never dropped by the broker: a reliable subscription always back-pressures
    /// (its congestion mode is forced to [`Congestion::Block`]). Acknowledgements and the
    /// durable log build on this later.
    Reliable,
}

/// What happens when a subscriber's outbox is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Congestion {
    /// The publisher waits until there is room: back-pressure reaches the publisher and
    /// nothing is lost.
    #[default]
    Block,
    /// The message is dropped for this subscriber; the broker counts the drops and tells the
    /// subscriber how many it missed.
    Drop,
}

/// What a `block` subscription does when its outbox stays full longer than the broker's
/// bound on blocking (`max_block_ms`): a subscriber that does not read must not hold its
/// publishers, and through them everyone else, for longer than that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Stall {
    /// The slow consumer is disconnected (as nats-server does past its write deadline).
    /// Unacknowledged deliveries of an acknowledged subscription go to another member.
    #[default]
    Disconnect,
    /// The messages that do not fit are dropped and counted (LOST), and further messages
    /// are dropped at once until the subscriber drains its outbox. Reliable and
    /// acknowledged subscriptions never drop: for them this is `Disconnect`.
    Drop,
}

/// Quality of service of a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qos {
    /// May messages be lost?
    pub reliability: Reliability,
    /// Drop or block when the subscriber cannot keep up.
    pub congestion: Congestion,
    /// Acknowledged delivery: every message carries a delivery id and stays held by the
    /// broker until the subscriber acknowledges it; a NACK or a disconnect gives it back
    /// for redelivery. Implies reliable.
    pub ack: bool,
    /// What a blocking subscription does when it stalls past the broker's bound.
    pub stall: Stall,
    /// Do not deliver messages published by the subscribing session itself (MQTT's
    /// no-local).
    pub no_echo: bool,
}

/// Wire bits of the QoS byte (native SUB).
mod bits {
    pub(super) const RELIABLE: u8 = 0x01;
    pub(super) const DROP: u8 = 0x02;
    pub(super) const ACK: u8 = 0x04;
    pub(super) const STALL_DROP: u8 = 0x08;
    pub(super) const NO_ECHO: u8 = 0x10;
    pub(super) const ALL: u8 = RELIABLE | DROP | ACK | STALL_DROP | NO_ECHO;
}

impl Qos {
    /// Best-effort delivery that drops when the subscriber is slow.
    pub const BEST_EFFORT_DROP: Qos = Qos {
        reliability: Reliability::BestEffort,
        congestion: Congestion::Drop,
        ack: false,
        stall: Stall::Disconnect,
        no_echo: false,
    };
    /// Reliable delivery with back-pressure. (The default, `Qos::default()`, is best-effort
    /// with back-pressure: nothing is dropped either, but it will not gain acknowledgements.)
    pub const RELIABLE: Qos = Qos {
        reliability: Reliability::Reliable,
        congestion: Congestion::Block,
        ack: false,
        stall: Stall::Disconnect,
        no_echo: false,
    };
    /// Acknowledged delivery (reliable, with back-pressure, held until acknowledged).
    pub const ACKED: Qos = Qos {
        reliability: Reliability::Reliable,
        congestion: Congestion::Block,
        ack: true,
        stall: Stall::Disconnect,
        no_echo: false,
    };

    /// True for reliable and acknowledged subscriptions (never dropped by the broker).
    pub fn is_reliable(self) -> bool {
        self.ack || self.reliability == Reliability::Reliable
    }

    /// The congestion behaviour actually applied: reliable subscriptions always block.
    pub fn effective_congestion(self) -> Congestion {
        if self.is_reliable() {
            Congestion::Block
        } else {
            self.congestion
        }
    }

    /// The stall behaviour actually applied: reliable subscriptions are never dropped.
    pub fn effective_stall(self) -> Stall {
        if self.is_reliable() {
            Stall::Disconnect
        } else {
            self.stall
        }
    }

    /// Encodes into the one-byte wire form: bit 0 = reliable, bit 1 = drop, bit 2 =
    /// acknowledged, bit 3 = drop (instead of disconnect) when stalled, bit 4 = no echo.
    pub fn to_bits(self) -> u8 {
        let mut b = 0;
        if self.reliability == Reliability::Reliable {
            b |= bits::RELIABLE;
        }
        if self.congestion == Congestion::Drop {
            b |= bits::DROP;
        }
        if self.ack {
            b |= bits::ACK;
        }
        if self.stall == Stall::Drop {
            b |= bits::STALL_DROP;
        }
        if self.no_echo {
            b |= bits::NO_ECHO;
        }
        b
    }

    /// Decodes the one-byte wire form; `None` if reserved bits (5 to 7) are set.
    pub fn from_bits(b: u8) -> Option<Qos> {
        if b & !bits::ALL != 0 {
            return None;
        }
        Some(Qos {
            reliability: if b & bits::RELIABLE != 0 {
                Reliability::Reliable
            } else {
                Reliability::BestEffort
            },
            congestion: if b & bits::DROP != 0 {
                Congestion::Drop
            } else {
                Congestion::Block
            },
            ack: b & bits::ACK != 0,
            stall: if b & bits::STALL_DROP != 0 {
                Stall::Drop
            } else {
                Stall::Disconnect
            },
            no_echo: b & bits::NO_ECHO != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip() {
        for b in 0..32u8 {
            assert_eq!(Qos::from_bits(b).map(Qos::to_bits), Some(b));
        }
        for b in [0x20, 0x40, 0x80] {
            assert_eq!(Qos::from_bits(b), None);
        }
        assert_eq!(Qos::RELIABLE.effective_congestion(), Congestion::Block);
        let q = Qos {
            reliability: Reliability::Reliable,
            congestion: Congestion::Drop,
            ..Qos::default()
        };
        assert_eq!(q.effective_congestion(), Congestion::Block);
        let acked_drop = Qos {
            congestion: Congestion::Drop,
            stall: Stall::Drop,
            ..Qos::ACKED
        };
        assert_eq!(acked_drop.effective_congestion(), Congestion::Block);
        assert_eq!(acked_drop.effective_stall(), Stall::Disconnect);
        assert_eq!(
            Qos::BEST_EFFORT_DROP.effective_congestion(),
            Congestion::Drop
        );
    }
}
