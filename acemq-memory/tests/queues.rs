//! Point 3: classic and quorum queues, exclusive and auto-delete, server
//! names, purge, delete, and consumers cancelled when their queue goes.

mod common;

use acemq_codec::{
    BasicAck, BasicCancel, BasicConsume, BasicNack, BasicQos, BasicReject, FieldTable, FieldValue, Method,
    QueueDeclare, QueueDelete, QueuePurge,
};
use acemq_memory::Broker;
use common::{args, close_of, Client};

fn quorum() -> FieldTable {
    args(&[("x-queue-type", "quorum".into())])
}

#[tokio::test]
async fn redeclare_with_different_arguments_is_406_and_closes_only_the_channel() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    c.open_channel(1).await;
    c.open_channel(2).await;
    c.declare_queue(1, "q", FieldTable::new()).await;
    let reply = c
        .call(
            1,
            QueueDeclare {
                queue: "q".into(),
                durable: true,
                arguments: args(&[("x-message-ttl", FieldValue::I32(2000))]),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply),
        (
            406,
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
                .into(),
            50,
            10
        )
    );
    c.declare_queue(2, "q", FieldTable::new()).await;
    })
    .await
}

#[tokio::test]
async fn integer_arguments_are_compared_by_value_not_width() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    c.open_channel(1).await;
    c.declare_queue(1, "ttl", args(&[("x-message-ttl", FieldValue::I32(1000))]))
        .await;
    c.declare_queue(1, "ttl", args(&[("x-message-ttl", FieldValue::I64(1000))]))
        .await;
    c.declare_queue(1, "ttl", args(&[("x-message-ttl", FieldValue::U16(1000))]))
        .await;
    let reply = c
        .call(
            1,
            QueueDeclare {
                queue: "ttl".into(),
                durable: true,
                arguments: args(&[("x-message-ttl", FieldValue::I64(999))]),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply).1,
        "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'ttl' in vhost '/': received '999' but current is '1000'"
    );
    })
    .await
}

#[tokio::test]
async fn redeclare_with_different_durability_is_406() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    c.open_channel(1).await;
    c.declare_queue(1, "dq", FieldTable::new()).await;
    let reply = c
        .call(
            1,
            QueueDeclare {
                queue: "dq".into(),
                durable: false,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply).1,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'dq' in vhost '/': received 'false' but current is 'true'"
    );
    })
    .await
}

#[tokio::test]
async fn a_server_named_queue_is_amq_gen_and_reported_in_declare_ok() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        let Method::QueueDeclareOk(ok) = c
            .call(
                1,
                QueueDeclare {
                    exclusive: true,
                    ..Default::default()
                },
            )
            .await
        else {
            panic!()
        };
        let name = ok.queue.to_string();
        assert!(name.starts_with("amq.gen-") && name.len() == 30, "{name}");
        assert!(broker.queue_info("/", &name).is_some());
    })
    .await
}

#[tokio::test]
async fn an_exclusive_queue_is_locked_to_its_connection_and_goes_with_it() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut owner = Client::open(&broker).await;
        owner.open_channel(1).await;
        let reply = owner
            .call(
                1,
                QueueDeclare {
                    queue: "mine".into(),
                    exclusive: true,
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::QueueDeclareOk(_)));
        let mut other = Client::open(&broker).await;
        other.open_channel(1).await;
        let reply = other
            .call(
                1,
                QueueDeclare {
                    queue: "mine".into(),
                    passive: true,
                    ..Default::default()
                },
            )
            .await;
        let (code, text, _, _) = close_of(&reply);
        assert_eq!(code, 405);
        assert!(
            text.starts_with("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in vhost '/'")
        );
        other.open_channel(2).await;
        let reply = other
            .call(
                2,
                BasicConsume {
                    queue: "mine".into(),
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(close_of(&reply).0, 405);
        owner.hang_up().await;
        for _ in 0..100 {
            if broker.queue_info("/", "mine").is_none() {
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("exclusive queue outlived its connection");
    })
    .await
}

#[tokio::test]
async fn an_auto_delete_queue_goes_with_its_last_consumer() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.call(
            1,
            QueueDeclare {
                queue: "ad".into(),
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            BasicConsume {
                queue: "ad".into(),
                consumer_tag: "a".into(),
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            BasicConsume {
                queue: "ad".into(),
                consumer_tag: "b".into(),
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            BasicCancel {
                consumer_tag: "a".into(),
                no_wait: false,
            },
        )
        .await;
        assert!(broker.queue_info("/", "ad").is_some());
        c.call(
            1,
            BasicCancel {
                consumer_tag: "b".into(),
                no_wait: false,
            },
        )
        .await;
        assert!(broker.queue_info("/", "ad").is_none());
    })
    .await
}

#[tokio::test]
async fn purge_removes_ready_messages_and_reports_how_many() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "p", FieldTable::new()).await;
        for _ in 0..3 {
            c.publish(1, "", "p", b"x").await;
        }
        let Method::QueuePurgeOk(ok) = c
            .call(
                1,
                QueuePurge {
                    queue: "p".into(),
                    ..Default::default()
                },
            )
            .await
        else {
            panic!()
        };
        assert_eq!(ok.message_count, 3);
        assert_eq!(broker.queue_info("/", "p").unwrap().messages, 0);
    })
    .await
}

