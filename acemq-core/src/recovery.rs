//! Recovery, when a connection drops: one supervisor per AMQP
//! connection of a [`Conn`](crate::Conn). A supervisor reports a loss at once,
//! redials with capped and jittered backoff (every host of the URL in turn),
//! then restores on the new connection, in this order: the channels and their
//! confirm mode, every recorded declaration (a server-named queue anew, its
//! new name given to its bindings and consumers), `basic.qos` and every
//! consumer with its tag and arguments. Only then is the connection handed
//! out again.
//!
//! The low-level [`amqp::Connection`] never recovers: the supervisor watches
//! it end and replaces it. Everything that needs the current connection asks
//! its [`Link`], which also lets a send wait (bounded) through a recovery.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use acemq_codec::{BasicConsume, BasicProperties, BasicPublish, FieldValue, ShortString};
use bytes::Bytes;
use rand::RngExt;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::amqp::{self, AmqpUrl, ConnectionEvent};
use crate::config::{Config, RecoveryEvent};
use crate::declaration::Declaration;
use crate::error::Error;
use crate::proto::CloseReason;

/// Where a link stands.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
    /// The connection is open and restored.
    Up,
    /// The connection was lost; the supervisor is redialling.
    Recovering,
    /// For good: recovery gave up, is turned off, or the `Conn` was closed.
    /// Everyone waiting gets this error.
    Down(Error),
}

/// The current connection of a link, its generation (one more per
/// recovery), and where it stands.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) conn: amqp::Connection,
    pub(crate) generation: u64,
    pub(crate) phase: Phase,
}

/// One of a `Conn`'s connections, as the rest of the crate sees it: the
/// connection of the moment, replaced by its supervisor after a loss.
pub(crate) struct Link {
    /// `publish` or `consume`, in events and logs.
    pub(crate) which: &'static str,
    state: watch::Sender<Snapshot>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("which", &self.which)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(which: &'static str, conn: amqp::Connection) -> Link {
        let (state, _) = watch::channel(Snapshot {
            conn,
            generation: 0,
            phase: Phase::Up,
        });
        Link { which, state }
    }

    /// The connection of the moment (the dead one while recovering).
    pub(crate) fn current(&self) -> amqp::Connection {
        self.state.borrow().conn.clone()
    }

    /// Whether the link is up (not recovering, not down for good).
    pub(crate) fn is_up(&self) -> bool {
        matches!(self.state.borrow().phase, Phase::Up)
    }

    /// Why the broker blocks the current connection, while it does. A new
    /// connection starts unblocked.
    pub(crate) fn blocked_reason(&self) -> Option<String> {
        let state = self.state.borrow();
        match state.phase {
            Phase::Up => state.conn.blocked_reason(),
            _ => None,
        }
    }

    /// The connection once it is up, waiting through a recovery until
    /// `deadline`. Past it, [`Error::ConnectionLost`] with `may_have_arrived`.
    pub(crate) async fn connection(
        &self,
        deadline: Instant,
        may_have_arrived: bool,
    ) -> Result<(amqp::Connection, u64), Error> {
        let mut rx = self.state.subscribe();
        loop {
            {
                let state = rx.borrow_and_update();
                match &state.phase {
                    Phase::Up => return Ok((state.conn.clone(), state.generation)),
                    Phase::Down(err) => return Err(err.clone()),
                    Phase::Recovering => {}
                }
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Closed(CloseReason::ByClient)),
                Err(_) => return Err(Error::ConnectionLost { may_have_arrived }),
            }
        }
    }

    /// Watches the link's snapshots.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Snapshot> {
        self.state.subscribe()
    }

    fn set(&self, conn: Option<amqp::Connection>, phase: Phase) {
        self.state.send_modify(|state| {
            if let Some(conn) = conn {
                state.conn = conn;
                state.generation += 1;
            }
            state.phase = phase;
        });
    }
}

/// Whether `err` means the connection went away under a call (rather than
/// a refusal by the broker, or a close we asked for): a call that failed so
/// can be made again once the connection is back.
pub(crate) fn is_loss(err: &Error) -> bool {
    match err {
        Error::Closed(reason) => *reason != CloseReason::ByClient,
        Error::Io(_) => true,
        Error::Engine(amqp::Error::ChannelNotOpen(_)) => true,
        _ => false,
    }
}

