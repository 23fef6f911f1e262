//! The acemq API's error: one type, with kinds a caller can match, and
//! messages that say what happened and what to do about it.

use std::time::Duration;

use crate::amqp;
use crate::proto::CloseReason;

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
    },
    /// The connection is closed.
    #[error("the connection is closed: {0}")]
    Closed(CloseReason),
    /// The network or TLS failed, or the URL is wrong.
    #[error("connection error: {0}")]
    Io(String),
    /// The payload could not be encoded.
    #[error("could not encode the payload: {0}")]
    Encode(String),
    /// The payload could not be decoded.
    #[error("could not decode the payload: {0}")]
    Decode(String),
    /// A declaration or option that cannot work, refused before asking the broker.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl Error {
    /// Whether this is [`Error::PublishingPaused`] or [`Error::ConnectionBlocked`].
    pub fn is_blocked(&self) -> bool {
        matches!(self, Error::PublishingPaused { .. } | Error::ConnectionBlocked { .. })
    }
}

/// Whether `err` says the broker has blocked publishing (see [`Error::is_blocked`]).
pub fn is_blocked(err: &Error) -> bool {
    err.is_blocked()
}

impl From<amqp::Error> for Error {
    fn from(e: amqp::Error) -> Self {
        match e {
            amqp::Error::ChannelClosed(r) => Error::Refused {
                code: r.code,
                text: r.text,
            },
            amqp::Error::ConnectionClosed(reason) => Error::Closed(reason),
            amqp::Error::ChannelNotOpen(ch) => Error::Io(format!("channel {ch} is not open")),
            other => Error::Io(other.to_string()),
        }
    }
}
