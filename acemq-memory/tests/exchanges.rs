//! Point 2: exchanges, routing, bindings, passive declares and equivalence.

mod common;

use acemq_codec::{
    BasicGet, ExchangeBind, ExchangeDeclare, ExchangeDelete, FieldTable, FieldValue, Method, QueueBind, QueueDeclare,
};
use acemq_memory::Broker;
use common::{args, close_of, Client};

async fn exchange(client: &mut Client, ch: u16, name: &str, kind: &str) {
    let reply = client
        .call(
            ch,
            ExchangeDeclare {
                exchange: name.into(),
                kind: kind.into(),
                durable: true,
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(reply, Method::ExchangeDeclareOk(_)), "{reply:?}");
}

async fn bind(client: &mut Client, ch: u16, queue: &str, exchange: &str, key: &str, arguments: FieldTable) {
    let reply = client
        .call(
            ch,
            QueueBind {
                queue: queue.into(),
                exchange: exchange.into(),
                routing_key: key.into(),
                arguments,
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(reply, Method::QueueBindOk(_)), "{reply:?}");
}

/// How many messages `queue` holds, by draining it with basic.get.
async fn drain(client: &mut Client, ch: u16, queue: &str) -> Vec<String> {
    let mut bodies = Vec::new();
    loop {
        client
            .send(
                ch,
                BasicGet {
                    queue: queue.into(),
                    no_ack: true,
                    ..Default::default()
                },
            )
            .await;
        let frame = client.next().await;
        match frame {
            acemq_codec::Frame::Method(_, Method::BasicGetEmpty(_)) => return bodies,
            acemq_codec::Frame::Method(_, Method::BasicGetOk(_)) => {
                let header = client.next().await;
                let acemq_codec::Frame::Header(_, header) = header else {
                    panic!()
                };
                if header.body_size > 0 {
                    let acemq_codec::Frame::Body(_, body) = client.next().await else {
                        panic!()
                    };
                    bodies.push(String::from_utf8_lossy(&body).into_owned());
                } else {
                    bodies.push(String::new());
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn rabbitmqs_exchanges_are_predeclared() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        for name in ["", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"] {
            assert!(broker.exchange_exists("/", name), "{name}");
        }
        let mut client = Client::open(&broker).await;
        client.open_channel(1).await;
        for (name, kind) in [("amq.direct", "direct"), ("amq.topic", "topic")] {
            let reply = client
                .call(
                    1,
                    ExchangeDeclare {
                        exchange: name.into(),
                        kind: kind.into(),
                        passive: true,
                        ..Default::default()
                    },
                )
                .await;
            assert!(matches!(reply, Method::ExchangeDeclareOk(_)));
        }
    })
    .await
}

#[tokio::test]
async fn default_direct_fanout_topic_and_headers_exchanges_route_as_rabbitmq() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        for q in ["d", "f1", "f2", "t1", "t2", "h_all", "h_any"] {
            c.declare_queue(1, q, FieldTable::new()).await;
        }
        exchange(&mut c, 1, "x.direct", "direct").await;
        exchange(&mut c, 1, "x.fanout", "fanout").await;
        exchange(&mut c, 1, "x.topic", "topic").await;
        exchange(&mut c, 1, "x.headers", "headers").await;
        bind(&mut c, 1, "d", "x.direct", "k", FieldTable::new()).await;
        bind(&mut c, 1, "f1", "x.fanout", "ignored", FieldTable::new()).await;
        bind(&mut c, 1, "f2", "x.fanout", "", FieldTable::new()).await;
        bind(&mut c, 1, "t1", "x.topic", "orders.*.placed", FieldTable::new()).await;
        bind(&mut c, 1, "t2", "x.topic", "orders.#", FieldTable::new()).await;
        let all = args(&[("x-match", "all".into()), ("a", FieldValue::I32(1)), ("b", "x".into())]);
        let any = args(&[("x-match", "any".into()), ("a", FieldValue::I32(1)), ("b", "x".into())]);
        bind(&mut c, 1, "h_all", "x.headers", "", all).await;
        bind(&mut c, 1, "h_any", "x.headers", "", any).await;

        c.publish(1, "", "d", b"default").await;
        c.publish(1, "x.direct", "k", b"direct").await;
        c.publish(1, "x.direct", "other", b"lost").await;
        c.publish(1, "x.fanout", "whatever", b"fanout").await;
        c.publish(1, "x.topic", "orders.eu.placed", b"t-both").await;
        c.publish(1, "x.topic", "orders", b"t-hash").await;
        c.publish(1, "x.topic", "orders.eu.x.placed", b"t-hash2").await;
        let mut headers = FieldTable::new();
        headers.insert("a", FieldValue::I64(1));
        let props = acemq_codec::BasicProperties {
            headers: Some(headers.clone()),
            ..Default::default()
        };
        let publish = acemq_codec::BasicPublish {
            exchange: "x.headers".into(),
            ..Default::default()
        };
        c.publish_with(1, publish.clone(), props, b"h-a").await;
        headers.insert("b", "x");
        let props = acemq_codec::BasicProperties {
            headers: Some(headers),
            ..Default::default()
        };
        c.publish_with(1, publish, props, b"h-ab").await;

        assert_eq!(drain(&mut c, 1, "d").await, ["default", "direct"]);
        assert_eq!(drain(&mut c, 1, "f1").await, ["fanout"]);
        assert_eq!(drain(&mut c, 1, "f2").await, ["fanout"]);
        assert_eq!(drain(&mut c, 1, "t1").await, ["t-both"]);
        assert_eq!(drain(&mut c, 1, "t2").await, ["t-both", "t-hash", "t-hash2"]);
        assert_eq!(drain(&mut c, 1, "h_all").await, ["h-ab"]);
        assert_eq!(drain(&mut c, 1, "h_any").await, ["h-a", "h-ab"]);
    })
    .await
}

#[tokio::test]
async fn exchange_to_exchange_bindings_route_through_and_each_queue_gets_one_copy() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        exchange(&mut c, 1, "upstream", "topic").await;
        exchange(&mut c, 1, "downstream", "fanout").await;
        c.declare_queue(1, "sink", FieldTable::new()).await;
        let reply = c
            .call(
                1,
                ExchangeBind {
                    destination: "downstream".into(),
                    source: "upstream".into(),
                    routing_key: "a.#".into(),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::ExchangeBindOk(_)));
        bind(&mut c, 1, "sink", "downstream", "", FieldTable::new()).await;
        bind(&mut c, 1, "sink", "upstream", "a.b", FieldTable::new()).await;
        c.publish(1, "upstream", "a.b", b"once").await;
        c.publish(1, "upstream", "z", b"nowhere").await;
        assert_eq!(drain(&mut c, 1, "sink").await, ["once"]);
    })
    .await
}

