//! Resolving a publish: what the broker's confirm means for the sender, the
//! wait for it (bounded by `blocked_timeout` of continuous block and by
//! `publish_timeout` otherwise), and how
//! each outcome is counted and logged. One place for both kinds of publish:
//! `Publisher`'s and the library's own hops (retries, rungs, set-asides).
//! It never writes a frame: it only judges what came back.

use std::pin::pin;
use std::time::Duration;

use acemq_codec::ShortString;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::amqp::{Confirmation, PublishConfirm};
use crate::error::Error;
use crate::metrics_names;

/// What the broker said about a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendResult {
    /// The broker has the message (false without confirms: nothing was promised).
    pub confirmed: bool,
    /// It reached a queue. Meaningful with `mandatory`; always true without
    /// confirms, because only the confirm proves no return is coming.
    pub routed: bool,
}

/// Counts a publish's outcome and logs it.
pub(crate) fn report(
    result: Result<&SendResult, &Error>,
    message_id: &str,
    exchange: &ShortString,
    routing_key: &ShortString,
) {
    let outcome = outcome_label(result);
    metrics_names::publish(outcome);
    match result {
        Ok(_) => {
            tracing::debug!(message_id, exchange = %exchange, routing_key = %routing_key, outcome, "published")
        }
        Err(err) => {
            tracing::warn!(message_id, exchange = %exchange, routing_key = %routing_key, outcome, %err, "publish failed")
        }
    }
}

/// The `outcome` label of `acemq_publish_total` for a publish's result.
pub(crate) fn outcome_label(result: Result<&SendResult, &Error>) -> &'static str {
    match result {
        Ok(SendResult { confirmed: false, .. }) => "unconfirmed",
        Ok(_) => "confirmed",
        Err(Error::PublishingPaused { .. }) => "refused",
        Err(Error::Unroutable { .. }) => "unroutable",
        Err(Error::Nacked { .. }) => "nacked",
        Err(_) => "failed",
    }
}

/// What the broker's confirmation means for the sender: an ack is a
/// confirmed, routed send; a nack and a return are errors naming the message.
pub(crate) fn resolve(
    confirmation: Confirmation,
    message_id: &str,
    exchange: &ShortString,
    routing_key: &ShortString,
) -> Result<SendResult, Error> {
    match confirmation {
        Confirmation::Ack => Ok(SendResult {
            confirmed: true,
            routed: true,
        }),
        Confirmation::Returned(ret) => Err(Error::Unroutable {
            message_id: message_id.to_string(),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            code: ret.reply_code,
            text: ret.reply_text.to_string(),
        }),
        Confirmation::Nack => Err(Error::Nacked {
            message_id: message_id.to_string(),
        }),
        Confirmation::NotRequested => Ok(SendResult {
            confirmed: false,
            routed: true,
        }),
    }
}

/// Waits for a confirm; gives up with [`Error::ConnectionBlocked`] once the
/// connection has been blocked for `blocked_timeout` without a break, and
/// with [`Error::NotConfirmed`] once it has waited `publish_timeout`
/// unblocked (counted afresh from the end of each block) for a broker that
/// does not answer.
pub(crate) async fn await_confirm(
    pending: PublishConfirm,
    blocked: &mut watch::Receiver<Option<String>>,
    timeouts: ConfirmTimeouts,
    message_id: &str,
) -> Result<Confirmation, Error> {
    let mut pending = pin!(pending);
    let mut block_started: Option<Instant> = None;
    let mut unblocked_since = Instant::now();
    loop {
        let is_blocked = blocked.borrow_and_update().is_some();
        block_started = match (is_blocked, block_started) {
            (true, None) => Some(Instant::now()),
            (true, started) => started,
            (false, Some(_)) => {
                unblocked_since = Instant::now();
                None
            }
            (false, None) => None,
        };
        let deadline = match block_started {
            Some(at) => at + timeouts.blocked,
            None => unblocked_since + timeouts.publish,
        };
        tokio::select! {
            // The confirm first: usually it is already there, and then the
            // block watch is never registered with.
            biased;
            result = &mut pending => return result.map_err(Error::from),
            changed = blocked.changed() => {
                if changed.is_err() {
                    // The connection is gone; the confirm future says how.
                    return pending.await.map_err(Error::from);
                }
            }
            _ = crate::time::sleep_until(Some(deadline)) => {
                return Err(match block_started {
                    Some(_) => Error::ConnectionBlocked {
                        message_id: message_id.to_string(),
                        waited: timeouts.blocked,
                    },
                    None => Error::NotConfirmed {
                        message_id: message_id.to_string(),
                        waited: timeouts.publish,
                    },
                });
            }
        }
    }
}

/// How long [`await_confirm`] waits: `blocked_timeout` of continuous
/// block, `publish_timeout` otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConfirmTimeouts {
    pub(crate) blocked: Duration,
    pub(crate) publish: Duration,
}

impl ConfirmTimeouts {
    pub(crate) fn of(config: &crate::config::Config) -> Self {
        ConfirmTimeouts {
            blocked: config.blocked_timeout,
            publish: config.publish_timeout,
        }
    }
}
