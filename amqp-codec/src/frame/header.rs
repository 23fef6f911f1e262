//! Content header frames: class, weight, body size and the property list.
//!
//! Must never turn a bad property list into a stream error: the frame decoder
//! has already delimited the frame, so a property list that breaks a limit is
//! reported as an [`UndecodableHeader`] with its raw bytes, and the connection
//! can carry on.

use crate::parse::num::{be_u16, be_u64};
use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeErrorKind, EncodeError, Error};
use crate::method::class;
use crate::parse::{kind_of, Ctx, PError};
use crate::properties::{self, BasicProperties, Properties, SalvagedProperties};
use crate::types::DEFAULT_MAX_DEPTH;

/// A decoded content header.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContentHeader {
    /// The class of the content-bearing method (60, basic).
    pub class_id: u16,
    /// Unused by AMQP 0-9-1; 0 on the wire, kept for byte-identical round trips.
    pub weight: u16,
    /// The total size of the body frames that follow.
    pub body_size: u64,
    /// The message properties: validated, and built on first access when
    /// decoded (see [`Properties`]).
    pub properties: Properties,
}

impl ContentHeader {
    /// A basic-class header for a body of `body_size` bytes.
    pub fn basic(body_size: u64, properties: impl Into<Properties>) -> Self {
        ContentHeader {
            class_id: class::BASIC,
            weight: 0,
            body_size,
            properties: properties.into(),
        }
    }

    /// Appends the header payload (without the frame header and end byte).
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        dst.put_u16(self.class_id);
        dst.put_u16(self.weight);
        dst.put_u64(self.body_size);
        self.properties.encode(dst)
    }
}

/// A content header whose frame and sizes are sound but whose property
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

    /// Every property that can still be read from
    /// [`UndecodableHeader::raw_properties`], and the names of those that
    /// cannot (see [`BasicProperties::salvage`]), with the default nesting
    /// limit ([`DEFAULT_MAX_DEPTH`], as [`crate::FrameDecoder::new`]).
    /// Tables are zero-copy slices of the raw bytes where large.
    ///
    /// A header of another class than basic salvages nothing: `lost` is
    /// `["property-flags"]`.
    ///
    /// ```
    /// use acemq_codec::{Frame, FrameDecoder};
    /// // basic (60), a 0-byte body, flags for headers and message-id; the
    /// // headers table holds one entry of type 'Z', which RabbitMQ does not
    /// // define.
    /// let mut payload = vec![0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x20, 0x80];
    /// payload.extend_from_slice(&[0, 0, 0, 3, 1, b'k', b'Z', 3, b'm', b'-', b'1']);
    /// let mut wire = bytes::BytesMut::from(&[2, 0, 1][..]);
    /// wire.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    /// wire.extend_from_slice(&payload);
    /// wire.extend_from_slice(&[0xCE]);
    ///
    /// let Some(Frame::UndecodableHeader(1, header)) = FrameDecoder::new(4096).decode(&mut wire).unwrap() else {
    ///     panic!("the 'Z' makes the header undecodable")
    /// };
    /// let salvaged = header.salvage();
    /// assert_eq!(salvaged.properties.message_id.as_ref().unwrap().as_bytes(), b"m-1");
    /// assert_eq!(salvaged.lost, ["headers"]);
    /// ```
    pub fn salvage(&self) -> SalvagedProperties {
        self.salvage_with_max_depth(DEFAULT_MAX_DEPTH)
    }

    /// [`UndecodableHeader::salvage`] for a header decoded by a
    /// [`crate::FrameDecoder`] built [`with_max_depth`](crate::FrameDecoder::with_max_depth)
    /// this limit.
    pub fn salvage_with_max_depth(&self, max_depth: usize) -> SalvagedProperties {
        if self.class_id != class::BASIC {
            return properties::unknown_class();
        }
        properties::salvage_basic(&self.raw_properties, Some(&self.raw_properties), max_depth)
    }
}

/// The fixed part of a content header (class, weight, body size) and what
/// is wrong with its property list, if anything.
pub(crate) struct CheckedHeader {
    class_id: u16,
    weight: u16,
    body_size: u64,
    error: Option<DecodeErrorKind>,
}

/// Where the property list starts in a content header payload.
pub(crate) const PROPERTIES_AT: usize = 12;

/// `content-header = class-id weight body-size property-flags property-list`:
/// reads the fixed 12 bytes and validates the property list, building
/// nothing. Only a payload too short for the fixed part is a stream error.
#[inline(always)]
pub(crate) fn check_content_header(payload: &[u8], max_depth: usize) -> Result<CheckedHeader, Error> {
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
        let ctx = Ctx {
            max_depth,
            validated: false,
        };
        BasicProperties::validate(ctx, rest).err()
    } else {
        Some(DecodeErrorKind::NoContentClass(class_id))
    };
    Ok(CheckedHeader {
        class_id,
        weight,
        body_size,
        error,
    })
}

impl CheckedHeader {
    /// The header, given the property bytes it was checked with: decoded,
    /// or undecodable with those bytes kept.
    #[inline(always)]
    pub(crate) fn into_header(self, raw: Bytes) -> Result<ContentHeader, UndecodableHeader> {
        match self.error {
            None => Ok(ContentHeader {
                class_id: self.class_id,
                weight: self.weight,
                body_size: self.body_size,
                properties: Properties::from_validated(raw),
            }),
            Some(error) => Err(UndecodableHeader {
                class_id: self.class_id,
                weight: self.weight,
                body_size: self.body_size,
                raw_properties: raw,
                error,
            }),
        }
    }
}
