//! Bad input gets the error it deserves, and never a panic or a stack
//! overflow: truncated frames, a wrong end byte, oversized frames, unknown
//! ids and field types, lengths that lie, and nesting bombs.

use acemq_codec::{
    encode_method, BasicProperties, ContentHeader, DecodeErrorKind, Error, FieldTable, FieldValue, Frame, FrameDecoder,
    QueueDeclare, ReplyCode,
};
use bytes::{BufMut, Bytes, BytesMut};

fn frame(frame_type: u8, channel: u16, payload: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_u8(frame_type);
    out.put_u16(channel);
    out.put_u32(payload.len() as u32);
    out.put_slice(payload);
    out.put_u8(0xCE);
    out
}

fn declare_frame() -> BytesMut {
    let mut arguments = FieldTable::new();
    arguments.insert("x-message-ttl", FieldValue::I32(1000));
    let declare = QueueDeclare {
        queue: "orders".into(),
        durable: true,
        arguments,
        ..Default::default()
    };
    let mut out = BytesMut::new();
    encode_method(1, &declare.into(), &mut out).unwrap();
    out
}

fn decode(bytes: &[u8]) -> Result<(Frame, usize), Error> {
    FrameDecoder::new(131_072).decode_slice(&Bytes::copy_from_slice(bytes))
}

#[test]
fn a_truncated_frame_is_incomplete_and_the_stream_decoder_waits() {
    let whole = declare_frame();
    for cut in 0..whole.len() {
        match decode(&whole[..cut]) {
            Err(Error::Incomplete { needed }) => assert!(needed >= 1 && needed <= whole.len() - cut, "cut {cut}"),
            other => panic!("cut at {cut}: {other:?}"),
        }
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(FrameDecoder::new(131_072).decode(&mut buf), Ok(None), "cut at {cut}");
        assert_eq!(buf.len(), cut, "nothing consumed before the frame is whole");
    }
    assert!(decode(&whole).is_ok());
}

#[test]
fn a_payload_shorter_than_its_method_is_malformed_not_incomplete() {
    let whole = declare_frame();
    let payload = &whole[7..whole.len() - 1];
    for cut in 4..payload.len() {
        match decode(&frame(1, 1, &payload[..cut])) {
            Err(Error::Malformed {
                context: "queue.declare",
                ..
            }) => {}
            other => panic!("cut at {cut}: {other:?}"),
        }
    }
    let err = decode(&frame(1, 1, &payload[..3])).unwrap_err();
    assert_eq!(
        err,
        Error::Malformed {
            context: "method frame",
            kind: DecodeErrorKind::Truncated
        }
    );
    assert_eq!(err.reply_code(), ReplyCode::SyntaxError);
}

#[test]
fn a_method_frame_too_short_for_its_ids_is_malformed_even_at_the_end_of_the_buffer() {
    // Found by fuzzing: the basic.deliver fast path looked at the ids before
    // checking the payload could hold them.
    for payload in [&[][..], &[0], &[0, 60], &[0, 60, 0]] {
        let mut buf = frame(1, 1, payload);
        match FrameDecoder::new(131_072).decode(&mut buf) {
            Err(Error::Malformed {
                context: "method frame",
                kind: DecodeErrorKind::Truncated,
            }) => {}
            other => panic!("payload {payload:?}: {other:?}"),
        }
    }
}

#[test]
fn trailing_bytes_after_the_last_argument_are_malformed() {
    let whole = declare_frame();
    let mut payload = whole[7..whole.len() - 1].to_vec();
    payload.push(0);
    assert_eq!(
        decode(&frame(1, 1, &payload)).unwrap_err(),
        Error::Malformed {
            context: "queue.declare",
            kind: DecodeErrorKind::TrailingBytes(1)
        }
    );
}

#[test]
fn a_wrong_end_byte_is_bad_frame_end() {
    let mut whole = declare_frame();
    let last = whole.len() - 1;
    whole[last] = 0xCD;
    assert_eq!(decode(&whole).unwrap_err(), Error::BadFrameEnd { found: 0xCD });
    assert_eq!(Error::BadFrameEnd { found: 0 }.reply_code(), ReplyCode::FrameError);
}