/// Whether `err` says the broker did not answer a call in time: on a
/// connection recovery has just made, the attempt failed (it is closed and
/// tried again), rather than one declaration or consumer.
pub(crate) fn is_silence(err: &Error) -> bool {
    matches!(err, Error::Engine(amqp::Error::NoReply { .. }))
}

/// The redial delays: `first`, doubling up to `max`, each with ±20% jitter.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            next: first,
            max: max.max(first),
        }
    }

    /// The next delay, jittered.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let factor = rand::rng().random_range(0.8..=1.2);
        base.mul_f64(factor)
    }
}

/// What is known of a consumer, for reattaching it: its queue (renamed when
/// a server-named queue is declared anew), its `basic.consume` with the tag
/// the broker first gave, its prefetch, and where a stream consumer is.
pub(crate) struct ConsumerRecord {
    pub(crate) queue: Mutex<String>,
    pub(crate) method: Mutex<BasicConsume>,
    pub(crate) prefetch: u16,
    pub(crate) stream: Mutex<StreamPosition>,
    /// Where the supervisor hands a reattached consumer (or why it could not).
    pub(crate) attach: mpsc::UnboundedSender<Result<Attachment, Error>>,
    /// Set to stop the consumer (by `Consumer::close` or `Conn::close`).
    pub(crate) shutdown: watch::Sender<bool>,
    /// How the consumer ended, once it has.
    pub(crate) ended: watch::Receiver<Option<Result<(), Error>>>,
}

/// A consumer's new channel and deliveries after a recovery.
pub(crate) struct Attachment {
    pub(crate) channel: amqp::Channel,
    pub(crate) deliveries: amqp::Consumer,
    /// The link generation of the connection it is on.
    pub(crate) generation: u64,
}

/// The stream offsets a consumer was given: those still unsettled, and the
/// newest. A reattached stream consumer starts at the oldest unsettled one,
/// or just after the newest (statement 19 of `docs/statements.md`).
#[derive(Debug, Default)]
pub(crate) struct StreamPosition {
    unsettled: std::collections::BTreeMap<i64, u32>,
    newest: Option<i64>,
}

impl StreamPosition {
    /// A delivery at `offset` was given to the consumer.
    pub(crate) fn given(&mut self, offset: i64) {
        *self.unsettled.entry(offset).or_default() += 1;
        self.newest = Some(self.newest.map_or(offset, |n| n.max(offset)));
    }

    /// The delivery at `offset` was settled (or handed back).
    pub(crate) fn settled(&mut self, offset: i64) {
        if let Some(count) = self.unsettled.get_mut(&offset) {
            *count -= 1;
            if *count == 0 {
                self.unsettled.remove(&offset);
            }
        }
    }

    /// Where to resume, if anything was given.
    pub(crate) fn resume_at(&self) -> Option<i64> {
        match self.unsettled.keys().next() {
            Some(&oldest) => Some(oldest),
            None => self.newest.map(|n| n.saturating_add(1)),
        }
    }
}

impl ConsumerRecord {
    /// The `basic.consume` to send now: the recorded one on the current queue
    /// name, with a stream consumer's offset moved to where it stands.
    fn consume_method(&self) -> BasicConsume {
        let mut method = self.method.lock().unwrap_or_else(|p| p.into_inner()).clone();
        method.queue = self.queue.lock().unwrap_or_else(|p| p.into_inner()).as_str().into();
        if let Some(offset) = self.stream.lock().unwrap_or_else(|p| p.into_inner()).resume_at() {
            method.arguments.insert("x-stream-offset", FieldValue::I64(offset));
        }
        method
    }
}

/// Counts, logs and hands an event to `on_recovery`.
pub(crate) fn emit(inner: &Inner, event: RecoveryEvent) {
    metrics::counter!(crate::metrics_names::RECOVERY_TOTAL, "event" => event.label()).increment(1);
    match &event {
        RecoveryEvent::Lost { .. } | RecoveryEvent::GaveUp { .. } => tracing::warn!(%event, "recovery"),
        RecoveryEvent::Retrying { .. } => tracing::info!(%event, "recovery"),
        _ => tracing::info!(%event, "recovery"),
    }
    if let Some(on_recovery) = &inner.config.on_recovery {
        on_recovery(event);
    }
}

