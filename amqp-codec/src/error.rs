//! The public error types of the codec.
//!
//! nom never appears here: parsers inside the crate are nom parsers whose
//! error carries a [`DecodeErrorKind`], and it is turned into [`Error`] at the
//! crate boundary. Every variant says what was wrong in terms of the protocol, so the caller can choose the right
//! reply code (see [`Error::reply_code`]).

use crate::reply_code::ReplyCode;

/// Why a frame or a value could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// More bytes are needed before a frame can be decoded; `needed` is how
    /// many more at least. Only the streaming frame decoder ever asks for more: a
    /// short payload inside a complete frame is [`Error::Malformed`].
    #[error("incomplete input: {needed} more bytes needed")]
    Incomplete {
        /// How many more bytes are needed at least.
        needed: usize,
    },
    /// The 8 bytes at the start of a connection are not `AMQP 0 0 9 1`.
    #[error("bad protocol header {found:02x?}, expected AMQP 0-9-1")]
    BadProtocolHeader {
        /// The 8 bytes received.
        found: [u8; 8],
    },
    /// The frame's declared size exceeds the negotiated `frame_max`. Raised
    /// from the 7-byte header alone, before the payload is buffered.
    #[error("frame of {size} bytes exceeds frame_max {frame_max}")]
    FrameTooLarge {
        /// The total frame size the header announces (header, payload and end byte).
        size: u64,
        /// The negotiated limit.
        frame_max: u32,
    },
    /// The byte after the payload is not `0xCE`.
    #[error("frame end byte is {found:#04x}, expected 0xce")]
    BadFrameEnd {
        /// The byte found where `0xCE` should be.
        found: u8,
    },
    /// The frame type octet is not one of method (1), header (2), body (3) or
    /// heartbeat (8).
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// A complete frame whose payload does not parse: a short or over-long
    /// payload, a length that points past its container, a bad value.
    #[error("malformed {context}: {kind}")]
    Malformed {
        /// What was being decoded (`"basic.deliver"`, `"content header"`, ...).
        context: &'static str,
        /// What was wrong with it.
        kind: DecodeErrorKind,
    },
    /// A method frame whose class and method ids name no AMQP 0-9-1 method.
    #[error("unknown method {class}.{method}")]
    UnknownMethod {
        /// The class id.
        class: u16,
        /// The method id.
        method: u16,
    },
}

impl Error {
    /// The AMQP reply code a peer should close the connection with when it
    /// receives input that fails this way (all of them are hard errors).
    pub fn reply_code(&self) -> ReplyCode {
        match self {
            Error::UnknownMethod { .. } => ReplyCode::CommandInvalid,
            Error::Malformed { .. } => ReplyCode::SyntaxError,
            _ => ReplyCode::FrameError,
        }
    }
}

/// What exactly went wrong inside a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The payload ended before the value did.
    #[error("payload too short")]
    Truncated,
    /// Bytes were left over after the last field.
    #[error("{0} unexpected trailing bytes")]
    TrailingBytes(usize),
    /// A field value carries a type code RabbitMQ does not define.
    #[error("unknown field type {:?}", char::from(*.0))]
    UnknownFieldType(u8),
    /// Tables and arrays nest deeper than the configured limit.
    #[error("field values nested deeper than {0} levels")]
    NestingTooDeep(usize),
    /// A length prefix is larger than what is left of its container.
    #[error("length {0} runs past the end of its container")]
    BadLength(u64),
    /// A content header's property flags set bits that the class does not
    /// define (including the continuation bit).
    #[error("property flags {0:#06x} set undefined bits")]
    BadPropertyFlags(u16),
    /// A content header for a class that carries no content.
    #[error("class {0} has no content")]
    NoContentClass(u16),
    /// A heartbeat frame on a channel other than 0, or with a payload.
    #[error("heartbeat frame must be empty and on channel 0")]
    BadHeartbeat,
}

/// Why a value could not be encoded. Encoding only fails on values that the
/// wire cannot carry; well-formed values always encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A short string longer than 255 bytes.
    #[error("short string of {0} bytes is longer than 255")]
    ShortStringTooLong(usize),
    /// A long string, table, array or payload longer than `u32::MAX` bytes.
    #[error("value of {0} bytes is longer than a 32-bit length allows")]
    TooLong(usize),
    /// A frame whose size would exceed the `frame_max` given to the encoder.
    #[error("frame of {size} bytes exceeds frame_max {frame_max}")]
    FrameTooLarge {
        /// The total frame size.
        size: usize,
        /// The limit.
        frame_max: u32,
    },
    /// `frame_max` is too small to carry any body bytes.
    #[error("frame_max {0} leaves no room for a body")]
    FrameMaxTooSmall(u32),
}
