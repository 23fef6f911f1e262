//! Point 4: consumers, prefetch, round robin, settlements, get, recover.

mod common;

use acemq_codec::{
    BasicAck, BasicCancel, BasicConsume, BasicGet, BasicNack, BasicQos, BasicRecover, BasicReject, ChannelClose,
    FieldTable, Method,
};
use acemq_memory::Broker;
use common::{close_of, Client};
use std::time::Duration;

async fn consume(c: &mut Client, ch: u16, queue: &str, tag: &str) {
    let reply = c
        .call(
            ch,
            BasicConsume {
                queue: queue.into(),
                consumer_tag: tag.into(),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(reply, Method::BasicConsumeOk(_)), "{reply:?}");
}

#[tokio::test(start_paused = true)]
async fn prefetch_limits_unacked_deliveries_per_consumer() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "work", FieldTable::new()).await;
        for i in 0..5 {
            c.publish(1, "", "work", format!("m{i}").as_bytes()).await;
        }
        c.call(
            1,
            BasicQos {
                prefetch_count: 2,
                ..Default::default()
            },
        )
        .await;
        consume(&mut c, 1, "work", "c").await;
        let a = c.content().await;
        let b = c.content().await;
        assert_eq!((&a.body[..], &b.body[..]), (&b"m0"[..], &b"m1"[..]));
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
        let y = c.content().await;
        assert_eq!((&x.body[..], &y.body[..]), (&b"m2"[..], &b"m3"[..]));
        c.silent_for(Duration::from_secs(1)).await;
        assert_eq!(broker.queue_info("/", "work").unwrap().unacked, 2);
    })
    .await
}

#[tokio::test]
async fn consumers_are_served_round_robin() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "rr", FieldTable::new()).await;
        consume(&mut c, 1, "rr", "a").await;
        consume(&mut c, 1, "rr", "b").await;
        for _ in 0..4 {
            c.publish(1, "", "rr", b"x").await;
        }
        let mut tags = Vec::new();
        for _ in 0..4 {
            let d = c.content().await;
            let Method::BasicDeliver(m) = d.method else { panic!() };
            tags.push(m.consumer_tag.to_string());
        }
        assert_eq!(tags, ["a", "b", "a", "b"]);
    })
    .await
}

#[tokio::test]
async fn nack_with_requeue_redelivers_with_the_redelivered_flag() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "rq", FieldTable::new()).await;
        c.publish(1, "", "rq", b"one").await;
        c.publish(1, "", "rq", b"two").await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 2,
                ..Default::default()
            },
        )
        .await;
        consume(&mut c, 1, "rq", "c").await;
        let one = c.content().await;
        let two = c.content().await;
        assert!(!one.redelivered());
        c.send(
            1,
            BasicNack {
                delivery_tag: two.delivery_tag(),
                multiple: true,
                requeue: true,
            },
        )
        .await;
        let again1 = c.content().await;
        let again2 = c.content().await;
        assert_eq!(
            (&again1.body[..], &again2.body[..]),
            (&b"one"[..], &b"two"[..]),
            "original order kept"
        );
        assert!(again1.redelivered() && again2.redelivered());
        assert_eq!(again1.delivery_tag(), 3);
    })
    .await
}

#[tokio::test]
async fn reject_without_requeue_drops_the_message() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "drop", FieldTable::new()).await;
        c.publish(1, "", "drop", b"x").await;
        consume(&mut c, 1, "drop", "c").await;
        let d = c.content().await;
        c.send(
            1,
            BasicReject {
                delivery_tag: d.delivery_tag(),
                requeue: false,
            },
        )
        .await;
        c.call(
            1,
            BasicCancel {
                consumer_tag: "c".into(),
                no_wait: false,
            },
        )
        .await;
        let info = broker.queue_info("/", "drop").unwrap();
        assert_eq!((info.messages, info.unacked), (0, 0));
    })
    .await
}

#[tokio::test]
async fn an_unknown_delivery_tag_is_406() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        let reply = c
            .call(
                1,
                BasicAck {
                    delivery_tag: 42,
                    multiple: false,
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (406, "PRECONDITION_FAILED - unknown delivery tag 42".into(), 60, 80)
        );
    })
    .await
}

