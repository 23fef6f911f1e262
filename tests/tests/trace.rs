//! Trace context across the broker, on every broker: a publish writes a
//! W3C `traceparent`, a delivery reads it, and the handler's `process` span
//! is a child of the publisher's `send` span (their `trace_id`, `span_id`
//! and `parent_span_id` fields, captured here by a `tracing` layer); a
//! handler's own publishes, and the library's hops (a retry in the process,
//! a rung, a set-aside), continue the trace; a hostile `traceparent` starts
//! a new trace and breaks nothing.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex, Once};
use std::time::Duration;

use acemq_codec::{BasicProperties, FieldTable, FieldValue, QueueDeclare};
use acemq_core::amqp::Channel;
use acemq_core::trace::{TraceContext, TRACEPARENT_HEADER, TRACESTATE_HEADER};
use acemq_core::{consume, fatal, Ack, Conn, Envelope, Message, RetryPolicy};
use acemq_tests::{brokers, depth, unique};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

/// One span as captured: its name and its fields as text.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl Captured {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

#[derive(Default)]
struct Spans {
    all: Vec<Captured>,
    /// Live span ids (reused by the registry once closed) to their entry.
    live: HashMap<u64, usize>,
}

static SPANS: LazyLock<Mutex<Spans>> = LazyLock::new(Mutex::default);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_string(), format!("{value:?}"));
    }
}

/// Keeps every span acemq opens, with its fields.
struct Capture;

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut captured = Captured {
            name: attrs.metadata().name(),
            fields: BTreeMap::new(),
        };
        attrs.record(&mut Fields(&mut captured.fields));
        let mut spans = SPANS.lock().unwrap();
        spans.all.push(captured);
        let at = spans.all.len() - 1;
        spans.live.insert(id.into_u64(), at);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = SPANS.lock().unwrap();
        if let Some(&at) = spans.live.get(&id.into_u64()) {
            values.record(&mut Fields(&mut spans.all[at].fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        SPANS.lock().unwrap().live.remove(&id.into_u64());
    }
}

fn capture_spans() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Capture);
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    });
}

/// The spans named `name` whose `field` is `value` and that `also` accepts,
/// once there is at least one (within 20 s).
async fn spans_where(name: &str, field: &str, value: &str, also: impl Fn(&Captured) -> bool) -> Vec<Captured> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<Captured> = SPANS
            .lock()
            .unwrap()
            .all
            .iter()
            .filter(|s| s.name == name && s.field(field) == Some(value) && also(s))
            .cloned()
            .collect();
        if !found.is_empty() {
            return found;
        }
        assert!(Instant::now() < until, "no {name} span with {field} = {value}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The one such span.
async fn span_where(name: &str, field: &str, value: &str, also: impl Fn(&Captured) -> bool) -> Captured {
    let found = spans_where(name, field, value, also).await;
    assert_eq!(found.len(), 1, "{name} with {field} = {value}: {found:#?}");
    found.into_iter().next().unwrap()
}

fn any(_: &Captured) -> bool {
    true
}

async fn queue(conn: &Conn, prefix: &str) -> (String, Channel) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let name = unique(prefix);
    ch.queue_declare(QueueDeclare {
        queue: name.as_str().into(),
        durable: true,
        ..Default::default()
    })
    .await
    .unwrap();
    (name, ch)
}

async fn delete(ch: &Channel, queue: &str) {
    for name in [queue.to_string(), format!("{queue}.dlq"), format!("{queue}.parked")] {
        let _ = ch
            .queue_delete(acemq_codec::QueueDelete {
                queue: name.as_str().into(),
                ..Default::default()
            })
            .await;
    }
}

