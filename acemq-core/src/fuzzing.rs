//! The entry point of the `delivery` fuzz target
//! (`fuzz/fuzz_targets/delivery.rs`): a delivery whose properties, headers,
//! body, exchange and routing key come from the input, read by everything
//! that reads a delivery on a producer's word: the consumer (envelope,
//! attempt, first seen, stream offset, routing slip, the copy a retry or a
//! set-aside publishes), `replay` (the set-aside message, its destination,
//! the replayed copy) and the scheduler (destination, due time, the
//! delivered copy). Compiled only for fuzzing (`--cfg fuzzing`, which
//! cargo-fuzz passes) and for this crate's tests, which replay the
//! committed corpus through the same code on stable (`corpus_tests`). Not
//! part of the API: it changes with the target, and nothing in the library
//! may call it.
//!
//! An input is a flag byte, then either a script that builds properties
//! (bit 1 clear) or raw property bytes (bit 1 set: a two-byte length, then
//! the flag word and property list as they go on the wire), then the
//! exchange and routing key (a length byte each), then the body (the rest).
//! Bit 0 is `redelivered`. The script's steps set a property or a header:
//! headers are named from the contract's list (`x-acemq-*`,
//! `x-delivery-count`, `x-death`, ...) or by the input, and their values
//! are of any field type, nested, with the integers and times that sit on
//! the edges (negative, 2^31, 2^63 + 1, `u64::MAX`, the last second of
//! 9999). The properties are encoded and read back through the frame
//! decoder, as the driver receives them, so that what it refuses arrives
//! as an undecodable header, as it would from a broker.
//!
//! It panics, which is the finding, when a reader panics, or when what the
//! library would publish breaks the contract: a retry's, a set-aside's, a
//! replay's or a scheduled delivery's copy that carries `x-delivery-count`,
//! has no `message-id`, an attempt other than the one it should, a first
//! seen that does not read, or does not encode; a retry's copy whose id
//! differs from the one the handler saw.

use std::time::{Duration, SystemTime};

use acemq_codec::{
    encode_content_raw, BasicDeliver, BasicProperties, Decimal, FieldArray, FieldTable, FieldValue, Frame,
    FrameDecoder, LongString, ShortString,
};
use bytes::{Bytes, BytesMut};

use crate::amqp::state::Acker;
use crate::amqp::Delivery;
use crate::codec::{Codec, Json};
use crate::envelope::{Envelope, ATTEMPT_HEADER, FIRST_SEEN_HEADER, REPLAYED_HEADER};
use crate::replay::SetAside;
use crate::retry::{Decision, RetryPolicy};

#[cfg(test)]
mod corpus_tests;

/// The header names a step can pick: every one the library reads or
/// writes, and some it only carries.
const NAMES: &[&str] = &[
    crate::envelope::ATTEMPT_HEADER,
    crate::envelope::FIRST_SEEN_HEADER,
    crate::envelope::CAUSATION_HEADER,
    crate::envelope::ERROR_HEADER,
    crate::envelope::REPLAYED_HEADER,
    crate::envelope::ORIGINAL_EXCHANGE_HEADER,
    crate::envelope::ORIGINAL_ROUTING_KEY_HEADER,
    crate::hop::ROUTING_SLIP_HEADER,
    crate::hop::ROUTING_SLIP_STEP_HEADER,
    crate::schedule::DELIVER_TO_EXCHANGE_HEADER,
    crate::schedule::DELIVER_TO_ROUTING_KEY_HEADER,
    crate::schedule::DELIVER_AT_HEADER,
    "x-delivery-count",
    "x-stream-offset",
    "x-death",
    "x-first-death-exchange",
    "x-first-death-reason",
    "x-acemq-source-queue",
    "exchange",
    "routing-key",
    "routing-keys",
];

/// Integers on the edges of what is read.
const EDGES: &[i64] = &[
    0,
    1,
    -1,
    2,
    6,
    i32::MAX as i64,
    i32::MAX as i64 + 1,
    i32::MIN as i64,
    u32::MAX as i64,
    u32::MAX as i64 + 1,
    253_402_300_799,
    253_402_300_800,
    i64::MAX,
    i64::MIN,
];

