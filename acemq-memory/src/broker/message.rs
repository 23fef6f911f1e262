//! A published message as the broker keeps it: where it was published, its
//! properties (decoded, or raw when the codec could not decode them) and
//! its body, shared between queues and streams; and the property bytes a
//! delivery of it carries. Must never copy a body; the property bytes go
//! out as they were received unless the broker or the delivery changes a
//! property.

use std::borrow::Cow;

use acemq_codec::{BasicProperties, FieldTable, FieldValue, Properties, ShortString, UndecodableHeader};
use bytes::{Bytes, BytesMut};

use super::args::set_table_value;

/// A message's properties: decoded, or kept raw when the codec could not
/// decode them (RabbitMQ passes such a header through untouched).
#[derive(Debug, Clone)]
pub(crate) enum Header {
    /// As the codec hands them over: the wire bytes, validated, with the
    /// fields built only if the broker reads one (and re-encoded as a copy
    /// of those bytes if it changes none).
    Decoded(Properties),
    Raw(UndecodableHeader),
}

/// A published message. Shared between queues with `Arc`; the body is a
/// zero-copy slice of the publisher's read buffer, and so are the property
/// bytes while the broker has changed no property.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub exchange: ShortString,
    pub routing_key: ShortString,
    pub header: Header,
    pub body: Bytes,
}

/// What a delivery adds to a message's properties.
#[derive(Debug, Default)]
pub(crate) struct Outgoing<'a> {
    /// A header set in its headers table (RabbitMQ's `add_header`).
    pub extra: Option<(&'a str, FieldValue)>,
    /// `delivery_mode` goes out as 2 if it is 2, otherwise as 1 (what
    /// RabbitMQ 4.0's AMQP 1.0 `durable` flag leaves of it).
    pub durable_flag: bool,
}

impl<'a> From<Option<(&'a str, FieldValue)>> for Outgoing<'a> {
    fn from(extra: Option<(&'a str, FieldValue)>) -> Self {
        Outgoing {
            extra,
            durable_flag: false,
        }
    }
}

impl Message {
    /// The property flag word and list a delivery of this message carries
    /// (empty for none), with what `outgoing` adds (a header that was not
    /// decoded goes out as it came): the bytes received, unless the broker
    /// changed a property (the headers of a dead letter) or `outgoing`
    /// changes one; those are encoded into `scratch`. `None` if they do
    /// not encode.
    #[inline]
    pub fn outgoing_properties<'a>(&'a self, outgoing: Outgoing<'_>, scratch: &'a mut BytesMut) -> Option<&'a [u8]> {
        let props = match (&self.header, outgoing) {
            (Header::Raw(raw), _) => return Some(&raw.raw_properties),
            (
                Header::Decoded(props),
                Outgoing {
                    extra: None,
                    durable_flag: false,
                },
            ) => match props.wire_bytes() {
                Some(received) => return Some(received),
                None if props.flags() == 0 => return Some(&[]),
                None => Cow::Borrowed(&**props),
            },
            (Header::Decoded(props), Outgoing { extra, durable_flag }) => {
                let mut props = BasicProperties::clone(props);
                if let Some((key, value)) = extra {
                    let mut headers = props.headers.take().unwrap_or_default();
                    set_table_value(&mut headers, key, value);
                    props.headers = Some(headers);
                }
                if durable_flag {
                    props.delivery_mode = Some(if props.delivery_mode == Some(2) { 2 } else { 1 });
                }
                Cow::Owned(props)
            }
        };
        props.encode(scratch).ok()?;
        Some(&scratch[..])
    }

    pub fn properties(&self) -> Option<&BasicProperties> {
        match &self.header {
            Header::Decoded(p) => Some(p),
            Header::Raw(_) => None,
        }
    }

    pub fn headers(&self) -> Option<&FieldTable> {
        self.properties().and_then(|p| p.headers.as_ref())
    }

    pub fn persistent(&self) -> bool {
        match &self.header {
            Header::Decoded(p) => p.delivery_mode == Some(2),
            Header::Raw(_) => false,
        }
    }

    /// The per-message TTL in milliseconds, if the `expiration` property holds one.
    pub fn expiration_ms(&self) -> Option<u64> {
        self.properties()?.expiration.as_ref()?.as_str()?.parse().ok()
    }
}
