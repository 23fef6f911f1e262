//! The scheduler (statement 26 of `docs/statements.md`): `send_at`/`send_after` over the
//! delay ladder and the `Scheduler` that delivers what falls due, on
//! acemq-memory with a paused clock (30 days take no time, and every
//! timing is checked) and on RabbitMQ on a real clock (the seconds checked
//! by the clock, the long delays by the ladder queues they wait in).
//!
//! The ladder's queues are shared by everyone on a broker, so the tests of
//! this binary take turns (`ONE_AT_A_TIME`), look only for their own
//! message ids, and take their own messages out of the ladder when done.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq_codec::{BasicProperties, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::schedule::{
    level_name, wall_clock, DELIVERY, DELIVER_AT_HEADER, DELIVER_TO_EXCHANGE_HEADER, DELIVER_TO_ROUTING_KEY_HEADER,
    MAX_DELAY,
};
use acemq_core::{consume, Ack, Conn, Consumer, Envelope, Error, Message, ReplayOptions, Scheduler};
use acemq_tests::{brokers_with_tls, counts_by_outcome, depth, unique, Broker, Kind, Moment};
use tokio::time::Instant;

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;
/// How late a delivery may be (statement 26: within 2 s, broker willing).
const LATE_AT_MOST: Duration = Duration::from_secs(2);

/// The tests of this binary share the ladder: one at a time, taken before
/// the deadline starts so that waiting for a turn is not counted.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `scenario` on acemq-memory (a paused clock) and on RabbitMQ (a real
/// clock; over TLS too when `tls`), each on a current-thread runtime whose
/// counters `recorder` sees.
fn on_brokers<F, Fut>(tls: bool, scenario: F)
where
    F: Fn(Broker, Arc<metrics_util::debugging::Snapshotter>) -> Fut,
    Fut: Future<Output = ()>,
{
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    acemq_tests::deadline_blocking(|| {
        let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers_with_tls());
        for b in all {
            if b.kind.is_tls() && !tls {
                continue;
            }
            let recorder = metrics_util::debugging::DebuggingRecorder::new();
            let snapshotter = Arc::new(recorder.snapshotter());
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(b.kind == Kind::Memory)
                .build()
                .unwrap();
            metrics::with_local_recorder(&recorder, || {
                runtime.block_on(acemq_tests::deadline(scenario(b, snapshotter)));
            });
        }
    })
}

/// One delivery as the destination's consumer saw it.
#[derive(Debug, Clone)]
struct Got {
    payload: u64,
    envelope: Envelope,
    when: Moment,
}

type Gots = Arc<Mutex<Vec<Got>>>;

/// A destination: a durable classic queue and a consumer recording what it
/// gets (and counting, so a wait wakes on a delivery rather than polling:
/// on the paused clock a poll would step through 30 days 10 ms at a time).
struct Dest {
    q: String,
    got: Gots,
    count: tokio::sync::watch::Receiver<usize>,
    consumer: Consumer,
}

async fn classic_queue(conn: &Conn, q: &str) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    ch.queue_declare(QueueDeclare {
        queue: q.into(),
        durable: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let _ = ch.close().await;
}

async fn dest(conn: &Conn) -> Dest {
    let q = unique("sched.to");
    classic_queue(conn, &q).await;
    let got: Gots = Arc::default();
    let (counter, count) = tokio::sync::watch::channel(0);
    let record = got.clone();
    let consumer = consume(conn, &q, move |m: Message<u64>| {
        let mut got = record.lock().unwrap();
        got.push(Got {
            payload: m.payload,
            envelope: m.envelope,
            when: Moment::now(),
        });
        counter.send_replace(got.len());
        std::future::ready(Ack::accept())
    })
    .prefetch(1000)
    .await
    .unwrap();
    Dest {
        q,
        got,
        count,
        consumer,
    }
}

impl Dest {
    /// Waits (on the test's clock) until `n` deliveries have been seen.
    async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Got> {
        let _label = acemq_tests::waiting_for(format!("{n} deliveries to {}", self.q));
        let mut count = self.count.clone();
        let reached = tokio::time::timeout(limit, count.wait_for(|seen| *seen >= n)).await;
        let got = self.seen();
        assert!(reached.is_ok(), "{} of {n} deliveries within {limit:?}", got.len());
        got
    }

    fn seen(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    async fn remove(self, conn: &Conn) {
        self.consumer.close().await.unwrap();
        delete_queues(
            conn,
            &[&self.q, &format!("{}.dlq", self.q), &format!("{}.parked", self.q)],
        )
        .await;
    }
}

async fn delete_queues(conn: &Conn, queues: &[&str]) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    for q in queues {
        let _ = ch
            .queue_delete(QueueDelete {
                queue: (*q).into(),
                ..Default::default()
            })
            .await;
    }
    let _ = ch.close().await;
}

/// The message ids in `queue`, read without consuming it.
async fn ids_in(conn: &Conn, queue: &str) -> BTreeSet<String> {
    conn.peek(queue, 100_000)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.envelope.id)
        .collect()
}

