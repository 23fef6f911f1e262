//! `BasicProperties::salvage` against property lists laid out by hand, each breaking one rule,
//! and against the decoder on arbitrary and damaged bytes.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::parse::Ctx;
use crate::{
    arbitrary, BasicProperties, DecodeErrorKind, FieldValue, Frame, FrameDecoder, SalvagedProperties, DEFAULT_MAX_DEPTH,
};

const CONTENT_TYPE: u16 = 1 << 15;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const CORRELATION_ID: u16 = 1 << 10;
const MESSAGE_ID: u16 = 1 << 7;
const TIMESTAMP: u16 = 1 << 6;
const APP_ID: u16 = 1 << 3;

/// The 14 properties by flag bit, as `lost` names them.
const NAMES: [(u16, &str); 14] = [
    (15, "content-type"),
    (14, "content-encoding"),
    (13, "headers"),
    (12, "delivery-mode"),
    (11, "priority"),
    (10, "correlation-id"),
    (9, "reply-to"),
    (8, "expiration"),
    (7, "message-id"),
    (6, "timestamp"),
    (5, "type"),
    (4, "user-id"),
    (3, "app-id"),
    (2, "cluster-id"),
];

/// A property list laid out by hand: the flag word, then each field as
/// given (callers give them in wire order).
#[derive(Default)]
struct List {
    flags: u16,
    fields: Vec<u8>,
}

impl List {
    fn shortstr(mut self, flag: u16, s: &str) -> Self {
        self.flags |= flag;
        self.fields.push(s.len() as u8);
        self.fields.extend_from_slice(s.as_bytes());
        self
    }

    fn octet(mut self, flag: u16, v: u8) -> Self {
        self.flags |= flag;
        self.fields.push(v);
        self
    }

    fn timestamp(mut self, v: u64) -> Self {
        self.flags |= TIMESTAMP;
        self.fields.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// The headers table: its body, behind a length prefix that fits it.
    fn headers(mut self, body: &[u8]) -> Self {
        self.flags |= HEADERS;
        self.fields.extend_from_slice(&(body.len() as u32).to_be_bytes());
        self.fields.extend_from_slice(body);
        self
    }

    /// A field's bytes as given, however wrong.
    fn raw(mut self, flag: u16, bytes: &[u8]) -> Self {
        self.flags |= flag;
        self.fields.extend_from_slice(bytes);
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.flags.to_be_bytes().to_vec();
        out.extend_from_slice(&self.fields);
        out
    }
}

/// `field-value-pair`: a key and the value's bytes (type code included).
fn pair(key: &str, value: &[u8]) -> Vec<u8> {
    let mut out = vec![key.len() as u8];
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    out
}

/// `I`: a signed 32-bit integer value.
fn int(v: i32) -> Vec<u8> {
    let mut out = vec![b'I'];
    out.extend_from_slice(&v.to_be_bytes());
    out
}

/// `S`: a long string value.
fn long_string(s: &[u8]) -> Vec<u8> {
    let mut out = vec![b'S'];
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s);
    out
}

/// A value that is `levels` tables, each holding the next under key `n`,
/// around a `V`.
fn nested_tables(levels: usize) -> Vec<u8> {
    let mut value = vec![b'V'];
    for _ in 0..levels {
        let body = pair("n", &value);
        value = vec![b'F'];
        value.extend_from_slice(&(body.len() as u32).to_be_bytes());
        value.extend_from_slice(&body);
    }
    value
}

/// The properties with message-id, correlation-id and timestamp and a few
/// more around a headers table of the body given.
fn identified_around(headers: &[u8]) -> Vec<u8> {
    List::default()
        .shortstr(CONTENT_TYPE, "application/json")
        .headers(headers)
        .octet(DELIVERY_MODE, 2)
        .shortstr(CORRELATION_ID, "corr-7")
        .shortstr(MESSAGE_ID, "msg-42")
        .timestamp(1_700_000_000)
        .shortstr(APP_ID, "orders")
        .bytes()
}

