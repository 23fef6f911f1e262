//! Message properties in the typed API, on every broker: what a send sets
//! per message (`Publisher::send_with` and `Outgoing`: routing key,
//! expiration, priority, reply-to, type, app-id, user headers) reaches the
//! broker and the handler with the envelope and the confirm unchanged; what
//! the broker would refuse is refused before anything is written; and what
//! another client writes, however hostile, reads as absent or as a typed
//! error in the handler (statement 29 of `docs/statements.md`), never a
//! panic or a stuck message.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use acemq_codec::{BasicProperties, FieldTable, FieldValue, LongString, QueueDeclare, ShortString};
use acemq_core::amqp::Channel;
use acemq_core::envelope::ATTEMPT_HEADER;
use acemq_core::properties::{DeliveryMode, HeaderError, PropertyError, MAX_EXPIRATION_MS};
use acemq_core::{consume, Ack, Conn, Envelope, Error, Message, Outgoing};
use acemq_tests::{brokers, depth, unique};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

/// A queue with these arguments, declared through the engine.
async fn queue(conn: &Conn, prefix: &str, args: FieldTable) -> (String, Channel) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let name = unique(prefix);
    ch.queue_declare(QueueDeclare {
        queue: name.as_str().into(),
        durable: true,
        arguments: args,
        ..Default::default()
    })
    .await
    .unwrap();
    (name, ch)
}

async fn delete(ch: &Channel, queue: &str) {
    let _ = ch
        .queue_delete(acemq_codec::QueueDelete {
            queue: queue.into(),
            ..Default::default()
        })
        .await;
}

