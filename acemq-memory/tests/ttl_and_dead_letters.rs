//! Point 6: TTL from the head, per-message expiration, x-expires,
//! max-length, and dead-lettering with RabbitMQ's x-death headers.

mod common;

use std::time::Duration;

use acemq_codec::{
    BasicConsume, BasicGet, BasicProperties, BasicPublish, BasicReject, ExchangeDeclare, FieldTable, FieldValue, Frame,
    FrameDecoder, Method, QueueBind,
};
use acemq_memory::Broker;
use bytes::{Bytes, BytesMut};
use common::{args, Client};

fn props_expiring(ms: u64) -> BasicProperties {
    BasicProperties {
        expiration: Some(ms.to_string().as_str().into()),
        ..Default::default()
    }
}

async fn publish_props(c: &mut Client, queue: &str, props: BasicProperties, body: &[u8]) {
    let publish = BasicPublish {
        routing_key: queue.into(),
        ..Default::default()
    };
    c.publish_with(1, publish, props, body).await;
}

fn death(d: &common::Delivery, index: usize) -> FieldTable {
    d.header("x-death").and_then(FieldValue::as_array).unwrap().0[index]
        .as_table()
        .unwrap()
        .clone()
}

#[tokio::test(start_paused = true)]
async fn message_ttl_expires_only_from_the_head_of_the_queue() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "head", FieldTable::new()).await;
        publish_props(&mut c, "head", props_expiring(10_000), b"long").await;
        publish_props(&mut c, "head", props_expiring(1_000), b"short").await;
        c.declare_queue(1, "head", FieldTable::new()).await; // a round trip: both are in
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            broker.queue_info("/", "head").unwrap().messages,
            2,
            "the short one waits behind the long one"
        );
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(broker.queue_info("/", "head").unwrap().messages, 0);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn x_message_ttl_expires_messages_and_dead_letters_them_as_expired() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "expired", FieldTable::new()).await;
        c.declare_queue(
            1,
            "rung",
            args(&[
                ("x-message-ttl", FieldValue::I32(1500)),
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "expired".into()),
            ]),
        )
        .await;
        c.call(
            1,
            BasicConsume {
                queue: "expired".into(),
                consumer_tag: "c".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let sent = tokio::time::Instant::now();
        publish_props(&mut c, "rung", props_expiring(60_000), b"later").await;
        let d = c.content().await;
        let waited = sent.elapsed();
        assert!(
            waited >= Duration::from_millis(1500) && waited < Duration::from_millis(1600),
            "{waited:?}"
        );
        let Method::BasicDeliver(m) = &d.method else { panic!() };
        assert_eq!(
            (m.exchange.as_bytes(), m.routing_key.as_bytes()),
            (&b""[..], &b"expired"[..])
        );
        assert_eq!(
            d.properties.expiration, None,
            "expiration is removed when dead-lettered"
        );
        let x = death(&d, 0);
        let keys: Vec<String> = x.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(
            keys,
            [
                "count",
                "reason",
                "queue",
                "time",
                "exchange",
                "routing-keys",
                "original-expiration"
            ]
        );
        assert_eq!(x.get("reason").and_then(FieldValue::as_str), Some("expired"));
        assert_eq!(x.get("original-expiration").and_then(FieldValue::as_str), Some("60000"));
        assert_eq!(
            d.header("x-first-death-queue").and_then(FieldValue::as_str),
            Some("rung")
        );
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn x_expires_deletes_a_queue_nobody_uses() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "temp", args(&[("x-expires", FieldValue::I32(5000))]))
            .await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        c.declare_queue(1, "temp", args(&[("x-expires", FieldValue::I64(5000))]))
            .await; // redeclare counts as use
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(broker.queue_info("/", "temp").is_some());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(broker.queue_info("/", "temp").is_none());
        // A consumer keeps it alive.
        c.declare_queue(1, "kept", args(&[("x-expires", FieldValue::I32(1000))]))
            .await;
        c.call(
            1,
            BasicConsume {
                queue: "kept".into(),
                consumer_tag: "k".into(),
                ..Default::default()
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(broker.queue_info("/", "kept").is_some());
    })
    .await
}

#[tokio::test]
async fn max_length_drops_the_head_and_dead_letters_it_as_maxlen() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "overflowed", FieldTable::new()).await;
        c.declare_queue(
            1,
            "bounded",
            args(&[
                ("x-max-length", FieldValue::I32(2)),
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "overflowed".into()),
            ]),
        )
        .await;
        for body in ["1", "2", "3"] {
            c.publish(1, "", "bounded", body.as_bytes()).await;
        }
        c.send(
            1,
            BasicGet {
                queue: "overflowed".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let d = c.content().await;
        assert_eq!(&d.body[..], b"1");
        assert_eq!(death(&d, 0).get("reason").and_then(FieldValue::as_str), Some("maxlen"));
        assert_eq!(broker.queue_info("/", "bounded").unwrap().messages, 2);
    })
    .await
}

