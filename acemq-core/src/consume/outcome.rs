//! How a delivery ends: the settlement sent for it (an ack, or a nack that
//! hands it back to the broker) and the [`Outcome`] it is counted under in
//! `acemq_handled_total{outcome}` and recorded on its span. The end of a
//! delivery's path: the consumer task hands a delivery to
//! [`super::delivery`], which ends it here; the [`crate::Scheduler`]'s
//! deliveries are settled here too.
//!
//! Must never: send a settlement for a delivery whose connection has died
//! (its tag would be unknown on a new connection, which would close the
//! channel with 406): such a settlement is dropped and counted, and the
//! broker redelivers the message. The outcome labels are read by tests and
//! dashboards: never rename one.

use crate::amqp::{self, Delivery};
use crate::error::Error;

/// What became of one delivery of a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler accepted it (and any hop it asked for was confirmed);
    /// acked.
    Accepted,
    /// Republished for another attempt (back to its queue or onto a rung),
    /// then acked.
    Retried,
    /// Set aside in the dead letters (its attempts spent, or a fatal
    /// error), then acked.
    DeadLettered,
    /// Set aside in `{queue}.parked` (`Ack::park`), then acked.
    Parked,
    /// Set aside in the dead letters without reaching a handler (its
    /// properties or its body could not be decoded), then acked.
    Undecodable,
    /// Handed back to the broker unhandled: the consumer started closing
    /// before a handler slot was free.
    Returned,
    /// Handed back to the broker because its handling failed on the way: a
    /// held publish gave up (the consumer is closing, or the delivery's
    /// connection is gone), or a settlement could not be sent. Not counted
    /// in `acemq_handled_total`.
    Requeued,
}

impl Outcome {
    /// Its label: the `outcome` of `acemq_handled_total` and of the
    /// delivery's span.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Retried => "retried",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Parked => "parked",
            Outcome::Undecodable => "undecodable",
            Outcome::Returned => "returned",
            Outcome::Requeued => "requeued",
        }
    }

    /// Counts it in `acemq_handled_total{outcome}` (a requeue is not
    /// counted: the broker hands the message out again).
    pub(crate) fn count(self) {
        if self != Outcome::Requeued {
            crate::metrics_names::handled(self.as_str());
        }
    }
}

/// Acks `delivery` (see [`sent`]).
#[inline]
pub(crate) fn ack(delivery: &Delivery) -> Result<(), Error> {
    sent(delivery, delivery.ack())
}

/// Hands `delivery` back to the broker: a nack with requeue (see [`sent`]).
pub(crate) fn requeue(delivery: &Delivery) -> Result<(), Error> {
    sent(delivery, delivery.nack(true))
}

/// Checks that a settlement went to the driver. One for a delivery of a
/// connection that has since died cannot be sent (the tag would be unknown
/// on a new connection, which would close the channel with 406): it is
/// dropped and counted, and the broker redelivers the message.
fn sent(delivery: &Delivery, sent: Result<(), amqp::Error>) -> Result<(), Error> {
    match sent {
        Ok(()) => Ok(()),
        Err(_) if delivery.acker.connection_gone() => {
            metrics::counter!(crate::metrics_names::RECOVERY_TOTAL, "event" => "settlement_dropped").increment(1);
            tracing::debug!(
                delivery_tag = delivery.delivery_tag,
                "the delivery's connection is gone; its settlement is dropped and the broker redelivers it"
            );
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}