/// Times on the edges: now-ish, the last readable second and the one after
/// it, 2^63 and 2^63 + 1, `u64::MAX`.
const TIMES: &[u64] = &[
    0,
    1_796_000_000,
    253_402_300_799,
    253_402_300_800,
    1 << 63,
    (1 << 63) + 1,
    u64::MAX,
];

/// Reads the delivery `data` describes as the module docs say. Panics only
/// when a reader breaks one of the rules listed there.
pub fn delivery(data: &[u8]) {
    let mut input = Reader(data);
    let flags = input.byte();
    let redelivered = flags & 1 != 0;
    let raw = if flags & 2 != 0 {
        let len = usize::from(u16::from_be_bytes([input.byte(), input.byte()]));
        input.take(len).to_vec()
    } else {
        let properties = script(&mut input);
        let mut raw = BytesMut::new();
        if properties.encode(&mut raw).is_err() {
            // Nothing a broker could deliver.
            return;
        }
        raw.to_vec()
    };
    let exchange = short(&mut input);
    let routing_key = short(&mut input);
    let body = Bytes::copy_from_slice(input.0);
    let Some(delivery) = received(&raw, redelivered, exchange, routing_key, body) else {
        return;
    };
    as_the_consumer(&delivery);
    as_replay(&delivery);
    as_the_scheduler(&delivery);
}

/// The delivery as the driver would hand it over: properties through the
/// frame decoder, so a refused property list is an undecodable header.
fn received(
    raw: &[u8],
    redelivered: bool,
    exchange: ShortString,
    routing_key: ShortString,
    body: Bytes,
) -> Option<Delivery> {
    let deliver = BasicDeliver {
        consumer_tag: "fuzz".into(),
        delivery_tag: 1,
        redelivered,
        exchange: exchange.clone(),
        routing_key: routing_key.clone(),
    };
    let mut frames = BytesMut::new();
    encode_content_raw(1, &deliver.into(), raw, &[], 0, &mut frames).ok()?;
    let decoder = FrameDecoder::new(0);
    let mut properties = None;
    // A property list the envelope refuses as a whole (a wrong flag
    // word, bytes left over) is no delivery: the driver closes the
    // connection for it, as it must.
    while let Ok(Some(frame)) = decoder.decode(&mut frames) {
        match frame {
            Frame::Header(_, header) => properties = Some(Ok(header.properties)),
            Frame::UndecodableHeader(_, header) => properties = Some(Err(header)),
            _ => {}
        }
    }
    Some(Delivery {
        consumer_tag: "fuzz".into(),
        delivery_tag: 1,
        redelivered,
        exchange,
        routing_key,
        properties: properties?,
        body,
        acker: Acker::detached(),
    })
}

/// What `consume` reads, and the copies it would publish.
fn as_the_consumer(delivery: &Delivery) {
    let properties: BasicProperties = match &delivery.properties {
        Ok(properties) => {
            let envelope = crate::consume::delivery::envelope_of(&properties.view(), delivery);
            let _ = crate::hop::has_slip_in(&envelope.headers);
            let _ = crate::consume::delivery::stream_offset(delivery);
            let _ = Json.decode::<serde_json::Value>(&delivery.body);
            let id = crate::consume::delivery::id_of(delivery, properties);
            assert_eq!(id, envelope.id, "the id a retry writes is the one the handler saw");
            decide(envelope.attempt, envelope.first_seen);
            retried(delivery, properties, envelope.attempt, &id);
            let allow_all = |_: &str, _: &str| true;
            let _ = crate::hop::next_hop(properties, &id, None, None, Some(&allow_all));
            let output = Some((Bytes::from_static(b"{}"), "application/json".to_string()));
            let _ = crate::hop::next_hop(properties, &id, None, output, Some(&allow_all));
            properties.as_ref().clone()
        }
        Err(raw) => raw.salvage().properties,
    };
    // A set-aside: undecodable, fatal, given up, parked.
    let attempt = crate::consume::delivery::envelope_of(&properties.view(), delivery).attempt;
    let copy = crate::consume::delivery::hop_properties(&properties, delivery, "orders", attempt, Some("fuzz"));
    published(&copy, "a set-aside");
    assert_eq!(
        Envelope::read_from(&copy).attempt,
        attempt.min(i32::MAX as u32),
        "a set-aside keeps the attempt"
    );
}