/// Waits (bounded) until `queue` holds nothing, ready or unacked.
async fn drained(ch: &Channel, queue: &str, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if depth(ch, queue).await == 0 {
            return;
        }
        assert!(Instant::now() < until, "{what}: {queue} never drained");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn send_with_sets_each_property_and_the_routing_key_and_keeps_the_envelope_and_the_confirm() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "props-default-key", FieldTable::new()).await;
            let (other, _) = queue(&conn, "props-per-send-key", FieldTable::new()).await;
            // The publisher's key is `q`; this one send goes to `other`.
            let publisher = conn.publisher::<Order>("", &q).mandatory();
            let envelope = Envelope::new().with_correlation_id("conv-1");
            let id = envelope.id.clone();
            let outgoing = Outgoing::new()
                .routing_key(other.as_str())
                .priority(5)
                .expiration(Duration::from_millis(30_500))
                .reply_to("replies")
                .message_type("order.placed")
                .app_id("shop")
                .content_encoding("identity")
                .header("tenant", "acme")
                .header("weight", FieldValue::I64(12))
                .envelope(envelope);
            publisher.send_with(&Order { id: 1 }, outgoing).await.unwrap();
            assert_eq!(
                depth(&ch, &q).await,
                0,
                "{:?}: the per-send key, not the publisher's",
                b.kind
            );

            let got = ch
                .basic_get(&other, true)
                .await
                .unwrap()
                .expect("routed by the per-send key");
            let props = got.properties.as_ref().unwrap();
            assert_eq!(
                props.expiration.as_ref().unwrap(),
                "30500",
                "{:?}: whole ms as text",
                b.kind
            );
            assert_eq!(props.priority, Some(5));
            assert_eq!(props.reply_to.as_ref().unwrap(), "replies");
            assert_eq!(props.kind.as_ref().unwrap(), "order.placed");
            assert_eq!(props.app_id.as_ref().unwrap(), "shop");
            assert_eq!(props.content_encoding.as_ref().unwrap(), "identity");
            assert_eq!(props.content_type.as_ref().unwrap(), "application/json");
            assert_eq!(props.delivery_mode, Some(2));
            // The envelope as `send` writes it.
            assert_eq!(props.message_id.as_ref().unwrap(), id.as_str());
            assert_eq!(props.correlation_id.as_ref().unwrap(), "conv-1");
            let headers = props.headers.as_ref().unwrap();
            assert_eq!(headers.get(ATTEMPT_HEADER), Some(&FieldValue::I32(1)));
            assert_eq!(headers.get("tenant").and_then(FieldValue::as_str), Some("acme"));
            assert_eq!(headers.get("weight"), Some(&FieldValue::I64(12)));

            // A handler reads the same, typed.
            let outgoing = Outgoing::new()
                .routing_key(other.as_str())
                .priority(7)
                .expiration(Duration::from_secs(60))
                .reply_to("replies")
                .message_type("order.placed")
                .app_id("shop")
                .header("tenant", "acme");
            publisher.send_with(&Order { id: 2 }, outgoing).await.unwrap();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let consumer = consume(&conn, &other, move |m: Message<Order>| {
                let _ = tx.send(m);
                async { Ack::accept() }
            })
            .await
            .unwrap();
            let m = tokio::time::timeout(Duration::from_secs(20), rx.recv())
                .await
                .expect("the handler ran")
                .unwrap();
            let p = &m.properties;
            assert_eq!(m.payload, Order { id: 2 });
            assert_eq!(p.priority(), Some(7), "{:?}", b.kind);
            assert_eq!(p.expiration(), Some(Duration::from_secs(60)));
            assert_eq!(p.reply_to(), Some("replies"));
            assert_eq!(p.message_type(), Some("order.placed"));
            assert_eq!(p.app_id(), Some("shop"));
            assert_eq!(p.content_type(), Some("application/json"));
            assert_eq!(p.delivery_mode(), Some(DeliveryMode::Persistent));
            assert_eq!(p.user_id(), None);
            let sent = p.timestamp().expect("a timestamp");
            assert!(SystemTime::now().duration_since(sent).unwrap_or_default() < Duration::from_secs(60));
            assert_eq!(p.header_str("tenant"), Ok(Some("acme")));
            assert_eq!(p.message_id(), Some(m.envelope.id.as_str()));
            let user: Vec<String> = p.headers().iter().map(|(k, _)| k.to_string()).collect();
            assert_eq!(user, ["tenant"], "{:?}: the managed headers are not the user's", b.kind);
            assert_eq!(m.envelope.attempt, 1);
            consumer.close().await.unwrap();
            delete(&ch, &q).await;
            delete(&ch, &other).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_honours_a_per_send_priority_and_expiration() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let args: FieldTable = [("x-max-priority", FieldValue::I32(10))].into_iter().collect();
            let (q, ch) = queue(&conn, "props-priority", args).await;
            let publisher = conn.publisher::<Order>("", &q);
            for (id, priority) in [(1, 1), (2, 9), (3, 4)] {
                publisher
                    .send_with(&Order { id }, Outgoing::new().priority(priority))
                    .await
                    .unwrap();
            }
            let mut order = Vec::new();
            while let Some(m) = ch.basic_get(&q, true).await.unwrap() {
                order.push(serde_json::from_slice::<Order>(&m.body).unwrap().id);
            }
            assert_eq!(order, [2, 3, 1], "{:?}: highest priority first", b.kind);

            // Expired in the queue: 50 ms to live, nobody takes it.
            publisher
                .send_with(&Order { id: 4 }, Outgoing::new().expiration(Duration::from_millis(50)))
                .await
                .unwrap();
            publisher
                .send_with(&Order { id: 5 }, Outgoing::new().expiration(Duration::from_secs(600)))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let left = ch.basic_get(&q, true).await.unwrap().expect("the long-lived one stays");
            assert_eq!(
                serde_json::from_slice::<Order>(&left.body).unwrap().id,
                5,
                "{:?}",
                b.kind
            );
            assert!(
                ch.basic_get(&q, true).await.unwrap().is_none(),
                "{:?}: id 4 expired",
                b.kind
            );
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn properties_the_broker_would_refuse_are_a_typed_error_and_nothing_is_sent() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "props-refused", FieldTable::new()).await;
            let publisher = conn.publisher::<Order>("", &q);
            let long = "k".repeat(256);
            let refused = [
                (Outgoing::new().routing_key(long.clone()), "routing key"),
                (Outgoing::new().reply_to(long.clone()), "reply-to"),
                (Outgoing::new().message_type(long.clone()), "type"),
                (Outgoing::new().app_id(long.clone()), "app-id"),
                (Outgoing::new().header(&long, 1), "header name"),
                (
                    Outgoing::new().expiration(Duration::from_millis(MAX_EXPIRATION_MS + 1)),
                    "expiration",
                ),
                (Outgoing::new().header("x-acemq-attempt", 99), "managed"),
                (Outgoing::new().header("x-acemq-first-seen", 0), "managed"),
                (Outgoing::new().header("traceparent", "00-x"), "managed"),
            ];
            for (outgoing, what) in refused {
                let err = publisher.send_with(&Order { id: 1 }, outgoing).await.unwrap_err();
                match (&err, what) {
                    (Error::InvalidProperties(PropertyError::TooLong { property, len: 256 }), _) => {
                        assert_eq!(*property, what)
                    }
                    (Error::InvalidProperties(PropertyError::ExpirationTooLong { .. }), "expiration") => {}
                    (Error::InvalidProperties(PropertyError::ManagedHeader { .. }), "managed") => {}
                    _ => panic!("{:?}: {what}: {err:?}", b.kind),
                }
            }
            // Headers that would not fit in one frame: the engine's encode
            // error, before anything is queued.
            let huge = Outgoing::new().header("big", "x".repeat(300 * 1024));
            let err = publisher.send_with(&Order { id: 1 }, huge).await.unwrap_err();
            assert!(matches!(err, Error::Engine(_)), "{:?}: {err:?}", b.kind);
            // Nothing was written, and the channel is still fine.
            assert_eq!(depth(&ch, &q).await, 0, "{:?}", b.kind);
            publisher
                .send_with(&Order { id: 2 }, Outgoing::new().routing_key("k".repeat(255)))
                .await
                .unwrap();
            publisher.send(&Order { id: 3 }).await.unwrap();
            assert_eq!(depth(&ch, &q).await, 1, "{:?}: the 255-byte key routes nowhere", b.kind);

            // A mandatory send to a per-send key that reaches no queue names that key.
            let mandatory = conn.publisher::<Order>("", &q).mandatory();
            let err = mandatory
                .send_with(&Order { id: 4 }, Outgoing::new().routing_key("nowhere-at-all"))
                .await
                .unwrap_err();
            match err {
                Error::Unroutable { routing_key, code, .. } => {
                    assert_eq!((routing_key.as_str(), code), ("nowhere-at-all", 312), "{:?}", b.kind)
                }
                other => panic!("{:?}: {other:?}", b.kind),
            }
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

