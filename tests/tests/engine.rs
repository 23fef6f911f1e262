//! The engine scenarios of the behaviour suite, run against every broker
//! (RabbitMQ 4.0 over TLS included: `all_brokers`):
//! handshake and tuning, channels, heartbeats, round trips with every
//! property and field type, confirms, returns, channel and connection errors,
//! a broker-forced close, and TLS verification.

use std::time::Duration;

use acemq_codec::{
    BasicConsume, BasicProperties, BasicQos, Decimal, ExchangeDeclare, FieldArray, FieldTable, FieldValue, QueueBind,
    QueueDeclare, ReplyCode,
};
use acemq_core::amqp::{CloseReason, Confirmation, Connection, Error, Properties, TlsConfig};
use acemq_tests::{all_brokers, exclusive_queue, unique, Broker, Kind, RabbitVersion};
use bytes::{Bytes, BytesMut};

fn props_of(p: &Properties) -> &BasicProperties {
    p.as_ref().expect("properties decode")
}

fn encoded(p: &BasicProperties) -> BytesMut {
    let mut out = BytesMut::new();
    p.encode(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn handshake_negotiates_tune_values_and_opens_many_channels() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let url = format!("{}?heartbeat=30&frame_max=65536&channel_max=100", b.url);
            let conn = Connection::open(&url, b.config()).await.unwrap();
            let tuned = conn.tuned();
            assert_eq!(
                (tuned.channel_max, tuned.frame_max, tuned.heartbeat),
                (100, 65536, 30),
                "{:?}",
                b.kind
            );
            let product = conn.server_properties().get("product").and_then(FieldValue::as_str);
            assert_eq!(product, Some(if b.is_rabbitmq() { "RabbitMQ" } else { "acemq-memory" }));

            let mut channels = Vec::new();
            for _ in 0..50 {
                channels.push(conn.channel().await.unwrap());
            }
            let mut ids: Vec<u16> = channels.iter().map(|c| c.id()).collect();
            ids.sort_unstable();
            assert_eq!(ids, (1..=50).collect::<Vec<_>>());
            for ch in &channels[..25] {
                ch.close().await.unwrap();
                assert!(!ch.is_open());
            }
            // Freed numbers are reused, lowest first.
            assert_eq!(conn.channel().await.unwrap().id(), 1);
            assert!(channels[30].is_open());
            conn.close().await.unwrap();
            assert_eq!(conn.closed().await, CloseReason::ByClient);
            assert!(matches!(
                conn.channel().await,
                Err(Error::ConnectionClosed(CloseReason::ByClient))
            ));
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frame_max_below_8192_is_raised_to_8192() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = Connection::open(&format!("{}?frame_max=4096", b.url), b.config())
                .await
                .unwrap();
            assert_eq!(conn.tuned().frame_max, 8192);
            // A body larger than a frame is split and comes back whole.
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let body: Bytes = (0..50_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
            let confirm = ch
                .publish("", &q, false, BasicProperties::default(), body.clone())
                .await
                .unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            assert_eq!(got.body, body);
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn heartbeat_keeps_an_idle_connection_up_past_three_intervals() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = Connection::open(&format!("{}?heartbeat=1", b.url), b.config())
                .await
                .unwrap();
            assert_eq!(conn.tuned().heartbeat, 1);
            let ch = conn.channel().await.unwrap();
            tokio::time::sleep(Duration::from_millis(3500)).await;
            assert!(!conn.is_closed(), "{:?}: closed by {:?}", b.kind, conn.close_reason());
            let q = exclusive_queue(&ch).await;
            assert!(!q.is_empty());
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A headers table with every field type RabbitMQ defines.
fn every_field_type() -> FieldTable {
    let mut nested = FieldTable::new();
    nested.insert("inner", FieldValue::I32(7));
    let mut t = FieldTable::new();
    t.insert("t", FieldValue::Bool(true));
    t.insert("b", FieldValue::I8(-5));
    t.insert("B", FieldValue::U8(250));
    t.insert("s", FieldValue::I16(-30_000));
    t.insert("u", FieldValue::U16(60_000));
    t.insert("I", FieldValue::I32(-2_000_000_000));
    t.insert("i", FieldValue::U32(4_000_000_000));
    t.insert("l", FieldValue::I64(-9_000_000_000_000));
    t.insert("f", FieldValue::F32(1.5));
    t.insert("d", FieldValue::F64(-2.25));
    t.insert("D", FieldValue::Decimal(Decimal { scale: 2, value: 12345 }));
    t.insert("S", FieldValue::from("long string"));
    t.insert(
        "A",
        FieldValue::Array(FieldArray(vec![
            FieldValue::I32(1),
            FieldValue::from("two"),
            FieldValue::Void,
        ])),
    );
    t.insert("T", FieldValue::Timestamp(1_700_000_000));
    t.insert("F", FieldValue::Table(nested));
    t.insert("V", FieldValue::Void);
    t.insert("x", FieldValue::ByteArray(Bytes::from_static(&[0, 1, 2, 0xff])));
    t
}

/// The properties `b` gives back for a message published with `sent`.
/// RabbitMQ 3.10 (and acemq-memory) gives them back byte for byte.
/// RabbitMQ 4.0 gives the headers table back sorted by key (byte order; it
/// merges the message's annotations into it and sorts the lot, even for a
/// classic queue and when there are none), with nested tables as sent;
/// every other property comes back as sent.
fn as_given_back_by(b: &Broker, sent: &BasicProperties) -> BasicProperties {
    match b.version() {
        None | Some(RabbitVersion::V3_10) => sent.clone(),
        Some(RabbitVersion::V4_0) => {
            let mut back = sent.clone();
            if let Some(headers) = &sent.headers {
                let mut entries = headers.entries().to_vec();
                entries.sort_by(|(a, _), (b, _)| a.as_bytes().cmp(b.as_bytes()));
                back.headers = Some(entries.into_iter().collect());
            }
            back
        }
    }
}

fn all_properties(id: &str) -> BasicProperties {
    BasicProperties {
        content_type: Some("application/json".into()),
        content_encoding: Some("identity".into()),
        headers: Some(every_field_type()),
        delivery_mode: Some(2),
        priority: Some(3),
        correlation_id: Some("corr-1".into()),
        reply_to: Some("replies".into()),
        expiration: Some("600000".into()),
        message_id: Some(id.into()),
        timestamp: Some(1_700_000_123),
        kind: Some("order.placed".into()),
        user_id: Some("guest".into()),
        app_id: Some("acemq-tests".into()),
        cluster_id: Some("cluster-a".into()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn properties_shared_by_many_publishes_come_back_on_each_and_are_released() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let shared = std::sync::Arc::new(all_properties("m-shared"));
            let mut confirms = Vec::new();
            for i in 0..20 {
                let body = Bytes::from(format!("body-{i}"));
                confirms.push(ch.publish("", &q, true, shared.clone(), body).await.unwrap());
            }
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            }
            // Written and confirmed: the engine holds no copy any more.
            assert_eq!(std::sync::Arc::strong_count(&shared), 1, "{:?}", b.kind);
            for i in 0..20 {
                let got = ch.basic_get(&q, true).await.unwrap().expect("a message");
                assert_eq!(got.body, format!("body-{i}").as_bytes(), "{:?}", b.kind);
                assert_eq!(
                    encoded(props_of(&got.properties)),
                    encoded(&as_given_back_by(&b, &shared)),
                    "{:?}",
                    b.kind
                );
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn properties_given_by_value_come_back_as_given_whether_or_not_they_equal_the_last() {
    acemq_tests::deadline(async {
        // Runs of equal properties (shared by the channel), each broken by
        // one field, by headers, and by equal headers (never shared).
        let plain = |expiration: &str, message_id: &str| BasicProperties {
            delivery_mode: Some(2),
            expiration: Some(expiration.into()),
            message_id: Some(message_id.into()),
            ..Default::default()
        };
        let with_headers = BasicProperties {
            headers: Some(every_field_type()),
            ..plain("1000", "a")
        };
        let given = [
            plain("1000", "a"),
            plain("1000", "a"),
            plain("1000", "a"),
            plain("2000", "a"),
            plain("1000", "a"),
            plain("1000", "b"),
            with_headers.clone(),
            with_headers,
            plain("1000", "b"),
            BasicProperties::default(),
            BasicProperties::default(),
            plain("1000", "a"),
        ];
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let mut confirms = Vec::new();
            for (i, props) in given.iter().enumerate() {
                let body = Bytes::from(format!("body-{i}"));
                confirms.push(ch.publish("", &q, true, props.clone(), body).await.unwrap());
            }
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            }
            for (i, props) in given.iter().enumerate() {
                let got = ch.basic_get(&q, true).await.unwrap().expect("a message");
                assert_eq!(got.body, format!("body-{i}").as_bytes(), "{:?}", b.kind);
                assert_eq!(
                    encoded(props_of(&got.properties)),
                    encoded(&as_given_back_by(&b, props)),
                    "message {i} on {:?}",
                    b.kind
                );
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

/// On RabbitMQ 4.0 byte-identical but for the headers' order: they come
/// back sorted by key (see `as_given_back_by`), which is asserted exactly.
#[tokio::test(flavor = "multi_thread")]
async fn all_14_properties_and_every_field_type_come_back_byte_identical() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let exchange = unique("direct");
            ch.exchange_declare(ExchangeDeclare {
                exchange: exchange.as_str().into(),
                kind: "direct".into(),
                auto_delete: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let q = exclusive_queue(&ch).await;
            ch.queue_bind(QueueBind {
                queue: q.as_str().into(),
                exchange: exchange.as_str().into(),
                routing_key: "k".into(),
                ..Default::default()
            })
            .await
            .unwrap();

            let sent = all_properties("m-get");
            let confirm = ch.publish(&exchange, "k", true, sent.clone(), "body-1").await.unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            let got = ch.basic_get(&q, false).await.unwrap().expect("a message");
            let expected = as_given_back_by(&b, &sent);
            assert_eq!(props_of(&got.properties), &expected, "{:?}", b.kind);
            assert_eq!(
                encoded(props_of(&got.properties)),
                encoded(&expected),
                "byte-identical after {:?}",
                b.kind
            );
            assert_eq!(&got.body[..], b"body-1");
            assert_eq!(got.exchange, exchange.as_str());
            assert_eq!(got.routing_key, "k");
            got.ack().unwrap();

            // The same through a consumer.
            let sent = all_properties("m-consume");
            ch.publish(&exchange, "k", false, sent.clone(), "body-2")
                .await
                .unwrap()
                .await
                .unwrap();
            let mut consumer = ch.consume(&q).await.unwrap();
            let delivery = consumer.next().await.unwrap();
            assert_eq!(
                encoded(props_of(&delivery.properties)),
                encoded(&as_given_back_by(&b, &sent)),
                "{:?}",
                b.kind
            );
            assert_eq!(&delivery.body[..], b"body-2");
            assert!(!delivery.redelivered);
            delivery.ack().unwrap();
            consumer.cancel().await.unwrap();
            assert!(consumer.next().await.is_none(), "a cancelled consumer's stream ends");
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn ack_nack_and_reject_settle_deliveries_as_asked() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            for body in ["a", "b", "c"] {
                ch.publish("", &q, false, BasicProperties::default(), Bytes::from(body))
                    .await
                    .unwrap()
                    .await
                    .unwrap();
            }
            ch.qos(10).await.unwrap();
            let mut consumer = ch.consume(&q).await.unwrap();
            let a = consumer.next().await.unwrap();
            let b_ = consumer.next().await.unwrap();
            let c = consumer.next().await.unwrap();
            assert_eq!([&a.body[..], &b_.body[..], &c.body[..]], [b"a", b"b", b"c"]);
            a.nack(true).unwrap(); // back in the queue, redelivered
            b_.reject(false).unwrap(); // gone
            c.ack().unwrap();
            let again = consumer.next().await.unwrap();
            assert_eq!(&again.body[..], b"a");
            assert!(
                again.redelivered,
                "{:?}: a requeued message is flagged redelivered",
                b.kind
            );
            again.ack().unwrap();
            consumer.cancel().await.unwrap();
            let empty = ch.basic_get(&q, false).await.unwrap();
            assert!(
                empty.is_none(),
                "nothing left: a acked after requeue, b rejected, c acked"
            );
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Publishes the bodies "0", "1", … to `queue`, all in flight at once, then
/// awaits each confirm: every one must be an ack.
async fn publish_numbered_and_confirmed(ch: &acemq_core::amqp::Channel, queue: &str, count: u32, kind: Kind) {
    let mut confirms = Vec::new();
    for i in 0..count {
        let body = Bytes::from(format!("{i}"));
        confirms.push(
            ch.publish("", queue, false, BasicProperties::default(), body)
                .await
                .unwrap(),
        );
    }
    for confirm in confirms {
        assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{kind:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pipelined_publishes_are_all_confirmed_in_order() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            publish_numbered_and_confirmed(&ch, &q, 2000, b.kind).await;
            assert_eq!(acemq_tests::depth(&ch, &q).await, 2000);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_with_room_is_queued_as_it_is_called_not_as_it_is_awaited() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let publish = |i: u32| ch.publish("", &q, false, BasicProperties::default(), Bytes::from(format!("{i}")));
            let pending: Vec<_> = (0..3).map(publish).collect();
            // Never awaited: it was queued when it was called all the same.
            drop(publish(3));
            let mut confirms = Vec::new();
            for future in pending.into_iter().rev() {
                confirms.push(future.await.unwrap());
            }
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            }
            let mut bodies = Vec::new();
            while let Some(message) = ch.basic_get(&q, true).await.unwrap() {
                bodies.push(String::from_utf8_lossy(&message.body).into_owned());
            }
            assert_eq!(bodies, ["0", "1", "2", "3"], "in call order, on {:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Publishes the driver takes together settle as they would one by one:
/// without confirm mode every one of them at once, and those queued behind
/// their channel's close with the machine's `ChannelNotOpen`. (One thread: every publish
/// is queued before the driver runs, so it takes them in one batch.)
#[tokio::test]
async fn publishes_taken_together_resolve_as_one_by_one_without_confirms_and_behind_a_close() {
    let settled = |confirm: acemq_core::amqp::PublishConfirm| async move {
        tokio::time::timeout(Duration::from_secs(5), confirm)
            .await
            .expect("settled within 5 s")
    };
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let mut confirms = Vec::new();
            for n in 0..5 {
                let body = format!("m{n}");
                confirms.push(
                    ch.publish("", &q, false, BasicProperties::default(), body)
                        .await
                        .unwrap(),
                );
            }
            for confirm in confirms {
                assert_eq!(
                    settled(confirm).await.unwrap(),
                    Confirmation::NotRequested,
                    "{:?}",
                    b.kind
                );
            }
            let mut bodies = Vec::new();
            while let Some(message) = ch.basic_get(&q, true).await.unwrap() {
                bodies.push(String::from_utf8_lossy(&message.body).into_owned());
            }
            assert_eq!(bodies, ["m0", "m1", "m2", "m3", "m4"], "{:?}", b.kind);

            let other = ch.clone();
            let mut close = Box::pin(ch.close());
            // Polled once, without yielding: the close is queued, not yet
            // answered.
            let first =
                std::future::poll_fn(|cx| std::task::Poll::Ready(std::future::Future::poll(close.as_mut(), cx))).await;
            assert!(first.is_pending());
            let mut refused = Vec::new();
            for _ in 0..3 {
                refused.push(
                    other
                        .publish("", &q, false, BasicProperties::default(), "late")
                        .await
                        .unwrap(),
                );
            }
            close.await.unwrap();
            for confirm in refused {
                let outcome = settled(confirm).await;
                assert!(
                    matches!(
                        outcome,
                        Err(Error::Command(acemq_core::proto::CommandError::ChannelNotOpen(_)))
                    ),
                    "{:?}: {outcome:?}",
                    b.kind
                );
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kind_of_body_arrives_as_given_with_room_for_one_publish_at_a_time() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            // A publish buffer of one byte: a publish waits until the one
            // before it is written, so a borrowed body is kept as a copy.
            let conn = b.connect_with(b.config().with_publish_buffer(1)).await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let props = std::sync::Arc::new(BasicProperties::default());
            let mut buffer = b"reused-1".to_vec();
            let mut confirms = Vec::new();
            confirms.push(ch.publish("", &q, false, &props, &buffer).await.unwrap());
            buffer.clear();
            buffer.extend_from_slice(b"reused-2");
            confirms.push(ch.publish("", &q, false, &props, &buffer[..]).await.unwrap());
            let bytes = Bytes::from_static(b"bytes");
            confirms.push(ch.publish("", &q, false, &props, &bytes).await.unwrap());
            confirms.push(ch.publish("", &q, false, props.clone(), bytes).await.unwrap());
            confirms.push(ch.publish("", &q, false, &props, b"array").await.unwrap());
            confirms.push(ch.publish("", &q, false, &props, "str").await.unwrap());
            confirms.push(ch.publish("", &q, false, &props, String::from("string")).await.unwrap());
            confirms.push(ch.publish("", &q, false, &props, b"vec".to_vec()).await.unwrap());
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            }
            let mut bodies = Vec::new();
            while let Some(message) = ch.basic_get(&q, true).await.unwrap() {
                bodies.push(String::from_utf8_lossy(&message.body).into_owned());
            }
            let sent = [
                "reused-1", "reused-2", "bytes", "bytes", "array", "str", "string", "vec",
            ];
            assert_eq!(bodies, sent, "on {:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_needing_the_whole_publish_buffer_is_not_held_back_by_room_small_publishes_took_ahead() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            const BUFFER: usize = 64 * 1024;
            let conn = b.connect_with(b.config().with_publish_buffer(BUFFER)).await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            // Small publishes take their room a chunk at a time; what is
            // left of the chunk stays with the connection for the next.
            let mut confirms = Vec::new();
            for n in 0..50 {
                confirms.push(
                    ch.publish("", &q, false, BasicProperties::default(), format!("small-{n}"))
                        .await
                        .unwrap(),
                );
            }
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            }
            // Everything is written: none of that room counts as backlog.
            assert_eq!(conn.publish_backlog(), 0, "{:?}", b.kind);
            // This one needs the whole buffer, part of which the small ones'
            // chunk still holds: it is given back, and the publish goes out.
            let large = vec![b'L'; BUFFER];
            let confirm = ch
                .publish("", &q, false, BasicProperties::default(), &large)
                .await
                .unwrap();
            assert_eq!(confirm.await.unwrap(), Confirmation::Ack, "{:?}", b.kind);
            assert_eq!(acemq_tests::depth(&ch, &q).await, 51, "{:?}", b.kind);
            assert_eq!(conn.publish_backlog(), 0, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_with_reject_publish_nacks() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let mut args = FieldTable::new();
            args.insert("x-max-length", FieldValue::I32(1));
            args.insert("x-overflow", FieldValue::from("reject-publish"));
            let q = ch
                .queue_declare(QueueDeclare {
                    exclusive: true,
                    arguments: args,
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap()
                .queue
                .to_string();
            let first = ch
                .publish("", &q, false, BasicProperties::default(), "1")
                .await
                .unwrap();
            let second = ch
                .publish("", &q, false, BasicProperties::default(), "2")
                .await
                .unwrap();
            assert_eq!(first.await.unwrap(), Confirmation::Ack);
            assert_eq!(second.await.unwrap(), Confirmation::Nack, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unroutable_mandatory_publish_is_returned_312_and_paired_with_its_own_publish() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            let nowhere = unique("nowhere");
            let with_id = |id: &str| BasicProperties {
                message_id: Some(id.into()),
                ..Default::default()
            };
            // Several outstanding at once, unroutable ones in between.
            let pending = vec![
                ch.publish("", &q, true, with_id("1"), "routed-1").await.unwrap(),
                ch.publish("", &nowhere, true, with_id("2"), "lost-2").await.unwrap(),
                ch.publish("", &q, true, with_id("3"), "routed-3").await.unwrap(),
                ch.publish("", &nowhere, true, with_id("4"), "lost-4").await.unwrap(),
                ch.publish("", &nowhere, false, with_id("5"), "dropped-5")
                    .await
                    .unwrap(),
            ];
            let mut outcomes = Vec::new();
            for p in pending {
                outcomes.push(p.await.unwrap());
            }
            assert_eq!(outcomes[0], Confirmation::Ack);
            assert_eq!(outcomes[2], Confirmation::Ack);
            assert_eq!(outcomes[4], Confirmation::Ack, "not mandatory: dropped silently, acked");
            for (i, body) in [(1, "lost-2"), (3, "lost-4")] {
                let Confirmation::Returned(ret) = &outcomes[i] else {
                    panic!("{:?}: publish {} should be returned: {:?}", b.kind, i + 1, outcomes[i]);
                };
                assert_eq!(ReplyCode::from_u16(ret.reply_code), ReplyCode::NoRoute);
                assert_eq!(ret.reply_text, "NO_ROUTE");
                assert_eq!(ret.routing_key, nowhere.as_str());
                assert_eq!(&ret.body[..], body.as_bytes());
            }
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_channel_error_closes_only_that_channel() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            let name = unique("inequivalent");
            let declare = |ttl: i32| QueueDeclare {
                queue: name.as_str().into(),
                exclusive: true,
                arguments: [("x-message-ttl", FieldValue::I32(ttl))].into_iter().collect(),
                ..Default::default()
            };
            ch.queue_declare(declare(1000)).await.unwrap();
            let err = ch.queue_declare(declare(2000)).await.unwrap_err();
            let refusal = err.refusal().expect("a refusal");
            assert_eq!(
                refusal.reply_code(),
                ReplyCode::PreconditionFailed,
                "{:?}: {err}",
                b.kind
            );
            assert!(
                refusal.text.contains("inequivalent arg 'x-message-ttl'"),
                "{}",
                refusal.text
            );
            assert_eq!(refusal.method_name(), Some("queue.declare"));
            assert!(!ch.is_open());
            assert!(matches!(
                ch.queue_declare(declare(1000)).await,
                Err(Error::ChannelNotOpen(_))
            ));

            // 404 on a passive declare, on another channel of the same connection.
            let ch2 = conn.channel().await.unwrap();
            let missing = unique("missing");
            let err = ch2
                .queue_declare(QueueDeclare {
                    queue: missing.as_str().into(),
                    passive: true,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.reply_code(), Some(404));
            assert_eq!(
                err.refusal().unwrap().text,
                format!("NOT_FOUND - no queue '{missing}' in vhost '/'")
            );

            // The connection goes on.
            assert!(!conn.is_closed());
            let ch3 = conn.channel().await.unwrap();
            assert!(!exclusive_queue(&ch3).await.is_empty());
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hard_error_closes_the_connection_with_its_code() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            // RabbitMQ does not implement a prefetch window in bytes: 540, a hard error.
            let err = ch
                .basic_qos(BasicQos {
                    prefetch_size: 1,
                    prefetch_count: 0,
                    global: false,
                })
                .await
                .unwrap_err();
            assert_eq!(err.reply_code(), Some(540), "{:?}: {err}", b.kind);
            match conn.closed().await {
                CloseReason::ByServer(r) => assert_eq!(r.reply_code(), ReplyCode::NotImplemented),
                other => panic!("{other:?}"),
            }
            assert!(matches!(
                conn.channel().await,
                Err(Error::ConnectionClosed(CloseReason::ByServer(_)))
            ));
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_forced_close_is_reported_as_320_and_ends_cleanly() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let name = unique("forced");
            let conn = b.connect_with(b.config().with_connection_name(name.clone())).await;
            let ch = conn.channel().await.unwrap();
            let mut consumer = ch.consume(&exclusive_queue(&ch).await).await.unwrap();
            b.force_close(&name);
            let reason = tokio::time::timeout(Duration::from_secs(10), conn.closed())
                .await
                .unwrap();
            match reason {
                CloseReason::ByServer(r) => {
                    assert_eq!(r.reply_code(), ReplyCode::ConnectionForced);
                    assert!(r.text.contains("closed by the acemq test suite"), "{}", r.text);
                }
                other => panic!("{:?}: {other:?}", b.kind),
            }
            assert!(consumer.next().await.is_none(), "consumers end with the connection");
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn consumers_get_their_own_deliveries_on_a_shared_channel() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q1 = exclusive_queue(&ch).await;
            let q2 = exclusive_queue(&ch).await;
            let mut c1 = ch
                .basic_consume(BasicConsume {
                    queue: q1.as_str().into(),
                    consumer_tag: "mine-1".into(),
                    no_ack: true,
                    ..Default::default()
                })
                .await
                .unwrap();
            let mut c2 = ch.consume(&q2).await.unwrap();
            assert_eq!(c1.tag(), "mine-1");
            assert!(c2.tag().to_string().starts_with("amq.ctag-"));
            ch.publish("", &q2, false, BasicProperties::default(), "two")
                .await
                .unwrap()
                .await
                .unwrap();
            ch.publish("", &q1, false, BasicProperties::default(), "one")
                .await
                .unwrap()
                .await
                .unwrap();
            assert_eq!(&c1.next().await.unwrap().body[..], b"one");
            let d2 = c2.next().await.unwrap();
            assert_eq!(&d2.body[..], b"two");
            d2.ack().unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

/// TLS only: the generated CA is trusted, others are not, and the host name counts.
#[tokio::test(flavor = "multi_thread")]
async fn tls_verifies_the_server_certificate_and_its_name() {
    acemq_tests::deadline(async {
        for b in all_brokers().await.into_iter().filter(|b| b.kind.is_tls()) {
            // Trusted through the generated CA (the other tests connect this way too).
            let conn = b.connect().await;
            conn.close().await.unwrap();

            // Webpki's public roots do not include the test CA.
            let untrusted = b.config().with_tls(TlsConfig::new());
            let err = Connection::open(&b.url, untrusted).await.unwrap_err();
            assert!(err.to_string().contains("certificate"), "{err}");

            // The right CA, the wrong name.
            let wrong_name = b
                .config()
                .with_tls(b.tls.clone().with_server_name("not-the-broker.example"));
            let err = Connection::open(&b.url, wrong_name).await.unwrap_err();
            assert!(err.to_string().to_lowercase().contains("not valid for name"), "{err}");

            // A client certificate is presented when configured.
            if let Some(dir) = b.tls_dir.clone().filter(|d| d.join("client.pem").exists()) {
                let cert = std::fs::read(dir.join("client.pem")).unwrap();
                let key = std::fs::read(dir.join("client.key")).unwrap();
                let with_cert = b
                    .config()
                    .with_tls(b.tls.clone().with_client_cert_pem(&cert, &key).unwrap());
                Connection::open(&b.url, with_cert)
                    .await
                    .unwrap()
                    .close()
                    .await
                    .unwrap();
            }
        }
    })
    .await
}

#[allow(dead_code)]
fn assert_broker_is_send(b: Broker) -> impl Send {
    b
}

/// A consumer connection with a small delivery buffer and a 1 s heartbeat,
/// its exclusive queue holding `total` messages of 1 KiB numbered in their
/// bodies, and a consumer on it without a prefetch limit that has taken
/// nothing yet.
async fn stalled_consumer(b: &Broker, buffer: usize, total: usize) -> (Connection, acemq_core::amqp::Consumer, String) {
    let conn = Connection::open(
        &format!("{}?heartbeat=1", b.url),
        b.config().with_delivery_buffer(buffer),
    )
    .await
    .unwrap();
    let ch = conn.channel().await.unwrap();
    let q = exclusive_queue(&ch).await;
    let publisher = b.connect().await;
    let pch = publisher.channel().await.unwrap();
    pch.confirm_select().await.unwrap();
    let mut confirms = Vec::new();
    for i in 0..total {
        let body = Bytes::from(format!("{i:01024}"));
        confirms.push(
            pch.publish("", &q, false, BasicProperties::default(), body)
                .await
                .unwrap(),
        );
    }
    for confirm in confirms {
        assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
    }
    publisher.close().await.unwrap();
    let consumer = ch.consume(&q).await.unwrap();
    (conn, consumer, q)
}

/// Memory use: a consumer that does not take its deliveries
/// holds at most its delivery buffer while the connection stops reading
/// (for longer than two heartbeat intervals, which is not taken for the
/// broker's silence), and then gets every message, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_that_does_not_take_its_deliveries_holds_at_most_its_buffer_and_loses_nothing() {
    const TOTAL: usize = 3000;
    const BUFFER: usize = 100;
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let (conn, mut consumer, q) = stalled_consumer(&b, BUFFER, TOTAL).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert_eq!(consumer.buffered(), BUFFER, "{:?}", b.kind);
            assert!(!conn.is_closed(), "{:?}: {:?}", b.kind, conn.close_reason());
            let mut most = 0;
            for i in 0..TOTAL {
                let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
                    .await
                    .unwrap_or_else(|_| panic!("{:?}: delivery {i} within 10 s", b.kind))
                    .expect("the consumer goes on");
                assert_eq!(delivery.body, format!("{i:01024}").as_bytes(), "{:?}", b.kind);
                most = most.max(consumer.buffered());
                delivery.ack().unwrap();
            }
            assert!(most <= BUFFER, "{:?}: {most} waited", b.kind);
            let ch = conn.channel().await.unwrap();
            assert_eq!(acemq_tests::depth(&ch, &q).await, 0);
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A full consumer queue pauses reading, but not the `cancel-ok` of that
/// consumer: cancelling it does not wait for it to be drained, what was
/// delivered before the cancel still comes in order, and the rest stays in
/// the queue.
#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_consumer_whose_queue_is_full_does_not_wait_for_it_to_be_drained() {
    const TOTAL: usize = 3000;
    const BUFFER: usize = 100;
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let (conn, mut consumer, q) = stalled_consumer(&b, BUFFER, TOTAL).await;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while consumer.buffered() < BUFFER {
                assert!(std::time::Instant::now() < deadline, "{:?}: the buffer fills", b.kind);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            tokio::time::timeout(Duration::from_secs(10), consumer.cancel())
                .await
                .unwrap_or_else(|_| panic!("{:?}: cancel-ok within 10 s with the consumer's queue full", b.kind))
                .unwrap();
            let mut taken = 0;
            while let Some(delivery) = tokio::time::timeout(Duration::from_secs(10), consumer.next())
                .await
                .unwrap_or_else(|_| panic!("{:?}: the stream ends within 10 s of the cancel", b.kind))
            {
                assert_eq!(delivery.body, format!("{taken:01024}").as_bytes(), "{:?}", b.kind);
                delivery.ack().unwrap();
                taken += 1;
            }
            assert!(taken >= BUFFER, "{:?}: {taken}", b.kind);
            let ch = conn.channel().await.unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let left = acemq_tests::depth(&ch, &q).await as usize;
                if left + taken == TOTAL {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{:?}: {left} left and {taken} taken of {TOTAL}",
                    b.kind
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            eprintln!("{:?}: {taken} delivered before the cancel took effect", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

/// Settlements take their own queue (the settle queue) to the driver, not the command queue:
/// acks, nacks and rejects given just before closing their channel still go
/// out before the `channel.close`, so nothing comes back to the queue. On a
/// current-thread runtime the settlements and the close are all queued
/// before the driver runs once.
#[tokio::test(flavor = "current_thread")]
async fn settlements_given_just_before_a_channel_close_go_out_before_it() {
    const TOTAL: usize = 600;
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let conn = b.connect().await;
            let setup = conn.channel().await.unwrap();
            let q = exclusive_queue(&setup).await;
            setup.confirm_select().await.unwrap();
            let mut confirms = Vec::new();
            for i in 0..TOTAL {
                let body = Bytes::from(format!("{i}"));
                confirms.push(
                    setup
                        .publish("", &q, false, BasicProperties::default(), body)
                        .await
                        .unwrap(),
                );
            }
            for confirm in confirms {
                assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
            }
            let ch = conn.channel().await.unwrap();
            ch.qos(TOTAL as u16).await.unwrap();
            let mut consumer = ch.consume(&q).await.unwrap();
            let mut deliveries = Vec::new();
            while deliveries.len() < TOTAL {
                let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
                    .await
                    .unwrap_or_else(|_| panic!("{:?}: delivery {} within 10 s", b.kind, deliveries.len()))
                    .expect("the consumer goes on");
                deliveries.push(delivery);
            }
            // Acks one by one, with a multiple ack, a nack and a reject (both
            // without requeue) among them; then at once the close.
            for (i, delivery) in deliveries.iter().enumerate() {
                match i % 100 {
                    10 => delivery.nack(false).unwrap(),
                    20 => delivery.reject(false).unwrap(),
                    99 => delivery.ack_multiple().unwrap(),
                    n if n > 90 => {} // covered by the multiple ack at 99
                    _ => delivery.ack().unwrap(),
                }
            }
            ch.close().await.unwrap();
            // Unsettled deliveries would be back in the queue by now.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(acemq_tests::depth(&setup, &q).await, 0, "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await
}

/// A connection whose driver's task ends without finishing its run (here:
/// its runtime shuts down under it; a bug that panicked would do the same)
/// still says it is over, to `is_closed`, `closed()` and new calls.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_whose_runtime_shuts_down_says_it_is_over() {
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let (url, config) = (b.url.clone(), b.config());
            let conn = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let conn = runtime.block_on(Connection::open(&url, config)).unwrap();
                // The driver's task is dropped with its runtime.
                drop(runtime);
                conn
            })
            .join()
            .unwrap();
            assert!(conn.is_closed(), "{:?}", b.kind);
            let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
                .await
                .unwrap_or_else(|_| panic!("{:?}: closed() within 5 s of the driver's end", b.kind));
            assert_eq!(reason, CloseReason::ConnectionLost, "{:?}", b.kind);
            assert!(
                matches!(
                    conn.channel().await,
                    Err(Error::ConnectionClosed(CloseReason::ConnectionLost))
                ),
                "{:?}",
                b.kind
            );
        }
    })
    .await
}

/// The CPU time this thread has used (Linux: `/proc/thread-self/stat`, in
/// clock ticks of 10 ms).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    // The fields after the command name, which is in parentheses: utime and
    // stime are the 14th and 15th of the line, the 12th and 13th after it.
    let after = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// On a new channel of `conn`: `count` numbered messages published to a
/// new queue and confirmed, then consumed in order and acked; the channel,
/// the queue's name and the consumer, still open.
async fn carry_numbered(
    conn: &Connection,
    count: u32,
    kind: Kind,
) -> (acemq_core::amqp::Channel, String, acemq_core::amqp::Consumer) {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let q = exclusive_queue(&ch).await;
    publish_numbered_and_confirmed(&ch, &q, count, kind).await;
    let mut consumer = ch.consume(&q).await.unwrap();
    for i in 0..count {
        let delivery = consumer.next().await.expect("a delivery");
        assert_eq!(&delivery.body[..], format!("{i}").as_bytes(), "{kind:?}");
        delivery.ack().unwrap();
    }
    (ch, q, consumer)
}

#[test]
fn busy_polling_carries_the_same_traffic_keeps_the_thread_busy_while_it_lasts_and_stops_when_idle() {
    const BUSY_POLL: Duration = Duration::from_millis(400);
    acemq_tests::deadline_blocking(|| {
        // One thread runs everything: the driver, the test and, for the
        // memory broker, the broker too; its CPU time is the driver's polling.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(acemq_tests::deadline(async {
            for b in all_brokers().await {
                let config = b.config().with_busy_poll(BUSY_POLL);
                let conn = b.connect_with(config).await;
                let (_ch, _q, consumer) = carry_numbered(&conn, 100, b.kind).await;
                // The driver polls for BUSY_POLL after the last traffic: a
                // sleep of a quarter of it keeps the thread busy.
                let (cpu, wall) = (thread_cpu(), std::time::Instant::now());
                tokio::time::sleep(BUSY_POLL / 4).await;
                let busy = thread_cpu().saturating_sub(cpu);
                assert!(
                    busy >= BUSY_POLL / 20,
                    "{:?}: {busy:?} of CPU in {:?} of busy polling",
                    b.kind,
                    wall.elapsed()
                );
                // Past it, the thread sleeps.
                tokio::time::sleep(BUSY_POLL).await;
                let cpu = thread_cpu();
                tokio::time::sleep(Duration::from_secs(1)).await;
                let idle = thread_cpu().saturating_sub(cpu);
                assert!(
                    idle <= Duration::from_millis(150),
                    "{:?}: {idle:?} of CPU in 1 s idle",
                    b.kind
                );
                consumer.cancel().await.unwrap();
                conn.close().await.unwrap();
            }
        }))
    })
}

#[tokio::test]
async fn a_read_interval_carries_the_same_traffic_spaces_reads_and_reads_at_once_after_a_quiet_spell() {
    const INTERVAL: Duration = Duration::from_millis(200);
    acemq_tests::deadline(async {
        for b in all_brokers().await {
            let config = b.config().with_read_interval(INTERVAL);
            let conn = b.connect_with(config).await;
            let (ch, q, consumer) = carry_numbered(&conn, 500, b.kind).await;
            consumer.cancel().await.unwrap();
            let passive = || QueueDeclare {
                queue: q.as_str().into(),
                passive: true,
                ..Default::default()
            };
            // Two calls one after the other: the first's reply is read after
            // it was sent, the second's no sooner than INTERVAL after that.
            let sent = std::time::Instant::now();
            ch.queue_declare(passive()).await.unwrap();
            ch.queue_declare(passive()).await.unwrap();
            let took = sent.elapsed();
            assert!(took >= INTERVAL, "{:?}: two calls in {took:?}", b.kind);
            // After a quiet spell longer than the interval, a reply is read
            // as soon as it comes.
            tokio::time::sleep(INTERVAL + Duration::from_millis(100)).await;
            let sent = std::time::Instant::now();
            ch.queue_declare(passive()).await.unwrap();
            let took = sent.elapsed();
            assert!(
                took < INTERVAL,
                "{:?}: one call after a quiet spell in {took:?}",
                b.kind
            );
            conn.close().await.unwrap();
        }
    })
    .await
}