/// The retry decision, under policies that wait in the process, in the
/// broker, and give up by age.
fn decide(attempt: u32, first_seen: SystemTime) {
    let error = std::io::Error::other("fuzz");
    let policies = [
        RetryPolicy::fixed(5, Duration::from_secs(1)),
        RetryPolicy::exponential(u32::MAX, Duration::from_secs(1), Duration::ZERO)
            .wait_in_broker_from(Duration::from_secs(4)),
        RetryPolicy::immediate().give_up_after(Duration::from_secs(60)),
    ];
    for policy in policies {
        if let Decision::DeadLetter { reason } = policy.decide(attempt, first_seen, &error, SystemTime::now()) {
            assert!(!reason.is_empty());
        }
    }
}

/// The copy a retry publishes: attempt one higher, same id, no broker count.
fn retried(delivery: &Delivery, properties: &BasicProperties, attempt: u32, id: &str) {
    let next = attempt.saturating_add(1);
    // The queue: one the delivery's routing key names (so the library's own
    // copies may come back), and one it does not.
    let queue = delivery.routing_key.to_string_lossy();
    let copy = crate::consume::delivery::hop_properties(properties, delivery, &queue, next, None);
    published(&copy, "a retry");
    let copy = crate::consume::delivery::hop_properties(properties, delivery, "orders", next, None);
    published(&copy, "a retry");
    let read = Envelope::read_from(&copy);
    assert_eq!(read.id, id, "a retry keeps the id");
    assert_eq!(
        read.attempt,
        next.min(i32::MAX as u32),
        "a retry advances the attempt by one"
    );
}

/// The contract of every copy the library publishes.
fn published(copy: &BasicProperties, what: &str) {
    let headers = copy
        .headers
        .as_ref()
        .unwrap_or_else(|| panic!("{what} without headers"));
    assert!(
        headers.get("x-delivery-count").is_none(),
        "{what} carries x-delivery-count"
    );
    assert!(copy.message_id.is_some(), "{what} without a message-id");
    assert!(
        matches!(headers.get(ATTEMPT_HEADER), Some(FieldValue::I32(n)) if *n >= 1),
        "{what}: attempt {:?}",
        headers.get(ATTEMPT_HEADER)
    );
    let first_seen = headers.get(FIRST_SEEN_HEADER).and_then(FieldValue::as_i64);
    assert!(
        crate::envelope::time_of(first_seen).is_some(),
        "{what}: first seen {:?} does not read",
        headers.get(FIRST_SEEN_HEADER)
    );
    assert!(copy.encode(&mut BytesMut::new()).is_ok(), "{what} does not encode");
}

/// What `replay`, `peek` and the CLI read of a set-aside message, and the
/// replayed copy.
fn as_replay(delivery: &Delivery) {
    let aside = SetAside::read(delivery);
    let scheduled = format!("{}.dlq", crate::schedule::DELIVERY);
    for (from, to_original) in [
        ("orders.dlq", false),
        ("orders.parked", true),
        (scheduled.as_str(), false),
        ("elsewhere", false),
    ] {
        let _ = aside.destination(from, to_original);
    }
    let _ = (
        aside.error.as_deref(),
        aside.envelope.first_seen.duration_since(SystemTime::UNIX_EPOCH),
    );
    let copy = aside.replay_properties();
    published(&copy, "a replay");
    let headers = copy.headers.as_ref().expect("checked");
    assert_eq!(
        headers.get(ATTEMPT_HEADER),
        Some(&FieldValue::I32(1)),
        "a replay starts at 1"
    );
    let replayed = headers.get(REPLAYED_HEADER).and_then(FieldValue::as_i64);
    assert!(replayed.is_some_and(|n| n >= 1), "a replay counts itself: {replayed:?}");
}

