//! proptest strategies for every AMQP domain, field value and property, used
//! by the round-trip tests. Floats are never NaN here, so values compare
//! equal after a round trip; NaN payloads are tested on bytes separately.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;

use crate::{BasicProperties, Decimal, FieldArray, FieldTable, FieldValue, LongString, ShortString};

pub(crate) fn octet() -> impl Strategy<Value = u8> {
    any::<u8>()
}

pub(crate) fn short() -> impl Strategy<Value = u16> {
    any::<u16>()
}

pub(crate) fn long() -> impl Strategy<Value = u32> {
    any::<u32>()
}

pub(crate) fn longlong() -> impl Strategy<Value = u64> {
    any::<u64>()
}

pub(crate) fn bit() -> impl Strategy<Value = bool> {
    any::<bool>()
}

pub(crate) fn shortstr() -> impl Strategy<Value = ShortString> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..24),
        1 => vec(any::<u8>(), 250..=255),
    ]
    .prop_map(|b| ShortString::from_bytes(Bytes::from(b)).expect("at most 255 bytes"))
}

pub(crate) fn longstr() -> impl Strategy<Value = LongString> {
    vec(any::<u8>(), 0..300).prop_map(LongString::from)
}

fn float32() -> impl Strategy<Value = f32> {
    any::<f32>().prop_filter("NaN never equals itself", |f| !f.is_nan())
}

fn float64() -> impl Strategy<Value = f64> {
    any::<f64>().prop_filter("NaN never equals itself", |f| !f.is_nan())
}

/// Every scalar field type.
fn scalar() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any::<i8>().prop_map(FieldValue::I8),
        any::<u8>().prop_map(FieldValue::U8),
        any::<i16>().prop_map(FieldValue::I16),
        any::<u16>().prop_map(FieldValue::U16),
        any::<i32>().prop_map(FieldValue::I32),
        any::<u32>().prop_map(FieldValue::U32),
        any::<i64>().prop_map(FieldValue::I64),
        any::<i64>().prop_map(FieldValue::I64L),
        float32().prop_map(FieldValue::F32),
        float64().prop_map(FieldValue::F64),
        (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| FieldValue::Decimal(Decimal { scale, value })),
        longstr().prop_map(FieldValue::LongString),
        any::<u64>().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
        vec(any::<u8>(), 0..40).prop_map(|b| FieldValue::ByteArray(Bytes::from(b))),
    ]
}

/// Any field value, tables and arrays nested a few levels.
pub(crate) fn field_value() -> impl Strategy<Value = FieldValue> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec((shortstr(), inner.clone()), 0..6).prop_map(|e| FieldValue::Table(e.into_iter().collect())),
            vec(inner, 0..6).prop_map(|v| FieldValue::Array(FieldArray(v))),
        ]
    })
}

/// A table, duplicate keys included.
pub(crate) fn table() -> impl Strategy<Value = FieldTable> {
    vec((shortstr(), field_value()), 0..8).prop_map(|entries| {
        let mut table = FieldTable::new();
        for (k, v) in entries {
            table.push(k, v);
        }
        table
    })
}

/// Any combination of the 14 properties.
pub(crate) fn properties() -> impl Strategy<Value = BasicProperties> {
    (
        (
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
            proptest::option::of(table()),
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u8>()),
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
        ),
        (
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
            proptest::option::of(shortstr()),
        ),
    )
        .prop_map(
            |(
                (content_type, content_encoding, headers, delivery_mode, priority, correlation_id, reply_to),
                (expiration, message_id, timestamp, kind, user_id, app_id, cluster_id),
            )| BasicProperties {
                content_type,
                content_encoding,
                headers,
                delivery_mode,
                priority,
                correlation_id,
                reply_to,
                expiration,
                message_id,
                timestamp,
                kind,
                user_id,
                app_id,
                cluster_id,
            },
        )
}