#[tokio::test]
async fn dead_lettering_keeps_the_original_routing_key_when_none_is_set() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.call(
            1,
            ExchangeDeclare {
                exchange: "dlx".into(),
                kind: "direct".into(),
                durable: true,
                ..Default::default()
            },
        )
        .await;
        c.declare_queue(1, "parking", FieldTable::new()).await;
        c.call(
            1,
            QueueBind {
                queue: "parking".into(),
                exchange: "dlx".into(),
                routing_key: "orders".into(),
                ..Default::default()
            },
        )
        .await;
        c.declare_queue(1, "orders", args(&[("x-dead-letter-exchange", "dlx".into())]))
            .await;
        c.publish(1, "", "orders", b"x").await;
        c.send(
            1,
            BasicGet {
                queue: "orders".into(),
                ..Default::default()
            },
        )
        .await;
        let d = c.content().await;
        c.send(
            1,
            BasicReject {
                delivery_tag: d.delivery_tag(),
                requeue: false,
            },
        )
        .await;
        c.send(
            1,
            BasicGet {
                queue: "parking".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let parked = c.content().await;
        let Method::BasicGetOk(ok) = &parked.method else {
            panic!()
        };
        assert_eq!(
            (ok.exchange.as_bytes(), ok.routing_key.as_bytes()),
            (&b"dlx"[..], &b"orders"[..])
        );
        assert_eq!(
            death(&parked, 0).get("reason").and_then(FieldValue::as_str),
            Some("rejected")
        );
    })
    .await
}

#[tokio::test]
async fn a_second_death_in_the_same_queue_counts_up_and_moves_to_the_front() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(
            1,
            "a",
            args(&[
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "b".into()),
            ]),
        )
        .await;
        c.declare_queue(
            1,
            "b",
            args(&[
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "a".into()),
            ]),
        )
        .await;
        c.publish(1, "", "a", b"ping-pong").await;
        let mut last = None;
        for queue in ["a", "b", "a"] {
            c.send(
                1,
                BasicGet {
                    queue: queue.into(),
                    ..Default::default()
                },
            )
            .await;
            let d = c.content().await;
            c.send(
                1,
                BasicReject {
                    delivery_tag: d.delivery_tag(),
                    requeue: false,
                },
            )
            .await;
            last = Some(d);
        }
        c.send(
            1,
            BasicGet {
                queue: "b".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let d = c.content().await;
        let _ = last;
        let deaths = d.header("x-death").and_then(FieldValue::as_array).unwrap();
        assert_eq!(deaths.len(), 2);
        let front = death(&d, 0);
        let keys: Vec<String> = front.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(
            keys,
            ["count", "exchange", "queue", "reason", "routing-keys", "time"],
            "sorted, as RabbitMQ re-sorts"
        );
        assert_eq!(front.get("count"), Some(&FieldValue::I64(2)));
        assert_eq!(front.get("queue").and_then(FieldValue::as_str), Some("a"));
        assert_eq!(d.header("x-first-death-queue").and_then(FieldValue::as_str), Some("a"));
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn an_automatic_dead_letter_cycle_is_dropped() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(
            1,
            "loop",
            args(&[
                ("x-message-ttl", FieldValue::I32(100)),
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "loop".into()),
            ]),
        )
        .await;
        c.publish(1, "", "loop", b"x").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(broker.queue_info("/", "loop").unwrap().messages, 0);
    })
    .await
}

