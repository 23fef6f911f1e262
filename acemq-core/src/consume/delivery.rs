//! One delivery of a consumer, from its arrival to its outcome: a stream
//! consumer notes its offset, the properties and the body are decoded (or
//! the message is set aside as undecodable), a handler slot is taken (or
//! the message is handed back when the consumer is closing), the handler
//! runs (a panic is a retry), and its verdict is carried out: an ack, a hop
//! ([`crate::hop`]) then the ack, or a republish (a retry, a rung, a
//! set-aside to `.dlq` or `.parked`, held as [`crate::set_aside`] says) then
//! the ack. It ends in [`super::outcome`], which settles the delivery and
//! names how it ended.
//!
//! Every delivery runs in its own task: it decodes, waits for a handler slot
//! (`concurrency`), runs the handler, and carries out what the handler and
//! the retry policy decided. (On a current-thread runtime the work starts in
//! the consumer's loop and becomes a task only if it has to wait.) A wait
//! spent in the process holds the delivery (and its prefetch slot) but not
//! a handler slot.
//!
//! Must never: ack a delivery before the broker has confirmed the copy a
//! republish or a hop made of it; hand a delivery back because such a
//! publish failed (that is [`crate::set_aside`]'s to try again); or let a
//! handler's panic reach the consumer task.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use acemq_codec::{BasicProperties, BasicPropertiesRef, BasicPublish, FieldTable, FieldValue, ShortString};
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::outcome::{ack, requeue, Outcome};
use super::{Message, MAX_ERROR_TEXT};
use crate::ack::{Ack, BoxError};
use crate::amqp::Delivery;
use crate::codec::Codec;
use crate::conn::Conn;
use crate::conn::{lock, ConsumerRecord};
use crate::envelope::{
    Envelope, ATTEMPT_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    REPLAYED_HEADER, SOURCE_QUEUE_HEADER,
};
use crate::error::Error;
use crate::hop::{Destination, SlipDestinations};
use crate::properties::MessageProperties;
use crate::retry::{rung_name, Decision, RetryPolicy};
use crate::set_aside::{publish_held, OnNoRoute};
use crate::topology::{self, DLX};
use crate::trace::{SpanName, TraceContext};

/// What every delivery of one consumer works with: the handler, how
/// payloads decode, the retry policy and where hops and give-ups go, shared
/// by the work of all its deliveries.
pub(super) struct Handling<T, F, C> {
    pub(super) conn: Conn,
    pub(super) queue: String,
    pub(super) handler: F,
    pub(super) codec: C,
    pub(super) policy: RetryPolicy,
    pub(super) handler_slots: Semaphore,
    pub(super) shutdown: watch::Receiver<bool>,
    pub(super) record: Arc<ConsumerRecord>,
    /// Started with `x-stream-offset`: offsets are tracked for recovery.
    pub(super) stream: bool,
    /// Where `Ack::then` outputs go.
    pub(super) then: Option<Destination>,
    /// The routing slip steps it follows; `None`: slips are not followed.
    pub(super) slips: Option<Arc<dyn SlipDestinations>>,
    /// The service's own dead-letter exchange and routing key (`None`: the
    /// message's), where give-ups go instead of `{queue}.dlq`.
    pub(super) dead_letter_to: Option<(String, Option<String>)>,
    /// Set on a current-thread runtime: each delivery's work is first
    /// polled in the consumer's loop (see `spawn`).
    pub(super) inline: Option<std::task::Waker>,
    pub(super) _payload: PhantomData<fn() -> T>,
}

