//! Tests of the validated lazy table: validation finds exactly the errors the
//! previous eager parser found, a decoded table re-encodes byte for byte
//! whether or not its entries were built, and changing one works as before.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use super::{FieldArray, FieldTable, FieldValue, LongString};
use crate::error::DecodeErrorKind;
use crate::{arbitrary, Error};

/// The eager recursive parser the lazy table replaced, kept as the oracle
/// for which error a malformed table gets.
mod reference {
    use crate::error::DecodeErrorKind;

    type R<'a> = Result<&'a [u8], DecodeErrorKind>;

    fn take(i: &[u8], n: usize) -> Result<(&[u8], &[u8]), DecodeErrorKind> {
        if i.len() < n {
            Err(DecodeErrorKind::Truncated)
        } else {
            Ok(i.split_at(n))
        }
    }

    fn prefixed(i: &[u8]) -> Result<(&[u8], &[u8]), DecodeErrorKind> {
        let (len, i) = take(i, 4)?;
        let len = u32::from_be_bytes(len.try_into().unwrap());
        if len as usize > i.len() {
            return Err(DecodeErrorKind::BadLength(len.into()));
        }
        Ok(i.split_at(len as usize))
    }

    fn nested(max: usize, depth: usize) -> Result<usize, DecodeErrorKind> {
        if depth + 1 > max {
            Err(DecodeErrorKind::NestingTooDeep(max))
        } else {
            Ok(depth + 1)
        }
    }

    pub(super) fn table(max: usize, depth: usize, i: &[u8]) -> R<'_> {
        let (mut body, rest) = prefixed(i)?;
        while !body.is_empty() {
            let (len, i) = take(body, 1)?;
            let (_, i) = take(i, usize::from(len[0]))?;
            body = value(max, depth, i)?;
        }
        Ok(rest)
    }

    fn array(max: usize, depth: usize, i: &[u8]) -> R<'_> {
        let (mut body, rest) = prefixed(i)?;
        while !body.is_empty() {
            body = value(max, depth, body)?;
        }
        Ok(rest)
    }

    fn value(max: usize, depth: usize, i: &[u8]) -> R<'_> {
        let (code, i) = take(i, 1)?;
        let fixed = |n| take(i, n).map(|(_, rest)| rest);
        match code[0] {
            b't' | b'b' | b'B' => fixed(1),
            b's' | b'u' => fixed(2),
            b'I' | b'i' | b'f' => fixed(4),
            b'l' | b'L' | b'd' | b'T' => fixed(8),
            b'D' => {
                let (_, i) = take(i, 1)?;
                take(i, 4).map(|(_, rest)| rest)
            }
            b'S' | b'x' => prefixed(i).map(|(_, rest)| rest),
            b'V' => Ok(i),
            b'F' => table(max, nested(max, depth)?, i),
            b'A' => array(max, nested(max, depth)?, i),
            other => Err(DecodeErrorKind::UnknownFieldType(other)),
        }
    }
}

/// What the reference parser says about `input` as a whole table.
fn reference_decode(input: &[u8], max_depth: usize) -> Result<(), DecodeErrorKind> {
    if max_depth == 0 {
        return Err(DecodeErrorKind::NestingTooDeep(0));
    }
    match reference::table(max_depth, 1, input)? {
        [] => Ok(()),
        rest => Err(DecodeErrorKind::TrailingBytes(rest.len())),
    }
}

fn encoded(table: &FieldTable) -> Bytes {
    let mut out = BytesMut::new();
    table.encode(&mut out).expect("encodes");
    out.freeze()
}

fn kind(err: Error) -> DecodeErrorKind {
    match err {
        Error::Malformed { kind, .. } => kind,
        other => panic!("unexpected {other:?}"),
    }
}

/// A table with every field type, a nested table inside an array, and a
/// long string too long to be inline.
fn sample() -> FieldTable {
    let mut inner = FieldTable::new();
    inner.push("reason", "rejected");
    inner.push("count", FieldValue::I64(3));
    let mut table = FieldTable::new();
    table.push("x-attempt", FieldValue::I32(2));
    table.push("first-seen", FieldValue::Timestamp(1_700_000_000));
    table.push("long", LongString::from("a".repeat(100)));
    table.push("bytes", FieldValue::ByteArray(Bytes::from_static(&[1, 2, 3])));
    table.push(
        "death",
        FieldValue::Array(FieldArray(vec![FieldValue::Table(inner.clone())])),
    );
    table.push("nested", FieldValue::Table(inner));
    table.push("x-attempt", FieldValue::I32(9));
    table.push("void", FieldValue::Void);
    table
}

#[test]
fn a_decoded_table_reencodes_byte_for_byte_before_and_after_its_entries_are_built() {
    let wire = encoded(&sample());
    let lazy = FieldTable::decode(&wire, 64).unwrap();
    assert_eq!(encoded(&lazy), wire, "not built yet");
    assert_eq!(lazy.len(), 8);
    assert_eq!(encoded(&lazy), wire, "built");
    assert_eq!(lazy, sample());
    assert_eq!(sample(), lazy);
}

#[test]
fn lookups_on_a_decoded_table_see_the_first_entry_and_nested_values() {
    let lazy = FieldTable::decode(&encoded(&sample()), 64).unwrap();
    assert_eq!(lazy.get("x-attempt"), Some(&FieldValue::I32(2)));
    assert!(lazy.contains_key("void"));
    assert!(!lazy.contains_key("nope"));
    assert!(!lazy.is_empty());
    let death = lazy.get("death").and_then(FieldValue::as_array).unwrap();
    let reason = death
        .iter()
        .next()
        .and_then(FieldValue::as_table)
        .unwrap()
        .get("reason");
    assert_eq!(reason.and_then(FieldValue::as_str), Some("rejected"));
    assert_eq!(lazy.get("long").and_then(FieldValue::as_str).map(str::len), Some(100));
    let keys: Vec<_> = lazy.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(
        keys,
        [
            "x-attempt",
            "first-seen",
            "long",
            "bytes",
            "death",
            "nested",
            "x-attempt",
            "void"
        ]
    );
    assert_eq!(lazy.entries().len(), 8);
}

