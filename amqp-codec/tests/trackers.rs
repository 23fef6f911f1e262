//! Tracker scenarios: publisher confirms, return pairing, content assembly and
//! the blocked state, driven with the frames a broker would send.

use acemq_codec::track::{
    Assembly, ConfirmError, Confirms, ContentAssembler, ContentError, Outcome, ReturnKey, ReturnMatch, Returns,
};
use acemq_codec::{
    BasicAck, BasicDeliver, BasicNack, BasicProperties, BasicPublish, BasicQosOk, BasicReturn, ContentHeader, Frame,
    Method, ReplyCode, ShortString,
};
use bytes::Bytes;

/// One publishing channel as acemq drives it: every publish mandatory with a
/// message id, confirms on.
struct Publisher {
    confirms: Confirms,
    returns: Returns,
}

/// What became of a publish once final.
#[derive(Debug, PartialEq)]
enum Fate {
    Routed,
    Returned(u16),
    Nacked,
}

impl Publisher {
    fn new() -> Self {
        let mut confirms = Confirms::new();
        confirms.select();
        Publisher {
            confirms,
            returns: Returns::new(),
        }
    }

    fn publish(&mut self, routing_key: &str, id: &str) -> u64 {
        let seq = self.confirms.on_publish().unwrap();
        self.returns.on_mandatory_publish(seq, key(routing_key, id));
        seq
    }

    fn returned(&mut self, routing_key: &str, id: &str) -> ReturnMatch {
        let ret = BasicReturn {
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
            exchange: "events".into(),
            routing_key: routing_key.into(),
        };
        self.returns.on_return(ret, Some(&ShortString::from(id)))
    }

    fn confirm(&mut self, method: Method) -> Result<Vec<(u64, Fate)>, ConfirmError> {
        let (outcome, tag, multiple) = match method {
            Method::BasicAck(a) => (Outcome::Ack, a.delivery_tag, a.multiple),
            Method::BasicNack(n) => (Outcome::Nack, n.delivery_tag, n.multiple),
            other => panic!("{other:?}"),
        };
        let mut resolved = Vec::new();
        self.confirms.on_confirm(outcome, tag, multiple, &mut resolved)?;
        Ok(resolved
            .into_iter()
            .map(|seq| {
                let ret = self.returns.resolve(seq);
                let fate = match (outcome, ret) {
                    (Outcome::Nack, _) => Fate::Nacked,
                    (Outcome::Ack, Some(ret)) => Fate::Returned(ret.reply_code),
                    (Outcome::Ack, None) => Fate::Routed,
                };
                (seq, fate)
            })
            .collect())
    }
}

fn key(routing_key: &str, id: &str) -> ReturnKey {
    ReturnKey {
        exchange: "events".into(),
        routing_key: routing_key.into(),
        message_id: Some(id.into()),
    }
}

fn ack(tag: u64, multiple: bool) -> Method {
    BasicAck {
        delivery_tag: tag,
        multiple,
    }
    .into()
}

fn nack(tag: u64, multiple: bool) -> Method {
    BasicNack {
        delivery_tag: tag,
        multiple,
        requeue: false,
    }
    .into()
}

#[test]
fn sequence_numbers_start_at_one_after_select_and_only_then() {
    let mut confirms = Confirms::new();
    assert_eq!(confirms.on_publish(), None, "no numbers before confirm.select");
    confirms.select();
    confirms.select();
    assert_eq!(confirms.on_publish(), Some(1));
    assert_eq!(confirms.on_publish(), Some(2));
    assert_eq!(confirms.next_sequence(), Some(3));
    let mut resolved = Vec::new();
    assert_eq!(
        Confirms::new().on_confirm(Outcome::Ack, 1, false, &mut resolved),
        Err(ConfirmError::NotInConfirmMode(Outcome::Ack, 1))
    );
}

