//! What the consumer publishes of a delivery it holds (a set-aside to
//! `.dlq` or `.parked`, a retry) never fails into a hot loop nor loses the
//! message: a queue deleted behind its back is declared again, other
//! failures are tried again after a capped backoff while the delivery is
//! held, a copy too large for `frame_max` is trimmed, and each failure is
//! counted in `acemq_set_aside_failed_total{reason}`. Run on every broker.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_codec::{BasicProperties, FieldTable, FieldValue, QueueBind, QueueDeclare, QueueDelete};
use acemq_core::envelope::{ERROR_HEADER, ORIGINAL_EXCHANGE_HEADER, SOURCE_QUEUE_HEADER};
use acemq_core::metrics_names::SET_ASIDE_FAILED_TOTAL;
use acemq_core::{consume, fatal, Ack, Codec, CodecError, Conn, Json, Message, RetryPolicy, Topology};
use acemq_tests::{brokers, counted_by, unique, Broker};
use tokio::time::Instant;

/// Runs `scenario` once per broker, each on a runtime of its own under the
/// test deadline.
fn on_every_broker<F, Fut>(scenario: F)
where
    F: Fn(Broker) -> Fut,
    Fut: Future<Output = ()>,
{
    let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
    for b in all {
        let kind = b.kind;
        let failed = counted_by(SET_ASIDE_FAILED_TOTAL, "reason", scenario(b));
        eprintln!("{kind:?}: acemq_set_aside_failed_total {failed:?}");
    }
}

/// JSON, counting every decode: one per delivery of a message, whether or
/// not it decodes.
#[derive(Clone, Default)]
struct Counting(Arc<AtomicUsize>);

impl Codec for Counting {
    fn content_type(&self) -> &str {
        Json.content_type()
    }

    fn encode<T: serde::Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Json.encode(value)
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Json.decode(bytes)
    }
}

async fn setup(b: &Broker) -> (Conn, String) {
    let conn = b.conn().await;
    let q = unique("setaside");
    Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
    (conn, q)
}

async fn delete(conn: &Conn, queue: &str) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    ch.queue_delete(QueueDelete {
        queue: queue.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let _ = ch.close().await;
}

async fn cleanup(conn: &Conn, q: &str) {
    for name in [q.to_string(), format!("{q}.dlq"), format!("{q}.parked")] {
        delete(conn, &name).await;
    }
    conn.close().await.unwrap();
}

/// Publishes `body` with `headers` straight into `q`, as another client would.
async fn publish_raw(conn: &Conn, q: &str, id: &str, headers: FieldTable, body: &[u8]) {
    let ch = conn.publishing_connection().channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let props = BasicProperties {
        message_id: Some(id.into()),
        headers: Some(headers),
        ..Default::default()
    };
    ch.publish("", q, true, props, bytes::Bytes::copy_from_slice(body))
        .await
        .unwrap()
        .await
        .unwrap();
    let _ = ch.close().await;
}

/// Takes the next message of `queue`, waiting for it up to 20 s.
async fn take_eventually(conn: &Conn, queue: &str) -> acemq_core::amqp::GetMessage {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        // A queue not declared again yet closes the channel (404): a new one each time.
        let ch = conn.consuming_connection().channel().await.unwrap();
        match ch.basic_get(queue, true).await {
            Ok(Some(m)) => return m,
            Ok(None) => {
                let _ = ch.close().await;
            }
            Err(err) if err.reply_code() == Some(404) => {}
            Err(err) => panic!("basic.get of {queue}: {err}"),
        }
        assert!(Instant::now() < until, "nothing in {queue} within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn header(m: &acemq_core::amqp::GetMessage, key: &str) -> Option<String> {
    let value = m.properties.as_ref().ok()?.headers.as_ref()?.get(key)?;
    value.as_str().map(str::to_string)
}

#[test]
fn an_undecodable_message_whose_dlq_was_deleted_lands_in_the_dlq_declared_again_after_one_delivery() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b| async move {
            let (conn, q) = setup(&b).await;
            let decodes = Counting::default();
            let consumer = consume(&conn, &q, |_: Message<u32>| async { Ack::accept() })
                .with_codec(decodes.clone())
                .await
                .unwrap();
            // Behind the consumer's back, its dlq goes away.
            delete(&conn, &format!("{q}.dlq")).await;
            publish_raw(&conn, &q, "bad-1", FieldTable::new(), b"not json {").await;
            let dead = take_eventually(&conn, &format!("{q}.dlq")).await;
            let error = header(&dead, ERROR_HEADER).unwrap_or_default();
            assert!(error.contains("could not be decoded"), "{:?}: {error}", b.kind);
            assert_eq!(header(&dead, SOURCE_QUEUE_HEADER).as_deref(), Some(q.as_str()));
            assert_eq!(&dead.body[..], b"not json {");
            // No loop: a while later it has still been delivered once.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(decodes.0.load(Ordering::SeqCst), 1, "{:?}: deliveries of it", b.kind);
            consumer.close().await.unwrap();
            cleanup(&conn, &q).await;
        });
    })
}

