//! Borrowed views of tables, arrays and values: [`FieldTableRef`],
//! [`FieldArrayRef`] and [`FieldValueRef`], read straight from a decoded
//! table's validated wire bytes (or from entries of its own), building
//! nothing and allocating nothing.
//!
//! A child of `table.rs`, so that it can see a table's representation.
//! Reading uses the same nom parsers as building entries does, over bytes
//! that validation accepted: should they somehow not be what it accepted,
//! an iterator ends early; it never panics.

use nom::number::complete::be_u8;

use super::{Decimal, Entry, FieldArray, FieldTable, FieldValue, TableStorage};
use crate::types::validate::{long_bytes, short_string_len};
use crate::wire::num::{be_f32, be_f64, be_i16, be_i32, be_i64, be_i8, be_u16, be_u32, be_u64};
use crate::wire::PResult;

/// A field table, borrowed: its entries read one by one from the bytes
/// received, without building a [`FieldTable`] (see [`FieldTable::view`]).
///
/// ```
/// use acemq_codec::{FieldTable, FieldValue, FieldValueRef};
/// let mut table = FieldTable::new();
/// table.push("x-attempt", FieldValue::I32(2));
/// table.push("tenant", FieldValue::LongString("acme".into()));
/// let mut buf = bytes::BytesMut::new();
/// table.encode(&mut buf).unwrap();
/// let decoded = FieldTable::decode(&buf.freeze(), 64).unwrap();
///
/// let view = decoded.view();
/// assert_eq!(view.get("x-attempt").and_then(|v| v.as_i64()), Some(2));
/// let keys: Vec<&[u8]> = view.iter().map(|(key, _)| key).collect();
/// assert_eq!(keys, [&b"x-attempt"[..], b"tenant"]);
/// assert!(matches!(view.get("tenant"), Some(FieldValueRef::LongString(b"acme"))));
/// ```
#[derive(Clone, Copy)]
pub struct FieldTableRef<'a>(TableRef<'a>);

#[derive(Clone, Copy)]
enum TableRef<'a> {
    /// A validated table body, without its length prefix.
    Wire(&'a [u8]),
    /// Entries of a table's own.
    Entries(&'a [Entry]),
}

impl FieldTable {
    /// The table, borrowed: for a table as decoded, its entries are read
    /// from the wire bytes on the way, never built (the cheapest way to
    /// read a table once); for one built here, its entries.
    pub fn view(&self) -> FieldTableRef<'_> {
        FieldTableRef(match &self.0 {
            TableStorage::Owned(entries) => TableRef::Entries(entries),
            TableStorage::Wire(wire) => TableRef::Wire(wire.raw.as_slice()),
        })
    }
}

impl<'a> FieldTableRef<'a> {
    /// A view of a body that `table_body` accepted.
    #[inline]
    pub(crate) fn from_validated(body: &'a [u8]) -> Self {
        FieldTableRef(TableRef::Wire(body))
    }

    /// The entries in wire order, keys as bytes.
    #[inline]
    pub fn iter(&self) -> FieldTableIter<'a> {
        FieldTableIter(match self.0 {
            TableRef::Wire(body) => IterRepr::Wire(body),
            TableRef::Entries(entries) => IterRepr::Entries(entries.iter()),
        })
    }

    /// The value of the first entry named `key`.
    pub fn get(&self, key: &str) -> Option<FieldValueRef<'a>> {
        self.iter().find(|(k, _)| *k == key.as_bytes()).map(|(_, v)| v)
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        match self.0 {
            TableRef::Wire(body) => body.is_empty(),
            TableRef::Entries(entries) => entries.is_empty(),
        }
    }

    /// The table as a [`FieldTable`] of its own (built, for a wire table).
    pub fn to_owned(&self) -> FieldTable {
        self.iter()
            .map(|(key, value)| (super::ShortString::from_slice(key), value.to_owned()))
            .collect()
    }
}

