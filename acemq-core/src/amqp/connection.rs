//! `Connection`: dials a broker (TCP or TLS, several hosts in turn) or runs
//! over any stream, spawns the driver task, and hands out channels.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use acemq_codec::FieldTable;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{broadcast, oneshot};

use super::batch_queue;
use super::driver;
use super::error::CredentialsError;
use super::message::ConnectionEvent;
use super::state::{Command, ConnectionState, Outgoing, Settings};
use super::url::{AmqpUrl, UrlError};
use super::Error;
use crate::io::{connect_tcp, TlsConfig};
use crate::proto::{self, Auth, CloseReason, ConnectionParams, Secret, Timeouts, TuneRequest, Tuned};

/// Credentials for one dial: a secret (a password, or an OAuth 2 token for
/// RabbitMQ's OAuth 2 backend) and, optionally, a user name that replaces
/// the URL's. Its `Debug` never shows the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The user name; `None` keeps the URL's.
    pub username: Option<String>,
    /// The password or token.
    pub secret: Secret,
}

impl Credentials {
    /// The URL's user name with this secret.
    pub fn new(secret: impl Into<Secret>) -> Self {
        Credentials {
            username: None,
            secret: secret.into(),
        }
    }

    /// The same secret for `username` instead of the URL's.
    pub fn with_username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }
}

/// What [`CredentialsProvider::credentials`] returns.
pub type CredentialsFuture<'a> = Pin<Box<dyn Future<Output = Result<Credentials, CredentialsError>> + Send + 'a>>;

/// Where fresh credentials come from: asked before every dial (the first
/// connection and every redial of a recovery) and, by a [`crate::Conn`]
/// with [`crate::Config::credentials_refresh`], on a schedule, whose
/// secret then goes to the open connections with
/// `connection.update-secret`. It may do I/O (fetch a token from an
/// identity provider); the dial waits for it, within
/// [`Config::connection_timeout`].
///
/// Any `Fn() -> impl Future<Output = Result<Credentials, CredentialsError>>`
/// is one:
///
/// ```
/// use std::sync::Arc;
/// use acemq_core::amqp::{Config, Credentials, CredentialsError};
///
/// async fn fetch_token() -> Result<String, CredentialsError> {
///     // e.g. an OAuth 2 client-credentials request
///     Ok("a-fresh-token".to_string())
/// }
///
/// let config = Config::default()
///     .with_credentials(Arc::new(|| async { Ok(Credentials::new(fetch_token().await?)) }));
/// assert!(config.credentials.is_some());
/// ```
pub trait CredentialsProvider: Send + Sync {
    /// Fresh credentials.
    fn credentials(&self) -> CredentialsFuture<'_>;
}

impl<F, Fut> CredentialsProvider for F
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Credentials, CredentialsError>> + Send + 'static,
{
    fn credentials(&self) -> CredentialsFuture<'_> {
        Box::pin(self())
    }
}

impl std::fmt::Debug for dyn CredentialsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialsProvider")
    }
}