#[test]
fn changing_a_decoded_table_works_as_on_a_built_one() {
    let wire = encoded(&sample());
    let mut expected = sample();
    let mut lazy = FieldTable::decode(&wire, 64).unwrap();
    assert_eq!(lazy.remove("absent"), None);
    assert_eq!(encoded(&lazy), wire, "removing nothing changes nothing");

    assert_eq!(lazy.insert("x-attempt", 3), expected.insert("x-attempt", 3));
    assert_eq!(lazy, expected);
    assert_eq!(encoded(&lazy), encoded(&expected));

    let mut lazy = FieldTable::decode(&wire, 64).unwrap();
    let mut expected = sample();
    assert_eq!(lazy.remove("x-attempt"), expected.remove("x-attempt"));
    lazy.push("new", true);
    expected.push("new", true);
    assert_eq!(lazy, expected);
    assert_eq!(encoded(&lazy), encoded(&expected));

    // Built first, then changed.
    let mut lazy = FieldTable::decode(&wire, 64).unwrap();
    assert!(lazy.get("nested").is_some());
    lazy.push("more", 1);
    let mut expected = sample();
    expected.push("more", 1);
    assert_eq!(encoded(&lazy), encoded(&expected));

    let lazy = FieldTable::decode(&wire, 64).unwrap();
    let entries: Vec<_> = lazy.into_iter().collect();
    assert_eq!(entries, sample().entries());
}

#[test]
fn clones_and_debug_output_do_not_depend_on_how_the_table_was_made() {
    let wire = encoded(&sample());
    let lazy = FieldTable::decode(&wire, 64).unwrap();
    let copy = lazy.clone();
    assert_eq!(format!("{lazy:?}"), format!("{:?}", sample()));
    let built_copy = lazy.clone();
    assert_eq!(copy, built_copy);
    assert_eq!(encoded(&copy), wire);
    assert_eq!(encoded(&built_copy), wire);
    assert!(format!("{:?}", FieldTable::new()).starts_with("FieldTable { entries: []"));
}

#[test]
fn equality_is_on_entries_so_nan_never_equals_itself() {
    let table: FieldTable = [("f", FieldValue::F64(f64::NAN))].into_iter().collect();
    let wire = encoded(&table);
    let a = FieldTable::decode(&wire, 64).unwrap();
    let b = FieldTable::decode(&wire, 64).unwrap();
    assert_ne!(a, b, "the same bytes, but NaN != NaN");
    assert_eq!(encoded(&a), wire);
}

#[test]
fn an_empty_decoded_table_is_empty() {
    let table = FieldTable::decode(&Bytes::from_static(&[0, 0, 0, 0]), 64).unwrap();
    assert!(table.is_empty());
    assert_eq!(table.len(), 0);
    assert_eq!(table, FieldTable::new());
    assert_eq!(&encoded(&table)[..], &[0, 0, 0, 0]);
}

#[test]
fn tables_are_send_and_sync_and_no_larger_than_a_vec() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<FieldTable>();
    assert_eq!(std::mem::size_of::<FieldTable>(), std::mem::size_of::<Vec<u8>>());
    assert_eq!(std::mem::size_of::<FieldValue>(), 40);
}

#[test]
fn a_table_built_on_another_thread_is_seen_by_all() {
    let lazy = FieldTable::decode(&encoded(&sample()), 64).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| lazy.get("x-attempt").cloned())).collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), Some(FieldValue::I32(2)));
        }
    });
}

/// Bytes that are a table, or nearly one: a valid table with some bytes
/// changed, cut or added, so that most errors are reachable.
fn nearly_tables() -> impl Strategy<Value = Vec<u8>> {
    let valid = arbitrary::table().prop_map(|t| encoded(&t).to_vec());
    (
        valid,
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        any::<usize>(),
        proptest::collection::vec(any::<u8>(), 0..4),
    )
        .prop_map(|(mut bytes, edits, cut, extra)| {
            for (at, byte) in edits {
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] = byte;
                }
            }
            if cut % 4 == 0 && !bytes.is_empty() {
                bytes.truncate(cut % bytes.len());
            }
            bytes.extend_from_slice(&extra);
            bytes
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn validation_finds_the_errors_the_eager_parser_found(bytes in nearly_tables(), depth in 0usize..6) {
        let ours = FieldTable::decode(&Bytes::from(bytes.clone()), depth).map(|_| ()).map_err(kind);
        prop_assert_eq!(ours, reference_decode(&bytes, depth));
    }

    #[test]
    fn random_bytes_get_the_same_verdict_too(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut framed = BytesMut::new();
        framed.put_u32(bytes.len() as u32);
        framed.put_slice(&bytes);
        let ours = FieldTable::decode(&framed.clone().freeze(), 3).map(|_| ()).map_err(kind);
        prop_assert_eq!(ours, reference_decode(&framed, 3));
    }

    #[test]
    fn a_valid_table_builds_to_what_was_encoded(table in arbitrary::table()) {
        let wire = encoded(&table);
        let lazy = FieldTable::decode(&wire, 64).unwrap();
        prop_assert_eq!(encoded(&lazy), wire.clone());
        prop_assert_eq!(&lazy, &table);
        prop_assert_eq!(encoded(&lazy), wire);
    }
}