#[tokio::test]
async fn acking_twice_is_406() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "twice", FieldTable::new()).await;
        c.publish(1, "", "twice", b"x").await;
        consume(&mut c, 1, "twice", "c").await;
        let d = c.content().await;
        c.send(
            1,
            BasicAck {
                delivery_tag: d.delivery_tag(),
                multiple: false,
            },
        )
        .await;
        let reply = c
            .call(
                1,
                BasicAck {
                    delivery_tag: d.delivery_tag(),
                    multiple: false,
                },
            )
            .await;
        assert_eq!(close_of(&reply).0, 406);
    })
    .await
}

#[tokio::test]
async fn basic_get_returns_a_message_with_the_count_left_or_get_empty() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "g", FieldTable::new()).await;
        c.publish(1, "", "g", b"a").await;
        c.publish(1, "", "g", b"b").await;
        c.send(
            1,
            BasicGet {
                queue: "g".into(),
                ..Default::default()
            },
        )
        .await;
        let got = c.content().await;
        let Method::BasicGetOk(ok) = &got.method else { panic!() };
        assert_eq!((ok.delivery_tag, ok.message_count, &got.body[..]), (1, 1, &b"a"[..]));
        c.send(
            1,
            BasicAck {
                delivery_tag: 1,
                multiple: false,
            },
        )
        .await;
        c.send(
            1,
            BasicGet {
                queue: "g".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let got = c.content().await;
        assert_eq!(&got.body[..], b"b");
        let reply = c
            .call(
                1,
                BasicGet {
                    queue: "g".into(),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::BasicGetEmpty(_)));
    })
    .await
}

#[tokio::test]
async fn basic_recover_requeues_everything_unacked() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "rec", FieldTable::new()).await;
        c.publish(1, "", "rec", b"x").await;
        consume(&mut c, 1, "rec", "c").await;
        let first = c.content().await;
        c.send(1, BasicRecover { requeue: true }).await;
        let (_, reply) = c.method().await;
        let redelivery = if matches!(reply, Method::BasicRecoverOk(_)) {
            c.content().await
        } else {
            // the redelivery may be written before recover-ok
            let d = c.content_after(reply).await;
            c.expect(|m| matches!(m, Method::BasicRecoverOk(_))).await;
            d
        };
        assert!(redelivery.redelivered());
        assert_ne!(redelivery.delivery_tag(), first.delivery_tag());
    })
    .await
}

#[tokio::test]
async fn closing_a_channel_requeues_its_unacked_messages_for_other_consumers() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.open_channel(2).await;
        c.declare_queue(1, "handover", FieldTable::new()).await;
        c.publish(1, "", "handover", b"x").await;
        consume(&mut c, 1, "handover", "first").await;
        let d = c.content().await;
        assert!(!d.redelivered());
        c.call(
            1,
            ChannelClose {
                reply_code: 200,
                reply_text: "".into(),
                class_id: 0,
                method_id: 0,
            },
        )
        .await;
        consume(&mut c, 2, "handover", "second").await;
        let again = c.content().await;
        assert_eq!(again.channel, 2);
        assert!(again.redelivered());
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_global_qos_limits_the_whole_channel() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "ga", FieldTable::new()).await;
        c.declare_queue(1, "gb", FieldTable::new()).await;
        for q in ["ga", "gb"] {
            c.publish(1, "", q, b"x").await;
            c.publish(1, "", q, b"y").await;
        }
        c.call(
            1,
            BasicQos {
                prefetch_count: 1,
                global: true,
                ..Default::default()
            },
        )
        .await;
        consume(&mut c, 1, "ga", "a").await;
        let _ = c.content().await;
        consume(&mut c, 1, "gb", "b").await;
        c.silent_for(Duration::from_secs(1)).await;
        let reply = c
            .call(
                1,
                BasicGet {
                    queue: "ga".into(),
                    no_ack: true,
                    ..Default::default()
                },
            )
            .await;
        // Only one delivery was outstanding; the get answers next.
        assert!(matches!(reply, Method::BasicGetOk(_)), "{reply:?}");
    })
    .await
}
