//! Points 8, 9 and 10: connection.blocked during a memory alarm, fault
//! injection, named brokers and the TCP listener.

mod common;

use std::time::Duration;

use acemq_codec::{
    BasicConsume, BasicProperties, BasicPublish, ConfirmSelect, ConnectionCloseOk, ExchangeDeclare, FieldTable, Frame,
    Method, QueueDeclare,
};
use acemq_memory::Broker;
use bytes::BytesMut;
use common::{close_of, Client};

#[tokio::test(start_paused = true)]
async fn a_memory_alarm_blocks_a_publishing_connection_and_stops_reading_it() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut publisher = Client::open(&broker).await;
        publisher.open_channel(1).await;
        publisher.declare_queue(1, "alarmed", FieldTable::new()).await;
        publisher.call(1, ConfirmSelect { no_wait: false }).await;
        let mut idle = Client::open(&broker).await;
        idle.open_channel(1).await;

        broker.faults().set_memory_alarm(true);
        publisher.publish(1, "", "alarmed", b"one").await;
        let (ch, blocked) = publisher.method().await;
        assert_eq!(ch, 0);
        let Method::ConnectionBlocked(blocked) = blocked else {
            panic!("{blocked:?}")
        };
        assert_eq!(blocked.reason, "low on memory");
        // Nothing is read any more: the content of that publish and what follows wait.
        publisher.publish(1, "", "alarmed", b"two").await;
        publisher.silent_for(Duration::from_secs(5)).await;
        assert_eq!(broker.queue_info("/", "alarmed").unwrap().messages, 0);
        // A connection that does not publish is not told.
        idle.silent_for(Duration::from_millis(10)).await;

        broker.faults().set_memory_alarm(false);
        let (_, unblocked) = publisher.method().await;
        assert!(matches!(unblocked, Method::ConnectionUnblocked(_)));
        let mut acked = 0;
        while acked < 2 {
            let Method::BasicAck(ack) = publisher.method().await.1 else {
                panic!()
            };
            acked = ack.delivery_tag;
        }
        assert_eq!(broker.queue_info("/", "alarmed").unwrap().messages, 2);
        idle.silent_for(Duration::from_millis(10)).await;
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_blocked_frames_match_rabbitmqs() {
    common::deadline::deadline(async {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../amqp-codec/tests/data/rabbitmq-3.10/");
        let blocked = std::fs::read(format!("{dir}connection_blocked.bin")).unwrap();
        let unblocked = std::fs::read(format!("{dir}connection_unblocked.bin")).unwrap();
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        broker.faults().set_memory_alarm(true);
        c.publish(1, "", "anywhere", b"x").await;
        let mut out = BytesMut::new();
        c.next().await.encode(&mut out).unwrap();
        assert_eq!(&out[..], &blocked[..]);
        broker.faults().set_memory_alarm(false);
        out.clear();
        c.next().await.encode(&mut out).unwrap();
        assert_eq!(&out[..], &unblocked[..]);
    })
    .await
}

#[tokio::test]
async fn sever_all_kills_every_socket_without_a_close() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut a = Client::open(&broker).await;
        let mut b = Client::open(&broker).await;
        a.open_channel(1).await;
        a.declare_queue(1, "survives", FieldTable::new()).await;
        a.publish(1, "", "survives", b"x").await;
        a.call(
            1,
            BasicConsume {
                queue: "survives".into(),
                consumer_tag: "c".into(),
                ..Default::default()
            },
        )
        .await;
        let _ = a.content().await;
        broker.faults().sever_all();
        assert_eq!(a.recv_frame().await, None);
        assert_eq!(b.recv_frame().await, None);
        // The unacked message went back to the queue.
        for _ in 0..100 {
            if broker.queue_info("/", "survives").unwrap().messages == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("unacked message not requeued");
    })
    .await
}

#[tokio::test]
async fn close_all_sends_320_connection_forced_and_waits_for_close_ok() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        broker.faults().close_all("Closed via management plugin");
        let close = c.method().await.1;
        assert_eq!(
            close_of(&close),
            (320, "CONNECTION_FORCED - Closed via management plugin".into(), 0, 0)
        );
        c.send(0, ConnectionCloseOk {}).await;
        assert!(c.closed().await);
    })
    .await
}

