//! `BasicProperties`: the 14 properties of the basic class and their flag word.
//!
//! A property list that breaks a limit (too deep, an unknown field type, a
//! length that lies) is an error about one message, not about the stream: the
//! frame around it is intact. The frame decoder reports it as
//! [`crate::Frame::UndecodableHeader`] with the raw bytes kept, and
//! [`BasicProperties::salvage`] reads back what it can of them (walking the
//! list with `crate::salvage`).

use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeErrorKind, EncodeError};
use crate::parse::num::be_u16;
use crate::parse::{kind_of, ArgReader, Ctx, ReadField};
use crate::salvage::{Walk, PROPERTY_FLAGS};
use crate::types::{FieldTable, FieldTableRef, ShortString, DEFAULT_MAX_DEPTH};

macro_rules! properties {
    ($( $(#[$doc:meta])* $field:ident : $ty:ty = $bit:literal, $name:literal, $read:ident, $write:ident; )*) => {
        /// The properties of a basic-class message. `None` is an absent
        /// property (its flag bit clear).
        #[derive(Debug, PartialEq, Default)]
        pub struct BasicProperties {
            $( $(#[$doc])* pub $field: Option<$ty>, )*
        }

        /// Starts from absent properties and clones the present ones into
        /// them: an absent property costs one check. (The derived clone
        /// builds every field aside before it moves them into place, which
        /// costs several times as much for the usual few properties.)
        impl Clone for BasicProperties {
            #[inline]
            fn clone(&self) -> Self {
                let mut out = BasicProperties::default();
                $( if let Some(value) = &self.$field {
                    out.$field = Some(value.clone());
                } )*
                out
            }
        }

        impl BasicProperties {
            /// The property flag word: bit 15 for the first property down to
            /// bit 2 for the fourteenth.
            pub fn flags(&self) -> u16 {
                let mut flags = 0;
                $( if self.$field.is_some() { flags |= 1 << $bit; } )*
                flags
            }

            /// Appends the flag word and the present properties.
            pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
                // One pass: the flag word is patched in once the fields
                // are written.
                let at = dst.len();
                dst.put_u16(0);
                let mut flags = 0u16;
                $( if let Some(value) = &self.$field {
                    flags |= 1 << $bit;
                    $write(value, dst)?;
                } )*
                dst[at..at + 2].copy_from_slice(&flags.to_be_bytes());
                Ok(())
            }

            /// Decodes the flag word and the properties into `props`, which
            /// must be empty (fields are written where they lie, not moved).
            /// `input` lies within `source` when there is one.
            pub(crate) fn decode_into(
                props: &mut Self,
                ctx: Ctx,
                input: &[u8],
                source: Option<&Bytes>,
            ) -> Result<(), DecodeErrorKind> {
                let mut r = ArgReader::new(ctx, source, input, input.len());
                let flags = r.short()?;
                if flags & DEFINED_FLAGS != flags {
                    return Err(DecodeErrorKind::BadPropertyFlags(flags));
                }
                $( if flags & (1 << $bit) != 0 {
                    ReadField::read_into(props.$field.insert(Default::default()), &mut r)?;
                } )*
                r.finish()
            }

            /// Checks a flag word and property list as
            /// [`BasicProperties::decode_into`] would decode them, finding
            /// every error it would find, without building anything.
            #[inline]
            pub(crate) fn validate(ctx: Ctx, input: &[u8]) -> Result<(), DecodeErrorKind> {
                let (mut i, flags) = be_u16(input).map_err(kind_of)?;
                if flags & DEFINED_FLAGS != flags {
                    return Err(DecodeErrorKind::BadPropertyFlags(flags));
                }
                $( if flags & (1 << $bit) != 0 {
                    i = skip::$read(ctx, i)?;
                } )*
                match i.len() {
                    0 => Ok(()),
                    left => Err(DecodeErrorKind::TrailingBytes(left)),
                }
            }

            /// Reads what can be read of a flag word and property list,
            /// field by field in wire order, into `props` (empty); see
            /// [`BasicProperties::salvage`]. `input` lies within `source`
            /// when there is one.
            fn salvage_into(
                props: &mut Self,
                max_depth: usize,
                input: &[u8],
                source: Option<&Bytes>,
            ) -> Vec<&'static str> {
                let ctx = Ctx { max_depth, validated: false };
                let mut walk = Walk::new(ArgReader::new(ctx, source, input, input.len()), max_depth);
                let Some(flags) = walk.flags(DEFINED_FLAGS) else {
                    return walk.into_lost();
                };
                $( if flags & (1 << $bit) != 0 {
                    walk.field(&mut props.$field, $name);
                } )*
                walk.into_lost()
            }
        }

        /// The properties of a basic-class message, borrowed: strings as
        /// the bytes they lie in, the headers as a [`FieldTableRef`]. What
        /// [`Properties::view`] reads straight from the bytes received,
        /// building nothing; `None` is an absent property.
        #[derive(Debug, Clone, Copy, PartialEq, Default)]
        pub struct BasicPropertiesRef<'a> {
            $( $(#[$doc])* pub $field: Option<view_type!($read)>, )*
        }

        impl BasicProperties {
            /// The properties, borrowed (see [`BasicPropertiesRef`]).
            pub fn view(&self) -> BasicPropertiesRef<'_> {
                BasicPropertiesRef {
                    $( $field: self.$field.as_ref().map(view::$read::from_owned), )*
                }
            }
        }

        impl<'a> BasicPropertiesRef<'a> {
            /// Reads a flag word and property list that passed
            /// [`BasicProperties::validate`], in one pass, building
            /// nothing. Should the bytes not be what validation accepted,
            /// the properties read up to there are returned.
            #[inline]
            // The last property's rest is assigned and not read.
            #[allow(unused_assignments)]
            fn from_validated(raw: &'a [u8]) -> Self {
                let mut props = BasicPropertiesRef::default();
                let Ok((mut i, flags)) = be_u16(raw) else {
                    return props;
                };
                $( if flags & (1 << $bit) != 0 {
                    match view::$read::read(i) {
                        Ok((rest, value)) => {
                            props.$field = Some(value);
                            i = rest;
                        }
                        Err(_) => return props,
                    }
                } )*
                props
            }

            /// The properties as a [`BasicProperties`] of their own.
            pub fn to_owned(&self) -> BasicProperties {
                BasicProperties {
                    $( $field: self.$field.as_ref().map(view::$read::to_owned), )*
                }
            }
        }

        /// The flag bits that name a property (bits 15 down to 2).
        const DEFINED_FLAGS: u16 = 0 $( | (1 << $bit) )*;
    };
}

/// The type a property of each kind is viewed as.
macro_rules! view_type {
    (shortstr) => { &'a [u8] };
    (table) => { FieldTableRef<'a> };
    (octet) => { u8 };
    (timestamp) => { u64 };
}

/// Reading one property of each type from validated bytes, for
/// [`BasicPropertiesRef`], and viewing one of a [`BasicProperties`].
mod view {
    pub(super) mod shortstr {
        use crate::parse::PError;
        use crate::types::{short_string_len, ShortString};

        /// `shortstr`: the string's bytes.
        #[inline(always)]
        pub(crate) fn read(i: &[u8]) -> nom::IResult<&[u8], &[u8], PError> {
            let (rest, len) = short_string_len(i)?;
            Ok((rest, i.get(1..1 + len).unwrap_or_default()))
        }

        pub(crate) fn from_owned(s: &ShortString) -> &[u8] {
            s.as_bytes()
        }

        pub(crate) fn to_owned(s: &&[u8]) -> ShortString {
            ShortString::from_slice(s)
        }
    }

    pub(super) mod table {
        use crate::parse::PError;
        use crate::types::{long_bytes, FieldTable, FieldTableRef};

        /// `table`: a view of its validated body.
        #[inline(always)]
        pub(crate) fn read(i: &[u8]) -> nom::IResult<&[u8], FieldTableRef<'_>, PError> {
            let (rest, body) = long_bytes(i)?;
            Ok((rest, FieldTableRef::from_validated(body)))
        }

        pub(crate) fn from_owned(t: &FieldTable) -> FieldTableRef<'_> {
            t.view()
        }

        pub(crate) fn to_owned(t: &FieldTableRef<'_>) -> FieldTable {
            t.to_owned()
        }
    }

    pub(super) mod octet {
        use crate::parse::PError;

        /// `octet`.
        #[inline(always)]
        pub(crate) fn read(i: &[u8]) -> nom::IResult<&[u8], u8, PError> {
            nom::number::complete::be_u8(i)
        }

        pub(crate) fn from_owned(v: &u8) -> u8 {
            *v
        }

        pub(crate) fn to_owned(v: &u8) -> u8 {
            *v
        }
    }

    pub(super) mod timestamp {
        use crate::parse::PError;

        /// `timestamp`: a 64-bit big-endian count of seconds.
        #[inline(always)]
        pub(crate) fn read(i: &[u8]) -> nom::IResult<&[u8], u64, PError> {
            crate::parse::num::be_u64(i)
        }

        pub(crate) fn from_owned(v: &u64) -> u64 {
            *v
        }

        pub(crate) fn to_owned(v: &u64) -> u64 {
            *v
        }
    }
}

/// Moving past one property of each type with nom's complete parsers, for
/// [`BasicProperties::validate`]: the rest of the list, or what is wrong.
mod skip {
    use nom::bytes::complete::take;

    use crate::error::DecodeErrorKind;
    use crate::parse::{kind_of, Ctx};
    use crate::types::{short_string_len, table_body};

    type Skip<'a> = Result<&'a [u8], DecodeErrorKind>;

    #[inline(always)]
    pub(super) fn shortstr(_: Ctx, i: &[u8]) -> Skip<'_> {
        short_string_len(i).map(|(rest, _)| rest).map_err(kind_of)
    }

    #[inline(always)]
    pub(super) fn table(ctx: Ctx, i: &[u8]) -> Skip<'_> {
        table_body(ctx.max_depth, 1, i).map(|(rest, _)| rest).map_err(kind_of)
    }

    #[inline(always)]
    pub(super) fn octet(_: Ctx, i: &[u8]) -> Skip<'_> {
        take::<_, _, crate::parse::PError>(1usize)(i)
            .map(|(rest, _)| rest)
            .map_err(kind_of)
    }

    #[inline(always)]
    pub(super) fn timestamp(_: Ctx, i: &[u8]) -> Skip<'_> {
        take::<_, _, crate::parse::PError>(8usize)(i)
            .map(|(rest, _)| rest)
            .map_err(kind_of)
    }
}