/// Connection settings that a URL does not carry (URL options override the
/// matching fields here).
///
/// `#[non_exhaustive]`: start from [`Config::default`] and change what you
/// need with the `with_*` setters (or assign the public fields).
///
/// ```
/// use std::time::Duration;
///
/// let config = acemq_core::amqp::Config::default()
///     .with_connection_timeout(Duration::from_secs(5))
///     .with_connection_name("billing");
/// assert_eq!(config.connection_timeout, Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// What to ask for in `tune-ok`.
    pub tune: TuneRequest,
    /// How long dialling, TLS and the handshake may take, per host.
    pub connection_timeout: Duration,
    /// How long `channel.open` may wait for `open-ok` (time the broker
    /// blocks the connection not counted).
    pub channel_open_timeout: Duration,
    /// How long a close (of a channel or of the connection) may wait for
    /// the broker's `close-ok`.
    pub close_timeout: Duration,
    /// How long every other synchronous call on a channel (declare, bind,
    /// unbind, qos, consume, cancel, get, purge, delete, `tx.*`,
    /// `confirm.select`, ...) may wait for its reply (time the broker
    /// blocks the connection not counted). Past it the call fails with
    /// [`super::Error::NoReply`], and so does every call queued behind it
    /// on that channel; the channel is closed (its publishes waiting for a
    /// confirm fail with the same error, its consumers end) and its handles
    /// are dead: every later call on them fails with
    /// [`super::Error::ChannelNotOpen`]. Open a new channel to go on.
    /// 30 s by default; see [`Timeouts::call`] for why.
    pub call_timeout: Duration,
    /// TLS settings for `amqps://`. Anything set here (roots, the OS
    /// trust store, a client certificate, a server name, a whole
    /// `rustls::ClientConfig`) with an `amqp://` URL is refused with
    /// [`super::Error::NotTls`]: the connection would go in clear.
    pub tls: TlsConfig,
    /// Where the credentials come from, instead of the URL's password
    /// (and, if it says, user name): asked before every dial.
    pub credentials: Option<Arc<dyn CredentialsProvider>>,
    /// A name for the connection, shown in RabbitMQ's management UI.
    pub connection_name: Option<String>,
    /// Authenticate with the TLS client certificate (SASL EXTERNAL) instead
    /// of the URL's user name and password. Only with `amqps://`: with
    /// `amqp://` it is refused ([`super::Error::NotTls`]).
    pub external_auth: bool,
    /// How many bytes of publishes may wait to be written to the socket
    /// (2 MiB by default). A publish that finds no room waits in
    /// [`super::Channel::publish`] until the driver has written enough:
    /// against a broker that stops reading, a publisher that never awaits
    /// its confirms is held back instead of buffered without limit. A
    /// message larger than the whole buffer waits for it to be empty.
    pub publish_buffer: usize,
    /// How many deliveries each consumer's queue holds before the driver
    /// stops reading the socket (1024 by default, and never fewer than the
    /// channel's prefetch when the consumer starts, so a consumer that
    /// stays within its prefetch never pauses reading). Reading resumes as
    /// soon as the consumer takes one; the broker's own flow control then
    /// holds the rest. This bounds the memory of a no-ack consumer, or one
    /// without a prefetch, whose handler is slower than the broker.
    pub delivery_buffer: usize,
    /// How long the connection's driver keeps polling the socket, rather
    /// than letting its thread sleep, after it last read or wrote something
    /// (zero, the default: it sleeps at once). A thread that sleeps while it
    /// waits for the broker's answer pays for waking up when it comes: on a
    /// virtual machine that can be half of a round trip. Polling keeps a
    /// core busy for up to this long after every burst of traffic, in
    /// exchange for a shorter publish → delivery or call → reply latency;
    /// for services that wait on one message at a time. The engine bench and
    /// the peers comparison measure both (`benches/peers`, latency).
    pub busy_poll: Duration,
    /// The least time between two reads of the socket (zero, the default:
    /// the driver reads as soon as input comes). Input that comes within
    /// this time of the last read waits in the socket until it is over;
    /// input after a quieter spell is read at once. Under load the broker's
    /// frames then gather, and one read takes many: fewer reads, writes and
    /// turns of the driver a message (the thread still wakes as frames
    /// come), and confirms that come acked together. The price, under
    /// load only, is up to this long (rounded up to tokio's timer tick, a
    /// millisecond) added to each reply: a confirm, a delivery, a call's
    /// answer; calls made one after the other take this long each. Writes
    /// are never held back. For connections that move many messages at
    /// once, not for those that wait on one at a time; keep it far below
    /// the heartbeat. Measured by the peers comparison (`benches/peers`,
    /// BENCHMARKS.md, "Reading less often"): with 2 ms, a confirmed publish's CPU
    /// 1.01× the wire floor's against the engine's 1.24× without it, and a
    /// reply with one message in flight 3.3 ms at p50 against 0.13–0.16 ms.
    pub read_interval: Duration,
    /// Record a transcript of the connection: every frame in and out, with
    /// its time and direction, read with [`Connection::transcript`]. `None`
    /// (the default) records nothing and costs one branch per read and per
    /// write batch; `Some(capacity)` keeps the last `capacity` frames (at
    /// least one), dropping the oldest and counting them
    /// ([`super::Transcript::dropped`]). For tests and debugging: it
    /// copies and decodes every method and content header frame a second
    /// time (bodies are counted, not kept).
    pub transcript: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tune: TuneRequest::default(),
            connection_timeout: Duration::from_secs(30),
            channel_open_timeout: Timeouts::default().channel_open,
            close_timeout: Timeouts::default().close,
            call_timeout: Timeouts::default().call,
            tls: TlsConfig::new(),
            credentials: None,
            connection_name: None,
            external_auth: false,
            publish_buffer: Settings::default().publish,
            delivery_buffer: Settings::default().deliveries,
            busy_poll: Duration::ZERO,
            read_interval: Duration::ZERO,
            transcript: None,
        }
    }
}

