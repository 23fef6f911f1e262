//! SASL responses that are AMQP encodings: AMQPLAIN, RabbitMQ's mechanism
//! whose `connection.start-ok` response is the body of a field table (its
//! entries, `LOGIN` and `PASSWORD`) without the table's 32-bit length
//! prefix. A client encodes one, a server decodes it.
//!
//! Must never panic on a response a client sends, and never log one: it
//! holds a password.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeErrorKind, EncodeError, Error};
use crate::types::FieldTable;

/// Appends the entries of `table` without the table's length prefix: an
/// AMQPLAIN response. On error nothing is appended.
///
/// ```
/// use acemq_codec::sasl::{decode_amqplain, encode_amqplain};
/// use acemq_codec::{FieldTable, FieldValue};
/// let mut credentials = FieldTable::new();
/// credentials.push("LOGIN", "guest");
/// credentials.push("PASSWORD", "guest");
/// let mut response = bytes::BytesMut::new();
/// encode_amqplain(&credentials, &mut response).unwrap();
/// let back = decode_amqplain(&response, 8).unwrap();
/// assert_eq!(back.get("LOGIN").and_then(FieldValue::as_str), Some("guest"));
/// ```
pub fn encode_amqplain(table: &FieldTable, dst: &mut BytesMut) -> Result<(), EncodeError> {
    let mut whole = BytesMut::new();
    table.encode(&mut whole)?;
    dst.put_slice(whole.get(4..).unwrap_or_default());
    Ok(())
}

/// Decodes an AMQPLAIN response: the entries of a field table without its
/// length prefix, which must fill `response` exactly, with tables and arrays
/// nested at most `max_depth` levels deep.
pub fn decode_amqplain(response: &[u8], max_depth: usize) -> Result<FieldTable, Error> {
    let len = u32::try_from(response.len()).map_err(|_| Error::Malformed {
        context: "AMQPLAIN response",
        kind: DecodeErrorKind::BadLength(response.len() as u64),
    })?;
    let mut table = BytesMut::with_capacity(response.len() + 4);
    table.put_u32(len);
    table.put_slice(response);
    FieldTable::decode(&Bytes::from(table), max_depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FieldValue;

    fn credentials() -> FieldTable {
        let mut table = FieldTable::new();
        table.push("LOGIN", "guest");
        table.push("PASSWORD", FieldValue::from("s3cret"));
        table
    }

    #[test]
    fn a_response_is_a_table_without_its_length_prefix() {
        let mut whole = BytesMut::new();
        credentials().encode(&mut whole).unwrap();
        let mut response = BytesMut::new();
        encode_amqplain(&credentials(), &mut response).unwrap();
        assert_eq!(&response[..], &whole[4..]);
        assert_eq!(decode_amqplain(&response, 8).unwrap(), credentials());
    }

    #[test]
    fn an_empty_response_is_an_empty_table() {
        assert!(decode_amqplain(&[], 8).unwrap().is_empty());
    }

    #[test]
    fn a_response_that_is_not_table_entries_is_an_error() {
        // A key length running past the end.
        assert!(decode_amqplain(&[9, b'L'], 8).is_err());
        // An unknown field type.
        assert!(decode_amqplain(&[1, b'k', b'?'], 8).is_err());
    }

    #[test]
    fn nesting_is_bounded() {
        let mut deep = FieldValue::Void;
        for _ in 0..4 {
            deep = FieldValue::Array(vec![deep].into_iter().collect());
        }
        let mut table = FieldTable::new();
        table.push("deep", deep);
        let mut response = BytesMut::new();
        encode_amqplain(&table, &mut response).unwrap();
        assert!(decode_amqplain(&response, 8).is_ok());
        assert!(decode_amqplain(&response, 3).is_err());
    }
}
