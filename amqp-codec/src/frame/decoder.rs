//! The frame decoder: streaming only here.
//!
//! Read the 7-byte frame header; refuse a size above `frame_max` before buffering
//! anything more; wait for the whole frame; check the end byte; then parse the
//! payload completely, so a short payload is `Malformed`, never `Incomplete`.
//! Must never allocate for a frame before its size has been checked. Its
//! step that feeds content assemblers directly,
//! [`FrameDecoder::decode_assembled`], is in `track` (`track/decode.rs`),
//! beside them: the frame layer knows nothing of assembly.

use bytes::{Buf, Bytes, BytesMut};
use nom::bytes::complete::take;
use nom::number::{complete, streaming};

use super::header::{check_content_header, CheckedHeader, PROPERTIES_AT};
use super::{
    Frame, DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_OVERHEAD,
};
use crate::error::{DecodeErrorKind, Error};
use crate::method::{BasicDeliver, Method};
use crate::parse::{kind_of, ArgReader, Ctx, PError};
use crate::types::DEFAULT_MAX_DEPTH;

/// The class and method ids of `basic.deliver` (60, 60) as they start a
/// method payload.
pub(crate) const BASIC_DELIVER_IDS: [u8; 4] = [0, 60, 0, 60];

/// The length of a `basic.ack` or `basic.nack` frame: the frame header and
/// end byte (8) and a payload of the ids (4), the delivery tag (8) and the
/// bits (1).
const ACK_FRAME_LEN: usize = 21;

/// A `basic.ack` or `basic.nack` frame, as [`FrameDecoder::take_ack`] takes
/// it: what [`FrameDecoder::decode`] would give as
/// `Frame::Method(channel, Method::BasicAck(..))` or `BasicNack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckFrame {
    /// The channel it came on (never 0).
    pub channel: u16,
    /// `basic.nack` rather than `basic.ack`.
    pub nack: bool,
    /// The delivery tag (for a publisher, the confirm's sequence number).
    pub delivery_tag: u64,
    /// The `multiple` bit.
    pub multiple: bool,
    /// The `requeue` bit of a `basic.nack` (`false` for an ack).
    pub requeue: bool,
}

impl From<AckFrame> for Method {
    /// The method [`FrameDecoder::decode`] gives for the frame.
    fn from(ack: AckFrame) -> Method {
        if ack.nack {
            Method::BasicNack(crate::method::BasicNack {
                delivery_tag: ack.delivery_tag,
                multiple: ack.multiple,
                requeue: ack.requeue,
            })
        } else {
            Method::BasicAck(crate::method::BasicAck {
                delivery_tag: ack.delivery_tag,
                multiple: ack.multiple,
            })
        }
    }
}

/// The most [`FrameDecoder::decode`] reserves at once for a partial frame.
pub(crate) const MAX_RESERVE: usize = 256 * 1024;

/// Decodes frames from a read buffer, in place.
///
/// ```
/// use acemq_codec::{Frame, FrameDecoder};
/// let mut buf = bytes::BytesMut::from(&[8u8, 0, 0, 0, 0, 0, 0, 0xCE][..]);
/// let decoder = FrameDecoder::new(131_072);
/// assert_eq!(decoder.decode(&mut buf).unwrap(), Some(Frame::Heartbeat));
/// assert_eq!(decoder.decode(&mut buf).unwrap(), None); // needs more bytes
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameDecoder {
    frame_max: u32,
    /// Bytes a frame may run over `frame_max` and still be taken.
    allowance: u32,
    /// Read by `track`'s `decode_assembled` too.
    pub(crate) max_depth: usize,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_FRAME_MAX)
    }
}

