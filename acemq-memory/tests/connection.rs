//! Point 1: the connection handshake, tune validation, heartbeats, channels
//! and the close handshakes with RabbitMQ's codes.

mod common;

use std::time::Duration;

use acemq_codec::{
    ChannelClose, ChannelCloseOk, ChannelOpen, ConnectionClose, ConnectionCloseOk, ConnectionOpen, ConnectionStartOk,
    ConnectionTuneOk, FieldTable, FieldValue, Frame, Method, QueueDeclare, PROTOCOL_HEADER,
};
use acemq_memory::{Broker, BrokerConfig};
use bytes::{BufMut, BytesMut};
use common::{close_of, start_ok_plain, Client};

#[tokio::test]
async fn connection_start_offers_plain_and_amqplain_and_rabbitmq_capabilities() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        let Method::ConnectionStart(start) = client.expect(|m| matches!(m, Method::ConnectionStart(_))).await else {
            unreachable!()
        };
        assert_eq!((start.version_major, start.version_minor), (0, 9));
        assert_eq!(start.mechanisms.as_bytes(), b"PLAIN AMQPLAIN");
        assert_eq!(start.locales.as_bytes(), b"en_US");
        let caps = start
            .server_properties
            .get("capabilities")
            .and_then(FieldValue::as_table)
            .unwrap();
        for cap in [
            "publisher_confirms",
            "exchange_exchange_bindings",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "consumer_priorities",
            "authentication_failure_close",
            "per_consumer_qos",
            "direct_reply_to",
        ] {
            assert_eq!(caps.get(cap), Some(&FieldValue::Bool(true)), "{cap}");
        }
        client.send(0, start_ok_plain("guest", "guest")).await;
        let Method::ConnectionTune(tune) = client.method().await.1 else {
            panic!()
        };
        assert_eq!((tune.channel_max, tune.frame_max, tune.heartbeat), (2047, 131_072, 60));
    })
    .await
}

#[tokio::test]
async fn amqplain_login_opens_the_connection() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        client.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        let mut table = BytesMut::new();
        let mut creds = FieldTable::new();
        creds.insert("LOGIN", "guest");
        creds.insert("PASSWORD", "guest");
        creds.encode(&mut table).unwrap();
        let response = table.split_off(4); // AMQPLAIN has no length prefix
        client
            .send(
                0,
                ConnectionStartOk {
                    client_properties: common::client_properties(),
                    mechanism: "AMQPLAIN".into(),
                    response: response.to_vec().into(),
                    locale: "en_US".into(),
                },
            )
            .await;
        client.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        client
            .send(
                0,
                ConnectionTuneOk {
                    channel_max: 2047,
                    frame_max: 131_072,
                    heartbeat: 0,
                },
            )
            .await;
        client
            .send(
                0,
                ConnectionOpen {
                    virtual_host: "/".into(),
                    ..Default::default()
                },
            )
            .await;
        client.expect(|m| matches!(m, Method::ConnectionOpenOk(_))).await;
    })
    .await
}

#[tokio::test]
async fn wrong_password_is_403_for_a_client_with_authentication_failure_close() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        client.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        client.send(0, start_ok_plain("guest", "nope")).await;
        let close = client.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        let (code, text, _, _) = close_of(&close);
        assert_eq!(code, 403);
        assert_eq!(
        text,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
    );
        assert!(client.closed().await);
    })
    .await
}

#[tokio::test]
async fn a_bad_protocol_header_gets_ours_back_and_the_socket_closed() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut stream = broker.connect();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream.write_all(b"AMQP\x00\x00\x08\x00").await.unwrap();
        let mut back = Vec::new();
        stream.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, PROTOCOL_HEADER);
    })
    .await
}