#[tokio::test]
async fn delete_if_unused_and_if_empty_refuse_with_406() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "del", FieldTable::new()).await;
        c.publish(1, "", "del", b"x").await;
        let reply = c
            .call(
                1,
                QueueDelete {
                    queue: "del".into(),
                    if_empty: true,
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply),
            (
                406,
                "PRECONDITION_FAILED - queue 'del' in vhost '/' not empty".into(),
                50,
                40
            )
        );
        c.open_channel(2).await;
        c.call(
            2,
            BasicConsume {
                queue: "del".into(),
                consumer_tag: "c".into(),
                no_ack: true,
                ..Default::default()
            },
        )
        .await;
        let _ = c.content().await;
        let reply = c
            .call(
                2,
                QueueDelete {
                    queue: "del".into(),
                    if_unused: true,
                    ..Default::default()
                },
            )
            .await;
        assert_eq!(
            close_of(&reply).1,
            "PRECONDITION_FAILED - queue 'del' in vhost '/' in use"
        );
        c.open_channel(3).await;
        let Method::QueueDeleteOk(ok) = c
            .call(
                3,
                QueueDelete {
                    queue: "del".into(),
                    ..Default::default()
                },
            )
            .await
        else {
            panic!()
        };
        assert_eq!(ok.message_count, 0);
        // Deleting what does not exist is fine.
        let reply = c
            .call(
                3,
                QueueDelete {
                    queue: "del".into(),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::QueueDeleteOk(_)));
    })
    .await
}

#[tokio::test]
async fn quorum_queues_must_be_durable_non_exclusive_and_not_auto_delete() {
    common::deadline::deadline(async {
    let broker = Broker::default();
    let mut c = Client::open(&broker).await;
    for (ch, declare, property) in [
        (
            1,
            QueueDeclare {
                queue: "qq".into(),
                durable: false,
                arguments: quorum(),
                ..Default::default()
            },
            "non-durable",
        ),
        (
            2,
            QueueDeclare {
                queue: "qq".into(),
                durable: true,
                exclusive: true,
                arguments: quorum(),
                ..Default::default()
            },
            "exclusive-declare",
        ),
        (
            3,
            QueueDeclare {
                queue: "qq".into(),
                durable: true,
                auto_delete: true,
                arguments: quorum(),
                ..Default::default()
            },
            "auto-delete",
        ),
    ] {
        c.open_channel(ch).await;
        let reply = c.call(ch, declare).await;
        assert_eq!(
            close_of(&reply),
            (
                406,
                format!("PRECONDITION_FAILED - invalid property '{property}' for queue 'qq' in vhost '/'"),
                50,
                10
            )
        );
    }
    c.open_channel(4).await;
    c.declare_queue(4, "qq", quorum()).await;
    // Redeclaring without x-queue-type is inequivalent in 3.10.
    let reply = c
        .call(
            4,
            QueueDeclare {
                queue: "qq".into(),
                durable: true,
                ..Default::default()
            },
        )
        .await;
    assert_eq!(
        close_of(&reply).1,
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'qq' in vhost '/': received none but current is the value 'quorum' of type 'longstr'"
    );
    })
    .await
}

#[tokio::test]
async fn quorum_redeliveries_carry_x_delivery_count() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "qc", quorum()).await;
        c.publish(1, "", "qc", b"m").await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 1,
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            BasicConsume {
                queue: "qc".into(),
                consumer_tag: "c".into(),
                ..Default::default()
            },
        )
        .await;
        let first = c.content().await;
        assert_eq!(first.header("x-delivery-count"), None);
        assert!(!first.redelivered());
        c.send(
            1,
            BasicNack {
                delivery_tag: first.delivery_tag(),
                multiple: false,
                requeue: true,
            },
        )
        .await;
        let second = c.content().await;
        assert_eq!(second.header("x-delivery-count"), Some(&FieldValue::I64(1)));
        assert!(second.redelivered());
        c.send(
            1,
            BasicReject {
                delivery_tag: second.delivery_tag(),
                requeue: true,
            },
        )
        .await;
        let third = c.content().await;
        assert_eq!(third.header("x-delivery-count"), Some(&FieldValue::I64(2)));
        c.send(
            1,
            BasicAck {
                delivery_tag: third.delivery_tag(),
                multiple: false,
            },
        )
        .await;
    })
    .await
}