fn write_shortstr(v: &ShortString, dst: &mut BytesMut) -> Result<(), EncodeError> {
    v.encode(dst)
}

fn write_table(v: &FieldTable, dst: &mut BytesMut) -> Result<(), EncodeError> {
    v.encode(dst)
}

fn write_octet(v: &u8, dst: &mut BytesMut) -> Result<(), EncodeError> {
    dst.put_u8(*v);
    Ok(())
}

fn write_u64(v: &u64, dst: &mut BytesMut) -> Result<(), EncodeError> {
    dst.put_u64(*v);
    Ok(())
}

properties! {
    /// `content-type`, e.g. `application/json`.
    content_type: ShortString = 15, "content-type", shortstr, write_shortstr;
    /// `content-encoding`, e.g. `gzip`.
    content_encoding: ShortString = 14, "content-encoding", shortstr, write_shortstr;
    /// `headers`: application headers.
    headers: FieldTable = 13, "headers", table, write_table;
    /// `delivery-mode`: 1 transient, 2 persistent.
    delivery_mode: u8 = 12, "delivery-mode", octet, write_octet;
    /// `priority`: 0 to 9.
    priority: u8 = 11, "priority", octet, write_octet;
    /// `correlation-id`.
    correlation_id: ShortString = 10, "correlation-id", shortstr, write_shortstr;
    /// `reply-to`.
    reply_to: ShortString = 9, "reply-to", shortstr, write_shortstr;
    /// `expiration`: a per-message TTL in milliseconds, as text.
    expiration: ShortString = 8, "expiration", shortstr, write_shortstr;
    /// `message-id`.
    message_id: ShortString = 7, "message-id", shortstr, write_shortstr;
    /// `timestamp`: seconds since the Unix epoch.
    timestamp: u64 = 6, "timestamp", timestamp, write_u64;
    /// `type`: the message type name.
    kind: ShortString = 5, "type", shortstr, write_shortstr;
    /// `user-id`: checked by RabbitMQ against the connection's user.
    user_id: ShortString = 4, "user-id", shortstr, write_shortstr;
    /// `app-id`.
    app_id: ShortString = 3, "app-id", shortstr, write_shortstr;
    /// `cluster-id` (deprecated in 0-9-1, still carried).
    cluster_id: ShortString = 2, "cluster-id", shortstr, write_shortstr;
}