impl Config {
    /// Sets [`Config::tune`].
    pub fn with_tune(mut self, tune: TuneRequest) -> Self {
        self.tune = tune;
        self
    }

    /// Sets [`Config::connection_timeout`].
    pub fn with_connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Sets [`Config::channel_open_timeout`].
    pub fn with_channel_open_timeout(mut self, timeout: Duration) -> Self {
        self.channel_open_timeout = timeout;
        self
    }

    /// Sets [`Config::close_timeout`].
    pub fn with_close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Sets [`Config::call_timeout`].
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets [`Config::tls`].
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = tls;
        self
    }

    /// Sets [`Config::credentials`].
    pub fn with_credentials(mut self, provider: Arc<dyn CredentialsProvider>) -> Self {
        self.credentials = Some(provider);
        self
    }

    /// Sets [`Config::connection_name`].
    pub fn with_connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// Sets [`Config::external_auth`].
    pub fn with_external_auth(mut self, external_auth: bool) -> Self {
        self.external_auth = external_auth;
        self
    }

    /// Sets [`Config::publish_buffer`], in bytes.
    pub fn with_publish_buffer(mut self, bytes: usize) -> Self {
        self.publish_buffer = bytes;
        self
    }

    /// Sets [`Config::delivery_buffer`], in deliveries per consumer.
    pub fn with_delivery_buffer(mut self, deliveries: usize) -> Self {
        self.delivery_buffer = deliveries;
        self
    }

    /// Sets [`Config::busy_poll`].
    pub fn with_busy_poll(mut self, busy_poll: Duration) -> Self {
        self.busy_poll = busy_poll;
        self
    }

    /// Sets [`Config::read_interval`].
    pub fn with_read_interval(mut self, interval: Duration) -> Self {
        self.read_interval = interval;
        self
    }

    /// Sets [`Config::transcript`]: record the last `capacity` frames.
    pub fn with_transcript(mut self, capacity: usize) -> Self {
        self.transcript = Some(capacity);
        self
    }

    pub(crate) fn settings(&self) -> Settings {
        Settings {
            publish: self.publish_buffer,
            deliveries: self.delivery_buffer,
            busy_poll: self.busy_poll,
            read_interval: self.read_interval,
            transcript: self.transcript,
        }
    }
}

/// The in-process broker called `name` (acemq-memory's).
#[cfg(feature = "memory")]
fn connect_memory(name: &str) -> Result<tokio::io::DuplexStream, UrlError> {
    Ok(crate::io::connect_memory(name))
}

/// Without the `memory` feature there is no in-process broker to reach.
#[cfg(not(feature = "memory"))]
fn connect_memory(name: &str) -> Result<tokio::io::DuplexStream, UrlError> {
    Err(UrlError(format!(
        "memory://{name} needs acemq-core's `memory` feature (the in-process acemq-memory broker)"
    )))
}

/// An open AMQP connection. Cheap to clone; the connection closes when
/// [`Connection::close`] is called or every handle (connections, channels,
/// consumers) is dropped.
#[derive(Clone)]
pub struct Connection {
    pub(crate) commands: batch_queue::Sender<Command, Outgoing>,
    pub(crate) state: Arc<ConnectionState>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("tuned", &self.state.tuned.get())
            .field("blocked", &self.is_blocked())
            .field("raw", &self.is_raw())
            .finish()
    }
}

impl Connection {
    /// Connects to `url` (`amqp://` or `amqps://`), trying each host in turn
    /// until one completes the handshake. A refusal by a broker (bad
    /// credentials, unknown vhost) is returned at once without trying others.
    /// `memory://name` reaches the in-process acemq-memory broker of that name.
    pub async fn open(url: &str, config: Config) -> Result<Connection, Error> {
        let url: AmqpUrl = url.parse()?;
        Connection::open_url(&url, config).await
    }

