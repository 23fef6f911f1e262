//! Content header frames: class, weight, body size and the property list.
//!
//! Must never turn a bad property list into a stream error: the envelope has
//! already delimited the frame, so a property list that breaks a limit is
//! reported as an [`UndecodableHeader`] with its raw bytes, and the connection
//! can carry on.

use crate::parse::num::{be_u16, be_u64};
use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeErrorKind, EncodeError, Error};
use crate::method::class;
use crate::parse::{kind_of, Ctx, PError};
use crate::properties::BasicProperties;
use crate::Frame;

/// A decoded content header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContentHeader {
    /// The class of the content-bearing method (60, basic).
    pub class_id: u16,
    /// Unused by AMQP 0-9-1; 0 on the wire, kept for byte-identical round trips.
    pub weight: u16,
    /// The total size of the body frames that follow.
    pub body_size: u64,
    /// The message properties, boxed: a header moves through several hands
    /// on its way to the application, and a pointer moves cheaper than the
    /// few hundred bytes of the properties.
    pub properties: Box<BasicProperties>,
}

impl ContentHeader {
    /// A basic-class header for a body of `body_size` bytes.
    pub fn basic(body_size: u64, properties: BasicProperties) -> Self {
        ContentHeader {
            class_id: class::BASIC,
            weight: 0,
            body_size,
            properties: Box::new(properties),
        }
    }

    /// Appends the header payload (without the frame envelope).
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        dst.put_u16(self.class_id);
        dst.put_u16(self.weight);
        dst.put_u64(self.body_size);
        self.properties.encode(dst)
    }
}

/// A content header whose envelope and sizes are sound but whose property
/// list could not be decoded: too deeply nested, an unknown field type, a
/// length that lies, undefined flag bits. The message it belongs to can be
/// set aside; the connection is fine.
#[derive(Debug, Clone, PartialEq)]
pub struct UndecodableHeader {
    /// The class id from the header.
    pub class_id: u16,
    /// The weight from the header.
    pub weight: u16,
    /// The body size from the header; the body frames still follow.
    pub body_size: u64,
    /// The property flags and list exactly as received.
    pub raw_properties: Bytes,
    /// What was wrong with them.
    pub error: DecodeErrorKind,
}

impl UndecodableHeader {
    /// Appends the header payload exactly as it was received.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.put_u16(self.class_id);
        dst.put_u16(self.weight);
        dst.put_u64(self.body_size);
        dst.put_slice(&self.raw_properties);
    }
}

/// `content-header = class-id weight body-size property-flags property-list`,
/// as the frame it makes on `channel`: [`Frame::Header`], or
/// [`Frame::UndecodableHeader`] when the properties cannot be decoded.
///
/// Only a payload too short for the fixed 12 bytes is a stream error.
/// `payload` lies within `source` when there is one: tables in the properties,
/// or the raw bytes of an undecodable header, are then zero-copy slices of it.
#[inline]
pub(crate) fn content_header(
    channel: u16,
    payload: &[u8],
    max_depth: usize,
    source: Option<&Bytes>,
) -> Result<Frame, Error> {
    let fixed = |i| -> nom::IResult<&[u8], (u16, u16, u64), PError> {
        let (i, class_id) = be_u16(i)?;
        let (i, weight) = be_u16(i)?;
        let (i, body_size) = be_u64(i)?;
        Ok((i, (class_id, weight, body_size)))
    };
    let (rest, (class_id, weight, body_size)) = fixed(payload).map_err(|err| Error::Malformed {
        context: "content header",
        kind: kind_of(err),
    })?;
    let error = if class_id == class::BASIC {
        let mut properties = Box::<BasicProperties>::default();
        match BasicProperties::decode_into(&mut properties, Ctx { max_depth }, rest, source) {
            Ok(()) => {
                return Ok(Frame::Header(
                    channel,
                    ContentHeader {
                        class_id,
                        weight,
                        body_size,
                        properties,
                    },
                ))
            }
            Err(error) => error,
        }
    } else {
        DecodeErrorKind::NoContentClass(class_id)
    };
    Ok(Frame::UndecodableHeader(
        channel,
        UndecodableHeader {
            class_id,
            weight,
            body_size,
            raw_properties: match source {
                Some(source) => source.slice_ref(rest),
                None => Bytes::copy_from_slice(rest),
            },
            error,
        },
    ))
}
