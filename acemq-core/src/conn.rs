//! `Conn`: the acemq API's connection. It keeps separate AMQP connections for
//! publishing and for consuming (RabbitMQ stops reading a blocked connection
//! entirely, and acks must keep flowing while publishing is blocked), one
//! channel for the application's publishes, and one always-confirmed channel
//! for what the library publishes on its own behalf.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use amqp_codec::{BasicProperties, BasicPublish};
use bytes::Bytes;
use tokio::sync::watch;

use crate::amqp::{self, AmqpUrl, ConnectionEvent, TlsConfig};
use crate::confirm::{await_confirm, outcome_label, settle, SendResult};
use crate::declaration::Declaration;
use crate::error::Error;
use crate::proto::CloseReason;

/// What happened to a connection, for [`Config::on_recovery`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryEvent {
    /// A connection was lost (`which` is `publish` or `consume`).
    Lost {
        /// Which of the two connections.
        which: &'static str,
        /// Why.
        reason: String,
    },
    /// The broker blocked publishing.
    Blocked {
        /// The broker's reason.
        reason: String,
    },
    /// The broker unblocked publishing.
    Unblocked,
}

impl std::fmt::Display for RecoveryEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryEvent::Lost { which, reason } => write!(f, "lost the {which} connection: {reason}"),
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
    /// The first delay before redialling a lost connection.
    ///
    /// Not honoured yet: connection recovery arrives with its own issue. A
    /// lost connection is reported ([`RecoveryEvent::Lost`]) and stays lost.
    pub recovery_delay: Duration,
    /// Called with every [`RecoveryEvent`]: today losses and blocks; redial
    /// attempts once recovery lands.
    pub on_recovery: Option<OnRecovery>,
    /// Turns recovery off. Not honoured yet (see `recovery_delay`): today
    /// there is no recovery to turn off.
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
            .field("on_recovery", &self.on_recovery.is_some())
            .field("without_recovery", &self.without_recovery)
            .field("tls", &self.tls)
            .field("connection_name", &self.connection_name)
            .finish()
    }
}

/// A channel that is reopened when the broker closes it (a refused publish
/// closes the channel it was on).
pub(crate) struct ChannelSlot {
    conn: amqp::Connection,
    confirm: bool,
    current: RwLock<amqp::Channel>,
    reopen: tokio::sync::Mutex<()>,
}

