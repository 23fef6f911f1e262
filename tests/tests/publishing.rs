//! The publishing side of the acemq API, on every broker (statements 13–15
//! of `docs/statements.md`): confirms by default, nacks as errors, publishing
//! without confirms, library publishes confirmed regardless, mandatory
//! errors that name the message, and the envelope on the wire.

use acemq_codec::{BasicProperties, FieldTable, FieldValue, QueueDeclare};
use acemq_core::amqp::Channel;
use acemq_core::envelope::{ATTEMPT_HEADER, CAUSATION_HEADER, FIRST_SEEN_HEADER};
use acemq_core::{Config, Conn, Envelope, Error, SendResult};
use acemq_tests::{brokers, counts_by_outcome, depth, unique};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
    item: String,
}

fn order(id: u32) -> Order {
    Order {
        id,
        item: format!("item-{id}"),
    }
}

/// A durable queue with these arguments, declared through the engine.
async fn queue(conn: &Conn, args: FieldTable) -> (String, Channel) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let name = unique("publishing");
    ch.queue_declare(QueueDeclare {
        queue: name.as_str().into(),
        durable: true,
        arguments: args,
        ..Default::default()
    })
    .await
    .unwrap();
    (name, ch)
}

/// Queue arguments under which a second message is refused (nacked).
fn full_after_one() -> FieldTable {
    [
        ("x-max-length", FieldValue::I32(1)),
        ("x-overflow", FieldValue::from("reject-publish")),
    ]
    .into_iter()
    .collect()
}

