//! `Consumer::pause` and `resume`, on every broker: a paused consumer
//! starts no handler, lets the running ones finish, and the broker stops
//! sending to it; it stays paused through a recovery of its connection and
//! resumes after one; a stream consumer resumes at its place; a close while
//! paused is clean; pause and resume are idempotent and race with each
//! other, with a close and with a broker cancel without harm. The attempt a
//! handler sees rises only by handler calls and real redeliveries
//! (statement 28 of docs/statements.md): a pause hands nothing back.
//!
//! Connections are closed by their name, never the broker's others.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{ChannelFlow, Method, QueueDelete};
use acemq_core::topology::QueueOptions;
use acemq_core::{consume, Ack, Config, Conn, Consumer, Error, Message, OnCancel, Topology};
use acemq_tests::{brokers, deadline, depth, step, unique, Broker, RecoveryLog};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How long a paused consumer is watched to show that nothing starts.
const QUIET: Duration = Duration::from_millis(400);

/// What a handler saw: payload, attempt, redelivered.
type Seen = Arc<Mutex<Vec<(u32, u32, bool)>>>;

/// A handler that records what it sees, and holds payloads in `hold` until
/// `release` gives a permit for each.
fn recording(
    seen: &Seen,
    hold: &'static [u32],
    release: &Arc<Semaphore>,
) -> impl Fn(Message<u32>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Ack> + Send>> + Send + Sync + 'static {
    let (seen, release) = (seen.clone(), release.clone());
    move |m: Message<u32>| {
        let (seen, release) = (seen.clone(), release.clone());
        Box::pin(async move {
            seen.lock()
                .unwrap()
                .push((m.payload, m.envelope.attempt, m.redelivered));
            if hold.contains(&m.payload) {
                release.acquire().await.unwrap().forget();
            }
            Ack::accept()
        })
    }
}

/// The payloads handlers saw, sorted: handlers run side by side, so the
/// order in which they start is free.
fn payloads(seen: &Seen) -> Vec<u32> {
    let mut all: Vec<u32> = seen.lock().unwrap().iter().map(|(p, ..)| *p).collect();
    all.sort_unstable();
    all
}

/// Waits until `done` holds, at most `within`.
async fn until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let _label = acemq_tests::waiting_for(what.to_string());
    let end = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < end, "no {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A `Conn` named `name` (its consuming connection `{name}-consume`),
/// reporting to `events`, with quick redials.
async fn conn_named(b: &Broker, name: &str, events: &RecoveryLog) -> Conn {
    let mut config = events.config(Config::default());
    config.engine.connection_name = Some(name.to_string());
    b.conn_with(config).await
}

/// Closes this test's consuming connection from the broker's side (on
/// acemq-memory, this scenario's own broker: every connection).
fn force_close_consuming(b: &Broker, name: &str) {
    b.force_close(&format!("{name}-consume"));
}

/// How many messages wait in `queue`, read from a connection of its own.
async fn ready(b: &Broker, queue: &str) -> u32 {
    let other = b.connect().await;
    let ch = other.channel().await.unwrap();
    let n = depth(&ch, queue).await;
    let _ = other.close().await;
    n
}

