//! Field values, field tables and field arrays: the tree of values that
//! tables and arrays carry, with RabbitMQ's type codes.
//!
//! They share one module because they are one recursive type: a table holds
//! values, and a value may be a table or an array. Their encoders, and the
//! building of entries from bytes, call each other the same way, so split
//! into two modules each would import the other.
//!
//! A table is a list of (key, value) pairs in wire order, duplicates kept, so
//! decoding then encoding gives back the same bytes; lookups take the first
//! match. Both tables and arrays carry a 32-bit byte-length prefix.
//!
//! A decoded table is validated but not materialized: decoding walks its
//! bytes once (in `validate.rs`), without allocating, and enforces every rule
//! (nesting limit, known type codes, lengths that fit their container), so a
//! bad table is still an error at decode time. The table then keeps its wire
//! bytes (a copy in its own allocation if small, else a zero-copy slice of
//! the frame when there is one to share) and builds its entries the first
//! time they are asked for. Encoding a table that was never changed copies
//! its bytes. This module must never build entries from bytes that
//! validation has not accepted, and never be imported by `validate.rs` or
//! `strings.rs`, which sit below it.
//!
//! RabbitMQ's codes differ from the 0-9-1 specification's table (`s` is a
//! signed 16-bit integer, not a short string; `u`, `i`, `U` and `L` are not
//! the spec's). This module follows RabbitMQ, which every client that talks
//! to it follows too. `L` is read as a signed 64-bit integer, as RabbitMQ does,
//! and kept apart from `l` so that decoding then encoding gives back the same
//! bytes. Any other code is a decode error.

use std::fmt;
use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};

use nom::number::complete::be_u8;

use super::strings::{encode_long_bytes, LongString, ShortString};
use super::validate::{long_bytes, short_string_len, table_body};
use crate::error::{DecodeErrorKind, EncodeError, Error};
use crate::wire::num::{be_f32, be_f64, be_i16, be_i32, be_i64, be_i8, be_u16, be_u32, be_u64};
use crate::wire::{kind_of, PResult};

/// One table entry.
type Entry = (ShortString, FieldValue);

/// An AMQP field table: ordered (key, value) pairs.
///
/// A table decoded from the wire keeps the wire bytes and builds its entries
/// on first access (thread-safe, once); a table built or changed through
/// `insert`, `push` or `remove` holds only entries. Equality compares
/// entries, never bytes.
#[derive(Clone)]
pub struct FieldTable(TableStorage);

