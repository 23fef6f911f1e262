//! The envelope: what travels with every message besides its payload, and
//! how it is written into (and read back from) AMQP properties and headers.
//! The names and types here are a contract with other services (`docs/wire-contract.md`).
//!
//! Reading never fails and never panics: whatever another producer wrote, a
//! value of the wrong type or out of range (an attempt that is not a
//! positive 32-bit integer, a time no clock can hold) is read as if it were
//! not there.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicProperties, BasicPropertiesRef, FieldTable, FieldValue, FieldValueRef, ShortString};
use bytes::Bytes;

/// Header: the attempt number, 1 on first publish (`I`).
pub const ATTEMPT_HEADER: &str = "x-acemq-attempt";
/// Header: when the message was first published, seconds (`T`), set once.
pub const FIRST_SEEN_HEADER: &str = "x-acemq-first-seen";
/// Header: the id of the message that caused this one (`S`).
pub const CAUSATION_HEADER: &str = "x-acemq-causation-id";
/// Header: why a message was given up on, on `.dlq` and `.parked` (`S`).
pub const ERROR_HEADER: &str = "x-acemq-error";
/// Header: how often a message was replayed from a dlq or parked queue (`I`).
pub const REPLAYED_HEADER: &str = "x-acemq-replayed";
/// Header: the exchange a set-aside message was first published to (`S`).
pub const ORIGINAL_EXCHANGE_HEADER: &str = "x-acemq-original-exchange";
/// Header: the routing key a set-aside message was first published with (`S`).
pub const ORIGINAL_ROUTING_KEY_HEADER: &str = "x-acemq-original-routing-key";
/// Header: the queue a set-aside message was consumed from, written by the
/// consumer that set it aside (`S`); where a replay sends it by default.
pub const SOURCE_QUEUE_HEADER: &str = "x-acemq-source-queue";

/// What travels with every message besides its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// The `message-id` property: a UUID, stable across every retry and redelivery.
    pub id: String,
    /// Which attempt this is: 1 on first publish.
    pub attempt: u32,
    /// When the message was first published (whole seconds).
    pub first_seen: SystemTime,
    /// The `correlation-id` property.
    pub correlation_id: Option<String>,
    /// The id of the message that caused this one.
    pub causation_id: Option<String>,
    /// Other application headers (the `x-acemq-*` ones are managed here and
    /// not repeated in this table).
    pub headers: FieldTable,
}

impl Default for Envelope {
    fn default() -> Self {
        Envelope::new()
    }
}

impl Envelope {
    /// A new message: a fresh id, attempt 1, first seen now.
    pub fn new() -> Self {
        Envelope {
            id: new_id(),
            attempt: 1,
            first_seen: whole_seconds(SystemTime::now()),
            correlation_id: None,
            causation_id: None,
            headers: FieldTable::new(),
        }
    }

    /// The same envelope with a correlation id.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// The same envelope with a causation id.
    pub fn with_causation_id(mut self, id: impl Into<String>) -> Self {
        self.causation_id = Some(id.into());
        self
    }

    /// A new message caused by this one: fresh id, attempt 1, first seen
    /// now, same correlation, causation = this message's id.
    pub fn caused(&self) -> Envelope {
        Envelope {
            correlation_id: self.correlation_id.clone(),
            causation_id: Some(self.id.clone()),
            ..Envelope::new()
        }
    }

    /// Writes the envelope into `properties`: `message-id`,
    /// `correlation-id`, and the `x-acemq-*` headers with the types of
    /// the wire contract (`I`, `T`, `S`).
    pub fn write_to(&self, properties: &mut BasicProperties) {
        properties.message_id = Some(self.id.as_str().into());
        properties.correlation_id = self.correlation_id.as_deref().map(ShortString::from);
        let attempt = FieldValue::I32(i32::try_from(self.attempt).unwrap_or(i32::MAX));
        let first_seen = FieldValue::Timestamp(unix_seconds(self.first_seen));
        let causation = self.causation_id.as_deref().map(FieldValue::from);
        if self.headers.is_empty() {
            // A new message's: the managed headers alone, in a table made
            // at its size (none of them can be there already).
            let managed = [
                Some((ATTEMPT_HEADER, attempt)),
                Some((FIRST_SEEN_HEADER, first_seen)),
                causation.map(|causation| (CAUSATION_HEADER, causation)),
            ];
            properties.headers = Some(managed.into_iter().flatten().collect());
            return;
        }
        let mut headers = self.headers.clone();
        for managed in [ATTEMPT_HEADER, FIRST_SEEN_HEADER, CAUSATION_HEADER] {
            headers.remove(managed);
        }
        headers.insert(ATTEMPT_HEADER, attempt);
        headers.insert(FIRST_SEEN_HEADER, first_seen);
        if let Some(causation) = causation {
            headers.insert(CAUSATION_HEADER, causation);
        }
        properties.headers = Some(headers);
    }