/// Returns once the flag is set (or its sender is gone). Owns the watch's
/// guard inside, so a `select!` over it holds nothing across an await.
pub(crate) async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

/// Starts the supervisor of `link`. It holds the `Conn` weakly: when every
/// handle is gone, the connection closes and the supervisor ends.
pub(crate) fn supervise(inner: &Arc<Inner>, link: &'static str) {
    let weak = Arc::downgrade(inner);
    let closing = inner.closing.subscribe();
    tokio::spawn(supervisor(weak, link, closing));
}

fn link_of<'a>(inner: &'a Inner, which: &str) -> &'a Link {
    if which == "publish" {
        &inner.publishing
    } else {
        &inner.consuming
    }
}

/// The connection and what it reports, until it ends; `None` if the `Conn`
/// is gone or closing.
async fn watch_until_lost(
    weak: &Weak<Inner>,
    which: &'static str,
    closing: &mut watch::Receiver<bool>,
) -> Option<CloseReason> {
    let (mut events, mut closed) = {
        let inner = weak.upgrade()?;
        let conn = link_of(&inner, which).current();
        (conn.events(), conn.state.closed.subscribe())
    };
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Ok(ConnectionEvent::Blocked { reason }) => {
                    let inner = weak.upgrade()?;
                    emit(&inner, RecoveryEvent::Blocked { reason });
                }
                Ok(ConnectionEvent::Unblocked) => {
                    let inner = weak.upgrade()?;
                    emit(&inner, RecoveryEvent::Unblocked);
                }
                Ok(ConnectionEvent::Closed(reason)) => return Some(reason),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => {
                    until_set(&mut closed).await;
                    let inner = weak.upgrade()?;
                    return Some(link_of(&inner, which).current().close_reason().unwrap_or(CloseReason::ConnectionLost));
                }
            },
            _ = until_set(closing) => return None,
        }
    }
}

async fn supervisor(weak: Weak<Inner>, which: &'static str, mut closing: watch::Receiver<bool>) {
    loop {
        let Some(reason) = watch_until_lost(&weak, which, &mut closing).await else {
            return;
        };
        let Some(inner) = weak.upgrade() else { return };
        let link = link_of(&inner, which);
        if reason == CloseReason::ByClient || *closing.borrow() {
            link.set(None, Phase::Down(Error::Closed(CloseReason::ByClient)));
            return;
        }
        let lost_at = Instant::now();
        emit(
            &inner,
            RecoveryEvent::Lost {
                which,
                reason: reason.to_string(),
            },
        );
        if inner.config.without_recovery {
            link.set(None, Phase::Down(Error::Closed(reason)));
            return;
        }
        link.set(None, Phase::Recovering);
        drop(inner);
        match redial(&weak, which, &mut closing, lost_at, reason).await {
            Some(true) => continue,
            _ => return,
        }
    }
}

