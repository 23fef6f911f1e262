//! `Topology` with arguments, on every broker: headers-exchange bindings
//! (`x-match` all and any) route as RabbitMQ routes them, an alternate
//! exchange catches what its exchange cannot route, an exchange-to-exchange
//! binding carries its arguments, and a recovery declares all of it again,
//! arguments included, after it was deleted behind the service's back. The
//! typed queue and consumer options (`QueueOptions`, `ConsumerBuilder::
//! priority`) declare exactly what the raw arguments do, and what RabbitMQ
//! refuses is refused before asking it, with the broker's own refusal of
//! the raw argument as the check.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{BasicProperties, ExchangeDelete, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::amqp::{Confirmation, Connection};
use acemq_core::topology::{ExchangeOptions, HeadersMatch, QueueOptions};
use acemq_core::{consume, Ack, Config, Error, Message, RecoveryEvent, Topology};
use acemq_tests::{brokers, deadline, step, unique, Broker};
use tokio::time::Instant;

fn table(pairs: &[(&str, FieldValue)]) -> FieldTable {
    let mut t = FieldTable::new();
    for (key, value) in pairs {
        t.insert(*key, value.clone());
    }
    t
}

/// The names one scenario declares.
struct Names {
    headers: String,
    main: String,
    alternate: String,
    all: String,
    any: String,
    keyed: String,
    caught: String,
}

impl Names {
    fn new(prefix: &str) -> Names {
        let n = |what: &str| unique(&format!("{prefix}.{what}"));
        Names {
            headers: n("headers"),
            main: n("main"),
            alternate: n("alternate"),
            all: n("all"),
            any: n("any"),
            keyed: n("keyed"),
            caught: n("caught"),
        }
    }

    /// A headers exchange with an `all` and an `any` binding; a direct
    /// exchange with an alternate (fanout) one, bound from the headers
    /// exchange when `route=main`.
    fn topology(&self) -> Topology {
        let wanted = table(&[("format", "pdf".into()), ("type", "report".into())]);
        Topology::new()
            .exchange(&self.headers, "headers")
            .exchange(&self.alternate, "fanout")
            .exchange_with(
                &self.main,
                "direct",
                ExchangeOptions::new().alternate_exchange(&self.alternate),
            )
            .queue_with(&self.all, QueueOptions::classic())
            .queue_with(&self.any, QueueOptions::classic())
            .queue_with(&self.keyed, QueueOptions::classic())
            .queue_with(&self.caught, QueueOptions::classic())
            .bind_headers(&self.all, &self.headers, HeadersMatch::All, wanted.clone())
            .bind_headers(&self.any, &self.headers, HeadersMatch::Any, wanted)
            .bind(&self.keyed, &self.main, "k")
            .bind(&self.caught, &self.alternate, "")
            .bind_exchange_with(
                &self.main,
                &self.headers,
                "",
                HeadersMatch::Any.binding_arguments(table(&[("route", "main".into())])),
            )
    }

    fn queues(&self) -> [&String; 4] {
        [&self.all, &self.any, &self.keyed, &self.caught]
    }

    fn exchanges(&self) -> [&String; 3] {
        [&self.headers, &self.main, &self.alternate]
    }
}

/// Publishes `body` with `headers` to `exchange` under `key`, mandatory,
/// and says whether the broker routed it.
async fn publish(conn: &Connection, exchange: &str, key: &str, headers: &[(&str, FieldValue)], body: &str) -> bool {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let properties = BasicProperties {
        headers: Some(table(headers)),
        ..Default::default()
    };
    let confirm = ch
        .publish(exchange, key, true, properties, body.as_bytes())
        .await
        .unwrap();
    let routed = match step("the confirm", confirm).await.unwrap() {
        Confirmation::Ack => true,
        Confirmation::Returned(_) => false,
        other => panic!("{other:?}"),
    };
    let _ = ch.close().await;
    routed
}

/// Every body waiting in `queue`, in order (taken).
async fn drain(conn: &Connection, queue: &str) -> Vec<String> {
    let ch = conn.channel().await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = ch.basic_get(queue, true).await.unwrap() {
        out.push(String::from_utf8_lossy(&m.body).into_owned());
    }
    let _ = ch.close().await;
    out
}

