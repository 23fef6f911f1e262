//! Message properties both ways: [`Outgoing`], what one send sets beyond
//! the publisher's defaults (routing key, expiration, priority, reply-to,
//! type, app-id, user headers), checked before anything is written; and
//! [`MessageProperties`], what a delivery arrived with, typed.
//!
//! Sending never writes what the broker would refuse or misread: a routing
//! key or a short-string property over 255 bytes, an expiration over
//! RabbitMQ's limit, a header name over 255 bytes, or a user header that
//! would overwrite one acemq manages (`x-acemq-*`, `traceparent`,
//! `tracestate`) is a [`PropertyError`] and nothing is sent.
//!
//! Reading never fails and never panics (statement 29 of
//! `docs/statements.md`): whatever another producer wrote, a property that
//! is not UTF-8, a delivery mode other than 1 or 2, an expiration that is
//! not a non-negative integer of milliseconds, or a timestamp no clock can
//! hold is read as absent; a header of another type than asked for is a
//! [`HeaderError`] saying what it was.

use std::time::{Duration, SystemTime};

use acemq_codec::{BasicProperties, BasicPropertiesRef, FieldTable, FieldValue, FieldValueRef, Properties};

use crate::envelope::Envelope;

/// The longest per-message TTL RabbitMQ accepts, in milliseconds (2^32 − 1,
/// about 49.7 days); a longer `expiration` closes the channel with 406.
pub const MAX_EXPIRATION_MS: u64 = u32::MAX as u64;

/// What one send sets besides the payload and the publisher's defaults:
/// give it to [`crate::Publisher::send_with`].
///
/// ```
/// use std::time::Duration;
/// use acemq_core::properties::Outgoing;
///
/// let outgoing = Outgoing::new()
///     .routing_key("eu.orders")
///     .priority(5)
///     .expiration(Duration::from_secs(30))
///     .reply_to("billing.replies")
///     .message_type("order.placed")
///     .app_id("shop")
///     .header("tenant", "acme");
/// assert!(outgoing.check().is_ok());
/// assert!(Outgoing::new().header("x-acemq-attempt", 9).check().is_err());
/// ```
#[derive(Debug, Clone, Default)]
pub struct Outgoing {
    pub(crate) routing_key: Option<String>,
    expiration: Option<Duration>,
    priority: Option<u8>,
    reply_to: Option<String>,
    kind: Option<String>,
    app_id: Option<String>,
    content_encoding: Option<String>,
    headers: FieldTable,
    pub(crate) envelope: Option<Envelope>,
}

impl Outgoing {
    /// Nothing set: a send with this is [`crate::Publisher::send`]'s.
    pub fn new() -> Outgoing {
        Outgoing::default()
    }

    /// The routing key of this message, instead of the publisher's (at most
    /// 255 bytes).
    pub fn routing_key(mut self, key: impl Into<String>) -> Self {
        self.routing_key = Some(key.into());
        self
    }

    /// The message's time to live in the queue (`expiration`, written as
    /// whole milliseconds, rounded down; at most [`MAX_EXPIRATION_MS`]).
    pub fn expiration(mut self, ttl: Duration) -> Self {
        self.expiration = Some(ttl);
        self
    }

    /// Its `priority` (a queue declared with `x-max-priority` delivers
    /// higher ones first, and caps it at that maximum).
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// `reply-to`: where a reply should go (at most 255 bytes).
    pub fn reply_to(mut self, queue: impl Into<String>) -> Self {
        self.reply_to = Some(queue.into());
        self
    }

    /// `type`: the message type's name (at most 255 bytes).
    pub fn message_type(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// `app-id`: the sending application (at most 255 bytes).
    pub fn app_id(mut self, app_id: impl Into<String>) -> Self {
        self.app_id = Some(app_id.into());
        self
    }

    /// `content-encoding`, e.g. `gzip` for a body the codec compressed (at
    /// most 255 bytes).
    pub fn content_encoding(mut self, encoding: impl Into<String>) -> Self {
        self.content_encoding = Some(encoding.into());
        self
    }

    /// A user header (the last value given for a name wins). The names
    /// acemq manages (`x-acemq-*`, `traceparent`, `tracestate`) are refused
    /// when the message is sent.
    pub fn header(mut self, name: &str, value: impl Into<FieldValue>) -> Self {
        self.headers.insert(name, value.into());
        self
    }

    /// The envelope to send with (a correlation id, a causation id, headers
    /// of its own); a new one otherwise.
    pub fn envelope(mut self, envelope: Envelope) -> Self {
        self.envelope = Some(envelope);
        self
    }

    /// Checks what the broker would refuse or misread, as a send does before
    /// writing anything.
    pub fn check(&self) -> Result<(), PropertyError> {
        let short = |property: &'static str, value: &Option<String>| match value {
            Some(v) if v.len() > 255 => Err(PropertyError::TooLong { property, len: v.len() }),
            _ => Ok(()),
        };
        short("routing key", &self.routing_key)?;
        short("reply-to", &self.reply_to)?;
        short("type", &self.kind)?;
        short("app-id", &self.app_id)?;
        short("content-encoding", &self.content_encoding)?;
        if let Some(ttl) = self.expiration {
            if ttl.as_millis() > u128::from(MAX_EXPIRATION_MS) {
                return Err(PropertyError::ExpirationTooLong { expiration: ttl });
            }
        }
        for (name, _) in self.headers.iter() {
            let text = name.to_string_lossy();
            if name.len() > 255 {
                return Err(PropertyError::TooLong {
                    property: "header name",
                    len: name.len(),
                });
            }
            if is_managed_header(name.as_bytes()) {
                return Err(PropertyError::ManagedHeader {
                    name: text.into_owned(),
                });
            }
        }
        Ok(())
    }