impl FrameDecoder {
    /// A decoder that refuses frames larger than `frame_max` bytes (the whole
    /// frame, frame header and end byte included; 0 = no limit) and nests field values at most
    /// [`DEFAULT_MAX_DEPTH`] levels deep.
    pub fn new(frame_max: u32) -> Self {
        FrameDecoder {
            frame_max,
            allowance: 0,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }

    /// The same decoder, taking frames up to `allowance` bytes over
    /// `frame_max` (the limit stays off when `frame_max` is 0).
    ///
    /// The protocol's `frame_max` bounds the whole frame, and a client or
    /// broker that keeps to it needs no allowance (the default, 0). A
    /// broker that imitates RabbitMQ needs one: RabbitMQ's reader lets a
    /// frame's payload reach `frame_max` bytes, so a frame of
    /// `frame_max + 8` bytes passes there (see acemq-memory's session).
    pub fn with_allowance(mut self, allowance: u32) -> Self {
        self.allowance = allowance;
        self
    }

    /// The bytes a frame may run over `frame_max` (see [`FrameDecoder::with_allowance`]).
    pub fn allowance(&self) -> u32 {
        self.allowance
    }

    /// The same decoder with another nesting limit (at least 1).
    pub fn with_max_depth(mut self, max_depth: usize) -> Self {
        self.max_depth = max_depth.max(1);
        self
    }

    /// Changes `frame_max`, e.g. once `tune` is done.
    pub fn set_frame_max(&mut self, frame_max: u32) {
        self.frame_max = frame_max;
    }

    /// The current `frame_max`.
    pub fn frame_max(&self) -> u32 {
        self.frame_max
    }

    /// The nesting limit.
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Takes the next frame off `buf` if it is a whole, well-formed
    /// `basic.ack` or `basic.nack` on a channel other than 0 for which
    /// `wanted` says yes; otherwise leaves `buf` as it is, for
    /// [`FrameDecoder::decode`], which gives the same method from the same
    /// bytes (and the error for any that are not well-formed).
    ///
    /// For a publisher, most frames it reads are confirms: this reads one
    /// in a few comparisons, without building a [`Frame`].
    ///
    /// ```
    /// use acemq_codec::{encode_method, AckFrame, BasicAck, FrameDecoder};
    /// let mut buf = bytes::BytesMut::new();
    /// encode_method(3, &BasicAck { delivery_tag: 9, multiple: true }.into(), &mut buf).unwrap();
    /// let decoder = FrameDecoder::new(4096);
    /// assert_eq!(decoder.take_ack(&mut buf.clone(), |channel| channel != 3), None);
    /// let ack = decoder.take_ack(&mut buf, |_| true).unwrap();
    /// assert_eq!(ack, AckFrame { channel: 3, nack: false, delivery_tag: 9, multiple: true, requeue: false });
    /// assert!(buf.is_empty());
    /// ```
    #[inline(always)]
    pub fn take_ack(&self, buf: &mut BytesMut, wanted: impl FnOnce(u16) -> bool) -> Option<AckFrame> {
        // Type, channel, size 13, class 60, method 80 or 120, tag, bits, end.
        let [FRAME_METHOD, c0, c1, 0, 0, 0, 13, 0, 60, 0, method, tag @ .., bits, FRAME_END] =
            *buf.first_chunk::<ACK_FRAME_LEN>()?
        else {
            return None;
        };
        let nack = match method {
            80 => false,
            120 => true,
            _ => return None,
        };
        let channel = u16::from_be_bytes([c0, c1]);
        let fits = self.frame_max == 0 || ACK_FRAME_LEN as u64 <= self.limit();
        if channel == 0 || !fits || !wanted(channel) {
            return None;
        }
        buf.advance(ACK_FRAME_LEN);
        Some(AckFrame {
            channel,
            nack,
            delivery_tag: u64::from_be_bytes(tag),
            multiple: bits & 1 != 0,
            requeue: nack && bits & 2 != 0,
        })
    }

    /// Takes one whole frame off the front of `buf`. `Ok(None)` means more
    /// bytes are needed (and `buf` has been reserved for them); an error
    /// means the stream is corrupt and must be closed, except that a content
    /// header with bad properties is not an error but
    /// [`Frame::UndecodableHeader`].
    ///
    /// Method and header frames are parsed where they lie and then skipped;
    /// a body frame's payload is split off `buf` without copying.
    #[inline]
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, Error> {
        let (frame_type, channel, total) = match self.frame_header(buf)? {
            Ok(header) => header,
            Err(_) => return Ok(None),
        };
        if buf.len() < total {
            // Room for the rest of the frame, but never more than a bounded
            // step on the peer's word: a header announcing 4 GiB (with no
            // frame_max) must not allocate 4 GiB before a byte arrives.
            buf.reserve((total - buf.len()).min(MAX_RESERVE));
            return Ok(None);
        }
        check_end(buf, total)?;
        touch_ahead(buf, total);
        if frame_type == FRAME_BODY {
            return Ok(Some(Frame::Body(channel, split_frame(buf, total, 7))));
        }
        if frame_type == FRAME_HEADER {
            // Checked where it lies; the property list is then kept as a
            // zero-copy slice, like a body, and built on first access.
            let checked = match check_content_header(&buf[7..total - 1], self.max_depth) {
                Ok(checked) => checked,
                Err(err) => {
                    buf.advance(total);
                    return Err(err);
                }
            };
            let raw = split_frame(buf, total, 7 + PROPERTIES_AT);
            return Ok(Some(header_frame(checked, channel, raw)));
        }
        // The ids are looked for within the payload only: a method frame too
        // short to hold them (even an empty one at the end of `buf`) takes
        // the general path and is `Malformed`.
        if frame_type == FRAME_METHOD && buf[7..total - 1].starts_with(&BASIC_DELIVER_IDS) {
            // basic.deliver, the method of every message a consumer gets,
            // decoded in place in the frame returned. The rest of the buffer
            // after the frame is slack for the string reader.
            let mut out = Ok(Some(Frame::Method(
                channel,
                Method::BasicDeliver(BasicDeliver::default()),
            )));
            if let Ok(Some(Frame::Method(_, Method::BasicDeliver(deliver)))) = &mut out {
                let args = ArgReader::new(self.ctx(), None, &buf[11..], total - 12);
                if let Err(kind) = deliver.decode_args_into(args) {
                    out = Err(malformed_deliver(kind));
                }
            }
            buf.advance(total);
            return out;
        }
        let frame = self.parse_payload(frame_type, channel, buf, total, None);
        buf.advance(total);
        frame.map(Some)
    }

    /// The largest whole frame taken while `frame_max` is not 0.
    #[inline(always)]
    fn limit(&self) -> u64 {
        u64::from(self.frame_max) + u64::from(self.allowance)
    }

    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            max_depth: self.max_depth,
            validated: false,
        }
    }

    /// Decodes the first frame of `input`, returning it and how many bytes it
    /// took. Too few bytes is [`Error::Incomplete`].
    pub fn decode_slice(&self, input: &Bytes) -> Result<(Frame, usize), Error> {
        let (frame_type, channel, total) = match self.frame_header(input)? {
            Ok(header) => header,
            Err(needed) => return Err(Error::Incomplete { needed }),
        };
        if input.len() < total {
            return Err(Error::Incomplete {
                needed: total - input.len(),
            });
        }
        check_end(input, total)?;
        let frame = if frame_type == FRAME_BODY {
            Frame::Body(channel, input.slice(7..total - 1))
        } else {
            self.parse_payload(frame_type, channel, input, total, Some(input))?
        };
        Ok((frame, total))
    }

    /// `frame = frame-type channel size payload frame-end`, its 7-byte
    /// header read with nom's streaming parsers: the type, the channel and
    /// the total frame size, or how many more bytes the header itself needs.
    /// Refuses unknown types and oversized frames.
    #[inline]
    pub(crate) fn frame_header(&self, buf: &[u8]) -> Result<Result<(u8, u16, usize), usize>, Error> {
        // Written out rather than with `tuple`, whose `parse` the compiler
        // does not inline here.
        let header = |i| -> nom::IResult<&[u8], (u8, u16, u32), PError> {
            let (i, frame_type) = streaming::be_u8(i)?;
            let (i, channel) = streaming::be_u16(i)?;
            let (i, size) = streaming::be_u32(i)?;
            Ok((i, (frame_type, channel, size)))
        };
        let (frame_type, channel, size) = match header(buf) {
            Ok((_, header)) => header,
            Err(nom::Err::Incomplete(_)) => return Ok(Err(7 - buf.len())),
            // Number parsers fail only for want of bytes.
            Err(err) => {
                return Err(Error::Malformed {
                    context: "frame header",
                    kind: kind_of(err),
                })
            }
        };
        if !matches!(frame_type, FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT) {
            return Err(Error::UnknownFrameType(frame_type));
        }
        let total = u64::from(size) + FRAME_OVERHEAD as u64;
        if self.frame_max != 0 && total > self.limit() {
            return Err(Error::FrameTooLarge {
                size: total,
                frame_max: self.frame_max,
            });
        }
        match usize::try_from(total) {
            Ok(total) => Ok(Ok((frame_type, channel, total))),
            Err(_) => Err(Error::FrameTooLarge {
                size: total,
                frame_max: self.frame_max,
            }),
        }
    }

    /// Parses the payload of a method, header or heartbeat frame completely.
    /// `frame` starts with the whole frame of `total` bytes; whatever follows
    /// it is slack the string reader may look at but never parses. `frame`
    /// lies within `source` when there is one; tables are then zero-copy
    /// slices of it.
    pub(crate) fn parse_payload(
        &self,
        frame_type: u8,
        channel: u16,
        frame: &[u8],
        total: usize,
        source: Option<&Bytes>,
    ) -> Result<Frame, Error> {
        let payload = &frame[7..total - 1];
        match frame_type {
            FRAME_METHOD => self.method(channel, &frame[7..], total - FRAME_OVERHEAD, source),
            FRAME_HEADER => {
                let checked = check_content_header(payload, self.max_depth)?;
                let properties = &payload[PROPERTIES_AT..];
                let raw = match source {
                    Some(source) => source.slice_ref(properties),
                    None => Bytes::copy_from_slice(properties),
                };
                Ok(header_frame(checked, channel, raw))
            }
            FRAME_HEARTBEAT if channel == 0 && payload.is_empty() => Ok(Frame::Heartbeat),
            FRAME_HEARTBEAT => Err(Error::Malformed {
                context: "heartbeat",
                kind: DecodeErrorKind::BadHeartbeat,
            }),
            other => Err(Error::UnknownFrameType(other)),
        }
    }

    /// `method-payload = class-id method-id *amqp-field`: the first `len`
    /// bytes of `payload`, the rest slack.
    fn method(&self, channel: u16, payload: &[u8], len: usize, source: Option<&Bytes>) -> Result<Frame, Error> {
        let ids = |i| -> nom::IResult<&[u8], (u16, u16), PError> {
            let (i, class_id) = crate::parse::num::be_u16(i)?;
            let (i, method_id) = crate::parse::num::be_u16(i)?;
            Ok((i, (class_id, method_id)))
        };
        let ids = ids(payload.get(..len).unwrap_or_default());
        let (class_id, method_id) = match ids {
            Ok((_, ids)) => ids,
            Err(err) => {
                return Err(Error::Malformed {
                    context: "method frame",
                    kind: kind_of(err),
                })
            }
        };
        let reader = ArgReader::new(self.ctx(), source, &payload[4..], len - 4);
        let method = Method::decode_args(class_id, method_id, reader)?;
        Ok(Frame::Method(channel, method))
    }
}

