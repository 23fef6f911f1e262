//! Frames: the protocol header, method, content header, body and heartbeat
//! frames, the streaming frame decoder, and the encoders (those for
//! messages a server passes on, from stored property bytes, in `stored`).
//!
//! ```text
//! frame = type:u8 channel:u16 size:u32 payload[size] 0xCE
//! ```

mod decoder;
mod header;
mod publish;
mod stored;

use bytes::{BufMut, Bytes, BytesMut};

pub use decoder::{decode_frame, AckFrame, FrameDecoder};
// What `track`'s `FrameDecoder::decode_assembled` shares with the decoder.
pub(crate) use decoder::{check_end, malformed_deliver, split_frame, touch_ahead, BASIC_DELIVER_IDS, MAX_RESERVE};
pub(crate) use header::{check_content_header, PROPERTIES_AT};
pub use header::{ContentHeader, UndecodableHeader};
pub use publish::{PropertiesRef, PublishEncoder};
pub use stored::{encode_content_raw, encode_delivery, DeliverRef};

use crate::error::EncodeError;
use crate::method::Method;
use crate::properties::BasicProperties;

/// The frame type of a method frame.
pub const FRAME_METHOD: u8 = 1;
/// The frame type of a content header frame.
pub const FRAME_HEADER: u8 = 2;
/// The frame type of a content body frame.
pub const FRAME_BODY: u8 = 3;
/// The frame type of a heartbeat frame.
pub const FRAME_HEARTBEAT: u8 = 8;
/// The byte every frame ends with.
pub const FRAME_END: u8 = 0xCE;
/// Bytes a frame adds around its payload: 7 of header, 1 end byte.
pub const FRAME_OVERHEAD: usize = 8;
/// The smallest `frame_max` a peer must accept, and the limit before `tune`.
pub const FRAME_MIN_SIZE: u32 = 4096;
/// RabbitMQ's default `frame_max`.
pub const DEFAULT_FRAME_MAX: u32 = 131_072;
/// What a client sends first: `AMQP` 0 0 9 1.
pub const PROTOCOL_HEADER: [u8; 8] = *b"AMQP\x00\x00\x09\x01";

/// One AMQP frame.
#[derive(Debug, Clone, PartialEq)]
// Boxing the header would cost an allocation per message on the hot path;
// moving a few hundred bytes is cheaper.
#[allow(clippy::large_enum_variant)]
pub enum Frame {
    /// A method on a channel.
    Method(u16, Method),
    /// A content header on a channel.
    Header(u16, ContentHeader),
    /// A content header whose property list could not be decoded; see
    /// [`UndecodableHeader`]. Only the message is lost, not the stream.
    UndecodableHeader(u16, UndecodableHeader),
    /// A slice of a message body: zero-copy, shares the read buffer.
    Body(u16, Bytes),
    /// A heartbeat (always channel 0).
    Heartbeat,
}

impl Frame {
    /// The channel the frame is on.
    pub fn channel(&self) -> u16 {
        match self {
            Frame::Method(ch, _) | Frame::Header(ch, _) | Frame::UndecodableHeader(ch, _) | Frame::Body(ch, _) => *ch,
            Frame::Heartbeat => 0,
        }
    }

    /// Appends the whole frame, frame header and end byte included. On error nothing is
    /// appended.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        match self {
            Frame::Method(ch, method) => encode_method(*ch, method, dst),
            Frame::Header(ch, header) => framed(FRAME_HEADER, *ch, dst, |dst| header.encode(dst)),
            Frame::UndecodableHeader(ch, header) => framed(FRAME_HEADER, *ch, dst, |dst| {
                header.encode(dst);
                Ok(())
            }),
            Frame::Body(ch, body) => encode_body(*ch, body, dst),
            Frame::Heartbeat => {
                dst.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
                Ok(())
            }
        }
    }
}

impl From<(u16, Method)> for Frame {
    fn from((channel, method): (u16, Method)) -> Self {
        Frame::Method(channel, method)
    }
}

/// Appends a method frame. On error nothing is appended.
pub fn encode_method(channel: u16, method: &Method, dst: &mut BytesMut) -> Result<(), EncodeError> {
    framed(FRAME_METHOD, channel, dst, |dst| method.encode(dst))
}

/// Appends one body frame carrying `body` (which must fit in one frame).
pub fn encode_body(channel: u16, body: &[u8], dst: &mut BytesMut) -> Result<(), EncodeError> {
    let size = u32::try_from(body.len()).map_err(|_| EncodeError::TooLong(body.len()))?;
    dst.reserve(body.len() + FRAME_OVERHEAD);
    dst.put_slice(&frame_head(FRAME_BODY, channel, size));
    dst.put_slice(body);
    dst.put_u8(FRAME_END);
    Ok(())
}

