//! One hop as it is published: where an accepted message goes next (the
//! next step of its routing slip, or its `Ack::then` output to the
//! consumer's destination), which slip destinations a consumer follows
//! ([`SlipDestinations`]), and the publish itself with the hop's
//! message-id, causation, correlation and attempt. What a consumer's
//! per-delivery work (`consume/delivery.rs`) calls when a handler is done;
//! [`crate::pipeline`] builds its pipelines and routing slips on it.
//!
//! Must never: follow a slip step the consumer's [`SlipDestinations`] do not
//! allow (such a step is a fatal error of the message), or carry the
//! input's attempt, error or dead-letter history onto a hop (a hop is a new
//! message: attempt 1).

use std::time::{SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicProperties, BasicPublish, FieldArray, FieldTable, FieldValue};
use bytes::Bytes;

use crate::conn::Conn;
use crate::envelope::{
    hop_id, ATTEMPT_HEADER, CAUSATION_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, REPLAYED_HEADER,
};
use crate::error::Error;

/// Header: a routing slip's itinerary, an array of tables
/// `{exchange: S, routing-key: S}` (`A` of `F`).
pub const ROUTING_SLIP_HEADER: &str = "x-acemq-routing-slip";
/// Header: the index of the slip step this copy is for (`I`).
pub const ROUTING_SLIP_STEP_HEADER: &str = "x-acemq-routing-slip-step";

/// Which routing slip destinations a consumer forwards to: given to
/// [`crate::ConsumerBuilder::routing_slips`]. A slip is written by whoever
/// published the message, so a consumer follows one only when built to, and
/// only to the destinations this accepts; a step it refuses is a fatal error
/// of that message, which goes to the dead letters with the reason.
///
/// A closure over `(exchange, routing_key)` is one; [`crate::pipeline::SlipAllowList`] is a
/// list of them.
///
/// ```no_run
/// # async fn demo(conn: acemq_core::Conn) -> Result<(), acemq_core::Error> {
/// use acemq_core::{consume, pipeline::SlipAllowList, Ack, Message};
/// let check = consume(&conn, "orders.check", |_: Message<serde_json::Value>| async { Ack::accept() })
///     .routing_slips(SlipAllowList::new().queue("orders.reserve").exchange("billing"))
///     .await?;
/// let any_orders_queue = consume(&conn, "orders.reserve", |_: Message<serde_json::Value>| async { Ack::accept() })
///     .routing_slips(|exchange: &str, key: &str| exchange.is_empty() && key.starts_with("orders."))
///     .await?;
/// # Ok(()) }
/// ```
pub trait SlipDestinations: Send + Sync + 'static {
    /// Whether a slip may send a message to `exchange` with `routing_key`
    /// (the default exchange is `""`, its key the queue's name).
    fn allows(&self, exchange: &str, routing_key: &str) -> bool;
}

impl<F> SlipDestinations for F
where
    F: Fn(&str, &str) -> bool + Send + Sync + 'static,
{
    fn allows(&self, exchange: &str, routing_key: &str) -> bool {
        self(exchange, routing_key)
    }
}

/// Where a hop publishes: an exchange and routing key, and whether the
/// broker writes it to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Destination {
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) persistent: bool,
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether a message carries a routing slip, from the headers its envelope
/// kept (every one it does not manage).
pub(crate) fn has_slip_in(headers: &FieldTable) -> bool {
    headers.contains_key(ROUTING_SLIP_HEADER)
}

