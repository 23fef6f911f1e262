//! Trace context across the broker: W3C Trace Context (`traceparent`,
//! `tracestate`) written into the headers of what acemq publishes and read
//! back from what it delivers, so that a trace goes on through a queue.
//!
//! `tracing` spans carry no W3C ids, so acemq keeps its own:
//! a [`TraceContext`] (trace id, span id, flags, `tracestate`) that is
//! *current* while a handler runs (a task-local value, set by the consumer
//! for each delivery: a child of the context the message carried, or a new
//! trace). What a publish writes is always a child of the context current
//! where it is made:
//!
//! - a [`crate::Publisher`] send inside a handler continues the handler's
//!   trace; one outside any handler starts a new trace, or continues the one
//!   the application made current with [`TraceContext::in_scope`];
//! - a library publish (a retry, a rung, a set-aside, an `Ack::then` output,
//!   a routing-slip step, a replay, the scheduler's delivery, the outbox
//!   relay's send, [`crate::Conn::publish_confirmed`]) continues the current
//!   context, or without one the context the message itself carries, so a
//!   message set aside and replayed, or scheduled and delivered, stays in
//!   its trace.
//!
//! Spans follow OpenTelemetry's messaging conventions: a publish runs
//! under a `send` span, a delivery under a `process` span, each with
//! `messaging.system = "rabbitmq"`, `messaging.operation.type`,
//! `messaging.operation.name`, `messaging.destination.name` (the exchange),
//! `messaging.rabbitmq.destination.routing_key`, `messaging.message.id`,
//! `messaging.message.conversation_id` (the correlation id), `otel.name`
//! (`"send {exchange}"`, `"process {queue}"`) and `otel.kind`; and the W3C
//! ids as `trace_id`, `span_id` and (on a delivery that carried a context)
//! `parent_span_id`, hex-encoded, for a subscriber or a log to join them.
//!
//! # OpenTelemetry
//!
//! acemq stays on `tracing` and brings no OpenTelemetry crate. The W3C
//! ids are span fields, so a `tracing` layer can export them as they are;
//! `otel.name` and `otel.kind` are the fields `tracing-opentelemetry` reads
//! for a span's name and kind. A bridge through `tracing-opentelemetry`
//! would have to write the ids its SDK gives each span, rather than these:
//! it is not part of this crate.
//!
//! # Cost
//!
//! A trace is started only where someone can see it: a send outside any
//! context injects a `traceparent` only when its `send` span is enabled (a
//! `tracing` subscriber takes INFO spans from acemq), and a delivery without
//! a context starts one only when its `process` span is enabled. Without a
//! subscriber, and without a context to carry on, a publish writes exactly
//! what it wrote before and costs one task-local lookup and one disabled
//! span: a trace that no one records has no root to join anyway. Where
//! there is a context, injecting it is two random numbers, 55 bytes of hex
//! and one header.
//!
//! # Hostile input
//!
//! A `traceparent` that is not a long string, not exactly the W3C form
//! (version `00`, 55 characters; a later version at least that long, its
//! extra fields ignored; never version `ff`), with ids all zero or not in
//! lower-case hex, is ignored: the delivery starts a new trace. A
//! `tracestate` is kept only beside a valid `traceparent`, and only when it
//! is printable ASCII of at most 512 bytes. Nothing a producer writes there
//! panics, fails a delivery, or is carried on unchecked.

use std::future::Future;
use std::sync::Arc;

use acemq_codec::{BasicProperties, FieldTable, FieldTableRef, FieldValue, FieldValueRef};

/// Header: the W3C `traceparent` (`S`).
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Header: the W3C `tracestate` (`S`).
pub const TRACESTATE_HEADER: &str = "tracestate";

/// The longest `tracestate` carried on (W3C's limit a vendor must keep).
pub const MAX_TRACESTATE: usize = 512;

tokio::task_local! {
    static CURRENT: Option<TraceContext>;
}

