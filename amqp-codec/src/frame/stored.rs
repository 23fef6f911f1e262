//! Encoders for a server passing on messages it holds: the content header is
//! written from the property bytes it already has (as they were received,
//! or as it encoded them once), never decoded and encoded again, and a
//! `basic.deliver` is written from borrowed names, so a delivery copies no
//! string into a method value first.
//!
//! Must never write bytes that differ from what [`super::encode_content`]
//! writes for the same message with those properties decoded (the tests
//! below hold them to it), and must never append part of a message: on
//! error nothing is appended.
//!
//! One difference is deliberate: `frame_max` splits the body only. The
//! method and header frames are written whole, as RabbitMQ writes them when
//! it passes a message on, so a header that outgrew a peer's `frame_max`
//! (dead-lettering adds `x-death` to it) is the peer's to refuse.

use bytes::{BufMut, BytesMut};

use super::{encode_body, encode_method, framed, FRAME_HEADER, FRAME_METHOD, FRAME_OVERHEAD};
use crate::error::EncodeError;
use crate::method::{BasicDeliver, Method};
use crate::types::ShortString;

/// The arguments of a `basic.deliver` with the strings borrowed, for
/// [`encode_delivery`]: a broker delivering a stored message has the
/// exchange and routing key in the message and the consumer tag in the
/// consumer, and need not copy them into a [`BasicDeliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliverRef<'a> {
    /// The consumer the message goes to.
    pub consumer_tag: &'a ShortString,
    /// The delivery tag on this channel.
    pub delivery_tag: u64,
    /// Whether the message was delivered before.
    pub redelivered: bool,
    /// The exchange the message was published to.
    pub exchange: &'a ShortString,
    /// The routing key it was published with.
    pub routing_key: &'a ShortString,
}

impl DeliverRef<'_> {
    /// The same arguments as a [`BasicDeliver`] of their own.
    pub fn to_basic_deliver(&self) -> BasicDeliver {
        BasicDeliver {
            consumer_tag: self.consumer_tag.clone(),
            delivery_tag: self.delivery_tag,
            redelivered: self.redelivered,
            exchange: self.exchange.clone(),
            routing_key: self.routing_key.clone(),
        }
    }

    /// `basic.deliver = consumer-tag delivery-tag redelivered exchange
    /// routing-key`, after the class and method ids: the method payload, as
    /// the methods table lays it out (`Method::encode` writes the same).
    fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        dst.put_u16(BasicDeliver::CLASS_ID);
        dst.put_u16(BasicDeliver::METHOD_ID);
        put_shortstr(self.consumer_tag, dst)?;
        dst.put_u64(self.delivery_tag);
        dst.put_u8(u8::from(self.redelivered));
        put_shortstr(self.exchange, dst)?;
        put_shortstr(self.routing_key, dst)
    }

    fn encoded_len(&self) -> usize {
        4 + 1 + self.consumer_tag.len() + 8 + 1 + 1 + self.exchange.len() + 1 + self.routing_key.len()
    }
}

/// `short-string = OCTET *string-char`.
fn put_shortstr(s: &ShortString, dst: &mut BytesMut) -> Result<(), EncodeError> {
    let bytes = s.as_bytes();
    let len = u8::try_from(bytes.len()).map_err(|_| EncodeError::ShortStringTooLong(bytes.len()))?;
    dst.put_u8(len);
    dst.put_slice(bytes);
    Ok(())
}