/// Takes the messages with these ids out of `queue`; the others stay, in
/// their places. Returns how many were taken.
async fn take_out(conn: &Conn, queue: &str, ids: &BTreeSet<String>) -> usize {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let n = depth(&ch, queue).await;
    let mut taken = 0;
    for _ in 0..n {
        let Some(m) = ch.basic_get(queue, false).await.unwrap() else {
            break;
        };
        let props = m.properties.as_ref().ok();
        let id = props.and_then(|p| p.message_id.as_ref()).map(|id| id.to_string());
        if id.is_some_and(|id| ids.contains(&id)) {
            m.ack().unwrap();
            taken += 1;
        }
    }
    // The others go back where they were when the channel closes.
    let _ = ch.close().await;
    taken
}

/// Sleeps until `at` on the test's clock.
async fn until(at: Instant) {
    tokio::time::sleep_until(at).await;
}

fn header<'a>(envelope: &'a Envelope, name: &str) -> Option<&'a FieldValue> {
    envelope.headers.get(name)
}

/// What a delivered copy must look like: a new id, caused by the
/// scheduled message, same correlation, attempt 1, no scheduling or
/// dead-lettering headers left.
fn check_delivered(got: &Got, scheduled_id: &str, correlation: Option<&str>) {
    let e = &got.envelope;
    assert_ne!(e.id, scheduled_id, "the delivered copy has an id of its own");
    assert_eq!(e.causation_id.as_deref(), Some(scheduled_id));
    assert_eq!(e.correlation_id.as_deref(), correlation);
    assert_eq!(e.attempt, 1);
    for gone in [
        DELIVER_AT_HEADER,
        DELIVER_TO_EXCHANGE_HEADER,
        DELIVER_TO_ROUTING_KEY_HEADER,
        "x-death",
        "x-first-death-queue",
    ] {
        assert!(header(e, gone).is_none(), "{gone} is gone from the delivered copy");
    }
}