/// Redials until a connection is up and restored (`Some(true)`), recovery
/// gives up (`Some(false)`), or the `Conn` goes (`None`).
async fn redial(
    weak: &Weak<Inner>,
    which: &'static str,
    closing: &mut watch::Receiver<bool>,
    lost_at: Instant,
    reason: CloseReason,
) -> Option<bool> {
    let (mut backoff, give_up) = {
        let inner = weak.upgrade()?;
        let config = &inner.config;
        (
            Backoff::new(config.recovery_delay, config.recovery_delay_max),
            config.recovery_give_up,
        )
    };
    let mut last_error = reason.to_string();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let delay = backoff.next_delay();
        {
            let inner = weak.upgrade()?;
            if give_up.is_some_and(|g| lost_at.elapsed() + delay > g) {
                let error = Error::RecoveryGaveUp {
                    which,
                    attempts: attempt - 1,
                    last_error: last_error.clone(),
                };
                emit(
                    &inner,
                    RecoveryEvent::GaveUp {
                        which,
                        attempts: attempt - 1,
                        error: last_error,
                    },
                );
                link_of(&inner, which).set(None, Phase::Down(error.clone()));
                fail_consumers(&inner, which, &error);
                return Some(false);
            }
            emit(
                &inner,
                RecoveryEvent::Retrying {
                    which,
                    attempt,
                    delay,
                    error: last_error.clone(),
                },
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = until_set(closing) => return stop(weak, which),
        }
        let (url, engine) = {
            let inner = weak.upgrade()?;
            (inner.url.clone(), inner.engine_config(which))
        };
        let dialled = tokio::select! {
            dialled = amqp::Connection::open_url(&url, engine) => dialled,
            _ = until_set(closing) => return stop(weak, which),
        };
        let conn = match dialled {
            Ok(conn) => conn,
            Err(err) => {
                last_error = err.to_string();
                continue;
            }
        };
        let inner = weak.upgrade()?;
        // The restore's calls are each bounded by `call_timeout`; the whole
        // of it, by what is left of `recovery_give_up`, so that a broker
        // that answers the handshake and then nothing cannot keep recovery
        // from giving up.
        let restored = match give_up {
            Some(give_up) => tokio::time::timeout_at(lost_at + give_up, restore(&inner, which, &conn))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Engine(amqp::Error::Timeout(
                        give_up.saturating_sub(lost_at.elapsed().min(give_up)),
                    )))
                }),
            None => restore(&inner, which, &conn).await,
        };
        match restored {
            Ok((consumers, failed)) => {
                if *closing.borrow() {
                    let _ = conn.close().await;
                    return stop(weak, which);
                }
                link_of(&inner, which).set(Some(conn), Phase::Up);
                emit(
                    &inner,
                    RecoveryEvent::Recovered {
                        which,
                        downtime: lost_at.elapsed(),
                        consumers,
                        failed,
                    },
                );
                return Some(true);
            }
            Err(err) => {
                tracing::warn!(which, %err, "the new connection failed while it was being restored");
                last_error = err.to_string();
                let _ = conn.close().await;
            }
        }
    }
}

fn stop(weak: &Weak<Inner>, which: &'static str) -> Option<bool> {
    let inner = weak.upgrade()?;
    link_of(&inner, which).set(None, Phase::Down(Error::Closed(CloseReason::ByClient)));
    None
}

/// Every consumer of the consuming link hears that recovery gave up.
fn fail_consumers(inner: &Inner, which: &str, error: &Error) {
    if which != "consume" {
        return;
    }
    for record in inner.consumer_records() {
        let _ = record.attach.send(Err(error.clone()));
    }
}

/// Restores what `which` had on the new connection `conn`. Returns how many
/// consumers were reattached and what could not be restored. An error means
/// the new connection itself failed (the attempt is retried).
async fn restore(inner: &Inner, which: &'static str, conn: &amqp::Connection) -> Result<(usize, Vec<String>), Error> {
    if which == "publish" {
        inner.publish_channel.reopen_on(conn).await?;
        inner.library_channel.reopen_on(conn).await?;
        return Ok((0, Vec::new()));
    }
    let mut failed = Vec::new();
    redeclare(inner, conn, &mut failed).await?;
    let mut reattached = 0;
    let generation = inner.consuming.state.borrow().generation + 1;
    for record in inner.consumer_records() {
        let queue = record.queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match reattach(conn, &record, generation).await {
            Ok(attachment) => {
                if record.attach.send(Ok(attachment)).is_ok() {
                    reattached += 1;
                }
            }
            Err(err) if is_loss(&err) || is_silence(&err) => return Err(err),
            Err(err) => {
                failed.push(format!("consumer of {queue}: {err}"));
                let _ = record.attach.send(Err(err));
            }
        }
    }
    Ok((reattached, failed))
}

/// Channel, `basic.qos`, then `basic.consume` with the recorded tag, on the
/// connection of link generation `generation`.
pub(crate) async fn reattach(
    conn: &amqp::Connection,
    record: &ConsumerRecord,
    generation: u64,
) -> Result<Attachment, Error> {
    let channel = conn.channel().await?;
    channel.qos(record.prefetch).await?;
    let deliveries = channel.basic_consume(record.consume_method()).await?;
    Ok(Attachment {
        channel,
        deliveries,
        generation,
    })
}

