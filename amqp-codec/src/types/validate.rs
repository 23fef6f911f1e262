//! The wire grammar of strings, tables and arrays, checked over bytes:
//! lengths that fit their container, known type codes and the nesting limit,
//! in one pass with nom's complete parsers, allocating nothing.
//!
//! A table is validated here when it is decoded; `table.rs` then builds its
//! entries from the bytes this accepted, with the same length parsers, and
//! the argument reader uses them for strings and tables in methods. This
//! module must never build a value or allocate, and never import the value
//! types (`table.rs` imports it, so that would make a cycle): it knows bytes,
//! `crate::wire` and the error kinds, nothing else. Validation recurses
//! only as deep as the nesting limit allows.

use nom::bytes::complete::take;
use nom::number::complete::be_u8;

use crate::error::DecodeErrorKind;
use crate::wire::num::be_u32;
use crate::wire::{fail, PResult};

/// The default limit on how deep tables and arrays may nest inside each other.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// `short-string = OCTET *string-char`: the length, once nom has checked
/// the string lies within the input. Callers copy the string itself as a
/// fixed window (see `ShortString::set_prefix`), which nom cannot express.
#[inline(always)]
pub(crate) fn short_string_len(i: &[u8]) -> PResult<'_, usize> {
    let (i, len) = be_u8(i)?;
    let (i, _) = take(len)(i)?;
    Ok((i, usize::from(len)))
}

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
        body = field_value_pair(max_depth, depth, body)?.0;
    }
    Ok((body, ()))
}

/// `field-value-pair = field-name field-value` in a table at nesting level
/// `depth`: checked, as every pair of a table body is.
#[inline(always)]
pub(crate) fn field_value_pair(max_depth: usize, depth: usize, i: &[u8]) -> PResult<'_, ()> {
    let (i, _key_len) = short_string_len(i)?;
    skip_value(max_depth, depth, i)
}

/// A `field-value-pair` whose value carries a 32-bit length (`S`, `x`,
/// `F`, `A`), stepped over by that length without looking inside: how a
/// pair that failed [`field_value_pair`] is passed by when its length still
/// fits. A pair of any other type cannot be passed by (a scalar fails only
/// by running out of bytes, an unknown type code has no known width).
pub(crate) fn field_value_pair_by_length(i: &[u8]) -> PResult<'_, ()> {
    let (i, _key_len) = short_string_len(i)?;
    let (i, code) = be_u8(i)?;
    match code {
        b'S' | b'x' | b'F' | b'A' => long_bytes(i).map(|(rest, _)| (rest, ())),
        other => fail(DecodeErrorKind::UnknownFieldType(other)),
    }
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