#[test]
fn a_give_up_and_a_park_whose_queues_were_deleted_are_set_aside_after_one_handler_call_each_and_counted() {
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
        for b in all {
            let kind = b.kind;
            let calls = Arc::new(AtomicUsize::new(0));
            let seen = calls.clone();
            let failed = counted_by(SET_ASIDE_FAILED_TOTAL, "reason", async move {
                let (conn, q) = setup(&b).await;
                let consumer = consume(&conn, &q, move |m: Message<u32>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    let ack = if m.payload == 1 {
                        Ack::retry(fatal("the order is malformed"))
                    } else {
                        Ack::park("needs a person")
                    };
                    async move { ack }
                })
                .retry_with(RetryPolicy::fixed(5, Duration::ZERO))
                .await
                .unwrap();
                delete(&conn, &format!("{q}.dlq")).await;
                delete(&conn, &format!("{q}.parked")).await;
                let publisher = conn.publisher::<u32>("", &q);
                publisher.send(&1).await.unwrap();
                publisher.send(&2).await.unwrap();
                let dead = take_eventually(&conn, &format!("{q}.dlq")).await;
                assert!(header(&dead, ERROR_HEADER).unwrap_or_default().contains("malformed"));
                let parked = take_eventually(&conn, &format!("{q}.parked")).await;
                assert_eq!(header(&parked, ERROR_HEADER).as_deref(), Some("needs a person"));
                tokio::time::sleep(Duration::from_millis(500)).await;
                consumer.close().await.unwrap();
                cleanup(&conn, &q).await;
            });
            assert_eq!(calls.load(Ordering::SeqCst), 2, "{kind:?}: one handler call each");
            assert_eq!(
                failed.get("no_route"),
                Some(&2),
                "{kind:?}: each failure counted by its reason: {failed:?}"
            );
        }
    })
}

#[test]
fn a_set_aside_the_broker_refuses_is_held_and_tried_again_with_a_capped_backoff_until_it_is_taken() {
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
        for b in all {
            let kind = b.kind;
            let calls = Arc::new(AtomicUsize::new(0));
            let seen = calls.clone();
            let failed = counted_by(SET_ASIDE_FAILED_TOTAL, "reason", async move {
                let (conn, q) = setup(&b).await;
                let dlq = format!("{q}.dlq");
                let consumer = consume(&conn, &q, move |_: Message<u32>| {
                    seen.fetch_add(1, Ordering::SeqCst);
                    async { Ack::retry(fatal("no good")) }
                })
                .await
                .unwrap();
                // The dlq refuses everything for now (a full queue that
                // rejects publishes: the broker nacks).
                delete(&conn, &dlq).await;
                let ch = conn.consuming_connection().channel().await.unwrap();
                let mut full = FieldTable::new();
                full.insert("x-max-length", FieldValue::I32(0));
                full.insert("x-overflow", FieldValue::from("reject-publish"));
                let declare = |arguments: FieldTable| QueueDeclare {
                    queue: dlq.as_str().into(),
                    durable: true,
                    arguments,
                    ..Default::default()
                };
                ch.queue_declare(declare(full)).await.unwrap();
                let bind = QueueBind {
                    queue: dlq.as_str().into(),
                    exchange: "acemq.dlx".into(),
                    routing_key: dlq.as_str().into(),
                    ..Default::default()
                };
                ch.queue_bind(bind.clone()).await.unwrap();
                conn.publisher::<u32>("", &q).send(&1).await.unwrap();
                // Refused for two seconds...
                tokio::time::sleep(Duration::from_secs(2)).await;
                // ...then the queue takes messages again.
                ch.queue_delete(QueueDelete {
                    queue: dlq.as_str().into(),
                    ..Default::default()
                })
                .await
                .unwrap();
                ch.queue_declare(declare(FieldTable::new())).await.unwrap();
                ch.queue_bind(bind).await.unwrap();
                let dead = take_eventually(&conn, &dlq).await;
                assert!(header(&dead, ERROR_HEADER).unwrap_or_default().contains("no good"));
                consumer.close().await.unwrap();
                cleanup(&conn, &q).await;
            });
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{kind:?}: held, never redelivered");
            let nacked = failed.get("nacked").copied().unwrap_or(0);
            // 50 ms doubling: about six tries in two seconds; a hot loop makes hundreds.
            assert!((2..=12).contains(&nacked), "{kind:?}: {failed:?}");
        }
    })
}