/// What the scheduler reads, and the delivered copy.
fn as_the_scheduler(delivery: &Delivery) {
    let properties: &BasicProperties = match &delivery.properties {
        Ok(properties) => properties,
        Err(_) => return,
    };
    let input_id = match &properties.message_id {
        Some(id) => id.to_string_lossy().into_owned(),
        None => Envelope::read_from_message(properties, &delivery.body).id,
    };
    let Ok(target) = crate::schedule::target_of(properties) else {
        return;
    };
    if let Some(due) = target.due() {
        let _ = due.duration_since(SystemTime::now());
    }
    let copy = crate::schedule::delivered_properties(properties, &input_id, &target);
    published(&copy, "a scheduled delivery");
    assert_eq!(
        copy.headers.as_ref().and_then(|h| h.get(ATTEMPT_HEADER)),
        Some(&FieldValue::I32(1))
    );
}

// ---------------------------------------------------------------- the input

/// The input: bytes taken from the front, zeros once it runs out.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        first
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }

    fn u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        let taken = self.take(8);
        bytes[..taken.len()].copy_from_slice(taken);
        u64::from_be_bytes(bytes)
    }

    /// An integer: an edge (high bit of the selector set) or eight bytes.
    fn integer(&mut self) -> i64 {
        let selector = self.byte();
        if selector & 0x80 != 0 {
            return EDGES[usize::from(selector & 0x7f) % EDGES.len()];
        }
        self.u64() as i64
    }

    /// A time: an edge or eight bytes.
    fn time(&mut self) -> u64 {
        let selector = self.byte();
        if selector & 0x80 != 0 {
            return TIMES[usize::from(selector & 0x7f) % TIMES.len()];
        }
        self.u64()
    }

    /// Up to 63 bytes of text (or not text at all).
    fn text(&mut self) -> Vec<u8> {
        let len = usize::from(self.byte() & 0x3f);
        self.take(len).to_vec()
    }
}

/// A short string: up to 63 bytes of the input.
fn short(input: &mut Reader<'_>) -> ShortString {
    ShortString::from_bytes(Bytes::from(input.text())).unwrap_or_default()
}

/// A header name: from [`NAMES`], or made up by the input.
fn name(input: &mut Reader<'_>) -> ShortString {
    let selector = input.byte();
    if selector & 0x80 == 0 {
        return NAMES[usize::from(selector) % NAMES.len()].into();
    }
    short(input)
}

/// A value of any type; tables and arrays nest to `depth`.
fn value(input: &mut Reader<'_>, depth: u8) -> FieldValue {
    match input.byte() % 19 {
        0 => FieldValue::Bool(input.byte() & 1 != 0),
        1 => FieldValue::I8(input.integer() as i8),
        2 => FieldValue::U8(input.integer() as u8),
        3 => FieldValue::I16(input.integer() as i16),
        4 => FieldValue::U16(input.integer() as u16),
        5 => FieldValue::I32(input.integer() as i32),
        6 => FieldValue::U32(input.integer() as u32),
        7 => FieldValue::I64(input.integer()),
        8 => FieldValue::I64L(input.integer()),
        9 => FieldValue::F32(f32::from_bits(input.integer() as u32)),
        10 => FieldValue::F64(f64::from_bits(input.integer() as u64)),
        11 => FieldValue::Decimal(Decimal {
            scale: input.byte(),
            value: input.integer() as u32,
        }),
        12 | 13 => FieldValue::LongString(LongString::from(input.text())),
        14 => FieldValue::Timestamp(input.time()),
        15 => FieldValue::Void,
        16 => FieldValue::ByteArray(Bytes::from(input.text())),
        17 if depth > 0 => {
            let n = input.byte() % 5;
            FieldValue::Array(FieldArray((0..n).map(|_| value(input, depth - 1)).collect()))
        }
        18 if depth > 0 => FieldValue::Table(table(input, depth - 1)),
        _ => FieldValue::Void,
    }
}

