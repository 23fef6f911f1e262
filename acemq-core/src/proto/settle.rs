//! Ack coalescing: consecutive acks of a channel's oldest deliveries go out
//! as one `basic.ack` with `multiple` set.
//!
//! A consumer that acks in order sends one ack per delivery; RabbitMQ handles
//! each one. When every delivery up to tag N is settled, `ack(N, multiple)`
//! says the same in one method. That is only right if no delivery at or below
//! N is still unsettled — the broker would take it as acked — so the channel
//! keeps the tags it has delivered and not yet seen settled, in order.
//!
//! - An ack of the oldest unsettled delivery is held back (with every
//!   consecutive settled one after it) and written as one multiple ack before
//!   the connection next writes: at the latest in the same write it would have
//!   gone out in, so nothing waits longer than before.
//! - Any other ack, and every nack and reject, is written at once. A multiple
//!   ack or nack from the application first lets out what is held, so that a
//!   held ack is never turned into a nack.
//! - Any other method on the channel first lets out what is held (a
//!   `channel.close` never loses an ack).
//! - A channel with a `no-ack` consumer or get, or a `basic.recover`, stops
//!   coalescing for good: its delivery tags no longer all need settling.

use std::collections::VecDeque;

use acemq_codec::Method;

/// What to do with a settling method the application sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Held back; it goes out in the next multiple ack.
    Held,
    /// Write it now (after letting out what is held, if `flush_first`).
    Write { flush_first: bool },
}

/// The deliveries of one channel not yet settled, and the ack held back.
#[derive(Debug, Default)]
pub(crate) struct Settlements {
    /// Delivered tags in order, each with whether it has been settled.
    unsettled: VecDeque<(u64, bool)>,
    /// The highest tag of the held-back acks: every tag up to it is settled.
    held: Option<u64>,
    /// Coalescing is off for this channel.
    off: bool,
}

impl Settlements {
    /// The broker delivered `tag` (a `basic.deliver` or `basic.get-ok`).
    pub(crate) fn on_delivery(&mut self, tag: u64) {
        if self.off {
            return;
        }
        match self.unsettled.back() {
            // Tags rise on a channel; one that does not means we no longer
            // know the broker's numbering, so stop guessing.
            Some(&(last, _)) if tag <= last => {
                self.turn_off();
            }
            _ => self.unsettled.push_back((tag, false)),
        }
    }

    /// The application sends `method` on this channel. Returns whether to
    /// write it now and whether the held ack must go first.
    pub(crate) fn on_send(&mut self, method: &Method) -> Settle {
        if self.off {
            return Settle::Write { flush_first: false };
        }
        match method {
            Method::BasicAck(ack) if !ack.multiple => {
                if self.hold_ack(ack.delivery_tag) {
                    Settle::Held
                } else {
                    self.mark(ack.delivery_tag);
                    Settle::Write { flush_first: false }
                }
            }
            Method::BasicAck(ack) => {
                self.settle_up_to(ack.delivery_tag);
                Settle::Write { flush_first: true }
            }
            Method::BasicNack(nack) if nack.multiple => {
                self.settle_up_to(nack.delivery_tag);
                Settle::Write { flush_first: true }
            }
            Method::BasicNack(nack) => {
                self.mark(nack.delivery_tag);
                Settle::Write { flush_first: false }
            }
            Method::BasicReject(reject) => {
                self.mark(reject.delivery_tag);
                Settle::Write { flush_first: false }
            }
            Method::BasicConsume(consume) if consume.no_ack => self.turn_off(),
            Method::BasicGet(get) if get.no_ack => self.turn_off(),
            Method::BasicRecover(_) | Method::BasicRecoverAsync(_) => self.turn_off(),
            _ => Settle::Write { flush_first: true },
        }
    }

    /// Holds back a single ack of `tag` if it settles the oldest unsettled
    /// delivery (`true`); otherwise changes nothing (`false`), and the ack
    /// goes through [`Settlements::on_send`].
    pub(crate) fn hold_ack(&mut self, tag: u64) -> bool {
        if self.off || self.unsettled.front().map(|&(t, _)| t) != Some(tag) {
            return false;
        }
        self.unsettled.pop_front();
        self.held = Some(tag);
        self.pop_settled();
        true
    }

    /// The held ack to write now, if any: `ack(tag, multiple)`.
    pub(crate) fn take_held(&mut self) -> Option<u64> {
        self.held.take()
    }

    /// Stops coalescing; what is held still goes out first.
    fn turn_off(&mut self) -> Settle {
        self.off = true;
        self.unsettled = VecDeque::new();
        Settle::Write { flush_first: true }
    }

    /// Marks one tag settled (written on its own).
    fn mark(&mut self, tag: u64) {
        if let Ok(at) = self.unsettled.binary_search_by_key(&tag, |&(t, _)| t) {
            self.unsettled[at].1 = true;
        }
        self.pop_settled();
    }

    /// Marks every tag up to `tag` settled (a multiple ack or nack).
    fn settle_up_to(&mut self, tag: u64) {
        while self.unsettled.front().is_some_and(|&(t, _)| t <= tag) {
            self.unsettled.pop_front();
        }
        self.pop_settled();
    }

