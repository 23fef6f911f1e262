//! `Conn`: the acemq API's connection. It keeps separate AMQP connections for
//! publishing and for consuming (RabbitMQ stops reading a blocked connection
//! entirely, and acks must keep flowing while publishing is blocked), one
//! channel for the application's publishes, and one always-confirmed channel
//! for what the library publishes on its own behalf. Each connection has a
//! supervisor (`recovery.rs`) that brings it back after a loss.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use amqp_codec::{BasicProperties, BasicPublish, FieldTable};
use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::amqp::{self, AmqpUrl, TlsConfig};
use crate::confirm::{outcome_label, settle, SendResult};
use crate::declaration::Declaration;
use crate::error::Error;
use crate::publish::Flight;
use crate::recovery::{supervise, ConsumerRecord, Link};

/// What happened to a connection, for [`Config::on_recovery`] and
/// `acemq_recovery_total{event}` (the event's [`RecoveryEvent::label`]).
/// `which` is `publish` or `consume`: the two connections of a [`Conn`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryEvent {
    /// A connection was lost: a socket error or EOF, a `connection.close`
    /// from the broker, or two heartbeat intervals of silence.
    Lost {
        /// Which of the two connections.
        which: &'static str,
        /// Why.
        reason: String,
    },
    /// A redial is about to be tried after `delay`.
    Retrying {
        /// Which of the two connections.
        which: &'static str,
        /// 1 for the first redial.
        attempt: u32,
        /// The wait before it (backoff with jitter).
        delay: Duration,
        /// Why the last try failed (or why the connection was lost).
        error: String,
    },
    /// The connection is back and restored.
    Recovered {
        /// Which of the two connections.
        which: &'static str,
        /// From the loss to now.
        downtime: Duration,
        /// How many consumers were reattached.
        consumers: usize,
        /// What could not be restored (declarations, consumers), and why. A
        /// consumer listed here ends with the error ([`crate::Consumer::closed`]).
        failed: Vec<String>,
    },
    /// Recovery stopped after `recovery_give_up`: every consumer and pending
    /// send on that connection fails.
    GaveUp {
        /// Which of the two connections.
        which: &'static str,
        /// How many redials were tried.
        attempts: u32,
        /// Why the last one failed.
        error: String,
    },
    /// A server-named queue was declared anew and got a new name; its
    /// bindings and consumers now use it.
    QueueRenamed {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
    },
    /// The broker blocked publishing.
    Blocked {
        /// The broker's reason.
        reason: String,
    },
    /// The broker unblocked publishing.
    Unblocked,
}

impl RecoveryEvent {
    /// The `event` label of `acemq_recovery_total`.
    pub fn label(&self) -> &'static str {
        match self {
            RecoveryEvent::Lost { .. } => "lost",
            RecoveryEvent::Retrying { .. } => "retrying",
            RecoveryEvent::Recovered { .. } => "recovered",
            RecoveryEvent::GaveUp { .. } => "gave_up",
            RecoveryEvent::QueueRenamed { .. } => "queue_renamed",
            RecoveryEvent::Blocked { .. } => "blocked",
            RecoveryEvent::Unblocked => "unblocked",
        }
    }
}

impl std::fmt::Display for RecoveryEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryEvent::Lost { which, reason } => write!(f, "lost the {which} connection: {reason}"),
            RecoveryEvent::Retrying {
                which,
                attempt,
                delay,
                error,
            } => write!(
                f,
                "redialling the {which} connection (attempt {attempt}) in {delay:?} after: {error}"
            ),
            RecoveryEvent::Recovered {
                which,
                downtime,
                consumers,
                failed,
            } => {
                write!(
                    f,
                    "recovered the {which} connection after {downtime:?}, {consumers} consumers reattached"
                )?;
                if !failed.is_empty() {
                    write!(f, "; not restored: {}", failed.join("; "))?;
                }
                Ok(())
            }
            RecoveryEvent::GaveUp { which, attempts, error } => {
                write!(
                    f,
                    "gave up recovering the {which} connection after {attempts} attempts: {error}"
                )
            }
            RecoveryEvent::QueueRenamed { from, to } => write!(f, "server-named queue {from} is now {to}"),
            RecoveryEvent::Blocked { reason } => write!(f, "publishing blocked by the broker: {reason}"),
            RecoveryEvent::Unblocked => f.write_str("publishing unblocked"),
        }
    }
}

