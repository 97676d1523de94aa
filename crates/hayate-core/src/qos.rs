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

/// Quality of service of a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Qos {
    /// May messages be lost?
    pub reliability: Reliability,
    /// Drop or block when the subscriber cannot keep up.
    pub congestion: Congestion,
}

impl Qos {
    /// Best-effort delivery that drops when the subscriber is slow.
    pub const BEST_EFFORT_DROP: Qos = Qos {
        reliability: Reliability::BestEffort,
        congestion: Congestion::Drop,
    };
    /// Reliable delivery with back-pressure. (The default, `Qos::default()`, is best-effort
    /// with back-pressure: nothing is dropped either, but it will not gain acknowledgements.)
    pub const RELIABLE: Qos = Qos {
        reliability: Reliability::Reliable,
        congestion: Congestion::Block,
    };

    /// The congestion behaviour actually applied: reliable subscriptions always block.
    pub fn effective_congestion(self) -> Congestion {
        match self.reliability {
            Reliability::Reliable => Congestion::Block,
            Reliability::BestEffort => self.congestion,
        }
    }

    /// Encodes into the one-byte wire form: bit 0 = reliable, bit 1 = drop.
    pub fn to_bits(self) -> u8 {
        let mut b = 0;
        if self.reliability == Reliability::Reliable {
            b |= 1;
        }
        if self.congestion == Congestion::Drop {
            b |= 2;
        }
        b
    }

    /// Decodes the one-byte wire form; `None` if reserved bits are set.
    pub fn from_bits(b: u8) -> Option<Qos> {
        if b & !3 != 0 {
            return None;
        }
        Some(Qos {
            reliability: if b & 1 != 0 {
                Reliability::Reliable
            } else {
                Reliability::BestEffort
            },
            congestion: if b & 2 != 0 {
                Congestion::Drop
            } else {
                Congestion::Block
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip() {
        for b in 0..4u8 {
            assert_eq!(Qos::from_bits(b).map(Qos::to_bits), Some(b));
        }
        assert_eq!(Qos::from_bits(4), None);
        assert_eq!(Qos::RELIABLE.effective_congestion(), Congestion::Block);
        let q = Qos {
            reliability: Reliability::Reliable,
            congestion: Congestion::Drop,
        };
        assert_eq!(q.effective_congestion(), Congestion::Block);
        assert_eq!(
            Qos::BEST_EFFORT_DROP.effective_congestion(),
            Congestion::Drop
        );
    }
}