impl std::fmt::Debug for FieldTableRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(k, v)| (String::from_utf8_lossy(k), v)))
            .finish()
    }
}

impl PartialEq for FieldTableRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

/// The entries of a [`FieldTableRef`], in wire order.
pub struct FieldTableIter<'a>(IterRepr<'a>);

enum IterRepr<'a> {
    /// The unread rest of a validated table body.
    Wire(&'a [u8]),
    Entries(std::slice::Iter<'a, Entry>),
}

impl<'a> Iterator for FieldTableIter<'a> {
    type Item = (&'a [u8], FieldValueRef<'a>);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            IterRepr::Entries(entries) => entries.next().map(|(k, v)| (k.as_bytes(), FieldValueRef::from(v))),
            IterRepr::Wire([]) => None,
            IterRepr::Wire(rest) => match field_value_pair(rest) {
                Ok((after, pair)) => {
                    *rest = after;
                    Some(pair)
                }
                Err(_) => {
                    *rest = &[];
                    None
                }
            },
        }
    }
}

/// A field array, borrowed: its values read one by one.
#[derive(Clone, Copy)]
pub struct FieldArrayRef<'a>(ArrayRef<'a>);

#[derive(Clone, Copy)]
enum ArrayRef<'a> {
    /// A validated array body, without its length prefix.
    Wire(&'a [u8]),
    Values(&'a [FieldValue]),
}

impl<'a> FieldArrayRef<'a> {
    /// The values in order.
    #[inline]
    pub fn iter(&self) -> FieldArrayIter<'a> {
        FieldArrayIter(match self.0 {
            ArrayRef::Wire(body) => ArrayIterRepr::Wire(body),
            ArrayRef::Values(values) => ArrayIterRepr::Values(values.iter()),
        })
    }

    /// Whether the array has no values.
    pub fn is_empty(&self) -> bool {
        match self.0 {
            ArrayRef::Wire(body) => body.is_empty(),
            ArrayRef::Values(values) => values.is_empty(),
        }
    }

    /// The array as a [`FieldArray`] of its own.
    pub fn to_owned(&self) -> FieldArray {
        FieldArray(self.iter().map(|v| v.to_owned()).collect())
    }
}

impl std::fmt::Debug for FieldArrayRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for FieldArrayRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl<'a> From<&'a FieldArray> for FieldArrayRef<'a> {
    fn from(array: &'a FieldArray) -> Self {
        FieldArrayRef(ArrayRef::Values(&array.0))
    }
}

/// The values of a [`FieldArrayRef`], in order.
pub struct FieldArrayIter<'a>(ArrayIterRepr<'a>);

enum ArrayIterRepr<'a> {
    Wire(&'a [u8]),
    Values(std::slice::Iter<'a, FieldValue>),
}

impl<'a> Iterator for FieldArrayIter<'a> {
    type Item = FieldValueRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            ArrayIterRepr::Values(values) => values.next().map(FieldValueRef::from),
            ArrayIterRepr::Wire([]) => None,
            ArrayIterRepr::Wire(rest) => match field_value(rest) {
                Ok((after, value)) => {
                    *rest = after;
                    Some(value)
                }
                Err(_) => {
                    *rest = &[];
                    None
                }
            },
        }
    }
}