#[test]
fn a_return_among_interleaved_mandatory_publishes_pairs_with_its_own_publish_under_a_multiple_ack() {
    let mut p = Publisher::new();
    // Three publishes to the same key: only the second reaches no queue. The
    // return names exchange and key only; the message id tells them apart.
    assert_eq!(p.publish("order.placed", "a"), 1);
    assert_eq!(p.publish("order.placed", "b"), 2);
    assert_eq!(p.publish("order.placed", "c"), 3);
    assert_eq!(p.publish("order.paid", "d"), 4);
    assert_eq!(p.returned("order.placed", "b"), ReturnMatch::Matched(2));
    // A single ack for 1 arrives after the return for 2: 2 is still open.
    assert_eq!(p.confirm(ack(1, false)).unwrap(), [(1, Fate::Routed)]);
    assert_eq!(p.publish("order.placed", "e"), 5);
    assert_eq!(p.returned("order.placed", "e"), ReturnMatch::Matched(5));
    // One ack with multiple covers 2..=5.
    assert_eq!(
        p.confirm(ack(5, true)).unwrap(),
        [
            (2, Fate::Returned(312)),
            (3, Fate::Routed),
            (4, Fate::Routed),
            (5, Fate::Returned(312)),
        ]
    );
    assert_eq!(p.confirms.outstanding(), 0);
    assert_eq!(p.returns.outstanding(), 0);
}

#[test]
fn identical_publishes_pair_returns_oldest_first() {
    // Without distinct message ids the oldest unreturned publish is taken: a
    // second return for the same key pairs with the next one, not the first again.
    let mut p = Publisher::new();
    p.publish("k", "same");
    p.publish("k", "same");
    assert_eq!(p.returned("k", "same"), ReturnMatch::Matched(1));
    assert_eq!(p.returned("k", "same"), ReturnMatch::Matched(2));
    assert!(matches!(p.returned("k", "same"), ReturnMatch::Unmatched(_)));
}

#[test]
fn a_return_for_an_already_confirmed_publish_or_unknown_message_is_reported_unmatched() {
    let mut p = Publisher::new();
    p.publish("k", "x");
    p.confirm(ack(1, false)).unwrap();
    match p.returned("k", "x") {
        ReturnMatch::Unmatched(ret) => assert_eq!(ReplyCode::from_u16(ret.reply_code), ReplyCode::NoRoute),
        other => panic!("{other:?}"),
    }
    p.publish("k", "y");
    assert!(matches!(p.returned("k", "other-id"), ReturnMatch::Unmatched(_)));
    assert!(matches!(p.returned("other-key", "y"), ReturnMatch::Unmatched(_)));
}

#[test]
fn a_nack_with_multiple_resolves_every_outstanding_publish_up_to_its_tag() {
    let mut p = Publisher::new();
    for id in ["a", "b", "c", "d", "e"] {
        p.publish("k", id);
    }
    assert_eq!(p.confirm(ack(2, false)).unwrap(), [(2, Fate::Routed)]);
    assert_eq!(
        p.confirm(nack(4, true)).unwrap(),
        [(1, Fate::Nacked), (3, Fate::Nacked), (4, Fate::Nacked)]
    );
    assert_eq!(p.confirms.oldest_outstanding(), Some(5));
}

#[test]
fn a_duplicate_ack_is_a_protocol_error_and_resolves_nothing() {
    let mut p = Publisher::new();
    p.publish("k", "a");
    p.publish("k", "b");
    p.publish("k", "c");
    p.confirm(ack(2, false)).unwrap();
    let dup = p.confirm(ack(2, false)).unwrap_err();
    assert_eq!(
        dup,
        ConfirmError::AlreadyResolved {
            outcome: Outcome::Ack,
            tag: 2,
            multiple: false
        }
    );
    // A nack for a publish already acked: never both for one publish.
    assert!(matches!(
        p.confirm(nack(2, false)),
        Err(ConfirmError::AlreadyResolved { .. })
    ));
    p.confirm(ack(1, true)).unwrap();
    // A multiple ack covering only resolved publishes.
    assert!(matches!(
        p.confirm(ack(2, true)),
        Err(ConfirmError::AlreadyResolved { .. })
    ));
    // A tag never published, and tag 0.
    assert_eq!(
        p.confirm(ack(9, true)).unwrap_err(),
        ConfirmError::UnknownTag {
            outcome: Outcome::Ack,
            tag: 9,
            published: 3
        }
    );
    assert!(matches!(
        p.confirm(ack(0, true)),
        Err(ConfirmError::UnknownTag { tag: 0, .. })
    ));
    assert_eq!(p.confirms.outstanding(), 1, "the errors resolved nothing");
    assert_eq!(p.confirm(ack(3, false)).unwrap(), [(3, Fate::Routed)]);
}