/// A callback for [`RecoveryEvent`]s.
pub type OnRecovery = Arc<dyn Fn(RecoveryEvent) + Send + Sync>;

/// How a [`Conn`] behaves.
#[derive(Clone)]
pub struct Config {
    /// Publish without publisher confirms: `send` returns once the bytes are
    /// queued, `SendResult::confirmed` is false and `routed` is always true.
    /// Library publishes stay confirmed. `memory://name?confirms=off` and
    /// `?confirms=off` on any URL set this too.
    pub without_confirms: bool,
    /// How long a publish already written waits for its confirm while the
    /// broker keeps the connection blocked (30 s, as in the Java client).
    pub blocked_timeout: Duration,
    /// The first delay before redialling a lost connection (1 s); each
    /// further attempt waits twice as long, up to `recovery_delay_max`, with
    /// ±20% jitter.
    pub recovery_delay: Duration,
    /// The longest wait between redials (30 s).
    pub recovery_delay_max: Duration,
    /// How long after a loss recovery stops trying ([`RecoveryEvent::GaveUp`]);
    /// `None` (the default) tries for ever.
    pub recovery_give_up: Option<Duration>,
    /// How long a send waits for a connection that is recovering, in total
    /// for one message, before it fails with [`Error::ConnectionLost`] (30 s).
    pub publish_timeout: Duration,
    /// Called with every [`RecoveryEvent`].
    pub on_recovery: Option<OnRecovery>,
    /// Turns recovery off: a lost connection stays lost, sends fail with
    /// [`Error::Closed`], and a consumer whose connection died ends with
    /// that error ([`crate::Consumer::closed`]).
    pub without_recovery: bool,
    /// TLS settings for `amqps://`.
    pub tls: TlsConfig,
    /// A name for the connections in RabbitMQ's management UI (suffixed
    /// `-publish` and `-consume`).
    pub connection_name: Option<String>,
    /// Engine settings (tuning, timeouts) for both connections.
    pub engine: amqp::Config,
    /// The retry policy of consumers that set none (without one, a retry is
    /// republished at once, without limit).
    pub retry: Option<crate::retry::RetryPolicy>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            without_confirms: false,
            blocked_timeout: Duration::from_secs(30),
            recovery_delay: Duration::from_secs(1),
            recovery_delay_max: Duration::from_secs(30),
            recovery_give_up: None,
            publish_timeout: Duration::from_secs(30),
            on_recovery: None,
            without_recovery: false,
            tls: TlsConfig::new(),
            connection_name: None,
            engine: amqp::Config::default(),
            retry: None,
        }
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("without_confirms", &self.without_confirms)
            .field("blocked_timeout", &self.blocked_timeout)
            .field("recovery_delay", &self.recovery_delay)
            .field("recovery_delay_max", &self.recovery_delay_max)
            .field("recovery_give_up", &self.recovery_give_up)
            .field("publish_timeout", &self.publish_timeout)
            .field("on_recovery", &self.on_recovery.is_some())
            .field("without_recovery", &self.without_recovery)
            .field("tls", &self.tls)
            .field("connection_name", &self.connection_name)
            .finish()
    }
}

/// A channel that is reopened when the broker closes it (a refused publish
/// closes the channel it was on), or on the new connection after a recovery.
pub(crate) struct ChannelSlot {
    confirm: bool,
    current: RwLock<amqp::Channel>,
    reopen: tokio::sync::Mutex<()>,
}