    /// Writes what is set into `properties` (after the envelope: the user
    /// headers join the envelope's, which [`Outgoing::check`] keeps them
    /// from overwriting).
    pub(crate) fn write_to(&self, properties: &mut BasicProperties) {
        if let Some(ttl) = self.expiration {
            properties.expiration = Some(ttl.as_millis().to_string().as_str().into());
        }
        if let Some(priority) = self.priority {
            properties.priority = Some(priority);
        }
        let text = |v: &Option<String>| v.as_deref().map(Into::into);
        if self.reply_to.is_some() {
            properties.reply_to = text(&self.reply_to);
        }
        if self.kind.is_some() {
            properties.kind = text(&self.kind);
        }
        if self.app_id.is_some() {
            properties.app_id = text(&self.app_id);
        }
        if self.content_encoding.is_some() {
            properties.content_encoding = text(&self.content_encoding);
        }
        if !self.headers.is_empty() {
            let headers = properties.headers.get_or_insert_with(FieldTable::new);
            for (name, value) in self.headers.iter() {
                headers.insert(name.clone(), value.clone());
            }
        }
    }
}

/// Whether a header name is one acemq writes itself.
pub(crate) fn is_managed_header(name: &[u8]) -> bool {
    name.starts_with(b"x-acemq-")
        || name == crate::trace::TRACEPARENT_HEADER.as_bytes()
        || name == crate::trace::TRACESTATE_HEADER.as_bytes()
}

/// A send's properties the broker would refuse or misread; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropertyError {
    /// A short string (the routing key, reply-to, type, app-id,
    /// content-encoding, a header name) over 255 bytes.
    #[error("the {property} is {len} bytes long; AMQP allows at most 255")]
    TooLong {
        /// Which one.
        property: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// An expiration longer than RabbitMQ accepts ([`MAX_EXPIRATION_MS`]).
    #[error("an expiration of {expiration:?} is over RabbitMQ's limit of {MAX_EXPIRATION_MS} ms")]
    ExpirationTooLong {
        /// The expiration asked for.
        expiration: Duration,
    },
    /// A user header named like one acemq manages (`x-acemq-*`,
    /// `traceparent`, `tracestate`), which it would overwrite.
    #[error("the header {name:?} is managed by acemq and cannot be set by a send")]
    ManagedHeader {
        /// The header's name.
        name: String,
    },
}

/// A message's delivery mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryMode {
    /// 1: kept in memory by the broker where it can.
    Transient,
    /// 2: written to disk by the broker.
    Persistent,
}

/// A header that is there but not what was asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Of another AMQP type.
    #[error("the header {name:?} is of type '{found}', not {expected}")]
    WrongType {
        /// The header.
        name: String,
        /// What was asked for.
        expected: &'static str,
        /// Its AMQP type code.
        found: char,
    },
    /// A long string that is not UTF-8.
    #[error("the header {name:?} is not UTF-8 text")]
    NotUtf8 {
        /// The header.
        name: String,
    },
}

/// The properties a message arrived with, read typed from the bytes
/// received (nothing is built until asked for). What is absent, or not what
/// the property may hold, reads as `None` (see the module's docs).
#[derive(Debug, Clone, Default)]
pub struct MessageProperties(Properties);

impl MessageProperties {
    pub(crate) fn new(properties: Properties) -> Self {
        MessageProperties(properties)
    }