impl ChannelSlot {
    async fn open(conn: amqp::Connection, confirm: bool) -> Result<ChannelSlot, Error> {
        let channel = Self::fresh(&conn, confirm).await?;
        Ok(ChannelSlot {
            conn,
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

    /// The channel, reopened first if the broker closed it.
    pub(crate) async fn get(&self) -> Result<amqp::Channel, Error> {
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        let _one_at_a_time = self.reopen.lock().await;
        let channel = self.current();
        if channel.is_open() {
            return Ok(channel);
        }
        let channel = Self::fresh(&self.conn, self.confirm).await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = channel.clone();
        Ok(channel)
    }
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) confirms: bool,
    pub(crate) publishing: amqp::Connection,
    pub(crate) consuming: amqp::Connection,
    pub(crate) publish_channel: ChannelSlot,
    pub(crate) library_channel: ChannelSlot,
    /// Everything declared through this connection, for recovery to replay.
    pub(crate) declared: std::sync::Mutex<Vec<Declaration>>,
}

/// A connection to RabbitMQ (or an in-process acemq-memory broker) for the
/// acemq API. Cheap to clone.
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
    pub async fn open(url: &str, config: Config) -> Result<Conn, Error> {
        let parsed: AmqpUrl = url.parse().map_err(|e: amqp::UrlError| Error::Engine(e.into()))?;
        let confirms = !config.without_confirms && parsed.confirms != Some(false);
        let engine = |suffix: &str| amqp::Config {
            tls: config.tls.clone(),
            connection_name: Some(match &config.connection_name {
                Some(name) => format!("{name}-{suffix}"),
                None => format!("acemq-{suffix}"),
            }),
            ..config.engine.clone()
        };
        let publishing = amqp::Connection::open_url(&parsed, engine("publish")).await?;
        let consuming = amqp::Connection::open_url(&parsed, engine("consume")).await?;
        let publish_channel = ChannelSlot::open(publishing.clone(), confirms).await?;
        let library_channel = ChannelSlot::open(publishing.clone(), true).await?;
        if let Some(on_recovery) = &config.on_recovery {
            watch_connection(publishing.clone(), "publish", on_recovery.clone());
            watch_connection(consuming.clone(), "consume", on_recovery.clone());
        }
        Ok(Conn {
            inner: Arc::new(Inner {
                config,
                confirms,
                publishing,
                consuming,
                publish_channel,
                library_channel,
                declared: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }

    /// Whether application publishes are confirmed.
    pub fn confirms(&self) -> bool {
        self.inner.confirms
    }

    /// Whether the broker has blocked the publishing connection.
    pub fn is_blocked(&self) -> bool {
        self.inner.publishing.is_blocked()
    }

    /// The engine connection used for publishing.
    pub fn publishing_connection(&self) -> &amqp::Connection {
        &self.inner.publishing
    }

    /// The engine connection used for consuming.
    pub fn consuming_connection(&self) -> &amqp::Connection {
        &self.inner.consuming
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// What has been declared through this connection (by [`crate::Topology`]
    /// and by consumers), in order.
    pub fn declared(&self) -> Vec<Declaration> {
        self.inner.declared.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn record_declarations(&self, declarations: &[Declaration]) {
        let mut declared = self.inner.declared.lock().unwrap_or_else(|p| p.into_inner());
        for d in declarations {
            if !declared.contains(d) {
                declared.push(d.clone());
            }
        }
    }

    /// Closes both connections.
    pub async fn close(&self) -> Result<(), Error> {
        let publishing = self.inner.publishing.close().await;
        let consuming = self.inner.consuming.close().await;
        publishing?;
        consuming?;
        Ok(())
    }

    /// Publishes raw bytes on the library's own channel, which is always
    /// confirmed, even on a connection without confirms: what acemq uses for
    /// retry and rung hops, set-asides and replays, and what you can use for
    /// a hop of your own that must not go unconfirmed. Returns once the
    /// broker has confirmed it; a nack or (with `mandatory`) a return is an
    /// error. The message id in `properties` names it in errors.
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

    pub(crate) async fn publish_library(
        &self,
        publish: BasicPublish,
        properties: BasicProperties,
        body: Bytes,
        message_id: &str,
    ) -> Result<SendResult, Error> {
        if let Some(reason) = self.inner.publishing.blocked_reason() {
            return Err(Error::PublishingPaused { reason });
        }
        let (exchange, routing_key) = (publish.exchange.clone(), publish.routing_key.clone());
        let channel = self.inner.library_channel.get().await?;
        let pending = channel.basic_publish(publish, properties, body)?;
        let mut blocked = self.inner.publishing.blocked_changes();
        let confirmation = await_confirm(pending, &mut blocked, self.inner.config.blocked_timeout, message_id).await?;
        match settle(confirmation, message_id, &exchange, &routing_key)? {
            SendResult { confirmed: false, .. } => Err(Error::LibraryChannelUnconfirmed {
                message_id: message_id.to_owned(),
            }),
            confirmed => Ok(confirmed),
        }
    }
}

fn watch_connection(conn: amqp::Connection, which: &'static str, on_recovery: OnRecovery) {
    let mut events = conn.events();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(ConnectionEvent::Blocked { reason }) => on_recovery(RecoveryEvent::Blocked { reason }),
                Ok(ConnectionEvent::Unblocked) => on_recovery(RecoveryEvent::Unblocked),
                Ok(ConnectionEvent::Closed(reason)) => {
                    if reason != CloseReason::ByClient {
                        on_recovery(RecoveryEvent::Lost {
                            which,
                            reason: reason.to_string(),
                        });
                    }
                    break;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => break,
            }
        }
    });
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Conn>();
    check::<watch::Receiver<bool>>();
}