#[tokio::test]
async fn unknown_vhost_is_530_not_allowed() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        client.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        client.send(0, start_ok_plain("guest", "guest")).await;
        client.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        client
            .send(
                0,
                ConnectionTuneOk {
                    channel_max: 2047,
                    frame_max: 131_072,
                    heartbeat: 0,
                },
            )
            .await;
        client
            .send(
                0,
                ConnectionOpen {
                    virtual_host: "nowhere".into(),
                    ..Default::default()
                },
            )
            .await;
        let close = client.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        assert_eq!(
            close_of(&close),
            (530, "NOT_ALLOWED - vhost nowhere not found".into(), 10, 40)
        );
        client.send(0, ConnectionCloseOk {}).await;
        assert!(client.closed().await);
    })
    .await
}

#[tokio::test]
async fn configured_vhosts_and_users_are_honoured() {
    common::deadline::deadline(async {
        let config = BrokerConfig::default()
            .with_vhosts(["/", "orders"])
            .with_user(acemq_memory::User::new("app", "secret"));
        let broker = Broker::new(config);
        let mut client = Client::open_with(&broker, "app", "secret", "orders", 0).await;
        client.open_channel(1).await;
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn tune_ok_with_frame_max_below_8192_is_dropped_without_a_close() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        client.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        client.send(0, start_ok_plain("guest", "guest")).await;
        client.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        let started = tokio::time::Instant::now();
        client
            .send(
                0,
                ConnectionTuneOk {
                    channel_max: 2047,
                    frame_max: 4096,
                    heartbeat: 0,
                },
            )
            .await;
        assert_eq!(client.recv_frame().await, None, "no close frame, just a dropped socket");
        assert!(started.elapsed() >= Duration::from_secs(3));
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn tune_ok_above_the_server_channel_max_is_refused() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::raw(&broker);
        client.send_bytes(&PROTOCOL_HEADER).await;
        client.expect(|m| matches!(m, Method::ConnectionStart(_))).await;
        client.send(0, start_ok_plain("guest", "guest")).await;
        client.expect(|m| matches!(m, Method::ConnectionTune(_))).await;
        client
            .send(
                0,
                ConnectionTuneOk {
                    channel_max: 0,
                    frame_max: 131_072,
                    heartbeat: 0,
                },
            )
            .await;
        assert_eq!(client.recv_frame().await, None);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_broker_heartbeats_at_half_the_interval_and_drops_a_silent_client_after_two() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open_with(&broker, "guest", "guest", "/", 10).await;
        let opened = tokio::time::Instant::now();
        // First heartbeat after 5 s of broker silence.
        assert_eq!(client.recv_frame().await, Some(Frame::Heartbeat));
        let first = opened.elapsed();
        assert!(
            first >= Duration::from_secs(5) && first < Duration::from_secs(6),
            "{first:?}"
        );
        // The client never sends anything: dropped after 20 s.
        while let Some(frame) = client.recv_frame().await {
            assert_eq!(frame, Frame::Heartbeat);
        }
        let dropped = opened.elapsed();
        assert!(
            dropped >= Duration::from_secs(20) && dropped < Duration::from_secs(21),
            "{dropped:?}"
        );
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_client_that_heartbeats_stays_connected() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open_with(&broker, "guest", "guest", "/", 2).await;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            client.send_bytes(&[8, 0, 0, 0, 0, 0, 0, 0xCE]).await;
        }
        client.open_channel(1).await;
    })
    .await
}

#[tokio::test]
async fn a_channel_error_closes_only_the_channel_and_it_ignores_everything_until_close_ok() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        client.open_channel(2).await;
        let reply = client
            .call(
                1,
                QueueDeclare {
                    queue: "acemq.kat.no-such-queue".into(),
                    passive: true,
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (
                404,
                "NOT_FOUND - no queue 'acemq.kat.no-such-queue' in vhost '/'".into(),
                50,
                10
            )
        );
        // Ignored: the channel is closing.
        client
            .send(
                1,
                QueueDeclare {
                    queue: "q".into(),
                    durable: true,
                    ..Default::default()
                },
            )
            .await;
        client.publish(1, "", "q", b"ignored").await;
        // Channel 2 still works.
        client.declare_queue(2, "still-works", FieldTable::new()).await;
        // close-ok, then channel 1 can be opened again.
        client.send(1, ChannelCloseOk {}).await;
        client.open_channel(1).await;
        assert_eq!(broker.queue_info("/", "q"), None);
    })
    .await
}

