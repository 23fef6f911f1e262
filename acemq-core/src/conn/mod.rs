//! `Conn`: the acemq API's connection. It keeps separate AMQP connections for
//! publishing and for consuming (RabbitMQ stops reading a blocked connection
//! entirely, and acks must keep flowing while publishing is blocked), one
//! channel for the application's publishes, and one always-confirmed channel
//! for what the library publishes on its own behalf (`publish.rs`).
//!
//! Inside, by what each is:
//! - `state`: [`ConnState`], what a `Conn` shares between its handles, its
//!   supervisors and its consumers;
//! - `link`: each connection of the moment, with its generation and phase;
//! - `channel_slot`: the two publishing channels, reopened when closed;
//! - `consumers`: what is recorded of each consumer, and its reattachment;
//! - `recovery`: the supervisor of each connection, which brings it back
//!   after a loss. It uses the others; none of them uses it: `Conn::open`
//!   starts it.
//!
//! Nothing here publishes or consumes: `publish.rs`, `consume/` and
//! the scheduler do, through the `Conn`'s state.

use std::sync::{Arc, Mutex};

use acemq_codec::FieldTable;
use tokio::sync::watch;

use crate::amqp::{self, AmqpUrl};
use crate::config::Config;
use crate::declaration::Declaration;
use crate::error::Error;

mod channel_slot;
mod consumers;
mod link;
mod recovery;
mod state;

pub(crate) use consumers::{reattach, with_tag, Attachment, ConsumerRecord, Flow};
pub(crate) use link::LinkPhase;
pub(crate) use recovery::Backoff;
pub(crate) use state::{emit, lock, until_set, ConnState};

use channel_slot::ChannelSlot;
use link::Link;
use recovery::supervise;
use state::engine_config;

/// A connection to RabbitMQ (or an in-process acemq-memory broker) for the
/// acemq API: two AMQP connections, each under a supervisor that recovers it
/// when it is lost (see [`Config::recovery_delay`] and [`crate::RecoveryEvent`]).
/// Cheap to clone.
#[derive(Clone)]
pub struct Conn {
    pub(crate) inner: Arc<ConnState>,
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
    ///
    /// With a credentials provider ([`Config::with_credentials`]) each of
    /// the two connections asks it before it dials, and so does every
    /// redial of a recovery.
    pub async fn open(url: &str, config: Config) -> Result<Conn, Error> {
        let parsed: AmqpUrl = url.parse().map_err(|e: amqp::UrlError| Error::Engine(e.into()))?;
        if config.credentials_refresh.is_some() && config.engine.credentials.is_none() {
            return Err(Error::Config(
                "credentials_refresh is set without a credentials provider (Config::with_credentials)".into(),
            ));
        }
        if config.credentials_refresh.is_some_and(|every| every.is_zero()) {
            return Err(Error::Config("credentials_refresh must be longer than zero".into()));
        }
        let confirms = !config.without_confirms && parsed.confirms != Some(false);
        let publishing = amqp::Connection::open_url(&parsed, engine_config(&config, "publish")).await?;
        let consuming = amqp::Connection::open_url(&parsed, engine_config(&config, "consume")).await?;
        let publish_channel = ChannelSlot::open(&publishing, confirms).await?;
        let library_channel = ChannelSlot::open(&publishing, true).await?;
        let inner = Arc::new(ConnState {
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
            secret: Mutex::new(None),
        });
        supervise(&inner, "publish");
        supervise(&inner, "consume");
        if let Some(every) = inner.config.credentials_refresh {
            tokio::spawn(refresh_credentials(Arc::downgrade(&inner), every));
        }
        Ok(Conn { inner })
    }

    /// Sends `connection.update-secret` with `secret` (e.g. a refreshed
    /// OAuth 2 token) on both connections, the publishing one and the
    /// consuming one, and waits for each broker's `update-secret-ok`
    /// (each within [`amqp::Config::call_timeout`]). A connection that is
    /// recovering is waited for, within [`Config::publish_timeout`]. From
    /// now on a redial uses `secret` as its password, unless a credentials
    /// provider is set: that is asked instead.
    ///
    /// A broker that refuses the secret closes that connection (RabbitMQ's
    /// OAuth 2 backend: 530 NOT_ALLOWED; the error is returned) and
    /// recovery redials it. RabbitMQ's internal backend (user names and
    /// passwords) accepts any secret on a connection it has already
    /// authenticated, without checking it; so does acemq-memory.
    pub async fn update_secret(&self, secret: impl Into<amqp::Secret>) -> Result<(), Error> {
        let secret = secret.into();
        *state::lock(&self.inner.secret) = Some(secret.clone());
        let deadline = tokio::time::Instant::now() + self.inner.config.publish_timeout;
        for link in [&self.inner.publishing, &self.inner.consuming] {
            let (conn, _) = link.connection(deadline, false).await?;
            conn.update_secret(secret.clone(), "acemq: the credentials were refreshed")
                .await?;
        }
        Ok(())
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
    /// [`crate::RecoveryEvent::QueueRenamed`] reports it.
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
}

/// Asks the credentials provider for a fresh secret every `every` and sends
/// it to both connections, until the `Conn` is closed or dropped. A failure
/// is logged and the next turn tries again.
async fn refresh_credentials(weak: std::sync::Weak<ConnState>, every: std::time::Duration) {
    let Some(mut closing) = weak.upgrade().map(|state| state.closing.subscribe()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = state::until_set(&mut closing) => return,
        }
        let Some(inner) = weak.upgrade() else { return };
        let Some(provider) = inner.config.engine.credentials.clone() else {
            return;
        };
        let timeout = inner.config.engine.connection_timeout;
        let conn = Conn { inner };
        let refreshed = match tokio::time::timeout(timeout, provider.credentials()).await {
            Ok(Ok(credentials)) => conn.update_secret(credentials.secret).await,
            Ok(Err(err)) => Err(Error::Engine(err.into())),
            Err(_) => Err(Error::Engine(
                amqp::CredentialsError(format!("no answer within {timeout:?}")).into(),
            )),
        };
        match refreshed {
            Ok(()) => tracing::debug!("credentials refreshed on both connections"),
            Err(err) => tracing::warn!(%err, "could not refresh the credentials; trying again next time"),
        }
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Conn>();
}
