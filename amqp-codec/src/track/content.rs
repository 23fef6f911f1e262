//! Content assembly: a content-bearing method, its header, and its body
//! frames become one [`Content`].
//!
//! One assembler per channel; the caller routes frames by channel. Must never
//! trust the announced body size for an allocation.

use bytes::{Bytes, BytesMut};

use crate::frame::{ContentHeader, Frame, UndecodableHeader};
use crate::method::Method;
use crate::reply_code::ReplyCode;

/// RabbitMQ's default `max_message_size` (128 MiB).
pub const DEFAULT_MAX_BODY: u64 = 128 * 1024 * 1024;

/// A whole message: the method that carried it, its header, and the body.
#[derive(Debug, Clone, PartialEq)]
pub struct Content {
    /// `basic.publish`, `basic.deliver`, `basic.get-ok` or `basic.return`.
    pub method: Method,
    /// The decoded header, or the raw header if its properties could not be
    /// decoded (the message can then be set aside; see [`UndecodableHeader`]).
    pub header: Result<ContentHeader, UndecodableHeader>,
    /// The body: a zero-copy slice when it came in one frame.
    pub body: Bytes,
}

/// What one frame did to the assembler.
#[derive(Debug, Clone, PartialEq)]
// Boxing the header would cost an allocation per message on the hot path;
// moving a few hundred bytes is cheaper.
#[allow(clippy::large_enum_variant)]
pub enum Assembly {
    /// A method without content: nothing to assemble, here it is.
    Method(Method),
    /// Part of a message; more frames to come.
    Partial,
    /// The last frame of a message.
    Complete(Content),
}

/// A frame that breaks the content sequence. All of these are connection
/// errors in RabbitMQ except [`ContentError::TooLarge`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContentError {
    /// A frame arrived that the sequence does not allow here.
    #[error("unexpected {got} frame, expected {expected}")]
    UnexpectedFrame {
        /// What was expected.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
    /// The header's class is not the method's class.
    #[error("content header for class {header_class} after a class {method_class} method")]
    ClassMismatch {
        /// The method's class.
        method_class: u16,
        /// The header's class.
        header_class: u16,
    },
    /// The header announces a body larger than the limit.
    #[error("message body of {body_size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// The announced size.
        body_size: u64,
        /// The limit.
        max: u64,
    },
    /// Body frames carry more bytes than the header announced.
    #[error("body frames carry {received} bytes, header announced {body_size}")]
    BodyOverrun {
        /// The announced size.
        body_size: u64,
        /// The bytes received so far, including the frame that overran.
        received: u64,
    },
}

impl ContentError {
    /// The reply code RabbitMQ closes with for this error.
    pub fn reply_code(&self) -> ReplyCode {
        match self {
            ContentError::TooLarge { .. } => ReplyCode::PreconditionFailed,
            ContentError::ClassMismatch { .. } => ReplyCode::CommandInvalid,
            _ => ReplyCode::UnexpectedFrame,
        }
    }
}

#[derive(Debug, Default)]
// Boxing the header would cost an allocation per message on the hot path;
// moving a few hundred bytes is cheaper.
#[allow(clippy::large_enum_variant)]
enum State {
    #[default]
    Idle,
    ExpectHeader(Method),
    ExpectBody {
        method: Method,
        header: Result<ContentHeader, UndecodableHeader>,
        body: Body,
    },
}

#[derive(Debug)]
enum Body {
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Empty => 0,
            Body::One(b) => b.len(),
            Body::Many(b) => b.len(),
        }
    }

    fn push(&mut self, part: Bytes, body_size: u64) {
        *self = match std::mem::replace(self, Body::Empty) {
            Body::Empty => Body::One(part),
            Body::One(first) => {
                // Grow with what has arrived, never with what was announced.
                let announced = usize::try_from(body_size).unwrap_or(usize::MAX);
                let mut all = BytesMut::with_capacity(announced.min(first.len() * 4 + part.len()));
                all.extend_from_slice(&first);
                all.extend_from_slice(&part);
                Body::Many(all)
            }
            Body::Many(mut all) => {
                all.extend_from_slice(&part);
                Body::Many(all)
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Body::Empty => Bytes::new(),
            Body::One(b) => b,
            Body::Many(b) => b.freeze(),
        }
    }
}