/// What could be read of a property list that does not decode as a whole:
/// the result of [`BasicProperties::salvage`] and
/// [`crate::UndecodableHeader::salvage`].
///
/// ```
/// use acemq_codec::BasicProperties;
/// // Flags: headers (bit 13) and message-id (bit 7). The headers table holds
/// // one entry of type 'Z', which RabbitMQ does not define.
/// let mut raw = vec![0x20, 0x80];
/// raw.extend_from_slice(&[0, 0, 0, 3, 1, b'k', b'Z']);
/// raw.extend_from_slice(&[3, b'm', b'-', b'1']);
///
/// let salvaged = BasicProperties::salvage(&raw);
/// assert_eq!(salvaged.properties.message_id.as_ref().unwrap().as_bytes(), b"m-1");
/// assert_eq!(salvaged.properties.headers, None);
/// assert_eq!(salvaged.lost, ["headers"]);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SalvagedProperties {
    /// Every property that could be read, as the decoder would have read it.
    /// `headers` may hold only the table's readable top-level entries (it is
    /// then also named in `lost`).
    pub properties: BasicProperties,
    /// The properties the flag word names that could not be read whole, by
    /// their AMQP names in wire order (`"headers"`, `"message-id"`, `"type"`,
    /// ...), preceded by `"property-flags"` when the flag word itself cannot
    /// be used (missing, cut short, undefined bits set, another class than
    /// basic). Empty when every property named was read; bytes left over
    /// after the last property are not a lost property.
    pub lost: Vec<&'static str>,
}

