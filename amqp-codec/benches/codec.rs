//! Codec throughput against amq-protocol 10.6.3 (the version lapin 4
//! parses with), in the same run (the targets: parsing ≥ 5x
//! amq-protocol's msg/s with properties left lazy, ≥ 3x with every
//! property and header read; serializing ≥ 2x). On 5 December 2026 (AMD
//! EPYC, 2 cores): 8.38x, 7.23x and 2.55x (against 8.1.0, the reference
//! before, the same day: 7.34x, 6.70x, 2.53x).
//!
//! ```text
//! cargo bench -p acemq-codec --bench codec -- --warm-up-time 1 --measurement-time 5
//! cargo bench -p acemq-codec --bench codec -- 'parse_lazy|parse_all_read|serialize/'
//! ```
//!
//! How to read it: each comparison is a criterion group with two functions
//! side by side, `acemq` and `amq-protocol`, timed one after the other in
//! the same run over the same bytes, with the same `Throughput::Elements`
//! (one element = one message). The ratio of a target is the `thrpt` line
//! of `GROUP/acemq` divided by that of `GROUP/amq-protocol`; the bench also
//! prints both medians and their ratio at the end (`ratio GROUP: ...`), from
//! criterion's own estimates of this run.
//!
//! - `parse_lazy`: 100,000 deliveries (deliver + content header + one
//!   256-byte body frame each) decoded and assembled into messages. acemq
//!   validates the properties and leaves them lazy; amq-protocol (which has
//!   no lazy mode) parses them whole, as it always does.
//! - `parse_all_read`: the same, and every one of the 14 properties and every
//!   header entry of every message read (a digest of them is computed).
//!   acemq reads them straight from the bytes (`Properties::view`);
//!   `codec/parse_all_read_built` is the same through the properties built
//!   on first access (`Deref` to `BasicProperties`).
//! - `serialize`: 100,000 publish + header + body triples with those
//!   properties appended to one buffer reserved beforehand.
//!
//! Every message has the shape acemq publishes: content-type, delivery-mode 2,
//! a 36-byte message-id, a timestamp and a 3-entry headers table, and a
//! 256-byte body. The headers are in key order, because amq-protocol keeps a
//! table as a sorted map and writes it in that order: so both sides parse the
//! very same bytes and serialize byte-identical streams, which is checked
//! before anything is timed, as are the message counts and the digests.
//!
//! The `codec` group holds acemq-only figures: frame-by-frame decoding
//! (`decode` + `push`), and a 10-entry headers table decoded lazily and
//! iterated.

use std::hint::black_box;
use std::time::Duration;

use acemq_codec::track::{Assembly, Content, ContentAssembler, Decoded};
use acemq_codec::{
    encode_content, BasicDeliver, BasicProperties, BasicPublish, FieldTable, FieldValue, FieldValueRef, FrameDecoder,
    LongString, Method, DEFAULT_FRAME_MAX,
};
use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame, WriteContext};
use amq_protocol::protocol::{basic as amq_basic, AMQPClass};
use amq_protocol::types::AMQPValue;
use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, BatchSize, BenchmarkGroup, Criterion, Throughput};

const MESSAGES: usize = 100_000;
const BODY: [u8; 256] = [b'x'; 256];
const CONSUMER_TAG: &str = "amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A"; // 31 bytes, RabbitMQ's shape
const TIMESTAMP: u64 = 1_764_508_980;
const ACEMQ: &str = "acemq";
const AMQ_PROTOCOL: &str = "amq-protocol";

/// A uuid-shaped message-id, different for every message.
fn uuid(n: u64) -> String {
    format!("{:08x}-4d5e-4f60-8a7b-{:012x}", n as u32, n)
}

