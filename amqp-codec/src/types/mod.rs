//! AMQP data types: short and long strings, field values, tables, arrays and
//! decimals, with RabbitMQ's type codes.

mod strings;
mod table;
mod value;

use bytes::Bytes;
use nom::bytes::complete::take;
use nom::number::complete::be_u8;

pub use strings::{LongString, ShortString};
pub use table::{FieldArray, FieldTable};
pub use value::{Decimal, FieldValue};

pub(crate) use table::{long_bytes, table_body};

use crate::error::{DecodeErrorKind, Error};
use crate::parse::{kind_of, PResult};

/// `short-string = OCTET *string-char`: the length, once nom has checked
/// the string lies within the input. Callers copy the string itself as a
/// fixed window (see `ShortString::set_prefix`), which nom cannot express.
#[inline(always)]
pub(crate) fn short_string_len(i: &[u8]) -> PResult<'_, usize> {
    let (i, len) = be_u8(i)?;
    let (i, _) = take(len)(i)?;
    Ok((i, usize::from(len)))
}

/// The default limit on how deep tables and arrays may nest inside each other.
pub const DEFAULT_MAX_DEPTH: usize = 64;

impl FieldTable {
    /// Decodes a table (its 32-bit length prefix included) that must fill
    /// `input` exactly, allowing `max_depth` levels of tables and arrays.
    ///
    /// Every error is found here, but the entries are built only when first
    /// asked for: until then the table keeps its bytes (a copy if small, a
    /// zero-copy slice of `input` if not).
    ///
    /// ```
    /// use amqp_codec::{FieldTable, FieldValue};
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
}
