//! `shortstr` and `longstr`: byte strings, kept as the bytes received.
//!
//! AMQP strings are octet sequences; RabbitMQ does not insist on UTF-8, so
//! neither does the decoder. Both types are cheap `Bytes` slices of the frame
//! they came from. Nothing here may copy on decode.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::EncodeError;

macro_rules! byte_string {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Bytes);

        impl $name {
            /// An empty string.
            pub const fn new() -> Self {
                $name(Bytes::new())
            }

            /// A string from a `'static` literal, without copying.
            pub const fn from_static(s: &'static str) -> Self {
                $name(Bytes::from_static(s.as_bytes()))
            }

            /// The raw bytes.
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }

            /// The bytes as UTF-8, or `None` if they are not valid UTF-8.
            pub fn as_str(&self) -> Option<&str> {
                std::str::from_utf8(&self.0).ok()
            }

            /// The bytes as text, with invalid UTF-8 replaced.
            pub fn to_string_lossy(&self) -> std::borrow::Cow<'_, str> {
                String::from_utf8_lossy(&self.0)
            }

            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// Whether the string is empty.
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }

            /// The underlying `Bytes` (a cheap clone).
            pub fn to_bytes(&self) -> Bytes {
                self.0.clone()
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(Bytes::copy_from_slice(s.as_bytes()))
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(Bytes::from(s))
            }
        }

        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                $name::from(s.as_str())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other.as_bytes()
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == other.as_bytes()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.as_str() {
                    Some(s) => fmt::Debug::fmt(s, f),
                    None => write!(f, "b{:?}", self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_string_lossy())
            }
        }
    };
}

byte_string! {
    /// An AMQP `shortstr`: at most 255 bytes on the wire. Longer values can be
    /// built but fail to encode with [`EncodeError::ShortStringTooLong`].
    ShortString
}

byte_string! {
    /// An AMQP `longstr` (field type `S`): up to 4 GiB of bytes.
    LongString
}

impl ShortString {
    /// Wraps bytes the decoder has already length-checked.
    pub(crate) fn from_bytes_unchecked(bytes: Bytes) -> Self {
        ShortString(bytes)
    }

    /// A short string from raw bytes, or `None` if they are longer than 255.
    pub fn from_bytes(bytes: Bytes) -> Option<Self> {
        (bytes.len() <= 255).then_some(ShortString(bytes))
    }

    pub(crate) fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let len = u8::try_from(self.0.len()).map_err(|_| EncodeError::ShortStringTooLong(self.0.len()))?;
        dst.put_u8(len);
        dst.put_slice(&self.0);
        Ok(())
    }
}

impl LongString {
    pub(crate) fn encode(&self, dst: &mut BytesMut) -> Result<(), EncodeError> {
        encode_long_bytes(&self.0, dst)
    }
}

impl From<Bytes> for LongString {
    fn from(bytes: Bytes) -> Self {
        LongString(bytes)
    }
}

impl From<Vec<u8>> for LongString {
    fn from(bytes: Vec<u8>) -> Self {
        LongString(Bytes::from(bytes))
    }
}

impl From<&[u8]> for LongString {
    fn from(bytes: &[u8]) -> Self {
        LongString(Bytes::copy_from_slice(bytes))
    }
}

/// Writes a 32-bit length prefix and the bytes.
pub(crate) fn encode_long_bytes(bytes: &[u8], dst: &mut BytesMut) -> Result<(), EncodeError> {
    let len = u32::try_from(bytes.len()).map_err(|_| EncodeError::TooLong(bytes.len()))?;
    dst.put_u32(len);
    dst.put_slice(bytes);
    Ok(())
}