/// The trace context a received message carries on the wire.
fn carried(props: &BasicProperties) -> Option<TraceContext> {
    TraceContext::from_headers(props.headers.as_ref()?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handlers_span_is_a_child_of_the_publishers_and_its_own_publish_continues_the_trace() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (first, ch) = queue(&conn, "trace-first").await;
            let (second, _) = queue(&conn, "trace-second").await;
            let onward = conn.publisher::<Order>("", &second);
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let seen = tx.clone();
            let c1 = consume(&conn, &first, move |m: Message<Order>| {
                let (onward, seen) = (onward.clone(), seen.clone());
                async move {
                    let next = m.envelope.caused();
                    let _ = seen.send(("first", TraceContext::current(), next.id.clone()));
                    match onward.send_envelope(next, &m.payload).await {
                        Ok(()) => Ack::accept(),
                        Err(err) => Ack::retry(err),
                    }
                }
            })
            .await
            .unwrap();
            let c2 = consume(&conn, &second, move |m: Message<Order>| {
                let _ = tx.send(("second", TraceContext::current(), m.envelope.id.clone()));
                async { Ack::accept() }
            })
            .await
            .unwrap();

            let envelope = Envelope::new();
            let id = envelope.id.clone();
            assert_eq!(TraceContext::current(), None, "outside any handler");
            conn.publisher::<Order>("", &first)
                .send_envelope(envelope, &Order { id: 1 })
                .await
                .unwrap();
            let mut got = Vec::new();
            while got.len() < 2 {
                let next = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await;
                got.push(next.expect("both handlers ran").unwrap());
            }
            got.sort_by_key(|(which, _, _)| *which);
            let (_, in_first, second_id) = got[0].clone();
            let (_, in_second, second_seen) = got[1].clone();
            assert_eq!(second_id, second_seen);

            // The send outside any handler starts a trace.
            let send = span_where("send", "messaging.message.id", &id, any).await;
            let trace = send.field("trace_id").expect("a trace id").to_string();
            assert_eq!(send.field("parent_span_id"), None, "{:?}: a new trace", b.kind);
            assert_eq!(send.field("messaging.system"), Some("rabbitmq"));
            assert_eq!(send.field("messaging.operation.type"), Some("send"));
            assert_eq!(
                send.field("messaging.rabbitmq.destination.routing_key"),
                Some(first.as_str())
            );
            assert_eq!(send.field("otel.kind"), Some("producer"));
            assert_eq!(send.field("outcome"), Some("confirmed"));
            // The handler's span is its child.
            let process = span_where("process", "messaging.message.id", &id, any).await;
            assert_eq!(process.field("trace_id"), Some(trace.as_str()), "{:?}", b.kind);
            assert_eq!(process.field("parent_span_id"), send.field("span_id"), "{:?}", b.kind);
            assert_eq!(process.field("messaging.operation.type"), Some("process"));
            assert_eq!(
                process.field("messaging.destination.subscription.name"),
                Some(first.as_str())
            );
            assert_eq!(process.field("otel.kind"), Some("consumer"));
            let in_first = in_first.expect("a context while the handler runs");
            assert_eq!(in_first.trace_id(), trace);
            assert_eq!(Some(in_first.span_id().as_str()), process.field("span_id"));
            // Its publish continues the trace, and the next handler's span
            // is that publish's child.
            let send2 = span_where("send", "messaging.message.id", &second_id, any).await;
            assert_eq!(send2.field("trace_id"), Some(trace.as_str()), "{:?}", b.kind);
            assert_eq!(send2.field("parent_span_id"), process.field("span_id"));
            let process2 = span_where("process", "messaging.message.id", &second_id, any).await;
            assert_eq!(process2.field("trace_id"), Some(trace.as_str()));
            assert_eq!(process2.field("parent_span_id"), send2.field("span_id"), "{:?}", b.kind);
            assert_eq!(in_second.expect("a context").trace_id(), trace);

            c1.close().await.unwrap();
            c2.close().await.unwrap();
            delete(&ch, &first).await;
            delete(&ch, &second).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Publishes one message to `queue` and returns its id and the trace its
/// send started.
async fn send_traced(conn: &Conn, queue: &str) -> (String, String, Captured) {
    let envelope = Envelope::new();
    let id = envelope.id.clone();
    conn.publisher::<Order>("", queue)
        .send_envelope(envelope, &Order { id: 1 })
        .await
        .unwrap();
    // The first send (a retry republishes with the same id, as a child).
    let send = span_where("send", "messaging.message.id", &id, |s| {
        s.field("parent_span_id").is_none()
    })
    .await;
    let trace = send.field("trace_id").unwrap().to_string();
    (id, trace, send)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_in_the_process_a_rung_and_a_set_aside_continue_the_trace_of_the_delivery_they_came_from() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let in_process = RetryPolicy::fixed(3, Duration::from_millis(20))
                .with_jitter(0.0)
                .wait_in_broker_from(Duration::from_secs(3600));
            let on_a_rung = RetryPolicy::fixed(3, Duration::from_secs(1))
                .with_jitter(0.0)
                .wait_in_broker_from(Duration::from_secs(1));
            for (policy, how) in [(in_process, "in the process"), (on_a_rung, "on a rung")] {
                let (q, ch) = queue(&conn, "trace-retry").await;
                let consumer = consume(&conn, &q, |m: Message<Order>| async move {
                    match m.envelope.attempt {
                        1 => Ack::retry(std::io::Error::other("once more")),
                        _ => Ack::accept(),
                    }
                })
                .retry_with(policy.clone())
                .await
                .unwrap();
                let (id, trace, send) = send_traced(&conn, &q).await;
                let first = span_where("process", "messaging.message.id", &id, |s| {
                    s.field("attempt") == Some("1")
                })
                .await;
                assert_eq!(
                    first.field("parent_span_id"),
                    send.field("span_id"),
                    "{:?} {how}",
                    b.kind
                );
                let second = span_where("process", "messaging.message.id", &id, |s| {
                    s.field("attempt") == Some("2")
                })
                .await;
                assert_eq!(second.field("trace_id"), Some(trace.as_str()), "{:?} {how}", b.kind);
                // The republish is a child of the first delivery's span, and
                // the second delivery a child of the republish.
                let republish = span_where("send", "messaging.message.id", &id, |s| {
                    s.field("parent_span_id") == first.field("span_id")
                })
                .await;
                assert_eq!(republish.field("trace_id"), Some(trace.as_str()));
                assert_eq!(
                    second.field("parent_span_id"),
                    republish.field("span_id"),
                    "{:?} {how}",
                    b.kind
                );
                consumer.close().await.unwrap();
                delete(&ch, &q).await;
                for rung in policy.rungs() {
                    let _ = ch
                        .queue_delete(acemq_codec::QueueDelete {
                            queue: acemq_core::retry::rung_name(&q, rung).as_str().into(),
                            ..Default::default()
                        })
                        .await;
                }
            }

            // A set-aside copy carries the trace on the wire.
            let (q, ch) = queue(&conn, "trace-dlq").await;
            let consumer = consume(&conn, &q, |_: Message<Order>| async { Ack::retry(fatal("never")) })
                .await
                .unwrap();
            let (id, trace, _) = send_traced(&conn, &q).await;
            let process = span_where("process", "messaging.message.id", &id, any).await;
            let until = Instant::now() + Duration::from_secs(20);
            let dead = loop {
                if let Some(m) = ch.basic_get(&format!("{q}.dlq"), true).await.unwrap() {
                    break m;
                }
                assert!(Instant::now() < until, "{:?}: nothing in the dlq", b.kind);
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let on_wire = carried(dead.properties.as_ref().unwrap()).expect("a traceparent on the dlq copy");
            assert_eq!(on_wire.trace_id(), trace, "{:?}", b.kind);
            let set_aside = span_where("send", "span_id", &on_wire.span_id(), any).await;
            assert_eq!(
                set_aside.field("parent_span_id"),
                process.field("span_id"),
                "{:?}",
                b.kind
            );
            consumer.close().await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_traceparent_is_ignored_and_the_delivery_starts_a_new_trace() {
    capture_spans();
    acemq_tests::deadline(async {
        const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let hostile: Vec<(&str, FieldValue)> = vec![
            ("integer", FieldValue::I64(7)),
            ("bytes", FieldValue::ByteArray(VALID.as_bytes().to_vec().into())),
            ("malformed", FieldValue::from("00-not-a-trace-01")),
            (
                "zero-trace",
                FieldValue::from("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            ),
            (
                "zero-span",
                FieldValue::from("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            ),
            (
                "version-ff",
                FieldValue::from("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
            ("ten-kb", FieldValue::from(format!("{VALID}{}", "-x".repeat(5 * 1024)))),
            ("not-utf8", FieldValue::LongString(vec![0xffu8; 55].into())),
        ];
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "trace-hostile").await;
            let seen = Arc::new(Mutex::new(HashMap::new()));
            let record = seen.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let id = m.properties.message_id().unwrap_or_default().to_string();
                record.lock().unwrap().insert(id, TraceContext::current());
                async { Ack::accept() }
            })
            .await
            .unwrap();
            let other = b.connect().await;
            let raw = other.channel().await.unwrap();
            raw.confirm_select().await.unwrap();
            let mut cases = hostile.clone();
            cases.push(("valid", FieldValue::from(VALID)));
            for (name, value) in &cases {
                let mut headers = FieldTable::new();
                headers.insert(TRACEPARENT_HEADER, value.clone());
                headers.insert(TRACESTATE_HEADER, FieldValue::from("congo=t61rcWkgMzE"));
                let props = BasicProperties {
                    message_id: Some(format!("{q}-{name}").as_str().into()),
                    headers: Some(headers),
                    ..Default::default()
                };
                raw.publish("", &q, true, props, serde_json::to_vec(&Order { id: 1 }).unwrap())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            other.close().await.unwrap();
            let until = Instant::now() + Duration::from_secs(20);
            while seen.lock().unwrap().len() < cases.len() {
                assert!(Instant::now() < until, "{:?}: every message handled", b.kind);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let seen = seen.lock().unwrap().clone();
            for (name, _) in &hostile {
                let id = format!("{q}-{name}");
                let context = seen[&id].clone().expect("a new trace while spans are recorded");
                assert_ne!(
                    context.trace_id(),
                    "4bf92f3577b34da6a3ce929d0e0e4736",
                    "{:?}: {name}",
                    b.kind
                );
                assert_eq!(
                    context.tracestate(),
                    None,
                    "{:?}: {name}: no state without a parent",
                    b.kind
                );
                let process = span_where("process", "messaging.message.id", &id, any).await;
                assert_eq!(process.field("parent_span_id"), None, "{:?}: {name}", b.kind);
                assert_eq!(process.field("trace_id"), Some(context.trace_id().as_str()));
            }
            let valid = seen[&format!("{q}-valid")].clone().expect("the carried trace");
            assert_eq!(valid.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736", "{:?}", b.kind);
            assert_eq!(valid.tracestate(), Some("congo=t61rcWkgMzE"));
            assert_eq!(depth(&ch, &q).await, 0, "{:?}: every one acked", b.kind);
            assert!(!consumer.is_finished());
            consumer.close().await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_in_an_applications_scope_continues_its_trace_and_every_publish_carries_one() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "trace-scope").await;
            let given =
                TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Some("k=v")).unwrap();
            let envelope = Envelope::new();
            let id = envelope.id.clone();
            let publisher = conn.publisher::<Order>("", &q);
            given
                .clone()
                .in_scope(publisher.send_envelope(envelope, &Order { id: 1 }))
                .await
                .unwrap();
            let send = span_where("send", "messaging.message.id", &id, any).await;
            assert_eq!(send.field("trace_id"), Some(given.trace_id().as_str()), "{:?}", b.kind);
            assert_eq!(send.field("parent_span_id"), Some("b7ad6b7169203331"));
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            let on_wire = carried(got.properties.as_ref().unwrap()).expect("a traceparent");
            assert_eq!(on_wire.trace_id(), given.trace_id());
            assert_eq!(Some(on_wire.span_id().as_str()), send.field("span_id"));
            assert_eq!(
                on_wire.tracestate(),
                Some("k=v"),
                "{:?}: the vendors' state goes on",
                b.kind
            );

            // `Conn::publish_confirmed` (a library publish) outside a scope
            // starts a trace; in one, continues it.
            let raw_id = unique("raw");
            let props = BasicProperties {
                message_id: Some(raw_id.as_str().into()),
                ..Default::default()
            };
            conn.publish_confirmed("", &q, true, props.clone(), "{\"id\":2}".into())
                .await
                .unwrap();
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            let fresh = carried(got.properties.as_ref().unwrap()).expect("a new trace");
            assert_ne!(fresh.trace_id(), given.trace_id());
            given
                .clone()
                .in_scope(conn.publish_confirmed("", &q, true, props, "{\"id\":3}".into()))
                .await
                .unwrap();
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            let continued = carried(got.properties.as_ref().unwrap()).expect("the scope's trace");
            assert_eq!(continued.trace_id(), given.trace_id(), "{:?}", b.kind);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// The one message `queue` gets, within 20 s.
async fn take(ch: &Channel, queue: &str) -> acemq_core::amqp::GetMessage {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(m) = ch.basic_get(queue, true).await.unwrap() {
            return m;
        }
        assert!(Instant::now() < until, "nothing in {queue}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ack_then_output_a_replay_and_a_scheduled_delivery_continue_the_trace() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            // `Ack::then`: the output's publish is a child of the input's
            // delivery.
            let (input, ch) = queue(&conn, "trace-then-in").await;
            let (output, _) = queue(&conn, "trace-then-out").await;
            let consumer = consume(&conn, &input, |m: Message<Order>| async move {
                Ack::then(&Order { id: m.payload.id + 1 })
            })
            .then(&conn.publisher::<Order>("", &output))
            .await
            .unwrap();
            let (id, trace, _) = send_traced(&conn, &input).await;
            let got = take(&ch, &output).await;
            let on_wire = carried(got.properties.as_ref().unwrap()).expect("the output carries the trace");
            assert_eq!(on_wire.trace_id(), trace, "{:?}: Ack::then", b.kind);
            let process = span_where("process", "messaging.message.id", &id, any).await;
            let hop = span_where("send", "span_id", &on_wire.span_id(), any).await;
            assert_eq!(hop.field("parent_span_id"), process.field("span_id"), "{:?}", b.kind);
            consumer.close().await.unwrap();
            delete(&ch, &input).await;
            delete(&ch, &output).await;

            // A replay, outside any handler, continues the trace the dead
            // letter carries.
            let (q, ch) = queue(&conn, "trace-replay").await;
            let consumer = consume(&conn, &q, |_: Message<Order>| async { Ack::retry(fatal("no")) })
                .await
                .unwrap();
            let (_, trace, _) = send_traced(&conn, &q).await;
            let dlq = format!("{q}.dlq");
            let until = Instant::now() + Duration::from_secs(20);
            while depth(&ch, &dlq).await == 0 {
                assert!(Instant::now() < until, "{:?}: nothing dead-lettered", b.kind);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            consumer.close().await.unwrap();
            let report = conn.replay(&dlq, acemq_core::ReplayOptions::default()).await.unwrap();
            assert_eq!(report.replayed, 1, "{:?}: {report:?}", b.kind);
            let replayed = take(&ch, &q).await;
            let on_wire = carried(replayed.properties.as_ref().unwrap()).expect("the replayed copy's trace");
            assert_eq!(on_wire.trace_id(), trace, "{:?}: a replay", b.kind);
            delete(&ch, &q).await;

            // A scheduled send: the scheduler's delivery continues it.
            let (q, ch) = queue(&conn, "trace-scheduled").await;
            let scheduler = acemq_core::Scheduler::start(&conn).await.unwrap();
            let envelope = Envelope::new();
            let id = envelope.id.clone();
            conn.publisher::<Order>("", &q)
                .send_envelope_after(envelope, &Order { id: 4 }, Duration::from_secs(1))
                .await
                .unwrap();
            let scheduled = span_where("send", "messaging.message.id", &id, any).await;
            let delivered = take(&ch, &q).await;
            let on_wire = carried(delivered.properties.as_ref().unwrap()).expect("the delivered copy's trace");
            assert_eq!(
                Some(on_wire.trace_id().as_str()),
                scheduled.field("trace_id"),
                "{:?}",
                b.kind
            );
            scheduler.close().await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_outbox_relay_continues_the_trace_a_message_was_enqueued_in() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "trace-outbox").await;
            let (_place, pool) = acemq_tests::db::sqlite().await;
            let outbox = acemq_core::outbox::Outbox::new(pool.clone());
            outbox.migrate().await.unwrap();
            let publisher = conn.publisher::<Order>("", &q);
            let given = TraceContext::new_root();
            let mut tx = pool.begin().await.unwrap();
            given
                .clone()
                .in_scope(outbox.enqueue(&mut tx, &publisher, Envelope::new(), &Order { id: 1 }))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            // The relay runs in no context of its own.
            let batch = outbox.relay(&conn).run_once().await.unwrap();
            assert_eq!(batch.dispatched, 1, "{:?}: {batch:?}", b.kind);
            let got = take(&ch, &q).await;
            let on_wire = carried(got.properties.as_ref().unwrap()).expect("the relayed copy's trace");
            assert_eq!(on_wire.trace_id(), given.trace_id(), "{:?}", b.kind);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_a_recovery_hands_back_keeps_its_properties_and_continues_the_same_trace() {
    capture_spans();
    acemq_tests::deadline(async {
        for b in brokers().await {
            let name = unique("trace-recovery");
            let lost = Arc::new(tokio::sync::Semaphore::new(0));
            let seen_lost = lost.clone();
            let mut config = acemq_core::Config::default()
                .with_recovery_delay(Duration::from_millis(50))
                .with_recovery_delay_max(Duration::from_millis(400));
            config.on_recovery = Some(Arc::new(move |event| {
                if matches!(event, acemq_core::RecoveryEvent::Lost { which: "consume", .. }) {
                    seen_lost.add_permits(1);
                }
            }));
            config.engine.connection_name = Some(name.clone());
            let conn = b.conn_with(config).await;
            let (q, ch) = queue(&conn, "trace-recovery").await;
            let running = Arc::new(tokio::sync::Semaphore::new(0));
            let calls = Arc::new(Mutex::new(Vec::new()));
            let (record, started, lost_seen) = (calls.clone(), running.clone(), lost.clone());
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let call = {
                    let mut calls = record.lock().unwrap();
                    calls.push((
                        m.envelope.attempt,
                        TraceContext::current(),
                        m.properties.priority(),
                        m.properties.app_id().map(str::to_string),
                    ));
                    calls.len()
                };
                let (started, lost_seen) = (started.clone(), lost_seen.clone());
                async move {
                    if call == 1 {
                        // Still running when the connection is lost: its ack
                        // cannot reach the broker, which delivers it again.
                        started.add_permits(1);
                        let _ = tokio::time::timeout(Duration::from_secs(30), lost_seen.acquire()).await;
                    }
                    Ack::accept()
                }
            })
            .await
            .unwrap();
            let envelope = Envelope::new();
            let id = envelope.id.clone();
            let outgoing = acemq_core::Outgoing::new()
                .priority(4)
                .app_id("shop")
                .envelope(envelope);
            conn.publisher::<Order>("", &q)
                .send_with(&Order { id: 1 }, outgoing)
                .await
                .unwrap();
            let _ = tokio::time::timeout(Duration::from_secs(20), running.acquire())
                .await
                .expect("the first call started");
            b.force_close(&format!("{name}-consume"));
            let until = Instant::now() + Duration::from_secs(30);
            while calls.lock().unwrap().len() < 2 {
                assert!(
                    Instant::now() < until,
                    "{:?}: delivered again after the recovery",
                    b.kind
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let send = span_where("send", "messaging.message.id", &id, any).await;
            let trace = send.field("trace_id").unwrap().to_string();
            let calls = calls.lock().unwrap().clone();
            for (attempt, context, priority, app_id) in &calls[..2] {
                assert_eq!((*priority, app_id.as_deref()), (Some(4), Some("shop")), "{:?}", b.kind);
                assert_eq!(
                    context.as_ref().map(|c| c.trace_id()),
                    Some(trace.clone()),
                    "{:?}: attempt {attempt}",
                    b.kind
                );
                let attempt = attempt.to_string();
                let process = span_where("process", "messaging.message.id", &id, |s| {
                    s.field("attempt") == Some(attempt.as_str())
                })
                .await;
                assert_eq!(
                    process.field("parent_span_id"),
                    send.field("span_id"),
                    "{:?}: attempt {attempt}",
                    b.kind
                );
            }
            assert_eq!(calls[0].0 + 1, calls[1].0, "{:?}: the redelivery counts", b.kind);
            consumer.close().await.unwrap();
            // The first channel died with its connection.
            drop(ch);
            let ch = conn.consuming_connection().channel().await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}