#[test]
fn statement_26_delays_of_1s_10s_1h_and_30_days_land_in_order_and_never_early() {
    on_brokers(true, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let scheduler = Scheduler::start(&conn).await.unwrap();
        let to = dest(&conn).await;
        let publisher = conn.publisher::<u64>("", &to.q);
        let start = Instant::now();
        let mut sent = BTreeMap::new();
        // The longest first, so the order they land in is the ladder's doing.
        for delay in [30 * DAY, HOUR, 10, 1] {
            let envelope = Envelope::new().with_correlation_id(format!("corr-{delay}"));
            let id = envelope.id.clone();
            let before = Moment::now();
            publisher
                .send_envelope_after(envelope, &delay, Duration::from_secs(delay))
                .await
                .unwrap();
            sent.insert(delay, (id, before, Moment::now()));
        }
        let id = |delay: u64| sent[&delay].0.clone();
        // Each waits in the queue of its highest set bit: 1 h = 2048 + 1024 + 512 + 16
        // (level 11), 30 days = 2,592,000 s (level 21), 10 s = 8 + 2 (level 03).
        for (delay, level) in [(30 * DAY, 21), (HOUR, 11), (10, 3)] {
            assert!(
                ids_in(&conn, &level_name(level)).await.contains(&id(delay)),
                "{kind:?}: {delay} s waits in {}",
                level_name(level)
            );
        }
        // 10 s is binary 1010: 8 s in level 03, then 2 s in level 01.
        until(start + Duration::from_secs(5)).await;
        assert!(
            ids_in(&conn, &level_name(3)).await.contains(&id(10)),
            "{kind:?}: at 5 s in level 03"
        );
        until(start + Duration::from_secs(9)).await;
        assert!(
            ids_in(&conn, &level_name(1)).await.contains(&id(10)),
            "{kind:?}: at 9 s in level 01"
        );
        assert!(
            !ids_in(&conn, &level_name(3)).await.contains(&id(10)),
            "{kind:?}: and out of level 03"
        );

        let expect = if kind == Kind::Memory { 4 } else { 2 };
        let limit = if kind == Kind::Memory {
            Duration::from_secs(30 * DAY + 60)
        } else {
            Duration::from_secs(12)
        };
        let got = to.wait_for(expect, limit).await;
        let order: Vec<u64> = got.iter().map(|g| g.payload).collect();
        assert_eq!(
            order,
            [1, 10, 3600, 2_592_000][..expect],
            "{kind:?}: in the order they fall due"
        );
        for g in &got {
            let (scheduled_id, before, after) = &sent[&g.payload];
            let due = Duration::from_secs(g.payload);
            let (waited, at_most) = (g.when.since(before), g.when.at - after.at);
            println!("{kind:?}: a delay of {} s was delivered after {waited}", g.payload);
            assert!(
                waited.at_least(due),
                "{kind:?}: {} s delivered early, after {waited}",
                g.payload
            );
            assert!(
                at_most <= due + LATE_AT_MOST,
                "{kind:?}: {} s delivered late, after {at_most:?}",
                g.payload
            );
            check_delivered(g, scheduled_id, Some(&format!("corr-{}", g.payload)));
        }
        if kind != Kind::Memory {
            // The long ones are where they should be, and are taken out again.
            assert!(ids_in(&conn, &level_name(11)).await.contains(&id(HOUR)));
            assert!(ids_in(&conn, &level_name(21)).await.contains(&id(30 * DAY)));
            let ours: BTreeSet<String> = [id(HOUR), id(30 * DAY)].into();
            let taken = take_out(&conn, &level_name(11), &ours).await + take_out(&conn, &level_name(21), &ours).await;
            assert_eq!(taken, 2);
        }
        scheduler.close().await.unwrap();
        to.remove(&conn).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn statement_26_a_delay_of_2_28_s_is_refused_with_a_clear_error() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let q = unique("sched.far");
        classic_queue(&conn, &q).await;
        let publisher = conn.publisher::<u64>("", &q);
        let too_long = [
            Duration::from_secs(1 << 28),
            // Rounded up to whole seconds, this is 2^28 s too.
            Duration::from_secs(1 << 28) - Duration::from_millis(500),
            Duration::from_secs(100 * 365 * DAY),
        ];
        for delay in too_long {
            let err = publisher.send_after(&1, delay).await.unwrap_err();
            let text = err.to_string();
            println!("{kind:?}: send_after({delay:?}): {text}");
            assert!(
                matches!(err, Error::DelayTooLong { max_secs: 268_435_455, requested_secs, .. } if requested_secs >= 1 << 28),
                "{kind:?}: {err:?}"
            );
            assert!(text.contains("2^28 - 1 s") && text.contains("not sent"), "{text}");
        }
        let err = publisher
            .send_at(&1, wall_clock() + Duration::from_secs((1 << 28) + 5))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::DelayTooLong { .. }), "{kind:?}: {err:?}");

        // The longest there is goes through every level: it waits first in
        // level 27, whose TTL (2^27 s, 134,217,728,000 ms) is a long.
        let envelope = Envelope::new();
        let id = envelope.id.clone();
        publisher.send_envelope_after(envelope, &1, MAX_DELAY).await.unwrap();
        let ours: BTreeSet<String> = [id.clone()].into();
        assert!(
            ids_in(&conn, &level_name(27)).await.contains(&id),
            "{kind:?}: in level 27"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            ids_in(&conn, &level_name(27)).await.contains(&id),
            "{kind:?}: still in level 27"
        );
        assert_eq!(take_out(&conn, &level_name(27), &ours).await, 1);
        delete_queues(&conn, &[&q]).await;
        conn.close().await.unwrap();
    });
}