/// What survives a poisoned headers table around which
/// [`identified_around`] lays out its properties.
fn identified() -> BasicProperties {
    BasicProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        correlation_id: Some("corr-7".into()),
        message_id: Some("msg-42".into()),
        timestamp: Some(1_700_000_000),
        app_id: Some("orders".into()),
        ..Default::default()
    }
}

/// The decoder's verdict on a property list, field by field.
fn decode(raw: &[u8], max_depth: usize) -> Result<BasicProperties, DecodeErrorKind> {
    let mut props = BasicProperties::default();
    let ctx = Ctx {
        max_depth,
        validated: false,
    };
    BasicProperties::decode_into(&mut props, ctx, raw, None).map(|()| props)
}

/// A basic-class content header frame on channel 1 around a property list.
fn header_frame(class_id: u16, raw: &[u8]) -> Bytes {
    let mut payload = class_id.to_be_bytes().to_vec();
    payload.extend_from_slice(&[0; 10]);
    payload.extend_from_slice(raw);
    let mut frame = vec![crate::FRAME_HEADER, 0, 1];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(crate::FRAME_END);
    Bytes::from(frame)
}

#[test]
fn a_headers_table_with_an_unknown_field_type_loses_only_the_headers() {
    let raw = identified_around(&pair("x-bad", b"Z\x00\x00"));
    assert!(matches!(
        decode(&raw, DEFAULT_MAX_DEPTH),
        Err(DecodeErrorKind::UnknownFieldType(b'Z'))
    ));

    let salvaged = BasicProperties::salvage(&raw);
    assert_eq!(salvaged.properties, identified());
    assert_eq!(salvaged.lost, ["headers"]);
}

#[test]
fn a_headers_table_nested_past_the_limit_loses_only_the_headers() {
    let raw = identified_around(&pair("x-deep", &nested_tables(DEFAULT_MAX_DEPTH)));
    assert_eq!(
        decode(&raw, DEFAULT_MAX_DEPTH),
        Err(DecodeErrorKind::NestingTooDeep(DEFAULT_MAX_DEPTH))
    );

    let salvaged = BasicProperties::salvage(&raw);
    assert_eq!(salvaged.properties, identified());
    assert_eq!(salvaged.lost, ["headers"]);
}

#[test]
fn the_nesting_limit_is_the_one_given() {
    let raw = identified_around(&pair("x-deep", &nested_tables(3)));
    assert_eq!(BasicProperties::salvage_with_max_depth(&raw, 3).lost, ["headers"]);
    let within = BasicProperties::salvage_with_max_depth(&raw, 4);
    assert!(within.lost.is_empty());
    assert_eq!(Ok(within.properties), decode(&raw, 4));
}

#[test]
fn readable_headers_entries_around_one_too_deep_are_kept() {
    let mut body = pair("x-attempt", &int(3));
    body.extend(pair("x-deep", &nested_tables(DEFAULT_MAX_DEPTH)));
    body.extend(pair("x-first-seen", &long_string(b"2024-01-01")));
    let raw = identified_around(&body);

    let salvaged = BasicProperties::salvage(&raw);
    let headers = salvaged.properties.headers.as_ref().expect("the readable entries");
    let keys: Vec<_> = headers.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["x-attempt", "x-first-seen"]);
    assert_eq!(headers.get("x-attempt"), Some(&FieldValue::I32(3)));
    assert_eq!(
        BasicProperties {
            headers: None,
            ..salvaged.properties.clone()
        },
        identified()
    );
    assert_eq!(salvaged.lost, ["headers"], "a partial table is still reported lost");
}

#[test]
fn headers_entries_end_at_one_of_unknown_type_whose_length_is_unknown() {
    let mut body = pair("x-attempt", &int(3));
    body.extend(pair("x-bad", b"Z"));
    body.extend(pair("x-after", &int(4)));
    let salvaged = BasicProperties::salvage(&identified_around(&body));
    let headers = salvaged.properties.headers.as_ref().expect("the entry before");
    assert_eq!(headers.len(), 1);
    assert_eq!(headers.get("x-attempt"), Some(&FieldValue::I32(3)));
    assert_eq!(salvaged.properties.message_id, identified().message_id);
}