#[tokio::test]
async fn the_404_close_frame_is_byte_identical_to_rabbitmqs() {
    common::deadline::deadline(async {
        let expected = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../amqp-codec/tests/data/rabbitmq-3.10/channel_close_404.bin"
        ))
        .unwrap();
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        let reply = client
            .call(
                1,
                QueueDeclare {
                    queue: "acemq.kat.no-such-queue".into(),
                    passive: true,
                    ..Default::default()
                },
            )
            .await;
        let mut ours = BytesMut::new();
        acemq_codec::encode_method(1, &reply, &mut ours).unwrap();
        assert_eq!(&ours[..], &expected[..]);
    })
    .await
}

#[tokio::test]
async fn a_frame_on_a_channel_that_is_not_open_is_504() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client
            .send(
                3,
                QueueDeclare {
                    queue: "q".into(),
                    ..Default::default()
                },
            )
            .await;
        let close = client.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        let (code, text, _, _) = close_of(&close);
        assert_eq!(code, 504);
        assert_eq!(text, "CHANNEL_ERROR - expected 'channel.open'");
        client.send(0, ConnectionCloseOk {}).await;
        assert!(client.closed().await);
    })
    .await
}

#[tokio::test]
async fn a_second_channel_open_is_504() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        let close = client.call(1, ChannelOpen::default()).await;
        assert_eq!(
            close_of(&close),
            (504, "CHANNEL_ERROR - second 'channel.open' seen".into(), 20, 10)
        );
    })
    .await
}

#[tokio::test]
async fn a_malformed_frame_is_a_hard_error() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        // A method frame whose payload is too short for queue.declare.
        let mut frame = BytesMut::new();
        frame.put_slice(&[1, 0, 1, 0, 0, 0, 5, 0, 50, 0, 10, 0, 0xCE]);
        client.send_bytes(&frame).await;
        let close = client.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        // RabbitMQ's decoder calls it a frame error.
        assert_eq!(close_of(&close).0, 501);
        // Ids that name no method: RabbitMQ's reader crashes and the socket
        // closes without a connection.close.
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.send_bytes(&[1, 0, 0, 0, 0, 0, 4, 0, 99, 0, 99, 0xCE]).await;
        assert_eq!(client.recv_frame().await, None);
    })
    .await
}

#[tokio::test]
async fn a_frame_end_that_is_not_0xce_is_501() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.send_bytes(&[8, 0, 0, 0, 0, 0, 0, 0xCD]).await;
        let close = client.expect(|m| matches!(m, Method::ConnectionClose(_))).await;
        assert_eq!(close_of(&close).0, 501);
    })
    .await
}

#[tokio::test]
async fn connection_close_is_answered_with_close_ok_and_the_socket_goes() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        let reply = client
            .call(
                0,
                ConnectionClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    class_id: 0,
                    method_id: 0,
                },
            )
            .await;
        assert!(matches!(reply, Method::ConnectionCloseOk(_)));
        assert!(client.closed().await);
        assert_eq!(broker.connection_count(), 0);
    })
    .await
}

#[tokio::test]
async fn channel_close_is_answered_with_close_ok() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        let reply = client
            .call(
                1,
                ChannelClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    class_id: 0,
                    method_id: 0,
                },
            )
            .await;
        assert!(matches!(reply, Method::ChannelCloseOk(_)));
        client.open_channel(1).await;
    })
    .await
}

#[tokio::test]
async fn consume_reusing_a_tag_is_530() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        client.declare_queue(1, "tags", FieldTable::new()).await;
        let consume = acemq_codec::BasicConsume {
            queue: "tags".into(),
            consumer_tag: "t".into(),
            ..Default::default()
        };
        client.call(1, consume.clone()).await;
        let close = client.call(1, consume).await;
        assert_eq!(
            close_of(&close),
            (530, "NOT_ALLOWED - attempt to reuse consumer tag 't'".into(), 60, 20)
        );
    })
    .await
}