/// A field value, borrowed: [`FieldValue`] with strings, byte arrays,
/// tables and arrays as views of the bytes they lie in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldValueRef<'a> {
    /// `t`: a boolean (any non-zero octet reads as true).
    Bool(bool),
    /// `b`: a signed 8-bit integer.
    I8(i8),
    /// `B`: an unsigned 8-bit integer.
    U8(u8),
    /// `s`: a signed 16-bit integer.
    I16(i16),
    /// `u`: an unsigned 16-bit integer.
    U16(u16),
    /// `I`: a signed 32-bit integer.
    I32(i32),
    /// `i`: an unsigned 32-bit integer.
    U32(u32),
    /// `l`: a signed 64-bit integer.
    I64(i64),
    /// `L`: read as a signed 64-bit integer, as RabbitMQ does.
    I64L(i64),
    /// `f`: a 32-bit float.
    F32(f32),
    /// `d`: a 64-bit float.
    F64(f64),
    /// `D`: a decimal.
    Decimal(Decimal),
    /// `S`: a long string's bytes.
    LongString(&'a [u8]),
    /// `A`: an array of values.
    Array(FieldArrayRef<'a>),
    /// `T`: a timestamp, seconds since the Unix epoch.
    Timestamp(u64),
    /// `F`: a nested table.
    Table(FieldTableRef<'a>),
    /// `V`: no value.
    Void,
    /// `x`: a byte array.
    ByteArray(&'a [u8]),
}

impl<'a> FieldValueRef<'a> {
    /// The value as an `i64` if it is an integer of any width (including a
    /// timestamp), as [`FieldValue::as_i64`].
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            FieldValueRef::I8(v) => Some(v.into()),
            FieldValueRef::U8(v) => Some(v.into()),
            FieldValueRef::I16(v) => Some(v.into()),
            FieldValueRef::U16(v) => Some(v.into()),
            FieldValueRef::I32(v) => Some(v.into()),
            FieldValueRef::U32(v) => Some(v.into()),
            FieldValueRef::I64(v) | FieldValueRef::I64L(v) => Some(v),
            FieldValueRef::Timestamp(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as text if it is a long string holding UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            FieldValueRef::LongString(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    /// The value as a [`FieldValue`] of its own.
    pub fn to_owned(&self) -> FieldValue {
        match *self {
            FieldValueRef::Bool(v) => FieldValue::Bool(v),
            FieldValueRef::I8(v) => FieldValue::I8(v),
            FieldValueRef::U8(v) => FieldValue::U8(v),
            FieldValueRef::I16(v) => FieldValue::I16(v),
            FieldValueRef::U16(v) => FieldValue::U16(v),
            FieldValueRef::I32(v) => FieldValue::I32(v),
            FieldValueRef::U32(v) => FieldValue::U32(v),
            FieldValueRef::I64(v) => FieldValue::I64(v),
            FieldValueRef::I64L(v) => FieldValue::I64L(v),
            FieldValueRef::F32(v) => FieldValue::F32(v),
            FieldValueRef::F64(v) => FieldValue::F64(v),
            FieldValueRef::Decimal(v) => FieldValue::Decimal(v),
            FieldValueRef::LongString(s) => FieldValue::LongString(s.into()),
            FieldValueRef::Array(a) => FieldValue::Array(a.to_owned()),
            FieldValueRef::Timestamp(v) => FieldValue::Timestamp(v),
            FieldValueRef::Table(t) => FieldValue::Table(t.to_owned()),
            FieldValueRef::Void => FieldValue::Void,
            FieldValueRef::ByteArray(b) => FieldValue::ByteArray(bytes::Bytes::copy_from_slice(b)),
        }
    }
}

impl<'a> From<&'a FieldValue> for FieldValueRef<'a> {
    fn from(value: &'a FieldValue) -> Self {
        match value {
            FieldValue::Bool(v) => FieldValueRef::Bool(*v),
            FieldValue::I8(v) => FieldValueRef::I8(*v),
            FieldValue::U8(v) => FieldValueRef::U8(*v),
            FieldValue::I16(v) => FieldValueRef::I16(*v),
            FieldValue::U16(v) => FieldValueRef::U16(*v),
            FieldValue::I32(v) => FieldValueRef::I32(*v),
            FieldValue::U32(v) => FieldValueRef::U32(*v),
            FieldValue::I64(v) => FieldValueRef::I64(*v),
            FieldValue::I64L(v) => FieldValueRef::I64L(*v),
            FieldValue::F32(v) => FieldValueRef::F32(*v),
            FieldValue::F64(v) => FieldValueRef::F64(*v),
            FieldValue::Decimal(v) => FieldValueRef::Decimal(*v),
            FieldValue::LongString(s) => FieldValueRef::LongString(s.as_bytes()),
            FieldValue::Array(a) => FieldValueRef::Array(a.into()),
            FieldValue::Timestamp(v) => FieldValueRef::Timestamp(*v),
            FieldValue::Table(t) => FieldValueRef::Table(t.view()),
            FieldValue::Void => FieldValueRef::Void,
            FieldValue::ByteArray(b) => FieldValueRef::ByteArray(b),
        }
    }
}

/// `field-value-pair = field-name field-value`, over validated bytes.
#[inline(always)]
fn field_value_pair(i: &[u8]) -> PResult<'_, (&[u8], FieldValueRef<'_>)> {
    let start = i;
    let (i, len) = short_string_len(i)?;
    let key = start.get(1..1 + len).unwrap_or_default();
    let (i, value) = field_value(i)?;
    Ok((i, (key, value)))
}

/// `field-value = type-code value`, over validated bytes: tables and
/// arrays are taken whole by their length, not looked inside.
#[inline(always)]
fn field_value(i: &[u8]) -> PResult<'_, FieldValueRef<'_>> {
    let (i, code) = be_u8(i)?;
    Ok(match code {
        b't' => be_u8(i).map(|(i, v)| (i, FieldValueRef::Bool(v != 0)))?,
        b'b' => be_i8(i).map(|(i, v)| (i, FieldValueRef::I8(v)))?,
        b'B' => be_u8(i).map(|(i, v)| (i, FieldValueRef::U8(v)))?,
        b's' => be_i16(i).map(|(i, v)| (i, FieldValueRef::I16(v)))?,
        b'u' => be_u16(i).map(|(i, v)| (i, FieldValueRef::U16(v)))?,
        b'I' => be_i32(i).map(|(i, v)| (i, FieldValueRef::I32(v)))?,
        b'i' => be_u32(i).map(|(i, v)| (i, FieldValueRef::U32(v)))?,
        b'l' => be_i64(i).map(|(i, v)| (i, FieldValueRef::I64(v)))?,
        b'L' => be_i64(i).map(|(i, v)| (i, FieldValueRef::I64L(v)))?,
        b'f' => be_f32(i).map(|(i, v)| (i, FieldValueRef::F32(v)))?,
        b'd' => be_f64(i).map(|(i, v)| (i, FieldValueRef::F64(v)))?,
        b'D' => {
            let (i, scale) = be_u8(i)?;
            let (i, value) = be_u32(i)?;
            (i, FieldValueRef::Decimal(Decimal { scale, value }))
        }
        b'S' => long_bytes(i).map(|(i, s)| (i, FieldValueRef::LongString(s)))?,
        b'x' => long_bytes(i).map(|(i, b)| (i, FieldValueRef::ByteArray(b)))?,
        b'T' => be_u64(i).map(|(i, v)| (i, FieldValueRef::Timestamp(v)))?,
        b'V' => (i, FieldValueRef::Void),
        b'F' => long_bytes(i).map(|(i, b)| (i, FieldValueRef::Table(FieldTableRef::from_validated(b))))?,
        b'A' => long_bytes(i).map(|(i, b)| (i, FieldValueRef::Array(FieldArrayRef(ArrayRef::Wire(b)))))?,
        other => return crate::wire::fail(crate::error::DecodeErrorKind::UnknownFieldType(other)),
    })
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A view of a decoded table reads what building it gives, and so
        /// does a view of a table built here.
        #[test]
        fn a_view_reads_what_building_gives(table in crate::arbitrary::table()) {
            let mut buf = BytesMut::new();
            table.encode(&mut buf).unwrap();
            let decoded = FieldTable::decode(&buf.freeze(), crate::DEFAULT_MAX_DEPTH).unwrap();
            prop_assert_eq!(decoded.view().to_owned(), decoded.clone());
            prop_assert_eq!(table.view().to_owned(), table.clone());
            prop_assert_eq!(decoded.view(), table.view());
        }
    }
}