    /// Reads the envelope of a received message. Like
    /// [`Envelope::read_from`], except that what is missing is made stable,
    /// so that every redelivery and retry of a message from another
    /// publisher reads the same: without a `message-id`, the id is derived
    /// from the message itself (a name-based UUID of its body and of the
    /// properties a broker never changes: content-type, correlation-id,
    /// timestamp, type and app-id; two such messages alike in all of these
    /// share an id), and without `x-acemq-first-seen`, first seen is the
    /// `timestamp` property when there is one.
    pub fn read_from_message(properties: &BasicProperties, body: &[u8]) -> Envelope {
        Envelope::read_from_message_view(&properties.view(), body)
    }

    /// [`Envelope::read_from_message`] over properties as received, read
    /// straight from their bytes (see [`acemq_codec::Properties::view`]),
    /// building nothing but the envelope.
    pub fn read_from_message_view(properties: &BasicPropertiesRef<'_>, body: &[u8]) -> Envelope {
        let (mut envelope, has_first_seen) = Envelope::read_view(properties);
        if properties.message_id.is_none() {
            envelope.id = derived_id(properties, body);
        }
        if let (false, Some(timestamp)) = (has_first_seen, properties.timestamp.and_then(time_of_secs)) {
            envelope.first_seen = timestamp;
        }
        envelope
    }

    /// The id [`Envelope::read_from_message_view`] gives a message: its
    /// `message-id`, or without one the id derived from the message.
    pub(crate) fn id_of(properties: &BasicPropertiesRef<'_>, body: &[u8]) -> String {
        match properties.message_id {
            Some(id) => crate::text::owned_lossy(id),
            None => derived_id(properties, body),
        }
    }

    /// Reads an envelope back from properties. Integers of every width are
    /// accepted; what is missing gets the value a first publish would have
    /// (attempt 1, first seen now, a fresh id if there is no `message-id`),
    /// and so does what is of another type or out of range: an attempt
    /// outside 1..=2^31−1, a first seen that is negative or after
    /// 9999-12-31T23:59:59Z, a causation id that is not a string.
    pub fn read_from(properties: &BasicProperties) -> Envelope {
        Envelope::read_from_view(&properties.view())
    }

    /// [`Envelope::read_from`] over borrowed properties.
    pub fn read_from_view(properties: &BasicPropertiesRef<'_>) -> Envelope {
        Envelope::read_view(properties).0
    }

    /// [`Envelope::read_from_view`], and whether `x-acemq-first-seen` was
    /// there and readable (the envelope's `first_seen` is now without it).
    fn read_view(properties: &BasicPropertiesRef<'_>) -> (Envelope, bool) {
        // One pass: the first of each managed header is read, every copy of
        // them left out, and the rest kept in order (no table is made when
        // there is nothing else in it).
        let (mut attempt, mut first_seen, mut causation) = (None, None, None);
        let mut headers = FieldTable::new();
        for (key, value) in properties.headers.iter().flat_map(|h| h.iter()) {
            let slot = match key {
                k if k == ATTEMPT_HEADER.as_bytes() => &mut attempt,
                k if k == FIRST_SEEN_HEADER.as_bytes() => &mut first_seen,
                k if k == CAUSATION_HEADER.as_bytes() => &mut causation,
                _ => {
                    // A validated table's keys are short strings.
                    if let Some(key) = ShortString::from_bytes(Bytes::copy_from_slice(key)) {
                        headers.push(key, value.to_owned());
                    }
                    continue;
                }
            };
            slot.get_or_insert(value);
        }
        let attempt = attempt.and_then(|v| attempt_of(v.as_i64())).unwrap_or(1);
        let first_seen = first_seen.and_then(|v| time_of(v.as_i64()));
        let has_first_seen = first_seen.is_some();
        let first_seen = first_seen.unwrap_or_else(|| whole_seconds(SystemTime::now()));
        let causation_id = causation.and_then(|v| match v {
            FieldValueRef::LongString(s) => Some(crate::text::owned_lossy(s)),
            _ => None,
        });
        let envelope = Envelope {
            id: properties
                .message_id
                .map(crate::text::owned_lossy)
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            attempt,
            first_seen,
            correlation_id: properties.correlation_id.map(crate::text::owned_lossy),
            causation_id,
            headers,
        };
        (envelope, has_first_seen)
    }
}