#[test]
fn an_oversized_frame_is_refused_from_its_header_before_buffering() {
    // Only the 7-byte header has arrived, announcing a 1 GiB payload.
    let mut buf = BytesMut::from(&[3u8, 0, 1, 0x40, 0, 0, 0][..]);
    let err = FrameDecoder::new(131_072).decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        Error::FrameTooLarge {
            size: (1 << 30) + 8,
            frame_max: 131_072
        }
    );
    assert!(buf.capacity() < 4096, "nothing was reserved for the oversized payload");

    // The limit is the whole frame, frame header and end byte included: frame_max itself passes.
    let body = vec![0u8; 4096 - 8];
    assert!(FrameDecoder::new(4096)
        .decode_slice(&frame(3, 1, &body).freeze())
        .is_ok());
    let body = vec![0u8; 4096 - 7];
    assert!(matches!(
        FrameDecoder::new(4096).decode_slice(&frame(3, 1, &body).freeze()),
        Err(Error::FrameTooLarge {
            size: 4097,
            frame_max: 4096
        })
    ));
}

#[test]
fn an_allowance_takes_frames_that_far_over_frame_max_and_no_further() {
    // RabbitMQ's reader takes a payload of frame_max bytes: 8 over the
    // whole-frame limit. A decoder without an allowance keeps to the limit.
    let exactly = frame(3, 1, &vec![0u8; 4096]).freeze();
    assert!(matches!(
        FrameDecoder::new(4096).decode_slice(&exactly),
        Err(Error::FrameTooLarge {
            size: 4104,
            frame_max: 4096
        })
    ));
    let lenient = FrameDecoder::new(4096).with_allowance(8);
    assert_eq!(lenient.allowance(), 8);
    assert!(lenient.decode_slice(&exactly).is_ok());
    let one_over = frame(3, 1, &vec![0u8; 4097]).freeze();
    assert_eq!(
        lenient.decode_slice(&one_over).unwrap_err(),
        Error::FrameTooLarge {
            size: 4105,
            frame_max: 4096
        }
    );
    // frame_max 0 is still no limit at all.
    assert!(FrameDecoder::new(0).with_allowance(8).decode_slice(&one_over).is_ok());
}

#[test]
fn an_unknown_frame_type_is_refused_from_its_header() {
    assert_eq!(decode(&[4, 0, 0, 0, 0, 0, 0]).unwrap_err(), Error::UnknownFrameType(4));
    assert_eq!(
        decode(b"AMQP\x00\x00\x09\x01").unwrap_err(),
        Error::UnknownFrameType(b'A')
    );
}

#[test]
fn unknown_class_and_method_ids_are_unknown_method() {
    for (class, method) in [(0u16, 0u16), (10, 99), (30, 10), (60, 41), (85, 20), (999, 1)] {
        let mut payload = Vec::new();
        payload.extend_from_slice(&class.to_be_bytes());
        payload.extend_from_slice(&method.to_be_bytes());
        let err = decode(&frame(1, 1, &payload)).unwrap_err();
        assert_eq!(err, Error::UnknownMethod { class, method });
        assert_eq!(err.reply_code(), ReplyCode::CommandInvalid);
    }
}

#[test]
fn a_heartbeat_with_a_payload_or_off_channel_zero_is_malformed() {
    assert_eq!(decode(&frame(8, 0, &[])).unwrap().0, Frame::Heartbeat);
    for bad in [frame(8, 1, &[]), frame(8, 0, &[0])] {
        assert!(matches!(
            decode(&bad),
            Err(Error::Malformed {
                kind: DecodeErrorKind::BadHeartbeat,
                ..
            })
        ));
    }
}

/// A table with one entry `k` whose value is given as raw bytes.
fn raw_table(value: &[u8]) -> Vec<u8> {
    let mut t = vec![1, b'k'];
    t.extend_from_slice(value);
    let mut out = (t.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&t);
    out
}

#[test]
fn field_types_outside_rabbitmqs_table_are_refused() {
    let defined = b"tbBsuIilLfdDSATFVx";
    for code in 0..=255u8 {
        // Enough zero bytes after the code for any defined type to parse.
        let mut value = vec![code];
        value.extend_from_slice(&[0; 9]);
        let table = Bytes::from(raw_table(&value));
        let result = FieldTable::decode(&table, 64);
        if defined.contains(&code) {
            if let Err(err) = result {
                assert!(
                    !matches!(err, Error::Malformed { kind: DecodeErrorKind::UnknownFieldType(c), .. } if c == code),
                    "{:?} is defined",
                    char::from(code)
                );
            }
        } else {
            assert_eq!(
                result.unwrap_err(),
                Error::Malformed {
                    context: "field table",
                    kind: DecodeErrorKind::UnknownFieldType(code)
                },
                "{:?}",
                char::from(code)
            );
        }
    }
}