/// Reproduces the capture in amqp-codec/tests/data/rabbitmq-3.10/deliver_x_death.bin:
/// the same message rejected into a dead-letter queue must come out byte for
/// byte as RabbitMQ 3.10.8 delivered it (but for the death time).
#[tokio::test]
async fn dead_lettered_message_carries_x_death_exactly_as_rabbitmq_writes_it() {
    common::deadline::deadline(async {
        let capture = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../amqp-codec/tests/data/rabbitmq-3.10/deliver_x_death.bin"
        ))
        .unwrap();
        let decoder = FrameDecoder::new(0);
        let mut buf = BytesMut::from(&capture[..]);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            frames.push(frame);
        }
        let Frame::Header(_, captured_header) = &frames[1] else {
            panic!()
        };
        let Frame::Body(_, captured_body) = &frames[2] else {
            panic!()
        };
        // What was published: the captured properties without the death headers.
        let mut published = captured_header.properties.clone().into_basic();
        let mut headers = published.headers.take().unwrap();
        for key in [
            "x-death",
            "x-first-death-exchange",
            "x-first-death-queue",
            "x-first-death-reason",
        ] {
            headers.remove(key);
        }
        published.headers = Some(headers);

        let broker = Broker::new(acemq_memory::BrokerConfig::for_version(
            acemq_memory::RabbitMqVersion::V3_10,
        ));
        // The capture is RabbitMQ 3.10's (4.0 adds x-last-death-*).
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "acemq.kat.dlx.target", FieldTable::new()).await;
        c.declare_queue(
            1,
            "acemq.kat.dlx.source",
            args(&[
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "acemq.kat.dlx.target".into()),
            ]),
        )
        .await;
        let publish = BasicPublish {
            routing_key: "acemq.kat.dlx.source".into(),
            mandatory: true,
            ..Default::default()
        };
        c.publish_with(1, publish, published, captured_body).await;
        c.send(
            1,
            BasicGet {
                queue: "acemq.kat.dlx.source".into(),
                ..Default::default()
            },
        )
        .await;
        let got = c.content().await;
        c.send(
            1,
            BasicReject {
                delivery_tag: got.delivery_tag(),
                requeue: false,
            },
        )
        .await;
        c.open_channel(2).await;
        c.call(
            2,
            BasicConsume {
                queue: "acemq.kat.dlx.target".into(),
                consumer_tag: "acemq-kat".into(),
                ..Default::default()
            },
        )
        .await;
        let mut ours = Vec::new();
        for _ in 0..3 {
            ours.push(c.next().await);
        }
        // Channel 2 here, 1 in the capture; the death time is now, not then.
        let mut encoded = BytesMut::new();
        for frame in ours {
            let frame = match frame {
                Frame::Method(_, m) => Frame::Method(1, m),
                Frame::Header(_, mut h) => {
                    let headers = h.properties.headers.as_mut().unwrap();
                    let Some(FieldValue::Array(deaths)) = headers.get("x-death").cloned() else {
                        panic!()
                    };
                    let mut entry = deaths.0[0].as_table().unwrap().clone();
                    assert!(matches!(entry.get("time"), Some(FieldValue::Timestamp(_))));
                    entry.insert("time", FieldValue::Timestamp(1_796_045_003));
                    headers.insert(
                        "x-death",
                        FieldValue::Array(acemq_codec::FieldArray(vec![FieldValue::Table(entry)])),
                    );
                    Frame::Header(1, h)
                }
                Frame::Body(_, b) => Frame::Body(1, Bytes::copy_from_slice(&b)),
                other => other,
            };
            frame.encode(&mut encoded).unwrap();
        }
        assert_eq!(&encoded[..], &capture[..]);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_ttl_of_zero_reaches_a_waiting_consumer_and_is_dropped_otherwise() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "now-or-never", args(&[("x-message-ttl", FieldValue::I32(0))]))
            .await;
        c.publish(1, "", "now-or-never", b"nobody waits").await;
        c.declare_queue(1, "now-or-never", args(&[("x-message-ttl", FieldValue::I32(0))]))
            .await;
        assert_eq!(broker.queue_info("/", "now-or-never").unwrap().messages, 0);
        c.call(
            1,
            BasicConsume {
                queue: "now-or-never".into(),
                consumer_tag: "c".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        c.publish(1, "", "now-or-never", b"caught").await;
        let d = c.content().await;
        assert_eq!(&d.body[..], b"caught");
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn requeued_messages_keep_their_original_expiry() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "keeps", args(&[("x-message-ttl", FieldValue::I32(5000))]))
            .await;
        c.publish(1, "", "keeps", b"x").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        c.send(
            1,
            BasicGet {
                queue: "keeps".into(),
                ..Default::default()
            },
        )
        .await;
        let d = c.content().await;
        c.send(
            1,
            acemq_codec::BasicNack {
                delivery_tag: d.delivery_tag(),
                multiple: false,
                requeue: true,
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(broker.queue_info("/", "keeps").unwrap().messages, 0);
    })
    .await
}

#[tokio::test]
async fn absurd_ttls_never_expire_and_never_crash() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(
            1,
            "forever",
            args(&[
                ("x-message-ttl", FieldValue::I64(i64::MAX)),
                ("x-expires", FieldValue::I64(i64::MAX)),
            ]),
        )
        .await;
        publish_props(&mut c, "forever", props_expiring(u64::MAX), b"x").await;
        c.declare_queue(
            1,
            "forever",
            args(&[
                ("x-message-ttl", FieldValue::I64(i64::MAX)),
                ("x-expires", FieldValue::I64(i64::MAX)),
            ]),
        )
        .await;
        assert_eq!(broker.queue_info("/", "forever").unwrap().messages, 1);
    })
    .await
}