/// Starts the task of one delivery; a stream consumer notes its offset first.
pub(super) fn spawn<T, F, Fut, C>(handling: &Arc<Handling<T, F, C>>, tasks: &mut JoinSet<()>, delivery: Delivery)
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    if handling.stream {
        if let Some(offset) = stream_offset(&delivery) {
            lock(&handling.record.stream).given(offset);
        }
    }
    let mut work = Box::pin(process(handling.clone(), delivery));
    if let Some(waker) = &handling.inline {
        // On a current-thread runtime a task of its own buys a delivery no
        // parallelism: it runs here until it first has to wait (most
        // handlers never do), and only then becomes a task, which polls it
        // again with its own waker.
        let mut cx = std::task::Context::from_waker(waker);
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.as_mut().poll(&mut cx)));
        match polled {
            Ok(std::task::Poll::Ready(())) => return,
            Ok(std::task::Poll::Pending) => {}
            Err(_) => {
                // As a panicked task would: the delivery stays unacknowledged.
                tracing::error!(queue = %handling.queue, "a delivery's work panicked; the broker redelivers it");
                return;
            }
        }
    }
    tasks.spawn(work);
}

/// The work of one delivery, under its span: handles it to its end, then
/// notes a stream consumer's offset as done and records and counts the
/// outcome. A verdict that could not be carried out hands the delivery back.
async fn process<T, F, Fut, C>(handling: Arc<Handling<T, F, C>>, delivery: Delivery)
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    // The trace context the message carries; the handler runs in a child
    // of it (or in a new trace, when the span is recorded), current for
    // every publish it and its verdict make (see `crate::trace`).
    let carried = match &delivery.properties {
        Ok(properties) => properties
            .view()
            .headers
            .and_then(|h| TraceContext::from_headers_view(&h)),
        Err(_) => None,
    };
    let span = tracing::info_span!(
        "process",
        "otel.name" = %SpanName("process", &handling.queue),
        "otel.kind" = "consumer",
        "messaging.system" = "rabbitmq",
        "messaging.operation.type" = "process",
        "messaging.operation.name" = "process",
        "messaging.destination.name" = %delivery.exchange,
        "messaging.rabbitmq.destination.routing_key" = %delivery.routing_key,
        "messaging.destination.subscription.name" = %handling.queue,
        "messaging.rabbitmq.message.delivery_tag" = delivery.delivery_tag,
        "messaging.message.id" = tracing::field::Empty,
        "messaging.message.conversation_id" = tracing::field::Empty,
        queue = %handling.queue,
        message_id = tracing::field::Empty,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
    );
    let context = crate::trace::next(carried.as_ref(), !span.is_disabled());
    if let Some(context) = &context {
        crate::trace::record_ids(&span, context, carried.as_ref());
    }
    let work = async move {
        let result = handle(&handling, &delivery).await;
        let outcome = match &result {
            Ok(outcome) => *outcome,
            Err(err) => {
                // A held publish gives up only when the consumer closes or
                // the delivery's connection is gone (see `set_aside.rs`), so
                // this is no hot loop: nothing is lost, the broker has it.
                tracing::error!(%err, "could not settle the message; returning it to the broker");
                let _ = requeue(&delivery);
                Outcome::Requeued
            }
        };
        if handling.stream && result.is_ok() {
            if let Some(offset) = stream_offset(&delivery) {
                lock(&handling.record.stream).settled(offset);
            }
        }
        tracing::Span::current().record("outcome", outcome.as_str());
        outcome.count();
    }
    .instrument(span);
    crate::trace::scoped(context, work).await
}