#[test]
fn uppercase_l_reads_as_a_signed_64_bit_integer_and_encodes_back_the_same() {
    let table = Bytes::from(raw_table(&[b'L', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]));
    let decoded = FieldTable::decode(&table, 64).unwrap();
    assert_eq!(decoded.get("k"), Some(&FieldValue::I64L(-2)));
    assert_eq!(decoded.get("k").and_then(FieldValue::as_i64), Some(-2));
    let mut again = BytesMut::new();
    decoded.encode(&mut again).unwrap();
    assert_eq!(&again[..], &table[..]);
}

#[test]
fn lengths_that_point_past_their_container_are_bad_length() {
    // A long string claiming 4 GiB - 1 ("negative" as a signed length).
    let table = Bytes::from(raw_table(&[b'S', 0xff, 0xff, 0xff, 0xff, b'x']));
    assert_eq!(
        FieldTable::decode(&table, 64).unwrap_err(),
        Error::Malformed {
            context: "field table",
            kind: DecodeErrorKind::BadLength(0xffff_ffff)
        }
    );
    // A nested table claiming more than its parent holds.
    let table = Bytes::from(raw_table(&[b'F', 0, 0, 1, 0]));
    assert!(matches!(
        FieldTable::decode(&table, 64),
        Err(Error::Malformed {
            kind: DecodeErrorKind::BadLength(256),
            ..
        })
    ));
    // An array claiming 2 GiB.
    let table = Bytes::from(raw_table(&[b'A', 0x80, 0, 0, 0]));
    assert!(matches!(
        FieldTable::decode(&table, 64),
        Err(Error::Malformed {
            kind: DecodeErrorKind::BadLength(0x8000_0000),
            ..
        })
    ));
    // A short string running past the table's end.
    let table = Bytes::from(vec![0, 0, 0, 2, 200, b'k']);
    assert!(matches!(
        FieldTable::decode(&table, 64),
        Err(Error::Malformed {
            kind: DecodeErrorKind::Truncated,
            ..
        })
    ));
    // The table's own length past the input.
    let table = Bytes::from(vec![0, 0, 0, 9, 1, b'k', b'V']);
    assert!(matches!(
        FieldTable::decode(&table, 64),
        Err(Error::Malformed {
            kind: DecodeErrorKind::BadLength(9),
            ..
        })
    ));
}

/// `depth` levels of `A` arrays inside a one-entry table, innermost empty.
fn array_bomb(depth: usize) -> Vec<u8> {
    // Build inside out: each level is 'A' + length + the level inside it.
    let mut inner: Vec<u8> = Vec::new();
    for _ in 0..depth {
        let mut level = Vec::with_capacity(inner.len() + 5);
        level.push(b'A');
        level.extend_from_slice(&(inner.len() as u32).to_be_bytes());
        level.extend_from_slice(&inner);
        inner = level;
    }
    raw_table(&inner)
}

/// `depth` levels of `F` tables, each holding the next under key `k`.
fn table_bomb(depth: usize) -> Vec<u8> {
    let mut inner: Vec<u8> = vec![0, 0, 0, 0];
    for _ in 1..depth {
        let mut level = Vec::with_capacity(inner.len() + 7);
        let len = (inner.len() + 3) as u32;
        level.extend_from_slice(&len.to_be_bytes());
        level.extend_from_slice(&[1, b'k', b'F']);
        level.extend_from_slice(&inner);
        inner = level;
    }
    inner
}

#[test]
fn nesting_up_to_the_limit_decodes_and_one_more_level_is_refused() {
    // The outer table is level 1; 63 nested arrays make 64 levels.
    assert!(FieldTable::decode(&Bytes::from(array_bomb(63)), 64).is_ok());
    assert_eq!(
        FieldTable::decode(&Bytes::from(array_bomb(64)), 64).unwrap_err(),
        Error::Malformed {
            context: "field table",
            kind: DecodeErrorKind::NestingTooDeep(64)
        }
    );
    assert!(FieldTable::decode(&Bytes::from(table_bomb(64)), 64).is_ok());
    assert!(FieldTable::decode(&Bytes::from(table_bomb(65)), 64).is_err());
    // The limit is configurable.
    assert!(FieldTable::decode(&Bytes::from(table_bomb(3)), 3).is_ok());
    assert!(FieldTable::decode(&Bytes::from(table_bomb(4)), 3).is_err());
}

