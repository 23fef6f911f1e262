//! # acemq-codec
//!
//! AMQP 0-9-1 as RabbitMQ speaks it, bytes to frames and back, in both
//! directions (a client or a broker can be written with it), plus the
//! protocol bookkeeping both sides need in [`track`].
//!
//! - Every frame kind and every method, including RabbitMQ's extensions
//!   (`confirm.select`, `basic.nack`, `exchange.bind`/`unbind`,
//!   `connection.blocked`/`unblocked`, `connection.update-secret`).
//! - Field values with RabbitMQ's type codes; tables keep wire order and
//!   duplicates, so decoding then encoding gives back the same bytes.
//! - Nesting of tables and arrays is bounded ([`DEFAULT_MAX_DEPTH`]): a deeper
//!   value is an error, never a stack overflow.
//! - The frame decoder refuses a frame above `frame_max` from its 7-byte
//!   frame header, before buffering it; bodies are zero-copy
//!   [`bytes::Bytes`].
//! - A content header's properties are checked in full when the frame is
//!   decoded and kept as a zero-copy slice of it ([`Properties`]); their
//!   fields are built the first time one is read, and unchanged properties
//!   encode as the bytes received. Decoding a delivery allocates nothing.
//!   [`Properties::view`] (and [`FieldTable::view`]) read every property and
//!   header straight from those bytes instead, building and allocating
//!   nothing: the cheapest way to read them once ([`BasicPropertiesRef`],
//!   [`FieldTableRef`], [`FieldValueRef`]).
//! - A content header whose properties cannot be decoded is
//!   [`Frame::UndecodableHeader`], not a stream error: the one message can be
//!   set aside and the connection lives on, with every property that can
//!   still be read ([`UndecodableHeader::salvage`]).
//! - [`PublishEncoder`] encodes `basic.publish` messages byte for byte as
//!   [`encode_content`] does, copying the previous message's method and
//!   header frames when the next one repeats them.
//! - Nothing panics on any input.
//! - Parsing is hand-written nom (streaming for the 7-byte frame header,
//!   `complete` for payloads); nom never appears in a public signature.
//!
//! ```
//! use acemq_codec::{encode_method, BasicDeliver, Frame, FrameDecoder, Method};
//! use bytes::BytesMut;
//!
//! // Encode a basic.deliver on channel 1 ...
//! let deliver = BasicDeliver {
//!     consumer_tag: "ctag-1".into(),
//!     delivery_tag: 42,
//!     redelivered: true,
//!     exchange: "orders".into(),
//!     routing_key: "order.placed".into(),
//! };
//! let mut wire = BytesMut::new();
//! encode_method(1, &deliver.clone().into(), &mut wire).unwrap();
//!
//! // ... and decode it back from a read buffer, in place.
//! let decoder = FrameDecoder::new(131_072);
//! let frame = decoder.decode(&mut wire).unwrap().expect("a whole frame");
//! assert_eq!(frame, Frame::Method(1, Method::BasicDeliver(deliver)));
//! assert!(wire.is_empty());
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
mod arbitrary;
mod error;
mod frame;
#[cfg(any(fuzzing, test))]
pub mod fuzzing;
mod method;
mod parse;
mod properties;
mod reply_code;
#[cfg(test)]
mod roundtrip_tests;
mod salvage;
pub mod sasl;
pub mod track;
mod types;
mod wire;

pub use error::{DecodeErrorKind, EncodeError, Error};
pub use frame::{
    decode_frame, encode_body, encode_content, encode_content_raw, encode_delivery, encode_method, AckFrame,
    ContentHeader, DeliverRef, Frame, FrameDecoder, PropertiesRef, PublishEncoder, UndecodableHeader,
    DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE,
    FRAME_OVERHEAD, PROTOCOL_HEADER,
};
pub use method::*;
pub use properties::{BasicProperties, BasicPropertiesRef, Properties, SalvagedProperties};
pub use reply_code::{ErrorScope, ReplyCode};
pub use types::{
    Decimal, FieldArray, FieldArrayIter, FieldArrayRef, FieldTable, FieldTableIter, FieldTableRef, FieldValue,
    FieldValueRef, LongString, ShortString, DEFAULT_MAX_DEPTH,
};

/// Checks the 8 bytes a client sends first. `Ok(false)` means fewer than 8
/// bytes have arrived; `Ok(true)` that they are `AMQP 0 0 9 1`. A server that
/// gets an error should answer with [`PROTOCOL_HEADER`] and close.
pub fn check_protocol_header(buf: &[u8]) -> Result<bool, Error> {
    let Some(first) = buf.get(..8) else {
        return Ok(false);
    };
    if first == PROTOCOL_HEADER {
        Ok(true)
    } else {
        let mut found = [0; 8];
        found.copy_from_slice(first);
        Err(Error::BadProtocolHeader { found })
    }
}