/// Publishes a message straight into `acemq.delay.delivery`, as another
/// service (or a person) could: due at `deliver_at` (seconds), to `queue`
/// on the default exchange, or with no destination at all.
async fn publish_due(conn: &Conn, to: Option<&str>, deliver_at: Option<u64>, payload: u64) -> String {
    let id = Envelope::new().id;
    let mut headers = FieldTable::new();
    if let Some(q) = to {
        headers.insert(DELIVER_TO_EXCHANGE_HEADER, "");
        headers.insert(DELIVER_TO_ROUTING_KEY_HEADER, q);
    }
    if let Some(at) = deliver_at {
        headers.insert(DELIVER_AT_HEADER, FieldValue::Timestamp(at));
    }
    let properties = BasicProperties {
        message_id: Some(id.as_str().into()),
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        headers: Some(headers),
        ..Default::default()
    };
    conn.publish_confirmed(DELIVERY, "by-hand", true, properties, payload.to_string().into())
        .await
        .unwrap();
    id
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs()
}

#[test]
fn statement_26_a_process_restart_while_messages_wait_loses_none() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        // The destination's consumer lives in another process.
        let watcher = b.conn().await;
        let to = dest(&watcher).await;

        // The first process schedules, and runs a scheduler.
        let first = b.conn().await;
        let scheduler = Scheduler::start(&first).await.unwrap();
        let publisher = first.publisher::<u64>("", &to.q);
        let mut sent = HashMap::new();
        for delay in [2, 3] {
            let envelope = Envelope::new();
            sent.insert(delay, (envelope.id.clone(), Moment::now()));
            publisher
                .send_envelope_after(envelope, &delay, Duration::from_secs(delay))
                .await
                .unwrap();
        }
        // One that reached the scheduler early: it holds it in the process.
        let due = unix_secs(wall_clock()) + 3;
        let held = publish_due(&first, Some(&to.q), Some(due), 99).await;
        tokio::time::sleep(Duration::from_secs(1)).await;

        // The process goes away mid-wait: its scheduler and its Conn with it.
        drop(scheduler);
        drop(publisher);
        first.close().await.unwrap();
        assert!(to.seen().is_empty(), "{kind:?}: nothing was due yet");

        // A new process, a new scheduler: nothing was lost.
        let second = b.conn().await;
        let scheduler = Scheduler::start(&second).await.unwrap();
        let got = to.wait_for(3, Duration::from_secs(10)).await;
        let mut payloads: Vec<u64> = got.iter().map(|g| g.payload).collect();
        payloads.sort();
        assert_eq!(payloads, [2, 3, 99], "{kind:?}");
        for g in &got {
            if g.payload == 99 {
                check_delivered(g, &held, None);
                assert!(unix_secs(g.when.wall) >= due, "{kind:?}: the held message came early");
                continue;
            }
            let (id, before) = &sent[&g.payload];
            check_delivered(g, id, None);
            let waited = g.when.since(before);
            assert!(
                waited.at_least(Duration::from_secs(g.payload)),
                "{kind:?}: {} s came early, after {waited}",
                g.payload
            );
            assert!(
                waited.monotonic <= Duration::from_secs(g.payload) + LATE_AT_MOST,
                "{kind:?}: {} s came after {waited}",
                g.payload
            );
        }
        scheduler.close().await.unwrap();
        second.close().await.unwrap();
        to.remove(&watcher).await;
        watcher.close().await.unwrap();
    });
}

#[test]
fn statement_26_a_scheduler_that_is_down_delays_delivery_without_losing_anything_and_catches_up() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let to = dest(&conn).await;
        let publisher = conn.publisher::<u64>("", &to.q);
        let start = Instant::now();
        let mut ids = BTreeSet::new();
        for n in 0..5u64 {
            let envelope = Envelope::new();
            ids.insert(envelope.id.clone());
            publisher
                .send_envelope_after(envelope, &n, Duration::from_secs(1))
                .await
                .unwrap();
        }
        // No scheduler: they fall due and wait in acemq.delay.delivery.
        until(start + Duration::from_secs(3)).await;
        assert!(
            to.seen().is_empty(),
            "{kind:?}: nothing is delivered without a scheduler"
        );
        let waiting = ids_in(&conn, DELIVERY).await;
        assert!(ids.is_subset(&waiting), "{kind:?}: all five wait for a scheduler");

        let scheduler = Scheduler::start(&conn).await.unwrap();
        let got = to.wait_for(5, Duration::from_secs(5)).await;
        let causes: BTreeSet<String> = got.iter().filter_map(|g| g.envelope.causation_id.clone()).collect();
        assert_eq!(causes, ids, "{kind:?}: every one, once");
        for g in &got {
            assert!(
                g.when.at - start >= Duration::from_secs(3),
                "{kind:?}: delivered when the scheduler came"
            );
        }
        println!(
            "{kind:?}: the scheduler came back after {:?}; all five delivered {:?} later",
            Duration::from_secs(3),
            got.iter().map(|g| g.when.at).max().unwrap() - (start + Duration::from_secs(3))
        );
        scheduler.close().await.unwrap();
        to.remove(&conn).await;
        conn.close().await.unwrap();
    });
}