#[test]
fn a_header_table_close_to_frame_max_is_set_aside_with_its_error_text_trimmed_or_its_largest_header_named() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b| async move {
            let (conn, q) = setup(&b).await;
            let frame_max = conn.publishing_connection().tuned().frame_max as usize;
            let consumer = consume(&conn, &q, |m: Message<u32>| async move {
                // A long error text: far more than the room left.
                Ack::retry(fatal(format!("order {} failed: {}", m.payload, "x".repeat(12_000))))
            })
            .await
            .unwrap();
            // 1. Room for some of the error: it is cut, the headers stay.
            let mut headers = FieldTable::new();
            headers.insert("app-big", FieldValue::from("a".repeat(frame_max - 6_000)));
            publish_raw(&conn, &q, "near-1", headers, b"1").await;
            let dead = take_eventually(&conn, &format!("{q}.dlq")).await;
            let error = header(&dead, ERROR_HEADER).unwrap();
            assert!(
                error.contains("order 1 failed: xxx") && error.ends_with('…'),
                "{:?}",
                b.kind
            );
            assert!(error.len() < 6_000, "{:?}: {} bytes", b.kind, error.len());
            assert_eq!(header(&dead, "app-big").map(|h| h.len()), Some(frame_max - 6_000));
            // 2. No room even for the envelope's headers: the largest
            //    header goes, and the error names it.
            let mut headers = FieldTable::new();
            headers.insert("app-small", FieldValue::from("kept"));
            headers.insert("app-huge", FieldValue::from("h".repeat(frame_max - 200)));
            publish_raw(&conn, &q, "near-2", headers, b"2").await;
            let dead = take_eventually(&conn, &format!("{q}.dlq")).await;
            let error = header(&dead, ERROR_HEADER).unwrap();
            assert!(error.contains("order 2 failed"), "{:?}: {error}", b.kind);
            assert!(
                error.ends_with(&format!("[headers dropped to fit frame_max {frame_max}: app-huge]")),
                "{:?}: {error}",
                b.kind
            );
            assert_eq!(header(&dead, "app-huge"), None);
            assert_eq!(header(&dead, "app-small").as_deref(), Some("kept"));
            consumer.close().await.unwrap();
            cleanup(&conn, &q).await;
        });
    })
}

/// Whether `queue` exists (a passive declare on a channel of its own).
async fn exists(conn: &Conn, queue: &str) -> bool {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let found = ch
        .queue_declare(QueueDeclare {
            queue: queue.into(),
            passive: true,
            ..Default::default()
        })
        .await
        .is_ok();
    let _ = ch.close().await;
    found
}

/// How a test tells the consumer about the service's dead-letter exchange.
#[derive(Debug, Clone, Copy)]
enum Told {
    /// `Topology::dead_letter_to` on the consumer's `Conn`.
    Topology,
    /// `Topology::dead_letter_to` with an `x-dead-letter-routing-key`.
    TopologyWithKey,
    /// The queue declared by another `Conn`; the consumer's
    /// `.dead_letter_to(exchange)`.
    Option,
}

