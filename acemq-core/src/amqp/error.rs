//! Errors of the low-level API: what the broker said, or what went wrong on
//! the way to it.

use std::sync::Arc;

use crate::proto::{CallError, CloseReason, CommandError, Refusal, Reply};

/// Why a [`super::CredentialsProvider`] gave no credentials. Its text is the
/// provider's own: never put the secret in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the credentials provider gave no credentials: {0}")]
pub struct CredentialsError(pub String);

/// An error from the low-level connection and channel API.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker closed the channel; the refusal carries its reply code and
    /// text (e.g. 404 NOT_FOUND, 406 PRECONDITION_FAILED). The channel is gone;
    /// the connection goes on.
    #[error("the broker closed the channel: {0}")]
    ChannelClosed(Refusal),
    /// The channel was closed (by us) or is not open.
    #[error("channel {0} is not open")]
    ChannelNotOpen(u16),
    /// The connection ended.
    #[error("the connection is closed: {0}")]
    ConnectionClosed(CloseReason),
    /// The socket failed.
    #[error("I/O error: {0}")]
    Io(#[source] Arc<std::io::Error>),
    /// The URL could not be parsed.
    #[error(transparent)]
    Url(#[from] super::url::UrlError),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] crate::io::TlsError),
    /// A TLS setting, or SASL EXTERNAL, was given with an `amqp://` URL:
    /// the connection would go in clear (the password with it), so it is
    /// not made. Use `amqps://`, or drop the setting.
    #[error("{setting} is set, but the URL is amqp:// (no TLS), which would send the credentials in clear: use amqps:// or remove the setting")]
    NotTls {
        /// What was set: `a TLS configuration` or `EXTERNAL authentication`.
        setting: &'static str,
    },
    /// The credentials provider ([`super::Config::credentials`]) gave no
    /// credentials, so the connection was not dialled.
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    /// The connection could not be set up in time.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// A command the engine refused (e.g. a value the wire cannot carry).
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The broker did not answer in time (`channel.open-ok`, or the
    /// `close-ok` of a close we asked for).
    #[error("the broker did not answer {waiting_for} within {after:?}")]
    NoReply {
        /// What was awaited.
        waiting_for: crate::proto::Wait,
        /// How long it was awaited.
        after: std::time::Duration,
    },
    /// The connection has left the protocol's state machine for raw frames
    /// (`Connection::raw`, with the `conformance` feature): its channels,
    /// publishes and calls are over, and a new one fails at once with this.
    #[error("the connection is raw: its frames are read and written by a RawConnection, not by the engine")]
    Raw,
    /// `Connection::raw` on a connection a `Conn` manages (its publishing
    /// or consuming connection): its recovery and consumers own it. Open an
    /// `amqp::Connection` of your own for raw frames.
    #[error("the connection belongs to a Conn and cannot go raw: open an amqp::Connection of your own for raw frames")]
    RawRefused,
    /// The broker answered something this call does not expect.
    #[error("unexpected reply: expected {expected}, got {}", .got.unwrap_or("no reply"))]
    UnexpectedReply {
        /// What the call waits for, e.g. `queue.declare-ok`.
        expected: &'static str,
        /// The method that came instead, or `None` for no reply at all.
        got: Option<&'static str>,
    },
}

impl Error {
    /// The reply code the broker gave, if this is a refusal by the broker.
    pub fn reply_code(&self) -> Option<u16> {
        match self {
            Error::ChannelClosed(r) => Some(r.code),
            Error::ConnectionClosed(CloseReason::ByServer(r)) => Some(r.code),
            Error::ConnectionClosed(CloseReason::ProtocolError { code, .. }) => Some(code.code()),
            _ => None,
        }
    }

    /// The refusal (code, text, method) if the broker refused something.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::ChannelClosed(r) | Error::ConnectionClosed(CloseReason::ByServer(r)) => Some(r),
            _ => None,
        }
    }
}

impl Error {
    /// [`Error::UnexpectedReply`]: `got` came (or nothing) where the call
    /// waits for `expected`.
    pub(crate) fn unexpected(expected: &'static str, got: Option<&Reply>) -> Error {
        Error::UnexpectedReply {
            expected,
            got: got.map(|reply| match reply {
                Reply::Method(method) => method.name(),
                Reply::Content(content) => content.method.name(),
            }),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl From<CallError> for Error {
    fn from(e: CallError) -> Self {
        match e {
            CallError::ChannelClosed(r) => Error::ChannelClosed(r),
            CallError::ConnectionClosed(r) => Error::ConnectionClosed(r),
            CallError::ChannelClosedByClient { channel } => Error::ChannelNotOpen(channel),
            CallError::TimedOut { waiting_for, after } => Error::NoReply { waiting_for, after },
        }
    }
}