/// Assembles the messages of one channel.
///
/// ```
/// use amqp_codec::track::{Assembly, ContentAssembler};
/// use amqp_codec::{BasicDeliver, ContentHeader, Frame, BasicProperties};
/// let mut channel = ContentAssembler::new();
/// let deliver = BasicDeliver { delivery_tag: 1, ..Default::default() };
/// assert_eq!(channel.push(Frame::Method(1, deliver.into())).unwrap(), Assembly::Partial);
/// let header = ContentHeader::basic(5, BasicProperties::default());
/// assert_eq!(channel.push(Frame::Header(1, header)).unwrap(), Assembly::Partial);
/// let Assembly::Complete(msg) = channel.push(Frame::Body(1, "hello".into())).unwrap() else { panic!() };
/// assert_eq!(&msg.body[..], b"hello");
/// ```
#[derive(Debug)]
pub struct ContentAssembler {
    state: State,
    max_body: u64,
}

impl Default for ContentAssembler {
    fn default() -> Self {
        ContentAssembler::new()
    }
}

impl ContentAssembler {
    /// An assembler with RabbitMQ's default body limit.
    pub fn new() -> Self {
        ContentAssembler::with_max_body(DEFAULT_MAX_BODY)
    }

    /// An assembler that refuses bodies larger than `max_body` bytes.
    pub fn with_max_body(max_body: u64) -> Self {
        ContentAssembler {
            state: State::Idle,
            max_body,
        }
    }

    /// Whether a message is partly assembled.
    pub fn in_progress(&self) -> bool {
        !matches!(self.state, State::Idle)
    }

    /// Forgets any partly assembled message (e.g. when the channel closes).
    pub fn reset(&mut self) {
        self.state = State::Idle;
    }

    /// Feeds the next frame of this channel. After an error the assembler is
    /// reset; the caller is expected to close the channel or connection.
    pub fn push(&mut self, frame: Frame) -> Result<Assembly, ContentError> {
        let result = self.step(frame);
        if result.is_err() {
            self.state = State::Idle;
        }
        result
    }

    fn step(&mut self, frame: Frame) -> Result<Assembly, ContentError> {
        match (std::mem::take(&mut self.state), frame) {
            (State::Idle, Frame::Method(_, method)) => {
                if method.has_content() {
                    self.state = State::ExpectHeader(method);
                    Ok(Assembly::Partial)
                } else {
                    Ok(Assembly::Method(method))
                }
            }
            (State::Idle, other) => Err(unexpected("method", &other)),
            (State::ExpectHeader(method), Frame::Header(_, header)) => {
                let (class, size) = (header.class_id, header.body_size);
                self.after_header(method, Ok(header), class, size)
            }
            (State::ExpectHeader(method), Frame::UndecodableHeader(_, header)) => {
                let (class, size) = (header.class_id, header.body_size);
                self.after_header(method, Err(header), class, size)
            }
            (State::ExpectHeader(_), other) => Err(unexpected("content header", &other)),
            (
                State::ExpectBody {
                    method,
                    header,
                    mut body,
                },
                Frame::Body(_, part),
            ) => {
                let body_size = body_size_of(&header);
                let received = body.len() as u64 + part.len() as u64;
                if received > body_size {
                    return Err(ContentError::BodyOverrun { body_size, received });
                }
                body.push(part, body_size);
                if received == body_size {
                    Ok(Assembly::Complete(Content {
                        method,
                        header,
                        body: body.into_bytes(),
                    }))
                } else {
                    self.state = State::ExpectBody { method, header, body };
                    Ok(Assembly::Partial)
                }
            }
            (State::ExpectBody { .. }, other) => Err(unexpected("content body", &other)),
        }
    }

    fn after_header(
        &mut self,
        method: Method,
        header: Result<ContentHeader, UndecodableHeader>,
        header_class: u16,
        body_size: u64,
    ) -> Result<Assembly, ContentError> {
        if header_class != method.class_id() {
            return Err(ContentError::ClassMismatch {
                method_class: method.class_id(),
                header_class,
            });
        }
        if body_size > self.max_body {
            return Err(ContentError::TooLarge {
                body_size,
                max: self.max_body,
            });
        }
        if body_size == 0 {
            return Ok(Assembly::Complete(Content {
                method,
                header,
                body: Bytes::new(),
            }));
        }
        self.state = State::ExpectBody {
            method,
            header,
            body: Body::Empty,
        };
        Ok(Assembly::Partial)
    }
}

fn body_size_of(header: &Result<ContentHeader, UndecodableHeader>) -> u64 {
    match header {
        Ok(h) => h.body_size,
        Err(h) => h.body_size,
    }
}

fn unexpected(expected: &'static str, got: &Frame) -> ContentError {
    let got = match got {
        Frame::Method(..) => "method",
        Frame::Header(..) | Frame::UndecodableHeader(..) => "content header",
        Frame::Body(..) => "content body",
        Frame::Heartbeat => "heartbeat",
    };
    ContentError::UnexpectedFrame { expected, got }
}