    /// Drops settled tags from the front: they no longer stop a multiple ack.
    fn pop_settled(&mut self) {
        while self.unsettled.front().is_some_and(|&(_, settled)| settled) {
            self.unsettled.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use acemq_codec::{BasicAck, BasicConsume, BasicNack, BasicQos, BasicReject};

    use super::*;

    fn ack(tag: u64) -> Method {
        BasicAck {
            delivery_tag: tag,
            multiple: false,
        }
        .into()
    }

    fn delivered(tags: impl IntoIterator<Item = u64>) -> Settlements {
        let mut s = Settlements::default();
        for tag in tags {
            s.on_delivery(tag);
        }
        s
    }

    #[test]
    fn in_order_acks_are_held_and_go_out_as_one_multiple_ack() {
        let mut s = delivered(1..=5);
        for tag in 1..=5 {
            assert_eq!(s.on_send(&ack(tag)), Settle::Held);
        }
        assert_eq!(s.take_held(), Some(5));
        assert_eq!(s.take_held(), None);
    }

    #[test]
    fn an_ack_behind_an_unsettled_delivery_is_written_alone() {
        let mut s = delivered(1..=3);
        assert_eq!(s.on_send(&ack(2)), Settle::Write { flush_first: false });
        assert_eq!(s.take_held(), None, "1 is still with the application");
        // Once 1 is acked, the multiple ack can reach past 2 to 1 only: 3 is open.
        assert_eq!(s.on_send(&ack(1)), Settle::Held);
        assert_eq!(s.take_held(), Some(1));
        assert_eq!(s.on_send(&ack(3)), Settle::Held);
        assert_eq!(s.take_held(), Some(3));
    }

    #[test]
    fn a_held_ack_never_covers_a_delivery_still_being_handled() {
        let mut s = delivered(1..=4);
        assert_eq!(s.on_send(&ack(1)), Settle::Held);
        // 2 is slow; 3 and 4 are acked: written alone, not folded in.
        assert_eq!(s.on_send(&ack(3)), Settle::Write { flush_first: false });
        assert_eq!(s.on_send(&ack(4)), Settle::Write { flush_first: false });
        assert_eq!(s.take_held(), Some(1));
    }

    #[test]
    fn rejects_and_single_nacks_are_written_at_once_and_count_as_settled() {
        let mut s = delivered(1..=3);
        let reject: Method = BasicReject {
            delivery_tag: 1,
            requeue: true,
        }
        .into();
        assert_eq!(s.on_send(&reject), Settle::Write { flush_first: false });
        let nack: Method = BasicNack {
            delivery_tag: 2,
            multiple: false,
            requeue: false,
        }
        .into();
        assert_eq!(s.on_send(&nack), Settle::Write { flush_first: false });
        // 3 is now the oldest unsettled one.
        assert_eq!(s.on_send(&ack(3)), Settle::Held);
        assert_eq!(s.take_held(), Some(3));
    }

    #[test]
    fn a_multiple_nack_lets_the_held_acks_out_first() {
        let mut s = delivered(1..=4);
        assert_eq!(s.on_send(&ack(1)), Settle::Held);
        let nack: Method = BasicNack {
            delivery_tag: 3,
            multiple: true,
            requeue: true,
        }
        .into();
        assert_eq!(s.on_send(&nack), Settle::Write { flush_first: true });
        assert_eq!(s.take_held(), Some(1));
        assert_eq!(s.on_send(&ack(4)), Settle::Held);
    }

    #[test]
    fn other_methods_let_the_held_acks_out_first() {
        let mut s = delivered(1..=2);
        assert_eq!(s.on_send(&ack(1)), Settle::Held);
        let qos: Method = BasicQos {
            prefetch_size: 0,
            prefetch_count: 10,
            global: false,
        }
        .into();
        assert_eq!(s.on_send(&qos), Settle::Write { flush_first: true });
    }

    #[test]
    fn a_no_ack_consumer_turns_coalescing_off_for_the_channel() {
        let mut s = delivered(1..=2);
        assert_eq!(s.on_send(&ack(1)), Settle::Held);
        let consume: Method = BasicConsume {
            no_ack: true,
            ..Default::default()
        }
        .into();
        assert_eq!(s.on_send(&consume), Settle::Write { flush_first: true });
        assert_eq!(s.take_held(), Some(1));
        s.on_delivery(3);
        assert_eq!(s.on_send(&ack(2)), Settle::Write { flush_first: false });
        assert_eq!(s.take_held(), None);
    }

    #[test]
    fn hold_ack_holds_only_the_oldest_and_otherwise_changes_nothing() {
        let mut s = delivered(1..=3);
        assert!(!s.hold_ack(2), "1 is still open");
        assert_eq!(s.take_held(), None);
        assert!(s.hold_ack(1));
        // 2 was left as it was: still unsettled, so it is next.
        assert!(s.hold_ack(2));
        assert_eq!(s.take_held(), Some(2));
        s.turn_off();
        assert!(!s.hold_ack(3), "coalescing is off");
    }

    #[test]
    fn tags_that_do_not_rise_turn_coalescing_off() {
        let mut s = delivered([1, 2]);
        s.on_delivery(2);
        assert_eq!(s.on_send(&ack(1)), Settle::Write { flush_first: false });
    }
}
