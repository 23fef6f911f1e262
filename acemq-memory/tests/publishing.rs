//! Point 5: publisher confirms, returns before acks, reject-publish nacks.

mod common;

use acemq_codec::{
    BasicProperties, BasicPublish, ConfirmSelect, FieldTable, FieldValue, Frame, Method, TxCommit, TxSelect,
};
use acemq_memory::Broker;
use bytes::BytesMut;
use common::{args, Client};

#[tokio::test]
async fn confirms_number_from_one_and_acks_are_coalesced_with_multiple() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "cq", FieldTable::new()).await;
        assert!(matches!(
            c.call(1, ConfirmSelect { no_wait: false }).await,
            Method::ConfirmSelectOk(_)
        ));
        // Three publishes in one write: one ack covering all three.
        let mut out = BytesMut::new();
        for _ in 0..3 {
            let publish = BasicPublish {
                routing_key: "cq".into(),
                ..Default::default()
            };
            acemq_codec::encode_content(1, &publish.into(), &BasicProperties::default(), b"x", 131_072, &mut out)
                .unwrap();
        }
        c.send_bytes(&out).await;
        let mut acked = 0;
        while acked < 3 {
            let Method::BasicAck(ack) = c.method().await.1 else {
                panic!()
            };
            assert!(ack.delivery_tag > acked);
            assert_eq!(ack.multiple, ack.delivery_tag > acked + 1);
            acked = ack.delivery_tag;
        }
        c.publish(1, "", "cq", b"x").await;
        let Method::BasicAck(ack) = c.method().await.1 else {
            panic!()
        };
        assert_eq!((ack.delivery_tag, ack.multiple), (4, false));
    })
    .await
}

#[tokio::test]
async fn mandatory_unroutable_is_returned_before_the_ack() {
    common::deadline::deadline(async {
        let expected = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../amqp-codec/tests/data/rabbitmq-3.10/return_then_ack.bin"
        ))
        .unwrap();
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.call(1, ConfirmSelect { no_wait: false }).await;
        let publish = BasicPublish {
            routing_key: "acemq.kat.no-such-queue".into(),
            mandatory: true,
            ..Default::default()
        };
        let props = BasicProperties {
            content_type: Some("text/plain".into()),
            message_id: Some("msg-return-1".into()),
            ..Default::default()
        };
        c.publish_with(1, publish, props, b"unroutable").await;
        let mut ours = BytesMut::new();
        for _ in 0..4 {
            c.next().await.encode(&mut ours).unwrap();
        }
        assert_eq!(
            &ours[..],
            &expected[..],
            "return, header, body, then ack, as RabbitMQ sends them"
        );
    })
    .await
}

#[tokio::test]
async fn non_mandatory_unroutable_is_acked_at_once() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.call(1, ConfirmSelect { no_wait: false }).await;
        c.publish(1, "", "nobody-home", b"x").await;
        let Method::BasicAck(ack) = c.method().await.1 else {
            panic!()
        };
        assert_eq!(ack.delivery_tag, 1);
    })
    .await
}

#[tokio::test]
async fn reject_publish_overflow_is_nacked() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(
            1,
            "full",
            args(&[
                ("x-max-length", FieldValue::I32(1)),
                ("x-overflow", "reject-publish".into()),
            ]),
        )
        .await;
        c.call(1, ConfirmSelect { no_wait: false }).await;
        c.publish(1, "", "full", b"fits").await;
        let Method::BasicAck(ack) = c.method().await.1 else {
            panic!()
        };
        assert_eq!(ack.delivery_tag, 1);
        c.publish(1, "", "full", b"refused").await;
        let Method::BasicNack(nack) = c.method().await.1 else {
            panic!()
        };
        assert_eq!((nack.delivery_tag, nack.multiple), (2, false));
        assert_eq!(broker.queue_info("/", "full").unwrap().messages, 1);
    })
    .await
}

#[tokio::test]
async fn bodies_larger_than_frame_max_arrive_split_and_whole() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "big", FieldTable::new()).await;
        let body = vec![7u8; 300_000];
        c.publish(1, "", "big", &body).await;
        c.send(
            1,
            acemq_codec::BasicGet {
                queue: "big".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let (_, m) = c.method().await;
        assert!(matches!(m, Method::BasicGetOk(_)));
        let Frame::Header(_, header) = c.next().await else {
            panic!()
        };
        assert_eq!(header.body_size, 300_000);
        let mut total = 0;
        while total < 300_000 {
            let Frame::Body(_, part) = c.next().await else { panic!() };
            assert!(part.len() <= 131_072 - 8);
            total += part.len();
        }
    })
    .await
}

#[tokio::test]
async fn a_transaction_publishes_on_commit() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    c.open_channel(1).await;
    c.declare_queue(1, "txq", FieldTable::new()).await;
    assert!(matches!(c.call(1, TxSelect {}).await, Method::TxSelectOk(_)));
    c.publish(1, "", "txq", b"x").await;
    assert!(
        matches!(c.call(1, acemq_codec::QueueDeclare { queue: "txq".into(), passive: true, ..Default::default() }).await,
        Method::QueueDeclareOk(ok) if ok.message_count == 0)
    );
    assert!(matches!(c.call(1, TxCommit {}).await, Method::TxCommitOk(_)));
    assert_eq!(broker.queue_info("/", "txq").unwrap().messages, 1);
    })
    .await
}