/// Replays every recorded declaration in order. A server-named queue is
/// declared anew; its new name replaces the old in later bindings and in
/// consumers, and is reported. A refused declaration is listed in `failed`.
async fn redeclare(inner: &Inner, conn: &amqp::Connection, failed: &mut Vec<String>) -> Result<(), Error> {
    let declarations = inner.declarations();
    let mut channel = conn.channel().await?;
    let mut renames: Vec<(String, String)> = Vec::new();
    for mut declaration in declarations {
        declaration.rename_queues(&renames);
        match declaration.apply(&channel).await {
            Ok(new_name) => {
                if let (Declaration::ServerNamedQueue { name, .. }, Some(new_name)) = (&declaration, new_name) {
                    if *name != new_name {
                        renames.push((name.clone(), new_name.clone()));
                        inner.rename_queue(name, &new_name);
                        emit(
                            inner,
                            RecoveryEvent::QueueRenamed {
                                from: name.clone(),
                                to: new_name,
                            },
                        );
                    }
                }
            }
            Err(err) if (is_loss(&err) && conn.is_closed()) || is_silence(&err) => return Err(err),
            Err(err) => {
                failed.push(format!("{declaration:?}: {err}"));
                channel = conn.channel().await?;
            }
        }
    }
    let _ = channel.close().await;
    Ok(())
}

/// The consumer tag the broker gave, recorded so the consumer comes back
/// under the same tag.
pub(crate) fn with_tag(mut method: BasicConsume, tag: &ShortString) -> BasicConsume {
    method.consumer_tag = tag.clone();
    method
}

/// A channel that is reopened when the broker closes it (a refused publish
/// closes the channel it was on), or on the new connection after a recovery.
pub(crate) struct ChannelSlot {
    confirm: bool,
    current: RwLock<amqp::Channel>,
    reopen: tokio::sync::Mutex<()>,
}

impl ChannelSlot {
    pub(crate) async fn open(conn: &amqp::Connection, confirm: bool) -> Result<ChannelSlot, Error> {
        let channel = Self::fresh(conn, confirm).await?;
        Ok(ChannelSlot {
            confirm,
            current: RwLock::new(channel),
            reopen: tokio::sync::Mutex::new(()),
        })
    }

    async fn fresh(conn: &amqp::Connection, confirm: bool) -> Result<amqp::Channel, Error> {
        let channel = conn.channel().await?;
        if confirm {
            channel.confirm_select().await?;
        }
        Ok(channel)
    }

    fn current(&self) -> amqp::Channel {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes on the current channel if that can be done at once: the
    /// channel open, room in the publish buffer. Takes no handle of the
    /// channel and reads no clock: the common case of a send. `None` when
    /// it cannot be done now; then nothing was published.
    pub(crate) fn publish_now(
        &self,
        publish: &BasicPublish,
        properties: &Arc<BasicProperties>,
        body: &Bytes,
    ) -> Option<amqp::PublishConfirm> {
        let channel = self.current.read().unwrap_or_else(|p| p.into_inner());
        if !channel.is_open() {
            return None;
        }
        channel.publish_shared(publish, properties, body).queued()
    }

    /// The channel, reopened first if the broker closed it; while `link`
    /// recovers, waits for it (at most `timeout`; `written` says whether the
    /// message waiting may already have arrived).
    pub(crate) async fn get(&self, link: &Link, timeout: Duration, written: bool) -> Result<amqp::Channel, Error> {
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        // Not under the lock: the supervisor takes it to reopen the channel
        // on the new connection before it says the link is up.
        let (conn, _) = link.connection(Instant::now() + timeout, written).await?;
        let _one_at_a_time = self.reopen.lock().await;
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        let channel = Self::fresh(&conn, self.confirm).await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = channel.clone();
        Ok(channel)
    }

    /// Opens the channel on `conn`, a connection recovery has just dialled.
    pub(crate) async fn reopen_on(&self, conn: &amqp::Connection) -> Result<(), Error> {
        let _one_at_a_time = self.reopen.lock().await;
        let channel = Self::fresh(conn, self.confirm).await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = channel;
        Ok(())
    }
}

/// What a `Conn` shares between its handles, its supervisors and its
/// consumers.
pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) confirms: bool,
    pub(crate) url: AmqpUrl,
    pub(crate) publishing: Link,
    pub(crate) consuming: Link,
    pub(crate) publish_channel: ChannelSlot,
    pub(crate) library_channel: ChannelSlot,
    /// Everything declared through this connection, for recovery to replay.
    pub(crate) declared: Mutex<Vec<Declaration>>,
    /// The running consumers, for recovery to reattach and `close` to drain.
    pub(crate) consumers: Mutex<Vec<Arc<ConsumerRecord>>>,
    /// Set by [`Conn::close`]: supervisors stop.
    pub(crate) closing: watch::Sender<bool>,
}