#[test]
fn a_hundred_thousand_deep_nest_in_one_frame_is_an_error_not_a_stack_overflow() {
    for bomb in [array_bomb(100_000), table_bomb(100_000)] {
        // In a queue.declare's arguments: a stream error (the method is unusable).
        let mut payload = vec![0, 50, 0, 10, 0, 0, 1, b'q', 0];
        payload.extend_from_slice(&bomb);
        let wire = frame(1, 1, &payload).freeze();
        assert!(
            wire.len() > 500_000,
            "the bomb fits in one frame of {} bytes",
            wire.len()
        );
        let err = FrameDecoder::new(0).decode_slice(&wire).unwrap_err();
        assert_eq!(
            err,
            Error::Malformed {
                context: "queue.declare",
                kind: DecodeErrorKind::NestingTooDeep(64)
            }
        );
    }
}

#[test]
fn a_poison_header_is_a_per_message_error_that_keeps_the_stream_and_the_raw_bytes() {
    // Flags: headers only; the headers table is a 100,000-deep bomb.
    let mut properties = 0x2000u16.to_be_bytes().to_vec();
    properties.extend_from_slice(&array_bomb(100_000));
    let mut payload = vec![0, 60, 0, 0];
    payload.extend_from_slice(&5u64.to_be_bytes());
    payload.extend_from_slice(&properties);

    let mut stream = frame(2, 3, &payload);
    stream.extend_from_slice(&frame(3, 3, b"hello"));
    stream.extend_from_slice(&frame(8, 0, &[]));
    let decoder = FrameDecoder::new(0);

    let Some(Frame::UndecodableHeader(3, header)) = decoder.decode(&mut stream).unwrap() else {
        panic!("expected an undecodable header");
    };
    assert_eq!(header.error, DecodeErrorKind::NestingTooDeep(64));
    assert_eq!(header.body_size, 5);
    assert_eq!(
        &header.raw_properties[..],
        &properties[..],
        "the raw property bytes are kept"
    );
    // The frames after it decode as usual: the stream is intact.
    assert_eq!(
        decoder.decode(&mut stream).unwrap(),
        Some(Frame::Body(3, Bytes::from_static(b"hello")))
    );
    assert_eq!(decoder.decode(&mut stream).unwrap(), Some(Frame::Heartbeat));

    // And the header re-encodes to exactly what was received.
    let mut again = BytesMut::new();
    Frame::UndecodableHeader(3, header).encode(&mut again).unwrap();
    assert_eq!(&again[..], &frame(2, 3, &payload)[..]);
}

#[test]
fn other_property_faults_are_per_message_errors_too() {
    let cases: [(&[u8], DecodeErrorKind); 4] = [
        // An unknown field type in the headers table.
        (
            &[0x20, 0, 0, 0, 0, 4, 1, b'k', b'Z', 0],
            DecodeErrorKind::UnknownFieldType(b'Z'),
        ),
        // The continuation bit.
        (&[0x00, 0x01], DecodeErrorKind::BadPropertyFlags(1)),
        // A content-type whose length runs past the frame.
        (&[0x80, 0x00, 10, b'a'], DecodeErrorKind::Truncated),
        // Flags promise a delivery mode that is not there... and a byte too many.
        (&[0x00, 0x00, 0xff], DecodeErrorKind::TrailingBytes(1)),
    ];
    for (properties, kind) in cases {
        let mut payload = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        payload.extend_from_slice(properties);
        match decode(&frame(2, 1, &payload)).unwrap().0 {
            Frame::UndecodableHeader(1, h) => assert_eq!(h.error, kind),
            other => panic!("{other:?}"),
        }
    }
    // A header too short for class, weight and body size is a stream error.
    assert!(matches!(
        decode(&frame(2, 1, &[0, 60, 0, 0, 0])),
        Err(Error::Malformed {
            context: "content header",
            kind: DecodeErrorKind::Truncated
        })
    ));
    // A header for a class without content is a per-message error.
    let good = ContentHeader::basic(0, BasicProperties::default());
    let mut payload = BytesMut::new();
    good.encode(&mut payload).unwrap();
    payload[1] = 10;
    assert!(matches!(
        decode(&frame(2, 1, &payload)).unwrap().0,
        Frame::UndecodableHeader(1, h) if h.error == DecodeErrorKind::NoContentClass(10)
    ));
}