/// Publishes the cases and checks where each one went.
async fn check_routing(b: &Broker, names: &Names) {
    let kind = b.kind;
    let conn = b.connect().await;
    let pdf_report = [
        ("format", FieldValue::from("pdf")),
        ("type", FieldValue::from("report")),
    ];
    assert!(publish(&conn, &names.headers, "", &pdf_report, "both").await);
    assert!(publish(&conn, &names.headers, "", &[("format", "pdf".into())], "one").await);
    // A header of the same value but another type does not match.
    assert!(
        !publish(
            &conn,
            &names.headers,
            "",
            &[("format", FieldValue::I32(1)), ("type", FieldValue::I32(2))],
            "typed"
        )
        .await
    );
    assert!(!publish(&conn, &names.headers, "", &[("format", "zip".into())], "none").await);
    // Extra headers do not stop an `all` match.
    let mut extra = pdf_report.to_vec();
    extra.push(("x-other", FieldValue::from("x")));
    extra.push(("size", FieldValue::I64(10)));
    assert!(publish(&conn, &names.headers, "", &extra, "extra").await);
    // Through the exchange-to-exchange binding, then by key or to the
    // alternate.
    assert!(publish(&conn, &names.headers, "k", &[("route", "main".into())], "via-keyed").await);
    assert!(
        publish(
            &conn,
            &names.headers,
            "nowhere",
            &[("route", "main".into())],
            "via-caught"
        )
        .await
    );
    assert!(publish(&conn, &names.main, "k", &[], "keyed").await);
    // Mandatory, unroutable by `main`: the alternate takes it, no return.
    assert!(publish(&conn, &names.main, "other", &[], "caught").await);
    assert_eq!(
        drain(&conn, &names.all).await,
        ["both", "extra"],
        "{kind:?}: x-match all"
    );
    assert_eq!(
        drain(&conn, &names.any).await,
        ["both", "one", "extra"],
        "{kind:?}: x-match any"
    );
    assert_eq!(drain(&conn, &names.keyed).await, ["via-keyed", "keyed"], "{kind:?}");
    assert_eq!(
        drain(&conn, &names.caught).await,
        ["via-caught", "caught"],
        "{kind:?}: the alternate"
    );
    conn.close().await.unwrap();
}

