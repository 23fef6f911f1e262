//! Content assembly: a content-bearing method, its header, and its body
//! frames become one [`Content`].
//!
//! One assembler per channel; the caller routes frames by channel. Must never
//! trust the announced body size for an allocation.

use bytes::{Bytes, BytesMut};

use crate::frame::{ContentHeader, Frame, UndecodableHeader};
use crate::method::{BasicDeliver, Method};
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

/// What [`crate::FrameDecoder::decode_assembled`] did with the next frame.
/// Small on purpose: a finished message stays in its assembler until
/// [`ContentAssembler::take_complete`] moves it out, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// The next frame is not whole yet; `buf` has room reserved for it.
    NeedMore,
    /// The next frame is whole but not content for an assembler (a
    /// heartbeat, a frame on channel 0, a method without content, a channel
    /// the caller keeps no assembler for). Nothing was taken off `buf`:
    /// decode it with [`crate::FrameDecoder::decode`].
    Other,
    /// The frame went to the assembler of this channel; its message is not
    /// finished.
    Partial(u16),
    /// The frame finished a message on this channel: take it with
    /// [`ContentAssembler::take_complete`]. Until it is taken, the next
    /// frame for that channel is not decoded and this is reported again.
    Complete(u16),
}

/// Why [`crate::FrameDecoder::decode_assembled`] failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    /// The stream is corrupt, as for [`crate::FrameDecoder::decode`]: close
    /// the connection.
    #[error(transparent)]
    Decode(#[from] crate::Error),
    /// A sound frame broke the content sequence of its channel; that
    /// channel's assembler has been reset.
    #[error("channel {channel}: {error}")]
    Content {
        /// The channel the frame was on.
        channel: u16,
        /// What was wrong.
        error: ContentError,
    },
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

/// A message being assembled: its method, then its header, then its body.
/// Kept in place and filled in as frames arrive, field by field, so that
/// nothing large is moved more than once on the way in and once on the way
/// out.
#[derive(Debug)]
struct Partial {
    /// The method; `None` when no message is in progress.
    method: Option<Method>,
    /// The header, once it has arrived.
    header: Option<Result<ContentHeader, UndecodableHeader>>,
    body_size: u64,
    body: Body,
    /// Method, header and the whole body are in: the message waits to be
    /// taken.
    complete: bool,
}

/// How far a frame took the message in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// More frames to come.
    Partial,
    /// Finished; see [`ContentAssembler::take_complete`].
    Complete,
}

impl Partial {
    const IDLE: Partial = Partial {
        complete: false,
        method: None,
        header: None,
        body_size: 0,
        body: Body::Empty,
    };
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