/// The last second a time read from a message may name:
/// 9999-12-31T23:59:59Z. Later ones (a `timestamp` of 2^63 or more among
/// them, which no `SystemTime` can hold) are out of range.
pub(crate) const LATEST_READABLE_SECOND: u64 = 253_402_300_799;

/// The time `secs` seconds after the epoch, or `None` past
/// [`LATEST_READABLE_SECOND`].
pub(crate) fn time_of_secs(secs: u64) -> Option<SystemTime> {
    if secs > LATEST_READABLE_SECOND {
        return None;
    }
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// A time header's value (an integer of any width or a timestamp, in
/// seconds), or `None` when it is not one or is out of range.
pub(crate) fn time_of(secs: Option<i64>) -> Option<SystemTime> {
    time_of_secs(u64::try_from(secs?).ok()?)
}

/// An attempt header's value: an integer of any width from 1 to 2^31−1
/// (what the contract's `I` holds), or `None`.
pub(crate) fn attempt_of(n: Option<i64>) -> Option<u32> {
    let n = u32::try_from(n?).ok()?;
    (1..=i32::MAX as u32).contains(&n).then_some(n)
}

/// The namespace of derived ids (a fixed, random UUID).
const DERIVED_ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5b0e_4c1f_9a63_4d2e_8f1c_2a7e_6d30_b9a4);

/// The message-id of what a hop publishes for the input `input_id`: a
/// version-5 UUID of the input's id and the hop's name, so a
/// redelivered input yields the same output id and a downstream handler
/// that dedupes on [`Envelope::id`] sees one output.
pub fn hop_id(input_id: &str, hop: &str) -> String {
    let mut name = Vec::with_capacity(input_id.len() + hop.len() + 1);
    name.extend_from_slice(input_id.as_bytes());
    name.push(0);
    name.extend_from_slice(hop.as_bytes());
    uuid::Uuid::new_v5(&DERIVED_ID_NAMESPACE, &name).to_string()
}

/// The id of a message that came without one: a version-5 UUID of the
/// fields that travel unchanged with every copy of it.
fn derived_id(properties: &BasicPropertiesRef<'_>, body: &[u8]) -> String {
    let mut name = Vec::with_capacity(body.len() + 128);
    let mut field = |bytes: &[u8]| {
        name.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        name.extend_from_slice(bytes);
    };
    field(properties.content_type.unwrap_or_default());
    field(properties.correlation_id.unwrap_or_default());
    field(&properties.timestamp.map(u64::to_be_bytes).unwrap_or_default());
    field(properties.kind.unwrap_or_default());
    field(properties.app_id.unwrap_or_default());
    field(body);
    uuid::Uuid::new_v5(&DERIVED_ID_NAMESPACE, &name).to_string()
}