async fn delete_all(b: &Broker, names: &Names) {
    let conn = b.connect().await;
    for q in names.queues() {
        let ch = conn.channel().await.unwrap();
        let _ = ch
            .queue_delete(QueueDelete {
                queue: q.as_str().into(),
                ..Default::default()
            })
            .await;
    }
    for x in names.exchanges() {
        let ch = conn.channel().await.unwrap();
        let _ = ch
            .exchange_delete(ExchangeDelete {
                exchange: x.as_str().into(),
                ..Default::default()
            })
            .await;
    }
    conn.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_bindings_and_an_alternate_exchange_route_as_rabbitmq_routes_them() {
    deadline(async {
        for b in brokers().await {
            let conn = b.conn().await;
            let names = Names::new("args.routing");
            names.topology().declare(&conn).await.unwrap();
            check_routing(&b, &names).await;
            conn.close().await.unwrap();
            delete_all(&b, &names).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_declares_exchanges_and_bindings_again_with_their_arguments_after_they_were_deleted() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = Arc::new(Mutex::new(Vec::<RecoveryEvent>::new()));
            let seen = events.clone();
            let name = unique("args.recovery");
            let mut config = Config::default()
                .with_on_recovery(move |e| seen.lock().unwrap().push(e))
                .with_recovery_delay(Duration::from_millis(50))
                .with_recovery_delay_max(Duration::from_millis(400));
            config.engine.connection_name = Some(name.clone());
            let conn = b.conn_with(config).await;
            let names = Names::new("args.recovery");
            names.topology().declare(&conn).await.unwrap();
            // Gone behind the service's back, then the connection too.
            delete_all(&b, &names).await;
            b.force_close(&format!("{name}-consume"));
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                let recovered = events.lock().unwrap().iter().find_map(|e| match e {
                    RecoveryEvent::Recovered {
                        which: "consume",
                        failed,
                        ..
                    } => Some(failed.clone()),
                    _ => None,
                });
                if let Some(failed) = recovered {
                    assert!(failed.is_empty(), "{kind:?}: {failed:?}");
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "{kind:?}: no recovery: {:?}",
                    events.lock().unwrap()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            check_routing(&b, &names).await;
            // Declared again with the same arguments: equivalent, no 406.
            let other = b.connect().await;
            let ch = other.channel().await.unwrap();
            ch.exchange_declare(acemq_codec::ExchangeDeclare {
                exchange: names.main.as_str().into(),
                kind: "direct".into(),
                durable: true,
                arguments: table(&[("alternate-exchange", names.alternate.as_str().into())]),
                ..Default::default()
            })
            .await
            .unwrap();
            other.close().await.unwrap();
            conn.close().await.unwrap();
            delete_all(&b, &names).await;
        }
    })
    .await;
}

/// A raw `queue.declare` of `queue` with `arguments`: the broker's reply code
/// (0: declared).
async fn raw_declare(conn: &Connection, queue: &str, arguments: FieldTable) -> u16 {
    let ch = conn.channel().await.unwrap();
    let outcome = ch
        .queue_declare(QueueDeclare {
            queue: queue.into(),
            durable: true,
            arguments,
            ..Default::default()
        })
        .await;
    match outcome {
        Ok(_) => {
            let _ = ch.close().await;
            0
        }
        Err(err) => err.reply_code().unwrap_or(1),
    }
}

async fn delete_queue(conn: &Connection, queue: &str) {
    let ch = conn.channel().await.unwrap();
    let _ = ch
        .queue_delete(QueueDelete {
            queue: queue.into(),
            ..Default::default()
        })
        .await;
    let _ = ch.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn typed_queue_options_declare_the_raw_arguments_and_refuse_what_rabbitmq_refuses() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let raw = b.connect().await;

            // Declared typed, then raw with the arguments a service in
            // another language would write: equivalent.
            let sac = unique("args.sac");
            let prio = unique("args.prio");
            Topology::new()
                .queue_with(&sac, QueueOptions::quorum().single_active_consumer())
                .queue_with(&prio, QueueOptions::classic().max_priority(9))
                .declare(&conn)
                .await
                .unwrap();
            let quorum_sac = table(&[
                ("x-queue-type", "quorum".into()),
                ("x-single-active-consumer", true.into()),
            ]);
            assert_eq!(raw_declare(&raw, &sac, quorum_sac).await, 0, "{kind:?}");
            let classic_prio = table(&[
                ("x-queue-type", "classic".into()),
                ("x-max-priority", FieldValue::U8(9)),
            ]);
            assert_eq!(raw_declare(&raw, &prio, classic_prio).await, 0, "{kind:?}");
            let other_prio = table(&[
                ("x-queue-type", "classic".into()),
                ("x-max-priority", FieldValue::I32(10)),
            ]);
            assert_eq!(
                raw_declare(&raw, &prio, other_prio).await,
                406,
                "{kind:?}: a different max"
            );

            // Refused before asking, and the broker refuses the raw
            // equivalent: same verdict on every broker.
            let refused: Vec<(Topology, FieldTable)> = vec![
                (
                    Topology::new().queue_with("q", QueueOptions::quorum().max_priority(5)),
                    table(&[
                        ("x-queue-type", "quorum".into()),
                        ("x-max-priority", FieldValue::I32(5)),
                    ]),
                ),
                (
                    Topology::new().queue_with("q", QueueOptions::stream().max_priority(5)),
                    table(&[
                        ("x-queue-type", "stream".into()),
                        ("x-max-priority", FieldValue::I32(5)),
                    ]),
                ),
                (
                    Topology::new().queue_with("q", QueueOptions::stream().single_active_consumer()),
                    table(&[
                        ("x-queue-type", "stream".into()),
                        ("x-single-active-consumer", true.into()),
                    ]),
                ),
                (
                    Topology::new()
                        .queue_with("q", QueueOptions::stream())
                        .dead_letters("q"),
                    table(&[
                        ("x-queue-type", "stream".into()),
                        ("x-dead-letter-exchange", "acemq.dlx".into()),
                    ]),
                ),
            ];
            for (topology, arguments) in refused {
                let err = topology.declarations().unwrap_err();
                assert!(matches!(err, Error::Config(_)), "{kind:?}: {err}");
                let q = unique("args.refused");
                assert_eq!(
                    raw_declare(&raw, &q, arguments.clone()).await,
                    406,
                    "{kind:?}: {arguments:?} ({err})"
                );
            }
            // A priority above 255 cannot be written typed (`u8`); raw, the
            // broker refuses it.
            let q = unique("args.refused");
            let over = table(&[
                ("x-queue-type", "classic".into()),
                ("x-max-priority", FieldValue::I32(256)),
            ]);
            assert_eq!(raw_declare(&raw, &q, over).await, 406, "{kind:?}");
            let err = Topology::new()
                .queue_with(
                    &q,
                    QueueOptions::classic().argument("x-max-priority", FieldValue::I32(256)),
                )
                .declare(&conn)
                .await
                .unwrap_err();
            assert_eq!(
                err.refusal().map(|r| r.code),
                Some(406),
                "{kind:?}: the broker refusal, as it is: {err}"
            );

            delete_queue(&raw, &sac).await;
            delete_queue(&raw, &prio).await;
            raw.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_of_higher_priority_gets_the_messages_while_it_has_room() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("args.consumer-priority");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let got = Arc::new(Mutex::new(Vec::<(&'static str, u32)>::new()));
            let handler = |who: &'static str| {
                let got = got.clone();
                move |m: Message<u32>| {
                    let got = got.clone();
                    async move {
                        got.lock().unwrap().push((who, m.payload));
                        Ack::accept()
                    }
                }
            };
            let low = consume(&conn, &queue, handler("low")).prefetch(10).await.unwrap();
            let high = consume(&conn, &queue, handler("high"))
                .priority(10)
                .prefetch(10)
                .await
                .unwrap();
            let publisher = conn.publisher::<u32>("", &queue).mandatory();
            for n in 0..6 {
                publisher.send(&n).await.unwrap();
            }
            let until = Instant::now() + Duration::from_secs(20);
            while got.lock().unwrap().len() < 6 {
                assert!(Instant::now() < until, "{kind:?}: {:?}", got.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let all = got.lock().unwrap().clone();
            assert!(all.iter().all(|(who, _)| *who == "high"), "{kind:?}: {all:?}");
            low.close().await.unwrap();
            high.close().await.unwrap();
            conn.close().await.unwrap();
            let raw = b.connect().await;
            for q in [queue.clone(), format!("{queue}.dlq"), format!("{queue}.parked")] {
                delete_queue(&raw, &q).await;
            }
            raw.close().await.unwrap();
        }
    })
    .await;
}