    /// [`Connection::open`] with a parsed URL.
    pub async fn open_url(url: &AmqpUrl, mut config: Config) -> Result<Connection, Error> {
        if let Some(h) = url.heartbeat {
            config.tune.heartbeat = h;
        }
        if let Some(f) = url.frame_max {
            config.tune.frame_max = f;
        }
        if let Some(c) = url.channel_max {
            config.tune.channel_max = c;
        }
        if let Some(t) = url.connection_timeout {
            config.connection_timeout = t;
        }
        let external = url.auth_mechanism.as_deref() == Some("external") || config.external_auth;
        if !url.tls && !url.memory {
            // Checked before the provider is asked or anything is dialled.
            if !config.tls.is_default() {
                return Err(Error::NotTls {
                    setting: "a TLS configuration",
                });
            }
            if external {
                return Err(Error::NotTls {
                    setting: "EXTERNAL authentication",
                });
            }
        }
        let (mut username, mut password) = (url.username.clone(), url.password.clone());
        if let (Some(provider), false) = (&config.credentials, external) {
            let fresh = tokio::time::timeout(config.connection_timeout, provider.credentials())
                .await
                .map_err(|_| {
                    CredentialsError(format!(
                        "no answer within the connection timeout ({:?})",
                        config.connection_timeout
                    ))
                })??;
            if let Some(name) = fresh.username {
                username = name;
            }
            password = fresh.secret;
        }
        let auth = match (url.auth_mechanism.as_deref(), config.external_auth) {
            (Some("external"), _) | (None, true) => Auth::External,
            (Some("amqplain"), _) => Auth::AmqPlain { username, password },
            (None | Some("plain"), _) => Auth::Plain { username, password },
            (Some(_), _) => {
                return Err(Error::Url(UrlError(
                    "auth_mechanism is not plain, amqplain or external".into(),
                )))
            }
        };
        let params = ConnectionParams {
            auth,
            vhost: url.vhost.clone(),
            tune: config.tune,
            connection_name: config.connection_name.clone(),
            timeouts: Timeouts {
                handshake: config.connection_timeout,
                channel_open: config.channel_open_timeout,
                close: config.close_timeout,
                call: config.call_timeout,
            },
        };
        let settings = config.settings();
        if url.memory {
            let stream = connect_memory(&url.hosts[0].0)?;
            let attempt = Connection::handshake(stream, params, settings);
            return tokio::time::timeout(config.connection_timeout, attempt)
                .await
                .unwrap_or(Err(Error::Timeout(config.connection_timeout)));
        }
        let mut last_error = None;
        for (host, port) in &url.hosts {
            let attempt = async {
                let tcp = connect_tcp(host, *port, config.connection_timeout).await?;
                if url.tls {
                    let tls = config.tls.connect(host, tcp).await?;
                    Connection::handshake(tls, params.clone(), settings).await
                } else {
                    Connection::handshake(tcp, params.clone(), settings).await
                }
            };
            match tokio::time::timeout(config.connection_timeout, attempt).await {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(err @ Error::ConnectionClosed(CloseReason::ByServer(_)))) => return Err(err),
                Ok(Err(err)) => {
                    tracing::warn!(host, port, %err, "could not connect; trying the next host if any");
                    last_error = Some(err);
                }
                Err(_) => last_error = Some(Error::Timeout(config.connection_timeout)),
            }
        }
        Err(last_error.unwrap_or(Error::Url(UrlError("no host".into()))))
    }

    /// Runs the handshake over an already connected stream (e.g. a
    /// `tokio::io::DuplexStream` to an in-process broker) and returns the
    /// open connection, with the default [`Config::publish_buffer`] and
    /// [`Config::delivery_buffer`].
    pub async fn open_stream<S>(stream: S, params: ConnectionParams) -> Result<Connection, Error>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Connection::handshake(stream, params, Settings::default()).await
    }

    async fn handshake<S>(stream: S, params: ConnectionParams, settings: Settings) -> Result<Connection, Error>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (commands, rx) = batch_queue::with_side();
        let state = Arc::new(ConnectionState::new(settings, commands.downgrade()));
        let machine = proto::Connection::new(params, tokio::time::Instant::now().into_std());
        let (opened_tx, opened_rx) = oneshot::channel();
        tokio::spawn(driver::run(stream, machine, state.clone(), rx, opened_tx));
        match opened_rx.await {
            Ok(Ok(())) => Ok(Connection { commands, state }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(state.closed_error()),
        }
    }

    /// Closes the connection with a normal close and waits for the broker's
    /// `close-ok`, at most [`Config::close_timeout`]; a broker that does not
    /// answer in time is hung up on and the result is [`Error::NoReply`].
    /// Closing a closed connection succeeds.
    ///
    /// A raw connection (feature `conformance`) is not closed this way:
    /// [`Error::Raw`] (drop its `RawConnection` to hang up).
    pub async fn close(&self) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        if self.commands.send(Command::Close { reply }).is_err() {
            return if self.is_raw() { Err(Error::Raw) } else { Ok(()) };
        }
        rx.await.unwrap_or(Ok(()))
    }

    /// Sends `connection.update-secret` with `secret` (e.g. a refreshed
    /// OAuth 2 token) and waits for the broker's `update-secret-ok`, at
    /// most [`Config::call_timeout`] (then [`Error::NoReply`]). `reason`
    /// is shown in the broker's log.
    ///
    /// What the broker does with it depends on its authentication backend.
    /// RabbitMQ's OAuth 2 backend checks the token and, if it is refused,
    /// closes the connection with 530 NOT_ALLOWED (this returns
    /// [`Error::ConnectionClosed`]). Its internal backend (user names and
    /// passwords) accepts any secret without looking at it: the connection
    /// is already authenticated and its user's credentials do not expire;
    /// the secret is not checked, nor remembered for the next dial.
    pub async fn update_secret(&self, secret: Secret, reason: &str) -> Result<(), Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::UpdateSecret {
            secret,
            reason: reason.to_string(),
            reply,
        })?;
        match rx.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(self.state.closed_error()),
        }
    }

    /// The negotiated limits.
    pub fn tuned(&self) -> Tuned {
        *self.state.tuned.get().expect("set before the connection is handed out")
    }

    /// The broker's `connection.start` properties (product, version, capabilities).
    pub fn server_properties(&self) -> &FieldTable {
        self.state
            .server_properties
            .get()
            .expect("set before the connection is handed out")
    }

    /// Whether the broker has blocked publishing on this connection.
    pub fn is_blocked(&self) -> bool {
        self.state.blocked.borrow().is_some()
    }

    /// Why the broker blocks this connection, while it does.
    pub fn blocked_reason(&self) -> Option<String> {
        self.state.blocked.borrow().clone()
    }

    /// Watches the blocked state (the broker's reason while blocked).
    pub fn blocked_changes(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.state.blocked.subscribe()
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        *self.state.closed.borrow()
    }

    /// Why the connection ended, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.state.close_reason.lock().ok().and_then(|r| r.clone())
    }

    /// Waits until the connection has ended, and says why.
    pub async fn closed(&self) -> CloseReason {
        let mut rx = self.state.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
        self.close_reason().unwrap_or(CloseReason::ConnectionLost)
    }

    /// Events about the connection as a whole, from now on.
    pub fn events(&self) -> broadcast::Receiver<ConnectionEvent> {
        self.state.events.subscribe()
    }

    /// Whether the connection has left the protocol's state machine for
    /// raw frames (`Connection::raw`, feature `conformance`). Once raw,
    /// channels, publishes and calls on it fail with [`Error::Raw`], and
    /// [`Connection::is_closed`] turns true when the raw socket ends.
    pub fn is_raw(&self) -> bool {
        self.state.raw.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The transcript recorded so far: `None` unless [`Config::transcript`]
    /// asked for one. A copy: later frames are in the next call's.
    pub fn transcript(&self) -> Option<super::Transcript> {
        self.state.transcript.as_ref().map(|log| log.snapshot())
    }

    /// Takes the connection off the protocol's rails: from now on nothing
    /// runs the state machine for it, and the returned
    /// [`super::RawConnection`] sends any frame or bytes and reads the
    /// peer's frames as they come. For conformance tests of a broker.
    ///
    /// What was queued before is written first; every call, channel,
    /// consumer and publish of the connection then fails with
    /// [`Error::Raw`] (publishes not yet confirmed included), as does
    /// everything tried on it later, and [`Connection::is_raw`] is true.
    /// Heartbeats are no longer answered: send them yourself within the
    /// negotiated interval. A `Conn`'s recovery never sees a raw connection (raw
    /// is only for this low-level API).
    ///
    /// Fails with [`Error::Command`] on a connection that is closing, with
    /// [`Error::Raw`] on one that is raw already, and with
    /// [`Error::RawRefused`] on a `Conn`'s own connections.
    #[cfg(feature = "conformance")]
    pub async fn raw(&self) -> Result<super::RawConnection, Error> {
        if self.state.raw_refused.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::RawRefused);
        }
        let (reply, rx) = oneshot::channel();
        self.send(Command::Raw { reply })?;
        let parts = rx.await.map_err(|_| self.state.closed_error())??;
        Ok(super::RawConnection::new(parts, self.state.transcript.clone()))
    }

    /// How many bytes of publishes wait to be written to the socket (at
    /// most [`Config::publish_buffer`]).
    pub fn publish_backlog(&self) -> usize {
        self.state.publish_backlog()
    }

    /// Marks the connection as a `Conn`'s: [`Connection::raw`] refuses it.
    pub(crate) fn refuse_raw(&self) {
        self.state.raw_refused.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn send(&self, command: Command) -> Result<(), Error> {
        self.commands.send(command).map_err(|_| self.state.closed_error())
    }
}