/// Splits the whole frame of `total` bytes off `buf` and returns its
/// payload from `skip` bytes in, without the end byte: one split of the
/// read buffer, then the frozen slice trimmed (cheaper than advancing the
/// `BytesMut` twice).
#[inline(always)]
pub(crate) fn split_frame(buf: &mut BytesMut, total: usize, skip: usize) -> Bytes {
    let mut payload = buf.split_to(total).freeze();
    payload.truncate(total - 1);
    payload.advance(skip);
    payload
}

/// The error for a `basic.deliver` whose arguments do not decode.
#[cold]
pub(crate) fn malformed_deliver(kind: DecodeErrorKind) -> Error {
    Error::Malformed {
        context: BasicDeliver::NAME,
        kind,
    }
}

/// How far ahead of the frame being decoded [`touch_ahead`] reads.
const TOUCH_DISTANCE: usize = 1024;

/// Reads one byte in every cache line of `buf[TOUCH_DISTANCE..][..total]`:
/// the stretch as long as this frame that lies `TOUCH_DISTANCE` bytes ahead
/// of it. The stretches of consecutive frames tile the buffer, so every line
/// of a long buffer is asked for once, some way before the decoder gets to
/// it, and independent loads can be in flight together: a long buffer is
/// parsed at the speed memory streams, not one memory round trip per frame
/// (the next frame's header depends on this frame's size, so the decoder's
/// own loads come one after another). Safe Rust has no prefetch
/// instruction; a load whose value is not used does the same. In a read
/// buffer the socket has just filled, the lines are in cache already and
/// the loads cost a few cycles.
#[inline(always)]
pub(crate) fn touch_ahead(buf: &[u8], total: usize) {
    let end = buf.len().min(TOUCH_DISTANCE + total);
    let mut at = TOUCH_DISTANCE;
    while at < end {
        std::hint::black_box(buf[at]);
        at += 64;
    }
}

