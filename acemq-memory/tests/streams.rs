//! Point 7: streams — an append-only log read from an offset, with credit
//! from a prefetch and the offset on every delivery.

mod common;

use std::time::Duration;

use acemq_codec::{BasicAck, BasicConsume, BasicGet, BasicQos, FieldTable, FieldValue, Method, QueueDeclare};
use acemq_memory::{Broker, BrokerConfig, RabbitMqVersion};
use common::{args, close_of, Client};

fn stream() -> FieldTable {
    args(&[("x-queue-type", "stream".into())])
}

async fn consume_from(c: &mut Client, ch: u16, tag: &str, offset: Option<FieldValue>) {
    let arguments = match offset {
        Some(v) => args(&[("x-stream-offset", v)]),
        None => FieldTable::new(),
    };
    let reply = c
        .call(
            ch,
            BasicConsume {
                queue: "log".into(),
                consumer_tag: tag.into(),
                arguments,
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(reply, Method::BasicConsumeOk(_)), "{reply:?}");
}

async fn offsets(c: &mut Client, n: usize) -> Vec<i64> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let d = c.content().await;
        seen.push(d.header("x-stream-offset").and_then(FieldValue::as_i64).unwrap());
        assert!(
            matches!(d.header("x-stream-offset"), Some(FieldValue::I64(_))),
            "an `l` header"
        );
        c.send(
            d.channel,
            BasicAck {
                delivery_tag: d.delivery_tag(),
                multiple: false,
            },
        )
        .await;
    }
    seen
}

async fn setup(broker: &Broker) -> Client {
    let mut c = Client::open(broker).await;
    c.open_channel(1).await;
    c.declare_queue(1, "log", stream()).await;
    for i in 0..5 {
        c.publish(1, "", "log", format!("m{i}").as_bytes()).await;
    }
    c.declare_queue(1, "log", stream()).await;
    c
}

#[tokio::test]
async fn a_stream_consumer_needs_a_prefetch() {
    common::deadline::deadline(async {
        // Each version in its own words.
        for (version, text) in [
            (
                RabbitMqVersion::V3_10,
                "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue 'log' in vhost '/''",
            ),
            (
                RabbitMqVersion::V4_0,
                "PRECONDITION_FAILED - consumer prefetch count is not set for stream queue 'log' in vhost '/'",
            ),
        ] {
            let broker = Broker::new(BrokerConfig::for_version(version));
            let mut c = setup(&broker).await;
            let reply = c
                .call(
                    1,
                    BasicConsume {
                        queue: "log".into(),
                        ..Default::default()
                    },
                )
                .await;
            assert_eq!(close_of(&reply), (406, text.into(), 60, 20), "{version}");
        }
    })
    .await
}

#[tokio::test]
async fn consuming_a_stream_with_no_ack_is_540() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = setup(&broker).await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 10,
                ..Default::default()
            },
        )
        .await;
        let reply = c
            .call(
                1,
                BasicConsume {
                    queue: "log".into(),
                    no_ack: true,
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::ConnectionClose(_)));
        assert_eq!(close_of(&reply).0, 540);
    })
    .await
}

#[tokio::test]
async fn streams_must_be_durable_and_refuse_basic_get() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = setup(&broker).await;
        let reply = c
            .call(
                1,
                QueueDeclare {
                    queue: "s2".into(),
                    arguments: stream(),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply).1,
            "PRECONDITION_FAILED - invalid property 'non-durable' for queue 's2' in vhost '/'"
        );
        c.open_channel(2).await;
        let reply = c
            .call(
                2,
                BasicGet {
                    queue: "log".into(),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(close_of(&reply).0, 540);
    })
    .await
}

#[tokio::test]
async fn x_stream_offset_first_last_next_number_and_timestamp() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = setup(&broker).await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 10,
                ..Default::default()
            },
        )
        .await;
        consume_from(&mut c, 1, "first", Some("first".into())).await;
        assert_eq!(offsets(&mut c, 5).await, [0, 1, 2, 3, 4]);
        consume_from(&mut c, 1, "last", Some("last".into())).await;
        assert_eq!(offsets(&mut c, 1).await, [4]);
        consume_from(&mut c, 1, "number", Some(FieldValue::I32(3))).await;
        assert_eq!(offsets(&mut c, 2).await, [3, 4]);
        consume_from(&mut c, 1, "next", Some("next".into())).await;
        consume_from(&mut c, 1, "default", None).await;
        consume_from(&mut c, 1, "timestamp", Some(FieldValue::Timestamp(0))).await;
        assert_eq!(offsets(&mut c, 5).await, [0, 1, 2, 3, 4]);
        consume_from(&mut c, 1, "future", Some(FieldValue::Timestamp(u64::MAX / 2000))).await;
        // New messages reach every consumer that is at the end of the log.
        c.publish(1, "", "log", b"m5").await;
        let mut got = offsets(&mut c, 7).await;
        got.sort();
        assert_eq!(got, [5; 7]);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn stream_acks_are_credit_and_messages_stay_in_the_log() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = setup(&broker).await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 2,
                ..Default::default()
            },
        )
        .await;
        consume_from(&mut c, 1, "slow", Some("first".into())).await;
        let a = c.content().await;
        let b = c.content().await;
        c.silent_for(Duration::from_secs(1)).await;
        c.send(
            1,
            BasicAck {
                delivery_tag: b.delivery_tag(),
                multiple: true,
            },
        )
        .await;
        let x = c.content().await;
        assert_eq!(x.header("x-stream-offset"), Some(&FieldValue::I64(2)));
        let _ = a;
        assert_eq!(
            broker.queue_info("/", "log").unwrap().messages,
            5,
            "reading does not remove"
        );
    })
    .await
}
