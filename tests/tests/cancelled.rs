//! A consumer the broker cancels (its queue deleted: `basic.cancel` from
//! the broker) or whose channel the broker closes (406 for a delivery not
//! acknowledged within RabbitMQ's `consumer_timeout`): it is reported
//! through `on_recovery` with the broker's reason and counted, then
//! subscribed again on a new channel (the default), or it ends with the
//! reason in `Consumer::closed()` when built with `.on_cancel(OnCancel::End)`.
//! Deliveries from the closed channel are never settled on the new one.

use std::sync::Arc;
use std::time::Duration;

use acemq_codec::QueueDelete;
use acemq_core::{consume, Ack, Config, Error, Message, OnCancel, RecoveryEvent, Topology};
use acemq_tests::{brokers, deadline, forward, next, unique, Broker, RecoveryLog};
use tokio::sync::mpsc;

/// Deletes `queue` behind the consumer's back, from a connection of its own.
async fn delete_behind_its_back(b: &Broker, queue: &str) {
    let other = b.connect().await;
    let ch = other.channel().await.unwrap();
    ch.queue_delete(QueueDelete {
        queue: queue.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    other.close().await.unwrap();
}

async fn cleanup(b: &Broker, queue: &str) {
    let other = b.connect().await;
    let ch = other.channel().await.unwrap();
    for name in [queue.to_string(), format!("{queue}.dlq"), format!("{queue}.parked")] {
        let _ = ch
            .queue_delete(QueueDelete {
                queue: name.as_str().into(),
                ..Default::default()
            })
            .await;
    }
    let _ = other.close().await;
}

#[test]
fn a_consumer_whose_queue_is_deleted_and_declared_again_resubscribes_and_handles_new_messages() {
    acemq_tests::deadline_blocking(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        for b in runtime.block_on(brokers()) {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let counts = acemq_tests::counted_by(acemq_core::metrics_names::RECOVERY_TOTAL, "event", async {
                let conn = b.conn_with(events.config(Config::default())).await;
                let queue = unique("cancel-resub");
                Topology::new().queue(&queue).declare(&conn).await.unwrap();
                let (tx, mut rx) = mpsc::unbounded_channel();
                let consumer = consume(&conn, &queue, forward(tx)).await.unwrap();
                let publisher = conn.publisher::<u32>("", &queue).mandatory();
                publisher.send(&1).await.unwrap();
                assert_eq!(next(&mut rx, "the first message").await.payload, 1, "{kind:?}");

                delete_behind_its_back(&b, &queue).await;
                let (reason, resubscribing) = events
                    .first("consumer_cancelled", Duration::from_secs(20), |e| match e {
                        RecoveryEvent::ConsumerCancelled {
                            queue: q,
                            reason,
                            resubscribing,
                        } if *q == queue => Some((reason.clone(), *resubscribing)),
                        _ => None,
                    })
                    .await;
                assert!(reason.contains("basic.cancel"), "{kind:?}: {reason}");
                assert!(resubscribing, "{kind:?}");
                // Its queue is gone: it keeps trying, with the backoff, and
                // is still running.
                tokio::time::sleep(Duration::from_millis(500)).await;
                assert!(!consumer.is_finished(), "{kind:?}");

                Topology::new().queue(&queue).declare(&conn).await.unwrap();
                let (again_reason, attempts) = events
                    .first("consumer_resubscribed", Duration::from_secs(20), |e| match e {
                        RecoveryEvent::ConsumerResubscribed {
                            queue: q,
                            reason,
                            attempts,
                        } if *q == queue => Some((reason.clone(), *attempts)),
                        _ => None,
                    })
                    .await;
                assert_eq!(again_reason, reason, "{kind:?}");
                assert!(attempts >= 1, "{kind:?}");
                publisher.send(&2).await.unwrap();
                assert_eq!(
                    next(&mut rx, "a message after the resubscribe").await.payload,
                    2,
                    "{kind:?}"
                );
                consumer.close().await.unwrap();
                conn.close().await.unwrap();
                cleanup(&b, &queue).await;
            });
            assert_eq!(counts.get("consumer_cancelled"), Some(&1), "{kind:?}: {counts:?}");
            assert_eq!(counts.get("consumer_resubscribed"), Some(&1), "{kind:?}: {counts:?}");
        }
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn with_on_cancel_end_a_consumer_whose_queue_is_deleted_ends_with_the_broker_reason() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let conn = b.conn_with(events.config(Config::default())).await;
            let queue = unique("cancel-end");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let (tx, _rx) = mpsc::unbounded_channel();
            let consumer = consume(&conn, &queue, forward(tx))
                .on_cancel(OnCancel::End)
                .await
                .unwrap();
            delete_behind_its_back(&b, &queue).await;
            let ended = tokio::time::timeout(Duration::from_secs(20), consumer.closed())
                .await
                .unwrap_or_else(|_| panic!("{kind:?}: the consumer ends"));
            match ended {
                Err(Error::ConsumerCancelled { queue: q, reason }) => {
                    assert_eq!(q, queue, "{kind:?}");
                    assert!(reason.contains("basic.cancel"), "{kind:?}: {reason}");
                }
                other => panic!("{kind:?}: {other:?}"),
            }
            assert!(
                events.all().iter().any(|e| matches!(
                    e,
                    RecoveryEvent::ConsumerCancelled {
                        resubscribing: false,
                        ..
                    }
                )),
                "{kind:?}: {:?}",
                events.all()
            );
            assert!(!events.all().iter().any(|e| e.label() == "consumer_resubscribed"));
            conn.close().await.unwrap();
            cleanup(&b, &queue).await;
        }
    })
    .await
}