/// The slip of a message and the step it is at, if it has one.
fn slip_of(properties: &BasicProperties) -> Option<(&FieldArray, usize)> {
    let headers = properties.headers.as_ref()?;
    let steps = headers.get(ROUTING_SLIP_HEADER)?.as_array()?;
    let at = headers
        .get(ROUTING_SLIP_STEP_HEADER)
        .and_then(FieldValue::as_i64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    Some((steps, at))
}

/// A hop about to be published.
pub(crate) struct Hop {
    destination: Destination,
    /// The output's body, or `None` to send the input's on.
    pub(crate) body: Option<Bytes>,
    content_type: Option<String>,
    message_id: String,
    input_id: String,
    /// The slip step the copy is for, if it travels on a slip.
    slip_step: Option<usize>,
}

/// Where an accepted message goes next: the next step of its slip (with
/// `output` if the handler gave one), or `output` to the consumer's
/// `.then` destination. `None` at the end of a slip with nothing to send.
///
/// The slip is read only when `slips` is given (the consumer opted in), and
/// a step `slips` does not allow is a fatal error of the message.
pub(crate) fn next_hop(
    properties: &BasicProperties,
    input_id: &str,
    then: Option<&Destination>,
    output: Option<(Bytes, String)>,
    slips: Option<&dyn SlipDestinations>,
) -> Result<Option<Hop>, crate::ack::Fatal> {
    let (body, content_type) = match output {
        Some((body, content_type)) => (Some(body), Some(content_type)),
        None => (None, None),
    };
    if let Some(((steps, at), allow)) = slips.and_then(|allow| Some((slip_of(properties)?, allow))) {
        let next = at.saturating_add(1);
        let Some(step) = steps.0.get(next) else {
            return Ok(None);
        };
        let table = step.as_table();
        let field = |key: &str| {
            table
                .and_then(|t| t.get(key))
                .and_then(FieldValue::as_str)
                .map(str::to_string)
        };
        let (Some(exchange), Some(routing_key)) = (field("exchange"), field("routing-key")) else {
            return Err(crate::fatal(format!(
                "routing slip step {next} has no exchange and routing-key"
            )));
        };
        if !allow.allows(&exchange, &routing_key) {
            return Err(crate::fatal(format!(
                "routing slip step {next} names exchange {exchange:?} with key {routing_key:?}, \
                 which this consumer's routing_slips do not allow"
            )));
        }
        return Ok(Some(Hop {
            destination: Destination {
                exchange,
                routing_key,
                persistent: properties.delivery_mode != Some(1),
            },
            body,
            content_type,
            message_id: hop_id(input_id, &format!("slip:{next}")),
            input_id: input_id.to_string(),
            slip_step: Some(next),
        }));
    }
    match (then, body) {
        (Some(destination), Some(body)) => Ok(Some(Hop {
            message_id: hop_id(
                input_id,
                &format!("then:{}/{}", destination.exchange, destination.routing_key),
            ),
            destination: destination.clone(),
            body: Some(body),
            content_type,
            input_id: input_id.to_string(),
            slip_step: None,
        })),
        (None, Some(_)) => Err(crate::fatal(
            "the handler returned Ack::then but the consumer has no .then(...) destination",
        )),
        (_, None) => Ok(None),
    }
}

impl Hop {
    /// Publishes it (mandatory, confirmed on the library channel).
    pub(crate) async fn publish(&self, conn: &Conn, input: &BasicProperties, body: Bytes) -> Result<(), Error> {
        let mut headers = FieldTable::new();
        // A slip copy keeps the application's headers and its slip; an
        // output of `then` is a new message with only the envelope's.
        if let Some(step) = self.slip_step {
            for (key, value) in input.headers.iter().flat_map(FieldTable::iter) {
                let name = key.as_bytes();
                let managed = [
                    ATTEMPT_HEADER,
                    FIRST_SEEN_HEADER,
                    CAUSATION_HEADER,
                    ERROR_HEADER,
                    ORIGINAL_EXCHANGE_HEADER,
                    ORIGINAL_ROUTING_KEY_HEADER,
                    REPLAYED_HEADER,
                    ROUTING_SLIP_STEP_HEADER,
                ]
                .iter()
                .any(|h| h.as_bytes() == name)
                    || name == b"x-death"
                    || name == b"x-delivery-count"
                    || name.starts_with(b"x-first-death-")
                    || name.starts_with(b"x-last-death-");
                if !managed {
                    headers.push(key.clone(), value.clone());
                }
            }
            headers.insert(
                ROUTING_SLIP_STEP_HEADER,
                FieldValue::I32(i32::try_from(step).unwrap_or(i32::MAX)),
            );
        }
        headers.insert(ATTEMPT_HEADER, FieldValue::I32(1));
        headers.insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(now_secs()));
        headers.insert(CAUSATION_HEADER, FieldValue::from(self.input_id.as_str()));
        let properties = BasicProperties {
            content_type: self
                .content_type
                .as_deref()
                .map(Into::into)
                .or_else(|| input.content_type.clone()),
            delivery_mode: Some(if self.destination.persistent { 2 } else { 1 }),
            timestamp: Some(now_secs()),
            message_id: Some(self.message_id.as_str().into()),
            correlation_id: input.correlation_id.clone(),
            headers: Some(headers),
            ..Default::default()
        };
        let publish = BasicPublish {
            exchange: self.destination.exchange.as_str().into(),
            routing_key: self.destination.routing_key.as_str().into(),
            mandatory: true,
            ..Default::default()
        };
        conn.publish_library(publish, properties, body, &self.message_id)
            .await
            .map(|_| ())
    }
}