    #[inline]
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
/// use acemq_codec::track::{Assembly, ContentAssembler};
/// use acemq_codec::{BasicDeliver, ContentHeader, Frame, BasicProperties};
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
    partial: Partial,
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
            partial: Partial::IDLE,
            max_body,
        }
    }

    /// Whether a message is partly assembled.
    pub fn in_progress(&self) -> bool {
        self.partial.method.is_some()
    }

    /// Forgets any partly assembled message (e.g. when the channel closes).
    pub fn reset(&mut self) {
        self.partial = Partial::IDLE;
    }

    /// Feeds the next frame of this channel. After an error the assembler is
    /// reset; the caller is expected to close the channel or connection.
    // Inlined into the caller, the frame is not copied into an argument
    // and the result not copied out: with frames of a couple of hundred
    // bytes, that is most of the assembler's cost.
    #[inline]
    pub fn push(&mut self, frame: Frame) -> Result<Assembly, ContentError> {
        self.step(frame).inspect_err(|_| self.reset())
    }

    #[inline]
    fn step(&mut self, frame: Frame) -> Result<Assembly, ContentError> {
        match frame {
            Frame::Method(_, method) => self.on_method(method),
            Frame::Header(_, header) => {
                let progress = self.on_header(Ok(header))?;
                Ok(self.assembly(progress))
            }
            Frame::UndecodableHeader(_, header) => {
                let progress = self.on_header(Err(header))?;
                Ok(self.assembly(progress))
            }
            Frame::Body(_, part) => {
                let progress = self.on_body(part)?;
                Ok(self.assembly(progress))
            }
            Frame::Heartbeat => {
                let expected = match &self.partial {
                    Partial { method: None, .. } => "method",
                    Partial { header: None, .. } => "content header",
                    _ => "content body",
                };
                Err(ContentError::UnexpectedFrame {
                    expected,
                    got: "heartbeat",
                })
            }
        }
    }

    /// A method frame: content-bearing ones start a message.
    #[inline(always)]
    fn on_method(&mut self, method: Method) -> Result<Assembly, ContentError> {
        if method.has_content() {
            self.begin(method)?;
            return Ok(Assembly::Partial);
        }
        self.expect_method()?;
        Ok(Assembly::Method(method))
    }

    /// Fails unless a method may come next: no message is in progress.
    #[inline(always)]
    fn expect_method(&self) -> Result<(), ContentError> {
        if self.partial.method.is_some() {
            let expected = if self.partial.header.is_some() {
                "content body"
            } else {
                "content header"
            };
            return Err(ContentError::UnexpectedFrame {
                expected,
                got: "method",
            });
        }
        Ok(())
    }

    /// Starts a message with a content-bearing method.
    #[inline(always)]
    pub(crate) fn begin(&mut self, method: Method) -> Result<Progress, ContentError> {
        self.expect_method()?;
        // Idle: header and body are already empty.
        self.partial.method = Some(method);
        Ok(Progress::Partial)
    }

    /// Starts a message with an empty `basic.deliver` for the decoder to
    /// fill in where it lies (see [`crate::FrameDecoder::decode_assembled`]);
    /// the caller resets the assembler if the arguments do not decode.
    #[inline(always)]
    pub(crate) fn begin_deliver(&mut self) -> Result<&mut BasicDeliver, ContentError> {
        self.expect_method()?;
        let method = self
            .partial
            .method
            .insert(Method::BasicDeliver(BasicDeliver::default()));
        match method {
            Method::BasicDeliver(deliver) => Ok(deliver),
            // Inserted just above.
            _ => unreachable!("a basic.deliver was inserted"),
        }
    }

    /// A body frame.
    #[inline(always)]
    pub(crate) fn on_body(&mut self, part: Bytes) -> Result<Progress, ContentError> {
        let partial = &mut self.partial;
        if partial.header.is_none() {
            let expected = if partial.method.is_some() {
                "content header"
            } else {
                "method"
            };
            return Err(ContentError::UnexpectedFrame {
                expected,
                got: "content body",
            });
        }
        let received = partial.body.len() as u64 + part.len() as u64;
        if received > partial.body_size {
            return Err(ContentError::BodyOverrun {
                body_size: partial.body_size,
                received,
            });
        }
        if let Body::Empty = partial.body {
            // The usual case: the whole body in one frame.
            partial.body = Body::One(part);
        } else {
            partial.body.push(part, partial.body_size);
        }
        if received == partial.body_size {
            partial.complete = true;
            Ok(Progress::Complete)
        } else {
            Ok(Progress::Partial)
        }
    }

    #[inline]
    /// A content header, decoded or not.
    pub(crate) fn on_header(
        &mut self,
        header: Result<ContentHeader, UndecodableHeader>,
    ) -> Result<Progress, ContentError> {
        let (header_class, body_size) = match &header {
            Ok(h) => (h.class_id, h.body_size),
            Err(h) => (h.class_id, h.body_size),
        };
        let max_body = self.max_body;
        let partial = &mut self.partial;
        let Some(method) = &partial.method else {
            return Err(ContentError::UnexpectedFrame {
                expected: "method",
                got: "content header",
            });
        };
        if partial.header.is_some() {
            return Err(ContentError::UnexpectedFrame {
                expected: "content body",
                got: "content header",
            });
        }
        let method_class = method.class_id();
        if header_class != method_class {
            return Err(ContentError::ClassMismatch {
                method_class,
                header_class,
            });
        }
        if body_size > max_body {
            return Err(ContentError::TooLarge {
                body_size,
                max: max_body,
            });
        }
        partial.header = Some(header);
        partial.body_size = body_size;
        if body_size == 0 {
            partial.complete = true;
            return Ok(Progress::Complete);
        }
        Ok(Progress::Partial)
    }

    /// What `push` reports for a frame's progress.
    #[inline(always)]
    fn assembly(&mut self, progress: Progress) -> Assembly {
        match progress {
            Progress::Partial => Assembly::Partial,
            Progress::Complete => match self.take_complete() {
                Some(content) => Assembly::Complete(content),
                // Complete means a method, a header and the whole body.
                None => Assembly::Partial,
            },
        }
    }

    /// Whether a finished message waits to be taken (see
    /// [`ContentAssembler::take_complete`]).
    pub fn has_complete(&self) -> bool {
        self.partial.complete
    }

    /// The finished message, moved out, and the assembler back to idle; or
    /// `None` if no message is finished. For
    /// [`crate::FrameDecoder::decode_assembled`]; [`ContentAssembler::push`]
    /// hands messages over itself.
    #[inline(always)]
    pub fn take_complete(&mut self) -> Option<Content> {
        let partial = &mut self.partial;
        if !partial.complete {
            return None;
        }
        partial.complete = false;
        if partial.method.is_none() || partial.header.is_none() {
            // `complete` is only set with a method and a header in place.
            *partial = Partial::IDLE;
            return None;
        }
        let body = std::mem::replace(&mut partial.body, Body::Empty).into_bytes();
        partial.body_size = 0;
        // Each part moved once, straight into the message.
        Some(Content {
            method: partial.method.take()?,
            header: partial.header.take()?,
            body,
        })
    }
}
