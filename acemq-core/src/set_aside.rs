//! The consumer's own publishes of a delivery it holds (a set-aside to
//! `.dlq` or `.parked`, a retry back to the queue, a hop to a rung), made so
//! that a failure never turns into a hot loop nor loses the message.
//!
//! Must never: hand the delivery back to the broker because such a publish
//! failed (the broker would deliver it again at once, and round it would go,
//! costing both sides a core); drop the message; or publish something the
//! wire cannot carry.
//!
//! - A publish that comes back NO_ROUTE (its queue was deleted behind the
//!   consumer's back) has its queue declared again, exactly as the consumer
//!   declared it at start, and is tried again.
//! - Any other failure (a nack, a block, a lost connection) is tried again
//!   after a capped backoff while the delivery is held (and keeps its
//!   prefetch slot). Only a consumer that is closing, or a delivery whose
//!   connection is gone (the broker hands it out again anyway), stops trying.
//! - Every failure is logged and counted in
//!   [`crate::metrics_names::SET_ASIDE_FAILED_TOTAL`] by its reason.
//! - The copy is made to fit `frame_max` before it is written (see
//!   [`fit_frame`]): what gives way first is the error text, then the
//!   broker's dead-letter history, then the largest other headers, whose
//!   names the error text then lists. The body is never touched.

use std::time::Duration;

use acemq_codec::{BasicProperties, BasicPublish, FieldValue, FRAME_OVERHEAD};
use bytes::{Bytes, BytesMut};
use tokio::sync::watch;

use crate::amqp::Delivery;
use crate::conn::Conn;
use crate::declaration::Declaration;
use crate::envelope::{
    ATTEMPT_HEADER, CAUSATION_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, REPLAYED_HEADER, SOURCE_QUEUE_HEADER,
};
use crate::error::Error;

/// The first wait before a failed publish is tried again; each further one
/// waits twice as long, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two tries of a held publish.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What a held publish does when it comes back NO_ROUTE.
pub(crate) enum OnNoRoute<'a> {
    /// Declares these again (as the consumer did at start), then tries again.
    Declare(&'a [Declaration]),
    /// Declares these again for the messages after it, and returns the
    /// error: the caller has another way (a rung's wait spent in the
    /// process instead).
    DeclareAndReturn(&'a [Declaration]),
    /// Nothing to declare (a queue the consumer must not declare, an
    /// exchange of the service's own): tried again after the backoff.
    Wait,
}

/// The label of a failed library publish in
/// `acemq_set_aside_failed_total{reason}`.
pub(crate) fn reason_of(err: &Error) -> &'static str {
    match err {
        Error::Unroutable { .. } => "no_route",
        Error::Nacked { .. } => "nacked",
        Error::PublishingPaused { .. } | Error::ConnectionBlocked { .. } => "blocked",
        Error::ConnectionLost { .. } | Error::Closed(_) | Error::Io(_) | Error::RecoveryGaveUp { .. } => "connection",
        Error::Engine(crate::amqp::Error::Command(crate::amqp::CommandError::Encode(_))) => "too_large",
        _ => "other",
    }
}

/// Counts and logs one failed publish of a held delivery.
pub(crate) fn count_failure(err: &Error, exchange: &str, routing_key: &str, message_id: &str) {
    let reason = reason_of(err);
    metrics::counter!(crate::metrics_names::SET_ASIDE_FAILED_TOTAL, "reason" => reason).increment(1);
    tracing::warn!(%err, reason, exchange, routing_key, message_id, "a set-aside or retry publish failed; the delivery is held and it is tried again");
}

