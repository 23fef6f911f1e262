//! What a handler says about a message (`Ack`), and fatal errors.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

/// A boxed error from a handler.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A handler's verdict on one message.
#[derive(Debug)]
pub enum Ack {
    /// Done: acknowledge it.
    Accept,
    /// Failed: try again as the retry policy says (a fatal error, see
    /// [`fatal`], is dead-lettered at once).
    Retry(BoxError),
    /// Set it aside in `{queue}.parked` with this reason, for a person to look at.
    Park(String),
    /// Done, with an output: it is published (a library hop: mandatory,
    /// confirmed) to the consumer's `.then(...)` destination, or to the next
    /// step of the message's routing slip, and only then is the input acked
    /// (statement 24 of `docs/statements.md`).
    Then(Output),
    /// Done, with a reply to the request: it is published (a library
    /// publish: confirmed) to the default exchange with the request's
    /// `reply-to` as routing key and its correlation-id, and only then is
    /// the request acked. A request whose `reply-to` is not a direct
    /// reply-to name (`amq.rabbitmq.reply-to.*`), or a queue the reply
    /// allows ([`Ack::reply_named`]), is a fatal error of the request
    /// (statements 34 and 43 of `docs/statements.md`).
    Reply(ReplyOutput),
}

/// The reply of [`Ack::reply`]: an encoded body, its content type, and the
/// named reply queues it may go to.
pub struct ReplyOutput {
    pub(crate) output: Output,
    pub(crate) named: Option<Arc<NamedReplyQueues>>,
}

/// Which named queues a reply may go to (see [`Ack::reply_named`]).
pub(crate) type NamedReplyQueues = dyn Fn(&str) -> bool + Send + Sync;

impl fmt::Debug for ReplyOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplyOutput")
            .field("output", &self.output)
            .field("named_queues_allowed", &self.named.is_some())
            .finish()
    }
}

/// The output of [`Ack::then`]: an encoded body and its content type.
#[derive(Debug)]
pub struct Output {
    pub(crate) body: Result<Bytes, crate::codec::CodecError>,
    pub(crate) content_type: String,
}

impl Ack {
    /// Done: acknowledge it.
    pub fn accept() -> Ack {
        Ack::Accept
    }

    /// Failed with `err`: try again as the retry policy says.
    pub fn retry(err: impl Into<BoxError>) -> Ack {
        Ack::Retry(err.into())
    }

    /// Set it aside in `{queue}.parked`.
    pub fn park(reason: impl Into<String>) -> Ack {
        Ack::Park(reason.into())
    }

    /// Done; publish `output` (JSON) onward, then acknowledge. An output
    /// that does not encode is a fatal error of the input.
    pub fn then<O: serde::Serialize>(output: &O) -> Ack {
        Ack::Then(Output {
            body: serde_json::to_vec(output)
                .map(Bytes::from)
                .map_err(crate::codec::CodecError::new),
            content_type: "application/json".into(),
        })
    }

    /// Done; publish `output` (JSON) as the reply to this request, then
    /// acknowledge. The reply goes only to a direct reply-to name (what a
    /// [`crate::Requester`] sends); a request without one is a fatal error.
    /// An output that does not encode is a fatal error of the request.
    pub fn reply<O: serde::Serialize>(output: &O) -> Ack {
        Ack::Reply(ReplyOutput {
            output: json_output(output),
            named: None,
        })
    }

    /// [`Ack::reply`] with a body already encoded.
    pub fn reply_bytes(body: impl Into<Bytes>, content_type: &str) -> Ack {
        Ack::Reply(ReplyOutput {
            output: Output {
                body: Ok(body.into()),
                content_type: content_type.into(),
            },
            named: None,
        })
    }

    /// [`Ack::reply`], allowing also a `reply-to` that names a queue, when
    /// `allow` accepts its name (a request's `reply-to` is written by its
    /// producer: say which queues a reply may go to). A reply to a named
    /// queue is mandatory; if the queue is gone, the reply is dropped and
    /// the request acked.
    pub fn reply_named<O: serde::Serialize>(output: &O, allow: impl Fn(&str) -> bool + Send + Sync + 'static) -> Ack {
        Ack::Reply(ReplyOutput {
            output: json_output(output),
            named: Some(Arc::new(allow)),
        })
    }

    /// [`Ack::then`] with a body already encoded.
    pub fn then_bytes(body: impl Into<Bytes>, content_type: &str) -> Ack {
        Ack::Then(Output {
            body: Ok(body.into()),
            content_type: content_type.into(),
        })
    }
}

fn json_output<O: serde::Serialize>(output: &O) -> Output {
    Output {
        body: serde_json::to_vec(output)
            .map(Bytes::from)
            .map_err(crate::codec::CodecError::new),
        content_type: "application/json".into(),
    }
}

/// An error that will not improve with retrying: a message failing with it
/// goes to `{queue}.dlq` at once.
#[derive(Debug)]
pub struct Fatal(pub BoxError);

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Fatal {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// Marks `err` as fatal (see [`Fatal`]).
pub fn fatal(err: impl Into<BoxError>) -> Fatal {
    Fatal(err.into())
}

/// Whether `err`, or anything in its `source()` chain, is [`Fatal`].
pub fn is_fatal(err: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(err);
    while let Some(e) = current {
        if e.is::<Fatal>() {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("while saving the order")
        }
    }
    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(self.0.as_ref())
        }
    }

    #[test]
    fn is_fatal_sees_through_wrapping() {
        let inner = fatal("no customer on this order");
        assert!(is_fatal(&inner));
        let wrapped = Wrapper(Box::new(inner));
        assert!(is_fatal(&wrapped));
        let twice = Wrapper(Box::new(Wrapper(Box::new(fatal("x")))));
        assert!(is_fatal(&twice));
        assert!(!is_fatal(&Wrapper("plain".into())));
    }
}