/// Waits until `queue` holds `n` messages ready, at most 10 s.
async fn until_ready(b: &Broker, queue: &str, n: u32) {
    let _label = acemq_tests::waiting_for(format!("{n} messages ready in {queue}"));
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let now = ready(b, queue).await;
        if now == n {
            return;
        }
        assert!(
            Instant::now() < end,
            "{:?}: {now} messages ready in {queue}, not {n}",
            b.kind
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn delete_queues(b: &Broker, queues: &[String]) {
    let other = b.connect().await;
    for q in queues {
        for name in [q.clone(), format!("{q}.dlq"), format!("{q}.parked")] {
            let ch = other.channel().await.unwrap();
            let _ = ch
                .queue_delete(QueueDelete {
                    queue: name.as_str().into(),
                    ..Default::default()
                })
                .await;
        }
    }
    let _ = other.close().await;
}

async fn send_all(conn: &Conn, queue: &str, range: std::ops::Range<u32>) {
    let publisher = conn.publisher::<u32>("", queue).mandatory();
    for n in range {
        publisher.send(&n).await.unwrap();
    }
}

async fn pause(consumer: &Consumer) {
    step("pause", consumer.pause()).await.unwrap();
}

async fn resume(consumer: &Consumer) {
    step("resume", consumer.resume()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_consumer_starts_no_handler_lets_running_ones_finish_and_the_broker_stops_sending() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("pause.basic");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            // One handler at a time: the first of 0, 1 and 2 to get the
            // slot runs and holds it (which is first is the runtime's
            // choice); the other two arrive and wait for it, started by no
            // handler.
            let consumer = consume(&conn, &queue, recording(&seen, &[0, 1, 2], &release))
                .prefetch(10)
                .concurrency(1)
                .await
                .unwrap();
            send_all(&conn, &queue, 0..3).await;
            // 30 s: a node just started, under the suite's other tests, has
            // been seen slower than 10 s to make its first delivery.
            until(&format!("{kind:?}: the first handler"), Duration::from_secs(30), || {
                !payloads(&seen).is_empty()
            })
            .await;
            let first = payloads(&seen);
            // The broker has sent the other two on.
            until_ready(&b, &queue, 0).await;
            pause(&consumer).await;
            assert!(consumer.is_paused(), "{kind:?}");
            // The running handler finishes and settles; nothing else starts.
            release.add_permits(1);
            send_all(&conn, &queue, 3..8).await;
            tokio::time::sleep(QUIET).await;
            assert_eq!(payloads(&seen), first, "{kind:?}: nothing starts while paused");
            // The broker stopped: what came after the pause waits in the
            // queue; the other two are held, unacknowledged, not handed back.
            assert_eq!(ready(&b, &queue).await, 5, "{kind:?}: the broker keeps what came after");

            resume(&consumer).await;
            assert!(!consumer.is_paused(), "{kind:?}");
            // The other two of 0, 1 and 2 hold their slot in turn too.
            release.add_permits(2);
            until("every message after resume", Duration::from_secs(20), || {
                seen.lock().unwrap().len() == 8
            })
            .await;
            let all = seen.lock().unwrap().clone();
            assert_eq!(payloads(&seen), (0..8).collect::<Vec<_>>(), "{kind:?}: each once");
            assert!(
                all.iter()
                    .all(|(_, attempt, redelivered)| *attempt == 1 && !redelivered),
                "{kind:?}: a pause is no redelivery and raises no attempt: {all:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(ready(&b, &queue).await, 0, "{kind:?}");
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pauses_in_the_middle_of_a_stream_of_deliveries_leave_no_message_behind() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("pause.load");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &queue, recording(&seen, &[], &release))
                .prefetch(50)
                .await
                .unwrap();
            const N: u32 = 1500;
            let publisher = conn.publisher::<u32>("", &queue).mandatory();
            let sending = tokio::spawn(async move {
                for n in 0..N {
                    publisher.send(&n).await.unwrap();
                }
            });
            // Pause and resume while deliveries pour in.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                pause(&consumer).await;
                tokio::time::sleep(Duration::from_millis(30)).await;
                resume(&consumer).await;
            }
            step("the sends", sending).await.unwrap();
            until("every message", Duration::from_secs(60), || {
                seen.lock().unwrap().len() >= N as usize
            })
            .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let all = seen.lock().unwrap().clone();
            assert_eq!(
                payloads(&seen),
                (0..N).collect::<Vec<_>>(),
                "{kind:?}: each handled once"
            );
            // acemq hands nothing back. RabbitMQ itself returns a quorum
            // queue's delivery that was on its way when a cancel took
            // effect (seen on 3.10 and 4.0): a real redelivery, counted
            // once. acemq-memory has no such window.
            let redelivered: Vec<_> = all.iter().filter(|(_, a, r)| *a != 1 || *r).collect();
            // (Returned at most once per pause: 5.)
            assert!(
                redelivered
                    .iter()
                    .all(|(_, attempt, r)| *r && (2..=6).contains(attempt)),
                "{kind:?}: only broker redeliveries, each counted once: {redelivered:?}"
            );
            if !b.is_rabbitmq() {
                assert!(redelivered.is_empty(), "{kind:?}: {redelivered:?}");
            }
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_are_idempotent_and_race_free_with_each_other() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("pause.race");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = Arc::new(consume(&conn, &queue, recording(&seen, &[], &release)).await.unwrap());
            // Twice each: the second does nothing.
            pause(&consumer).await;
            pause(&consumer).await;
            resume(&consumer).await;
            resume(&consumer).await;
            // Many at once, from many tasks: each returns, none hangs.
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..40 {
                let consumer = consumer.clone();
                calls.spawn(async move {
                    if i % 2 == 0 {
                        consumer.pause().await
                    } else {
                        consumer.resume().await
                    }
                });
            }
            while let Some(result) = step("the racing calls", calls.join_next()).await {
                result.unwrap().unwrap();
            }
            // The last word wins: paused, then nothing is handled.
            pause(&consumer).await;
            send_all(&conn, &queue, 0..3).await;
            tokio::time::sleep(QUIET).await;
            assert!(seen.lock().unwrap().is_empty(), "{kind:?}: {:?}", seen.lock().unwrap());
            assert_eq!(ready(&b, &queue).await, 3, "{kind:?}");
            resume(&consumer).await;
            until("the three messages", Duration::from_secs(20), || {
                seen.lock().unwrap().len() == 3
            })
            .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(payloads(&seen), [0, 1, 2], "{kind:?}: each once");
            let consumer = Arc::try_unwrap(consumer).expect("one handle left");
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_resume_racing_a_conn_close_return_and_the_close_is_clean() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("pause.close-race");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = Arc::new(consume(&conn, &queue, recording(&seen, &[], &release)).await.unwrap());
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..10 {
                let consumer = consumer.clone();
                calls.spawn(async move {
                    if i % 2 == 0 {
                        consumer.pause().await
                    } else {
                        consumer.resume().await
                    }
                });
            }
            step("Conn::close among pauses and resumes", conn.close())
                .await
                .unwrap();
            while let Some(result) = step("the racing calls", calls.join_next()).await {
                // Each returns: done, or the consumer was closed under it.
                match result.unwrap() {
                    Ok(()) | Err(Error::Closed(_)) => {}
                    Err(other) => panic!("{kind:?}: {other}"),
                }
            }
            assert!(consumer.is_finished(), "{kind:?}");
            assert!(
                matches!(step("pause after close", consumer.pause()).await, Err(Error::Closed(_))),
                "{kind:?}"
            );
            assert!(
                matches!(
                    step("resume after close", consumer.resume()).await,
                    Err(Error::Closed(_))
                ),
                "{kind:?}"
            );
            step("closed", consumer.closed()).await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pause_while_a_cancelled_consumer_resubscribes_keeps_it_unsubscribed_until_resumed() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let conn = conn_named(&b, &unique("pause.resub"), &events).await;
            let queue = unique("pause.resub");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &queue, recording(&seen, &[], &release)).await.unwrap();
            // The broker cancels it; it keeps trying to subscribe again...
            delete_queues(&b, std::slice::from_ref(&queue)).await;
            until("a consumer_cancelled", Duration::from_secs(20), || {
                events.count("consumer_cancelled") >= 1
            })
            .await;
            // ... until paused: then it stops trying.
            pause(&consumer).await;
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            send_all(&conn, &queue, 0..2).await;
            tokio::time::sleep(QUIET).await;
            assert!(seen.lock().unwrap().is_empty(), "{kind:?}: {:?}", seen.lock().unwrap());
            assert_eq!(events.count("consumer_resubscribed"), 0, "{kind:?}");
            until_ready(&b, &queue, 2).await;
            resume(&consumer).await;
            until("both after resume", Duration::from_secs(20), || {
                seen.lock().unwrap().len() == 2
            })
            .await;
            assert_eq!(payloads(&seen), [0, 1], "{kind:?}");
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_consumer_stays_paused_through_a_recovery_and_resumes_after_it() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let name = unique("pause.recovery");
            let conn = conn_named(&b, &name, &events).await;
            let queue = unique("pause.recovery");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &queue, recording(&seen, &[1], &release))
                .prefetch(10)
                .await
                .unwrap();
            send_all(&conn, &queue, 0..2).await;
            // 0 is handled; 1 is in its handler when the pause comes.
            until("the handlers of 0 and 1", Duration::from_secs(10), || {
                seen.lock().unwrap().len() == 2
            })
            .await;
            pause(&consumer).await;
            force_close_consuming(&b, &name);
            until("a recovery", Duration::from_secs(60), || events.count("recovered") >= 1).await;
            // The handler of 1 finishes after the loss: its ack cannot
            // reach the new connection, so the broker has 1 back. (Its
            // redelivery will not be held.)
            release.add_permits(2);
            send_all(&conn, &queue, 2..4).await;
            tokio::time::sleep(QUIET).await;
            assert_eq!(
                seen.lock().unwrap().len(),
                2,
                "{kind:?}: still paused after the recovery"
            );
            // Nobody is subscribed on the new connection: 1 (back from
            // the lost one), 2 and 3 wait in the queue.
            until_ready(&b, &queue, 3).await;

            resume(&consumer).await;
            until("1, 2 and 3 after resume", Duration::from_secs(20), || {
                seen.lock().unwrap().len() == 5
            })
            .await;
            let mut after: Vec<(u32, u32, bool)> = seen.lock().unwrap()[2..].to_vec();
            after.sort_unstable();
            assert_eq!(after[0].0, 1, "{kind:?}: {after:?}");
            assert!(after[0].2, "{kind:?}: 1 came back redelivered: {after:?}");
            assert_eq!(after[0].1, 2, "{kind:?}: the redelivery of 1 counts once: {after:?}");
            assert_eq!(&after[1..], &[(2, 1, false), (3, 1, false)], "{kind:?}");
            // Paused once more and closed while paused: clean.
            pause(&consumer).await;
            send_all(&conn, &queue, 4..5).await;
            step("close while paused", consumer.close()).await.unwrap();
            let left = ready(&b, &queue).await;
            assert_eq!(
                left,
                1,
                "{kind:?}: the message sent while paused stays; seen {:?}",
                seen.lock().unwrap()
            );
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resume_after_a_recovery_of_a_running_consumer_and_a_pause_during_the_recovery_work() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let name = unique("pause.during");
            let conn = conn_named(&b, &name, &events).await;
            let queue = unique("pause.during");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &queue, recording(&seen, &[], &release)).await.unwrap();
            // Paused right as the connection goes: whichever comes first,
            // the consumer ends up paused on the new connection.
            force_close_consuming(&b, &name);
            pause(&consumer).await;
            until("a recovery", Duration::from_secs(60), || events.count("recovered") >= 1).await;
            send_all(&conn, &queue, 0..2).await;
            tokio::time::sleep(QUIET).await;
            assert!(seen.lock().unwrap().is_empty(), "{kind:?}: {:?}", seen.lock().unwrap());
            assert_eq!(ready(&b, &queue).await, 2, "{kind:?}");
            resume(&consumer).await;
            until("both after resume", Duration::from_secs(20), || {
                seen.lock().unwrap().len() == 2
            })
            .await;
            assert_eq!(payloads(&seen), [0, 1], "{kind:?}");
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_stream_consumer_resumes_at_its_place_after_a_pause_and_after_a_recovery() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let name = unique("pause.stream");
            let conn = conn_named(&b, &name, &events).await;
            let stream = unique("pause.stream");
            Topology::new()
                .queue_with(&stream, QueueOptions::stream())
                .declare(&conn)
                .await
                .unwrap();
            send_all(&conn, &stream, 0..5).await;
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &stream, recording(&seen, &[], &release))
                .argument("x-stream-offset", "first")
                .prefetch(50)
                .await
                .unwrap();
            until("0..5", Duration::from_secs(20), || seen.lock().unwrap().len() == 5).await;
            pause(&consumer).await;
            send_all(&conn, &stream, 5..10).await;
            tokio::time::sleep(QUIET).await;
            assert_eq!(seen.lock().unwrap().len(), 5, "{kind:?}");
            resume(&consumer).await;
            until("5..10", Duration::from_secs(20), || seen.lock().unwrap().len() >= 10).await;
            // And paused across a recovery.
            pause(&consumer).await;
            force_close_consuming(&b, &name);
            until("a recovery", Duration::from_secs(60), || events.count("recovered") >= 1).await;
            send_all(&conn, &stream, 10..15).await;
            tokio::time::sleep(QUIET).await;
            assert_eq!(seen.lock().unwrap().len(), 10, "{kind:?}: still paused");
            resume(&consumer).await;
            until("10..15", Duration::from_secs(20), || seen.lock().unwrap().len() >= 15).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert_eq!(
                payloads(&seen),
                (0..15).collect::<Vec<_>>(),
                "{kind:?}: each offset once, at its place"
            );
            consumer.close().await.unwrap();
            conn.close().await.unwrap();
            // The stream itself stays: RabbitMQ 3.10 can crash a stream's
            // writer when one is deleted under its retention check (see
            // features.rs); its name is this run's alone.
            delete_queues(&b, &[]).await;
            let other = b.connect().await;
            for name in [format!("{stream}.dlq"), format!("{stream}.parked")] {
                let ch = other.channel().await.unwrap();
                let _ = ch
                    .queue_delete(QueueDelete {
                        queue: name.as_str().into(),
                        ..Default::default()
                    })
                    .await;
            }
            let _ = other.close().await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_close_while_paused_hands_back_what_it_held_and_waits_for_running_handlers() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let conn = b.conn().await;
            let queue = unique("pause.close");
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let consumer = consume(&conn, &queue, recording(&seen, &[0], &release))
                .prefetch(10)
                .concurrency(1)
                .await
                .unwrap();
            send_all(&conn, &queue, 0..3).await;
            until("the handler of 0", Duration::from_secs(10), || payloads(&seen) == [0]).await;
            until_ready(&b, &queue, 0).await;
            pause(&consumer).await;
            let closing = tokio::spawn(consumer.close());
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                !closing.is_finished(),
                "{kind:?}: the close waits for the running handler"
            );
            release.add_permits(1);
            step("the close", closing).await.unwrap().unwrap();
            assert_eq!(payloads(&seen), [0], "{kind:?}: nothing started after the pause");
            assert_eq!(ready(&b, &queue).await, 2, "{kind:?}: 1 and 2 went back to the queue");
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_deleted_while_paused_is_a_broker_cancel_at_resume() {
    deadline(async {
        for b in brokers().await {
            let kind = b.kind;
            let events = RecoveryLog::default();
            let conn = conn_named(&b, &unique("pause.cancel"), &events).await;
            let queue = unique("pause.cancel");
            let ended_queue = unique("pause.cancel.end");
            Topology::new()
                .queue(&queue)
                .queue(&ended_queue)
                .declare(&conn)
                .await
                .unwrap();
            let seen = Seen::default();
            let release = Arc::new(Semaphore::new(0));
            let resubscribing = consume(&conn, &queue, recording(&seen, &[], &release)).await.unwrap();
            let ending = consume(&conn, &ended_queue, recording(&seen, &[], &release))
                .on_cancel(OnCancel::End)
                .await
                .unwrap();
            pause(&resubscribing).await;
            pause(&ending).await;
            delete_queues(&b, &[queue.clone(), ended_queue.clone()]).await;

            // Built to end: resume says why, and so does closed().
            let err = step("resume of a consumer whose queue went", ending.resume())
                .await
                .unwrap_err();
            assert!(matches!(err, Error::ConsumerCancelled { .. }), "{kind:?}: {err}");
            let closed = step("closed", ending.closed()).await.unwrap_err();
            assert!(matches!(closed, Error::ConsumerCancelled { .. }), "{kind:?}: {closed}");

            // Built to resubscribe: it comes back once the queue does.
            let resumed = tokio::spawn(async move {
                let result = resubscribing.resume().await;
                (resubscribing, result)
            });
            until("a consumer_cancelled", Duration::from_secs(20), || {
                events.count("consumer_cancelled") >= 1
            })
            .await;
            Topology::new().queue(&queue).declare(&conn).await.unwrap();
            let (resubscribing, result) = step("the resume", resumed).await.unwrap();
            result.unwrap();
            send_all(&conn, &queue, 0..1).await;
            until("the message after the resubscription", Duration::from_secs(20), || {
                payloads(&seen) == [0]
            })
            .await;
            resubscribing.close().await.unwrap();
            let _ = ending.close().await;
            conn.close().await.unwrap();
            delete_queues(&b, &[queue]).await;
        }
    })
    .await;
}

/// Why a pause cancels rather than asks for flow control: RabbitMQ (and
/// acemq-memory, imitating it) refuses a client's `channel.flow` with
/// `active=false`, closing the connection with 540 NOT_IMPLEMENTED.
#[tokio::test(flavor = "multi_thread")]
async fn a_clients_channel_flow_off_is_refused_by_the_broker_so_pause_cancels_instead() {
    deadline(async {
        for b in brokers().await {
            let connection = b.connect().await;
            let ch = connection.channel().await.unwrap();
            let err = ch
                .call(Method::ChannelFlow(ChannelFlow { active: false }))
                .await
                .unwrap_err();
            let closed = step("the connection to close", connection.closed()).await;
            let text = format!("{err} / {closed}");
            assert!(
                text.contains("540") || text.contains("NOT_IMPLEMENTED"),
                "{:?}: {text}",
                b.kind
            );
        }
    })
    .await;
}