/// RabbitMQ only: acemq-memory has no delivery-acknowledgement timeout.
/// Over TCP only (TLS changes nothing here, and each run waits for the
/// broker's check). On 3.10 the timeout is the node's `consumer_timeout`,
/// and the check runs on the channel's tick (`channel_tick_interval`, a
/// minute by default); both are read by a channel when it opens, so they
/// are set on this run's own node before the consumer starts and put back
/// after. On 4.0 the queue's and the consumer's `x-consumer-timeout`
/// arguments set it, leaving the shared node alone; its check still comes
/// with the channel's tick, up to a minute later.
#[test]
fn a_handler_past_the_consumer_timeout_gets_406_and_the_consumer_resubscribes_without_sending_the_late_ack_on_3_10() {
    past_the_consumer_timeout(acemq_tests::RabbitVersion::V3_10);
}

#[test]
fn a_handler_past_the_consumer_timeout_gets_406_and_the_consumer_resubscribes_without_sending_the_late_ack_on_4_0() {
    past_the_consumer_timeout(acemq_tests::RabbitVersion::V4_0);
}

/// The consumer_timeout scenario on RabbitMQ `version`, over TCP.
fn past_the_consumer_timeout(version: acemq_tests::RabbitVersion) {
    acemq_tests::deadline_blocking(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let all = runtime.block_on(brokers());
        let rabbits: Vec<Broker> = all
            .into_iter()
            .filter(|b| b.version() == Some(version) && !b.kind.is_tls())
            .collect();
        if rabbits.is_empty() {
            eprintln!("no RabbitMQ {version:?} in this run: the consumer_timeout test needs it");
        }
        for b in rabbits {
            let kind = b.kind;
            let v3 = b.rabbit() == acemq_tests::RabbitVersion::V3_10;
            if v3 {
                b.rabbitmqctl(&["eval", "application:set_env(rabbit, consumer_timeout, 1000)."]);
                b.rabbitmqctl(&["eval", "application:set_env(rabbit, channel_tick_interval, 500)."]);
            }
            let events = RecoveryLog::default();
            let counts = acemq_tests::counted_by(acemq_core::metrics_names::RECOVERY_TOTAL, "event", async {
                let conn = b.conn_with(events.config(Config::default())).await;
                let queue = unique("cancel-406");
                let mut arguments = acemq_codec::FieldTable::new();
                if !v3 {
                    arguments.insert("x-consumer-timeout", acemq_codec::FieldValue::I64(1000));
                }
                Topology::new()
                    .queue_with_arguments(&queue, arguments)
                    .declare(&conn)
                    .await
                    .unwrap();
                let (tx, mut rx) = mpsc::unbounded_channel();
                let (release_tx, release_rx) = tokio::sync::watch::channel(false);
                let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let handler = move |m: Message<u32>| {
                    let (tx, mut release, calls) = (tx.clone(), release_rx.clone(), calls.clone());
                    async move {
                        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                        let _ = tx.send(m);
                        if first {
                            // Past the broker's timeout: it closes the channel.
                            let _ = release.wait_for(|r| *r).await;
                        }
                        Ack::accept()
                    }
                };
                let mut builder = consume(&conn, &queue, handler);
                if !v3 {
                    builder = builder.argument("x-consumer-timeout", 1000i64);
                }
                let consumer = builder.await.unwrap();
                if v3 {
                    // Channels opened from now on get 3.10's defaults again (unset,
                    // `channel_tick_interval` would crash every new channel).
                    b.rabbitmqctl(&["eval", "application:set_env(rabbit, consumer_timeout, 1800000)."]);
                    b.rabbitmqctl(&["eval", "application:set_env(rabbit, channel_tick_interval, 60000)."]);
                }
                conn.publisher::<u32>("", &queue).send(&7).await.unwrap();
                let first = next(&mut rx, "the first delivery").await;
                assert!(!first.redelivered, "{kind:?}");
                let reason = events
                    .first("consumer_cancelled", Duration::from_secs(90), |e| match e {
                        RecoveryEvent::ConsumerCancelled { queue: q, reason, .. } if *q == queue => {
                            Some(reason.clone())
                        }
                        _ => None,
                    })
                    .await;
                assert!(reason.contains("406"), "{kind:?}: {reason}");
                // Resubscribed on a new channel, the broker redelivers it
                // while the first handler still holds its copy.
                let again = next(&mut rx, "the redelivery on the new channel").await;
                assert_eq!(again.payload, 7, "{kind:?}");
                assert!(again.redelivered, "{kind:?}");
                assert_eq!(again.envelope.attempt, 2, "{kind:?}: a redelivery counts");
                // The late handler accepts now: its ack belongs to the
                // closed channel and must not reach the new one (where its
                // tag would close the channel with 406 again).
                release_tx.send_replace(true);
                tokio::time::sleep(Duration::from_millis(500)).await;
                conn.publisher::<u32>("", &queue).send(&8).await.unwrap();
                assert_eq!(next(&mut rx, "a message after").await.payload, 8, "{kind:?}");
                let cancels = events
                    .all()
                    .iter()
                    .filter(|e| e.label() == "consumer_cancelled")
                    .count();
                assert_eq!(cancels, 1, "{kind:?}: the new channel stayed open: {:?}", events.all());
                consumer.close().await.unwrap();
                let ch = conn.consuming_connection().channel().await.unwrap();
                assert_eq!(acemq_tests::depth(&ch, &queue).await, 0, "{kind:?}");
                conn.close().await.unwrap();
                cleanup(&b, &queue).await;
            });
            if v3 {
                b.rabbitmqctl(&["eval", "application:set_env(rabbit, consumer_timeout, 1800000)."]);
                b.rabbitmqctl(&["eval", "application:set_env(rabbit, channel_tick_interval, 60000)."]);
            }
            assert_eq!(counts.get("consumer_cancelled"), Some(&1), "{kind:?}: {counts:?}");
            assert_eq!(counts.get("consumer_resubscribed"), Some(&1), "{kind:?}: {counts:?}");
            assert_eq!(
                counts.get("settlement_dropped"),
                Some(&1),
                "{kind:?}: the late ack was dropped and counted: {counts:?}"
            );
        }
    });
}