impl BasicProperties {
    /// Whether `self` and `other`, both without headers, encode as the same
    /// bytes: every field equal, those that usually differ between messages
    /// compared first. Always `false` when either has headers: a table is
    /// never compared by value (`0.0` and `-0.0` are equal and encode
    /// differently). Written out field by field, so that a new field cannot
    /// be missed.
    ///
    /// ```
    /// use acemq_codec::BasicProperties;
    /// let a = BasicProperties { delivery_mode: Some(2), ..Default::default() };
    /// assert!(a.encodes_like(&a.clone()));
    /// assert!(!a.encodes_like(&BasicProperties::default()));
    /// ```
    pub fn encodes_like(&self, other: &BasicProperties) -> bool {
        let BasicProperties {
            content_type,
            content_encoding,
            headers,
            delivery_mode,
            priority,
            correlation_id,
            reply_to,
            expiration,
            message_id,
            timestamp,
            kind,
            user_id,
            app_id,
            cluster_id,
        } = self;
        headers.is_none()
            && other.headers.is_none()
            && *message_id == other.message_id
            && *timestamp == other.timestamp
            && *correlation_id == other.correlation_id
            && *expiration == other.expiration
            && *delivery_mode == other.delivery_mode
            && *priority == other.priority
            && *content_type == other.content_type
            && *content_encoding == other.content_encoding
            && *reply_to == other.reply_to
            && *kind == other.kind
            && *user_id == other.user_id
            && *app_id == other.app_id
            && *cluster_id == other.cluster_id
    }