/// The two states of a table. Kept to the size of a `Vec` so that methods
/// and field values holding a table do not grow.
#[derive(Clone)]
enum TableStorage {
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
        FieldTable(TableStorage::Owned(Vec::new()))
    }

    /// Decodes a table (its 32-bit length prefix included) that must fill
    /// `input` exactly, allowing `max_depth` levels of tables and arrays.
    ///
    /// Every error is found here, but the entries are built only when first
    /// asked for: until then the table keeps its bytes (a copy if small, a
    /// zero-copy slice of `input` if not).
    ///
    /// ```
    /// use acemq_codec::{FieldTable, FieldValue};
    /// let mut table = FieldTable::new();
    /// table.insert("x-attempt", FieldValue::I32(2));
    /// let mut buf = bytes::BytesMut::new();
    /// table.encode(&mut buf).unwrap();
    /// let back = FieldTable::decode(&buf.freeze(), 64).unwrap();
    /// assert_eq!(back.get("x-attempt").and_then(FieldValue::as_i64), Some(2));
    /// ```
    pub fn decode(input: &Bytes, max_depth: usize) -> Result<FieldTable, Error> {
        let malformed = |kind| Error::Malformed {
            context: "field table",
            kind,
        };
        if max_depth == 0 {
            return Err(malformed(DecodeErrorKind::NestingTooDeep(0)));
        }
        let (rest, body) = table_body(max_depth, 1, input).map_err(|err| malformed(kind_of(err)))?;
        if !rest.is_empty() {
            return Err(malformed(DecodeErrorKind::TrailingBytes(rest.len())));
        }
        Ok(FieldTable::from_validated(body, Some(input)))
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
        FieldTable(TableStorage::Wire(wire))
    }

    /// The entries, built from the wire bytes on first access.
    #[inline]
    fn built(&self) -> &[Entry] {
        match &self.0 {
            TableStorage::Owned(entries) => entries,
            TableStorage::Wire(wire) => wire.entries.get_or_init(|| materialize_table(&wire.raw)),
        }
    }

    /// The entries, to change: from now on the table holds its own.
    fn entries_mut(&mut self) -> &mut Vec<Entry> {
        if let TableStorage::Wire(wire) = &mut self.0 {
            let entries = match wire.entries.take() {
                Some(entries) => entries,
                None => materialize_table(&wire.raw),
            };
            self.0 = TableStorage::Owned(entries);
        }
        match &mut self.0 {
            TableStorage::Owned(entries) => entries,
            // Just turned into `Owned` above.
            TableStorage::Wire(_) => unreachable!("a table being changed owns its entries"),
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
            TableStorage::Owned(entries) => entries.is_empty(),
            // A validated body that is not empty holds at least one entry.
            TableStorage::Wire(_) => false,
        }
    }

    /// Appends the 32-bit length and the entries. A table as decoded is
    /// written back byte for byte.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let entries = match &self.0 {
            TableStorage::Owned(entries) => entries,
            TableStorage::Wire(wire) => return encode_long_bytes(wire.raw.as_slice(), dst),
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
        FieldTable(TableStorage::Owned(
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

/// A decimal: `value / 10^scale`, carried as a scale octet and a 32-bit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Decimal {
    /// The number of decimal digits after the point.
    pub scale: u8,
    /// The unscaled value.
    pub value: u32,
}

/// A value in a field table or array, tagged with RabbitMQ's type code.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
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
    /// `I`: a signed 32-bit integer, what Java, .NET, Python and Go write for a small int.
    I32(i32),
    /// `i`: an unsigned 32-bit integer.
    U32(u32),
    /// `l`: a signed 64-bit integer.
    I64(i64),
    /// `L`: read as a signed 64-bit integer as RabbitMQ does; kept apart from
    /// `l` so re-encoding is byte-identical.
    I64L(i64),
    /// `f`: a 32-bit float.
    F32(f32),
    /// `d`: a 64-bit float.
    F64(f64),
    /// `D`: a decimal.
    Decimal(Decimal),
    /// `S`: a long string.
    LongString(LongString),
    /// `A`: an array of values.
    Array(FieldArray),
    /// `T`: a timestamp, seconds since the Unix epoch.
    Timestamp(u64),
    /// `F`: a nested table.
    Table(FieldTable),
    /// `V`: no value.
    Void,
    /// `x`: a byte array.
    ByteArray(Bytes),
}

impl FieldValue {
    /// The type code on the wire.
    pub fn type_code(&self) -> u8 {
        match self {
            FieldValue::Bool(_) => b't',
            FieldValue::I8(_) => b'b',
            FieldValue::U8(_) => b'B',
            FieldValue::I16(_) => b's',
            FieldValue::U16(_) => b'u',
            FieldValue::I32(_) => b'I',
            FieldValue::U32(_) => b'i',
            FieldValue::I64(_) => b'l',
            FieldValue::I64L(_) => b'L',
            FieldValue::F32(_) => b'f',
            FieldValue::F64(_) => b'd',
            FieldValue::Decimal(_) => b'D',
            FieldValue::LongString(_) => b'S',
            FieldValue::Array(_) => b'A',
            FieldValue::Timestamp(_) => b'T',
            FieldValue::Table(_) => b'F',
            FieldValue::Void => b'V',
            FieldValue::ByteArray(_) => b'x',
        }
    }

