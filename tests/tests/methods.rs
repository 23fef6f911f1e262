//! The rest of the low-level API against every broker: authentication and
//! vhost refusals, failover between hosts, exchange-to-exchange bindings,
//! unbind, purge and delete counts, transactions, recover, get-empty.

use std::time::Duration;

use acemq_codec::*;
use acemq_core::amqp::{CloseReason, Config, Confirmation, Connection, Error};
use acemq_tests::{brokers, exclusive_queue, unique};
use bytes::Bytes;

fn with_credentials(url: &str, user: &str, pass: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let rest = rest.split_once('@').map_or(rest, |(_, r)| r);
    format!("{scheme}://{user}:{pass}@{rest}")
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_credentials_are_refused_with_403() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let url = with_credentials(&b.url, "guest", "not-the-password");
            let err = Connection::open(&url, b.config()).await.unwrap_err();
            match err {
                Error::ConnectionClosed(CloseReason::ByServer(r)) => {
                    assert_eq!(r.code, 403, "{:?}", b.kind);
                    assert!(r.text.starts_with("ACCESS_REFUSED"), "{}", r.text);
                    assert!(!format!("{r}").contains("not-the-password"));
                }
                other => panic!("{:?}: {other:?}", b.kind),
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn amqplain_authenticates_too() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = Connection::open(&format!("{}?auth_mechanism=amqplain", b.url), b.config())
                .await
                .unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_vhost_is_refused_with_530() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let url = format!(
                "{}no-such-vhost-{}",
                b.url.trim_end_matches('/').to_string() + "/",
                std::process::id()
            );
            let err = Connection::open(&url, b.config()).await.unwrap_err();
            assert_eq!(err.reply_code(), Some(530), "{:?}: {err}", b.kind);
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn hosts_are_tried_in_turn_until_one_answers() {
    acemq_tests::deadline(async {
        // Dialling hosts in turn is about sockets: RabbitMQ only.
        for b in brokers().await.into_iter().filter(|b| b.is_rabbitmq()) {
            // A port nobody listens on, then the broker.
            let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let dead_port = dead.local_addr().unwrap().port();
            drop(dead);
            let (scheme, rest) = b.url.split_once("://").unwrap();
            let (userinfo, hostpart) = rest.split_once('@').unwrap();
            let (hosts, path) = hostpart.split_once('/').unwrap_or((hostpart, ""));
            let url = format!("{scheme}://{userinfo}@127.0.0.1:{dead_port},{hosts}/{path}");
            let conn = Connection::open(&url, b.config()).await.unwrap();
            assert!(!conn.is_closed());
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn exchange_to_exchange_bindings_route_and_unbind_stops_them() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let (source, destination) = (unique("src"), unique("dst"));
            // The source must not auto-delete: unbinding its only binding would delete it.
            for (name, kind, auto_delete) in [(&source, "topic", false), (&destination, "fanout", true)] {
                ch.exchange_declare(ExchangeDeclare {
                    exchange: name.as_str().into(),
                    kind: kind.into(),
                    auto_delete,
                    ..Default::default()
                })
                .await
                .unwrap();
            }
            let q = ch
                .queue_declare(QueueDeclare {
                    exclusive: true,
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap()
                .queue;
            ch.queue_bind(QueueBind {
                queue: q.clone(),
                exchange: destination.as_str().into(),
                ..Default::default()
            })
            .await
            .unwrap();
            let bind = ExchangeBind {
                destination: destination.as_str().into(),
                source: source.as_str().into(),
                routing_key: "order.*".into(),
                ..Default::default()
            };
            ch.exchange_bind(bind.clone()).await.unwrap();
            let publish = |key: &'static str| {
                ch.publish(
                    &source,
                    key,
                    true,
                    BasicProperties::default(),
                    Bytes::from(key.to_string()),
                )
            };
            assert_eq!(publish("order.placed").await.unwrap().await.unwrap(), Confirmation::Ack);
            assert!(matches!(
                publish("invoice.sent").await.unwrap().await.unwrap(),
                Confirmation::Returned(_)
            ));
            let got = ch.basic_get(q.as_str().unwrap(), true).await.unwrap().unwrap();
            assert_eq!(&got.body[..], b"order.placed");
            ch.exchange_unbind(ExchangeUnbind {
                destination: bind.destination,
                source: bind.source,
                routing_key: bind.routing_key,
                ..Default::default()
            })
            .await
            .unwrap();
            assert!(matches!(
                publish("order.placed").await.unwrap().await.unwrap(),
                Confirmation::Returned(_)
            ));
            ch.exchange_delete(ExchangeDelete {
                exchange: source.as_str().into(),
                ..Default::default()
            })
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn purge_and_delete_report_their_message_counts_and_get_empty_says_so() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = unique("counts");
            ch.queue_declare(QueueDeclare {
                queue: q.as_str().into(),
                durable: true,
                ..Default::default()
            })
            .await
            .unwrap();
            let send = |n: usize| {
                let ch = ch.clone();
                let q = q.clone();
                async move {
                    for i in 0..n {
                        ch.publish("", &q, false, BasicProperties::default(), Bytes::from(i.to_string()))
                            .await
                            .unwrap()
                            .await
                            .unwrap();
                    }
                }
            };
            send(3).await;
            let purged = ch
                .queue_purge(QueuePurge {
                    queue: q.as_str().into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(purged.message_count, 3);
            assert!(ch.basic_get(&q, true).await.unwrap().is_none(), "get-empty");
            send(2).await;
            ch.queue_unbind(QueueUnbind {
                queue: q.as_str().into(),
                exchange: "amq.direct".into(),
                routing_key: "nothing".into(),
                ..Default::default()
            })
            .await
            .unwrap();
            let deleted = ch
                .queue_delete(QueueDelete {
                    queue: q.as_str().into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(deleted.message_count, 2);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolled_back_transaction_publishes_nothing_and_a_committed_one_everything() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            let q = exclusive_queue(&ch).await;
            ch.tx_select().await.unwrap();
            let no_confirms = ch
                .publish("", &q, false, BasicProperties::default(), "rolled back")
                .await
                .unwrap();
            assert_eq!(no_confirms.await.unwrap(), Confirmation::NotRequested);
            ch.tx_rollback().await.unwrap();
            ch.publish("", &q, false, BasicProperties::default(), "committed")
                .await
                .unwrap();
            ch.tx_commit().await.unwrap();
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            assert_eq!(&got.body[..], b"committed");
            assert_eq!(got.message_count, 0);
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn recover_redelivers_unacknowledged_messages() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let ch = conn.channel().await.unwrap();
            ch.confirm_select().await.unwrap();
            let q = exclusive_queue(&ch).await;
            ch.publish("", &q, false, BasicProperties::default(), "again")
                .await
                .unwrap()
                .await
                .unwrap();
            let mut consumer = ch.consume(&q).await.unwrap();
            let first = consumer.next().await.unwrap();
            assert!(!first.redelivered);
            ch.basic_recover(BasicRecover { requeue: true }).await.unwrap();
            let second = tokio::time::timeout(Duration::from_secs(5), consumer.next())
                .await
                .unwrap()
                .unwrap();
            assert!(second.redelivered, "{:?}", b.kind);
            assert_eq!(&second.body[..], b"again");
            second.ack().unwrap();
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_every_handle_closes_the_connection() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let probe = conn.events();
            let ch = conn.channel().await.unwrap();
            drop(ch);
            drop(conn);
            let mut probe = probe;
            let closed = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match probe.recv().await {
                        Ok(acemq_core::amqp::ConnectionEvent::Closed(reason)) => break reason,
                        Ok(_) => continue,
                        Err(_) => break CloseReason::ConnectionLost,
                    }
                }
            })
            .await
            .unwrap();
            assert_eq!(closed, CloseReason::ByClient, "{:?}", b.kind);
        }
    })
    .await
}

#[allow(dead_code)]
fn config_is_clone(c: &Config) -> Config {
    c.clone()
}

/// How a redeclare compares the queue type, as RabbitMQ 3.10.8 does it
/// (and acemq-memory with it): a queue declared without `x-queue-type` is
/// classic, so `classic` and no argument are equivalent either way; a
/// declare without the argument over a quorum queue, or of another type,
/// is refused with 406.
#[tokio::test(flavor = "multi_thread")]
async fn a_redeclare_compares_the_queue_type_as_rabbitmq_does() {
    use acemq_codec::{FieldTable, FieldValue, QueueDeclare};
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.connect().await;
            let declare = |name: &str, kind: Option<&str>| {
                let mut arguments = FieldTable::new();
                if let Some(kind) = kind {
                    arguments.insert("x-queue-type", FieldValue::from(kind));
                }
                QueueDeclare {
                    queue: name.into(),
                    durable: true,
                    arguments,
                    ..Default::default()
                }
            };
            let (quorum, classic) = (unique("type.quorum"), unique("type.classic"));
            let named_classic = unique("type.named-classic");
            let ch = conn.channel().await.unwrap();
            ch.queue_declare(declare(&quorum, Some("quorum"))).await.unwrap();
            ch.queue_declare(declare(&classic, None)).await.unwrap();
            ch.queue_declare(declare(&named_classic, Some("classic")))
                .await
                .unwrap();
            let mut outcomes = Vec::new();
            for (queue, kind) in [
                (&quorum, None),
                (&quorum, Some("classic")),
                (&classic, Some("classic")),
                (&classic, Some("quorum")),
                (&named_classic, None),
            ] {
                let ch = conn.channel().await.unwrap();
                let outcome = ch.queue_declare(declare(queue, kind)).await;
                outcomes.push(outcome.err().and_then(|e| e.reply_code()));
            }
            println!("{:?}: {outcomes:?}", b.kind);
            assert_eq!(outcomes, [Some(406), Some(406), None, Some(406), None], "{:?}", b.kind);
            conn.close().await.unwrap();
        }
    })
    .await;
}