#[tokio::test]
async fn restart_loses_what_is_not_durable_and_keeps_persistent_messages() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "durable", FieldTable::new()).await;
        c.call(
            1,
            QueueDeclare {
                queue: "transient".into(),
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            ExchangeDeclare {
                exchange: "tx".into(),
                kind: "fanout".into(),
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            ExchangeDeclare {
                exchange: "dx".into(),
                kind: "fanout".into(),
                durable: true,
                ..Default::default()
            },
        )
        .await;
        let persistent = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let publish = BasicPublish {
            routing_key: "durable".into(),
            ..Default::default()
        };
        c.publish_with(1, publish.clone(), persistent.clone(), b"kept").await;
        c.publish_with(1, publish.clone(), BasicProperties::default(), b"lost")
            .await;
        c.publish_with(1, publish, persistent, b"unacked").await;
        c.declare_queue(1, "durable", FieldTable::new()).await;
        broker.faults().restart();
        let close = c.method().await.1;
        assert_eq!(
            close_of(&close),
            (
                320,
                "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'".into(),
                0,
                0
            )
        );
        assert!(c.closed().await);
        assert!(broker.queue_info("/", "transient").is_none());
        assert!(!broker.exchange_exists("/", "tx"));
        assert!(broker.exchange_exists("/", "dx"));
        assert_eq!(broker.queue_info("/", "durable").unwrap().messages, 2);
        // The broker takes new connections after the restart.
        let mut again = Client::open(&broker).await;
        again.open_channel(1).await;
    })
    .await
}

#[tokio::test]
async fn deleting_a_queue_behind_a_consumers_back_sends_basic_cancel() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "pulled", FieldTable::new()).await;
        c.call(
            1,
            BasicConsume {
                queue: "pulled".into(),
                consumer_tag: "victim".into(),
                ..Default::default()
            },
        )
        .await;
        assert!(broker.faults().delete_queue("/", "pulled"));
        let (ch, cancel) = c.method().await;
        let Method::BasicCancel(cancel) = cancel else {
            panic!("{cancel:?}")
        };
        assert_eq!(
            (ch, cancel.consumer_tag.as_bytes(), cancel.no_wait),
            (1, &b"victim"[..], true)
        );
        assert!(!broker.faults().delete_queue("/", "pulled"));
    })
    .await
}

#[tokio::test]
async fn a_named_broker_is_the_same_broker_anywhere_in_the_process() {
    common::deadline::deadline(async {
        let a = Broker::named("orders-test");
        let mut c = Client::open(&a).await;
        c.open_channel(1).await;
        c.declare_queue(1, "shared-by-name", FieldTable::new()).await;
        let b = tokio::spawn(async { Broker::named("orders-test") }).await.unwrap();
        assert!(b.queue_info("/", "shared-by-name").is_some());
        assert!(Broker::named("another").queue_info("/", "shared-by-name").is_none());
    })
    .await
}

#[tokio::test]
async fn the_tcp_listener_speaks_amqp() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let addr = broker.listen_tcp("127.0.0.1:0").await.unwrap();
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut c = Client::over(socket);
        c.handshake("guest", "guest", "/", 0).await;
        c.open_channel(1).await;
        c.declare_queue(1, "over-tcp", FieldTable::new()).await;
        c.publish(1, "", "over-tcp", b"hello").await;
        c.send(
            1,
            acemq_codec::BasicGet {
                queue: "over-tcp".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let d = c.content().await;
        assert_eq!(&d.body[..], b"hello");
        assert!(matches!(d.method, Method::BasicGetOk(_)));
        let _ = Frame::Heartbeat;
    })
    .await
}

#[tokio::test]
async fn a_connection_whose_runtime_ends_leaves_no_consumer_behind() {
    common::deadline::deadline(async {
        let broker = Broker::named("runtime-ends");
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "left-behind", FieldTable::new()).await;
        let other = broker.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut c = Client::open(&other).await;
                c.open_channel(1).await;
                c.call(
                    1,
                    BasicConsume {
                        queue: "left-behind".into(),
                        consumer_tag: "gone".into(),
                        ..Default::default()
                    },
                )
                .await;
                assert_eq!(other.queue_info("/", "left-behind").unwrap().consumers, 1);
            });
        })
        .join()
        .unwrap();
        assert_eq!(broker.queue_info("/", "left-behind").unwrap().consumers, 0);
    })
    .await
}