#[tokio::test]
async fn quorum_delivery_limit_dead_letters_with_reason_delivery_limit() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "limited.dlq", FieldTable::new()).await;
        c.declare_queue(
            1,
            "limited",
            args(&[
                ("x-queue-type", "quorum".into()),
                ("x-delivery-limit", FieldValue::I32(2)),
                ("x-dead-letter-exchange", "".into()),
                ("x-dead-letter-routing-key", "limited.dlq".into()),
            ]),
        )
        .await;
        c.publish(1, "", "limited", b"poison").await;
        c.call(
            1,
            BasicQos {
                prefetch_count: 1,
                ..Default::default()
            },
        )
        .await;
        c.call(
            1,
            BasicConsume {
                queue: "limited".into(),
                consumer_tag: "c".into(),
                ..Default::default()
            },
        )
        .await;
        for _ in 0..3 {
            let d = c.content().await;
            c.send(
                1,
                BasicNack {
                    delivery_tag: d.delivery_tag(),
                    multiple: false,
                    requeue: true,
                },
            )
            .await;
        }
        c.call(
            1,
            BasicConsume {
                queue: "limited.dlq".into(),
                consumer_tag: "dlq".into(),
                ..Default::default()
            },
        )
        .await;
        let dead = c.content().await;
        assert_eq!(&dead.body[..], b"poison");
        assert_eq!(
            dead.header("x-first-death-reason").and_then(FieldValue::as_str),
            Some("delivery_limit")
        );
        let death = dead
            .header("x-death")
            .and_then(FieldValue::as_array)
            .unwrap()
            .iter()
            .next()
            .unwrap();
        assert_eq!(
            death.as_table().unwrap().get("reason").and_then(FieldValue::as_str),
            Some("delivery_limit")
        );
        assert_eq!(broker.queue_info("/", "limited").unwrap().messages, 0);
    })
    .await
}

#[tokio::test]
async fn deleting_a_queue_cancels_its_consumers_that_asked_for_cancel_notify() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.declare_queue(1, "doomed", FieldTable::new()).await;
        c.call(
            1,
            BasicConsume {
                queue: "doomed".into(),
                consumer_tag: "watcher".into(),
                ..Default::default()
            },
        )
        .await;
        let mut deleter = Client::open(&broker).await;
        deleter.open_channel(1).await;
        let reply = deleter
            .call(
                1,
                QueueDelete {
                    queue: "doomed".into(),
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(reply, Method::QueueDeleteOk(_)));
        let cancel = c.method().await;
        assert!(
            matches!(&cancel, (1, Method::BasicCancel(m)) if m.consumer_tag == "watcher"),
            "{cancel:?}"
        );
    })
    .await
}

/// RabbitMQ (3.10 and 4.0) answers `queue.delete` before it cancels the
/// queue's consumers, on the deleting channel too: kombu deletes the queue
/// its own consumer reads (its event-loop integration test) and, with no
/// cancel callback, fails on a `basic.cancel` that arrives before
/// `delete-ok`.
#[tokio::test]
async fn delete_ok_comes_before_the_cancel_of_a_consumer_on_the_deleting_channel() {
    common::deadline::deadline(async {
        let broker = Broker::default();
        let mut c = Client::open(&broker).await;
        c.open_channel(1).await;
        c.open_channel(2).await;
        c.declare_queue(1, "consumed", FieldTable::new()).await;
        for (ch, tag) in [(1, "same-channel"), (2, "other-channel")] {
            let reply = c
                .call(
                    ch,
                    BasicConsume {
                        queue: "consumed".into(),
                        consumer_tag: tag.into(),
                        ..Default::default()
                    },
                )
                .await;
            assert!(matches!(reply, Method::BasicConsumeOk(_)), "{reply:?}");
        }
        c.send(
            1,
            QueueDelete {
                queue: "consumed".into(),
                ..Default::default()
            },
        )
        .await;
        let first = c.method().await;
        assert!(matches!(first, (1, Method::QueueDeleteOk(_))), "{first:?}");
        let mut cancelled = Vec::new();
        for _ in 0..2 {
            match c.method().await {
                (ch, Method::BasicCancel(m)) => {
                    cancelled.push((ch, String::from_utf8_lossy(m.consumer_tag.as_bytes()).into_owned()))
                }
                other => panic!("expected a basic.cancel, got {other:?}"),
            }
        }
        cancelled.sort();
        assert_eq!(
            cancelled,
            [(1, "same-channel".to_owned()), (2, "other-channel".to_owned())]
        );
    })
    .await
}