/// Appends a `basic.deliver`, a basic content header carrying
/// `raw_properties`, and the body split into frames of at most `frame_max`
/// bytes (0 = no limit): the frames [`super::encode_content`] writes for
/// the same delivery, without a [`BasicDeliver`] or a
/// [`crate::BasicProperties`] to build.
///
/// `raw_properties` is the property flag word and property list exactly as
/// they go on the wire: [`crate::Properties::wire_bytes`] of properties as
/// received, [`crate::UndecodableHeader::raw_properties`], or what
/// [`crate::BasicProperties::encode`] wrote. They are copied, not checked.
/// An empty slice stands for no properties (a zero flag word).
///
/// Only the body is split to `frame_max`; see the module documentation. On
/// error nothing is appended.
///
/// ```
/// use acemq_codec::{encode_delivery, BasicProperties, DeliverRef, Frame, FrameDecoder, Method, ShortString};
/// let (tag, exchange, key) = (ShortString::from("ctag-1"), ShortString::from("orders"), ShortString::from("placed"));
/// let deliver = DeliverRef { consumer_tag: &tag, delivery_tag: 7, redelivered: false, exchange: &exchange, routing_key: &key };
/// // Properties as a broker keeps them: the flag word and list, encoded once.
/// let mut stored = bytes::BytesMut::new();
/// BasicProperties { message_id: Some("m-1".into()), ..Default::default() }.encode(&mut stored).unwrap();
///
/// let mut out = bytes::BytesMut::new();
/// encode_delivery(1, &deliver, &stored, &[7u8; 10_000], 4096, &mut out).unwrap();
/// let decoder = FrameDecoder::new(4096);
/// let mut frames = Vec::new();
/// while let Some(frame) = decoder.decode(&mut out).unwrap() {
///     frames.push(frame);
/// }
/// assert!(matches!(&frames[0], Frame::Method(1, Method::BasicDeliver(d)) if d.delivery_tag == 7));
/// assert!(matches!(&frames[1], Frame::Header(1, h) if h.properties.message_id == Some("m-1".into())));
/// assert_eq!(frames.len(), 5); // and three body frames
/// ```
pub fn encode_delivery(
    channel: u16,
    deliver: &DeliverRef<'_>,
    raw_properties: &[u8],
    body: &[u8],
    frame_max: u32,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = dst.len();
    let result = body_part_max(frame_max).and_then(|max_body| {
        reserve(dst, deliver.encoded_len(), raw_properties, body, max_body);
        framed(FRAME_METHOD, channel, dst, |dst| deliver.encode(dst))?;
        header_and_body(channel, BasicDeliver::CLASS_ID, raw_properties, body, max_body, dst)
    });
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

/// Appends a content-bearing method (`basic.return`, `basic.get-ok`, ...), a
/// content header of the method's class carrying `raw_properties`, and the
/// body split into frames of at most `frame_max` bytes (0 = no limit): what
/// [`super::encode_content`] writes with those properties decoded.
///
/// `raw_properties` is as for [`encode_delivery`]: the flag word and
/// property list as they go on the wire, copied unchecked; empty for none.
/// Only the body is split to `frame_max`. On error nothing is appended.
///
/// ```
/// use acemq_codec::{encode_content_raw, BasicReturn, Frame, FrameDecoder};
/// let returned = BasicReturn { reply_code: 312, reply_text: "NO_ROUTE".into(), ..Default::default() };
/// let mut out = bytes::BytesMut::new();
/// encode_content_raw(1, &returned.into(), &[], b"hello", 4096, &mut out).unwrap();
/// let decoder = FrameDecoder::new(4096);
/// assert!(matches!(decoder.decode(&mut out).unwrap(), Some(Frame::Method(1, _))));
/// assert!(matches!(decoder.decode(&mut out).unwrap(), Some(Frame::Header(1, h)) if h.body_size == 5));
/// assert_eq!(decoder.decode(&mut out).unwrap(), Some(Frame::Body(1, "hello".into())));
/// ```
pub fn encode_content_raw(
    channel: u16,
    method: &Method,
    raw_properties: &[u8],
    body: &[u8],
    frame_max: u32,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = dst.len();
    let result = body_part_max(frame_max).and_then(|max_body| {
        reserve(dst, 64, raw_properties, body, max_body);
        encode_method(channel, method, dst)?;
        header_and_body(channel, method.class_id(), raw_properties, body, max_body, dst)
    });
    if result.is_err() {
        dst.truncate(start);
    }
    result
}

/// The most body bytes one frame carries under `frame_max` (0 = no limit).
fn body_part_max(frame_max: u32) -> Result<usize, EncodeError> {
    match frame_max {
        0 => Ok(usize::MAX),
        max if (max as usize) <= FRAME_OVERHEAD => Err(EncodeError::FrameMaxTooSmall(max)),
        max => Ok(max as usize - FRAME_OVERHEAD),
    }
}

/// Room for the whole message at once: the method payload, the header, the
/// body and every frame's header and end byte.
#[inline]
fn reserve(dst: &mut BytesMut, method_payload: usize, raw_properties: &[u8], body: &[u8], max_body: usize) {
    let body_frames = body.len().div_ceil(max_body.max(1));
    let header = 12 + raw_properties.len().max(2);
    dst.reserve(method_payload + header + body.len() + FRAME_OVERHEAD * (2 + body_frames));
}

/// `content-header = class-id weight body-size property-flags
/// property-list`, the properties as given, then the body frames.
#[inline]
fn header_and_body(
    channel: u16,
    class_id: u16,
    raw_properties: &[u8],
    body: &[u8],
    max_body: usize,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    framed(FRAME_HEADER, channel, dst, |dst| {
        dst.put_u16(class_id);
        dst.put_u16(0);
        dst.put_u64(body.len() as u64);
        if raw_properties.is_empty() {
            dst.put_u16(0);
        } else {
            dst.put_slice(raw_properties);
        }
        Ok(())
    })?;
    for part in body.chunks(max_body) {
        encode_body(channel, part, dst)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each encoder against the general one: the same message, the same
    //! bytes, and those bytes decode to the frames it was given.

    use bytes::{Bytes, BytesMut};
    use proptest::prelude::*;

    use super::*;
    use crate::frame::encode_content;
    use crate::{arbitrary, BasicGetOk, BasicProperties, BasicReturn, ContentHeader, Frame, FrameDecoder};

    /// What the general encoder writes, if it accepts `frame_max` for the
    /// method and header frames.
    fn general(
        channel: u16,
        method: &Method,
        props: &BasicProperties,
        body: &[u8],
        frame_max: u32,
    ) -> Result<Bytes, EncodeError> {
        let mut out = BytesMut::new();
        encode_content(channel, method, props, body, frame_max, &mut out)?;
        Ok(out.freeze())
    }

    /// The message frame by frame with [`Frame::encode`]: the method and
    /// header whole, the body split to `frame_max`.
    fn frame_by_frame(channel: u16, method: &Method, props: &BasicProperties, body: &[u8], frame_max: u32) -> Bytes {
        let mut out = BytesMut::new();
        Frame::Method(channel, method.clone()).encode(&mut out).unwrap();
        let header = ContentHeader::basic(body.len() as u64, props.clone());
        Frame::Header(channel, header).encode(&mut out).unwrap();
        let part = if frame_max == 0 {
            usize::MAX
        } else {
            frame_max as usize - FRAME_OVERHEAD
        };
        for part in body.chunks(part) {
            Frame::Body(channel, Bytes::copy_from_slice(part))
                .encode(&mut out)
                .unwrap();
        }
        out.freeze()
    }

    fn wire(props: &BasicProperties) -> Bytes {
        let mut out = BytesMut::new();
        props.encode(&mut out).expect("encodes");
        out.freeze()
    }

    fn frames(mut bytes: BytesMut) -> Vec<Frame> {
        let decoder = FrameDecoder::new(0);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.decode(&mut bytes).expect("decodes") {
            frames.push(frame);
        }
        assert!(bytes.is_empty(), "nothing left over");
        frames
    }

    fn body_and_frame_max() -> impl Strategy<Value = (Vec<u8>, u32)> {
        (
            proptest::collection::vec(any::<u8>(), 0..3000),
            prop_oneof![Just(0u32), 9u32..64, 4096u32..=8192],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn a_delivery_is_the_bytes_the_general_encoder_writes(
            channel in any::<u16>(),
            consumer_tag in arbitrary::shortstr(),
            delivery_tag in any::<u64>(),
            redelivered in any::<bool>(),
            exchange in arbitrary::shortstr(),
            routing_key in arbitrary::shortstr(),
            props in arbitrary::properties(),
            (body, frame_max) in body_and_frame_max(),
        ) {
            let deliver = DeliverRef {
                consumer_tag: &consumer_tag,
                delivery_tag,
                redelivered,
                exchange: &exchange,
                routing_key: &routing_key,
            };
            let method = Method::BasicDeliver(deliver.to_basic_deliver());
            let expected = frame_by_frame(channel, &method, &props, &body, frame_max);
            if let Ok(whole) = general(channel, &method, &props, &body, frame_max) {
                prop_assert_eq!(&whole[..], &expected[..]);
            }
            let mut ours = BytesMut::from(&b"before"[..]);
            encode_delivery(channel, &deliver, &wire(&props), &body, frame_max, &mut ours).unwrap();
            prop_assert_eq!(&ours[..6], b"before");
            prop_assert_eq!(&ours[6..], &expected[..]);
            let decoded = frames(ours.split_off(6));
            prop_assert_eq!(&decoded[0], &Frame::Method(channel, method));
            prop_assert!(matches!(&decoded[1], Frame::Header(_, h) if h.properties == props));
        }

        #[test]
        fn content_with_raw_properties_is_the_bytes_the_general_encoder_writes(
            channel in any::<u16>(),
            returned in any::<bool>(),
            props in arbitrary::properties(),
            body in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            let method = if returned {
                Method::BasicReturn(BasicReturn { reply_code: 312, reply_text: "NO_ROUTE".into(), ..Default::default() })
            } else {
                Method::BasicGetOk(BasicGetOk { delivery_tag: 3, message_count: 9, ..Default::default() })
            };
            let frame_max = 1 << 20;
            let mut ours = BytesMut::new();
            encode_content_raw(channel, &method, &wire(&props), &body, frame_max, &mut ours).unwrap();
            prop_assert_eq!(&ours[..], &general(channel, &method, &props, &body, frame_max).unwrap()[..]);
        }
    }

    #[test]
    fn no_properties_is_an_empty_slice_or_a_zero_flag_word() {
        let method = Method::BasicGetOk(BasicGetOk::default());
        let expected = general(1, &method, &BasicProperties::default(), b"x", 4096).unwrap();
        for raw in [&[][..], &[0, 0][..]] {
            let mut out = BytesMut::new();
            encode_content_raw(1, &method, raw, b"x", 4096, &mut out).unwrap();
            assert_eq!(&out[..], &expected[..]);
        }
    }

    #[test]
    fn properties_that_do_not_decode_go_out_as_they_came() {
        // Undefined flag bits: the decoder keeps them raw, and so does the encoder.
        let raw = [0x00, 0x01];
        let (tag, name) = (ShortString::from("t"), ShortString::from("q"));
        let deliver = DeliverRef {
            consumer_tag: &tag,
            delivery_tag: 1,
            redelivered: true,
            exchange: &name,
            routing_key: &name,
        };
        let mut out = BytesMut::new();
        encode_delivery(2, &deliver, &raw, b"body", 0, &mut out).unwrap();
        let decoded = frames(out);
        assert!(matches!(&decoded[1], Frame::UndecodableHeader(2, h) if h.raw_properties[..] == raw[..]));
        assert_eq!(decoded[2], Frame::Body(2, Bytes::from_static(b"body")));
    }

    #[test]
    fn on_error_nothing_is_appended() {
        let long = ShortString::from("x".repeat(256));
        let ok = ShortString::from("q");
        let deliver = DeliverRef {
            consumer_tag: &long,
            delivery_tag: 1,
            redelivered: false,
            exchange: &ok,
            routing_key: &ok,
        };
        let mut out = BytesMut::from(&b"kept"[..]);
        assert_eq!(
            encode_delivery(1, &deliver, &[], b"body", 4096, &mut out),
            Err(EncodeError::ShortStringTooLong(256))
        );
        assert_eq!(
            encode_content_raw(1, &Method::BasicGetOk(BasicGetOk::default()), &[], b"body", 8, &mut out),
            Err(EncodeError::FrameMaxTooSmall(8))
        );
        assert_eq!(&out[..], b"kept");
    }
}