/// A fresh message id: a random UUID in its hyphenated lower-case form.
fn new_id() -> String {
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text).to_owned()
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn whole_seconds(t: SystemTime) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix_seconds(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_is_written_with_the_contracts_header_types() {
        let envelope = Envelope::new().with_correlation_id("corr").with_causation_id("cause");
        let mut props = BasicProperties::default();
        envelope.write_to(&mut props);
        let headers = props.headers.as_ref().unwrap();
        assert_eq!(headers.get(ATTEMPT_HEADER), Some(&FieldValue::I32(1)));
        assert!(matches!(headers.get(FIRST_SEEN_HEADER), Some(FieldValue::Timestamp(_))));
        assert_eq!(headers.get(CAUSATION_HEADER), Some(&FieldValue::from("cause")));
        assert_eq!(props.message_id.as_ref().unwrap(), envelope.id.as_str());
        assert_eq!(props.correlation_id.as_ref().unwrap(), "corr");
        assert_eq!(Envelope::read_from(&props), envelope);
    }

    #[test]
    fn reading_accepts_every_integer_width() {
        for attempt in [
            FieldValue::I8(3),
            FieldValue::U8(3),
            FieldValue::I16(3),
            FieldValue::U16(3),
            FieldValue::I32(3),
            FieldValue::U32(3),
            FieldValue::I64(3),
            FieldValue::I64L(3),
        ] {
            let mut headers = FieldTable::new();
            headers.insert(ATTEMPT_HEADER, attempt.clone());
            headers.insert(FIRST_SEEN_HEADER, FieldValue::I64(1_700_000_000));
            let props = BasicProperties {
                headers: Some(headers),
                ..Default::default()
            };
            let envelope = Envelope::read_from(&props);
            assert_eq!(envelope.attempt, 3, "{attempt:?}");
            assert_eq!(envelope.first_seen, UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        }
    }

    #[test]
    fn a_message_without_an_id_reads_with_the_same_id_every_time() {
        let props = BasicProperties {
            timestamp: Some(1_700_000_000),
            content_type: Some("application/json".into()),
            ..Default::default()
        };
        let first = Envelope::read_from_message(&props, b"{\"n\":1}");
        let again = Envelope::read_from_message(&props, b"{\"n\":1}");
        assert_eq!(first.id, again.id);
        assert!(uuid::Uuid::parse_str(&first.id).is_ok());
        assert_eq!(first.first_seen, UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        let other = Envelope::read_from_message(&props, b"{\"n\":2}");
        assert_ne!(first.id, other.id, "another body is another message");
        let with_id = BasicProperties {
            message_id: Some("given".into()),
            ..props.clone()
        };
        assert_eq!(Envelope::read_from_message(&with_id, b"x").id, "given");
        // What the consumer's republishing paths read the id with.
        for (props, body) in [(&props, &b"{\"n\":1}"[..]), (&with_id, b"x")] {
            let read = Envelope::read_from_message(props, body).id;
            assert_eq!(Envelope::id_of(&props.view(), body), read);
        }
    }

    #[test]
    fn values_of_another_type_or_out_of_range_read_as_absent() {
        let first_seen = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        for (attempt, seen) in [
            (FieldValue::from("three"), FieldValue::from("yesterday")),
            (FieldValue::I32(-4), FieldValue::I64(-1)),
            (FieldValue::I64(i64::MAX), FieldValue::Timestamp(u64::MAX)),
            (FieldValue::U32(u32::MAX), FieldValue::Timestamp((1 << 63) + 1)),
            (FieldValue::I32(0), FieldValue::Timestamp(LATEST_READABLE_SECOND + 1)),
        ] {
            let mut headers = FieldTable::new();
            headers.insert(ATTEMPT_HEADER, attempt.clone());
            headers.insert(FIRST_SEEN_HEADER, seen.clone());
            headers.insert(CAUSATION_HEADER, FieldValue::I32(7));
            let props = BasicProperties {
                headers: Some(headers),
                timestamp: Some(1_700_000_000),
                ..Default::default()
            };
            let envelope = Envelope::read_from_message(&props, b"{}");
            assert_eq!(envelope.attempt, 1, "{attempt:?}");
            assert_eq!(
                envelope.first_seen, first_seen,
                "{seen:?}: the timestamp property instead"
            );
            assert_eq!(envelope.causation_id, None);
        }
        for timestamp in [1 << 63, (1 << 63) + 1, u64::MAX, LATEST_READABLE_SECOND + 1] {
            let props = BasicProperties {
                timestamp: Some(timestamp),
                ..Default::default()
            };
            let before = whole_seconds(SystemTime::now());
            let envelope = Envelope::read_from_message(&props, b"{}");
            assert!(
                envelope.first_seen >= before,
                "{timestamp}: read as absent, first seen now"
            );
        }
        let last = UNIX_EPOCH + Duration::from_secs(LATEST_READABLE_SECOND);
        assert_eq!(time_of_secs(LATEST_READABLE_SECOND), Some(last));
        assert_eq!(attempt_of(Some(i64::from(i32::MAX))), Some(i32::MAX as u32));
    }

    #[test]
    fn a_message_from_elsewhere_reads_as_a_first_attempt() {
        let envelope = Envelope::read_from(&BasicProperties::default());
        assert_eq!(envelope.attempt, 1);
        assert!(uuid::Uuid::parse_str(&envelope.id).is_ok());
    }
}
