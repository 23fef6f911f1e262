//! Decoding frames straight into content assemblers:
//! [`FrameDecoder::decode_assembled`], the frame decoder's step for the
//! frames that make up messages, here beside the assemblers it feeds (the
//! rest of the decoder, and the pieces this step shares with it, are in
//! `frame`). Must never allocate for a frame before its size has been
//! checked, nor take a frame other than as [`FrameDecoder::decode`] and
//! [`ContentAssembler::push`] would.

use bytes::{Buf, BytesMut};

use super::content::Progress;
use super::{AssembleError, ContentAssembler, Decoded};
use crate::frame::{
    check_content_header, check_end, malformed_deliver, split_frame, touch_ahead, Frame, FrameDecoder,
    BASIC_DELIVER_IDS, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, MAX_RESERVE, PROPERTIES_AT,
};
use crate::method::{BasicDeliver, Method};
use crate::parse::ArgReader;

impl FrameDecoder {
    /// Takes the next frame off `buf` if it is content (a content-bearing
    /// method, a content header or a body frame) on a channel
    /// `assembler_for` gives an assembler for, and feeds it to that
    /// assembler: [`FrameDecoder::decode`] and [`ContentAssembler::push`] in
    /// one step, for the frames that make up messages.
    ///
    /// What it saves is moving: a `basic.deliver` is decoded straight into
    /// the message being assembled, no frame is built to be handed from the
    /// decoder to the assembler, and a finished message is moved out once,
    /// by [`ContentAssembler::take_complete`]. Anything else is
    /// [`Decoded::Other`] and stays in `buf` for [`FrameDecoder::decode`].
    ///
    /// Errors are those of `decode`, or a content sequence error, which
    /// resets that channel's assembler and comes with its channel; the frame
    /// has been taken off `buf` either way.
    ///
    /// ```
    /// use acemq_codec::track::{ContentAssembler, Decoded};
    /// use acemq_codec::{encode_content, encode_method, BasicAck, BasicDeliver, BasicProperties, FrameDecoder, Method};
    /// let mut buf = bytes::BytesMut::new();
    /// let deliver = BasicDeliver { delivery_tag: 7, ..Default::default() };
    /// encode_content(3, &deliver.into(), &BasicProperties::default(), b"hi", 4096, &mut buf).unwrap();
    /// encode_method(3, &BasicAck::default().into(), &mut buf).unwrap();
    ///
    /// let decoder = FrameDecoder::new(4096);
    /// let mut channel_3 = ContentAssembler::new();
    /// let mut messages = Vec::new();
    /// let mut others = Vec::new();
    /// loop {
    ///     match decoder.decode_assembled(&mut buf, |ch| (ch == 3).then_some(&mut channel_3)).unwrap() {
    ///         Decoded::NeedMore => break,
    ///         Decoded::Partial(_) => {}
    ///         Decoded::Complete(3) => messages.extend(channel_3.take_complete()),
    ///         Decoded::Complete(_) => unreachable!(),
    ///         Decoded::Other => others.extend(decoder.decode(&mut buf).unwrap()),
    ///     }
    /// }
    /// assert!(matches!(messages[0].method, Method::BasicDeliver(BasicDeliver { delivery_tag: 7, .. })));
    /// assert_eq!(&messages[0].body[..], b"hi");
    /// assert_eq!(others.len(), 1); // the basic.ack
    /// ```
    #[inline(always)]
    pub fn decode_assembled<'a>(
        &self,
        buf: &mut BytesMut,
        assembler_for: impl FnOnce(u16) -> Option<&'a mut ContentAssembler>,
    ) -> Result<Decoded, AssembleError> {
        let (frame_type, channel, total) = match self.frame_header(buf)? {
            Ok(header) => header,
            Err(_) => return Ok(Decoded::NeedMore),
        };
        if buf.len() < total {
            buf.reserve((total - buf.len()).min(MAX_RESERVE));
            return Ok(Decoded::NeedMore);
        }
        if channel == 0 || frame_type == FRAME_HEARTBEAT {
            return Ok(Decoded::Other);
        }
        let Some(assembler) = assembler_for(channel) else {
            return Ok(Decoded::Other);
        };
        if assembler.has_complete() {
            return Ok(Decoded::Complete(channel));
        }
        let is_content_method = |payload: &[u8]| match payload.first_chunk::<4>() {
            Some(&[c0, c1, m0, m1]) => {
                Method::ids_have_content(u16::from_be_bytes([c0, c1]), u16::from_be_bytes([m0, m1]))
            }
            None => false,
        };
        if frame_type == FRAME_METHOD && !is_content_method(&buf[7..total - 1]) {
            return Ok(Decoded::Other);
        }
        check_end(buf, total)?;
        touch_ahead(buf, total);
        let fed = if frame_type == FRAME_BODY {
            assembler.on_body(split_frame(buf, total, 7))
        } else if frame_type == FRAME_HEADER {
            let checked = match check_content_header(&buf[7..total - 1], self.max_depth) {
                Ok(checked) => checked,
                Err(err) => {
                    buf.advance(total);
                    return Err(err.into());
                }
            };
            let raw = split_frame(buf, total, 7 + PROPERTIES_AT);
            assembler.on_header(checked.into_header(raw))
        } else if buf[7..total - 1].starts_with(&BASIC_DELIVER_IDS) {
            let fed = match assembler.begin_deliver() {
                Ok(deliver) => {
                    let args = ArgReader::new(self.ctx(), None, &buf[11..], total - 12);
                    if let Err(kind) = deliver.decode_args_into(args) {
                        assembler.reset();
                        buf.advance(total);
                        return Err(malformed_deliver(kind).into());
                    }
                    Ok(Progress::Partial)
                }
                Err(error) => {
                    // Out of sequence; but a frame that does not decode is
                    // the graver error, as it is for `decode`.
                    let args = ArgReader::new(self.ctx(), None, &buf[11..], total - 12);
                    if let Err(kind) = BasicDeliver::default().decode_args_into(args) {
                        buf.advance(total);
                        return Err(malformed_deliver(kind).into());
                    }
                    Err(error)
                }
            };
            buf.advance(total);
            fed
        } else {
            // basic.publish, basic.return, basic.get-ok: the general path.
            let frame = self.parse_payload(frame_type, channel, buf, total, None);
            buf.advance(total);
            match frame? {
                Frame::Method(_, method) => assembler.begin(method),
                // A method frame decodes to a method.
                _ => Ok(Progress::Partial),
            }
        };
        match fed {
            Ok(Progress::Partial) => Ok(Decoded::Partial(channel)),
            Ok(Progress::Complete) => Ok(Decoded::Complete(channel)),
            Err(error) => {
                assembler.reset();
                Err(AssembleError::Content { channel, error })
            }
        }
    }
}