    /// Reads everything that can be read of a flag word and property list
    /// as they lie on the wire (what
    /// [`crate::UndecodableHeader::raw_properties`] holds), with the default
    /// nesting limit ([`DEFAULT_MAX_DEPTH`], as [`crate::FrameDecoder::new`]).
    ///
    /// For a message whose properties did not decode, so that it can be set
    /// aside with its identifiers and timestamp rather than with none. On
    /// bytes the decoder accepts, it gives what the decoder gives and loses
    /// nothing. See [`SalvagedProperties`].
    pub fn salvage(raw: &[u8]) -> SalvagedProperties {
        Self::salvage_with_max_depth(raw, DEFAULT_MAX_DEPTH)
    }

    /// [`BasicProperties::salvage`] with the nesting limit of a decoder built
    /// with [`crate::FrameDecoder::with_max_depth`]: a headers table nested
    /// deeper is not read whole.
    pub fn salvage_with_max_depth(raw: &[u8], max_depth: usize) -> SalvagedProperties {
        salvage_basic(raw, None, max_depth)
    }
}

/// Salvages a basic-class property list; tables are zero-copy slices of
/// `source` when `raw` lies within it. The limit is at least 1, as a
/// [`crate::FrameDecoder`]'s is.
pub(crate) fn salvage_basic(raw: &[u8], source: Option<&Bytes>, max_depth: usize) -> SalvagedProperties {
    let mut properties = BasicProperties::default();
    let lost = BasicProperties::salvage_into(&mut properties, max_depth.max(1), raw, source);
    SalvagedProperties { properties, lost }
}

/// What a content header of a class other than basic salvages: nothing, as
/// its flag bits name properties this crate does not know.
pub(crate) fn unknown_class() -> SalvagedProperties {
    SalvagedProperties {
        properties: BasicProperties::default(),
        lost: vec![PROPERTY_FLAGS],
    }
}

/// The properties of a content header: as received, the validated wire
/// bytes, decoded into a [`BasicProperties`] the first time a property is
/// read; or a [`BasicProperties`] of one's own.
///
/// Decoding a content header checks its whole property list against every
/// rule decoding it field by field would (flag bits, string lengths, table
/// nesting, type codes), so a bad list is still an
/// [`crate::UndecodableHeader`] at once; only building the fields waits. A
/// message that is passed on without reading its properties (a broker
/// routing it) never builds them, and encodes as a copy of the bytes
/// received. The wire bytes are a zero-copy slice of the frame, like a body:
/// decoding a header allocates nothing.
///
/// `Properties` dereferences to [`BasicProperties`]; changing a property
/// (through `DerefMut`) makes the value its own, and it then encodes from
/// its fields.
///
/// ```
/// use acemq_codec::{BasicProperties, ContentHeader, Frame, FrameDecoder, Properties};
/// let sent = BasicProperties { message_id: Some("m-1".into()), ..Default::default() };
/// let mut wire = bytes::BytesMut::new();
/// Frame::Header(1, ContentHeader::basic(0, sent.clone())).encode(&mut wire).unwrap();
///
/// let Some(Frame::Header(_, header)) = FrameDecoder::new(4096).decode(&mut wire).unwrap() else { panic!() };
/// assert_eq!(header.properties.flags(), sent.flags());
/// assert_eq!(header.properties.message_id.as_ref().unwrap().as_bytes(), b"m-1"); // built here
/// let mut props: Properties = header.properties;
/// props.priority = Some(5);
/// assert_eq!(props.flags(), sent.flags() | 1 << 11);
/// ```
#[derive(Clone)]
pub struct Properties(PropertiesRepr);

#[derive(Clone)]
enum PropertiesRepr {
    /// As received: the flag word and the property list, validated (empty
    /// for a value with no properties), and the fields once built.
    Wire {
        raw: Bytes,
        built: OnceLock<Box<BasicProperties>>,
    },
    /// Built or changed by the application.
    Owned(Box<BasicProperties>),
}