/// Runs one delivery to its end; returns its outcome. Each step is
/// one function: the properties and the body must decode (or the message
/// is set aside), a handler slot is taken (or the message goes back to the
/// broker when closing), the handler runs (a panic is a retry), and its
/// verdict is carried out.
async fn handle<T, F, Fut, C>(handling: &Handling<T, F, C>, delivery: &Delivery) -> Result<Outcome, Error>
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Ack> + Send + 'static,
    C: Codec,
{
    // Read straight from the received bytes; `BasicProperties` are built
    // only for what needs them (a retry, a set-aside, a hop).
    let properties = match &delivery.properties {
        Ok(p) => p,
        Err(raw) => {
            // Whatever can still be read goes with it (message-id,
            // correlation-id, timestamp...), so an operator can find it.
            let salvaged = raw.salvage();
            let reason = format!(
                "the message's properties could not be decoded: {} (not kept: {})",
                raw.error,
                salvaged.lost.join(", ")
            );
            return Box::pin(set_aside_undecodable(handling, delivery, &salvaged.properties, &reason)).await;
        }
    };
    let envelope = envelope_of(&properties.view(), delivery);
    // What a retry needs once the envelope has gone to the handler.
    let facts = RetryFacts {
        attempt: envelope.attempt,
        first_seen: envelope.first_seen,
        slip: handling.slips.is_some() && crate::hop::has_slip_in(&envelope.headers),
    };
    let payload: T = match handling.codec.decode(&delivery.body) {
        Ok(payload) => payload,
        Err(err) => {
            let reason = format!("the body could not be decoded: {err}");
            return Box::pin(set_aside_undecodable(handling, delivery, properties, &reason)).await;
        }
    };
    let Some(permit) = handler_slot(handling).await else {
        requeue(delivery)?;
        return Ok(Outcome::Returned);
    };
    let message = Message {
        payload,
        envelope,
        redelivered: delivery.redelivered,
        exchange: crate::text::owned_lossy(delivery.exchange.as_bytes()),
        routing_key: crate::text::owned_lossy(delivery.routing_key.as_bytes()),
        queue: handling.queue.clone(),
        properties: MessageProperties::new(properties.clone()),
    };
    let verdict = run_handler(&handling.handler, message).await;
    drop(permit);
    carry_out(handling, delivery, properties, &facts, verdict).await
}

/// The envelope as the handler sees it: the attempt counts redeliveries
/// (see [`delivered_attempt`]).
pub(crate) fn envelope_of(properties: &BasicPropertiesRef<'_>, delivery: &Delivery) -> Envelope {
    let mut envelope = Envelope::read_from_message_view(properties, &delivery.body);
    envelope.attempt = delivered_attempt(envelope.attempt, &envelope.headers, delivery.redelivered);
    let span = tracing::Span::current();
    if !span.is_disabled() {
        span.record("message_id", envelope.id.as_str());
        span.record("messaging.message.id", envelope.id.as_str());
        span.record("messaging.message.conversation_id", envelope.correlation_id.as_deref());
        span.record("attempt", envelope.attempt);
    }
    envelope
}

/// A message that cannot reach a handler goes to the dlq at once.
async fn set_aside_undecodable<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    reason: &str,
) -> Result<Outcome, Error> {
    set_aside(handling, delivery, properties, "dlq", reason).await?;
    ack(delivery)?;
    Ok(Outcome::Undecodable)
}

/// A handler slot, or `None` when the consumer starts closing first. A
/// paused consumer (`Consumer::pause`) gives none until it is resumed.
async fn handler_slot<T, F, C>(handling: &Handling<T, F, C>) -> Option<tokio::sync::SemaphorePermit<'_>> {
    loop {
        if *handling.shutdown.borrow() {
            return None;
        }
        if handling.record.is_paused() && !handling.record.until_resumed(&handling.shutdown).await {
            return None;
        }
        let permit = match handling.handler_slots.try_acquire() {
            Ok(permit) => permit,
            Err(_) => {
                let mut shutdown = handling.shutdown.clone();
                tokio::select! {
                    permit = handling.handler_slots.acquire() => permit.ok()?,
                    _ = shutdown.wait_for(|stop| *stop) => return None,
                }
            }
        };
        if !handling.record.is_paused() {
            return Some(permit);
        }
    }
}

/// Runs the handler; a panic in it is caught and becomes a retry.
async fn run_handler<T, F, Fut>(handler: &F, message: Message<T>) -> Ack
where
    F: Fn(Message<T>) -> Fut,
    Fut: Future<Output = Ack>,
{
    let mut running = std::pin::pin!(handler(message));
    let caught = std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| running.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(ack)) => std::task::Poll::Ready(Ok(ack)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await;
    caught.unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        Ack::Retry(Box::new(HandlerPanicked(text)))
    })
}