#[test]
fn a_bad_protocol_header_is_reported_with_the_bytes_received() {
    assert_eq!(acemq_codec::check_protocol_header(b"AMQP\x00\x00"), Ok(false));
    assert_eq!(acemq_codec::check_protocol_header(b"AMQP\x00\x00\x09\x01"), Ok(true));
    assert_eq!(
        acemq_codec::check_protocol_header(b"GET / HTTP/1.1"),
        Err(Error::BadProtocolHeader { found: *b"GET / HT" })
    );
}

#[test]
fn values_the_wire_cannot_carry_fail_to_encode_and_write_nothing() {
    let long_key = "k".repeat(256);
    let mut table = FieldTable::new();
    table.insert(long_key.as_str(), FieldValue::Void);
    let declare = QueueDeclare {
        queue: "q".into(),
        arguments: table,
        ..Default::default()
    };
    let mut out = BytesMut::from(&b"prefix"[..]);
    assert_eq!(
        encode_method(1, &declare.into(), &mut out),
        Err(acemq_codec::EncodeError::ShortStringTooLong(256))
    );
    assert_eq!(&out[..], b"prefix");
}

#[test]
fn a_header_announcing_4_gib_without_frame_max_reserves_a_bounded_amount() {
    // Found by the decode_frames fuzzer: `frame_max` 0 (no limit) and a body
    // frame announcing 4 GiB made the decoder reserve 4 GiB up front.
    let mut buf = BytesMut::from(&[3u8, 0, 0, 0xff, 0xff, 0xff, 0xff][..]);
    assert_eq!(FrameDecoder::new(0).decode(&mut buf), Ok(None));
    assert!(buf.capacity() <= 1 << 20, "reserved {} bytes", buf.capacity());
}

/// Strings are read from a window that may run past the frame into the next
/// one; a length that runs past the payload must still be refused, and the
/// bytes after the frame must never leak into a value.
#[test]
fn strings_never_reach_past_their_frame_into_the_next_one() {
    use acemq_codec::{BasicDeliver, Method};
    let deliver = BasicDeliver {
        consumer_tag: "ctag".into(),
        delivery_tag: 7,
        redelivered: true,
        exchange: "ex".into(),
        routing_key: "rk".into(),
    };
    let mut good = BytesMut::new();
    encode_method(1, &deliver.clone().into(), &mut good).unwrap();
    let next = frame(3, 1, &[b'z'; 100]);

    // Followed by another frame: decodes exactly, nothing borrowed from it.
    let mut stream = good.clone();
    stream.extend_from_slice(&next);
    let decoder = FrameDecoder::new(0);
    let got = decoder.decode(&mut stream).unwrap().unwrap();
    assert_eq!(got, Frame::Method(1, Method::BasicDeliver(deliver.clone())));
    let Frame::Method(_, Method::BasicDeliver(got)) = got else {
        unreachable!()
    };
    assert_eq!(got.routing_key.as_bytes(), b"rk");
    assert_eq!(got.routing_key.len(), 2);

    // The routing key's length byte claims more than the payload holds; the
    // next frame's bytes would satisfy it, but they are not the payload's.
    let mut lying = good.to_vec();
    let at = lying.len() - 4; // the length byte of "rk", before "rk" and the end byte
    assert_eq!(&lying[at..], &[2, b'r', b'k', 0xCE]);
    lying[at] = 40;
    let mut stream = BytesMut::from(&lying[..]);
    stream.extend_from_slice(&next);
    let err = decoder.decode(&mut stream).unwrap_err();
    assert_eq!(
        err,
        Error::Malformed {
            context: "basic.deliver",
            kind: DecodeErrorKind::Truncated
        }
    );
    let mut whole = BytesMut::from(&lying[..]);
    whole.extend_from_slice(&next);
    assert_eq!(decoder.decode_slice(&whole.freeze()).unwrap_err(), err);
    // The same frame alone, with no slack at all.
    assert_eq!(decode(&lying).unwrap_err(), err);

    // A content header's strings likewise.
    let props = BasicProperties {
        content_type: Some("text/plain".into()),
        ..Default::default()
    };
    let mut header = BytesMut::new();
    Frame::Header(1, ContentHeader::basic(5, props.clone()))
        .encode(&mut header)
        .unwrap();
    let mut stream = header.clone();
    stream.extend_from_slice(&next);
    let Some(Frame::Header(1, h)) = decoder.decode(&mut stream).unwrap() else {
        panic!("a header")
    };
    assert_eq!(*h.properties, props);
}