impl Properties {
    /// No properties; allocates nothing.
    pub const fn new() -> Self {
        Properties(PropertiesRepr::Wire {
            raw: Bytes::new(),
            built: OnceLock::new(),
        })
    }

    /// Properties over a flag word and property list that passed
    /// [`BasicProperties::validate`].
    #[inline]
    pub(crate) fn from_validated(raw: Bytes) -> Self {
        Properties(PropertiesRepr::Wire {
            raw,
            built: OnceLock::new(),
        })
    }

    /// The property flag word, read without building the properties.
    pub fn flags(&self) -> u16 {
        match &self.0 {
            PropertiesRepr::Wire { raw, .. } => match raw.first_chunk::<2>() {
                Some(flags) => u16::from_be_bytes(*flags),
                None => 0,
            },
            PropertiesRepr::Owned(props) => props.flags(),
        }
    }

    /// The flag word and property list as received, while they are the
    /// value (none was changed); `None` for properties built here.
    pub fn wire_bytes(&self) -> Option<&Bytes> {
        match &self.0 {
            PropertiesRepr::Wire { raw, .. } if !raw.is_empty() => Some(raw),
            _ => None,
        }
    }

    /// Whether the fields have been built (always, for properties built
    /// here).
    pub fn is_built(&self) -> bool {
        match &self.0 {
            PropertiesRepr::Wire { raw, built } => raw.is_empty() || built.get().is_some(),
            PropertiesRepr::Owned(_) => true,
        }
    }

    /// Appends the flag word and the present properties: the bytes received,
    /// if nothing was changed.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        match &self.0 {
            PropertiesRepr::Wire { raw, .. } if raw.is_empty() => {
                dst.put_u16(0);
                Ok(())
            }
            PropertiesRepr::Wire { raw, .. } => {
                dst.put_slice(raw);
                Ok(())
            }
            PropertiesRepr::Owned(props) => props.encode(dst),
        }
    }

    /// Every property, borrowed, read straight from the bytes received
    /// (whether or not they have been built): the cheapest way to read
    /// them, as nothing is built or allocated, the headers included (see
    /// [`FieldTableRef`]). For properties of one's own, a view of their
    /// fields.
    ///
    /// ```
    /// use acemq_codec::{BasicProperties, ContentHeader, FieldTable, FieldValue, Frame, FrameDecoder};
    /// let mut headers = FieldTable::new();
    /// headers.push("x-attempt", FieldValue::I32(3));
    /// let sent = BasicProperties { message_id: Some("m-1".into()), headers: Some(headers), ..Default::default() };
    /// let mut wire = bytes::BytesMut::new();
    /// Frame::Header(1, ContentHeader::basic(0, sent.clone())).encode(&mut wire).unwrap();
    ///
    /// let Some(Frame::Header(_, header)) = FrameDecoder::new(4096).decode(&mut wire).unwrap() else { panic!() };
    /// let view = header.properties.view();
    /// assert_eq!(view.message_id, Some(&b"m-1"[..]));
    /// assert_eq!(view.headers.and_then(|h| h.get("x-attempt")).and_then(|v| v.as_i64()), Some(3));
    /// assert!(!header.properties.is_built()); // nothing was built
    /// assert_eq!(view.to_owned(), sent);
    /// ```
    #[inline]
    pub fn view(&self) -> BasicPropertiesRef<'_> {
        match &self.0 {
            PropertiesRepr::Wire { raw, .. } => BasicPropertiesRef::from_validated(raw),
            PropertiesRepr::Owned(props) => props.view(),
        }
    }

    /// The properties as a [`BasicProperties`] of their own.
    pub fn into_basic(self) -> BasicProperties {
        match self.0 {
            PropertiesRepr::Wire { raw, built } => match built.into_inner() {
                Some(props) => *props,
                None => build(&raw),
            },
            PropertiesRepr::Owned(props) => *props,
        }
    }
}

