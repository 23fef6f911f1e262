//! Field tables and field arrays.
//!
//! A table is a list of (key, value) pairs in wire order, duplicates kept, so
//! decoding then encoding gives back the same bytes; lookups take the first
//! match. Both carry a 32-bit byte-length prefix. Parsing never recurses past
//! the nesting limit in [`crate::parse::Ctx`].

use bytes::{BufMut, BytesMut};
use nom::bytes::complete::take;
use nom::number::complete::be_u32;

use super::value::field_value;
use super::{FieldValue, ShortString};
use crate::error::{DecodeErrorKind, EncodeError};
use crate::parse::{fail, Ctx, PResult};

/// An AMQP field table: ordered (key, value) pairs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldTable {
    entries: Vec<(ShortString, FieldValue)>,
}

impl FieldTable {
    /// An empty table.
    pub const fn new() -> Self {
        FieldTable { entries: Vec::new() }
    }

    /// The value of the first entry named `key`.
    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.entries
            .iter()
            .find(|(k, _)| k.as_bytes() == key.as_bytes())
            .map(|(_, v)| v)
    }

    /// Sets `key` to `value`: replaces the first entry with that key, or
    /// appends one. Returns the value replaced.
    pub fn insert(&mut self, key: impl Into<ShortString>, value: impl Into<FieldValue>) -> Option<FieldValue> {
        let key = key.into();
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => Some(std::mem::replace(slot, value)),
            None => {
                self.entries.push((key, value));
                None
            }
        }
    }

    /// Appends an entry, even if the key is already present.
    pub fn push(&mut self, key: impl Into<ShortString>, value: impl Into<FieldValue>) {
        self.entries.push((key.into(), value.into()));
    }

    /// Removes every entry named `key`; returns the first value removed.
    pub fn remove(&mut self, key: &str) -> Option<FieldValue> {
        let at = self.entries.iter().position(|(k, _)| k.as_bytes() == key.as_bytes())?;
        let (_, first) = self.entries.remove(at);
        self.entries.retain(|(k, _)| k.as_bytes() != key.as_bytes());
        Some(first)
    }

    /// Whether an entry named `key` exists.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The entries in wire order.
    pub fn iter(&self) -> impl Iterator<Item = (&ShortString, &FieldValue)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The entries in wire order.
    pub fn entries(&self) -> &[(ShortString, FieldValue)] {
        &self.entries
    }

    /// The number of entries (duplicates counted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends the 32-bit length and the entries.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        with_length_prefix(dst, |dst| {
            for (key, value) in &self.entries {
                key.encode(dst)?;
                value.encode(dst)?;
            }
            Ok(())
        })
    }
}

impl<K: Into<ShortString>, V: Into<FieldValue>> FromIterator<(K, V)> for FieldTable {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        FieldTable {
            entries: iter.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }
}

impl IntoIterator for FieldTable {
    type Item = (ShortString, FieldValue);
    type IntoIter = std::vec::IntoIter<(ShortString, FieldValue)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
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

/// Takes a 32-bit length and that many bytes; a length past the end of the
/// container is `BadLength`, not `Truncated`, because it is the length that lies.
fn length_prefixed(i: &[u8]) -> PResult<'_, &[u8]> {
    let (i, len) = be_u32(i)?;
    if len as usize > i.len() {
        return fail(DecodeErrorKind::BadLength(len.into()));
    }
    take(len)(i)
}

/// `field-table = long-uint *field-value-pair`, at nesting level `depth`.
pub(crate) fn field_table(ctx: Ctx, depth: usize, i: &[u8]) -> PResult<'_, FieldTable> {
    let (rest, mut body) = length_prefixed(i)?;
    // A pair takes at least 3 bytes (empty key, type code, one value byte) and
    // usually far more; a modest guess avoids most regrowth without trusting
    // the peer's length for the allocation size.
    let mut entries = Vec::with_capacity(capacity_guess(body.len(), 12));
    while !body.is_empty() {
        let (i, key) = super::short_string_raw(body)?;
        let (i, value) = field_value(ctx, depth, i)?;
        entries.push((ShortString::from_slice(key), value));
        body = i;
    }
    Ok((rest, FieldTable { entries }))
}

/// `field-array = long-int *field-value`, at nesting level `depth`.
pub(crate) fn field_array(ctx: Ctx, depth: usize, i: &[u8]) -> PResult<'_, FieldArray> {
    let (rest, mut body) = length_prefixed(i)?;
    let mut values = Vec::with_capacity(capacity_guess(body.len(), 8));
    while !body.is_empty() {
        let (i, value) = field_value(ctx, depth, body)?;
        values.push(value);
        body = i;
    }
    Ok((rest, FieldArray(values)))
}

/// How many items to allocate for a container of `len` bytes whose items
/// take about `item_size` bytes: never more than 16 on the peer's word.
fn capacity_guess(len: usize, item_size: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len / item_size).clamp(1, 16)
    }
}
