//! AMQP data types: short and long strings, field values, tables, arrays and
//! decimals, with RabbitMQ's type codes.
//!
//! Layers, each importing only those below it: `strings` (byte strings),
//! `validate` (the wire grammar checked over bytes, on `crate::wire`), and
//! `table` (the recursive tree of values, tables and arrays). This file only
//! declares and re-exports them; none of them may import `crate::parse`, which
//! reads method arguments with these types and so sits above them.

mod strings;
mod table;
mod validate;

pub(crate) use strings::same_bytes;
pub use strings::{LongString, ShortString};
pub use table::{
    Decimal, FieldArray, FieldArrayIter, FieldArrayRef, FieldTable, FieldTableIter, FieldTableRef, FieldValue,
    FieldValueRef,
};
pub use validate::DEFAULT_MAX_DEPTH;

pub(crate) use validate::{field_value_pair, field_value_pair_by_length, long_bytes, short_string_len, table_body};
