//! The acemq API's error: one type, with kinds a caller can match, and
//! messages that say what happened and what to do about it. Each variant is
//! one kind of failure and keeps its cause as `source()`; nothing is
//! flattened into a string, and `Io` is only ever a failed socket.

use std::sync::Arc;
use std::time::Duration;

use crate::amqp;
use crate::amqp::{CloseReason, Refusal};
use crate::codec::CodecError;

/// An error from the acemq API.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker has blocked the publishing connection (it is low on memory
    /// or disk); the message was not written. Shed load, buffer, or fail the
    /// request; publishing resumes when the broker unblocks.
    #[error("publishing is paused: the broker blocked the connection ({reason}); the message was not sent")]
    PublishingPaused {
        /// The broker's reason, e.g. `low on memory`.
        reason: String,
    },
    /// The connection's publish buffer stayed full for the whole
    /// `publish_timeout`: the socket took less than was published (the
    /// broker reads slowly or not at all). The message was not written.
    #[error("publishing is held back: the connection's publish buffer stayed full for {waited:?} (the broker reads less than is published); the message was not sent")]
    PublishBufferFull {
        /// How long it waited for room.
        waited: Duration,
    },
    /// The message was written, then the broker blocked the connection and
    /// stayed blocked for `blocked_timeout` before confirming it. It may or
    /// may not have arrived.
    #[error("message {message_id} was sent but the broker stayed blocked for {waited:?} without confirming it; it may or may not have arrived")]
    ConnectionBlocked {
        /// The message.
        message_id: String,
        /// How long the block lasted.
        waited: Duration,
    },
    /// The message was written and the connection stayed up and unblocked,
    /// but the broker did not confirm it within `publish_timeout` (a broker
    /// that stays connected but stopped answering: a quorum queue that lost
    /// its majority does this). It may or may not have arrived.
    #[error("message {message_id} was sent but the broker did not confirm it within {waited:?}; it may or may not have arrived")]
    NotConfirmed {
        /// The message.
        message_id: String,
        /// How long the confirm was awaited.
        waited: Duration,
    },
    /// A mandatory message reached no queue; the broker dropped it.
    #[error("message {message_id} to exchange {exchange:?} with key {routing_key:?} reached no queue ({code} {text}); the broker dropped it")]
    Unroutable {
        /// The message.
        message_id: String,
        /// The exchange it was published to.
        exchange: String,
        /// The routing key.
        routing_key: String,
        /// The reply code (312 NO_ROUTE).
        code: u16,
        /// The reply text.
        text: String,
    },
    /// The broker refused to take the message (`basic.nack`), e.g. a full
    /// queue with `x-overflow=reject-publish`. It was not stored.
    #[error("the broker refused message {message_id} (basic.nack); it was not stored")]
    Nacked {
        /// The message.
        message_id: String,
    },
    /// The broker refused an operation and closed the channel, e.g. 404 for
    /// a missing exchange or 406 for an inequivalent declaration.
    #[error("the broker refused: {code} {text}")]
    Refused {
        /// The reply code.
        code: u16,
        /// The reply text.
        text: String,
        /// The class of the method it refused (0 if it did not say).
        class_id: u16,
        /// The method it refused (0 if it did not say).
        method_id: u16,
    },
    /// The connection is closed; the reason says who closed it
    /// ([`CloseReason::initiator`]).
    #[error("the connection is closed: {0}")]
    Closed(CloseReason),
    /// The socket failed.
    #[error("I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The engine below the acemq API failed in a way that is not the
    /// broker's refusal nor a closed connection: a bad URL, TLS, a timeout,
    /// a channel that is no longer open, a reply the call did not expect.
    #[error("{0}")]
    Engine(#[source] amqp::Error),
    /// The payload could not be encoded.
    #[error("could not encode the payload: {0}")]
    Encode(#[source] CodecError),
    /// The payload could not be decoded.
    #[error("could not decode the payload: {0}")]
    Decode(#[source] CodecError),
    /// A consumer's task ended abnormally (it panicked outside a handler, or
    /// its runtime went away).
    #[error("the consumer task failed: {0}")]
    ConsumerFailed(#[source] Arc<tokio::task::JoinError>),
    /// The library channel, which every library publish goes through, is
    /// not in confirm mode, so a publish could not be confirmed.
    #[error("the library channel is not in confirm mode; message {message_id} was not confirmed")]
    LibraryChannelUnconfirmed {
        /// The message.
        message_id: String,
    },
    /// The connection was lost and did not come back within
    /// `publish_timeout`. With `may_have_arrived`, the message had been
    /// written before the loss and the broker may have it; without, it was
    /// never written.
    #[error("the connection was lost and not recovered in time; the message {}", if *may_have_arrived { "may or may not have arrived" } else { "was not sent" })]
    ConnectionLost {
        /// Whether an earlier write of the message may have reached the broker.
        may_have_arrived: bool,
    },
    /// Recovery of a connection gave up (`recovery_give_up`).
    #[error("recovery of the {which} connection gave up after {attempts} attempts: {last_error}")]
    RecoveryGaveUp {
        /// `publish` or `consume`.
        which: &'static str,
        /// How many redials were tried.
        attempts: u32,
        /// Why the last one failed ([`Error::Closed`] with the reason of
        /// the loss, if none was tried); also the error's `source()`.
        #[source]
        last_error: Arc<Error>,
    },
    /// The broker cancelled the consumer (its queue was deleted, or a
    /// stream or quorum queue lost its leader) or closed its channel, and
    /// the consumer was built to end then ([`crate::OnCancel::End`]).
    #[error("the broker cancelled the consumer of {queue}: {reason}")]
    ConsumerCancelled {
        /// The queue.
        queue: String,
        /// The broker's reason (its reply code and text for a closed channel).
        reason: String,
    },
    /// A pending send that had already given its answer was polled again.
    #[error("a pending send was polled after it completed")]
    PolledAfterCompletion,
    /// No reply to a request came within its timeout
    /// ([`crate::Requester::request`]). The request may still be handled;
    /// a reply that comes later is dropped.
    #[error("no reply to request {correlation_id} within {waited:?}; it may or may not have been handled")]
    RequestTimedOut {
        /// The request's correlation-id.
        correlation_id: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The channel a request's reply would have come on closed (the
    /// connection was lost) before the reply came. The request may or may
    /// not have been handled; the next request opens a new reply channel.
    #[error("the reply channel of request {correlation_id} closed before its reply came ({reason}); it may or may not have been handled")]
    ReplyChannelLost {
        /// The request's correlation-id.
        correlation_id: String,
        /// Why the channel closed.
        reason: String,
    },
    /// A declaration or option that cannot work, refused before asking the broker.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A scheduled send (`send_at`, `send_after`) further ahead than the
    /// delay ladder holds: 2^28 − 1 s, about 8.5 years. Nothing was sent.
    #[error("message {message_id} was not sent: a delay of {requested_secs} s is beyond the delay ladder's longest, {max_secs} s (2^28 - 1 s, about 8.5 years)")]
    DelayTooLong {
        /// The message.
        message_id: String,
        /// The delay asked for, whole seconds rounded up.
        requested_secs: u64,
        /// The longest delay there is.
        max_secs: u64,
    },
    /// A send's properties ([`crate::properties::Outgoing`]) are ones the
    /// broker would refuse or misread (see [`crate::properties::PropertyError`]).
    /// Nothing was sent.
    #[error("the message was not sent: {0}")]
    InvalidProperties(#[source] crate::properties::PropertyError),
}

impl Error {
    /// Whether this is [`Error::PublishingPaused`] or [`Error::ConnectionBlocked`].
    pub fn is_blocked(&self) -> bool {
        matches!(self, Error::PublishingPaused { .. } | Error::ConnectionBlocked { .. })
    }
}

/// Whether `err` means the connection went away under a call (rather than
/// a refusal by the broker, or a close we asked for): a call that failed so
/// can be made again once the connection is back.
pub(crate) fn is_loss(err: &Error) -> bool {
    match err {
        Error::Closed(reason) => *reason != CloseReason::ByClient,
        Error::Io(_) => true,
        Error::Engine(amqp::Error::ChannelNotOpen(_)) => true,
        _ => false,
    }
}

/// Whether `err` says the broker did not answer a call in time: on a
/// connection recovery has just made, the attempt failed (it is closed and
/// tried again), rather than one declaration or consumer.
pub(crate) fn is_silence(err: &Error) -> bool {
    matches!(err, Error::Engine(amqp::Error::NoReply { .. }))
}

/// Whether `err` says the broker has blocked publishing (see [`Error::is_blocked`]).
pub fn is_blocked(err: &Error) -> bool {
    err.is_blocked()
}

impl Error {
    /// The broker's refusal as a [`Refusal`], if this is [`Error::Refused`].
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused {
                code,
                text,
                class_id,
                method_id,
            } => Some(Refusal {
                code: *code,
                text: text.clone(),
                class_id: *class_id,
                method_id: *method_id,
            }),
            _ => None,
        }
    }
}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Self {
        Error::Refused {
            code: r.code,
            text: r.text,
            class_id: r.class_id,
            method_id: r.method_id,
        }
    }
}

impl From<amqp::Error> for Error {
    fn from(e: amqp::Error) -> Self {
        match e {
            amqp::Error::ChannelClosed(r) => r.into(),
            amqp::Error::ConnectionClosed(reason) => Error::Closed(reason),
            amqp::Error::Io(io) => Error::Io(io),
            other => Error::Engine(other),
        }
    }
}