    /// Every property as received, borrowed, for what the typed readers do
    /// not cover.
    pub fn raw(&self) -> BasicPropertiesRef<'_> {
        self.0.view()
    }

    fn text(value: Option<&[u8]>) -> Option<&str> {
        std::str::from_utf8(value?).ok()
    }

    /// `content-type`.
    pub fn content_type(&self) -> Option<&str> {
        Self::text(self.raw().content_type)
    }

    /// `content-encoding`.
    pub fn content_encoding(&self) -> Option<&str> {
        Self::text(self.raw().content_encoding)
    }

    /// `delivery-mode` (a value other than 1 or 2 reads as `None`).
    pub fn delivery_mode(&self) -> Option<DeliveryMode> {
        match self.raw().delivery_mode? {
            1 => Some(DeliveryMode::Transient),
            2 => Some(DeliveryMode::Persistent),
            _ => None,
        }
    }

    /// `priority`.
    pub fn priority(&self) -> Option<u8> {
        self.raw().priority
    }

    /// `reply-to`.
    pub fn reply_to(&self) -> Option<&str> {
        Self::text(self.raw().reply_to)
    }

    /// `expiration`, the per-message TTL it was published with: decimal
    /// digits only, as RabbitMQ accepts it (a sign, a fraction, spaces or a
    /// value over [`MAX_EXPIRATION_MS`] read as `None`).
    pub fn expiration(&self) -> Option<Duration> {
        let text = self.raw().expiration?;
        if text.is_empty() || text.len() > 20 || !text.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let ms: u64 = std::str::from_utf8(text).ok()?.parse().ok()?;
        (ms <= MAX_EXPIRATION_MS).then(|| Duration::from_millis(ms))
    }

    /// `timestamp` (past 9999-12-31, or 2^63 s and more: `None`).
    pub fn timestamp(&self) -> Option<SystemTime> {
        crate::envelope::time_of_secs(self.raw().timestamp?)
    }

    /// `type`.
    pub fn message_type(&self) -> Option<&str> {
        Self::text(self.raw().kind)
    }

    /// `user-id` (RabbitMQ checks it against the publisher's user).
    pub fn user_id(&self) -> Option<&str> {
        Self::text(self.raw().user_id)
    }

    /// `app-id`.
    pub fn app_id(&self) -> Option<&str> {
        Self::text(self.raw().app_id)
    }

    /// `correlation-id` (also the envelope's).
    pub fn correlation_id(&self) -> Option<&str> {
        Self::text(self.raw().correlation_id)
    }

    /// `message-id` as it arrived (the envelope's id is derived when there
    /// is none).
    pub fn message_id(&self) -> Option<&str> {
        Self::text(self.raw().message_id)
    }

    /// The headers other than those acemq manages (`x-acemq-*`,
    /// `traceparent`, `tracestate`): the application's, and the broker's
    /// (`x-death`, `x-delivery-count`, ...), in wire order.
    pub fn headers(&self) -> FieldTable {
        let mut out = FieldTable::new();
        let Some(headers) = self.raw().headers else {
            return out;
        };
        for (name, value) in headers.iter() {
            if is_managed_header(name) {
                continue;
            }
            if let Some(name) = acemq_codec::ShortString::from_bytes(bytes::Bytes::copy_from_slice(name)) {
                out.push(name, value.to_owned());
            }
        }
        out
    }

    /// A header's value as received (the first, should a producer have
    /// written the name twice), managed ones included.
    pub fn header(&self, name: &str) -> Option<FieldValue> {
        self.header_ref(name).map(|v| v.to_owned())
    }

    fn header_ref(&self, name: &str) -> Option<FieldValueRef<'_>> {
        self.raw()
            .headers?
            .iter()
            .find_map(|(key, value)| (key == name.as_bytes()).then_some(value))
    }

    /// A text header (`S`): `Ok(None)` when absent, an error when of
    /// another type or not UTF-8.
    pub fn header_str(&self, name: &str) -> Result<Option<&str>, HeaderError> {
        match self.header_ref(name) {
            None => Ok(None),
            Some(FieldValueRef::LongString(bytes)) => std::str::from_utf8(bytes)
                .map(Some)
                .map_err(|_| HeaderError::NotUtf8 { name: name.into() }),
            Some(other) => Err(wrong_type(name, "text", &other)),
        }
    }

    /// An integer header of any width (timestamps included, up to 2^63 −
    /// 1): `Ok(None)` when absent, an error when of another type.
    pub fn header_i64(&self, name: &str) -> Result<Option<i64>, HeaderError> {
        match self.header_ref(name) {
            None => Ok(None),
            Some(value) => value
                .as_i64()
                .map(Some)
                .ok_or_else(|| wrong_type(name, "an integer", &value)),
        }
    }

    /// A boolean header (`t`): `Ok(None)` when absent, an error when of
    /// another type.
    pub fn header_bool(&self, name: &str) -> Result<Option<bool>, HeaderError> {
        match self.header_ref(name) {
            None => Ok(None),
            Some(FieldValueRef::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(name, "a boolean", &other)),
        }
    }
}

