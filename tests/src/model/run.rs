//! The runner: one sequence against a real consumer on a real broker,
//! recording what the model needs ([`super::check::Record`]).
//!
//! It must never decide what is right: it records the handler's calls, the
//! redeliveries it caused, the faults it injected and where every copy of
//! every message was found, and leaves the verdict to [`super::check`].
//! Every wait is bounded; a consumer that never finishes a message shows up
//! as a message the model finds in the wrong place, not as a hang.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_codec::{BasicProperties, FieldArray, FieldTable, FieldValue, QueueDeclare, QueueDelete};
use acemq_core::amqp::{Channel, Config as EngineConfig, Connection};
use acemq_core::envelope::{ATTEMPT_HEADER, ERROR_HEADER, FIRST_SEEN_HEADER};
use acemq_core::pipeline::ROUTING_SLIP_HEADER;
use acemq_core::retry::rung_name;
use acemq_core::{consume, fatal, Ack, Config, Conn, Consumer, Message};
use bytes::Bytes;
use serde::Deserialize;

use super::check::{self, Call, Cancel, Found, Place, Record, FATAL_ERROR, PANIC_TEXT, PARK_REASON, RETRY_ERROR};
use super::ops::{Hostile, Op, Outcome, QueueType, Setup, CANCEL_GAP, LONG_ERROR, NEAR_FRAME_MAX, SLOW};
use crate::chaos::{host_port, Proxy};

/// The broker a sequence runs against.
#[derive(Debug, Clone)]
pub struct Target {
    /// What the reports call it (`acemq-memory`, `RabbitMQ 3.10`, ...).
    pub name: String,
    /// The RabbitMQ's URL, or `None` for a fresh acemq-memory broker per sequence.
    pub url: Option<String>,
}

/// How long a `Quiet` step waits for the consumer to finish its messages.
const QUIET: Duration = Duration::from_secs(3);
/// How long the last wait for quiet takes at most, before the consumer is
/// closed.
const LAST_QUIET: Duration = Duration::from_secs(4);
/// How long the rungs may take to hand their messages back at the end.
const RUNGS_EMPTY: Duration = Duration::from_secs(3);
/// How long the `Conn` may take to recover from a forced close.
const RECOVERY: Duration = Duration::from_secs(5);
/// How long a consumer the broker cancelled may take to subscribe again
/// once its queue is back (its backoff is 20 ms doubling to 200 ms).
const RESUBSCRIBE: Duration = Duration::from_secs(5);
/// How long a message whose queue was deleted under it may show no sign of
/// life (no call, not found) before `quieten` stops waiting for it: it went
/// with the queue. Every wait a live message spends is far shorter.
const GONE_QUIET: Duration = Duration::from_millis(1000);
/// How long `Conn::close()` may take (its drain is two seconds).
const CLOSE: Duration = Duration::from_secs(15);
/// A message last published, called or found this recently when a fault
/// came may still be unacknowledged (a set-aside confirmed, its ack not yet
/// out): the fault may redeliver it, and it may be set aside twice.
const RECENT: Duration = Duration::from_millis(500);

#[derive(Deserialize)]
struct Body {
    n: usize,
}

#[derive(Debug)]
struct ModelError(String);

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ModelError {}

/// What the handler reads and writes: the scripts, and the calls.
#[derive(Default)]
struct Handled {
    scripts: Mutex<HashMap<usize, Vec<Outcome>>>,
    calls: Mutex<BTreeMap<usize, Vec<Call>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps the panics the model's handler makes on purpose out of the output
/// (every other panic is printed as before).
pub fn quiet_model_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !text.contains(PANIC_TEXT) {
                previous(info);
            }
        }));
    });
}

/// The number in a body the test published (`{"n":N}` or `not json N`).
fn number_of(body: &[u8]) -> Option<usize> {
    if let Ok(b) = serde_json::from_slice::<Body>(body) {
        return Some(b.n);
    }
    std::str::from_utf8(body).ok()?.strip_prefix("not json ")?.parse().ok()
}

