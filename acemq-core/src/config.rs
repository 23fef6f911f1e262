//! What a `Conn` is told (`Config`) and what it tells (`RecoveryEvent`).
//! A leaf: the connection, its supervisors and the consumers all read it,
//! and it reads none of them. One home per setting: what the engine is told
//! (TLS and the connection name too) lives in `Config::engine` only, never
//! in a second field that would override it.

use std::sync::Arc;
use std::time::Duration;

use crate::amqp::{self, CredentialsProvider, TlsConfig};

/// What happened to a connection, for [`Config::on_recovery`] and
/// `acemq_recovery_total{event}` (the event's [`RecoveryEvent::label`]).
/// `which` is `publish` or `consume`: the two connections of a [`crate::Conn`].
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
    /// The broker cancelled a consumer (`basic.cancel`: its queue was
    /// deleted, or lost its leader) or closed its channel (e.g. 406
    /// PRECONDITION_FAILED when a delivery was not acknowledged within
    /// RabbitMQ's `consumer_timeout`). Deliveries from that channel can no
    /// longer be settled: their acks are dropped and counted
    /// (`settlement_dropped`), and the broker redelivers them.
    ConsumerCancelled {
        /// The queue.
        queue: String,
        /// The broker's reason (its reply code and text for a closed channel).
        reason: String,
        /// Whether the consumer subscribes again (the default) or ends
        /// ([`crate::OnCancel::End`]).
        resubscribing: bool,
    },
    /// A cancelled consumer is subscribed again, on a new channel, with its
    /// tag, arguments and prefetch.
    ConsumerResubscribed {
        /// The queue.
        queue: String,
        /// Why it had been cancelled.
        reason: String,
        /// How many tries it took (each after the recovery backoff).
        attempts: u32,
    },
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
            RecoveryEvent::ConsumerCancelled { .. } => "consumer_cancelled",
            RecoveryEvent::ConsumerResubscribed { .. } => "consumer_resubscribed",
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
            RecoveryEvent::ConsumerCancelled {
                queue,
                reason,
                resubscribing,
            } => {
                write!(f, "the consumer of {queue} was cancelled by the broker: {reason}")?;
                f.write_str(if *resubscribing {
                    "; subscribing again"
                } else {
                    "; it ends"
                })
            }
            RecoveryEvent::ConsumerResubscribed {
                queue,
                reason,
                attempts,
            } => write!(
                f,
                "the consumer of {queue} is subscribed again after {attempts} attempts (cancelled: {reason})"
            ),
        }
    }
}

/// A callback for [`RecoveryEvent`]s.
pub type OnRecovery = Arc<dyn Fn(RecoveryEvent) + Send + Sync>;

/// How a [`crate::Conn`] behaves.
///
/// `#[non_exhaustive]`: start from [`Config::default`] and change what you
/// need with the `with_*` setters (or assign the public fields), so that a
/// field added later breaks nobody.
///
/// The engine's settings, TLS and the connection name among them, have
/// one home, [`Config::engine`]; [`Config::with_tls`] and
/// [`Config::with_connection_name`] write them there.
///
/// ```
/// use std::time::Duration;
///
/// let config = acemq_core::Config::default()
///     .with_connection_name("orders")
///     .with_recovery_give_up(Duration::from_secs(300))
///     .with_on_recovery(|event| eprintln!("{event}"));
/// assert_eq!(config.engine.connection_name.as_deref(), Some("orders"));
/// ```
#[derive(Clone)]
#[non_exhaustive]
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
    /// for one message, before it fails with [`crate::Error::ConnectionLost`] (30 s).
    pub publish_timeout: Duration,
    /// Called with every [`RecoveryEvent`].
    pub on_recovery: Option<OnRecovery>,
    /// Turns recovery off: a lost connection stays lost, sends fail with
    /// [`crate::Error::Closed`], and a consumer whose connection died ends with
    /// that error ([`crate::Consumer::closed`]).
    pub without_recovery: bool,
    /// Engine settings for both connections: tuning, timeouts, TLS for
    /// `amqps://` ([`amqp::Config::tls`]), and the name the connections
    /// show in RabbitMQ's management UI ([`amqp::Config::connection_name`],
    /// suffixed `-publish` and `-consume`; `acemq-publish` and
    /// `acemq-consume` without one).
    pub engine: amqp::Config,
    /// The retry policy of consumers that set none (without one, a retry is
    /// republished at once, without limit).
    pub retry: Option<crate::retry::RetryPolicy>,
    /// How often to ask [`amqp::Config::credentials`] for a fresh secret
    /// and send it to both connections with `connection.update-secret`
    /// ([`crate::Conn::update_secret`]); `None` (the default) never does.
    /// Set it below the lifetime of the provider's tokens. Needs a
    /// provider ([`Config::with_credentials`]): without one,
    /// [`crate::Conn::open`] fails with [`crate::Error::Config`].
    pub credentials_refresh: Option<Duration>,
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
            engine: amqp::Config::default(),
            retry: None,
            credentials_refresh: None,
        }
    }
}

