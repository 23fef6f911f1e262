//! Pairing `basic.return` with the publish it returns.
//!
//! RabbitMQ sends `basic.return` before the `basic.ack` of the same publish,
//! and the return carries no sequence number. A return is matched to the
//! oldest outstanding mandatory publish with the same exchange, routing key
//! and message-id that has not been returned already; the pairing is final
//! when the confirm covering that publish arrives ([`Returns::resolve`]). A
//! return that matches nothing is reported, never dropped.

use std::collections::VecDeque;

use crate::method::BasicReturn;
use crate::types::ShortString;

/// What identifies a returned message: where it was published, and its id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReturnKey {
    /// The exchange it was published to.
    pub exchange: ShortString,
    /// The routing key it was published with.
    pub routing_key: ShortString,
    /// Its `message-id` property, if it had one.
    pub message_id: Option<ShortString>,
}

/// What [`Returns::on_return`] made of a `basic.return`.
#[derive(Debug, Clone, PartialEq)]
pub enum ReturnMatch {
    /// Paired with the publish of this sequence number (final when it is resolved).
    Matched(u64),
    /// No outstanding mandatory publish fits: a protocol surprise worth
    /// reporting (for example a return for a publish made before a reconnect).
    Unmatched(BasicReturn),
}

#[derive(Debug, Clone)]
struct Pending {
    seq: u64,
    key: ReturnKey,
    returned: Option<BasicReturn>,
}

/// The outstanding mandatory publishes of one channel.
///
/// ```
/// use acemq_codec::track::{ReturnKey, ReturnMatch, Returns};
/// use acemq_codec::BasicReturn;
/// let key = |id: &str| ReturnKey { exchange: "".into(), routing_key: "nowhere".into(), message_id: Some(id.into()) };
/// let mut returns = Returns::new();
/// returns.on_mandatory_publish(1, key("a"));
/// returns.on_mandatory_publish(2, key("b"));
/// let ret = BasicReturn { reply_code: 312, reply_text: "NO_ROUTE".into(), exchange: "".into(), routing_key: "nowhere".into() };
/// assert_eq!(returns.on_return(ret, Some(&"b".into())), ReturnMatch::Matched(2));
/// assert_eq!(returns.resolve(1), None); // acked, routed
/// assert_eq!(returns.resolve(2).map(|r| r.reply_code), Some(312)); // acked after its return
/// ```
#[derive(Debug, Clone, Default)]
pub struct Returns {
    pending: VecDeque<Pending>,
}

impl Returns {
    /// No publishes outstanding.
    pub fn new() -> Self {
        Returns::default()
    }

    /// Records a mandatory publish with its sequence number (the confirm
    /// sequence, or any increasing number without confirms).
    pub fn on_mandatory_publish(&mut self, seq: u64, key: ReturnKey) {
        self.pending.push_back(Pending {
            seq,
            key,
            returned: None,
        });
    }

    /// How many mandatory publishes are outstanding.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Pairs a `basic.return` (with the `message-id` of its content) with the
    /// oldest outstanding, not yet returned, mandatory publish that has the
    /// same exchange, routing key and message-id.
    pub fn on_return(&mut self, ret: BasicReturn, message_id: Option<&ShortString>) -> ReturnMatch {
        let found = self.pending.iter_mut().find(|p| {
            p.returned.is_none()
                && p.key.exchange == ret.exchange
                && p.key.routing_key == ret.routing_key
                && p.key.message_id.as_ref() == message_id
        });
        match found {
            Some(pending) => {
                pending.returned = Some(ret);
                ReturnMatch::Matched(pending.seq)
            }
            None => ReturnMatch::Unmatched(ret),
        }
    }

    /// The publish `seq` has been confirmed (acked or nacked): forget it, and
    /// give back its return if it had one. The pairing is final now.
    pub fn resolve(&mut self, seq: u64) -> Option<BasicReturn> {
        let at = if self.pending.front().map(|p| p.seq) == Some(seq) {
            0
        } else {
            self.pending.iter().position(|p| p.seq == seq)?
        };
        self.pending.remove(at).and_then(|p| p.returned)
    }

    /// Whether no mandatory publish is outstanding: then no confirm has a
    /// return to pair with, and [`Returns::resolve`] would give none.
    ///
    /// ```
    /// use acemq_codec::track::Returns;
    /// assert!(Returns::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether `seq` is an outstanding mandatory publish.
    pub fn is_pending(&self, seq: u64) -> bool {
        self.pending.iter().any(|p| p.seq == seq)
    }

    /// Forgets everything (the channel closed).
    pub fn clear(&mut self) {
        self.pending.clear();
    }
}