impl ChannelSlot {
    async fn open(conn: &amqp::Connection, confirm: bool) -> Result<ChannelSlot, Error> {
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

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) confirms: bool,
    pub(crate) url: AmqpUrl,
    pub(crate) publishing: Link,
    pub(crate) consuming: Link,
    pub(crate) publish_channel: ChannelSlot,
    pub(crate) library_channel: ChannelSlot,
    /// Everything declared through this connection, for recovery to replay.
    declared: Mutex<Vec<Declaration>>,
    /// The running consumers, for recovery to reattach and `close` to drain.
    consumers: Mutex<Vec<Arc<ConsumerRecord>>>,
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

    pub(crate) fn add_consumer(&self, record: Arc<ConsumerRecord>) {
        lock(&self.consumers).push(record);
    }

    pub(crate) fn remove_consumer(&self, record: &Arc<ConsumerRecord>) {
        lock(&self.consumers).retain(|r| !Arc::ptr_eq(r, record));
    }
}

/// The engine settings of the `which` connection (`publish` or `consume`):
/// the `Conn`'s, with the connection named after it.
fn engine_config(config: &Config, which: &str) -> amqp::Config {
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

/// A connection to RabbitMQ (or an in-process acemq-memory broker) for the
/// acemq API: two AMQP connections, each under a supervisor that recovers it
/// when it is lost (see [`Config::recovery_delay`] and [`RecoveryEvent`]).
/// Cheap to clone.
#[derive(Clone)]
pub struct Conn {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("confirms", &self.inner.confirms)
            .field("blocked", &self.is_blocked())
            .finish()
    }
}

impl Conn {
    /// Connects to `amqp://`, `amqps://` or `memory://name[?confirms=off]`.
    /// Several hosts in the URL are tried in turn, now and on every redial.
    pub async fn open(url: &str, config: Config) -> Result<Conn, Error> {
        let parsed: AmqpUrl = url.parse().map_err(|e: amqp::UrlError| Error::Engine(e.into()))?;
        let confirms = !config.without_confirms && parsed.confirms != Some(false);
        let publishing = amqp::Connection::open_url(&parsed, engine_config(&config, "publish")).await?;
        let consuming = amqp::Connection::open_url(&parsed, engine_config(&config, "consume")).await?;
        let publish_channel = ChannelSlot::open(&publishing, confirms).await?;
        let library_channel = ChannelSlot::open(&publishing, true).await?;
        let inner = Arc::new(Inner {
            config,
            confirms,
            url: parsed,
            publishing: Link::new("publish", publishing),
            consuming: Link::new("consume", consuming),
            publish_channel,
            library_channel,
            declared: Mutex::new(Vec::new()),
            consumers: Mutex::new(Vec::new()),
            closing: watch::channel(false).0,
        });
        supervise(&inner, "publish");
        supervise(&inner, "consume");
        Ok(Conn { inner })
    }

    /// Whether application publishes are confirmed.
    pub fn confirms(&self) -> bool {
        self.inner.confirms
    }

    /// Whether the broker has blocked the publishing connection. A
    /// recovered connection starts unblocked.
    pub fn is_blocked(&self) -> bool {
        self.inner.publishing.blocked_reason().is_some()
    }

    /// Whether both connections are up (not recovering, not closed).
    pub fn is_connected(&self) -> bool {
        self.inner.publishing.is_up() && self.inner.consuming.is_up()
    }

    /// The engine connection used for publishing at this moment (after a
    /// recovery, the new one).
    pub fn publishing_connection(&self) -> amqp::Connection {
        self.inner.publishing.current()
    }

