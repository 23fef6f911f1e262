//! Field values with RabbitMQ's type codes.
//!
//! RabbitMQ's codes differ from the 0-9-1 specification's table (`s` is a
//! signed 16-bit integer, not a short string; `u`, `i`, `U` and `L` are not
//! the spec's). This module follows RabbitMQ, which every client that talks
//! to it follows too. `L` is read as a signed 64-bit integer, as RabbitMQ does,
//! and kept apart from `l` so that decoding then encoding gives back the same
//! bytes. Any other code is a decode error.

use bytes::{BufMut, Bytes, BytesMut};

use super::strings::encode_long_bytes;
use super::{FieldArray, FieldTable, LongString};
use crate::error::EncodeError;

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
        dst.put_u8(self.type_code());
        match self {
            FieldValue::Bool(v) => dst.put_u8(u8::from(*v)),
            FieldValue::I8(v) => dst.put_i8(*v),
            FieldValue::U8(v) => dst.put_u8(*v),
            FieldValue::I16(v) => dst.put_i16(*v),
            FieldValue::U16(v) => dst.put_u16(*v),
            FieldValue::I32(v) => dst.put_i32(*v),
            FieldValue::U32(v) => dst.put_u32(*v),
            FieldValue::I64(v) | FieldValue::I64L(v) => dst.put_i64(*v),
            FieldValue::F32(v) => dst.put_f32(*v),
            FieldValue::F64(v) => dst.put_f64(*v),
            FieldValue::Decimal(d) => {
                dst.put_u8(d.scale);
                dst.put_u32(d.value);
            }
            FieldValue::LongString(s) => s.encode(dst)?,
            FieldValue::Array(a) => a.encode(dst)?,
            FieldValue::Timestamp(v) => dst.put_u64(*v),
            FieldValue::Table(t) => t.encode(dst)?,
            FieldValue::Void => {}
            FieldValue::ByteArray(b) => encode_long_bytes(b, dst)?,
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