/// Carries out the handler's verdict.
async fn carry_out<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    // As received: built into `BasicProperties` only on the paths that
    // republish (an accept without a routing slip never builds them).
    properties: &acemq_codec::Properties,
    facts: &RetryFacts,
    verdict: Ack,
) -> Result<Outcome, Error> {
    match verdict {
        Ack::Accept if facts.slip => Box::pin(forward(handling, delivery, properties, facts, None)).await,
        Ack::Accept => {
            ack(delivery)?;
            Ok(Outcome::Accepted)
        }
        Ack::Then(output) => Box::pin(forward(handling, delivery, properties, facts, Some(output))).await,
        Ack::Reply(reply) => Box::pin(answer(handling, delivery, properties, facts, reply)).await,
        Ack::Park(reason) => {
            Box::pin(set_aside(handling, delivery, properties, "parked", &reason)).await?;
            ack(delivery)?;
            Ok(Outcome::Parked)
        }
        // Boxed, like the set-asides: the rare paths are kept out of the
        // future every delivery's task carries.
        Ack::Retry(err) => Box::pin(retry(handling, delivery, properties, facts, err)).await,
    }
}

/// An accepted message goes on: to the next step of its routing slip (with
/// the handler's output, if it gave one), or its `Ack::then` output to the
/// consumer's destination. A hop that fails is a failure of the input.
async fn forward<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    facts: &RetryFacts,
    output: Option<crate::ack::Output>,
) -> Result<Outcome, Error> {
    let output = match output.map(|o| o.body.map(|body| (body, o.content_type))) {
        Some(Err(err)) => {
            let err = crate::fatal(format!("the handler's output could not be encoded: {err}"));
            return Box::pin(retry(handling, delivery, properties, facts, Box::new(err))).await;
        }
        Some(Ok(output)) => Some(output),
        None => None,
    };
    let slips = handling.slips.as_deref();
    let hop = match crate::hop::next_hop(
        properties,
        &id_of(delivery, properties),
        handling.then.as_ref(),
        output,
        slips,
    ) {
        Ok(Some(hop)) => hop,
        // The last step of a slip, and no output to send on.
        Ok(None) => {
            ack(delivery)?;
            return Ok(Outcome::Accepted);
        }
        Err(err) => return Box::pin(retry(handling, delivery, properties, facts, Box::new(err))).await,
    };
    let body = hop.body.clone().unwrap_or_else(|| delivery.body.clone());
    match hop.publish(&handling.conn, properties, body).await {
        Ok(()) => {
            ack(delivery)?;
            Ok(Outcome::Accepted)
        }
        Err(err) => Box::pin(retry(handling, delivery, properties, facts, Box::new(err))).await,
    }
}

/// A request is answered (`crate::rpc`), then acked; a reply that cannot
/// go is a failure of the request.
async fn answer<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    facts: &RetryFacts,
    reply: crate::ack::ReplyOutput,
) -> Result<Outcome, Error> {
    match crate::rpc::send_reply(&handling.conn, properties, &id_of(delivery, properties), reply).await {
        Ok(()) => {
            ack(delivery)?;
            Ok(Outcome::Accepted)
        }
        Err(err) => Box::pin(retry(handling, delivery, properties, facts, err)).await,
    }
}