/// What a handler read of one hostile message.
#[derive(Debug, Default, Clone)]
struct Read {
    content_type: Option<String>,
    delivery_mode: Option<DeliveryMode>,
    priority: Option<u8>,
    expiration: Option<Duration>,
    timestamp: Option<SystemTime>,
    kind: Option<String>,
    app_id: Option<String>,
    reply_to: Option<String>,
    tenant: Option<Result<Option<String>, HeaderError>>,
    count: Option<Result<Option<i64>, HeaderError>>,
    huge_len: Option<usize>,
    flag: Option<Result<Option<bool>, HeaderError>>,
    user_headers: usize,
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_29_properties_and_headers_another_client_wrote_read_as_absent_or_typed_errors_and_never_break_the_consumer(
) {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, "props-hostile", FieldTable::new()).await;
            let not_utf8 = || ShortString::from_bytes(vec![0xff, 0xfe, b'x'].into()).unwrap();
            let mut headers = FieldTable::new();
            headers.insert("tenant", FieldValue::I32(7));
            headers.insert("count", FieldValue::from("seven"));
            headers.insert("flag", FieldValue::LongString(LongString::from(vec![0xffu8, 0x00])));
            headers.insert("huge", FieldValue::from("h".repeat(64 * 1024)));
            headers.insert("x-acemq-attempt", FieldValue::from("three"));
            headers.insert("traceparent", FieldValue::I64(1));
            let hostile = BasicProperties {
                content_type: Some(not_utf8()),
                content_encoding: Some(not_utf8()),
                // (RabbitMQ refuses a delivery mode other than 1 or 2 with
                // 406, so none can arrive; the unit tests read one.)
                priority: Some(255),
                // The broker takes only digits; far ahead is still valid.
                expiration: Some("4294967295".into()),
                timestamp: Some(u64::MAX),
                kind: Some(not_utf8()),
                app_id: Some(not_utf8()),
                reply_to: Some(not_utf8()),
                headers: Some(headers),
                ..Default::default()
            };
            // Another client: the engine, no acemq envelope.
            let other = b.connect().await;
            let raw = other.channel().await.unwrap();
            raw.confirm_select().await.unwrap();
            raw.publish("", &q, true, hostile, serde_json::to_vec(&Order { id: 9 }).unwrap())
                .await
                .unwrap()
                .await
                .unwrap();
            // And one whose properties are all absent.
            raw.publish(
                "",
                &q,
                true,
                BasicProperties::default(),
                serde_json::to_vec(&Order { id: 10 }).unwrap(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
            other.close().await.unwrap();

            let reads = Arc::new(Mutex::new(Vec::new()));
            let seen = reads.clone();
            let consumer = consume(&conn, &q, move |m: Message<Order>| {
                let p = &m.properties;
                let read = Read {
                    content_type: p.content_type().map(str::to_string),
                    delivery_mode: p.delivery_mode(),
                    priority: p.priority(),
                    expiration: p.expiration(),
                    timestamp: p.timestamp(),
                    kind: p.message_type().map(str::to_string),
                    app_id: p.app_id().map(str::to_string),
                    reply_to: p.reply_to().map(str::to_string),
                    tenant: Some(p.header_str("tenant").map(|v| v.map(str::to_string))),
                    count: Some(p.header_i64("count")),
                    huge_len: p.header_str("huge").ok().flatten().map(str::len),
                    flag: Some(p.header_bool("flag")),
                    user_headers: p.headers().len(),
                };
                seen.lock().unwrap().push((m.payload.id, m.envelope.attempt, read));
                async { Ack::accept() }
            })
            .await
            .unwrap();
            drained(&ch, &q, &format!("{:?}", b.kind)).await;
            let until = Instant::now() + Duration::from_secs(10);
            while reads.lock().unwrap().len() < 2 {
                assert!(Instant::now() < until, "{:?}: both handled", b.kind);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut reads = reads.lock().unwrap().clone();
            reads.sort_by_key(|(id, _, _)| *id);
            let (id, attempt, hostile) = &reads[0];
            assert_eq!(
                (*id, *attempt),
                (9, 1),
                "{:?}: an attempt of another type reads as absent",
                b.kind
            );
            assert_eq!(hostile.content_type, None, "{:?}: not UTF-8", b.kind);
            assert_eq!(hostile.delivery_mode, None, "{:?}", b.kind);
            assert_eq!(hostile.priority, Some(255));
            assert_eq!(hostile.expiration, Some(Duration::from_millis(MAX_EXPIRATION_MS)));
            assert_eq!(hostile.timestamp, None, "{:?}: out of range", b.kind);
            assert_eq!(
                (&hostile.kind, &hostile.app_id, &hostile.reply_to),
                (&None, &None, &None)
            );
            assert!(
                matches!(&hostile.tenant, Some(Err(HeaderError::WrongType { found: 'I', .. }))),
                "{:?}: {:?}",
                b.kind,
                hostile.tenant
            );
            assert!(matches!(
                &hostile.count,
                Some(Err(HeaderError::WrongType { found: 'S', .. }))
            ));
            assert!(matches!(
                &hostile.flag,
                Some(Err(HeaderError::WrongType { found: 'S', .. }))
            ));
            assert_eq!(hostile.huge_len, Some(64 * 1024));
            assert_eq!(hostile.user_headers, 4, "{:?}: tenant, count, flag, huge", b.kind);
            let (id, _, empty) = &reads[1];
            assert_eq!(*id, 10);
            assert_eq!(
                (
                    empty.content_type.clone(),
                    empty.priority,
                    empty.expiration,
                    empty.timestamp
                ),
                (None, None, None, None)
            );
            assert_eq!(empty.tenant, Some(Ok(None)));
            assert_eq!(empty.user_headers, 0);
            assert!(!consumer.is_finished(), "{:?}: the consumer goes on", b.kind);
            consumer.close().await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}