fn wrong_type(name: &str, expected: &'static str, value: &FieldValueRef<'_>) -> HeaderError {
    HeaderError::WrongType {
        name: name.into(),
        expected,
        found: char::from(value.to_owned().type_code()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(props: BasicProperties) -> MessageProperties {
        MessageProperties::new(Properties::from(props))
    }

    #[test]
    fn what_a_send_sets_is_checked_and_written() {
        let outgoing = Outgoing::new()
            .expiration(Duration::from_millis(1500))
            .priority(9)
            .reply_to("r")
            .message_type("t")
            .app_id("a")
            .header("k", "v");
        outgoing.check().unwrap();
        let mut props = BasicProperties::default();
        Envelope::new().write_to(&mut props);
        outgoing.write_to(&mut props);
        let read = received(props);
        assert_eq!(read.expiration(), Some(Duration::from_millis(1500)));
        assert_eq!(read.raw().expiration, Some(&b"1500"[..]));
        assert_eq!(read.priority(), Some(9));
        assert_eq!(read.reply_to(), Some("r"));
        assert_eq!(read.message_type(), Some("t"));
        assert_eq!(read.app_id(), Some("a"));
        assert_eq!(read.header_str("k"), Ok(Some("v")));
        assert_eq!(read.headers().len(), 1, "the managed headers are not the user's");

        let long = "k".repeat(256);
        for (bad, what) in [
            (Outgoing::new().routing_key(long.clone()), "routing key"),
            (Outgoing::new().reply_to(long.clone()), "reply-to"),
            (Outgoing::new().message_type(long.clone()), "type"),
            (Outgoing::new().app_id(long.clone()), "app-id"),
            (Outgoing::new().header(&long, 1), "header name"),
        ] {
            assert_eq!(
                bad.check(),
                Err(PropertyError::TooLong {
                    property: what,
                    len: 256
                })
            );
        }
        assert!(Outgoing::new().routing_key("k".repeat(255)).check().is_ok());
        for managed in ["x-acemq-attempt", "x-acemq-anything", "traceparent", "tracestate"] {
            assert!(matches!(
                Outgoing::new().header(managed, "x").check(),
                Err(PropertyError::ManagedHeader { .. })
            ));
        }
        let too_long = Duration::from_millis(MAX_EXPIRATION_MS + 1);
        assert!(Outgoing::new().expiration(too_long).check().is_err());
        assert!(Outgoing::new()
            .expiration(Duration::from_millis(MAX_EXPIRATION_MS))
            .check()
            .is_ok());
    }

    #[test]
    fn hostile_properties_read_as_absent_and_headers_of_another_type_as_errors() {
        let mut headers = FieldTable::new();
        headers.insert("n", FieldValue::from("seven"));
        headers.insert("s", FieldValue::I32(7));
        headers.insert("b", FieldValue::ByteArray(vec![0xff, 0xfe].into()));
        headers.insert(
            "t",
            FieldValue::LongString(acemq_codec::LongString::from(vec![0xffu8, 0x00])),
        );
        let props = BasicProperties {
            content_type: acemq_codec::ShortString::from_bytes(vec![0xff, 0xfe].into()),
            delivery_mode: Some(7),
            expiration: Some("-5".into()),
            timestamp: Some(u64::MAX),
            headers: Some(headers),
            ..Default::default()
        };
        let read = received(props);
        assert_eq!(read.content_type(), None);
        assert_eq!(read.delivery_mode(), None);
        assert_eq!(read.expiration(), None);
        assert_eq!(read.timestamp(), None);
        assert!(matches!(
            read.header_i64("n"),
            Err(HeaderError::WrongType { found: 'S', .. })
        ));
        assert!(matches!(
            read.header_str("s"),
            Err(HeaderError::WrongType { found: 'I', .. })
        ));
        assert!(matches!(
            read.header_str("b"),
            Err(HeaderError::WrongType { found: 'x', .. })
        ));
        assert!(matches!(read.header_str("t"), Err(HeaderError::NotUtf8 { .. })));
        assert_eq!(read.header_i64("missing"), Ok(None));
        for text in ["1.5", " 10", "+3", "99999999999999999999999", "4294967296", ""] {
            let read = received(BasicProperties {
                expiration: Some(text.into()),
                ..Default::default()
            });
            assert_eq!(read.expiration(), None, "{text:?}");
        }
    }
}