async fn retry<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    envelope: &RetryFacts,
    err: BoxError,
) -> Result<Outcome, Error> {
    let decision = handling
        .policy
        .decide(envelope.attempt, envelope.first_seen, err.as_ref(), SystemTime::now());
    // The republished copy: only built where a retry republishes.
    let next = || {
        hop_properties(
            properties,
            delivery,
            &handling.queue,
            envelope.attempt.saturating_add(1),
            None,
        )
    };
    let id = id_of(delivery, properties);
    match decision {
        Decision::DeadLetter { reason } => {
            set_aside(handling, delivery, properties, "dlq", &reason).await?;
            ack(delivery)?;
            Ok(Outcome::DeadLettered)
        }
        Decision::WaitInProcess(wait) => {
            wait_unless_closing(handling, wait).await;
            republish(handling, delivery, &handling.queue, next(), &id, OnNoRoute::Wait).await?;
            ack(delivery)?;
            Ok(Outcome::Retried)
        }
        Decision::WaitInBroker(wait) => {
            let rung = rung_name(&handling.queue, wait);
            // A missing rung is declared again for the messages after this
            // one; this one spends its wait in the process.
            let again = topology::rung_declarations(&handling.queue, &handling.policy)
                .into_iter()
                .filter(|d| matches!(d, crate::declaration::Declaration::Queue { name, .. } if *name == rung))
                .collect::<Vec<_>>();
            match republish(
                handling,
                delivery,
                &rung,
                next(),
                &id,
                OnNoRoute::DeclareAndReturn(&again),
            )
            .await
            {
                Ok(()) => {}
                Err(Error::Unroutable { .. }) => {
                    metrics::counter!(crate::metrics_names::RUNG_MISSING_TOTAL).increment(1);
                    tracing::warn!(%rung, ?wait, "the rung queue is missing; waiting in the process instead");
                    wait_unless_closing(handling, wait).await;
                    republish(handling, delivery, &handling.queue, next(), &id, OnNoRoute::Wait).await?;
                }
                Err(other) => return Err(other),
            }
            ack(delivery)?;
            Ok(Outcome::Retried)
        }
    }
}

/// Sleeps `wait`, or less if the consumer starts closing: the message is then
/// republished at once, so nothing is lost or run twice.
async fn wait_unless_closing<T, F, C>(handling: &Handling<T, F, C>, wait: Duration) {
    let mut shutdown = handling.shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(wait) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

/// The properties for a library hop: the original's, with the attempt
/// advanced, the original exchange and routing key recorded on the first
/// hop, and the error text (bounded) for set-asides; without the broker's
/// `x-delivery-count`, which belongs to the copy received, not to the new one
/// (see [`delivered_attempt`]).
pub(crate) fn hop_properties(
    original: &BasicProperties,
    delivery: &Delivery,
    queue: &str,
    attempt: u32,
    error: Option<&str>,
) -> BasicProperties {
    let mut props = original.clone();
    // A message from another publisher may come without an id or a first
    // seen (or with one that does not read): its hops carry the ones it was
    // read with, so they stay stable.
    let has_first_seen = original
        .headers
        .as_ref()
        .and_then(|h| h.get(FIRST_SEEN_HEADER))
        .and_then(|v| crate::envelope::time_of(v.as_i64()))
        .is_some();
    if original.message_id.is_none() || !has_first_seen {
        let read = Envelope::read_from_message(original, &delivery.body);
        if props.message_id.is_none() {
            props.message_id = Some(read.id.as_str().into());
        }
        if !has_first_seen {
            let secs = read
                .first_seen
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            props
                .headers
                .get_or_insert_with(FieldTable::new)
                .insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(secs));
        }
    }
    let mut headers = props.headers.take().unwrap_or_default();
    let origin_recorded = carries_librarys_origin(&headers, delivery, queue);
    headers.remove(DELIVERY_COUNT_HEADER);
    headers.insert(
        ATTEMPT_HEADER,
        FieldValue::I32(i32::try_from(attempt).unwrap_or(i32::MAX)),
    );
    if !origin_recorded {
        headers.insert(
            ORIGINAL_EXCHANGE_HEADER,
            FieldValue::from(delivery.exchange.to_string()),
        );
        headers.insert(
            ORIGINAL_ROUTING_KEY_HEADER,
            FieldValue::from(delivery.routing_key.to_string()),
        );
    }
    if let Some(error) = error {
        headers.insert(ERROR_HEADER, FieldValue::from(bounded(error)));
    }
    props.headers = Some(headers);
    props
}

