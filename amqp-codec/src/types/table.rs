//! Field tables and field arrays.
//!
//! A table is a list of (key, value) pairs in wire order, duplicates kept, so
//! decoding then encoding gives back the same bytes; lookups take the first
//! match. Both carry a 32-bit byte-length prefix.
//!
//! A decoded table is validated but not materialized: decoding walks its
//! bytes once with nom's complete parsers, without allocating, and enforces
//! every rule (nesting limit, known type codes, lengths that fit their
//! container), so a bad table is still an error at decode time. The table
//! then keeps its wire bytes (a copy in its own allocation if small, else a
//! zero-copy slice of the frame when there is one to share) and builds its
//! entries the first time they are asked for. Encoding a table that was
//! never changed copies its bytes.
//! Validation recurses only as deep as the nesting limit allows.

use std::fmt;
use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};

use nom::bytes::complete::take;
use nom::number::complete::be_u8;

use crate::parse::num::{be_f32, be_f64, be_i16, be_i32, be_i64, be_i8, be_u16, be_u32, be_u64};

use super::short_string_len;
use super::value::Decimal;
use super::{FieldValue, LongString, ShortString};
use crate::error::{DecodeErrorKind, EncodeError};
use crate::parse::{fail, PResult};

/// One table entry.
type Entry = (ShortString, FieldValue);

/// An AMQP field table: ordered (key, value) pairs.
///
/// A table decoded from the wire keeps the wire bytes and builds its entries
/// on first access (thread-safe, once); a table built or changed through
/// `insert`, `push` or `remove` holds only entries. Equality compares
/// entries, never bytes.
#[derive(Clone)]
pub struct FieldTable(Repr);

/// The two states of a table. Kept to the size of a `Vec` so that methods
/// and field values holding a table do not grow.
#[derive(Clone)]
enum Repr {
    /// Entries of the table's own.
    Owned(Vec<Entry>),
    /// A table as decoded: the validated wire bytes, and the entries once
    /// built from them.
    Wire(Box<WireTable>),
}

#[derive(Clone)]
struct WireTable {
    /// The validated body, without the length prefix; never empty.
    raw: RawBody,
    /// The entries, built from `raw` on first access.
    entries: OnceLock<Vec<Entry>>,
}

/// How many bytes of a decoded table are kept in the table's own
/// allocation. Most headers and arguments tables are smaller: copying them
/// costs less than sharing the frame (a reference count taken and dropped
/// for the frame and again for the slice).
const RAW_INLINE: usize = 192;
const _: () = assert!(RAW_INLINE <= u8::MAX as usize);

/// The wire bytes of a decoded table.
#[derive(Clone)]
enum RawBody {
    /// A copy, for small tables.
    Inline { len: u8, buf: [u8; RAW_INLINE] },
    /// A slice of the frame, or a copy, for larger ones.
    Shared(Bytes),
}

impl RawBody {
    #[inline]
    fn as_slice(&self) -> &[u8] {
        match self {
            RawBody::Inline { len, buf } => buf.get(..usize::from(*len)).unwrap_or_default(),
            RawBody::Shared(bytes) => bytes,
        }
    }

    /// The shared buffer long values can be sliced from, if there is one.
    fn shared(&self) -> Option<&Bytes> {
        match self {
            RawBody::Inline { .. } => None,
            RawBody::Shared(bytes) => Some(bytes),
        }
    }
}

impl Default for FieldTable {
    fn default() -> Self {
        FieldTable::new()
    }
}

impl FieldTable {
    /// An empty table.
    pub const fn new() -> Self {
        FieldTable(Repr::Owned(Vec::new()))
    }

    /// A table over a body that [`table_body`] accepted, which
    /// lies within `source` when there is one: a small body is copied, a
    /// larger one sliced from `source` (or copied without one).
    #[inline]
    pub(crate) fn from_validated(body: &[u8], source: Option<&Bytes>) -> Self {
        if body.is_empty() {
            return FieldTable::new();
        }
        let mut wire = Box::new(WireTable {
            raw: RawBody::Inline {
                len: 0,
                buf: [0; RAW_INLINE],
            },
            entries: OnceLock::new(),
        });
        // Filled where it lies: the box is not built on the stack and moved.
        match &mut wire.raw {
            RawBody::Inline { len, buf } if body.len() <= RAW_INLINE => {
                buf[..body.len()].copy_from_slice(body);
                *len = body.len() as u8;
            }
            raw => {
                *raw = RawBody::Shared(match source {
                    Some(source) => source.slice_ref(body),
                    None => Bytes::copy_from_slice(body),
                })
            }
        }
        FieldTable(Repr::Wire(wire))
    }