/// Sends `n` messages due after `delay` through `publisher`, `window` at a time.
async fn send_many(publisher: &acemq_core::Publisher<u64>, n: u64, delay: Duration) -> Vec<String> {
    let mut ids = Vec::with_capacity(n as usize);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        if tasks.len() >= 512 {
            tasks.join_next().await.unwrap().unwrap();
        }
        let envelope = Envelope::new();
        ids.push(envelope.id.clone());
        let publisher = publisher.clone();
        tasks.spawn(async move { publisher.send_envelope_after(envelope, &i, delay).await.unwrap() });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    ids
}

async fn wait_depth(conn: &Conn, queue: &str, n: u32, limit: Duration) {
    let _label = acemq_tests::waiting_for(format!("{n} messages in {queue}"));
    let ch = conn.consuming_connection().channel().await.unwrap();
    let until = Instant::now() + limit;
    loop {
        let now = depth(&ch, queue).await;
        if now >= n {
            return;
        }
        assert!(Instant::now() < until, "{queue} holds {now} of {n} after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn statement_26_two_schedulers_deliver_each_message_once_to_a_deduping_consumer() {
    on_brokers(false, |b, snapshotter| async move {
        let kind = b.kind;
        const N: u64 = 2000;
        let watcher = b.conn().await;
        // Downstream dedupes on Envelope.id, and counts what it dropped.
        let q = unique("sched.dedupe");
        classic_queue(&watcher, &q).await;
        let seen: Arc<Mutex<(HashMap<String, String>, u64)>> = Arc::default();
        let record = seen.clone();
        let downstream = consume(&watcher, &q, move |m: Message<u64>| {
            let mut seen = record.lock().unwrap();
            let cause = m.envelope.causation_id.clone().unwrap_or_default();
            if let Some(before) = seen.0.insert(m.envelope.id.clone(), cause.clone()) {
                assert_eq!(before, cause, "one id, one scheduled message");
                seen.1 += 1;
            }
            std::future::ready(Ack::accept())
        })
        .prefetch(1000)
        .await
        .unwrap();

        let sender = b.conn().await;
        let ids: BTreeSet<String> = send_many(&sender.publisher::<u64>("", &q), N, Duration::from_secs(1))
            .await
            .into_iter()
            .collect();
        wait_depth(&sender, DELIVERY, N as u32, Duration::from_secs(30)).await;

        // Two schedulers in two processes; the first dies under the load
        // (its consuming connection goes), so what it had delivered but not
        // yet acked is delivered again by the second.
        let (one, two) = (b.conn().await, b.conn().await);
        let first = Scheduler::start(&one).await.unwrap();
        let second = Scheduler::start(&two).await.unwrap();
        {
            let _label = acemq_tests::waiting_for("a quarter delivered");
            let until = Instant::now() + Duration::from_secs(30);
            while (seen.lock().unwrap().0.len() as u64) < N / 4 {
                assert!(Instant::now() < until, "{kind:?}: a quarter delivered");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        one.consuming_connection().close().await.unwrap();
        {
            let _label = acemq_tests::waiting_for("every message delivered");
            let until = Instant::now() + Duration::from_secs(30);
            while (seen.lock().unwrap().0.len() as u64) < N {
                assert!(
                    Instant::now() < until,
                    "{kind:?}: {} of {N} delivered",
                    seen.lock().unwrap().0.len()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        // Stragglers: a copy the dead scheduler had published is delivered again.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (unique_ids, duplicates) = {
            let seen = seen.lock().unwrap();
            (seen.0.clone(), seen.1)
        };
        let causes: BTreeSet<String> = unique_ids.values().cloned().collect();
        assert_eq!(causes, ids, "{kind:?}: each scheduled message delivered");
        assert_eq!(unique_ids.len() as u64, N, "{kind:?}: each under one id");
        let first_ended = first.close().await;
        second.close().await.unwrap();
        let counts = counts_by_outcome(&snapshotter, acemq_core::metrics_names::SCHEDULED_TOTAL);
        println!(
            "{kind:?}: {N} scheduled, {} delivered once each downstream, {duplicates} duplicates dropped by the dedupe; \
             acemq_scheduled_total {counts:?}; the first scheduler ended with {first_ended:?}",
            unique_ids.len()
        );
        let delivered = counts.get("delivered").copied().unwrap_or(0);
        let redelivered = counts.get("redelivered").copied().unwrap_or(0);
        assert!(delivered + redelivered >= N + duplicates, "{kind:?}: {counts:?}");
        assert!(
            redelivered >= duplicates,
            "{kind:?}: every duplicate was a redelivery: {counts:?}"
        );
        downstream.close().await.unwrap();
        delete_queues(&watcher, &[&q, &format!("{q}.dlq"), &format!("{q}.parked")]).await;
        for conn in [watcher, sender, two] {
            conn.close().await.unwrap();
        }
        let _ = one.close().await;
    });
}

#[test]
fn statement_26_a_delivery_that_cannot_go_is_set_aside_for_replay_and_an_early_one_waits() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let scheduler = Scheduler::start(&conn).await.unwrap();
        let dlq = format!("{DELIVERY}.dlq");

        // A destination that does not exist yet: NO_ROUTE, set aside with
        // its destination, replayed once it exists.
        let later = unique("sched.later");
        let envelope = Envelope::new();
        let scheduled = envelope.id.clone();
        conn.publisher::<u64>("", &later)
            .send_envelope_after(envelope, &7, Duration::from_secs(1))
            .await
            .unwrap();
        // An exchange that does not exist: asked before the publish (which
        // would close the library channel), and set aside.
        let missing = unique("sched.no-exchange");
        let envelope = Envelope::new();
        let to_nowhere = envelope.id.clone();
        conn.publisher::<u64>(&missing, "k")
            .send_envelope_after(envelope, &9, Duration::from_secs(1))
            .await
            .unwrap();
        // Without a destination at all: set aside at once.
        let lost = publish_due(&conn, None, None, 8).await;
        let set_aside = {
            let _label = acemq_tests::waiting_for("three set-asides");
            let until = Instant::now() + Duration::from_secs(10);
            loop {
                let listed = conn.peek(&dlq, 100_000).await.unwrap();
                let ours: Vec<_> = listed
                    .into_iter()
                    .filter(|m| {
                        let cause = m.envelope.causation_id.as_deref();
                        cause == Some(&scheduled) || cause == Some(&to_nowhere) || m.envelope.id == lost
                    })
                    .collect();
                if ours.len() == 3 {
                    break ours;
                }
                assert!(Instant::now() < until, "{kind:?}: {} set aside", ours.len());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let caused_by = |id: &str| {
            set_aside
                .iter()
                .find(|m| m.envelope.causation_id.as_deref() == Some(id))
                .unwrap()
        };
        let unroutable = caused_by(&scheduled);
        let no_exchange = caused_by(&to_nowhere);
        let nowhere = set_aside.iter().find(|m| m.envelope.id == lost).unwrap();
        println!(
            "{kind:?}: set aside: {:?} / {:?} / {:?}",
            unroutable.error, no_exchange.error, nowhere.error
        );
        assert!(
            no_exchange.error.as_deref().unwrap().contains("does not exist"),
            "{no_exchange:?}"
        );
        assert_eq!(no_exchange.original_exchange.as_deref(), Some(missing.as_str()));
        assert_eq!(no_exchange.original_routing_key.as_deref(), Some("k"));
        assert!(
            unroutable.error.as_deref().unwrap().contains("312"),
            "{kind:?}: {unroutable:?}"
        );
        assert_eq!(unroutable.original_exchange.as_deref(), Some(""));
        assert_eq!(unroutable.original_routing_key.as_deref(), Some(later.as_str()));
        assert!(nowhere.error.as_deref().unwrap().contains(DELIVER_TO_EXCHANGE_HEADER));

        classic_queue(&conn, &later).await;
        let delivered_id = unroutable.envelope.id.clone();
        let only = delivered_id.clone();
        let report = conn
            .replay(
                &dlq,
                ReplayOptions {
                    filter: Some(Arc::new(move |m: &acemq_core::SetAside| m.envelope.id == only)),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(report.replayed, 1, "{kind:?}: {report:?}");
        let ch = conn.consuming_connection().channel().await.unwrap();
        let m = ch
            .basic_get(&later, false)
            .await
            .unwrap()
            .expect("the replayed delivery");
        let props = m.properties.as_ref().unwrap();
        assert_eq!(
            props.message_id.as_ref().unwrap(),
            delivered_id.as_str(),
            "the id it was to have"
        );
        assert_eq!(&m.body[..], b"7");
        m.ack().unwrap();

        // Early by 2 s: held in the process until due. Early by 2 h: back
        // onto the ladder (2 h = 7200 s: level 12 first).
        let to = dest(&conn).await;
        let due = unix_secs(wall_clock()) + 2;
        let held = publish_due(&conn, Some(&to.q), Some(due), 1).await;
        let far = publish_due(&conn, Some(&to.q), Some(unix_secs(wall_clock()) + 2 * HOUR), 2).await;
        let got = to.wait_for(1, Duration::from_secs(5)).await;
        check_delivered(&got[0], &held, None);
        assert!(unix_secs(got[0].when.wall) >= due, "{kind:?}: held until due");
        let far_ids: BTreeSet<String> = [far.clone()].into();
        {
            let _label = acemq_tests::waiting_for("the far one back on the ladder");
            let until = Instant::now() + Duration::from_secs(5);
            while !ids_in(&conn, &level_name(12)).await.contains(&far) {
                assert!(Instant::now() < until, "{kind:?}: rescheduled into level 12");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        assert_eq!(take_out(&conn, &level_name(12), &far_ids).await, 1);
        let ours: BTreeSet<String> = [lost, no_exchange.envelope.id.clone()].into();
        assert_eq!(take_out(&conn, &dlq, &ours).await, 2);
        let _ = ch.close().await;
        scheduler.close().await.unwrap();
        to.remove(&conn).await;
        delete_queues(&conn, &[&later]).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn measure_scheduled_deliveries_per_second_of_10000_messages_due_at_once() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        const N: u64 = 10_000;
        let conn = b.conn().await;
        let q = unique("sched.burst");
        classic_queue(&conn, &q).await;
        let publisher = conn.publisher::<u64>("", &q);
        let sending = std::time::Instant::now();
        send_many(&publisher, N, Duration::from_secs(1)).await;
        let sent_in = sending.elapsed();
        // No scheduler yet: all of them fall due and wait.
        wait_depth(&conn, DELIVERY, N as u32, Duration::from_secs(60)).await;

        // A consumer without acks counts them in as they come.
        let ch = conn.consuming_connection().channel().await.unwrap();
        let mut deliveries = ch
            .basic_consume(acemq_codec::BasicConsume {
                queue: q.as_str().into(),
                no_ack: true,
                ..Default::default()
            })
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let scheduler = Scheduler::start(&conn).await.unwrap();
        let _label = acemq_tests::waiting_for("10,000 scheduled deliveries");
        let mut first = None;
        for n in 0..N {
            let next = tokio::time::timeout(Duration::from_secs(60), deliveries.next()).await;
            assert!(matches!(next, Ok(Some(_))), "{kind:?}: {n} of {N} delivered");
            first.get_or_insert_with(|| started.elapsed());
        }
        let last = started.elapsed();
        let first = first.unwrap();
        let spread = last - first;
        println!(
            "{kind:?}: {N} messages due at once delivered in {last:?} from the scheduler's start \
             (first after {first:?}): {:.0} deliveries/s ({:.0}/s first to last); \
             sending them took {sent_in:?} ({:.0} scheduled sends/s)",
            N as f64 / last.as_secs_f64(),
            (N - 1) as f64 / spread.as_secs_f64().max(1e-9),
            N as f64 / sent_in.as_secs_f64()
        );
        scheduler.close().await.unwrap();
        let _ = ch.close().await;
        delete_queues(&conn, &[&q]).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn statement_26_the_ladder_is_declared_as_documented_and_agrees_with_a_service_that_writes_longs() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let scheduler = Scheduler::start(&conn).await.unwrap();
        // Recorded, so that a recovery declares it all again.
        let declared = conn.declared();
        for d in acemq_core::schedule::ladder_declarations() {
            assert!(declared.contains(&d), "{kind:?}: {d:?} is recorded");
        }
        let ch = conn.consuming_connection().channel().await.unwrap();
        for level in 0..acemq_core::schedule::LEVELS {
            // What a service writing every integer as a long declares: RabbitMQ
            // takes `I` and `l` of one value as the same.
            let ttl_ms = (1i64 << level) * 1000;
            let mut arguments = FieldTable::new();
            arguments.insert("x-message-ttl", FieldValue::I64(ttl_ms));
            let below = if level == 0 {
                DELIVERY.to_string()
            } else {
                level_name(level - 1)
            };
            arguments.insert("x-dead-letter-exchange", below.as_str());
            ch.queue_declare(QueueDeclare {
                queue: level_name(level).as_str().into(),
                durable: true,
                arguments,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: level {level} with a long TTL: {e}"));
        }
        // A TTL of 2^22 s cannot be an `I`: wrapped round, it is refused.
        let probe = unique("sched.ttl-probe");
        let mut arguments = FieldTable::new();
        arguments.insert("x-message-ttl", FieldValue::I32((1u64 << 22).wrapping_mul(1000) as i32));
        let refused = ch
            .queue_declare(QueueDeclare {
                queue: probe.as_str().into(),
                durable: true,
                arguments,
                ..Default::default()
            })
            .await
            .unwrap_err();
        println!("{kind:?}: level 22's TTL as a 32-bit int: {refused}");
        assert!(refused.to_string().contains("value_negative"), "{kind:?}: {refused}");
        scheduler.close().await.unwrap();
        conn.close().await.unwrap();
    });
}

#[test]
fn statement_26_a_scheduler_rides_through_a_recovery_of_its_connection() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let name = unique("sched.recover");
        let config = acemq_core::Config::default()
            .with_connection_name(name.clone())
            .with_recovery_delay(Duration::from_millis(50))
            .with_recovery_delay_max(Duration::from_millis(400));
        let conn = b.conn_with(config).await;
        let scheduler = Scheduler::start(&conn).await.unwrap();
        let to = dest(&conn).await;
        let publisher = conn.publisher::<u64>("", &to.q);
        let sent = Moment::now();
        let envelope = Envelope::new();
        let id = envelope.id.clone();
        publisher
            .send_envelope_after(envelope, &2, Duration::from_secs(2))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        b.force_close(&format!("{name}-consume"));
        let got = to.wait_for(1, Duration::from_secs(10)).await;
        check_delivered(&got[0], &id, None);
        let took = got[0].when.since(&sent);
        println!("{kind:?}: delivered after {took}, across a forced close of the consuming connection");
        assert!(took.at_least(Duration::from_secs(2)), "{kind:?}: early");
        assert!(!scheduler.is_finished(), "{kind:?}: the scheduler is still running");
        scheduler.close().await.unwrap();
        to.remove(&conn).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn a_scheduled_message_whose_times_are_out_of_range_is_delivered_now() {
    on_brokers(false, |b, _| async move {
        let kind = b.kind;
        let conn = b.conn().await;
        let scheduler = Scheduler::start(&conn).await.unwrap();
        let to = dest(&conn).await;
        // Another producer's: no message-id, a timestamp of 2^63 + 1, and
        // a due time that is no time (past 9999-12-31T23:59:59Z, negative,
        // or not a number): read as absent, so due now.
        for (n, deliver_at) in [
            FieldValue::Timestamp(u64::MAX),
            FieldValue::Timestamp((1 << 63) + 1),
            FieldValue::I64(i64::MAX),
            FieldValue::Timestamp(253_402_300_800),
            FieldValue::I64(-5),
            FieldValue::from("tomorrow"),
        ]
        .into_iter()
        .enumerate()
        {
            let mut headers = FieldTable::new();
            headers.insert(DELIVER_TO_EXCHANGE_HEADER, "");
            headers.insert(DELIVER_TO_ROUTING_KEY_HEADER, to.q.as_str());
            headers.insert(DELIVER_AT_HEADER, deliver_at);
            let properties = BasicProperties {
                timestamp: Some((1 << 63) + 1),
                headers: Some(headers),
                ..Default::default()
            };
            conn.publish_confirmed(DELIVERY, "by-hand", true, properties, n.to_string().into())
                .await
                .unwrap();
        }
        let got = to.wait_for(6, Duration::from_secs(10)).await;
        let mut payloads: Vec<u64> = got.iter().map(|g| g.payload).collect();
        payloads.sort();
        assert_eq!(payloads, [0, 1, 2, 3, 4, 5], "{kind:?}: each delivered at once");
        assert!(got.iter().all(|g| g.envelope.attempt == 1), "{kind:?}");
        to.remove(&conn).await;
        scheduler.close().await.unwrap();
        conn.close().await.unwrap();
    });
}