/// Whether the `x-acemq-original-*` headers of a delivery were written by
/// acemq, so a hop keeps them: it came the way the library's own copies come
/// back to the queue (a retry, a rung, a replay into the queue: the default
/// exchange, routing key this queue) and as one (attempt 2 or more, or
/// replayed). Any other delivery is the message's first hop here: the
/// exchange and key it came through are recorded, whatever a producer wrote.
fn carries_librarys_origin(headers: &FieldTable, delivery: &Delivery, queue: &str) -> bool {
    let number = |key: &str| headers.get(key).and_then(FieldValue::as_i64).unwrap_or(0);
    headers.contains_key(ORIGINAL_EXCHANGE_HEADER)
        && headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER)
        && delivery.exchange.as_bytes().is_empty()
        && delivery.routing_key.as_bytes() == queue.as_bytes()
        && (number(ATTEMPT_HEADER) >= 2 || number(REPLAYED_HEADER) >= 1)
}

/// At most [`MAX_ERROR_TEXT`] bytes, cut at a character boundary.
fn bounded(text: &str) -> String {
    let kept = crate::text::prefix_within(text, MAX_ERROR_TEXT);
    if kept.len() == text.len() {
        return text.to_string();
    }
    format!("{kept}…")
}

/// Republishes to `routing_key` on the default exchange (mandatory, on the
/// always-confirmed library channel), holding the delivery until the broker
/// has the copy (see [`crate::set_aside`]).
async fn republish<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    routing_key: &str,
    properties: BasicProperties,
    message_id: &str,
    on_no_route: OnNoRoute<'_>,
) -> Result<(), Error> {
    let publish = BasicPublish {
        exchange: ShortString::new(),
        routing_key: routing_key.into(),
        mandatory: true,
        ..Default::default()
    };
    let body = delivery.body.clone();
    publish_held(
        &handling.conn,
        delivery,
        &handling.shutdown,
        publish,
        properties,
        body,
        message_id,
        on_no_route,
    )
    .await
}

/// Sets a message aside in `{queue}.{suffix}` (`dlq` or `parked`) through
/// `acemq.dlx`, with the reason in `x-acemq-error` and the queue in
/// `x-acemq-source-queue`; a set-aside queue deleted since the consumer
/// started is declared again.
async fn set_aside<T, F, C>(
    handling: &Handling<T, F, C>,
    delivery: &Delivery,
    properties: &BasicProperties,
    suffix: &str,
    reason: &str,
) -> Result<(), Error> {
    // The attempt the handler saw (or would have seen), redeliveries counted.
    let attempt = envelope_of(&properties.view(), delivery).attempt;
    let mut props = hop_properties(properties, delivery, &handling.queue, attempt, Some(reason));
    props
        .headers
        .get_or_insert_with(FieldTable::new)
        .insert(SOURCE_QUEUE_HEADER, FieldValue::from(handling.queue.as_str()));
    let message_id = props.message_id.as_ref().map(|m| m.to_string()).unwrap_or_default();
    let (exchange, routing_key, again) = match &handling.dead_letter_to {
        // Give-ups to the service's own dead-letter exchange, as the broker
        // routes its dead letters there: the queue's dead-letter key, else
        // the key the message was first published with (recorded above).
        Some((exchange, key)) if suffix == "dlq" => {
            let first_key = props
                .headers
                .as_ref()
                .and_then(|h| h.get(ORIGINAL_ROUTING_KEY_HEADER))
                .and_then(FieldValue::as_str)
                .map(str::to_string);
            let key = key.clone().or(first_key).unwrap_or_default();
            // Its bindings are the service's: nothing to declare again.
            (exchange.clone(), key, Vec::new())
        }
        _ => (
            DLX.to_string(),
            format!("{}.{suffix}", handling.queue),
            topology::set_aside_queue_declarations(&handling.queue, &[suffix]),
        ),
    };
    let publish = BasicPublish {
        exchange: exchange.as_str().into(),
        routing_key: routing_key.as_str().into(),
        mandatory: true,
        ..Default::default()
    };
    let on_no_route = if again.is_empty() {
        OnNoRoute::Wait
    } else {
        OnNoRoute::Declare(&again)
    };
    tracing::info!(queue = %handling.queue, %message_id, suffix, %exchange, %routing_key, reason = %bounded(reason), "setting a message aside");
    publish_held(
        &handling.conn,
        delivery,
        &handling.shutdown,
        publish,
        props,
        delivery.body.clone(),
        &message_id,
        on_no_route,
    )
    .await
}

