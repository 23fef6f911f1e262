//! Codec throughput (DESIGN.md §7: ≥ 5 M msg/s parsing deliver + header +
//! body with properties).
//!
//! ```text
//! cargo bench -p amqp-codec --bench codec -- --warm-up-time 1 --measurement-time 5
//! ```
//!
//! Every message has the shape acemq publishes: content-type, delivery-mode 2,
//! a 36-byte message-id, a timestamp and a 3-entry headers table, and a
//! 256-byte body. `parse_deliveries` decodes and assembles them as a
//! consumer's connection does (`FrameDecoder::decode_assembled`);
//! `parse_deliveries_frame_by_frame` does it with `decode` and `push`.
//! `parse_deliveries` and `serialize_publishes` report
//! elements per second as messages per second; `decode_headers_table_10`
//! reports tables per second.
//!
//! Headers tables are validated when decoded and their entries built on
//! first access, so each lazy figure has a twin that does the reading too:
//! `parse_deliveries_read_headers` reads the three headers of every message,
//! `decode_headers_table_10_iterate` visits all ten entries.

use std::hint::black_box;

use amqp_codec::track::{Assembly, Content, ContentAssembler, Decoded};
use amqp_codec::{
    encode_content, BasicDeliver, BasicProperties, BasicPublish, FieldTable, FieldValue, FrameDecoder, LongString,
    Method, DEFAULT_FRAME_MAX,
};
use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const MESSAGES: usize = 100_000;
const BODY: [u8; 256] = [b'x'; 256];
const CONSUMER_TAG: &str = "amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A"; // 31 bytes, RabbitMQ's shape
const TIMESTAMP: u64 = 1_764_508_980;

/// A uuid-shaped message-id, different for every message.
fn uuid(n: u64) -> String {
    format!("{:08x}-4d5e-4f60-8a7b-{:012x}", n as u32, n)
}

fn properties(n: u64) -> BasicProperties {
    let mut headers = FieldTable::new();
    headers.push("x-acemq-attempt", FieldValue::I32(1));
    headers.push("x-acemq-first-seen", FieldValue::Timestamp(TIMESTAMP - 5));
    headers.push("x-acemq-causation-id", FieldValue::LongString(uuid(n ^ 0x5eed).into()));
    BasicProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        message_id: Some(uuid(n).into()),
        timestamp: Some(TIMESTAMP),
        headers: Some(headers),
        ..Default::default()
    }
}

/// 100,000 deliveries on channel 1: deliver, header, one body frame each.
fn deliveries() -> BytesMut {
    let mut wire = BytesMut::with_capacity(MESSAGES * 520);
    for n in 1..=MESSAGES as u64 {
        let deliver = BasicDeliver {
            consumer_tag: CONSUMER_TAG.into(),
            delivery_tag: n,
            redelivered: false,
            exchange: "orders".into(),
            routing_key: "order.placed".into(),
        };
        encode_content(1, &deliver.into(), &properties(n), &BODY, DEFAULT_FRAME_MAX, &mut wire).expect("encodes");
    }
    wire
}

/// Decodes every frame of `buf` and assembles the messages of channel 1 with
/// `FrameDecoder::decode_assembled`, the path a consumer's connection takes;
/// returns how many were completed, and the emptied buffer (so that freeing
/// it happens outside the timed part). With `read_headers`, also reads the
/// three application headers of every message through the public API, as a
/// consumer would (properties and tables are built on first access).
fn parse_all(decoder: &FrameDecoder, mut buf: BytesMut, read_headers: bool) -> (usize, BytesMut) {
    let mut channel = ContentAssembler::new();
    let mut complete = 0;
    loop {
        match decoder
            .decode_assembled(&mut buf, |_| Some(&mut channel))
            .expect("well-formed stream")
        {
            Decoded::NeedMore => break,
            Decoded::Partial(_) => {}
            Decoded::Complete(_) => {
                let content = channel.take_complete().expect("a finished message");
                if read_headers {
                    read_three_headers(&content);
                }
                black_box(&content);
                complete += 1;
            }
            Decoded::Other => panic!("unexpected frame"),
        }
    }
    (complete, buf)
}

/// The same with `FrameDecoder::decode` and `ContentAssembler::push`, frame
/// by frame: every frame built, handed over and taken apart.
fn parse_all_frames(decoder: &FrameDecoder, mut buf: BytesMut) -> (usize, BytesMut) {
    let mut channel = ContentAssembler::new();
    let mut complete = 0;
    while let Some(frame) = decoder.decode(&mut buf).expect("well-formed stream") {
        match channel.push(frame).expect("well-formed content") {
            Assembly::Complete(content) => {
                black_box(&content);
                complete += 1;
            }
            Assembly::Partial => {}
            Assembly::Method(method) => panic!("unexpected {method:?}"),
        }
    }
    (complete, buf)
}