    /// The entries, built from the wire bytes on first access.
    #[inline]
    fn built(&self) -> &[Entry] {
        match &self.0 {
            Repr::Owned(entries) => entries,
            Repr::Wire(wire) => wire.entries.get_or_init(|| materialize_table(&wire.raw)),
        }
    }

    /// The entries, to change: from now on the table holds its own.
    fn entries_mut(&mut self) -> &mut Vec<Entry> {
        if let Repr::Wire(wire) = &mut self.0 {
            let entries = match wire.entries.take() {
                Some(entries) => entries,
                None => materialize_table(&wire.raw),
            };
            self.0 = Repr::Owned(entries);
        }
        match &mut self.0 {
            Repr::Owned(entries) => entries,
            // Just turned into `Owned` above.
            Repr::Wire(_) => unreachable!("a table being changed owns its entries"),
        }
    }

    /// The value of the first entry named `key`.
    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.built()
            .iter()
            .find(|(k, _)| k.as_bytes() == key.as_bytes())
            .map(|(_, v)| v)
    }

    /// Sets `key` to `value`: replaces the first entry with that key, or
    /// appends one. Returns the value replaced.
    pub fn insert(&mut self, key: impl Into<ShortString>, value: impl Into<FieldValue>) -> Option<FieldValue> {
        let key = key.into();
        let value = value.into();
        let entries = self.entries_mut();
        match entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => Some(std::mem::replace(slot, value)),
            None => {
                entries.push((key, value));
                None
            }
        }
    }

    /// Appends an entry, even if the key is already present.
    pub fn push(&mut self, key: impl Into<ShortString>, value: impl Into<FieldValue>) {
        self.entries_mut().push((key.into(), value.into()));
    }

    /// Removes every entry named `key`; returns the first value removed.
    pub fn remove(&mut self, key: &str) -> Option<FieldValue> {
        if !self.contains_key(key) {
            return None;
        }
        let entries = self.entries_mut();
        let at = entries.iter().position(|(k, _)| k.as_bytes() == key.as_bytes())?;
        let (_, first) = entries.remove(at);
        entries.retain(|(k, _)| k.as_bytes() != key.as_bytes());
        Some(first)
    }

    /// Whether an entry named `key` exists.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The entries in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&ShortString, &FieldValue)> {
        self.built().iter().map(|(k, v)| (k, v))
    }

    /// The entries in wire order.
    pub fn entries(&self) -> &[(ShortString, FieldValue)] {
        self.built()
    }

    /// The number of entries (duplicates counted).
    pub fn len(&self) -> usize {
        self.built().len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        match &self.0 {
            Repr::Owned(entries) => entries.is_empty(),
            // A validated body that is not empty holds at least one entry.
            Repr::Wire(_) => false,
        }
    }

    /// Appends the 32-bit length and the entries. A table as decoded is
    /// written back byte for byte.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let entries = match &self.0 {
            Repr::Owned(entries) => entries,
            Repr::Wire(wire) => return super::strings::encode_long_bytes(wire.raw.as_slice(), dst),
        };
        with_length_prefix(dst, |dst| {
            for (key, value) in entries {
                key.encode(dst)?;
                value.encode(dst)?;
            }
            Ok(())
        })
    }
}

impl PartialEq for FieldTable {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl fmt::Debug for FieldTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FieldTable").field("entries", &self.built()).finish()
    }
}

impl<K: Into<ShortString>, V: Into<FieldValue>> FromIterator<(K, V)> for FieldTable {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        FieldTable(Repr::Owned(
            iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        ))
    }
}

impl IntoIterator for FieldTable {
    type Item = (ShortString, FieldValue);
    type IntoIter = std::vec::IntoIter<(ShortString, FieldValue)>;

    fn into_iter(mut self) -> Self::IntoIter {
        std::mem::take(self.entries_mut()).into_iter()
    }
}

/// An AMQP field array (`A`): values in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldArray(pub Vec<FieldValue>);

impl FieldArray {
    /// Appends the 32-bit length and the values.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        with_length_prefix(dst, |dst| {
            for value in &self.0 {
                value.encode(dst)?;
            }
            Ok(())
        })
    }

    /// The values.
    pub fn iter(&self) -> std::slice::Iter<'_, FieldValue> {
        self.0.iter()
    }

    /// The number of values.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the array is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<V: Into<FieldValue>> FromIterator<V> for FieldArray {
    fn from_iter<I: IntoIterator<Item = V>>(iter: I) -> Self {
        FieldArray(iter.into_iter().map(Into::into).collect())
    }
}