/// Builds the fields of a validated property list: validated, so decoding
/// cannot fail, and tables are not checked a second time.
fn build(raw: &Bytes) -> BasicProperties {
    let mut props = BasicProperties::default();
    if !raw.is_empty() {
        let ctx = Ctx {
            max_depth: usize::MAX,
            validated: true,
        };
        // Cannot fail: `raw` passed `validate` with the same rules. Were it
        // to, the properties decoded up to that point are kept.
        let _ = BasicProperties::decode_into(&mut props, ctx, raw, Some(raw));
    }
    props
}

impl Default for Properties {
    fn default() -> Self {
        Properties::new()
    }
}

impl std::ops::Deref for Properties {
    type Target = BasicProperties;

    fn deref(&self) -> &BasicProperties {
        match &self.0 {
            PropertiesRepr::Wire { raw, built } => built.get_or_init(|| Box::new(build(raw))),
            PropertiesRepr::Owned(props) => props,
        }
    }
}

impl std::ops::DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut BasicProperties {
        if let PropertiesRepr::Wire { raw, built } = &mut self.0 {
            let props = built.take().unwrap_or_else(|| Box::new(build(raw)));
            self.0 = PropertiesRepr::Owned(props);
        }
        match &mut self.0 {
            PropertiesRepr::Owned(props) => props,
            // Made `Owned` just above.
            PropertiesRepr::Wire { .. } => unreachable!("properties made their own"),
        }
    }
}

impl AsRef<BasicProperties> for Properties {
    fn as_ref(&self) -> &BasicProperties {
        self
    }
}

impl From<BasicProperties> for Properties {
    fn from(props: BasicProperties) -> Self {
        Properties(PropertiesRepr::Owned(Box::new(props)))
    }
}

impl From<Box<BasicProperties>> for Properties {
    fn from(props: Box<BasicProperties>) -> Self {
        Properties(PropertiesRepr::Owned(props))
    }
}

impl From<Properties> for BasicProperties {
    fn from(props: Properties) -> Self {
        props.into_basic()
    }
}

impl PartialEq for Properties {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl PartialEq<BasicProperties> for Properties {
    fn eq(&self, other: &BasicProperties) -> bool {
        **self == *other
    }
}

impl std::fmt::Debug for Properties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
#[path = "salvage_tests.rs"]
mod salvage_tests;

#[cfg(test)]
mod view_tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    use crate::{ContentHeader, Frame, FrameDecoder};

    proptest! {
        /// Viewing decoded properties reads what building them gives, and
        /// builds nothing; a view of one's own properties reads the same.
        #[test]
        fn a_view_reads_what_building_gives(props in crate::arbitrary::properties()) {
            let mut wire = BytesMut::new();
            Frame::Header(1, ContentHeader::basic(0, props.clone())).encode(&mut wire).unwrap();
            let Some(Frame::Header(_, header)) = FrameDecoder::new(0).decode(&mut wire).unwrap() else {
                panic!("a header")
            };
            let view = header.properties.view();
            prop_assert!(header.properties.is_built() == (header.properties.wire_bytes().is_none()));
            prop_assert_eq!(view.to_owned(), props.clone());
            prop_assert_eq!(view, props.view());
            prop_assert_eq!(&*header.properties, &props);
            prop_assert_eq!(header.properties.view(), view);
        }
    }
}

#[cfg(test)]
mod clone_tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    proptest! {
        /// A clone holds every property its original holds, absent ones
        /// absent, and encodes to the same bytes.
        #[test]
        fn a_clone_holds_every_property_of_its_original_and_encodes_alike(
            props in crate::arbitrary::properties()
        ) {
            let clone = props.clone();
            prop_assert_eq!(clone.flags(), props.flags());
            prop_assert_eq!(&clone, &props);
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            props.encode(&mut a).unwrap();
            clone.encode(&mut b).unwrap();
            prop_assert_eq!(a, b);
        }
    }
}