/// Reads the three headers every message carries, checking their types.
fn read_three_headers(content: &Content) {
    let headers = content
        .header
        .as_ref()
        .ok()
        .and_then(|h| h.properties.headers.as_ref())
        .expect("headers");
    let attempt = headers.get("x-acemq-attempt").and_then(FieldValue::as_i64);
    let first_seen = match headers.get("x-acemq-first-seen") {
        Some(FieldValue::Timestamp(t)) => Some(*t),
        _ => None,
    };
    let causation = headers.get("x-acemq-causation-id").and_then(FieldValue::as_str);
    assert!(attempt.is_some() && first_seen.is_some() && causation.is_some());
    black_box((attempt, first_seen, causation));
}

fn parse_deliveries(c: &mut Criterion) {
    let wire = deliveries();
    let decoder = FrameDecoder::new(DEFAULT_FRAME_MAX);
    assert_eq!(
        parse_all(&decoder, wire.clone(), true).0,
        MESSAGES,
        "every delivery assembles"
    );

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    // The copy of the prebuilt stream is the setup, outside the timing.
    group.bench_function("parse_deliveries", |b| {
        b.iter_batched(
            || wire.clone(),
            |buf| parse_all(&decoder, buf, false),
            BatchSize::LargeInput,
        )
    });
    // Frame by frame, through `decode` and `push`.
    assert_eq!(parse_all_frames(&decoder, wire.clone()).0, MESSAGES);
    group.bench_function("parse_deliveries_frame_by_frame", |b| {
        b.iter_batched(
            || wire.clone(),
            |buf| parse_all_frames(&decoder, buf),
            BatchSize::LargeInput,
        )
    });
    // The same, and every message's headers read as a consumer would.
    group.bench_function("parse_deliveries_read_headers", |b| {
        b.iter_batched(
            || wire.clone(),
            |buf| parse_all(&decoder, buf, true),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn serialize_publishes(c: &mut Criterion) {
    let publish: Method = BasicPublish {
        reserved_1: 0,
        exchange: "orders".into(),
        routing_key: "order.placed".into(),
        mandatory: true,
        immediate: false,
    }
    .into();
    let props = properties(1);
    let mut out = BytesMut::new();
    encode_content(1, &publish, &props, &BODY, DEFAULT_FRAME_MAX, &mut out).expect("encodes");
    let one = out.len();
    out.reserve(one * MESSAGES);
    // One untimed pass: the single reservation is enough, nothing regrows.
    let capacity = out.capacity();
    out.clear();
    for _ in 0..MESSAGES {
        encode_content(1, &publish, &props, &BODY, DEFAULT_FRAME_MAX, &mut out).expect("encodes");
    }
    assert_eq!((out.len(), out.capacity()), (one * MESSAGES, capacity));

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group.bench_function("serialize_publishes", |b| {
        b.iter(|| {
            out.clear();
            for _ in 0..MESSAGES {
                encode_content(1, &publish, &props, &BODY, DEFAULT_FRAME_MAX, &mut out).expect("encodes");
            }
            black_box(out.len());
        })
    });
    group.finish();
}

/// A realistic 10-entry headers table: acemq's own, tracing, and a few
/// application headers of the usual types.
fn headers_table_10() -> Bytes {
    let mut table = FieldTable::new();
    table.push("x-acemq-attempt", FieldValue::I32(3));
    table.push("x-acemq-first-seen", FieldValue::Timestamp(TIMESTAMP - 60));
    table.push("x-acemq-causation-id", FieldValue::LongString(uuid(7).into()));
    table.push("x-acemq-correlation-id", FieldValue::LongString(uuid(8).into()));
    table.push(
        "traceparent",
        FieldValue::LongString(LongString::from(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )),
    );
    table.push("tenant", FieldValue::LongString("acme-eu-west".into()));
    table.push("schema-version", FieldValue::I32(4));
    table.push("retry-after-ms", FieldValue::I64(30_000));
    table.push("priority-boost", FieldValue::Bool(false));
    table.push("source", FieldValue::LongString("checkout-service".into()));
    let mut buf = BytesMut::new();
    table.encode(&mut buf).expect("encodes");
    buf.freeze()
}

fn decode_headers_table_10(c: &mut Criterion) {
    let wire = headers_table_10();
    assert_eq!(FieldTable::decode(&wire, 64).expect("decodes").len(), 10);

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(1));
    group.bench_function("decode_headers_table_10", |b| {
        b.iter(|| FieldTable::decode(black_box(&wire), 64).expect("decodes"))
    });
    // Decoding validates and defers building the entries; this one also
    // builds them and visits every entry, as a reader of all headers would.
    group.bench_function("decode_headers_table_10_iterate", |b| {
        b.iter(|| {
            let table = FieldTable::decode(black_box(&wire), 64).expect("decodes");
            for (key, value) in table.iter() {
                black_box((key, value));
            }
            table
        })
    });
    group.finish();
}

criterion_group!(benches, parse_deliveries, serialize_publishes, decode_headers_table_10);
criterion_main!(benches);