async fn gives_up_into_the_services_dead_letter_exchange(b: &Broker, told: Told) {
    let conn = b.conn().await;
    let q = unique("dlto");
    let (dead_x, dead) = (unique("dlto.x"), unique("dlto.dead"));
    let (x, key) = (unique("dlto.orders"), "order.placed");
    // The service's dead-letter exchange and the queue that collects its
    // dead letters under the key they will come with.
    let dead_key = match told {
        Told::TopologyWithKey => "dead-key",
        _ => key,
    };
    Topology::new()
        .exchange(&dead_x, "direct")
        .exchange(&x, "direct")
        .queue(&dead)
        .bind(&dead, &dead_x, dead_key)
        .declare(&conn)
        .await
        .unwrap();
    let source = match told {
        Told::Topology => Topology::new().queue(&q).dead_letter_to(&q, &dead_x),
        Told::TopologyWithKey => {
            let mut arguments = FieldTable::new();
            arguments.insert("x-dead-letter-routing-key", FieldValue::from("dead-key"));
            Topology::new()
                .queue_with_arguments(&q, arguments)
                .dead_letter_to(&q, &dead_x)
        }
        Told::Option => Topology::new().queue(&q).dead_letter_to(&q, &dead_x),
    };
    let source = source.bind(&q, &x, key);
    let consumer_conn = match told {
        Told::Option => {
            // Declared elsewhere: this Conn has no record of its arguments.
            let other = b.conn().await;
            source.declare(&other).await.unwrap();
            other.close().await.unwrap();
            b.conn().await
        }
        _ => {
            source.declare(&conn).await.unwrap();
            conn.clone()
        }
    };
    let builder = consume(&consumer_conn, &q, |m: Message<u32>| async move {
        match m.payload {
            1 => Ack::retry(fatal("order 1 is malformed")),
            _ => Ack::park("needs a person"),
        }
    });
    let consumer = match told {
        Told::Option => builder.dead_letter_to(&dead_x),
        _ => builder,
    }
    .await
    .unwrap();
    let publisher = conn.publisher::<u32>(&x, key).mandatory();
    let envelope = acemq_core::Envelope::new()
        .with_correlation_id("corr-1")
        .with_causation_id("cause-1");
    let id = envelope.id.clone();
    publisher.send_envelope(envelope, &1).await.unwrap();
    publisher.send(&2).await.unwrap();

    let got = take_eventually(&conn, &dead).await;
    assert_eq!(got.exchange.as_str(), Some(dead_x.as_str()), "{:?} {told:?}", b.kind);
    assert_eq!(got.routing_key.as_str(), Some(dead_key), "{:?} {told:?}", b.kind);
    let error = header(&got, ERROR_HEADER).unwrap_or_default();
    assert!(error.contains("order 1 is malformed"), "{:?} {told:?}: {error}", b.kind);
    let props = got.properties.as_ref().unwrap();
    let envelope = acemq_core::Envelope::read_from(props);
    assert_eq!(envelope.id, id, "{:?} {told:?}", b.kind);
    assert_eq!(envelope.correlation_id.as_deref(), Some("corr-1"));
    assert_eq!(envelope.causation_id.as_deref(), Some("cause-1"));
    assert_eq!(envelope.attempt, 1);
    assert_eq!(header(&got, ORIGINAL_EXCHANGE_HEADER).as_deref(), Some(x.as_str()));
    // A park still goes to `{queue}.parked`; there is no `{queue}.dlq`.
    let parked = take_eventually(&conn, &format!("{q}.parked")).await;
    assert_eq!(header(&parked, ERROR_HEADER).as_deref(), Some("needs a person"));
    assert!(
        !exists(&conn, &format!("{q}.dlq")).await,
        "{:?} {told:?}: no .dlq declared",
        b.kind
    );
    consumer.close().await.unwrap();
    for name in [q.clone(), dead.clone(), format!("{q}.parked")] {
        delete(&conn, &name).await;
    }
    if matches!(told, Told::Option) {
        consumer_conn.close().await.unwrap();
    }
    conn.close().await.unwrap();
}

#[test]
fn a_consumer_of_a_queue_declared_with_dead_letter_to_gives_up_into_that_exchange_and_declares_no_dlq() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b| async move {
            gives_up_into_the_services_dead_letter_exchange(&b, Told::Topology).await;
            gives_up_into_the_services_dead_letter_exchange(&b, Told::TopologyWithKey).await;
        });
    })
}

#[test]
fn a_consumer_told_dead_letter_to_gives_up_into_that_exchange_and_declares_no_dlq() {
    acemq_tests::deadline_blocking(|| {
        on_every_broker(|b| async move {
            gives_up_into_the_services_dead_letter_exchange(&b, Told::Option).await;
        });
    })
}