/// One W3C trace context: the trace, the span that is the parent of what
/// comes next, the flags and the vendors' `tracestate`.
///
/// ```
/// use acemq_core::trace::TraceContext;
///
/// let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let parent = TraceContext::parse(incoming, None).expect("a valid traceparent");
/// let child = parent.child();
/// assert_eq!(child.trace_id(), parent.trace_id());
/// assert_ne!(child.span_id(), parent.span_id());
/// assert!(TraceContext::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None).is_none());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    flags: u8,
    state: Option<Arc<str>>,
}

impl std::fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.state)
            .finish()
    }
}

impl TraceContext {
    /// A new trace: random trace and span ids, sampled.
    pub fn new_root() -> TraceContext {
        TraceContext {
            trace_id: nonzero(rand::random::<u128>()),
            span_id: nonzero(rand::random::<u64>()),
            flags: 0x01,
            state: None,
        }
    }

    /// A span in the same trace, whose parent is this one: same trace id,
    /// flags and `tracestate`, a new span id.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            trace_id: self.trace_id,
            span_id: nonzero(rand::random::<u64>()),
            flags: self.flags,
            state: self.state.clone(),
        }
    }

    /// The context current in this task: the handler's (a child of the
    /// context its message carried) while a handler runs, or what
    /// [`TraceContext::in_scope`] set; `None` elsewhere. A task spawned from
    /// a handler does not inherit it: carry it over with `in_scope`.
    pub fn current() -> Option<TraceContext> {
        CURRENT.try_with(Clone::clone).ok().flatten()
    }

    /// Runs `future` with this context current: what it publishes
    /// continues this trace.
    ///
    /// ```
    /// # async fn demo(publisher: acemq_core::Publisher<u32>) -> Result<(), acemq_core::Error> {
    /// use acemq_core::trace::TraceContext;
    ///
    /// // E.g. from an HTTP request's `traceparent` header.
    /// let incoming = TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
    /// let context = incoming.unwrap_or_else(TraceContext::new_root);
    /// context.in_scope(async { publisher.send(&7).await }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn in_scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(Some(self), future).await
    }

    /// Runs `f` with this context current (for code that is not async).
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CURRENT.sync_scope(Some(self), f)
    }

    /// Reads a W3C `traceparent` (and its `tracestate`), or `None` when it
    /// is not a valid one (see the module's docs on hostile input).
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        parse_bytes(traceparent.as_bytes(), tracestate.map(str::as_bytes))
    }

    /// The `traceparent` value: `00-{trace id}-{span id}-{flags}`.
    pub fn traceparent(&self) -> String {
        let mut out = String::with_capacity(55);
        out.push_str("00-");
        push_hex(&mut out, &self.trace_id.to_be_bytes());
        out.push('-');
        push_hex(&mut out, &self.span_id.to_be_bytes());
        out.push('-');
        push_hex(&mut out, &[self.flags]);
        out
    }

    /// The `tracestate` carried with it, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The trace id, 32 lower-case hex digits.
    pub fn trace_id(&self) -> String {
        let mut out = String::with_capacity(32);
        push_hex(&mut out, &self.trace_id.to_be_bytes());
        out
    }

    /// The span id, 16 lower-case hex digits.
    pub fn span_id(&self) -> String {
        let mut out = String::with_capacity(16);
        push_hex(&mut out, &self.span_id.to_be_bytes());
        out
    }

    /// Whether the trace is sampled (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 0x01 != 0
    }

    /// The context a message carries in its headers, if a valid one.
    pub fn from_headers(headers: &FieldTable) -> Option<TraceContext> {
        Self::from_headers_view(&headers.view())
    }

    /// [`TraceContext::from_headers`] over headers as received.
    pub fn from_headers_view<'a>(headers: &FieldTableRef<'a>) -> Option<TraceContext> {
        let (mut parent, mut state) = (None, None);
        for (key, value) in headers.iter() {
            if key == TRACEPARENT_HEADER.as_bytes() && parent.is_none() {
                parent = Some(value);
            } else if key == TRACESTATE_HEADER.as_bytes() && state.is_none() {
                state = Some(value);
            }
        }
        let text = |v: FieldValueRef<'a>| match v {
            FieldValueRef::LongString(bytes) => Some(bytes),
            _ => None,
        };
        let parent = text(parent?)?;
        let state = state.and_then(text);
        parse_bytes(parent, state)
    }

    /// Writes this context into `headers` (replacing any there), with its
    /// `tracestate` or none.
    pub fn write_to(&self, headers: &mut FieldTable) {
        headers.insert(TRACEPARENT_HEADER, FieldValue::from(self.traceparent()));
        match &self.state {
            Some(state) => {
                headers.insert(TRACESTATE_HEADER, FieldValue::from(&**state));
            }
            None => {
                headers.remove(TRACESTATE_HEADER);
            }
        }
    }
}