#[test]
fn kept_headers_entries_encode_as_a_table_that_decodes() {
    // Large enough to be kept as a shared slice rather than inline.
    let big = vec![b'x'; 500];
    let mut body = pair("x-big", &long_string(&big));
    body.extend(pair("x-bad", b"Z"));
    let salvaged = BasicProperties::salvage(&identified_around(&body));
    let mut wire = BytesMut::new();
    salvaged.properties.encode(&mut wire).expect("encodes");
    assert_eq!(decode(&wire, DEFAULT_MAX_DEPTH), Ok(salvaged.properties));
}

#[test]
fn a_headers_length_past_the_end_loses_everything_from_the_headers_on() {
    let raw = List::default()
        .shortstr(CONTENT_TYPE, "text/plain")
        .raw(HEADERS, &1000u32.to_be_bytes())
        .shortstr(MESSAGE_ID, "msg")
        .bytes();

    let salvaged = BasicProperties::salvage(&raw);
    assert_eq!(salvaged.properties.content_type, Some("text/plain".into()));
    assert_eq!(salvaged.properties.headers, None);
    assert_eq!(salvaged.properties.message_id, None);
    assert_eq!(salvaged.lost, ["headers", "message-id"]);
}

#[test]
fn a_truncated_list_keeps_the_properties_before_the_cut() {
    let whole = identified_around(&pair("x-attempt", &int(3)));
    let full = decode(&whole, DEFAULT_MAX_DEPTH).expect("decodes whole");
    // Cut inside message-id ("msg-42"), after its length octet and 2 bytes.
    let at = whole.windows(6).position(|w| w == b"msg-42").expect("laid out") + 2;

    let salvaged = BasicProperties::salvage(&whole[..at]);
    assert_eq!(salvaged.lost, ["message-id", "timestamp", "app-id"]);
    assert_eq!(
        salvaged.properties,
        BasicProperties {
            message_id: None,
            timestamp: None,
            app_id: None,
            ..full
        }
    );
}

#[test]
fn every_cut_of_a_list_keeps_a_prefix_of_its_properties() {
    let whole = identified_around(&pair("x-attempt", &int(3)));
    let full = decode(&whole, DEFAULT_MAX_DEPTH).expect("decodes whole");
    for at in 0..whole.len() {
        let salvaged = BasicProperties::salvage(&whole[..at]);
        assert!(!salvaged.lost.is_empty(), "cut at {at} loses something");
        let p = &salvaged.properties;
        assert!(p.content_type.is_none() || p.content_type == full.content_type);
        assert!(p.headers.is_none() || p.headers == full.headers);
        assert!(p.correlation_id.is_none() || p.correlation_id == full.correlation_id);
        assert!(p.message_id.is_none() || p.message_id == full.message_id);
        assert!(p.timestamp.is_none() || p.timestamp == full.timestamp);
        assert!(p.app_id.is_none() || p.app_id == full.app_id);
    }
}

#[test]
fn empty_input_has_no_flag_word_and_salvages_nothing() {
    for raw in [&b""[..], &b"\x80"[..]] {
        assert_eq!(
            BasicProperties::salvage(raw),
            SalvagedProperties {
                properties: BasicProperties::default(),
                lost: vec!["property-flags"],
            }
        );
    }
}

#[test]
fn undefined_flag_bits_stop_the_salvage_before_the_first_property() {
    let mut raw = List::default()
        .shortstr(CONTENT_TYPE, "text/plain")
        .shortstr(MESSAGE_ID, "m")
        .bytes();
    raw[1] |= 1; // the continuation bit: another flag word would follow
    let salvaged = BasicProperties::salvage(&raw);
    assert_eq!(salvaged.properties, BasicProperties::default());
    assert_eq!(salvaged.lost, ["property-flags", "content-type", "message-id"]);
}