struct Runner<'a> {
    setup: &'a Setup,
    queues: Vec<String>,
    helper_url: String,
    conn_url: String,
    memory: Option<(String, acemq_memory::Broker)>,
    proxy: Option<Proxy>,
    helper: Option<(Connection, Channel)>,
    handled: Arc<Handled>,
    records: Vec<Record>,
    /// The queue each message was published to.
    queue_of: Vec<String>,
    /// When each message was last published or found.
    last_seen: Vec<Instant>,
    running: Option<(Conn, Vec<Consumer>)>,
    /// The `which` of every `RecoveryEvent::Recovered` of the running `Conn`.
    recovered: Arc<Mutex<Vec<&'static str>>>,
    /// Whether the running `Conn`'s consuming connection is up (it came
    /// back after the last forced close).
    consuming_up: bool,
    /// The label and subject of the running `Conn`'s consumer events
    /// (`consumer_cancelled`, `consumer_resubscribed`: the queue) and
    /// connection events (`lost`, `recovered`: `publish` or `consume`).
    consumer_events: Arc<Mutex<Vec<(&'static str, String)>>>,
    /// Every cancel of a running consumer the test caused.
    cancels: Vec<Cancel>,
    log: Vec<String>,
    started: Instant,
}

/// Runs `ops` on `setup` against `target`; `Err` is the model's verdict
/// with the sequence's log.
pub async fn run(setup: &Setup, ops: &[Op], target: &Target) -> Result<(), String> {
    quiet_model_panics();
    let base = crate::unique("model");
    let (memory, helper_url, conn_url, proxy) = match &target.url {
        None => {
            let name = format!("{base}.broker");
            let broker = acemq_memory::Broker::named(&name);
            let url = format!("memory://{name}/");
            (Some((name, broker)), url.clone(), url, None)
        }
        Some(url) => {
            let proxy = Proxy::start(host_port(url)).await;
            let through = proxy.url_for(url);
            (None, url.clone(), through, Some(proxy))
        }
    };
    let queues = (0..setup.queues.len()).map(|i| format!("{base}.q{i}")).collect();
    let mut runner = Runner {
        setup,
        queues,
        helper_url,
        conn_url,
        memory,
        proxy,
        helper: None,
        handled: Arc::default(),
        records: Vec::new(),
        queue_of: Vec::new(),
        last_seen: Vec::new(),
        running: None,
        recovered: Arc::default(),
        consuming_up: false,
        consumer_events: Arc::default(),
        cancels: Vec::new(),
        log: Vec::new(),
        started: Instant::now(),
    };
    let outcome = runner.go(ops).await;
    runner.cleanup().await;
    outcome.map_err(|e| format!("on {}: {e}\n{}", target.name, runner.log.join("\n")))
}