/// A waker that does nothing: the first poll of a delivery's work made in
/// the consumer's own loop (see `spawn`), whose wake-ups the task
/// it then becomes takes over.
struct FirstPoll;

impl std::task::Wake for FirstPoll {
    fn wake(self: Arc<Self>) {}
}

/// The waker for first polls in the consumer's loop, when the runtime is
/// current-thread (elsewhere every delivery gets a task, for parallelism).
pub(super) fn inline_waker() -> Option<std::task::Waker> {
    let flavor = tokio::runtime::Handle::try_current().ok()?.runtime_flavor();
    (flavor == tokio::runtime::RuntimeFlavor::CurrentThread).then(|| std::task::Waker::from(Arc::new(FirstPoll)))
}

/// The `x-stream-offset` header of a delivery from a stream.
pub(crate) fn stream_offset(delivery: &Delivery) -> Option<i64> {
    let properties = delivery.properties.as_ref().ok()?.view();
    properties.headers?.get("x-stream-offset")?.as_i64()
}

/// The broker's count of a quorum queue's redeliveries.
const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The attempt a delivery is, from the attempt written on the message
/// (`written`, `x-acemq-attempt`: 1 on first publish) and what the broker
/// says of this copy. The rule, so that the attempt rises by exactly one
/// per handler call and per broker redelivery:
///
/// - Every republish the library makes (an in-process or rung retry, a
///   set-aside, a recovery's cut-short wait) writes the attempt of the call
///   it follows plus one, and never carries `x-delivery-count`: the copy it
///   makes is new to the broker, which has counted nothing of it.
/// - A copy the broker has not delivered before (`redelivered` false) adds
///   nothing, whatever `x-delivery-count` it carries: a count on such a
///   copy was written by whoever published it (another client republishing
///   a quorum delivery, or an older acemq), not by this queue.
/// - A copy delivered before adds the broker's count of its redeliveries:
///   a quorum queue's `x-delivery-count` (each return, nack or reject with
///   requeue, and each redelivery after a lost channel counts once; on
///   RabbitMQ 3.10 and 4.0 alike), or one when there is none (a classic
///   queue, or a quorum queue that did not say). A classic queue says only
///   that the copy was delivered before, not how often: there several
///   redeliveries of one copy count as one.
///
/// A count that is not a non-negative integer is read as absent.
pub(crate) fn delivered_attempt(written: u32, headers: &FieldTable, redelivered: bool) -> u32 {
    if !redelivered {
        return written;
    }
    let count = headers
        .get(DELIVERY_COUNT_HEADER)
        .and_then(FieldValue::as_i64)
        .and_then(|n| u32::try_from(n).ok());
    written.saturating_add(count.unwrap_or(0).max(1))
}

/// The parts of the envelope a retry decision needs.
struct RetryFacts {
    attempt: u32,
    first_seen: SystemTime,
    /// Whether the message carries a routing slip (an accept forwards it).
    slip: bool,
}

/// The envelope's id of a delivery, for the paths that republish it (made
/// again from the properties rather than kept from the envelope: an
/// accepted message never needs it).
pub(crate) fn id_of(delivery: &Delivery, properties: &BasicProperties) -> String {
    Envelope::id_of(&properties.view(), &delivery.body)
}

/// A panic in a handler, as an error for the retry policy.
#[derive(Debug)]
struct HandlerPanicked(String);

impl std::fmt::Display for HandlerPanicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the handler panicked: {}", self.0)
    }
}

impl std::error::Error for HandlerPanicked {}