async fn delete(ch: &Channel, queue: &str) {
    ch.queue_delete(acemq_codec::QueueDelete {
        queue: queue.into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_13_confirms_are_on_by_default_and_send_returns_once_the_broker_has_the_message() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            assert!(conn.confirms());
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            let publisher = conn.publisher::<Order>("", &q);
            publisher.send(&order(1)).await.unwrap();
            let result = publisher.send_result(&order(2)).await.unwrap();
            assert_eq!(
                result,
                SendResult {
                    confirmed: true,
                    routed: true
                }
            );
            // Confirmed means stored: both are in the queue now, no waiting.
            assert_eq!(depth(&ch, &q).await, 2, "{:?}", b.kind);
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            let props = got.properties.as_ref().unwrap();
            assert_eq!(props.content_type.as_ref().unwrap(), "application/json");
            assert_eq!(props.delivery_mode, Some(2), "persistent by default");
            assert_eq!(serde_json::from_slice::<Order>(&got.body).unwrap(), order(1));
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_13_a_nack_is_an_error() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let args = full_after_one();
            let (q, ch) = queue(&conn, args).await;
            let publisher = conn.publisher::<Order>("", &q);
            publisher.send(&order(1)).await.unwrap();
            let err = publisher.send(&order(2)).await.unwrap_err();
            assert!(matches!(err, Error::Nacked { .. }), "{:?}: {err}", b.kind);
            assert!(err.to_string().contains("refused"), "{err}");
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_13_without_confirms_confirmed_is_false_and_routed_is_always_true() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn_with(Config::default().with_without_confirms(true)).await;
            assert!(!conn.confirms());
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            let result = conn.publisher::<Order>("", &q).send_result(&order(1)).await.unwrap();
            assert_eq!(
                result,
                SendResult {
                    confirmed: false,
                    routed: true
                }
            );
            // Even mandatory and unroutable: only a confirm could rule a return out.
            let nowhere = unique("nowhere");
            let lost = conn.publisher::<Order>("", &nowhere).mandatory();
            assert_eq!(
                lost.send_result(&order(2)).await.unwrap(),
                SendResult {
                    confirmed: false,
                    routed: true
                }
            );
            lost.send(&order(3)).await.unwrap();
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_confirms_off_in_the_url_is_a_connection_without_confirms() {
    acemq_tests::deadline(async {
        let name = unique("confirms-off");
        let conn = Conn::open(&format!("memory://{name}?confirms=off"), Config::default())
            .await
            .unwrap();
        assert!(!conn.confirms());
        let on = Conn::open(&format!("memory://{name}"), Config::default())
            .await
            .unwrap();
        assert!(on.confirms());
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_15_library_publishes_are_confirmed_even_on_a_connection_without_confirms() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn_with(Config::default().with_without_confirms(true)).await;
            let args = full_after_one();
            let (q, ch) = queue(&conn, args).await;
            let props = |id: &str| BasicProperties {
                message_id: Some(id.into()),
                ..Default::default()
            };
            conn.publish_confirmed("", &q, true, props("first"), "1".into())
                .await
                .unwrap();
            assert_eq!(depth(&ch, &q).await, 1, "confirmed means stored");
            // A nack and a return are seen, which only a confirmed channel can do.
            let err = conn
                .publish_confirmed("", &q, true, props("second"), "2".into())
                .await
                .unwrap_err();
            assert!(
                matches!(err, Error::Nacked { ref message_id } if message_id == "second"),
                "{err}"
            );
            let nowhere = unique("nowhere");
            let err = conn
                .publish_confirmed("", &nowhere, true, props("third"), "3".into())
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Unroutable { .. }), "{:?}: {err}", b.kind);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_14_an_unroutable_mandatory_message_is_an_error_naming_id_exchange_key_and_312() {
    acemq_tests::deadline(async {
    for b in brokers().await {
        let conn = b.conn().await;
        let nowhere = unique("nowhere");
        let publisher = conn.publisher::<Order>("", &nowhere).mandatory();
        let err = publisher.send(&order(1)).await.unwrap_err();
        let Error::Unroutable { message_id, code, .. } = &err else {
            panic!("{:?}: {err:?}", b.kind)
        };
        assert_eq!(*code, 312);
        assert_eq!(
            err.to_string(),
            format!("message {message_id} to exchange \"\" with key \"{nowhere}\" reached no queue (312 NO_ROUTE); the broker dropped it")
        );
        assert!(uuid_like(message_id));
        assert_eq!(
            publisher.send_result(&order(2)).await.unwrap(),
            SendResult {
                confirmed: true,
                routed: false
            }
        );
        // Routed mandatory: routed.
        let (q, ch) = queue(&conn, FieldTable::new()).await;
        let routed = conn.publisher::<Order>("", &q).mandatory();
        assert_eq!(
            routed.send_result(&order(3)).await.unwrap(),
            SendResult {
                confirmed: true,
                routed: true
            }
        );
        delete(&ch, &q).await;
        conn.close().await.unwrap();
    }
    })
    .await
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_14_among_many_outstanding_mandatory_publishes_the_error_names_the_unroutable_one() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            let nowhere = unique("nowhere");
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..40u32 {
                let key = if i == 17 { nowhere.clone() } else { q.clone() };
                let publisher = conn.publisher::<Order>("", &key).mandatory();
                tasks.spawn(async move { (i, publisher.send(&order(i)).await) });
            }
            let mut failed = Vec::new();
            while let Some(joined) = tasks.join_next().await {
                let (i, result) = joined.unwrap();
                if let Err(err) = result {
                    assert!(matches!(err, Error::Unroutable { .. }), "{err}");
                    failed.push(i);
                }
            }
            assert_eq!(failed, [17], "{:?}", b.kind);
            assert_eq!(depth(&ch, &q).await, 39);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn begin_send_keeps_a_window_in_flight_from_one_task_and_each_pending_send_gets_its_own_answer() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            let nowhere = unique("nowhere");
            let to_queue = conn.publisher::<Order>("", &q).mandatory();
            let to_nowhere = conn.publisher::<Order>("", &nowhere).mandatory();
            // All 300 are written before the first answer is awaited.
            let mut pending = Vec::new();
            for i in 0..300u32 {
                let publisher = if i == 150 { &to_nowhere } else { &to_queue };
                pending.push((i, publisher.begin_send(&order(i)).await.unwrap()));
            }
            let mut failed = Vec::new();
            for (i, send) in pending {
                let id = send.message_id().to_string();
                if let Err(err) = send.await {
                    let Error::Unroutable { message_id, .. } = &err else {
                        panic!("{:?}: {err}", b.kind)
                    };
                    assert_eq!(*message_id, id);
                    failed.push(i);
                }
            }
            assert_eq!(failed, [150], "{:?}", b.kind);
            // In the order they were begun.
            for i in (0..300u32).filter(|i| *i != 150) {
                let got = ch.basic_get(&q, true).await.unwrap().unwrap();
                assert_eq!(serde_json::from_slice::<Order>(&got.body).unwrap(), order(i));
            }
            // `result()` is `send_result`: unroutable is routed false, not an error.
            let pending = to_nowhere.begin_send(&order(1)).await.unwrap();
            assert_eq!(
                pending.result().await.unwrap(),
                SendResult {
                    confirmed: true,
                    routed: false
                }
            );
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_envelope_round_trips_exactly_with_the_contracts_header_types() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            let mut envelope = Envelope::new()
                .with_correlation_id("corr-7")
                .with_causation_id("cause-3");
            envelope.attempt = 4;
            envelope.headers.insert("tenant", FieldValue::from("acme"));
            conn.publisher::<Order>("", &q)
                .send_envelope(envelope.clone(), &order(1))
                .await
                .unwrap();
            let got = ch.basic_get(&q, true).await.unwrap().unwrap();
            let props = got.properties.as_ref().unwrap();
            // The raw types on the wire, as `docs/wire-contract.md` fixes them.
            let headers = props.headers.as_ref().unwrap();
            assert_eq!(headers.get(ATTEMPT_HEADER).map(FieldValue::type_code), Some(b'I'));
            assert_eq!(headers.get(FIRST_SEEN_HEADER).map(FieldValue::type_code), Some(b'T'));
            assert_eq!(headers.get(CAUSATION_HEADER).map(FieldValue::type_code), Some(b'S'));
            assert_eq!(props.message_id.as_ref().unwrap(), envelope.id.as_str());
            assert_eq!(props.correlation_id.as_ref().unwrap(), "corr-7");
            // And read back exactly.
            assert_eq!(Envelope::read_from(props), envelope, "{:?}", b.kind);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_publish_reports_the_brokers_code_and_the_next_send_works() {
    acemq_tests::deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let missing = unique("no-such-exchange");
            let err = conn
                .publisher::<Order>(&missing, "k")
                .send(&order(1))
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Refused { code: 404, .. }), "{:?}: {err}", b.kind);
            // The publishing channel was closed by the refusal; it is reopened.
            let (q, ch) = queue(&conn, FieldTable::new()).await;
            conn.publisher::<Order>("", &q).send(&order(2)).await.unwrap();
            assert_eq!(depth(&ch, &q).await, 1);
            delete(&ch, &q).await;
            conn.close().await.unwrap();
        }
    })
    .await
}

#[test]
fn publish_outcomes_are_counted() {
    acemq_tests::deadline_blocking(|| {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(acemq_tests::deadline(async {
                for b in brokers().await {
                    let conn = b.conn().await;
                    let args = full_after_one();
                    let (q, ch) = queue(&conn, args).await;
                    let publisher = conn.publisher::<Order>("", &q);
                    publisher.send(&order(1)).await.unwrap();
                    publisher.send(&order(2)).await.unwrap_err();
                    let nowhere = unique("nowhere");
                    conn.publisher::<Order>("", &nowhere)
                        .mandatory()
                        .send(&order(3))
                        .await
                        .unwrap_err();
                    delete(&ch, &q).await;
                    conn.close().await.unwrap();
                }
            }))
        });
        let counts = counts_by_outcome(&snapshotter, acemq_core::metrics_names::PUBLISH_TOTAL);
        let count = |outcome: &str| counts.get(outcome).copied().unwrap_or(0);
        let brokers = count("confirmed");
        assert!(brokers >= 1, "{counts:?}");
        assert_eq!(count("nacked"), brokers, "{counts:?}");
        assert_eq!(count("unroutable"), brokers, "{counts:?}");
    })
}