#[tokio::test]
async fn publishing_to_an_internal_exchange_is_403() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        let reply = c
            .call(
                1,
                ExchangeDeclare {
                    exchange: "inner".into(),
                    kind: "fanout".into(),
                    internal: true,
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::ExchangeDeclareOk(_)));
        c.publish(1, "inner", "", b"x").await;
        let close = c.method().await.1;
        assert_eq!(
            close_of(&close),
            (
                403,
                "ACCESS_REFUSED - cannot publish to internal exchange 'inner' in vhost '/'".into(),
                60,
                40
            )
        );
    })
    .await
}

#[tokio::test]
async fn publishing_to_a_missing_exchange_is_404() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.publish(1, "nope", "", b"x").await;
        let close = c.method().await.1;
        assert_eq!(
            close_of(&close),
            (404, "NOT_FOUND - no exchange 'nope' in vhost '/'".into(), 60, 40)
        );
    })
    .await
}

#[tokio::test]
async fn passive_declare_of_a_missing_exchange_is_404() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        let reply = c
            .call(
                1,
                ExchangeDeclare {
                    exchange: "ghost".into(),
                    kind: "direct".into(),
                    passive: true,
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (404, "NOT_FOUND - no exchange 'ghost' in vhost '/'".into(), 40, 10)
        );
    })
    .await
}

#[tokio::test]
async fn redeclaring_an_exchange_with_another_type_is_406_with_rabbitmqs_text() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    c.open_channel(1).await;
    exchange(&mut c, 1, "orders", "direct").await;
    let reply = c
        .call(
            1,
            ExchangeDeclare {
                exchange: "orders".into(),
                kind: "fanout".into(),
                durable: true,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply),
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'orders' in vhost '/': received 'fanout' but current is 'direct'"
                .into(),
            40,
            10
        )
    );
    c.open_channel(2).await;
    let reply = c
        .call(
            2,
            ExchangeDeclare {
                exchange: "orders".into(),
                kind: "direct".into(),
                durable: false,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply).1,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'orders' in vhost '/': received 'false' but current is 'true'"
    );
    })
    .await
}