    /// The value as an `i64` if it is an integer of any width (including a
    /// timestamp); readers of integers accept every width, as RabbitMQ does
    /// when it compares arguments.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            FieldValue::I8(v) => Some(v.into()),
            FieldValue::U8(v) => Some(v.into()),
            FieldValue::I16(v) => Some(v.into()),
            FieldValue::U16(v) => Some(v.into()),
            FieldValue::I32(v) => Some(v.into()),
            FieldValue::U32(v) => Some(v.into()),
            FieldValue::I64(v) | FieldValue::I64L(v) => Some(v),
            FieldValue::Timestamp(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as text if it is a long string holding UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            FieldValue::LongString(s) => s.as_str(),
            _ => None,
        }
    }

    /// The value as a table, if it is one.
    pub fn as_table(&self) -> Option<&FieldTable> {
        match self {
            FieldValue::Table(t) => Some(t),
            _ => None,
        }
    }

    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&FieldArray> {
        match self {
            FieldValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            FieldValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// Appends the type code and the value.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        // A scalar and its code go out as one fixed-size copy.
        fn put<const N: usize>(dst: &mut BytesMut, code: u8, value: [u8; N]) {
            let mut out = [0; 9];
            out[0] = code;
            out[1..=N].copy_from_slice(&value);
            dst.put_slice(&out[..=N]);
        }
        let code = self.type_code();
        match self {
            FieldValue::Bool(v) => put(dst, code, [u8::from(*v)]),
            FieldValue::I8(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::U8(v) => put(dst, code, [*v]),
            FieldValue::I16(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::U16(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::I32(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::U32(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::I64(v) | FieldValue::I64L(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::F32(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::F64(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::Decimal(d) => {
                let [a, b, c, e] = d.value.to_be_bytes();
                put(dst, code, [d.scale, a, b, c, e]);
            }
            FieldValue::LongString(s) => s.encode_after(dst, Some(code))?,
            FieldValue::Array(a) => {
                dst.put_u8(code);
                a.encode(dst)?
            }
            FieldValue::Timestamp(v) => put(dst, code, v.to_be_bytes()),
            FieldValue::Table(t) => {
                dst.put_u8(code);
                t.encode(dst)?
            }
            FieldValue::Void => dst.put_u8(code),
            FieldValue::ByteArray(b) => {
                dst.put_u8(code);
                encode_long_bytes(b, dst)?
            }
        }
        Ok(())
    }
}

impl From<bool> for FieldValue {
    fn from(v: bool) -> Self {
        FieldValue::Bool(v)
    }
}

impl From<i32> for FieldValue {
    fn from(v: i32) -> Self {
        FieldValue::I32(v)
    }
}

impl From<i64> for FieldValue {
    fn from(v: i64) -> Self {
        FieldValue::I64(v)
    }
}

impl From<&str> for FieldValue {
    fn from(v: &str) -> Self {
        FieldValue::LongString(v.into())
    }
}

impl From<String> for FieldValue {
    fn from(v: String) -> Self {
        FieldValue::LongString(v.into())
    }
}

impl From<LongString> for FieldValue {
    fn from(v: LongString) -> Self {
        FieldValue::LongString(v)
    }
}

impl From<FieldTable> for FieldValue {
    fn from(v: FieldTable) -> Self {
        FieldValue::Table(v)
    }
}

impl From<FieldArray> for FieldValue {
    fn from(v: FieldArray) -> Self {
        FieldValue::Array(v)
    }
}

/// Writes a 32-bit length placeholder, the body, then patches the length.
// Each instance has one caller, but it sits in the encoders' recursion
// (value, table, value), which LLVM does not inline into by itself now that
// they share a module: out of line, every table encode pays for a call.
#[inline(always)]
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
                FieldValue::Array(FieldArray(values))
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

#[path = "table_view.rs"]
mod view;
pub use view::{FieldArrayIter, FieldArrayRef, FieldTableIter, FieldTableRef, FieldValueRef};

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