/// Checks `frame-end` of the frame of `total` bytes at the start of `buf`
/// (which holds all of it): nom takes the header and payload, then the end
/// byte.
#[inline(always)]
pub(crate) fn check_end(buf: &[u8], total: usize) -> Result<(), Error> {
    let end = |i| -> nom::IResult<&[u8], u8, PError> {
        let (i, _) = take(total - 1)(i)?;
        complete::be_u8(i)
    };
    let (_, end) = end(buf).map_err(|err| Error::Malformed {
        context: "frame",
        kind: kind_of(err),
    })?;
    if end != FRAME_END {
        return Err(Error::BadFrameEnd { found: end });
    }
    Ok(())
}

/// Decodes the first frame of `input` with `frame_max` and the default
/// nesting limit; see [`FrameDecoder::decode_slice`].
pub fn decode_frame(input: &Bytes, frame_max: u32) -> Result<(Frame, usize), Error> {
    FrameDecoder::new(frame_max).decode_slice(input)
}

/// A checked header as the frame it makes on `channel`: [`Frame::Header`],
/// or [`Frame::UndecodableHeader`] when its properties cannot be decoded.
#[inline]
fn header_frame(checked: CheckedHeader, channel: u16, raw: Bytes) -> Frame {
    match checked.into_header(raw) {
        Ok(header) => Frame::Header(channel, header),
        Err(header) => Frame::UndecodableHeader(channel, header),
    }
}