#[tokio::test]
async fn an_unknown_exchange_type_closes_the_connection_with_503_on_3_10_and_the_channel_with_406_on_4_0() {
    common::deadline::deadline(async {
        for version in acemq_memory::RabbitMqVersion::ALL {
            let broker = Broker::new(acemq_memory::BrokerConfig::for_version(version));
            let mut c = Client::open(&broker).await;
            c.open_channel(1).await;
            let reply = c
                .call(
                    1,
                    ExchangeDeclare {
                        exchange: "odd".into(),
                        kind: "x-odd".into(),
                        ..Default::default()
                    },
                )
                .await;
            if version.is_4() {
                assert!(matches!(reply, Method::ChannelClose(_)), "{reply:?}");
                assert_eq!(
                    close_of(&reply),
                    (
                        406,
                        "PRECONDITION_FAILED - unknown exchange type 'x-odd'".into(),
                        40,
                        10
                    )
                );
            } else {
                assert!(matches!(reply, Method::ConnectionClose(_)), "{reply:?}");
                assert_eq!(
                    close_of(&reply),
                    (503, "COMMAND_INVALID - unknown exchange type 'x-odd'".into(), 40, 10)
                );
            }
        }
    })
    .await
}

#[tokio::test]
async fn amq_prefixed_names_are_reserved() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        let reply = c
            .call(
                1,
                ExchangeDeclare {
                    exchange: "amq.mine".into(),
                    kind: "direct".into(),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (
                403,
                "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'".into(),
                40,
                10
            )
        );
        c.open_channel(2).await;
        let reply = c
            .call(
                2,
                QueueDeclare {
                    queue: "amq.q".into(),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(close_of(&reply).0, 403);
    })
    .await
}

#[tokio::test]
async fn exchange_delete_if_unused_refuses_an_exchange_with_bindings() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        exchange(&mut c, 1, "busy", "fanout").await;
        c.declare_queue(1, "bq", FieldTable::new()).await;
        bind(&mut c, 1, "bq", "busy", "", FieldTable::new()).await;
        let reply = c
            .call(
                1,
                ExchangeDelete {
                    exchange: "busy".into(),
                    if_unused: true,
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (
                406,
                "PRECONDITION_FAILED - exchange 'busy' in vhost '/' in use".into(),
                40,
                20
            )
        );
        c.open_channel(2).await;
        let reply = c
            .call(
                2,
                ExchangeDelete {
                    exchange: "busy".into(),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::ExchangeDeleteOk(_)));
        assert!(!broker.exchange_exists("/", "busy"));
    })
    .await
}

#[tokio::test]
async fn alternate_exchange_takes_what_the_exchange_cannot_route() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        exchange(&mut c, 1, "ae", "fanout").await;
        let reply = c
            .call(
                1,
                ExchangeDeclare {
                    exchange: "main".into(),
                    kind: "direct".into(),
                    durable: true,
                    arguments: args(&[("alternate-exchange", "ae".into())]),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::ExchangeDeclareOk(_)));
        c.declare_queue(1, "unrouted", FieldTable::new()).await;
        bind(&mut c, 1, "unrouted", "ae", "", FieldTable::new()).await;
        c.publish(1, "main", "nobody", b"caught").await;
        assert_eq!(drain(&mut c, 1, "unrouted").await, ["caught"]);
    })
    .await
}

#[tokio::test]
async fn cc_and_bcc_headers_add_routing_keys_and_bcc_is_removed() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        for q in ["main", "cc", "bcc"] {
            c.declare_queue(1, q, FieldTable::new()).await;
        }
        let mut headers = FieldTable::new();
        headers.insert("CC", FieldValue::Array(acemq_codec::FieldArray(vec!["cc".into()])));
        headers.insert("BCC", FieldValue::Array(acemq_codec::FieldArray(vec!["bcc".into()])));
        let props = acemq_codec::BasicProperties {
            headers: Some(headers),
            ..Default::default()
        };
        let publish = acemq_codec::BasicPublish {
            routing_key: "main".into(),
            ..Default::default()
        };
        c.publish_with(1, publish, props, b"x").await;
        for q in ["main", "cc", "bcc"] {
            c.send(
                1,
                BasicGet {
                    queue: q.into(),
                    no_ack: true,
                    ..Default::default()
                },
            )
            .await;
            let d = c.content().await;
            assert!(d.header("CC").is_some(), "{q}");
            assert!(d.header("BCC").is_none(), "{q}");
        }
    })
    .await
}
