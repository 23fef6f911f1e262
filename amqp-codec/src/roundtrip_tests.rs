//! Property-based round trips: every method, every field type and the basic
//! properties go through encode → decode → encode unchanged. Together with the
//! known-answer tests against RabbitMQ's own bytes (tests/known_answers.rs),
//! which catch mistakes a symmetric encoder and decoder would share.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::{arbitrary, ContentHeader, FieldTable, FieldValue, Frame, FrameDecoder, Method};

fn encode(frame: &Frame) -> Bytes {
    let mut out = BytesMut::new();
    frame.encode(&mut out).expect("encodes");
    out.freeze()
}

fn decode_one(bytes: &Bytes) -> Frame {
    let (frame, used) = FrameDecoder::new(0).decode_slice(bytes).expect("decodes");
    assert_eq!(used, bytes.len(), "one frame, nothing left over");
    frame
}

#[test]
fn every_method_in_the_table_round_trips_with_default_arguments() {
    let all = Method::all_defaults();
    // connection 14, channel 6, exchange 8, queue 10, basic 18, confirm 2, tx 6
    assert_eq!(all.len(), 64, "AMQP 0-9-1 with RabbitMQ's extensions has 64 methods");
    let mut ids = std::collections::HashSet::new();
    for method in all {
        assert!(
            ids.insert((method.class_id(), method.method_id())),
            "{} has a duplicate id",
            method.name()
        );
        let frame = Frame::Method(7, method);
        let bytes = encode(&frame);
        assert_eq!(decode_one(&bytes), frame);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn every_method_round_trips(channel in any::<u16>(), method in Method::arbitrary()) {
        let frame = Frame::Method(channel, method);
        let bytes = encode(&frame);
        let back = decode_one(&bytes);
        prop_assert_eq!(&back, &frame);
        prop_assert_eq!(encode(&back), bytes);
    }
}

proptest! {
    #[test]
    fn every_field_type_round_trips(value in arbitrary::field_value()) {
        let mut table = FieldTable::new();
        table.push("k", value);
        let mut bytes = BytesMut::new();
        table.encode(&mut bytes).unwrap();
        let bytes = bytes.freeze();
        let back = FieldTable::decode(&bytes, 64).unwrap();
        prop_assert_eq!(&back, &table);
        let mut again = BytesMut::new();
        back.encode(&mut again).unwrap();
        prop_assert_eq!(again.freeze(), bytes);
    }

    #[test]
    fn tables_keep_wire_order_and_duplicate_keys(table in arbitrary::table()) {
        let mut bytes = BytesMut::new();
        table.encode(&mut bytes).unwrap();
        let back = FieldTable::decode(&bytes.freeze(), 64).unwrap();
        let keys: Vec<_> = table.iter().map(|(k, _)| k.clone()).collect();
        let back_keys: Vec<_> = back.iter().map(|(k, _)| k.clone()).collect();
        prop_assert_eq!(back_keys, keys);
        prop_assert_eq!(back, table);
    }

    #[test]
    fn basic_properties_round_trip_in_a_content_header(
        channel in any::<u16>(),
        body_size in any::<u64>(),
        properties in arbitrary::properties(),
    ) {
        let frame = Frame::Header(channel, ContentHeader::basic(body_size, properties));
        let bytes = encode(&frame);
        let back = decode_one(&bytes);
        prop_assert_eq!(&back, &frame);
        prop_assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn body_frames_round_trip(channel in any::<u16>(), body in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let frame = Frame::Body(channel, Bytes::from(body));
        let bytes = encode(&frame);
        prop_assert_eq!(decode_one(&bytes), frame);
    }

    #[test]
    fn floats_round_trip_bit_for_bit_nan_included(bits32 in any::<u32>(), bits64 in any::<u64>()) {
        let table: FieldTable = [
            ("f", FieldValue::F32(f32::from_bits(bits32))),
            ("d", FieldValue::F64(f64::from_bits(bits64))),
        ].into_iter().collect();
        let mut bytes = BytesMut::new();
        table.encode(&mut bytes).unwrap();
        let bytes = bytes.freeze();
        let back = FieldTable::decode(&bytes, 64).unwrap();
        let mut again = BytesMut::new();
        back.encode(&mut again).unwrap();
        prop_assert_eq!(again.freeze(), bytes);
    }
}

/// Bit fields pack LSB first into one octet per run of consecutive bits; a
/// symmetric mistake would pass the round trips, so pin the bytes.
#[test]
fn consecutive_bits_pack_least_significant_first() {
    let declare = crate::QueueDeclare {
        queue: "q".into(),
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: true,
        no_wait: false,
        ..Default::default()
    };
    let bytes = encode(&Frame::Method(1, declare.into()));
    // type, channel, size, class 50, method 10, reserved short, "q", bits, empty table, end
    let expected: &[u8] = &[
        1,
        0,
        1,
        0,
        0,
        0,
        13,
        0,
        50,
        0,
        10,
        0,
        0,
        1,
        b'q',
        0b0000_1010,
        0,
        0,
        0,
        0,
        0xCE,
    ];
    assert_eq!(&bytes[..], expected);

    // basic.nack: delivery-tag, then multiple (bit 0) and requeue (bit 1) share an octet.
    let nack = crate::BasicNack {
        delivery_tag: 5,
        multiple: true,
        requeue: false,
    };
    let bytes = encode(&Frame::Method(1, nack.into()));
    assert_eq!(
        &bytes[7..bytes.len() - 1],
        &[0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 5, 0b01]
    );

    // basic.deliver: the redelivered bit sits alone between a longlong and a shortstr.
    let deliver = crate::BasicDeliver {
        delivery_tag: 1,
        redelivered: true,
        ..Default::default()
    };
    let bytes = encode(&Frame::Method(1, deliver.into()));
    assert_eq!(
        &bytes[7..bytes.len() - 1],
        &[0, 60, 0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    );
}

/// The flag word: content-type is bit 15, cluster-id bit 2.
#[test]
fn property_flags_follow_the_spec_order() {
    let props = crate::BasicProperties {
        content_type: Some("a".into()),
        cluster_id: Some("c".into()),
        ..Default::default()
    };
    assert_eq!(props.flags(), 0x8004);
    let props = crate::BasicProperties {
        headers: Some(FieldTable::new()),
        delivery_mode: Some(2),
        ..Default::default()
    };
    assert_eq!(props.flags(), 0x3000);
}

/// What decoding a property list field by field says of `input`: the oracle
/// for [`crate::BasicProperties::validate`], which a header is checked with
/// before its fields are built lazily.
fn decode_eagerly(input: &[u8], max_depth: usize) -> Result<crate::BasicProperties, crate::DecodeErrorKind> {
    let mut props = crate::BasicProperties::default();
    let ctx = crate::parse::Ctx {
        max_depth,
        validated: false,
    };
    crate::BasicProperties::decode_into(&mut props, ctx, input, None).map(|()| props)
}

fn validate(input: &[u8], max_depth: usize) -> Result<(), crate::DecodeErrorKind> {
    let ctx = crate::parse::Ctx {
        max_depth,
        validated: false,
    };
    crate::BasicProperties::validate(ctx, input)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Encoded properties with one byte changed, or cut short: validating
    /// accepts exactly what decoding accepts, with the same error, and what
    /// it accepts builds into what decoding gives.
    #[test]
    fn validating_properties_agrees_with_decoding_them(
        properties in arbitrary::properties(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
        change in 0..3u8,
        max_depth in 1..4usize,
    ) {
        let mut wire = BytesMut::new();
        properties.encode(&mut wire).expect("encodes");
        let mut wire = wire.to_vec();
        match change {
            0 => {}
            1 => {
                let at = at.index(wire.len());
                wire[at] = byte;
            }
            _ => wire.truncate(cut.index(wire.len() + 1)),
        }
        let eager = decode_eagerly(&wire, max_depth);
        prop_assert_eq!(validate(&wire, max_depth), eager.as_ref().map(drop).map_err(|e| *e));

        // The same list in a content header frame, through the decoder.
        let mut payload = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
        payload.extend_from_slice(&wire);
        let mut framed = vec![crate::FRAME_HEADER, 0, 7];
        framed.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        framed.extend_from_slice(&payload);
        framed.push(crate::FRAME_END);
        let framed = Bytes::from(framed);
        let (frame, used) = FrameDecoder::new(0).with_max_depth(max_depth).decode_slice(&framed).expect("a sound frame");
        prop_assert_eq!(used, framed.len());
        match (frame, eager) {
            (Frame::Header(7, header), Ok(eager)) => {
                prop_assert!(!header.properties.is_built());
                prop_assert_eq!(header.properties.flags(), eager.flags());
                prop_assert_eq!(&*header.properties, &eager);
                // Unchanged, it encodes as the bytes received; built, the
                // same bytes again.
                let again = encode(&Frame::Header(7, header.clone()));
                prop_assert_eq!(&again, &framed);
                let rebuilt = ContentHeader::basic(9, header.properties.into_basic());
                prop_assert_eq!(encode(&Frame::Header(7, rebuilt)), framed);
            }
            (Frame::UndecodableHeader(7, header), Err(error)) => {
                prop_assert_eq!(header.error, error);
                prop_assert_eq!(&header.raw_properties[..], &wire[..]);
            }
            (frame, eager) => prop_assert!(false, "decoded {:?}, field by field {:?}", frame, eager),
        }
    }
}