/// Appends a content-bearing method (e.g. `basic.publish`), its content
/// header, and the body split into frames of at most `frame_max` bytes
/// (0 = no limit). On error nothing is appended.
///
/// ```
/// use acemq_codec::{encode_content, BasicPublish, BasicProperties, FrameDecoder, Frame};
/// let publish = BasicPublish { routing_key: "orders".into(), ..Default::default() };
/// let mut out = bytes::BytesMut::new();
/// encode_content(1, &publish.into(), &BasicProperties::default(), &[7u8; 10_000], 4096, &mut out).unwrap();
/// let decoder = FrameDecoder::new(4096);
/// let mut frames = Vec::new();
/// while let Some(frame) = decoder.decode(&mut out).unwrap() {
///     frames.push(frame);
/// }
/// // method, header, and three body frames of at most 4088 bytes each
/// assert_eq!(frames.len(), 5);
/// assert!(matches!(&frames[4], Frame::Body(1, b) if b.len() == 10_000 - 2 * 4088));
/// ```
pub fn encode_content(
    channel: u16,
    method: &Method,
    properties: &BasicProperties,
    body: &[u8],
    frame_max: u32,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = dst.len();
    let result = encode_content_inner(channel, method, properties, body, frame_max, dst);
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

fn encode_content_inner(
    channel: u16,
    method: &Method,
    properties: &BasicProperties,
    body: &[u8],
    frame_max: u32,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let max_body = reserve_content(body.len(), frame_max, dst)?;
    let method_start = dst.len();
    encode_method(channel, method, dst)?;
    check_frame_max(dst.len() - method_start, frame_max)?;
    let header_start = dst.len();
    encode_header(channel, method.class_id(), body.len(), properties, dst)?;
    check_frame_max(dst.len() - header_start, frame_max)?;
    encode_bodies(channel, body, max_body, dst)
}

/// The largest body slice one frame carries under `frame_max` (0 = no
/// limit), after reserving room in `dst` for a message of `body_len` bytes.
fn reserve_content(body_len: usize, frame_max: u32, dst: &mut BytesMut) -> Result<usize, EncodeError> {
    let max_body = match frame_max {
        0 => usize::MAX,
        max if (max as usize) <= FRAME_OVERHEAD => return Err(EncodeError::FrameMaxTooSmall(max)),
        max => max as usize - FRAME_OVERHEAD,
    };
    dst.reserve(64 + body_len + FRAME_OVERHEAD * (1 + body_len / max_body.max(1)));
    Ok(max_body)
}

/// Appends a content header frame: class, weight 0, body size, properties.
fn encode_header(
    channel: u16,
    class_id: u16,
    body_len: usize,
    properties: &BasicProperties,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    framed(FRAME_HEADER, channel, dst, |dst| {
        let mut fixed = [0; 12];
        fixed[..2].copy_from_slice(&class_id.to_be_bytes());
        // weight: 0
        fixed[4..].copy_from_slice(&(body_len as u64).to_be_bytes());
        dst.put_slice(&fixed);
        properties.encode(dst)
    })
}

/// Appends `body` as body frames of at most `max_body` bytes (none for an
/// empty body).
fn encode_bodies(channel: u16, body: &[u8], max_body: usize, dst: &mut BytesMut) -> Result<(), EncodeError> {
    for chunk in body.chunks(max_body) {
        encode_body(channel, chunk, dst)?;
    }
    Ok(())
}

/// A frame of `size` bytes must fit in `frame_max` (0 = no limit).
fn check_frame_max(size: usize, frame_max: u32) -> Result<(), EncodeError> {
    if frame_max != 0 && size > frame_max as usize {
        Err(EncodeError::FrameTooLarge { size, frame_max })
    } else {
        Ok(())
    }
}

/// `frame-type channel size`, the 7 bytes that start a frame.
#[inline(always)]
fn frame_head(frame_type: u8, channel: u16, size: u32) -> [u8; 7] {
    let [c0, c1] = channel.to_be_bytes();
    let [s0, s1, s2, s3] = size.to_be_bytes();
    [frame_type, c0, c1, s0, s1, s2, s3]
}

/// Writes type, channel and a size placeholder, the payload, the end byte,
/// then patches the size. On error nothing is appended.
fn framed(
    frame_type: u8,
    channel: u16,
    dst: &mut BytesMut,
    payload: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = dst.len();
    dst.put_slice(&frame_head(frame_type, channel, 0));
    if let Err(err) = payload(dst) {
        dst.truncate(start);
        return Err(err);
    }
    let size = dst.len() - start - 7;
    let Ok(size32) = u32::try_from(size) else {
        dst.truncate(start);
        return Err(EncodeError::TooLong(size));
    };
    dst[start + 3..start + 7].copy_from_slice(&size32.to_be_bytes());
    dst.put_u8(FRAME_END);
    Ok(())
}