#[test]
fn confirms_scale_to_a_window_of_thousands_with_out_of_order_single_acks() {
    let mut confirms = Confirms::new();
    confirms.select();
    for _ in 0..10_000 {
        confirms.on_publish();
    }
    let mut resolved = Vec::new();
    for tag in (1..=5_000u64).rev().map(|n| n * 2) {
        confirms.on_confirm(Outcome::Ack, tag, false, &mut resolved).unwrap();
    }
    confirms.on_confirm(Outcome::Ack, 9_999, true, &mut resolved).unwrap();
    assert_eq!(resolved.len(), 10_000);
    resolved.sort_unstable();
    resolved.dedup();
    assert_eq!(resolved.len(), 10_000, "each publish resolved once");
}

fn publish_frames(channel: u16, body: &[u8], split: usize) -> Vec<Frame> {
    let mut frames = vec![
        Frame::Method(channel, BasicPublish::default().into()),
        Frame::Header(
            channel,
            ContentHeader::basic(body.len() as u64, BasicProperties::default()),
        ),
    ];
    frames.extend(
        body.chunks(split.max(1))
            .map(|c| Frame::Body(channel, Bytes::copy_from_slice(c))),
    );
    frames
}

#[test]
fn content_assembly_joins_body_frames_and_passes_other_methods_through() {
    let mut channel = ContentAssembler::new();
    assert_eq!(
        channel.push(Frame::Method(1, BasicQosOk {}.into())).unwrap(),
        Assembly::Method(BasicQosOk {}.into())
    );
    let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let frames = publish_frames(1, &body, 4088);
    let last = frames.len() - 1;
    for (i, frame) in frames.into_iter().enumerate() {
        match channel.push(frame).unwrap() {
            Assembly::Partial => assert!(i < last),
            Assembly::Complete(content) => {
                assert_eq!(i, last);
                assert_eq!(&content.body[..], &body[..]);
                assert!(matches!(content.method, Method::BasicPublish(_)));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(!channel.in_progress());
}

#[test]
fn an_empty_body_completes_at_the_header() {
    let mut channel = ContentAssembler::new();
    let frames = publish_frames(1, b"", 1);
    assert_eq!(frames.len(), 2);
    assert_eq!(channel.push(frames[0].clone()).unwrap(), Assembly::Partial);
    assert!(matches!(channel.push(frames[1].clone()).unwrap(), Assembly::Complete(c) if c.body.is_empty()));
}

#[test]
fn a_single_body_frame_is_not_copied() {
    let mut channel = ContentAssembler::new();
    let body = Bytes::from(vec![7u8; 256]);
    channel.push(Frame::Method(1, BasicDeliver::default().into())).unwrap();
    channel
        .push(Frame::Header(1, ContentHeader::basic(256, BasicProperties::default())))
        .unwrap();
    let Assembly::Complete(content) = channel.push(Frame::Body(1, body.clone())).unwrap() else {
        panic!()
    };
    assert_eq!(
        content.body.as_ptr(),
        body.as_ptr(),
        "the body shares the frame's buffer"
    );
}

#[test]
fn frames_out_of_sequence_are_unexpected_frame_errors() {
    let header = Frame::Header(1, ContentHeader::basic(3, BasicProperties::default()));
    let body = Frame::Body(1, Bytes::from_static(b"abc"));
    let publish = Frame::Method(1, BasicPublish::default().into());

    let mut channel = ContentAssembler::new();
    let err = channel.push(header.clone()).unwrap_err();
    assert_eq!(
        err,
        ContentError::UnexpectedFrame {
            expected: "method",
            got: "content header"
        }
    );
    assert_eq!(err.reply_code(), ReplyCode::UnexpectedFrame);
    assert!(channel.push(body.clone()).is_err());

    channel.push(publish.clone()).unwrap();
    assert!(matches!(
        channel.push(publish.clone()),
        Err(ContentError::UnexpectedFrame { .. })
    ));
    assert!(!channel.in_progress(), "an error resets the assembler");

    channel.push(publish.clone()).unwrap();
    channel.push(header.clone()).unwrap();
    assert!(matches!(
        channel.push(publish),
        Err(ContentError::UnexpectedFrame {
            expected: "content body",
            ..
        })
    ));
}

#[test]
fn a_body_longer_than_announced_or_the_limit_is_refused() {
    let mut channel = ContentAssembler::with_max_body(1000);
    channel.push(Frame::Method(1, BasicPublish::default().into())).unwrap();
    channel
        .push(Frame::Header(1, ContentHeader::basic(3, BasicProperties::default())))
        .unwrap();
    channel.push(Frame::Body(1, Bytes::from_static(b"ab"))).unwrap();
    assert_eq!(
        channel.push(Frame::Body(1, Bytes::from_static(b"cd"))),
        Err(ContentError::BodyOverrun {
            body_size: 3,
            received: 4
        })
    );

    channel.push(Frame::Method(1, BasicPublish::default().into())).unwrap();
    let err = channel
        .push(Frame::Header(1, ContentHeader::basic(1001, BasicProperties::default())))
        .unwrap_err();
    assert_eq!(
        err,
        ContentError::TooLarge {
            body_size: 1001,
            max: 1000
        }
    );
    assert_eq!(err.reply_code(), ReplyCode::PreconditionFailed);

    // A header that announces 2^64-1 bytes allocates nothing up front.
    let mut channel = ContentAssembler::with_max_body(u64::MAX);
    channel.push(Frame::Method(1, BasicPublish::default().into())).unwrap();
    channel
        .push(Frame::Header(
            1,
            ContentHeader::basic(u64::MAX, BasicProperties::default()),
        ))
        .unwrap();
    channel.push(Frame::Body(1, Bytes::from_static(b"x"))).unwrap();
    assert_eq!(
        channel.push(Frame::Body(1, Bytes::from_static(b"y"))),
        Ok(Assembly::Partial)
    );
}

#[test]
fn a_header_for_another_class_is_refused() {
    let mut channel = ContentAssembler::new();
    channel.push(Frame::Method(1, BasicPublish::default().into())).unwrap();
    let mut header = ContentHeader::basic(1, BasicProperties::default());
    header.class_id = 50;
    assert_eq!(
        channel.push(Frame::Header(1, header)),
        Err(ContentError::ClassMismatch {
            method_class: 60,
            header_class: 50
        })
    );
}

#[test]
fn a_message_with_undecodable_properties_is_assembled_with_its_raw_header() {
    let decoder = acemq_codec::FrameDecoder::new(0);
    // Deliver, then a header whose headers table holds an unknown type 'Z', then the body.
    let mut wire = bytes::BytesMut::new();
    acemq_codec::encode_method(2, &BasicDeliver::default().into(), &mut wire).unwrap();
    let header_payload = [
        0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0x20, 0, 0, 0, 0, 4, 1, b'k', b'Z', 0,
    ];
    wire.extend_from_slice(&[2, 0, 2, 0, 0, 0, header_payload.len() as u8]);
    wire.extend_from_slice(&header_payload);
    wire.extend_from_slice(&[0xCE]);
    acemq_codec::encode_body(2, b"body", &mut wire).unwrap();

    let mut channel = ContentAssembler::new();
    let mut last = None;
    while let Some(frame) = decoder.decode(&mut wire).unwrap() {
        last = Some(channel.push(frame).unwrap());
    }
    let Some(Assembly::Complete(content)) = last else {
        panic!("{last:?}")
    };
    let raw = content.header.unwrap_err();
    assert_eq!(raw.error, acemq_codec::DecodeErrorKind::UnknownFieldType(b'Z'));
    assert_eq!(&raw.raw_properties[..], &header_payload[12..]);
    assert_eq!(
        &content.body[..],
        b"body",
        "the body still arrives, so the message can be set aside"
    );
}

/// Two consumers' deliveries interleaved frame by frame on channels 1 and 2,
/// with an ack for a publisher on channel 3 and a heartbeat between them, as
/// a broker might write them.
fn interleaved_stream() -> bytes::BytesMut {
    use acemq_codec::{encode_content, encode_method};
    let mut one = bytes::BytesMut::new();
    let mut two = bytes::BytesMut::new();
    let deliver = |tag: u64| -> Method {
        BasicDeliver {
            consumer_tag: format!("ctag-{tag}").as_str().into(),
            delivery_tag: tag,
            ..Default::default()
        }
        .into()
    };
    let props = BasicProperties {
        message_id: Some("m-1".into()),
        ..Default::default()
    };
    encode_content(1, &deliver(1), &props, &[1; 5000], 4096, &mut one).unwrap();
    encode_content(2, &deliver(2), &BasicProperties::default(), b"two", 4096, &mut two).unwrap();
    let decoder = acemq_codec::FrameDecoder::new(0);
    let (mut ones, mut twos) = (Vec::new(), Vec::new());
    while let Some(f) = decoder.decode(&mut one).unwrap() {
        ones.push(f);
    }
    while let Some(f) = decoder.decode(&mut two).unwrap() {
        twos.push(f);
    }
    let mut wire = bytes::BytesMut::new();
    for (a, b) in ones.iter().zip(&twos) {
        a.encode(&mut wire).unwrap();
        b.encode(&mut wire).unwrap();
    }
    encode_method(3, &ack(9, false), &mut wire).unwrap();
    Frame::Heartbeat.encode(&mut wire).unwrap();
    for f in &ones[twos.len()..] {
        f.encode(&mut wire).unwrap();
    }
    wire
}

#[test]
fn decode_assembled_builds_the_same_messages_as_decode_and_push_and_leaves_other_frames() {
    use acemq_codec::track::Decoded;
    let decoder = acemq_codec::FrameDecoder::new(4096);

    // Frame by frame.
    let mut wire = interleaved_stream();
    let (mut a1, mut a2) = (ContentAssembler::new(), ContentAssembler::new());
    let mut expected = Vec::new();
    let mut expected_others = Vec::new();
    while let Some(frame) = decoder.decode(&mut wire).unwrap() {
        let assembler = match frame.channel() {
            1 => &mut a1,
            2 => &mut a2,
            _ => {
                expected_others.push(frame);
                continue;
            }
        };
        match assembler.push(frame).unwrap() {
            Assembly::Complete(content) => expected.push(content),
            Assembly::Method(method) => panic!("{method:?} on a consumer's channel"),
            Assembly::Partial => {}
        }
    }

    // In one step, fed a few bytes at a time.
    let whole = interleaved_stream();
    let mut buf = bytes::BytesMut::new();
    let (mut b1, mut b2) = (ContentAssembler::new(), ContentAssembler::new());
    let (mut got, mut others, mut partials) = (Vec::new(), Vec::new(), 0);
    for part in whole.chunks(333) {
        buf.extend_from_slice(part);
        loop {
            let decoded = decoder
                .decode_assembled(&mut buf, |ch| match ch {
                    1 => Some(&mut b1),
                    2 => Some(&mut b2),
                    _ => None,
                })
                .unwrap();
            match decoded {
                Decoded::NeedMore => break,
                Decoded::Partial(_) => partials += 1,
                Decoded::Complete(1) => got.push(b1.take_complete().unwrap()),
                Decoded::Complete(2) => got.push(b2.take_complete().unwrap()),
                Decoded::Complete(ch) => panic!("no assembler for channel {ch}"),
                Decoded::Other => others.push(decoder.decode(&mut buf).unwrap().unwrap()),
            }
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got.len(), 2);
    assert_eq!(got, expected);
    // Channel 2's one-frame message finishes first.
    assert_eq!(got[0].body, Bytes::from_static(b"two"));
    assert_eq!(
        got[1].header.as_ref().unwrap().properties.message_id,
        Some("m-1".into())
    );
    assert_eq!(got[1].body.len(), 5000);
    // The ack on channel 3 (no assembler) and the heartbeat are left to
    // `decode`, in stream order.
    assert_eq!(others, expected_others);
    assert_eq!(others.len(), 2);
    // Two methods and two headers, and all body frames but the last of each.
    assert_eq!(partials, 4 + (2 - 1));
}

#[test]
fn a_finished_message_blocks_its_channel_until_taken_and_nothing_is_lost() {
    use acemq_codec::track::Decoded;
    let decoder = acemq_codec::FrameDecoder::new(0);
    let mut wire = bytes::BytesMut::new();
    for tag in [1, 2] {
        let deliver: Method = BasicDeliver {
            delivery_tag: tag,
            ..Default::default()
        }
        .into();
        acemq_codec::encode_content(5, &deliver, &BasicProperties::default(), b"x", 0, &mut wire).unwrap();
    }
    let mut assembler = ContentAssembler::new();
    let step = |wire: &mut bytes::BytesMut, assembler: &mut ContentAssembler| {
        decoder.decode_assembled(wire, |_| Some(assembler)).unwrap()
    };
    assert_eq!(step(&mut wire, &mut assembler), Decoded::Partial(5));
    assert_eq!(step(&mut wire, &mut assembler), Decoded::Partial(5));
    assert_eq!(step(&mut wire, &mut assembler), Decoded::Complete(5));
    let left = wire.len();
    // Not taken: reported again, and the second message stays in the buffer.
    assert_eq!(step(&mut wire, &mut assembler), Decoded::Complete(5));
    assert_eq!(wire.len(), left);
    assert!(assembler.has_complete());
    let first = assembler.take_complete().unwrap();
    assert!(matches!(
        first.method,
        Method::BasicDeliver(BasicDeliver { delivery_tag: 1, .. })
    ));
    assert_eq!(assembler.take_complete(), None);
    assert_eq!(step(&mut wire, &mut assembler), Decoded::Partial(5));
}

#[test]
fn decode_assembled_reports_a_sequence_error_with_its_channel_and_resets_that_assembler() {
    use acemq_codec::track::{AssembleError, Decoded};
    let decoder = acemq_codec::FrameDecoder::new(0);
    let mut wire = bytes::BytesMut::new();
    // A body frame on channel 4 with no message in progress.
    Frame::Body(4, Bytes::from_static(b"stray")).encode(&mut wire).unwrap();
    // Then a whole message, which must still assemble.
    acemq_codec::encode_content(
        4,
        &BasicDeliver::default().into(),
        &BasicProperties::default(),
        b"ok",
        0,
        &mut wire,
    )
    .unwrap();
    let mut assembler = ContentAssembler::new();
    let err = decoder
        .decode_assembled(&mut wire, |_| Some(&mut assembler))
        .unwrap_err();
    assert_eq!(
        err,
        AssembleError::Content {
            channel: 4,
            error: ContentError::UnexpectedFrame {
                expected: "method",
                got: "content body"
            }
        }
    );
    assert!(!assembler.in_progress());
    let mut done = None;
    loop {
        match decoder.decode_assembled(&mut wire, |_| Some(&mut assembler)).unwrap() {
            Decoded::NeedMore => break,
            Decoded::Complete(4) => done = assembler.take_complete(),
            Decoded::Partial(4) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(done.unwrap().body, Bytes::from_static(b"ok"));
}

#[test]
fn a_malformed_delivery_out_of_sequence_is_a_stream_error_as_with_decode() {
    use acemq_codec::track::AssembleError;
    use acemq_codec::{DecodeErrorKind, Error};
    let deliver: Method = BasicDeliver::default().into();
    let mut first = bytes::BytesMut::new();
    acemq_codec::encode_method(1, &deliver, &mut first).unwrap();
    // A second basic.deliver before the first one's header, cut short: its
    // payload ends inside the delivery tag.
    let mut second = bytes::BytesMut::new();
    acemq_codec::encode_method(1, &deliver, &mut second).unwrap();
    let payload_len = 4 + 1 + 3; // ids, empty consumer tag, 3 of the tag's 8 bytes
    let mut wire = first.clone();
    wire.extend_from_slice(&[1, 0, 1]);
    wire.extend_from_slice(&(payload_len as u32).to_be_bytes());
    wire.extend_from_slice(&second[7..7 + payload_len]);
    wire.extend_from_slice(&[0xCE]);

    let decoder = acemq_codec::FrameDecoder::new(0);
    let mut by_frames = wire.clone();
    let mut assembler = ContentAssembler::new();
    assembler
        .push(decoder.decode(&mut by_frames).unwrap().unwrap())
        .unwrap();
    let expected = decoder.decode(&mut by_frames).unwrap_err();
    assert!(matches!(
        expected,
        Error::Malformed {
            kind: DecodeErrorKind::Truncated,
            ..
        }
    ));

    let mut assembler = ContentAssembler::new();
    decoder.decode_assembled(&mut wire, |_| Some(&mut assembler)).unwrap();
    let err = decoder
        .decode_assembled(&mut wire, |_| Some(&mut assembler))
        .unwrap_err();
    assert_eq!(err, AssembleError::Decode(expected));
    assert!(wire.is_empty());
}

/// What the confirm tracker must agree with: the set of unresolved numbers.
#[derive(Debug, Clone)]
enum ConfirmStep {
    Publish(u8),
    Confirm { tag_back: u16, multiple: bool },
}

use proptest::prelude::*;

proptest::proptest! {
    #[test]
    fn the_confirm_tracker_resolves_what_a_set_of_outstanding_numbers_says(
        steps in proptest::collection::vec(
            proptest::prop_oneof![
                (1u8..40).prop_map(ConfirmStep::Publish),
                (0u16..60, proptest::bool::ANY).prop_map(|(tag_back, multiple)| ConfirmStep::Confirm { tag_back, multiple }),
            ],
            1..60,
        )
    ) {
        let mut confirms = Confirms::new();
        confirms.select();
        // The same steps through `on_publishes` and `on_confirm_runs`.
        let mut by_runs = Confirms::new();
        by_runs.select();
        let mut model = std::collections::BTreeSet::new();
        let mut published = 0u64;
        for step in steps {
            match step {
                ConfirmStep::Publish(n) => {
                    // One by one, and all at once in the twin.
                    prop_assert_eq!(by_runs.on_publishes(u64::from(n)), Some(published + 1));
                    for _ in 0..n {
                        published += 1;
                        prop_assert_eq!(confirms.on_publish(), Some(published));
                        model.insert(published);
                    }
                }
                ConfirmStep::Confirm { tag_back, multiple } => {
                    // A tag counted back from the last published, so most hit.
                    let tag = published.saturating_sub(u64::from(tag_back));
                    let mut resolved = Vec::new();
                    let expected: Vec<u64> = if multiple {
                        model.range(..=tag).copied().collect()
                    } else {
                        model.get(&tag).copied().into_iter().collect()
                    };
                    let result = confirms.on_confirm(Outcome::Ack, tag, multiple, &mut resolved);
                    let mut runs = Vec::new();
                    let by_runs_result = by_runs.on_confirm_runs(Outcome::Ack, tag, multiple, &mut runs);
                    prop_assert_eq!(&by_runs_result, &result);
                    let expanded: Vec<u64> = runs.iter().flat_map(|&(first, last)| first..=last).collect();
                    prop_assert_eq!(&expanded, &resolved);
                    for pair in runs.windows(2) {
                        prop_assert!(pair[0].1 + 1 < pair[1].0, "runs {:?} are adjacent or out of order", runs);
                    }
                    if tag == 0 || expected.is_empty() {
                        prop_assert!(result.is_err(), "tag {} multiple {}: {:?}", tag, multiple, resolved);
                        prop_assert!(resolved.is_empty());
                    } else {
                        prop_assert!(result.is_ok());
                        prop_assert_eq!(&resolved, &expected);
                        for seq in &expected {
                            model.remove(seq);
                        }
                    }
                }
            }
            prop_assert_eq!(confirms.outstanding(), model.len());
            prop_assert_eq!(by_runs.outstanding(), model.len());
            prop_assert_eq!(confirms.oldest_outstanding(), model.first().copied());
        }
        let mut rest = Vec::new();
        confirms.fail_all(&mut rest);
        prop_assert_eq!(rest, model.into_iter().collect::<Vec<_>>());
        prop_assert_eq!(confirms.outstanding(), 0);
    }
}
