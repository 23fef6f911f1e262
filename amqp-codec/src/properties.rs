//! `BasicProperties`: the 14 properties of the basic class and their flag word.
//!
//! A property list that breaks a limit (too deep, an unknown field type, a
//! length that lies) is an error about one message, not about the stream: the
//! frame envelope around it is intact. The frame decoder reports it as
//! [`crate::Frame::UndecodableHeader`] with the raw bytes kept.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeErrorKind, EncodeError};
use crate::parse::{ArgReader, Ctx, ReadField};
use crate::types::{FieldTable, ShortString};

macro_rules! properties {
    ($( $(#[$doc:meta])* $field:ident : $ty:ty = $bit:literal, $read:ident, $write:ident; )*) => {
        /// The properties of a basic-class message. `None` is an absent
        /// property (its flag bit clear).
        #[derive(Debug, Clone, PartialEq, Default)]
        pub struct BasicProperties {
            $( $(#[$doc])* pub $field: Option<$ty>, )*
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
                dst.put_u16(self.flags());
                $( if let Some(value) = &self.$field { $write(value, dst)?; } )*
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
        }

        /// The flag bits that name a property (bits 15 down to 2).
        const DEFINED_FLAGS: u16 = 0 $( | (1 << $bit) )*;
    };
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
    content_type: ShortString = 15, shortstr, write_shortstr;
    /// `content-encoding`, e.g. `gzip`.
    content_encoding: ShortString = 14, shortstr, write_shortstr;
    /// `headers`: application headers.
    headers: FieldTable = 13, table, write_table;
    /// `delivery-mode`: 1 transient, 2 persistent.
    delivery_mode: u8 = 12, octet, write_octet;
    /// `priority`: 0 to 9.
    priority: u8 = 11, octet, write_octet;
    /// `correlation-id`.
    correlation_id: ShortString = 10, shortstr, write_shortstr;
    /// `reply-to`.
    reply_to: ShortString = 9, shortstr, write_shortstr;
    /// `expiration`: a per-message TTL in milliseconds, as text.
    expiration: ShortString = 8, shortstr, write_shortstr;
    /// `message-id`.
    message_id: ShortString = 7, shortstr, write_shortstr;
    /// `timestamp`: seconds since the Unix epoch.
    timestamp: u64 = 6, timestamp, write_u64;
    /// `type`: the message type name.
    kind: ShortString = 5, shortstr, write_shortstr;
    /// `user-id`: checked by RabbitMQ against the connection's user.
    user_id: ShortString = 4, shortstr, write_shortstr;
    /// `app-id`.
    app_id: ShortString = 3, shortstr, write_shortstr;
    /// `cluster-id` (deprecated in 0-9-1, still carried).
    cluster_id: ShortString = 2, shortstr, write_shortstr;
}