/// A table of up to seven entries.
fn table(input: &mut Reader<'_>, depth: u8) -> FieldTable {
    let mut table = FieldTable::new();
    for _ in 0..input.byte() % 8 {
        let key = name(input);
        let value = value(input, depth);
        table.push(key, value);
    }
    table
}

/// Properties built by the script: up to 31 steps.
fn script(input: &mut Reader<'_>) -> BasicProperties {
    let mut p = BasicProperties::default();
    for _ in 0..input.byte() % 32 {
        match input.byte() % 12 {
            0 => p.message_id = Some(short(input)),
            1 => p.correlation_id = Some(short(input)),
            2 => p.timestamp = Some(input.time()),
            3 => p.content_type = Some(short(input)),
            4 => p.kind = Some(short(input)),
            5 => p.app_id = Some(short(input)),
            6 => p.delivery_mode = Some(input.byte()),
            7 => p.expiration = Some(short(input)),
            8 => p.user_id = Some(short(input)),
            // Headers, most often: a name and a value, nested up to four deep.
            _ => {
                let key = name(input);
                let value = value(input, 4);
                p.headers.get_or_insert_with(FieldTable::new).push(key, value);
            }
        }
    }
    p
}

/// The committed seeds of the `delivery` target, by file name: the
/// messages that were found to break a reader, and ordinary ones.
/// `tests/fuzz_corpus.rs` checks that `fuzz/corpus/delivery/` holds these.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Steps: 2 = timestamp, 9 = header; names by index into NAMES.
    let name_of = |wanted: &str| NAMES.iter().position(|n| *n == wanted).expect("a listed name") as u8;
    let header = |n: &str, value: &[u8]| [&[9, name_of(n)][..], value].concat();
    let body = b"{\"id\":1}";
    let message = |redelivered: u8, steps: &[Vec<u8>]| {
        let mut out = vec![redelivered, steps.len() as u8];
        for step in steps {
            out.extend_from_slice(step);
        }
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(body);
        out
    };
    // Value selectors: 5 = I32, 14 = timestamp, 12 = string; 0x80 | i an edge.
    let i32_edge = |i: u8| vec![5, 0x80 | i];
    let time_edge = |i: u8| vec![14, 0x80 | i];
    vec![
        ("seed-plain", message(0, &[])),
        (
            "seed-timestamp-2-63-plus-1",
            message(0, &[[vec![2], time_edge(5)].concat()]),
        ),
        (
            "seed-timestamp-u64-max",
            message(0, &[[vec![2], time_edge(6)].concat()]),
        ),
        (
            "seed-first-seen-u64-max",
            message(0, &[header(FIRST_SEEN_HEADER, &time_edge(6))]),
        ),
        (
            "seed-attempt-string",
            message(0, &[header(ATTEMPT_HEADER, &[12, 3, b'a', b'b', b'c'])]),
        ),
        (
            "seed-attempt-negative",
            message(0, &[header(ATTEMPT_HEADER, &i32_edge(2))]),
        ),
        (
            "seed-quorum-redelivered",
            message(1, &[header("x-delivery-count", &[7, 0x80 | 3])]),
        ),
        (
            "seed-slip-malformed",
            message(
                0,
                &[
                    header(
                        crate::hop::ROUTING_SLIP_HEADER,
                        &[17, 2, 12, 1, b'x', 18, 1, 0x7f, 5, 0x80 | 1],
                    ),
                    header(crate::hop::ROUTING_SLIP_STEP_HEADER, &i32_edge(7)),
                ],
            ),
        ),
        (
            "seed-scheduled-far",
            message(
                0,
                &[
                    header(crate::schedule::DELIVER_TO_EXCHANGE_HEADER, &[12, 0]),
                    header(crate::schedule::DELIVER_TO_ROUTING_KEY_HEADER, &[12, 1, b'q']),
                    header(crate::schedule::DELIVER_AT_HEADER, &time_edge(3)),
                ],
            ),
        ),
        (
            "seed-raw-undecodable",
            // Headers with a field of unknown type `Z`.
            [&[2u8, 0, 9, 0x20, 0x00, 0, 0, 0, 3, 1, b'k', b'Z'][..], &[0, 0], body].concat(),
        ),
    ]
}
