//! The hops the library publishes for a handler: `Ack::then` and `Pipeline`
//! (statement 24 of `docs/statements.md`) and routing slips (statement 25), on both
//! brokers. Every test holds `chaos::serial`: two of them break the broker.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{FieldValue, QueueDeclare};
use acemq_core::envelope::{hop_id, ERROR_HEADER};
use acemq_core::pipeline::{Pipeline, RoutingSlip, ROUTING_SLIP_HEADER, ROUTING_SLIP_STEP_HEADER};
use acemq_core::{consume, fatal, Ack, Config, Conn, Envelope, Message, ReplayOptions, RetryPolicy, Topology};
use acemq_tests::{brokers, chaos, deadline, depth, unique, Broker};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Priced {
    id: u32,
    cents: u64,
}

#[derive(Debug)]
struct Boom(&'static str);

impl std::fmt::Display for Boom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Boom {}

type Seen<T> = Arc<Mutex<Vec<Message<T>>>>;

/// A consumer of `queue` that records and accepts.
async fn recorder<T>(conn: &Conn, queue: &str) -> (acemq_core::Consumer, Seen<T>)
where
    T: serde::de::DeserializeOwned + Send + Sync + Clone + 'static,
{
    Topology::new()
        .queue(queue)
        .dead_letters(queue)
        .declare(conn)
        .await
        .unwrap();
    let seen: Seen<T> = Arc::default();
    let record = seen.clone();
    let consumer = consume(conn, queue, move |m: Message<T>| {
        record.lock().unwrap().push(m);
        std::future::ready(Ack::accept())
    })
    .await
    .unwrap();
    (consumer, seen)
}

async fn wait_for<T: Clone>(seen: &Seen<T>, n: usize, what: &str) -> Vec<Message<T>> {
    let _label = acemq_tests::waiting_for(what.to_string());
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = seen.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        assert!(Instant::now() < until, "{what}: {} of {n}", now.len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_depth(conn: &Conn, queue: &str, n: u32) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = depth(&ch, queue).await;
        if now == n {
            return;
        }
        assert!(Instant::now() < until, "{queue} holds {now}, not {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn exists(conn: &Conn, queue: &str) -> bool {
    let ch = conn.consuming_connection().channel().await.unwrap();
    ch.queue_declare(QueueDeclare {
        queue: queue.into(),
        passive: true,
        ..Default::default()
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_24_then_publishes_the_output_confirmed_with_a_derived_id_causation_and_correlation() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let (input, output) = (unique("then.in"), unique("then.out"));
            let (downstream, priced) = recorder::<Priced>(&conn, &output).await;
            Topology::new()
                .queue(&input)
                .dead_letters(&input)
                .declare(&conn)
                .await
                .unwrap();
            let to = conn.publisher::<Priced>("", &output);
            let upstream = consume(&conn, &input, |m: Message<Order>| async move {
                Ack::then(&Priced {
                    id: m.payload.id,
                    cents: 1250,
                })
            })
            .then(&to)
            .await
            .unwrap();
            let envelope = Envelope::new().with_correlation_id("order-flow-1");
            let input_id = envelope.id.clone();
            conn.publisher::<Order>("", &input)
                .send_envelope(envelope, &Order { id: 4 })
                .await
                .unwrap();
            let got = wait_for(&priced, 1, "the output").await;
            let out = &got[0];
            assert_eq!(out.payload, Priced { id: 4, cents: 1250 });
            assert_eq!(
                out.envelope.id,
                hop_id(&input_id, &format!("then:/{output}")),
                "{:?}",
                b.kind
            );
            assert_eq!(
                out.envelope.causation_id.as_deref(),
                Some(input_id.as_str()),
                "{:?}",
                b.kind
            );
            assert_eq!(
                out.envelope.correlation_id.as_deref(),
                Some("order-flow-1"),
                "{:?}",
                b.kind
            );
            assert_eq!(out.envelope.attempt, 1, "{:?}", b.kind);
            // The input was acked once the output was confirmed.
            wait_depth(&conn, &input, 0).await;
            upstream.close().await.unwrap();
            downstream.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_24_a_redelivered_input_yields_the_same_output_id_and_a_deduping_handler_sees_one() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await.into_iter().filter(|b| !b.kind.is_tls()) {
            let config = Config::default()
                .with_recovery_delay(Duration::from_millis(50))
                .with_recovery_delay_max(Duration::from_millis(400));
            let conn = b.conn_with(config).await;
            let (input, output) = (unique("then.redo.in"), unique("then.redo.out"));
            // Downstream dedupes on Envelope.id.
            Topology::new()
                .queue(&output)
                .dead_letters(&output)
                .declare(&conn)
                .await
                .unwrap();
            let unique_ids: Arc<Mutex<BTreeSet<String>>> = Arc::default();
            let deliveries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let downstream = consume(&conn, &output, {
                let (unique_ids, deliveries) = (unique_ids.clone(), deliveries.clone());
                move |m: Message<Order>| {
                    deliveries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    unique_ids.lock().unwrap().insert(m.envelope.id);
                    std::future::ready(Ack::accept())
                }
            })
            .await
            .unwrap();
            Topology::new()
                .queue(&input)
                .dead_letters(&input)
                .declare(&conn)
                .await
                .unwrap();
            let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let upstream = consume(&conn, &input, {
                let (calls, b, conn) = (calls.clone(), b.clone(), conn.clone());
                move |m: Message<Order>| {
                    let (calls, b, conn) = (calls.clone(), b.clone(), conn.clone());
                    async move {
                        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                            // The connections die before this input's ack:
                            // the broker will deliver it again.
                            let consuming = conn.consuming_connection();
                            force_close_all(&b).await;
                            let _ = tokio::time::timeout(Duration::from_secs(20), consuming.closed()).await;
                        }
                        Ack::then(&m.payload)
                    }
                }
            })
            .then(&conn.publisher::<Order>("", &output))
            .await
            .unwrap();
            conn.publisher::<Order>("", &input)
                .send(&Order { id: 1 })
                .await
                .unwrap();
            let until = Instant::now() + Duration::from_secs(30);
            while deliveries.load(std::sync::atomic::Ordering::SeqCst) < 2 {
                assert!(Instant::now() < until, "{:?}: two outputs", b.kind);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                calls.load(std::sync::atomic::Ordering::SeqCst) >= 2,
                "{:?}: redelivered",
                b.kind
            );
            assert_eq!(unique_ids.lock().unwrap().len(), 1, "{:?}: one output id", b.kind);
            upstream.close().await.unwrap();
            downstream.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

async fn force_close_all(b: &Broker) {
    match &b.memory {
        Some(memory) => memory.faults().close_all("the acemq hops suite"),
        None => chaos::close_all_connections(b.rabbit(), "the acemq hops suite").await,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_24_an_unroutable_output_retries_the_input_and_dead_letters_it_when_the_attempts_are_gone() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let input = unique("then.nowhere");
            Topology::new()
                .queue(&input)
                .dead_letters(&input)
                .declare(&conn)
                .await
                .unwrap();
            let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let nowhere = conn.publisher::<Order>("", &unique("no-such-queue"));
            let upstream = consume(&conn, &input, {
                let calls = calls.clone();
                move |m: Message<Order>| {
                    calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::future::ready(Ack::then(&m.payload))
                }
            })
            .then(&nowhere)
            .retry_with(RetryPolicy::fixed(3, Duration::ZERO))
            .await
            .unwrap();
            conn.publisher::<Order>("", &input)
                .send(&Order { id: 2 })
                .await
                .unwrap();
            let dlq = format!("{input}.dlq");
            wait_depth(&conn, &dlq, 1).await;
            assert_eq!(
                calls.load(std::sync::atomic::Ordering::SeqCst),
                3,
                "{:?}: three attempts",
                b.kind
            );
            let ch = conn.consuming_connection().channel().await.unwrap();
            let dead = ch.basic_get(&dlq, true).await.unwrap().unwrap();
            let error = dead
                .properties
                .as_ref()
                .unwrap()
                .headers
                .as_ref()
                .unwrap()
                .get(ERROR_HEADER)
                .cloned();
            let error = error.and_then(|e| e.as_str().map(str::to_string)).unwrap_or_default();
            assert!(
                error.contains("312") || error.contains("NO_ROUTE"),
                "{:?}: {error}",
                b.kind
            );
            upstream.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_24_a_pipeline_of_three_stages_runs_each_with_its_dead_letters_and_rungs() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let names = [unique("pipe.parse"), unique("pipe.price"), unique("pipe.ship")];
            let shipped: Seen<Priced> = Arc::default();
            let policy = RetryPolicy::exponential(3, Duration::from_secs(40), Duration::ZERO);
            let running = Pipeline::new(&conn)
                .retry_with(policy.clone())
                .stage(&names[0], |m: Message<String>| async move {
                    Ack::then(&Order {
                        id: m.payload.parse().unwrap_or(0),
                    })
                })
                .stage(&names[1], |m: Message<Order>| async move {
                    Ack::then(&Priced {
                        id: m.payload.id,
                        cents: u64::from(m.payload.id) * 100,
                    })
                })
                .stage(&names[2], {
                    let shipped = shipped.clone();
                    move |m: Message<Priced>| {
                        shipped.lock().unwrap().push(m);
                        std::future::ready(Ack::accept())
                    }
                })
                .start()
                .await
                .unwrap();
            assert_eq!(running.stages(), &names);
            conn.publisher::<String>("", running.input())
                .send(&"12".to_string())
                .await
                .unwrap();
            let got = wait_for(&shipped, 1, "the pipeline's end").await;
            assert_eq!(got[0].payload, Priced { id: 12, cents: 1200 }, "{:?}", b.kind);
            for name in &names {
                for queue in [
                    format!("{name}.dlq"),
                    format!("{name}.parked"),
                    format!("{name}.retry.40s"),
                    format!("{name}.retry.80s"),
                ] {
                    assert!(exists(&conn, &queue).await, "{:?}: {queue}", b.kind);
                }
            }
            running.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_24_a_fatal_error_at_stage_2_dead_letters_into_stage_2s_dlq() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let names = [unique("pipe2.a"), unique("pipe2.b"), unique("pipe2.c")];
            let running = Pipeline::new(&conn)
                .stage(&names[0], |m: Message<Order>| async move { Ack::then(&m.payload) })
                .stage(&names[1], |_m: Message<Order>| async move {
                    Ack::retry(fatal(Boom("no price list")))
                })
                .stage(&names[2], |_m: Message<Order>| async move { Ack::accept() })
                .start()
                .await
                .unwrap();
            conn.publisher::<Order>("", running.input())
                .send(&Order { id: 3 })
                .await
                .unwrap();
            wait_depth(&conn, &format!("{}.dlq", names[1]), 1).await;
            for (i, name) in names.iter().enumerate() {
                if i != 1 {
                    assert_eq!(
                        depth(
                            &conn.consuming_connection().channel().await.unwrap(),
                            &format!("{name}.dlq")
                        )
                        .await,
                        0
                    );
                }
            }
            running.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

/// A step of a slip: its queue, whose consumer records the step and
/// accepts (or, while `failing`, dead-letters at once).
struct Step {
    queue: String,
    failing: Arc<std::sync::atomic::AtomicBool>,
    consumer: Option<acemq_core::Consumer>,
}

async fn step(conn: &Conn, queue: &str, log: &Arc<Mutex<Vec<String>>>, start: bool) -> Step {
    Topology::new()
        .queue(queue)
        .dead_letters(queue)
        .declare(conn)
        .await
        .unwrap();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut s = Step {
        queue: queue.to_string(),
        failing,
        consumer: None,
    };
    if start {
        s.start(conn, log).await;
    }
    s
}

impl Step {
    async fn start(&mut self, conn: &Conn, log: &Arc<Mutex<Vec<String>>>) {
        let (failing, log, name) = (self.failing.clone(), log.clone(), self.queue.clone());
        self.consumer = Some(
            consume(conn, &self.queue, move |m: Message<Order>| {
                let verdict = if failing.load(std::sync::atomic::Ordering::SeqCst) {
                    Ack::retry(fatal(Boom("the step is broken")))
                } else {
                    log.lock().unwrap().push(format!("{name}:{}", m.payload.id));
                    Ack::accept()
                };
                std::future::ready(verdict)
            })
            // The test's own queues: every step and completion of its slips.
            .routing_slips(|exchange: &str, key: &str| exchange.is_empty() && key.starts_with("acemq-test."))
            .await
            .unwrap(),
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_25_a_routing_slip_runs_every_step_in_order_and_reaches_completion() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let log: Arc<Mutex<Vec<String>>> = Arc::default();
            let mut steps = Vec::new();
            for name in ["slip.a", "slip.b", "slip.c"] {
                steps.push(step(&conn, &unique(name), &log, true).await);
            }
            let done = unique("slip.done");
            let (completion, completed) = recorder::<Order>(&conn, &done).await;
            let mut slip = RoutingSlip::new();
            for s in &steps {
                slip = slip.to_queue(&s.queue);
            }
            let slip = slip.completion("", &done);
            slip.send(&conn, Envelope::new(), &Order { id: 5 }).await.unwrap();
            let got = wait_for(&completed, 1, "completion").await;
            let want: Vec<String> = steps.iter().map(|s| format!("{}:5", s.queue)).collect();
            assert_eq!(*log.lock().unwrap(), want, "{:?}: every step, in order", b.kind);
            let headers = &got[0].envelope.headers;
            assert!(headers.contains_key(ROUTING_SLIP_HEADER), "{:?}", b.kind);
            assert_eq!(
                headers.get(ROUTING_SLIP_STEP_HEADER),
                Some(&FieldValue::I32(3)),
                "{:?}",
                b.kind
            );
            for s in steps {
                s.consumer.unwrap().close().await.unwrap();
            }
            completion.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_25_a_message_dead_lettered_mid_slip_keeps_its_slip_and_a_replay_resumes_it_at_that_step() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let log: Arc<Mutex<Vec<String>>> = Arc::default();
            let mut steps = Vec::new();
            for name in ["slipr.a", "slipr.b", "slipr.c"] {
                steps.push(step(&conn, &unique(name), &log, true).await);
            }
            steps[1].failing.store(true, std::sync::atomic::Ordering::SeqCst);
            let done = unique("slipr.done");
            let (completion, completed) = recorder::<Order>(&conn, &done).await;
            let slip = steps
                .iter()
                .fold(RoutingSlip::new(), |slip, s| slip.to_queue(&s.queue))
                .completion("", &done);
            slip.send(&conn, Envelope::new(), &Order { id: 6 }).await.unwrap();
            let dlq = format!("{}.dlq", steps[1].queue);
            wait_depth(&conn, &dlq, 1).await;
            let parked = conn.peek(&dlq, 1).await.unwrap();
            let headers = &parked[0].envelope.headers;
            assert!(
                headers.contains_key(ROUTING_SLIP_HEADER),
                "{:?}: the slip stays",
                b.kind
            );
            assert_eq!(
                headers.get(ROUTING_SLIP_STEP_HEADER),
                Some(&FieldValue::I32(1)),
                "{:?}",
                b.kind
            );
            // Fixed, and replayed: it resumes at step 2 and completes.
            steps[1].failing.store(false, std::sync::atomic::Ordering::SeqCst);
            let report = conn.replay(&dlq, ReplayOptions::default()).await.unwrap();
            assert_eq!(report.replayed, 1, "{:?}: {report:?}", b.kind);
            wait_for(&completed, 1, "completion after the replay").await;
            let want: Vec<String> = vec![format!("{}:6", steps[1].queue), format!("{}:6", steps[2].queue)];
            assert_eq!(log.lock().unwrap()[1..], want, "{:?}", b.kind);
            for s in steps {
                s.consumer.unwrap().close().await.unwrap();
            }
            completion.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn statement_25_a_slip_survives_a_broker_restart_while_its_message_is_between_steps() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await.into_iter().filter(|b| !b.kind.is_tls()) {
            let config = Config::default()
                .with_recovery_delay(Duration::from_millis(100))
                .with_recovery_delay_max(Duration::from_secs(1));
            let conn = b.conn_with(config).await;
            let log: Arc<Mutex<Vec<String>>> = Arc::default();
            let mut first = step(&conn, &unique("slipk.a"), &log, true).await;
            // The second step's consumer is not running: the message waits in its queue.
            let mut second = step(&conn, &unique("slipk.b"), &log, false).await;
            let done = unique("slipk.done");
            Topology::new()
                .queue(&done)
                .dead_letters(&done)
                .declare(&conn)
                .await
                .unwrap();
            let slip = RoutingSlip::new()
                .to_queue(&first.queue)
                .to_queue(&second.queue)
                .completion("", &done);
            slip.send(&conn, Envelope::new(), &Order { id: 8 }).await.unwrap();
            wait_depth(&conn, &second.queue, 1).await;
            match &b.memory {
                Some(memory) => memory.faults().restart(),
                None => {
                    // Quorum queues killed within a second of their
                    // declaration can come back without a leader for a
                    // minute (see statement 17's restart test): let them settle.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    chaos::kill(b.rabbit()).await;
                    chaos::restart(b.rabbit()).await;
                }
            }
            second.start(&conn, &log).await;
            let (completion, completed) = recorder::<Order>(&conn, &done).await;
            let got = wait_for(&completed, 1, "completion after the restart").await;
            assert_eq!(got[0].payload, Order { id: 8 }, "{:?}", b.kind);
            first.consumer.take().unwrap().close().await.unwrap();
            second.consumer.take().unwrap().close().await.unwrap();
            completion.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

/// Publishes `Order { id }` straight into `queue` with a slip written by
/// the producer itself: step 0 is `queue`, step 1 `next`.
async fn publish_with_forged_slip(conn: &Conn, queue: &str, next: &str, id: u32) {
    let slip = RoutingSlip::new().to_queue(queue).to_queue(next);
    let mut headers = acemq_codec::FieldTable::new();
    let mut steps = Vec::new();
    for key in [queue, next] {
        let mut step = acemq_codec::FieldTable::new();
        step.push("exchange", FieldValue::from(""));
        step.push("routing-key", FieldValue::from(key));
        steps.push(FieldValue::Table(step));
    }
    assert_eq!(slip.len(), steps.len());
    headers.insert(ROUTING_SLIP_HEADER, FieldValue::Array(acemq_codec::FieldArray(steps)));
    headers.insert(ROUTING_SLIP_STEP_HEADER, FieldValue::I32(0));
    let ch = conn.publishing_connection().channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let props = acemq_codec::BasicProperties {
        message_id: Some(format!("forged-{id}").as_str().into()),
        headers: Some(headers),
        ..Default::default()
    };
    let body = serde_json::to_vec(&Order { id }).unwrap();
    ch.publish("", queue, true, props, body).await.unwrap().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slip_a_producer_wrote_is_not_followed_by_a_consumer_that_did_not_opt_in() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let (consumer, seen) = recorder::<Order>(&conn, &unique("noslip")).await;
            let target = unique("noslip.target");
            Topology::new().queue(&target).declare(&conn).await.unwrap();
            publish_with_forged_slip(&conn, consumer.queue(), &target, 11).await;
            let got = wait_for(&seen, 1, "the message, handled").await;
            assert_eq!(got[0].payload, Order { id: 11 });
            // Handled and acked as an ordinary message; the slip is left in
            // its headers, not followed.
            assert!(
                got[0].envelope.headers.contains_key(ROUTING_SLIP_HEADER),
                "{:?}",
                b.kind
            );
            wait_depth(&conn, consumer.queue(), 0).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let ch = conn.consuming_connection().channel().await.unwrap();
            assert_eq!(depth(&ch, &target).await, 0, "{:?}: nothing was forwarded", b.kind);
            assert_eq!(
                depth(&ch, &format!("{}.dlq", consumer.queue())).await,
                0,
                "{:?}",
                b.kind
            );
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slip_step_outside_the_allow_list_is_refused_and_set_aside_with_the_reason() {
    deadline(async {
        let _serial = chaos::serial().await;
        for b in brokers().await {
            let conn = b.conn().await;
            let queue = unique("allow");
            let (allowed, forbidden) = (unique("allow.ok"), unique("allow.no"));
            for q in [&queue, &allowed, &forbidden] {
                Topology::new().queue(q).dead_letters(q).declare(&conn).await.unwrap();
            }
            let consumer = consume(&conn, &queue, |_: Message<Order>| async { Ack::accept() })
                .routing_slips(acemq_core::pipeline::SlipAllowList::new().queue(&allowed))
                .await
                .unwrap();
            // A step it allows is followed...
            publish_with_forged_slip(&conn, &queue, &allowed, 1).await;
            wait_depth(&conn, &allowed, 1).await;
            // ...one it does not is a fatal error of that message.
            publish_with_forged_slip(&conn, &queue, &forbidden, 2).await;
            let dlq = format!("{queue}.dlq");
            wait_depth(&conn, &dlq, 1).await;
            let dead = conn.peek(&dlq, 1).await.unwrap();
            let error = dead[0].error.clone().unwrap_or_default();
            assert!(
                error.contains(&format!("{forbidden:?}")) && error.contains("do not allow"),
                "{:?}: {error}",
                b.kind
            );
            assert_eq!(dead[0].envelope.attempt, 1, "{:?}: set aside at once", b.kind);
            let ch = conn.consuming_connection().channel().await.unwrap();
            assert_eq!(depth(&ch, &forbidden).await, 0, "{:?}: nothing reached it", b.kind);
            assert_eq!(depth(&ch, &allowed).await, 1, "{:?}", b.kind);
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
        }
    })
    .await;
}