    /// The engine connection used for consuming at this moment.
    pub fn consuming_connection(&self) -> amqp::Connection {
        self.inner.consuming.current()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// What has been declared through this connection (by [`crate::Topology`],
    /// by consumers and by [`Conn::declare_server_named_queue`]), in order,
    /// with server-named queues under their current names.
    pub fn declared(&self) -> Vec<Declaration> {
        self.inner.declarations()
    }

    pub(crate) fn record_declarations(&self, declarations: &[Declaration]) {
        let mut declared = lock(&self.inner.declared);
        for d in declarations {
            if !declared.contains(d) {
                declared.push(d.clone());
            }
        }
    }

    /// Declares a server-named queue (exclusive to the consuming connection,
    /// deleted with it) and returns its name. It is recorded like every
    /// declaration: after a recovery it is declared anew, its new name goes
    /// to its bindings (declared after it) and its consumers, and
    /// [`RecoveryEvent::QueueRenamed`] reports it.
    pub async fn declare_server_named_queue(&self, arguments: FieldTable) -> Result<String, Error> {
        let declaration = Declaration::ServerNamedQueue {
            name: String::new(),
            arguments,
        };
        let ch = self.consuming_connection().channel().await?;
        let name = declaration.apply(&ch).await?.unwrap_or_default();
        let _ = ch.close().await;
        let Declaration::ServerNamedQueue { arguments, .. } = declaration else {
            unreachable!("built above")
        };
        self.record_declarations(&[Declaration::ServerNamedQueue {
            name: name.clone(),
            arguments,
        }]);
        Ok(name)
    }

    /// Closes the `Conn`: stops a recovery in progress, closes every
    /// consumer it started (each drains as [`crate::Consumer::close`] says),
    /// then closes both connections.
    pub async fn close(&self) -> Result<(), Error> {
        self.inner.closing.send_replace(true);
        let records = self.inner.consumer_records();
        for record in &records {
            record.shutdown.send_replace(true);
        }
        for record in records {
            let mut ended = record.ended.clone();
            let _ = ended.wait_for(Option::is_some).await;
        }
        let publishing = self.inner.publishing.current().close().await;
        let consuming = self.inner.consuming.current().close().await;
        publishing?;
        consuming?;
        Ok(())
    }

    /// Publishes raw bytes on the library's own channel, which is always
    /// confirmed, even on a connection without confirms: what acemq uses for
    /// retry and rung hops, set-asides and replays, and what you can use for
    /// a hop of your own that must not go unconfirmed. Returns once the
    /// broker has confirmed it; a nack or (with `mandatory`) a return is an
    /// error. The message id in `properties` names it in errors. It rides
    /// through a recovery as [`crate::Publisher::send`] does.
    pub async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: BasicProperties,
        body: Bytes,
    ) -> Result<(), Error> {
        let message_id = properties
            .message_id
            .as_ref()
            .map(|id| id.to_string())
            .unwrap_or_default();
        let publish = BasicPublish {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            mandatory,
            ..Default::default()
        };
        let result = self.publish_library(publish, properties, body, &message_id).await;
        crate::metrics_names::publish(outcome_label(result.as_ref()));
        result.map(|_| ())
    }

    /// A library hop. While the broker blocks publishing, it waits for the
    /// block to lift (the delivery it is for is held meanwhile, instead of
    /// going back to the broker and round again), at most `blocked_timeout`;
    /// then it fails with [`Error::PublishingPaused`].
    pub(crate) async fn publish_library(
        &self,
        publish: BasicPublish,
        properties: BasicProperties,
        body: Bytes,
        message_id: &str,
    ) -> Result<SendResult, Error> {
        self.wait_unblocked().await?;
        let (exchange, routing_key) = (publish.exchange.clone(), publish.routing_key.clone());
        let flight = Flight::library(publish, properties, body);
        let confirmation = flight.confirmed(self, message_id).await?;
        match settle(confirmation, message_id, &exchange, &routing_key)? {
            SendResult { confirmed: false, .. } => Err(Error::LibraryChannelUnconfirmed {
                message_id: message_id.to_owned(),
            }),
            confirmed => Ok(confirmed),
        }
    }

    /// Returns once the publishing connection is not blocked, or fails with
    /// [`Error::PublishingPaused`] after `blocked_timeout` of block.
    async fn wait_unblocked(&self) -> Result<(), Error> {
        let Some(reason) = self.inner.publishing.blocked_reason() else {
            return Ok(());
        };
        let mut blocked = self.inner.publishing.current().blocked_changes();
        let timeout = self.inner.config.blocked_timeout;
        let lifted = tokio::time::timeout(timeout, async {
            let _ = blocked.wait_for(Option::is_none).await;
        })
        .await;
        lifted.map_err(|_| Error::PublishingPaused { reason })
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Conn>();
}
