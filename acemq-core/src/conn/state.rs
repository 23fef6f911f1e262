//! `ConnState`: what a `Conn` shares between its handles, its supervisors
//! and its consumers: the configuration, the two links, the two publishing
//! channels, and the records recovery replays (every declaration, every
//! running consumer). Also the small helpers everyone who holds it uses:
//! `emit` for a [`RecoveryEvent`], `lock`, `until_set`.
//!
//! It is state, never a supervisor: it does not import recovery, and starts
//! or watches nothing. The supervisor reads and writes it; `Conn::open`
//! builds it and starts the supervisors.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::channel_slot::ChannelSlot;
use super::consumers::ConsumerRecord;
use super::link::Link;
use crate::amqp::{self, AmqpUrl, Secret};
use crate::config::{Config, RecoveryEvent};
use crate::declaration::Declaration;
use crate::error::{is_loss, Error};

/// What a `Conn` shares between its handles, its supervisors and its
/// consumers.
pub(crate) struct ConnState {
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
    /// Set by [`Conn::close`](crate::Conn::close): supervisors stop.
    pub(crate) closing: watch::Sender<bool>,
    /// The last secret given to [`Conn::update_secret`](crate::Conn::update_secret):
    /// a redial uses it instead of the URL's password (a credentials
    /// provider, when there is one, is asked anyway).
    pub(crate) secret: Mutex<Option<Secret>>,
}

impl ConnState {
    /// The engine settings of the `which` connection.
    pub(crate) fn engine_config(&self, which: &str) -> amqp::Config {
        engine_config(&self.config, which)
    }

    /// The URL to dial: the one given, with the last secret of
    /// [`Conn::update_secret`](crate::Conn::update_secret) as its password.
    pub(crate) fn dial_url(&self) -> AmqpUrl {
        let mut url = self.url.clone();
        if let Some(secret) = lock(&self.secret).clone() {
            url.password = secret;
        }
        url
    }

    /// The link of the `which` connection (`publish` or `consume`).
    pub(crate) fn link(&self, which: &str) -> &Link {
        if which == "publish" {
            &self.publishing
        } else {
            &self.consuming
        }
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
/// [`Config::engine`], with the connection named after it (its
/// `connection_name` suffixed `-publish` or `-consume`; `acemq-publish`
/// and `acemq-consume` without one).
pub(crate) fn engine_config(config: &Config, which: &str) -> amqp::Config {
    let mut engine = config.engine.clone();
    engine.connection_name = Some(match &config.engine.connection_name {
        Some(name) => format!("{name}-{which}"),
        None => format!("acemq-{which}"),
    });
    engine
}

/// Counts, logs and hands an event to `on_recovery`.
pub(crate) fn emit(state: &ConnState, event: RecoveryEvent) {
    metrics::counter!(crate::metrics_names::RECOVERY_TOTAL, "event" => event.label()).increment(1);
    match &event {
        RecoveryEvent::Lost { .. } | RecoveryEvent::GaveUp { .. } => tracing::warn!(%event, "recovery"),
        RecoveryEvent::Retrying { .. } => tracing::info!(%event, "recovery"),
        _ => tracing::info!(%event, "recovery"),
    }
    if let Some(on_recovery) = &state.config.on_recovery {
        on_recovery(event);
    }
}

/// Returns once the flag is set (or its sender is gone). Owns the watch's
/// guard inside, so a `select!` over it holds nothing across an await.
pub(crate) async fn until_set(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

/// The mutex's guard, even if a thread panicked while it held it (the data
/// is taken as that thread left it).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