fn nonzero<T: Default + PartialEq + From<u8>>(n: T) -> T {
    if n == T::default() {
        T::from(1)
    } else {
        n
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn push_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
}

/// Lower-case hex only, as W3C requires.
fn hex_value(bytes: &[u8]) -> Option<u128> {
    let mut n: u128 = 0;
    for &b in bytes {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        n = (n << 4) | u128::from(digit);
    }
    Some(n)
}

fn parse_bytes(traceparent: &[u8], tracestate: Option<&[u8]>) -> Option<TraceContext> {
    // version "-" trace-id(32) "-" parent-id(16) "-" flags(2): 55 bytes.
    if traceparent.len() < 55 {
        return None;
    }
    let version = hex_value(traceparent.get(..2)?)?;
    match version {
        0 if traceparent.len() != 55 => return None,
        0xff => return None,
        // A later version: its first fields read as version 00's, and
        // whatever follows must start with a dash.
        _ if traceparent.len() > 55 && traceparent[55] != b'-' => return None,
        _ => {}
    }
    if traceparent[2] != b'-' || traceparent[35] != b'-' || traceparent[52] != b'-' {
        return None;
    }
    let trace_id = hex_value(&traceparent[3..35])?;
    let span_id = u64::try_from(hex_value(&traceparent[36..52])?).ok()?;
    let flags = u8::try_from(hex_value(&traceparent[53..55])?).ok()?;
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    let state = tracestate
        .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE && s.iter().all(|b| (0x20..=0x7e).contains(b)))
        .and_then(|s| std::str::from_utf8(s).ok())
        .map(Arc::from);
    Some(TraceContext {
        trace_id,
        span_id,
        flags,
        state,
    })
}

/// The context a library publish continues: the current one, or without
/// one the context the message carries.
pub(crate) fn library_parent(properties: &BasicProperties) -> Option<TraceContext> {
    TraceContext::current().or_else(|| TraceContext::from_headers(properties.headers.as_ref()?))
}

/// The context a publish writes: a child of `parent`, or a new trace when
/// `start` (its span is enabled), else none.
pub(crate) fn next(parent: Option<&TraceContext>, start: bool) -> Option<TraceContext> {
    match parent {
        Some(parent) => Some(parent.child()),
        None if start => Some(TraceContext::new_root()),
        None => None,
    }
}

/// Writes `context` into the headers of `properties`.
pub(crate) fn inject(properties: &mut BasicProperties, context: &TraceContext) {
    context.write_to(properties.headers.get_or_insert_with(FieldTable::new));
}

/// Runs `future` with `context` current (or none).
pub(crate) async fn scoped<F: Future>(context: Option<TraceContext>, future: F) -> F::Output {
    CURRENT.scope(context, future).await
}

/// Whether an INFO span of acemq's would be recorded: a trace is started
/// only then.
pub(crate) fn spans_enabled() -> bool {
    tracing::span_enabled!(tracing::Level::INFO)
}

/// `"{operation} {destination}"`, OpenTelemetry's span name (the
/// operation alone for the default exchange, whose name is empty).
pub(crate) struct SpanName<'a>(pub(crate) &'static str, pub(crate) &'a dyn std::fmt::Display);

impl std::fmt::Display for SpanName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let destination = self.1.to_string();
        match destination.is_empty() {
            true => f.write_str(self.0),
            false => write!(f, "{} {destination}", self.0),
        }
    }
}