/// Publishes a copy of the held `delivery` (mandatory, confirmed on the
/// library channel) until the broker has it, as the module docs say.
/// Returns an error only when trying again is pointless: the consumer is
/// closing, the delivery's connection is gone, or `on_no_route` says so.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn publish_held(
    conn: &Conn,
    delivery: &Delivery,
    shutdown: &watch::Receiver<bool>,
    publish: BasicPublish,
    mut properties: BasicProperties,
    body: Bytes,
    message_id: &str,
    on_no_route: OnNoRoute<'_>,
) -> Result<(), Error> {
    let frame_max = conn.publishing_connection().tuned().frame_max;
    fit_frame(&mut properties, frame_max);
    let mut backoff = BACKOFF_FIRST;
    let mut declared_again = false;
    loop {
        let sent = conn
            .publish_library(publish.clone(), properties.clone(), body.clone(), message_id)
            .await;
        let err = match sent {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        count_failure(
            &err,
            &publish.exchange.to_string_lossy(),
            &publish.routing_key.to_string_lossy(),
            message_id,
        );
        if matches!(err, Error::Unroutable { .. }) {
            match on_no_route {
                OnNoRoute::Declare(declarations) => {
                    if declare_again(conn, declarations).await && !declared_again {
                        // Straight away, once: the queue is there now.
                        declared_again = true;
                        continue;
                    }
                }
                OnNoRoute::DeclareAndReturn(declarations) => {
                    declare_again(conn, declarations).await;
                    return Err(err);
                }
                OnNoRoute::Wait => {}
            }
        }
        if *shutdown.borrow() || delivery.acker.connection_gone() {
            return Err(err);
        }
        let mut closing = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = closing.wait_for(|stop| *stop) => return Err(err),
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Declares `declarations` again, as the consumer did at start, and records
/// them for recovery; whether it worked.
async fn declare_again(conn: &Conn, declarations: &[Declaration]) -> bool {
    match crate::topology::apply(conn, declarations).await {
        Ok(()) => {
            conn.record_declarations(declarations);
            tracing::warn!(
                ?declarations,
                "a set-aside or rung queue was missing; declared it again"
            );
            true
        }
        Err(err) => {
            tracing::error!(%err, ?declarations, "could not declare a missing set-aside or rung queue again");
            false
        }
    }
}

/// The error text kept at least when the copy has to shrink, in bytes.
const ERROR_KEPT: usize = 256;
/// Room left for the note naming the headers dropped, in bytes.
const NOTE_ROOM: usize = 512;

/// The size of the content header frame `properties` make.
fn header_frame_size(properties: &BasicProperties) -> usize {
    let mut buf = BytesMut::new();
    // A value the wire cannot carry at all (a table over 4 GiB) counts as
    // too large; the encode of the publish says what is wrong with it.
    if properties.encode(&mut buf).is_err() {
        return usize::MAX;
    }
    // Class, weight and body size, then the properties, in the envelope.
    FRAME_OVERHEAD + 12 + buf.len()
}

/// Headers the envelope manages: never dropped to make room.
fn is_envelope_header(name: &[u8]) -> bool {
    [
        ATTEMPT_HEADER,
        FIRST_SEEN_HEADER,
        CAUSATION_HEADER,
        ERROR_HEADER,
        ORIGINAL_EXCHANGE_HEADER,
        ORIGINAL_ROUTING_KEY_HEADER,
        REPLAYED_HEADER,
        SOURCE_QUEUE_HEADER,
    ]
    .iter()
    .any(|h| h.as_bytes() == name)
}

/// The broker's dead-letter history, which the set-aside copy can do without.
fn is_death_history(name: &[u8]) -> bool {
    name == b"x-death" || name.starts_with(b"x-first-death-") || name.starts_with(b"x-last-death-")
}

/// Makes `properties` fit one content header frame of `frame_max` bytes (0:
/// no limit), as the module docs say: the `x-acemq-error` text is cut
/// first (down to [`ERROR_KEPT`] bytes); if that is not enough, the broker's
/// `x-death` history goes, then the largest other headers one by one (never
/// the envelope's own), and the error text ends with their names. Returns
/// the names of the headers dropped.
pub(crate) fn fit_frame(properties: &mut BasicProperties, frame_max: u32) -> Vec<String> {
    let limit = frame_max as usize;
    if limit == 0 || header_frame_size(properties) <= limit {
        return Vec::new();
    }
    let error = |p: &BasicProperties| {
        p.headers
            .as_ref()
            .and_then(|h| h.get(ERROR_HEADER))
            .and_then(FieldValue::as_str)
            .map(str::to_string)
    };
    // 1. The error text gives way first.
    if let Some(text) = error(properties) {
        let over = header_frame_size(properties).saturating_sub(limit);
        let keep = text.len().saturating_sub(over + "…".len()).max(ERROR_KEPT);
        set_error(properties, &text, keep, "");
        if header_frame_size(properties) <= limit {
            return Vec::new();
        }
    }
    // 2. Then the broker's history, then the largest other headers, until
    //    the copy fits with room for the note.
    let mut dropped = Vec::new();
    let room = limit.saturating_sub(NOTE_ROOM);
    while header_frame_size(properties) > room {
        let Some(headers) = properties.headers.as_mut() else {
            break;
        };
        let history = headers
            .iter()
            .map(|(k, _)| k)
            .find(|k| is_death_history(k.as_bytes()))
            .cloned();
        let victim = history.or_else(|| {
            headers
                .iter()
                .filter(|(k, _)| !is_envelope_header(k.as_bytes()))
                .max_by_key(|(k, v)| {
                    let mut buf = BytesMut::new();
                    let _ = v.encode(&mut buf);
                    k.as_bytes().len() + buf.len()
                })
                .map(|(k, _)| k.clone())
        });
        let Some(victim) = victim else {
            break;
        };
        let name = victim.to_string_lossy().into_owned();
        headers.remove(&name);
        dropped.push(name);
    }
    if !dropped.is_empty() {
        let text = error(properties).unwrap_or_default();
        let mut note = format!(
            " [headers dropped to fit frame_max {frame_max}: {}]",
            dropped.join(", ")
        );
        if note.len() > NOTE_ROOM - 16 {
            note = format!("{}…]", crate::text::prefix_within(&note, NOTE_ROOM - 16 - "…]".len()));
        }
        set_error(properties, &text, ERROR_KEPT, &note);
    }
    dropped
}

/// Writes `x-acemq-error` as at most `keep` bytes of `text` (marked cut
/// when it is), then `note`.
fn set_error(properties: &mut BasicProperties, text: &str, keep: usize, note: &str) {
    let kept = crate::text::prefix_within(text, keep);
    let cut = if kept.len() < text.len() { "…" } else { "" };
    let value = format!("{kept}{cut}{note}");
    properties
        .headers
        .get_or_insert_with(Default::default)
        .insert(ERROR_HEADER, FieldValue::from(value));
}

#[cfg(test)]
mod tests {
    use super::*;
    use acemq_codec::FieldTable;

    fn with_headers(pairs: &[(&str, usize)], error: usize) -> BasicProperties {
        let mut headers = FieldTable::new();
        for (name, size) in pairs {
            headers.insert(*name, FieldValue::from("h".repeat(*size)));
        }
        headers.insert(ATTEMPT_HEADER, FieldValue::I32(3));
        headers.insert(ERROR_HEADER, FieldValue::from("e".repeat(error)));
        BasicProperties {
            message_id: Some("m-1".into()),
            headers: Some(headers),
            ..Default::default()
        }
    }

    fn error_of(p: &BasicProperties) -> String {
        p.headers
            .as_ref()
            .unwrap()
            .get(ERROR_HEADER)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn a_copy_that_fits_is_left_alone() {
        let mut p = with_headers(&[("app", 100)], 1000);
        let before = p.clone();
        assert!(fit_frame(&mut p, 8192).is_empty());
        assert_eq!(p, before);
        assert!(fit_frame(&mut p, 0).is_empty(), "0 is no limit");
    }

    #[test]
    fn the_error_text_gives_way_first() {
        let mut p = with_headers(&[("app", 6000)], 4000);
        assert!(fit_frame(&mut p, 8192).is_empty());
        assert!(header_frame_size(&p) <= 8192);
        let error = error_of(&p);
        assert!(error.ends_with('…') && error.len() < 4000, "{}", error.len());
        assert_eq!(
            p.headers.as_ref().unwrap().get("app").unwrap().as_str().unwrap().len(),
            6000
        );
    }

    #[test]
    fn then_the_death_history_then_the_largest_headers_named_in_the_error() {
        let mut p = with_headers(&[("small", 10), ("big", 7500), ("x-death", 3000)], 4000);
        let dropped = fit_frame(&mut p, 8192);
        assert_eq!(dropped, ["x-death", "big"]);
        assert!(header_frame_size(&p) <= 8192);
        let headers = p.headers.as_ref().unwrap();
        assert!(headers.contains_key("small") && headers.contains_key(ATTEMPT_HEADER));
        assert!(error_of(&p).ends_with("[headers dropped to fit frame_max 8192: x-death, big]"));
    }
}