impl Inner {
    /// The engine settings of the `which` connection.
    pub(crate) fn engine_config(&self, which: &str) -> amqp::Config {
        engine_config(&self.config, which)
    }

    pub(crate) fn declarations(&self) -> Vec<Declaration> {
        lock(&self.declared).clone()
    }

    pub(crate) fn consumer_records(&self) -> Vec<Arc<ConsumerRecord>> {
        lock(&self.consumers).clone()
    }

    /// A server-named queue got a new name: its recorded declaration, its
    /// bindings and its consumers take it.
    pub(crate) fn rename_queue(&self, from: &str, to: &str) {
        let renames = [(from.to_string(), to.to_string())];
        for declaration in lock(&self.declared).iter_mut() {
            match declaration {
                Declaration::ServerNamedQueue { name, .. } if name == from => *name = to.to_string(),
                other => other.rename_queues(&renames),
            }
        }
        for record in lock(&self.consumers).iter() {
            let mut queue = lock(&record.queue);
            if *queue == from {
                *queue = to.to_string();
            }
        }
    }

    /// Runs `call` on the consuming connection of the moment, waiting
    /// through a recovery; a call that the loss of its connection cut short
    /// is made again on the next one, until `publish_timeout`. Returns the
    /// result and the link generation of the connection it ran on.
    pub(crate) async fn on_consuming<T, F, Fut>(&self, mut call: F) -> Result<(T, u64), Error>
    where
        F: FnMut(amqp::Connection) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let deadline = Instant::now() + self.config.publish_timeout;
        loop {
            let (conn, generation) = self.consuming.connection(deadline, false).await?;
            match call(conn).await {
                Err(err) if !self.config.without_recovery && is_loss(&err) && Instant::now() < deadline => {
                    tracing::debug!(%err, "the consuming connection failed under a call; trying again");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other.map(|value| (value, generation)),
            }
        }
    }

    pub(crate) fn add_consumer(&self, record: Arc<ConsumerRecord>) {
        lock(&self.consumers).push(record);
    }

    pub(crate) fn remove_consumer(&self, record: &Arc<ConsumerRecord>) {
        lock(&self.consumers).retain(|r| !Arc::ptr_eq(r, record));
    }
}

/// The engine settings of the `which` connection (`publish` or `consume`):
/// the `Conn`'s, with the connection named after it.
pub(crate) fn engine_config(config: &Config, which: &str) -> amqp::Config {
    amqp::Config {
        tls: config.tls.clone(),
        connection_name: Some(match &config.connection_name {
            Some(name) => format!("{name}-{which}"),
            None => format!("acemq-{which}"),
        }),
        ..config.engine.clone()
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_both_ways() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let bases = [1.0, 2.0, 4.0, 4.0, 4.0];
        let mut below = false;
        let mut above = false;
        for _ in 0..200 {
            let mut b = backoff.clone();
            for base in bases {
                let d = b.next_delay().as_secs_f64();
                assert!(d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9, "{d} around {base}");
                below |= d < base;
                above |= d > base;
            }
        }
        assert!(below && above, "jitter goes both ways");
        assert!(backoff.next_delay() <= Duration::from_secs_f64(1.2));
    }

    #[test]
    fn a_stream_consumer_resumes_at_its_oldest_unsettled_offset_or_after_its_newest() {
        let mut at = StreamPosition::default();
        assert_eq!(at.resume_at(), None);
        for offset in [10, 11, 12] {
            at.given(offset);
        }
        at.settled(10);
        at.settled(12);
        assert_eq!(at.resume_at(), Some(11));
        at.settled(11);
        assert_eq!(at.resume_at(), Some(13));
    }
}