/// The `send` span of a publish (see the module's docs); its W3C ids are
/// recorded by [`record_ids`]. Its fields are only evaluated when it is
/// enabled.
pub(crate) fn send_span(
    exchange: &acemq_codec::ShortString,
    routing_key: &acemq_codec::ShortString,
    message_id: &str,
    correlation_id: Option<&str>,
) -> tracing::Span {
    tracing::info_span!(
        "send",
        "otel.name" = %SpanName("send", exchange),
        "otel.kind" = "producer",
        "messaging.system" = "rabbitmq",
        "messaging.operation.type" = "send",
        "messaging.operation.name" = "publish",
        "messaging.destination.name" = %exchange,
        "messaging.rabbitmq.destination.routing_key" = %routing_key,
        "messaging.message.id" = message_id,
        "messaging.message.conversation_id" = correlation_id,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        parent_span_id = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// Records a context's ids on `span` (`parent`: the span it continues).
pub(crate) fn record_ids(span: &tracing::Span, context: &TraceContext, parent: Option<&TraceContext>) {
    if span.is_disabled() {
        return;
    }
    span.record("trace_id", context.trace_id().as_str());
    span.record("span_id", context.span_id().as_str());
    if let Some(parent) = parent {
        span.record("parent_span_id", parent.span_id().as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let context = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.traceparent(), VALID);
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        assert!(context.sampled());
        assert_eq!(context.tracestate(), Some("congo=t61rcWkgMzE"));
        let child = context.child();
        assert_eq!(child.trace_id(), context.trace_id());
        assert_ne!(child.span_id(), context.span_id());
        assert_eq!(child.tracestate(), context.tracestate());
        let mut headers = FieldTable::new();
        child.write_to(&mut headers);
        assert_eq!(TraceContext::from_headers(&headers), Some(child));
    }

    #[test]
    fn hostile_traceparents_are_ignored() {
        let long = format!("{VALID}{}", "x".repeat(10 * 1024));
        let later_version = format!("cc{}-what-follows", &VALID[2..]);
        let bad = [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é6-00f067aa0ba902b7-01",
            long.as_str(),
        ];
        for text in bad {
            assert_eq!(TraceContext::parse(text, None), None, "{text:?}");
        }
        assert!(TraceContext::parse(&later_version, None).is_some());
        // A tracestate too long or not printable is dropped, the parent kept.
        let huge = "a=".to_string() + &"b".repeat(MAX_TRACESTATE);
        for state in [huge.as_str(), "a=\u{7}", ""] {
            let context = TraceContext::parse(VALID, Some(state)).unwrap();
            assert_eq!(context.tracestate(), None, "{state:?}");
        }
        // Of another type, or non-UTF-8 bytes: absent.
        let mut headers = FieldTable::new();
        headers.insert(TRACEPARENT_HEADER, FieldValue::I64(7));
        assert_eq!(TraceContext::from_headers(&headers), None);
        headers.insert(
            TRACEPARENT_HEADER,
            FieldValue::ByteArray(VALID.as_bytes().to_vec().into()),
        );
        assert_eq!(TraceContext::from_headers(&headers), None);
        let mut not_utf8 = VALID.as_bytes().to_vec();
        not_utf8[10] = 0xff;
        assert_eq!(parse_bytes(&not_utf8, None), None);
    }

    #[tokio::test]
    async fn the_current_context_is_the_scopes_and_a_new_message_is_its_child() {
        assert_eq!(TraceContext::current(), None);
        assert_eq!(next(TraceContext::current().as_ref(), false), None);
        assert!(next(None, true).is_some());
        let root = TraceContext::new_root();
        let seen = root
            .clone()
            .in_scope(async { (TraceContext::current(), next(TraceContext::current().as_ref(), false)) })
            .await;
        assert_eq!(seen.0.as_ref(), Some(&root));
        assert_eq!(seen.1.unwrap().trace_id(), root.trace_id());
        // A library publish outside a scope continues what the message carries.
        let mut props = BasicProperties::default();
        inject(&mut props, &root);
        let parent = library_parent(&props);
        assert_eq!(parent.as_ref(), Some(&root));
        let after = next(parent.as_ref(), false).unwrap();
        assert_eq!(after.trace_id(), root.trace_id());
        assert_ne!(after.span_id(), root.span_id());
    }
}