#[test]
fn trailing_bytes_lose_no_property() {
    let mut raw = List::default().shortstr(MESSAGE_ID, "m-1").bytes();
    raw.extend_from_slice(b"junk");
    assert_eq!(decode(&raw, DEFAULT_MAX_DEPTH), Err(DecodeErrorKind::TrailingBytes(4)));
    let salvaged = BasicProperties::salvage(&raw);
    assert_eq!(salvaged.properties.message_id, Some("m-1".into()));
    assert!(salvaged.lost.is_empty());
}

#[test]
fn an_undecodable_header_salvages_its_raw_properties() {
    let raw = identified_around(&pair("x-bad", b"Z"));
    let mut wire = BytesMut::from(&header_frame(60, &raw)[..]);
    let Some(Frame::UndecodableHeader(1, header)) = FrameDecoder::new(0).decode(&mut wire).expect("a sound frame")
    else {
        panic!("the 'Z' makes the header undecodable");
    };
    assert_eq!(header.salvage(), BasicProperties::salvage(&raw));
    assert_eq!(header.salvage().properties, identified());
}

#[test]
fn a_header_of_another_class_salvages_nothing() {
    let raw = List::default().shortstr(MESSAGE_ID, "m-1").bytes();
    let mut wire = BytesMut::from(&header_frame(61, &raw)[..]);
    let Some(Frame::UndecodableHeader(1, header)) = FrameDecoder::new(0).decode(&mut wire).expect("a sound frame")
    else {
        panic!("class 61 carries no content");
    };
    assert_eq!(header.salvage().properties, BasicProperties::default());
    assert_eq!(header.salvage().lost, ["property-flags"]);
}

/// What must hold of a salvage of `raw`, whatever the bytes.
fn check_salvage(raw: &[u8], max_depth: usize) -> Result<(), TestCaseError> {
    let salvaged = BasicProperties::salvage_with_max_depth(raw, max_depth);
    match decode(raw, max_depth) {
        Ok(decoded) => {
            prop_assert_eq!(&salvaged.properties, &decoded);
            prop_assert!(
                salvaged.lost.is_empty(),
                "lost {:?} of a list that decodes",
                salvaged.lost
            );
        }
        Err(DecodeErrorKind::TrailingBytes(_)) => prop_assert!(salvaged.lost.is_empty()),
        Err(_) => prop_assert!(!salvaged.lost.is_empty(), "a list that fails loses something"),
    }
    // Only properties the flag word names are read, and each is either read
    // whole or named lost (a partial headers table is both).
    if let Some(&flags) = raw.first_chunk::<2>() {
        let flags = u16::from_be_bytes(flags);
        let read = salvaged.properties.flags();
        prop_assert_eq!(read & !flags, 0);
        let mut named = NAMES
            .iter()
            .filter(|(bit, name)| flags & (1 << bit) != 0 && (read & (1 << bit) == 0 || *name == "headers"));
        let lost = salvaged.lost.iter().filter(|&&n| n != "property-flags");
        for lost in lost {
            prop_assert!(
                named.any(|(_, name)| name == lost),
                "{} lost, out of order or not flagged",
                lost
            );
        }
        for (bit, name) in NAMES {
            if flags & (1 << bit) != 0 && read & (1 << bit) == 0 {
                prop_assert!(salvaged.lost.contains(&name), "{} neither read nor lost", name);
            }
        }
    }
    // What was salvaged is a sound property list.
    let mut wire = BytesMut::new();
    salvaged
        .properties
        .encode(&mut wire)
        .expect("salvaged properties encode");
    prop_assert_eq!(decode(&wire, max_depth), Ok(salvaged.properties));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn salvage_never_panics_and_agrees_with_the_decoder_on_any_bytes(
        raw in vec(any::<u8>(), 0..400),
        max_depth in 1..4usize,
    ) {
        check_salvage(&raw, max_depth)?;
    }

    /// Sound lists, one byte changed, cut short, or with a headers table's
    /// byte changed: the cases where salvage has the most to save.
    #[test]
    fn salvage_agrees_with_the_decoder_on_damaged_lists(
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
        check_salvage(&wire, max_depth)?;
    }
}