/// Writes a 32-bit length placeholder, the body, then patches the length.
fn with_length_prefix(
    dst: &mut BytesMut,
    body: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let at = dst.len();
    dst.put_u32(0);
    body(dst)?;
    let len = dst.len() - at - 4;
    let len32 = u32::try_from(len).map_err(|_| EncodeError::TooLong(len))?;
    dst[at..at + 4].copy_from_slice(&len32.to_be_bytes());
    Ok(())
}

// ---------------------------------------------------------------------------
// Validation: one pass over the bytes with nom's complete parsers, no
// allocation.
// ---------------------------------------------------------------------------

/// `long-uint *OCTET`: a 32-bit length and the bytes it covers. A length
/// past the end of the container is `BadLength`, not `Truncated`, because it
/// is the length that lies.
#[inline]
pub(crate) fn long_bytes(i: &[u8]) -> PResult<'_, &[u8]> {
    let (i, len) = be_u32(i)?;
    if len as usize > i.len() {
        return fail(DecodeErrorKind::BadLength(len.into()));
    }
    take(len)(i)
}

/// `field-table = long-uint *field-value-pair` at nesting level `depth` (the
/// outermost table is level 1): the body, checked.
#[inline]
pub(crate) fn table_body(max_depth: usize, depth: usize, i: &[u8]) -> PResult<'_, &[u8]> {
    let (rest, body) = long_bytes(i)?;
    validate_table_body(max_depth, depth, body)?;
    Ok((rest, body))
}

/// Checks the body of a table (what follows its length prefix) at nesting
/// level `depth`: every `field-value-pair = field-name field-value`, its
/// key, type code and length, and the nesting limit.
#[inline]
fn validate_table_body(max_depth: usize, depth: usize, mut body: &[u8]) -> PResult<'_, ()> {
    while !body.is_empty() {
        let (i, _key_len) = short_string_len(body)?;
        body = skip_value(max_depth, depth, i)?.0;
    }
    Ok((body, ()))
}

/// Checks the body of an array at nesting level `depth`.
fn validate_array_body(max_depth: usize, depth: usize, mut body: &[u8]) -> PResult<'_, ()> {
    while !body.is_empty() {
        body = skip_value(max_depth, depth, body)?.0;
    }
    Ok((body, ()))
}

/// Checks one `field-value = type-code value` held by a container at level
/// `depth`. The scalar cases are inlined into the loops above; tables and
/// arrays, which recurse, are not.
#[inline(always)]
fn skip_value(max_depth: usize, depth: usize, i: &[u8]) -> PResult<'_, ()> {
    let (i, code) = be_u8(i)?;
    let width: u8 = match code {
        b't' | b'b' | b'B' => 1,
        b's' | b'u' => 2,
        b'I' | b'i' | b'f' => 4,
        b'D' => 5,
        b'l' | b'L' | b'd' | b'T' => 8,
        b'V' => 0,
        b'S' | b'x' => return long_bytes(i).map(|(rest, _)| (rest, ())),
        b'F' | b'A' => return skip_container(max_depth, depth, code, i),
        other => return fail(DecodeErrorKind::UnknownFieldType(other)),
    };
    take(width)(i).map(|(rest, _)| (rest, ()))
}

/// Checks a nested table (`F`) or array (`A`) held at level `depth`.
#[inline(never)]
fn skip_container(max_depth: usize, depth: usize, code: u8, i: &[u8]) -> PResult<'_, ()> {
    let depth = nested(max_depth, depth).or_else(fail)?;
    if code == b'F' {
        return table_body(max_depth, depth, i).map(|(rest, _)| (rest, ()));
    }
    let (rest, body) = long_bytes(i)?;
    validate_array_body(max_depth, depth, body)?;
    Ok((rest, ()))
}

/// The level of a table or array nested at `depth`, or an error past the limit.
#[inline]
fn nested(max_depth: usize, depth: usize) -> Result<usize, DecodeErrorKind> {
    let next = depth + 1;
    if next > max_depth {
        Err(DecodeErrorKind::NestingTooDeep(max_depth))
    } else {
        Ok(next)
    }
}

// ---------------------------------------------------------------------------
// Materialization: building values from bytes that passed validation.
// ---------------------------------------------------------------------------

/// Reads values out of validated bytes with nom's complete parsers. Long values are zero-copy slices of
/// `shared` when the bytes are that buffer, else copies. Nested tables stay
/// lazy; arrays are built, so recursion only follows arrays, as deep as
/// validation allowed. Should the bytes somehow not be what validation
/// accepted, reading stops early instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    shared: Option<&'a Bytes>,
    at: usize,
    end: usize,
}