impl Runner<'_> {
    fn note(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.log
            .push(format!("  {:>6.0?} {text}", self.started.elapsed().as_millis() as f64));
    }

    async fn go(&mut self, ops: &[Op]) -> Result<(), String> {
        self.declare().await?;
        for op in ops {
            self.step(op).await?;
        }
        if self.running.is_some() {
            self.quieten(LAST_QUIET).await?;
            self.close().await?;
        }
        self.wait_for_rungs().await;
        for i in 0..self.queues.len() {
            for (suffix, place) in [
                (".dlq", Place::Dlq),
                (".parked", Place::Parked),
                (".sink", Place::Sink),
                ("", Place::Queued),
            ] {
                let queue = format!("{}{suffix}", self.queues[i]);
                self.observe(&queue, place).await?;
            }
        }
        let calls = std::mem::take(&mut *lock(&self.handled.calls));
        for (n, calls) in calls {
            match self.records.get_mut(n) {
                Some(r) => r.calls = calls,
                None => return Err(format!("the handler saw message {n}, which was never published")),
            }
        }
        let mut failures = Vec::new();
        for c in &self.cancels {
            if let Err(e) = check::check_cancel(c) {
                failures.push(e);
            }
        }
        for r in &self.records {
            if let Err(e) = check::check(self.setup, r) {
                failures.push(format!("message {} ({:?} queue, {:?}, script {:?}, broker redeliveries by copy {:?}, faults {:?}{}): {e}\n      calls {:?}\n      found {:?}",
                    r.n, r.queue, r.props, r.script, r.steals, r.faults,
                    if r.queue_deleted { ", its queue deleted under it" } else { "" },
                    r.calls.iter().map(|c| (c.attempt, c.redelivered)).collect::<Vec<_>>(),
                    r.found));
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!("{:?}\n  {}\nlog:", self.setup, failures.join("\n  ")))
        }
    }

    async fn step(&mut self, op: &Op) -> Result<(), String> {
        match op {
            Op::Publish { q, props, script } => {
                let qi = q % self.queues.len();
                let n = self.records.len();
                lock(&self.handled.scripts).insert(n, script.clone());
                self.records.push(Record {
                    n,
                    queue: self.setup.queues[qi],
                    props: *props,
                    script: script.clone(),
                    steals: BTreeMap::new(),
                    consumed: self.running.is_some(),
                    faults: Vec::new(),
                    dlq_deleted: false,
                    queue_deleted: false,
                    calls: Vec::new(),
                    found: Vec::new(),
                });
                self.queue_of.push(self.queues[qi].clone());
                self.last_seen.push(Instant::now());
                self.publish(qi, n).await?;
                self.note(format!("published {n} to q{qi}"));
            }
            Op::Steal { q } => {
                let queue = self.queues[q % self.queues.len()].clone();
                let ch = self.channel().await?;
                match ch.basic_get(&queue, false).await {
                    Ok(Some(m)) => {
                        let Some(n) = number_of(&m.body) else {
                            return Err(format!("{queue} held a message the test never published: {:?}", m.body));
                        };
                        let copy = lock(&self.handled.calls).get(&n).map_or(0, Vec::len);
                        ch.basic_nack(m.delivery_tag, false, true)
                            .map_err(|e| format!("nacking a stolen message: {e}"))?;
                        if let Some(r) = self.records.get_mut(n) {
                            *r.steals.entry(copy).or_default() += 1;
                        }
                        self.note(format!(
                            "another client took {n} (copy {copy}) and nacked it with requeue"
                        ));
                    }
                    Ok(None) => self.note("another client found nothing to take"),
                    Err(e) => return Err(format!("basic.get on {queue}: {e}")),
                }
            }
            Op::Start => {
                if self.running.is_none() {
                    self.start().await?;
                }
            }
            Op::Close => {
                if self.running.is_some() {
                    self.fault("Conn::close").await?;
                    self.close().await?;
                }
            }
            Op::ForceClose => {
                if self.running.is_some() {
                    self.fault("a forced close").await?;
                    lock(&self.recovered).clear();
                    match (&self.memory, &self.proxy) {
                        (Some((_, broker)), _) => {
                            broker.faults().close_all("closed by the model test");
                            // The test's own connection went with them.
                            self.helper = None;
                        }
                        (None, Some(proxy)) => proxy.cut_all(),
                        (None, None) => unreachable!("a RabbitMQ run has its proxy"),
                    }
                    self.note("the broker closed the consumer's connections");
                    self.wait_for_recovery().await;
                }
            }
            Op::DeleteDlq { q } => {
                let qi = q % self.queues.len();
                let queue = format!("{}.dlq", self.queues[qi]);
                self.observe_set_asides().await?;
                let calls = lock(&self.handled.calls).clone();
                let name = &self.queues[qi];
                for r in &mut self.records {
                    let mine = self.queue_of[r.n] == *name;
                    if mine && r.consumed && !Self::done(r, calls.get(&r.n)) {
                        r.dlq_deleted = true;
                    }
                }
                let ch = self.channel().await?;
                let delete = QueueDelete {
                    queue: queue.as_str().into(),
                    ..Default::default()
                };
                match ch.queue_delete(delete).await {
                    Ok(ok) => {
                        let count = ok.map_or(0, |ok| ok.message_count);
                        self.note(format!("another client deleted {queue} ({count} messages in it)"));
                    }
                    Err(e) => self.note(format!("deleting {queue}: {e}")),
                }
            }
            Op::Cancel { q, gap } => {
                let qi = q % self.queues.len();
                self.cancel(qi, *gap).await?;
            }
            Op::Quiet => {
                if self.running.is_some() {
                    self.quieten(QUIET).await?;
                }
            }
        }
        Ok(())
    }

    /// The test's own channel (another client), opened again when a fault
    /// or a refusal closed it.
    async fn channel(&mut self) -> Result<Channel, String> {
        if let Some((conn, ch)) = &self.helper {
            if !conn.is_closed() && ch.is_open() {
                return Ok(ch.clone());
            }
        }
        let conn = match self.helper.take() {
            Some((conn, _)) if !conn.is_closed() => conn,
            _ => {
                let config = EngineConfig::default().with_connection_timeout(Duration::from_secs(10));
                Connection::open(&self.helper_url, config)
                    .await
                    .map_err(|e| format!("the test's connection to {}: {e}", self.helper_url))?
            }
        };
        let ch = conn.channel().await.map_err(|e| format!("the test's channel: {e}"))?;
        ch.confirm_select().await.map_err(|e| format!("confirm.select: {e}"))?;
        self.helper = Some((conn, ch.clone()));
        Ok(ch)
    }

    async fn declare(&mut self) -> Result<(), String> {
        for qi in 0..self.queues.len() {
            let name = self.queues[qi].clone();
            self.declare_queue(qi).await?;
            let ch = self.channel().await?;
            ch.queue_declare(QueueDeclare {
                queue: format!("{name}.sink").as_str().into(),
                durable: true,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("declaring {name}.sink: {e}"))?;
        }
        Ok(())
    }

    /// Declares source queue `qi`, as the deployment's topology does.
    async fn declare_queue(&mut self, qi: usize) -> Result<(), String> {
        let name = self.queues[qi].clone();
        let mut arguments = FieldTable::new();
        if self.setup.queues[qi] == QueueType::Quorum {
            // What `Topology::queue(..).dead_letters(..)` declares.
            arguments.push("x-queue-type", FieldValue::from("quorum"));
            arguments.push("x-dead-letter-exchange", FieldValue::from("acemq.dlx"));
            arguments.push("x-dead-letter-routing-key", FieldValue::from(format!("{name}.dlq")));
        }
        let ch = self.channel().await?;
        ch.queue_declare(QueueDeclare {
            queue: name.as_str().into(),
            durable: true,
            arguments,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("declaring {name}: {e}"))?;
        Ok(())
    }

    /// Another client deletes source queue `qi` and declares it again
    /// (after [`CANCEL_GAP`] with `gap`). Every message of the queue not
    /// done by then may go with it; a running consumer is cancelled by the
    /// broker, and the test waits (bounded) for it to subscribe again.
    async fn cancel(&mut self, qi: usize, gap: bool) -> Result<(), String> {
        self.observe_set_asides().await?;
        let at_risk = self.at_risk();
        let calls = lock(&self.handled.calls).clone();
        let name = self.queues[qi].clone();
        let now = Instant::now();
        for r in &mut self.records {
            // A fault may have left a second copy of a message done since
            // (a retry's republish, and the original redelivered).
            let may_be_in_it = !Self::done(r, calls.get(&r.n)) || !r.faults.is_empty();
            if self.queue_of[r.n] == name && may_be_in_it {
                r.queue_deleted = true;
                self.last_seen[r.n] = now;
            }
        }
        let watching = self.running.is_some() && self.consuming_up;
        let events = self.consumer_events.clone();
        let count = |label: &str, about: &str| lock(&events).iter().filter(|(l, a)| *l == label && *a == about).count();
        let before: Vec<usize> = [
            ("consumer_cancelled", name.as_str()),
            ("consumer_resubscribed", &name),
            ("lost", "consume"),
            ("recovered", "consume"),
        ]
        .iter()
        .map(|(label, about)| count(label, about))
        .collect();
        let cancelled = || count("consumer_cancelled", &name) > before[0];
        // Back: subscribed again, or reattached by the recovery of its
        // connection (which the broker may close meanwhile: see below).
        let back = || count("consumer_resubscribed", &name) > before[1] || count("recovered", "consume") > before[3];
        // What it holds is read out first: the model then knows which
        // messages the deletion took (all but those that arrive in the
        // moment between).
        self.observe(&name, Place::Deleted).await?;
        let ch = self.channel().await?;
        let delete = QueueDelete {
            queue: name.as_str().into(),
            ..Default::default()
        };
        let deleted_at = Instant::now();
        match ch.queue_delete(delete).await {
            Ok(ok) => {
                let count = ok.map_or(0, |ok| ok.message_count);
                self.note(format!("another client deleted {name} ({count} more messages in it)"));
            }
            Err(e) => return Err(format!("deleting {name}: {e}")),
        }
        // The queue is declared again only once the consumer has heard of
        // the cancel: RabbitMQ 3.10 never cancels the consumers of a quorum
        // queue declared again within some milliseconds of its deletion
        // (they stay subscribed to nothing, and the new queue's messages
        // stick, unsent, on their channel), as no topology is that quick.
        let until = Instant::now() + RESUBSCRIBE;
        while watching && !cancelled() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let reported = cancelled();
        if gap {
            tokio::time::sleep(CANCEL_GAP).await;
        }
        self.declare_queue(qi).await?;
        self.note(format!("another client declared {name} again"));
        if !watching {
            return Ok(());
        }
        while !back() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let resubscribed = back().then(|| deleted_at.elapsed());
        // RabbitMQ (3.10 and 4.0) may answer a `basic.consume` on a quorum
        // queue declared again a moment before with a crash of the channel
        // (`{badmatch,{error,noproc}}` in `rabbit_quorum_queue:consume`),
        // which closes the connection with 541 INTERNAL_ERROR: a loss like
        // a forced close, whose redeliveries the model must allow.
        if count("lost", "consume") > before[2] {
            self.note("the broker closed the consuming connection while the consumer subscribed again");
            for n in at_risk {
                self.records[n]
                    .faults
                    .push("the broker closed the consuming connection during a resubscribe".into());
            }
            while count("recovered", "consume") <= before[3] && Instant::now() < until + RECOVERY {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            self.consuming_up = count("recovered", "consume") > before[3];
        }
        self.note(match resubscribed {
            Some(after) => format!("the consumer of {name} subscribed again, {after:?} after the deletion"),
            None => format!("the consumer of {name} did not subscribe again within {RESUBSCRIBE:?}"),
        });
        self.cancels.push(Cancel {
            queue: name,
            reported,
            resubscribed,
        });
        Ok(())
    }

    async fn publish(&mut self, qi: usize, n: usize) -> Result<(), String> {
        let queue = self.queues[qi].clone();
        let props = self.records[n].props;
        let ch = self.channel().await?;
        let mut headers = FieldTable::new();
        headers.insert("x-model-message", FieldValue::I32(n as i32));
        match props.hostile {
            Hostile::Nothing | Hostile::Undecodable => {}
            Hostile::AttemptString => {
                headers.insert(ATTEMPT_HEADER, FieldValue::from("5"));
            }
            Hostile::AttemptNegative => {
                headers.insert(ATTEMPT_HEADER, FieldValue::I32(-2));
            }
            Hostile::AttemptLong => {
                headers.insert(ATTEMPT_HEADER, FieldValue::I64(3));
            }
            Hostile::FirstSeenTable => {
                let mut table = FieldTable::new();
                table.insert("seconds", FieldValue::I32(1));
                headers.insert(FIRST_SEEN_HEADER, FieldValue::Table(table));
            }
            Hostile::FirstSeenHuge => {
                headers.insert(FIRST_SEEN_HEADER, FieldValue::Timestamp(u64::MAX));
            }
            Hostile::NearFrameMax => {
                let frame_max = self.helper.as_ref().map_or(131_072, |(c, _)| c.tuned().frame_max) as usize;
                headers.insert(
                    "x-model-padding",
                    FieldValue::from("p".repeat(frame_max - NEAR_FRAME_MAX)),
                );
            }
            Hostile::ForeignSlip => {
                let step = |key: &str| {
                    let mut t = FieldTable::new();
                    t.insert("exchange", FieldValue::from(""));
                    t.insert("routing-key", FieldValue::from(key));
                    FieldValue::Table(t)
                };
                let slip = FieldArray(vec![step(&queue), step(&format!("{queue}.sink"))]);
                headers.insert(ROUTING_SLIP_HEADER, FieldValue::Array(slip));
            }
        }
        let properties = BasicProperties {
            content_type: Some("application/json".into()),
            delivery_mode: Some(if props.persistent { 2 } else { 1 }),
            message_id: props.message_id.then(|| format!("model-{n}").as_str().into()),
            timestamp: props.timestamp.value(),
            headers: Some(headers),
            ..Default::default()
        };
        let body = if props.hostile == Hostile::Undecodable {
            Bytes::from(format!("not json {n}"))
        } else {
            Bytes::from(format!("{{\"n\":{n}}}"))
        };
        let confirm = ch
            .publish("", &queue, true, properties, body)
            .await
            .map_err(|e| format!("publishing {n}: {e}"))?;
        let confirmation = confirm.await.map_err(|e| format!("the confirm of {n}: {e}"))?;
        if confirmation != acemq_core::amqp::Confirmation::Ack {
            return Err(format!("publishing {n} to {queue}: {confirmation:?}"));
        }
        Ok(())
    }

    /// Waits until both connections of the `Conn` are back: a message
    /// published before that may still go to the consumer of the closed
    /// connection (the broker has not noticed yet) and come back redelivered.
    async fn wait_for_recovery(&mut self) {
        let until = Instant::now() + RECOVERY;
        self.consuming_up = false;
        loop {
            let back = lock(&self.recovered).clone();
            if back.contains(&"publish") && back.contains(&"consume") {
                self.consuming_up = true;
                self.note("the Conn recovered");
                return;
            }
            if Instant::now() >= until {
                self.note(format!(
                    "the Conn did not recover within {RECOVERY:?} (recovered: {back:?})"
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn start(&mut self) -> Result<(), String> {
        let recovered = self.recovered.clone();
        lock(&recovered).clear();
        let consumer_events = self.consumer_events.clone();
        lock(&consumer_events).clear();
        let config = Config::default()
            .with_on_recovery(move |event| {
                use acemq_core::RecoveryEvent::*;
                let about = match &event {
                    ConsumerCancelled { queue, .. } | ConsumerResubscribed { queue, .. } => queue.clone(),
                    Lost { which, .. } | Recovered { which, .. } => which.to_string(),
                    _ => return,
                };
                if let Recovered { which, .. } = event {
                    lock(&recovered).push(which);
                }
                lock(&consumer_events).push((event.label(), about));
            })
            .with_recovery_delay(Duration::from_millis(20))
            .with_recovery_delay_max(Duration::from_millis(200))
            .with_engine(EngineConfig::default().with_connection_timeout(Duration::from_secs(10)))
            .with_connection_name(crate::unique("model-consumer"));
        let conn = Conn::open(&self.conn_url, config)
            .await
            .map_err(|e| format!("Conn::open: {e}"))?;
        let mut consumers = Vec::new();
        for queue in &self.queues {
            let handled = self.handled.clone();
            let consumer = consume(&conn, queue, move |m: Message<Body>| {
                let n = m.payload.n;
                let outcome = {
                    let mut calls = lock(&handled.calls);
                    let calls = calls.entry(n).or_default();
                    calls.push(Call {
                        attempt: m.envelope.attempt,
                        redelivered: m.redelivered,
                        at: Instant::now(),
                    });
                    let script = lock(&handled.scripts);
                    check::outcome_at(script.get(&n).map_or(&[][..], Vec::as_slice), calls.len() - 1)
                };
                answer(outcome)
            })
            .prefetch(self.setup.prefetch)
            .retry_with(self.setup.policy())
            .drain_timeout(Duration::from_secs(2))
            .await
            .map_err(|e| format!("consume({queue}): {e}"))?;
            consumers.push(consumer);
        }
        for r in &mut self.records {
            r.consumed = true;
        }
        self.running = Some((conn, consumers));
        self.consuming_up = true;
        self.note("started a Conn and its consumers");
        Ok(())
    }

    async fn close(&mut self) -> Result<(), String> {
        let Some((conn, consumers)) = self.running.take() else {
            return Ok(());
        };
        match tokio::time::timeout(CLOSE, conn.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.note(format!("Conn::close: {e}")),
            Err(_) => return Err(format!("Conn::close() did not return within {CLOSE:?}")),
        }
        drop(consumers);
        self.note("closed the Conn");
        Ok(())
    }

    /// Whether message `r` is done: accepted, or found set aside.
    fn done(r: &Record, calls: Option<&Vec<Call>>) -> bool {
        r.found.iter().any(|f| f.place != Place::Queued)
            || calls.is_some_and(|calls| (0..calls.len()).any(|i| check::accepted_at(r, i)))
    }

    /// A fault is coming: every message the consumer may hold then (not
    /// done, or done so recently that its ack may not be out) is noted.
    async fn fault(&mut self, what: &str) -> Result<(), String> {
        self.observe_set_asides().await?;
        for n in self.at_risk() {
            self.records[n].faults.push(what.to_string());
        }
        Ok(())
    }

    /// The messages the consumer may hold now (as [`Self::fault`] says),
    /// as far as the set-asides observed last show.
    fn at_risk(&self) -> Vec<usize> {
        let calls = lock(&self.handled.calls).clone();
        let now = Instant::now();
        self.records
            .iter()
            .filter(|r| {
                let mine = calls.get(&r.n);
                let called = mine.and_then(|c| c.last()).map(|c| c.at);
                let last = called.map_or(self.last_seen[r.n], |at| at.max(self.last_seen[r.n]));
                let recent = now.duration_since(last) < RECENT;
                r.consumed && (recent || !Self::done(r, mine))
            })
            .map(|r| r.n)
            .collect()
    }

    async fn observe_set_asides(&mut self) -> Result<(), String> {
        for i in 0..self.queues.len() {
            for (suffix, place) in [(".dlq", Place::Dlq), (".parked", Place::Parked), (".sink", Place::Sink)] {
                let queue = format!("{}{suffix}", self.queues[i]);
                self.observe(&queue, place).await?;
            }
        }
        Ok(())
    }

    async fn quieten(&mut self, limit: Duration) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            self.observe_set_asides().await?;
            let calls = lock(&self.handled.calls).clone();
            let gone = |r: &Record| {
                let called = calls.get(&r.n).and_then(|c| c.last()).map(|c| c.at);
                let last = called.map_or(self.last_seen[r.n], |at| at.max(self.last_seen[r.n]));
                r.queue_deleted && last.elapsed() > GONE_QUIET
            };
            let waiting: Vec<usize> = self
                .records
                .iter()
                .filter(|r| !Self::done(r, calls.get(&r.n)) && !gone(r))
                .map(|r| r.n)
                .collect();
            if waiting.is_empty() {
                self.note("quiet");
                return Ok(());
            }
            if Instant::now() >= until {
                self.note(format!("not quiet within {limit:?}: {waiting:?} not done"));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Takes every message in `queue` (none if it does not exist) and notes
    /// where it was found.
    async fn observe(&mut self, queue: &str, place: Place) -> Result<(), String> {
        loop {
            let ch = self.channel().await?;
            let m = match ch.basic_get(queue, true).await {
                Ok(Some(m)) => m,
                // Empty, or not there (404 closed the channel).
                Ok(None) | Err(_) => return Ok(()),
            };
            let Some(n) = number_of(&m.body) else {
                return Err(format!("{queue} held a message the test never published: {:?}", m.body));
            };
            let headers = m.properties.as_ref().ok().and_then(|p| p.headers.clone());
            let header = |key: &str| headers.as_ref().and_then(|h| h.get(key).cloned());
            let found = Found {
                place,
                error: header(ERROR_HEADER).and_then(|v| v.as_str().map(str::to_string)),
                attempt: header(ATTEMPT_HEADER).and_then(|v| v.as_i64()),
                redelivered: m.redelivered,
            };
            match self.records.get_mut(n) {
                Some(r) => {
                    r.found.push(found);
                    self.last_seen[n] = Instant::now();
                }
                None => return Err(format!("{queue} held message {n}, which was never published")),
            }
            self.note(format!("found {n} in {place:?}"));
        }
    }

    /// Waits until the rungs have handed back what they hold.
    async fn wait_for_rungs(&mut self) {
        let rungs: Vec<String> = self
            .queues
            .iter()
            .flat_map(|q| self.setup.policy().rungs().into_iter().map(move |d| rung_name(q, d)))
            .collect();
        let until = Instant::now() + RUNGS_EMPTY;
        for rung in rungs {
            loop {
                let Ok(ch) = self.channel().await else { return };
                let passive = QueueDeclare {
                    queue: rung.as_str().into(),
                    passive: true,
                    ..Default::default()
                };
                match ch.queue_declare(passive).await {
                    Ok(Some(ok)) if ok.message_count > 0 && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => break,
                }
            }
        }
        // A message the rung just dead-lettered may be on its way.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    /// Deletes what the sequence declared (RabbitMQ), or forgets the
    /// acemq-memory broker.
    async fn cleanup(&mut self) {
        if let Some((conn, _)) = self.running.take() {
            let _ = tokio::time::timeout(CLOSE, conn.close()).await;
        }
        if let Some((name, _)) = self.memory.take() {
            acemq_memory::Broker::forget_named(&name);
            return;
        }
        let rungs = self.setup.policy().rungs();
        for q in self.queues.clone() {
            let mut names = vec![
                q.clone(),
                format!("{q}.dlq"),
                format!("{q}.parked"),
                format!("{q}.sink"),
            ];
            names.extend(rungs.iter().map(|d| rung_name(&q, *d)));
            for name in names {
                let Ok(ch) = self.channel().await else { return };
                let _ = ch
                    .queue_delete(QueueDelete {
                        queue: name.as_str().into(),
                        ..Default::default()
                    })
                    .await;
            }
        }
        if let Some((conn, _)) = self.helper.take() {
            let _ = conn.close().await;
        }
    }
}

/// The handler's answer for `outcome`.
async fn answer(outcome: Outcome) -> Ack {
    match outcome {
        Outcome::Accept => Ack::accept(),
        Outcome::Retry => Ack::retry(ModelError(RETRY_ERROR.into())),
        Outcome::Fatal => Ack::retry(fatal(ModelError(FATAL_ERROR.into()))),
        Outcome::LongFatal => Ack::retry(fatal(ModelError("e".repeat(LONG_ERROR)))),
        Outcome::Park => Ack::park(PARK_REASON),
        Outcome::Panic => panic!("{PANIC_TEXT}"),
        Outcome::Slow => {
            tokio::time::sleep(SLOW).await;
            Ack::accept()
        }
    }
}