/// The properties of message `n`; headers in key order (see the top).
fn properties(n: u64) -> BasicProperties {
    let mut headers = FieldTable::new();
    headers.push("x-acemq-attempt", FieldValue::I32(1));
    headers.push("x-acemq-causation-id", FieldValue::LongString(uuid(n ^ 0x5eed).into()));
    headers.push("x-acemq-first-seen", FieldValue::Timestamp(TIMESTAMP - 5));
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

// ---------------------------------------------------------------------------
// acemq
// ---------------------------------------------------------------------------

/// What the acemq parse reads of every message's properties.
#[derive(Clone, Copy)]
enum Read {
    /// Nothing: they stay lazy.
    Nothing,
    /// Everything, from the bytes (`Properties::view`).
    All,
    /// Everything, built (`Deref` to `BasicProperties`).
    AllBuilt,
}

/// Decodes every frame of `buf` and assembles the messages of channel 1 with
/// `FrameDecoder::decode_assembled`, the path a consumer's connection takes;
/// returns how many were completed, the sum of the digests of their
/// properties as `read` says (see [`acemq_digest`]), and the emptied buffer
/// (so that freeing it happens outside the timed part).
fn acemq_parse(decoder: &FrameDecoder, mut buf: BytesMut, read: Read) -> (usize, u64, BytesMut) {
    let mut channel = ContentAssembler::new();
    let mut complete = 0;
    let mut digest = 0u64;
    loop {
        match decoder
            .decode_assembled(&mut buf, |_| Some(&mut channel))
            .expect("well-formed stream")
        {
            Decoded::NeedMore => break,
            Decoded::Partial(_) => {}
            Decoded::Complete(_) => {
                let content = channel.take_complete().expect("a finished message");
                match read {
                    Read::Nothing => {}
                    Read::All => digest = digest.wrapping_add(acemq_digest(&content)),
                    Read::AllBuilt => digest = digest.wrapping_add(acemq_digest_built(&content)),
                }
                black_box(&content);
                complete += 1;
            }
            Decoded::Other => panic!("unexpected frame"),
        }
    }
    (complete, digest, buf)
}

/// Reads every property and every header entry of a message, as a consumer
/// that looks at all of them would, through the public API: straight from
/// the bytes received (`Properties::view`), building nothing; sums what it
/// read into a digest both sides compute alike.
fn acemq_digest(content: &Content) -> u64 {
    let Method::BasicDeliver(deliver) = &content.method else {
        panic!("a delivery")
    };
    let props = content.header.as_ref().expect("decodable").properties.view();
    let mut d = deliver.delivery_tag + content.body.len() as u64;
    for s in [
        props.content_type,
        props.content_encoding,
        props.correlation_id,
        props.reply_to,
        props.expiration,
        props.message_id,
        props.kind,
        props.user_id,
        props.app_id,
        props.cluster_id,
    ]
    .into_iter()
    .flatten()
    {
        d += str_digest(s);
    }
    for n in [props.delivery_mode, props.priority].into_iter().flatten() {
        d += u64::from(n);
    }
    d += props.timestamp.unwrap_or(0);
    if let Some(headers) = props.headers {
        for (key, value) in headers.iter() {
            d += str_digest(key)
                + match value {
                    FieldValueRef::I32(v) => v as u64,
                    FieldValueRef::Timestamp(t) => t,
                    FieldValueRef::LongString(s) => str_digest(s),
                    other => panic!("not in the bench: {other:?}"),
                };
        }
    }
    d
}

/// [`acemq_digest`] through the properties built on first access (`Deref`
/// to `BasicProperties`, and the headers' entries built): the way that
/// keeps what it read.
fn acemq_digest_built(content: &Content) -> u64 {
    let Method::BasicDeliver(deliver) = &content.method else {
        panic!("a delivery")
    };
    let props = &content.header.as_ref().expect("decodable").properties;
    let mut d = deliver.delivery_tag + content.body.len() as u64;
    for s in [
        &props.content_type,
        &props.content_encoding,
        &props.correlation_id,
        &props.reply_to,
        &props.expiration,
        &props.message_id,
        &props.kind,
        &props.user_id,
        &props.app_id,
        &props.cluster_id,
    ]
    .into_iter()
    .flatten()
    {
        d += str_digest(s.as_bytes());
    }
    for n in [props.delivery_mode, props.priority].into_iter().flatten() {
        d += u64::from(n);
    }
    d += props.timestamp.unwrap_or(0);
    if let Some(headers) = &props.headers {
        for (key, value) in headers.iter() {
            d += str_digest(key.as_bytes())
                + match value {
                    FieldValue::I32(v) => *v as u64,
                    FieldValue::Timestamp(t) => *t,
                    FieldValue::LongString(s) => str_digest(s.as_bytes()),
                    other => panic!("not in the bench: {other:?}"),
                };
        }
    }
    d
}

/// What reading a string adds to a digest: its length and its last byte
/// (so the bytes are looked at, not only the length).
#[inline(always)]
fn str_digest(s: &[u8]) -> u64 {
    let s = black_box(s);
    s.len() as u64 + u64::from(s.last().copied().unwrap_or(0))
}

/// The same with `FrameDecoder::decode` and `ContentAssembler::push`, frame
/// by frame: every frame built, handed over and taken apart.
fn acemq_parse_frames(decoder: &FrameDecoder, mut buf: BytesMut) -> (usize, BytesMut) {
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

// ---------------------------------------------------------------------------
// amq-protocol
// ---------------------------------------------------------------------------

/// A message as amq-protocol's frames make it (amq-protocol has no
/// assembler; lapin's is this, plus its channel bookkeeping).
struct AmqMessage {
    deliver: amq_basic::Deliver,
    header: AMQPContentHeader,
    body: Vec<u8>,
}

/// Parses every frame of `buf` with `amq_protocol::frame::parse_frame` and
/// assembles the messages: the deliver, the header, and the body, which in
/// this stream is one frame, kept as parsed (as acemq keeps its slice).
fn amq_parse(buf: BytesMut, read_all: bool) -> (usize, u64, BytesMut) {
    let mut input: &[u8] = &buf;
    let mut complete = 0;
    let mut digest = 0u64;
    let mut deliver = None;
    let mut header = None;
    while !input.is_empty() {
        let (rest, frame) = parse_frame(input).expect("well-formed stream");
        input = rest;
        match frame {
            AMQPFrame::Method(_, AMQPClass::Basic(amq_basic::AMQPMethod::Deliver(d))) => deliver = Some(d),
            AMQPFrame::Header(_, h) => header = Some(h),
            AMQPFrame::Body(_, body) => {
                let (Some(deliver), Some(header)) = (deliver.take(), header.take()) else {
                    panic!("a body out of sequence")
                };
                assert_eq!(header.body_size, body.len() as u64, "one body frame a message");
                let message = AmqMessage { deliver, header, body };
                if read_all {
                    digest = digest.wrapping_add(amq_digest(&message));
                }
                black_box(&message);
                complete += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    (complete, digest, buf)
}

/// [`acemq_digest`] for amq-protocol's message.
fn amq_digest(message: &AmqMessage) -> u64 {
    let props = &message.header.properties;
    let mut d = message.deliver.delivery_tag + message.body.len() as u64;
    for s in [
        props.content_type(),
        props.content_encoding(),
        props.correlation_id(),
        props.reply_to(),
        props.expiration(),
        props.message_id(),
        props.kind(),
        props.user_id(),
        props.app_id(),
        props.cluster_id(),
    ]
    .into_iter()
    .flatten()
    {
        d += str_digest(s.as_str().as_bytes());
    }
    for n in [props.delivery_mode(), props.priority()].into_iter().flatten() {
        d += u64::from(*n);
    }
    d += props.timestamp().unwrap_or(0);
    if let Some(headers) = props.headers() {
        for (key, value) in headers {
            d += str_digest(key.as_str().as_bytes())
                + match value {
                    AMQPValue::LongInt(v) => *v as u64,
                    AMQPValue::Timestamp(t) => *t,
                    AMQPValue::LongString(s) => str_digest(s.as_bytes()),
                    other => panic!("not in the bench: {other:?}"),
                };
        }
    }
    d
}

/// Writes one frame at the start of `out` with
/// `amq_protocol::frame::gen_frame`; returns the rest of `out`. A slice is
/// the fastest of cookie-factory's writers (its `Vec` writer zero-fills and
/// copies the room it keeps for a length), so that is what it is given.
#[inline(always)]
fn amq_gen<'a>(frame: &AMQPFrame, out: &'a mut [u8]) -> &'a mut [u8] {
    match gen_frame(frame)(WriteContext::from(out)) {
        Ok(ctx) => ctx.write,
        Err(err) => panic!("amq-protocol serializes: {err:?}"),
    }
}

/// Writes `MESSAGES` times the three frames into `out` (which has room for
/// them all); returns how many bytes were written.
fn amq_serialize(frames: &[AMQPFrame; 3], out: &mut [u8], messages: usize) -> usize {
    let room = out.len();
    let mut rest = out;
    for _ in 0..messages {
        for frame in frames {
            rest = amq_gen(frame, rest);
        }
    }
    room - rest.len()
}

/// amq-protocol's frames for the publish, header and body the serialize
/// bench writes: the same values as acemq's.
fn amq_publish_frames(props: &BasicProperties) -> [AMQPFrame; 3] {
    let publish = amq_basic::Publish {
        exchange: "orders".into(),
        routing_key: "order.placed".into(),
        mandatory: true,
        immediate: false,
    };
    let mut headers = amq_protocol::types::FieldTable::default();
    for (key, value) in props.headers.as_ref().expect("headers").iter() {
        let value = match value {
            FieldValue::I32(v) => AMQPValue::LongInt(*v),
            FieldValue::Timestamp(t) => AMQPValue::Timestamp(*t),
            FieldValue::LongString(s) => AMQPValue::LongString(s.as_bytes().to_vec().into()),
            other => panic!("not in the bench: {other:?}"),
        };
        headers.insert(key.as_str().expect("utf-8").into(), value);
    }
    let str_of = |s: &Option<acemq_codec::ShortString>| s.as_ref().expect("set").as_str().expect("utf-8").into();
    let amq_props = amq_basic::AMQPProperties::default()
        .with_content_type(str_of(&props.content_type))
        .with_delivery_mode(props.delivery_mode.expect("set"))
        .with_message_id(str_of(&props.message_id))
        .with_timestamp(props.timestamp.expect("set"))
        .with_headers(headers);
    [
        AMQPFrame::Method(1, AMQPClass::Basic(amq_basic::AMQPMethod::Publish(publish))),
        AMQPFrame::Header(
            1,
            AMQPContentHeader {
                class_id: 60,
                body_size: BODY.len() as u64,
                properties: amq_props,
            },
        ),
        AMQPFrame::Body(1, BODY.to_vec()),
    ]
}

// ---------------------------------------------------------------------------
// The comparisons
// ---------------------------------------------------------------------------

/// A group of two functions, acemq's and amq-protocol's, one element a
/// message.
fn comparison<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(MESSAGES as u64));
    group
}

fn parse_deliveries(c: &mut Criterion) {
    let wire = deliveries();
    let decoder = FrameDecoder::new(DEFAULT_FRAME_MAX);
    // Like for like: the same messages found, the same values read.
    let (ours, our_digest, _) = acemq_parse(&decoder, wire.clone(), Read::All);
    let (theirs, their_digest, _) = amq_parse(wire.clone(), true);
    assert_eq!((ours, theirs), (MESSAGES, MESSAGES), "every delivery assembles");
    assert_eq!(our_digest, their_digest, "both read the same properties and headers");
    assert_eq!(acemq_parse(&decoder, wire.clone(), Read::AllBuilt).1, our_digest);

    for (name, read, read_all) in [
        ("parse_lazy", Read::Nothing, false),
        ("parse_all_read", Read::All, true),
    ] {
        let mut group = comparison(c, name);
        // The copy of the prebuilt stream is the setup, outside the timing.
        group.bench_function(ACEMQ, |b| {
            b.iter_batched(
                || wire.clone(),
                |buf| acemq_parse(&decoder, buf, read),
                BatchSize::LargeInput,
            )
        });
        group.bench_function(AMQ_PROTOCOL, |b| {
            b.iter_batched(|| wire.clone(), |buf| amq_parse(buf, read_all), BatchSize::LargeInput)
        });
        group.finish();
    }

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Elements(MESSAGES as u64));
    assert_eq!(acemq_parse_frames(&decoder, wire.clone()).0, MESSAGES);
    // Every property read through the properties built on first access.
    group.bench_function("parse_all_read_built", |b| {
        b.iter_batched(
            || wire.clone(),
            |buf| acemq_parse(&decoder, buf, Read::AllBuilt),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("parse_deliveries_frame_by_frame", |b| {
        b.iter_batched(
            || wire.clone(),
            |buf| acemq_parse_frames(&decoder, buf),
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

    // Like for like: amq-protocol writes the very same bytes, and they
    // decode with acemq's decoder to the same message.
    let amq_frames = amq_publish_frames(&props);
    let mut theirs = vec![0u8; one * MESSAGES];
    let written = amq_serialize(&amq_frames, &mut theirs, 1);
    let theirs_one = &theirs[..written];
    assert_eq!(theirs_one, &out[..], "amq-protocol serializes the same bytes");
    let decoder = FrameDecoder::new(DEFAULT_FRAME_MAX);
    let decode_one = |bytes: &[u8]| {
        let mut buf = BytesMut::from(bytes);
        let mut channel = ContentAssembler::new();
        while !matches!(
            decoder
                .decode_assembled(&mut buf, |_| Some(&mut channel))
                .expect("decodes"),
            Decoded::Complete(_)
        ) {}
        channel.take_complete().expect("a message")
    };
    let message = decode_one(theirs_one);
    assert_eq!(message, decode_one(&out));
    assert_eq!(message.method, publish);
    assert_eq!(message.header.as_ref().expect("decodable").properties, props);

    out.reserve(one * MESSAGES);
    // One untimed pass: the single reservation is enough, nothing regrows.
    let capacity = out.capacity();
    out.clear();
    for _ in 0..MESSAGES {
        encode_content(1, &publish, &props, &BODY, DEFAULT_FRAME_MAX, &mut out).expect("encodes");
    }
    assert_eq!((out.len(), out.capacity()), (one * MESSAGES, capacity));

    let mut acemq_run = || {
        out.clear();
        for _ in 0..MESSAGES {
            encode_content(1, &publish, &props, &BODY, DEFAULT_FRAME_MAX, &mut out).expect("encodes");
        }
        black_box(out.len());
    };
    assert_eq!(amq_serialize(&amq_frames, &mut theirs, MESSAGES), one * MESSAGES);
    let mut amq_run = || black_box(amq_serialize(&amq_frames, &mut theirs, MESSAGES));

    let mut group = comparison(c, "serialize");
    group.bench_function(ACEMQ, |b| b.iter(&mut acemq_run));
    group.bench_function(AMQ_PROTOCOL, |b| b.iter(&mut amq_run));
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

fn main() {
    START.get_or_init(std::time::Instant::now);
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}

/// The comparisons' ratios, from the medians criterion measured in this
/// run (a group filtered out of this run is skipped, not read from an
/// older one).
fn print_ratios() {
    let started = std::time::SystemTime::now() - START.get().map_or(Duration::ZERO, |s| s.elapsed());
    let Some(dir) = criterion_dir() else { return };
    for group in ["parse_lazy", "parse_all_read", "serialize"] {
        let median = |function: &str| {
            let path = dir.join(group).join(function).join("new").join("estimates.json");
            let fresh = std::fs::metadata(&path).and_then(|m| m.modified()).ok()? >= started;
            fresh
                .then(|| median_ns(&std::fs::read_to_string(&path).ok()?))
                .flatten()
        };
        if let (Some(ours), Some(theirs)) = (median(ACEMQ), median(AMQ_PROTOCOL)) {
            let rate = |ns: f64| MESSAGES as f64 / ns * 1e3;
            println!(
                "ratio {group}: acemq {:.2} M msg/s, amq-protocol {:.2} M msg/s: {:.2}x",
                rate(ours),
                rate(theirs),
                theirs / ours
            );
        }
    }
}

/// When the bench started, for [`print_ratios`].
static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Where criterion writes its estimates: `CRITERION_HOME`, or `criterion`
/// in the target directory this bench was built in (`target/release/deps/`).
fn criterion_dir() -> Option<std::path::PathBuf> {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return Some(home.into());
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// The median's point estimate, in nanoseconds, from criterion's
/// `estimates.json` (`"median":{"confidence_interval":{..},"point_estimate":N,..}`).
fn median_ns(json: &str) -> Option<f64> {
    let median = &json[json.find("\"median\"")?..];
    let value = &median[median.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
    let end = value.find([',', '}'])?;
    value[..end].trim().parse().ok()
}