/// Runs a nom parser on the unread bytes of a [`Reader`].
macro_rules! read {
    ($reader:ident, $parser:expr) => {{
        let unread = $reader.rest();
        $reader.consumed(unread, $parser(unread))
    }};
}

impl<'a> Reader<'a> {
    /// The unread bytes of the container, never those after it.
    #[inline(always)]
    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.at..self.end).unwrap_or_default()
    }

    /// Moves past what a nom parser consumed of `unread` (what
    /// [`Reader::rest`] was) and returns its value. Parsers are called
    /// directly, not passed in, so that they inline.
    #[inline(always)]
    fn consumed<T>(&mut self, unread: &'a [u8], result: PResult<'a, T>) -> Option<T> {
        let (after, value) = result.ok()?;
        self.at += unread.len() - after.len();
        Some(value)
    }

    /// `bytes` (taken from this reader) as `Bytes`: shared or copied.
    fn to_bytes(&self, bytes: &[u8]) -> Bytes {
        match self.shared {
            Some(shared) => shared.slice_ref(bytes),
            None => Bytes::copy_from_slice(bytes),
        }
    }

    fn value(&mut self) -> Option<FieldValue> {
        Some(match read!(self, be_u8)? {
            b't' => FieldValue::Bool(read!(self, be_u8)? != 0),
            b'b' => FieldValue::I8(read!(self, be_i8)?),
            b'B' => FieldValue::U8(read!(self, be_u8)?),
            b's' => FieldValue::I16(read!(self, be_i16)?),
            b'u' => FieldValue::U16(read!(self, be_u16)?),
            b'I' => FieldValue::I32(read!(self, be_i32)?),
            b'i' => FieldValue::U32(read!(self, be_u32)?),
            b'l' => FieldValue::I64(read!(self, be_i64)?),
            b'L' => FieldValue::I64L(read!(self, be_i64)?),
            b'f' => FieldValue::F32(read!(self, be_f32)?),
            b'd' => FieldValue::F64(read!(self, be_f64)?),
            b'D' => {
                let scale = read!(self, be_u8)?;
                let value = read!(self, be_u32)?;
                FieldValue::Decimal(Decimal { scale, value })
            }
            b'S' => {
                let start = self.at + 4;
                let len = read!(self, long_bytes)?.len();
                // The window may run past the value into the rest of the buffer.
                let tail = self.bytes.get(start..).unwrap_or_default();
                FieldValue::LongString(LongString::from_prefix(tail, len, self.shared))
            }
            b'x' => {
                let bytes = read!(self, long_bytes)?;
                FieldValue::ByteArray(self.to_bytes(bytes))
            }
            b'T' => FieldValue::Timestamp(read!(self, be_u64)?),
            b'V' => FieldValue::Void,
            b'F' => {
                let bytes = read!(self, long_bytes)?;
                FieldValue::Table(FieldTable::from_validated(bytes, self.shared))
            }
            b'A' => {
                let start = self.at + 4;
                let bytes = read!(self, long_bytes)?;
                let mut inner = Reader {
                    bytes: self.bytes,
                    shared: self.shared,
                    at: start,
                    end: start + bytes.len(),
                };
                let mut values = Vec::new();
                while inner.at < inner.end {
                    values.push(inner.value()?);
                }
                FieldValue::Array(super::FieldArray(values))
            }
            _ => return None,
        })
    }
}

/// The entries of a validated table body.
fn materialize_table(raw: &RawBody) -> Vec<Entry> {
    let (bytes, end) = match raw {
        // The whole inline buffer: the zeros after the body let strings
        // near its end be copied as whole windows too.
        RawBody::Inline { len, buf } => (&buf[..], usize::from(*len)),
        RawBody::Shared(bytes) => (&bytes[..], bytes.len()),
    };
    let mut reader = Reader {
        bytes,
        shared: raw.shared(),
        at: 0,
        end,
    };
    // A pair takes at least 3 bytes and usually far more; a modest guess
    // avoids most regrowth without trusting the peer for the allocation.
    let mut entries = Vec::with_capacity((end / 12).clamp(1, 16));
    while reader.at < reader.end {
        let start = reader.at + 1;
        let Some(key_len) = read!(reader, short_string_len) else {
            break;
        };
        // The window may run past the key into the rest of the buffer.
        let key = ShortString::from_prefix(reader.bytes.get(start..).unwrap_or_default(), key_len);
        let Some(value) = reader.value() else { break };
        entries.push((key, value));
    }
    entries
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