impl Config {
    /// Sets [`Config::without_confirms`].
    pub fn with_without_confirms(mut self, without_confirms: bool) -> Self {
        self.without_confirms = without_confirms;
        self
    }

    /// Sets [`Config::blocked_timeout`].
    pub fn with_blocked_timeout(mut self, timeout: Duration) -> Self {
        self.blocked_timeout = timeout;
        self
    }

    /// Sets [`Config::recovery_delay`].
    pub fn with_recovery_delay(mut self, delay: Duration) -> Self {
        self.recovery_delay = delay;
        self
    }

    /// Sets [`Config::recovery_delay_max`].
    pub fn with_recovery_delay_max(mut self, delay: Duration) -> Self {
        self.recovery_delay_max = delay;
        self
    }

    /// Sets [`Config::recovery_give_up`]: recovery stops `after` a loss.
    pub fn with_recovery_give_up(mut self, after: Duration) -> Self {
        self.recovery_give_up = Some(after);
        self
    }

    /// Sets [`Config::publish_timeout`].
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Sets [`Config::on_recovery`]: `callback` is called with every [`RecoveryEvent`].
    pub fn with_on_recovery(mut self, callback: impl Fn(RecoveryEvent) + Send + Sync + 'static) -> Self {
        self.on_recovery = Some(Arc::new(callback));
        self
    }

    /// Sets [`Config::without_recovery`].
    pub fn with_without_recovery(mut self, without_recovery: bool) -> Self {
        self.without_recovery = without_recovery;
        self
    }

    /// Sets the TLS settings for `amqps://`: [`Config::engine`]'s
    /// [`amqp::Config::tls`], where they live.
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.engine.tls = tls;
        self
    }

    /// Sets where the credentials come from: [`Config::engine`]'s
    /// [`amqp::Config::credentials`], where it lives. It is asked before
    /// every dial, the redials of a recovery included, and, with
    /// [`Config::credentials_refresh`], on a schedule.
    pub fn with_credentials(mut self, provider: Arc<dyn CredentialsProvider>) -> Self {
        self.engine.credentials = Some(provider);
        self
    }

    /// Sets [`Config::credentials_refresh`].
    pub fn with_credentials_refresh(mut self, every: Duration) -> Self {
        self.credentials_refresh = Some(every);
        self
    }

    /// Sets the name the connections show in RabbitMQ's management UI
    /// (suffixed `-publish` and `-consume`): [`Config::engine`]'s
    /// [`amqp::Config::connection_name`], where it lives.
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.engine.connection_name = Some(name.into());
        self
    }

    /// Sets [`Config::engine`], the whole of it: TLS and the connection
    /// name too. Call [`Config::with_tls`] and
    /// [`Config::with_connection_name`] after it, not before.
    pub fn with_engine(mut self, engine: amqp::Config) -> Self {
        self.engine = engine;
        self
    }

    /// Sets [`Config::retry`]: the retry policy of consumers that set none.
    pub fn with_retry(mut self, policy: crate::retry::RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
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
            .field("engine", &self.engine)
            .field("retry", &self.retry)
            .field("credentials_refresh", &self.credentials_refresh)
            .finish()
    }
}
