//! Broker configuration: virtual hosts, users, and the limits offered in
//! `connection.tune`. Plain data; must never do IO.

use std::time::Duration;

/// A user the broker accepts (PLAIN or AMQPLAIN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The password.
    pub password: String,
    /// The virtual hosts the user may open; `None` means all of them.
    pub vhosts: Option<Vec<String>>,
}

impl User {
    /// A user allowed on every virtual host.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> Self {
        User {
            name: name.into(),
            password: password.into(),
            vhosts: None,
        }
    }
}

/// The RabbitMQ release line whose behaviour the broker imitates where the
/// two differ (the crate docs list every difference, "RabbitMQ 3.10 and
/// 4.0"). The default is the newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RabbitMqVersion {
    /// RabbitMQ 3.10 (as 3.10.8 behaves).
    V3_10,
    /// RabbitMQ 4.0 (as 4.0.5 behaves).
    #[default]
    V4_0,
}

impl RabbitMqVersion {
    /// Every version the broker can imitate, oldest first.
    pub const ALL: [RabbitMqVersion; 2] = [RabbitMqVersion::V3_10, RabbitMqVersion::V4_0];

    /// `3.10` or `4.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            RabbitMqVersion::V3_10 => "3.10",
            RabbitMqVersion::V4_0 => "4.0",
        }
    }

    /// Whether this is 4.0 or later.
    pub fn is_4(self) -> bool {
        self >= RabbitMqVersion::V4_0
    }

    /// The `x-delivery-limit` a quorum queue declared without one has:
    /// none on 3.10, 20 on 4.0.
    pub fn quorum_default_delivery_limit(self) -> Option<u64> {
        self.is_4().then_some(20)
    }
}

impl std::fmt::Display for RabbitMqVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version that is not `3.10` or `4.0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVersion(pub String);

impl std::fmt::Display for UnknownVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown RabbitMQ version {:?} (expected 3.10 or 4.0)", self.0)
    }
}

impl std::error::Error for UnknownVersion {}

impl std::str::FromStr for RabbitMqVersion {
    type Err = UnknownVersion;

    /// `3.10` or `4.0` (a patch release such as `3.10.8` or `4.0.5` names its line).
    fn from_str(s: &str) -> Result<Self, UnknownVersion> {
        let s = s.trim();
        let line = |prefix: &str| s == prefix || s.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'));
        if line("3.10") {
            Ok(RabbitMqVersion::V3_10)
        } else if line("4.0") {
            Ok(RabbitMqVersion::V4_0)
        } else {
            Err(UnknownVersion(s.to_owned()))
        }
    }
}

/// How a broker is set up. `BrokerConfig::default()` is RabbitMQ 4.0's
/// out-of-the-box shape: vhost `/`, user `guest`/`guest`, channel-max 2047,
/// frame-max 131072, heartbeat 60 s; [`BrokerConfig::for_version`] gives
/// another version's.
///
/// `#[non_exhaustive]`: start from [`BrokerConfig::default`] (or
/// [`BrokerConfig::for_version`]) and change what you need with the `with_*`
/// setters (or assign the public fields).
///
/// ```
/// use acemq_memory::{BrokerConfig, RabbitMqVersion, User};
///
/// let config = BrokerConfig::default()
///     .with_version(RabbitMqVersion::V3_10)
///     .with_user(User::new("app", "secret"))
///     .with_frame_max(8192);
/// assert_eq!(config.users.len(), 2);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BrokerConfig {
    /// The RabbitMQ version imitated where versions differ.
    pub rabbitmq_version: RabbitMqVersion,
    /// The virtual hosts that exist.
    pub vhosts: Vec<String>,
    /// The users that may log in.
    pub users: Vec<User>,
    /// `channel-max` offered in `connection.tune`.
    pub channel_max: u16,
    /// `frame-max` offered in `connection.tune`.
    pub frame_max: u32,
    /// The smallest `frame-max` a client may choose in `tune-ok` (RabbitMQ
    /// 3.10 and 4.0: 4096; 4.1+: 8192).
    pub frame_min: u32,
    /// Heartbeat interval offered in `connection.tune`, in seconds.
    pub heartbeat: u16,
    /// How long a client has from its protocol header to `connection.open`.
    pub handshake_timeout: Duration,
    /// How long the broker waits for `connection.close-ok` after sending
    /// `connection.close`, and before dropping a client whose `tune-ok` it refused.
    pub close_timeout: Duration,
    /// The largest message body accepted (RabbitMQ's `max_message_size`).
    pub max_message_size: u64,
    /// The `x-delivery-limit` of quorum queues declared without one
    /// (RabbitMQ 4.0+ uses 20; 3.x has none; set from the version by
    /// [`BrokerConfig::for_version`]).
    pub quorum_default_delivery_limit: Option<u64>,
    /// Bytes buffered in each direction of an in-process connection.
    pub duplex_capacity: usize,
    /// `cluster_name` in `connection.start`.
    pub cluster_name: String,
    /// The users that may log in only from a loopback address (RabbitMQ's
    /// `loopback_users`; default `guest`). A connection served with
    /// [`crate::Broker::serve`] or [`crate::Broker::connect`] counts as
    /// loopback; one accepted by [`crate::Broker::listen_tcp`] or served with
    /// [`crate::Broker::serve_tcp`] counts by its peer address.
    pub loopback_users: Vec<String>,
    /// How many connections may be open at once (`None`: no limit). A
    /// `connection.open` past it is refused with 530 NOT_ALLOWED, as
    /// RabbitMQ's `connection_max` refuses it.
    pub max_connections: Option<usize>,
    /// The bytes a connection may have waiting to be written before the
    /// broker stops delivering to it (messages stay queued, as RabbitMQ's
    /// credit flow keeps them) and stops reading its input.
    pub output_limit: usize,
    /// How long a write to a client may make no progress before its
    /// connection is dropped (RabbitMQ's `send_timeout`).
    pub write_timeout: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig::for_version(RabbitMqVersion::default())
    }
}

impl BrokerConfig {
    /// RabbitMQ's out-of-the-box shape as `version` has it.
    pub fn for_version(version: RabbitMqVersion) -> Self {
        BrokerConfig {
            rabbitmq_version: version,
            vhosts: vec!["/".to_owned()],
            users: vec![User::new("guest", "guest")],
            channel_max: 2047,
            frame_max: 131_072,
            frame_min: 4096,
            heartbeat: 60,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(3),
            max_message_size: 128 * 1024 * 1024,
            quorum_default_delivery_limit: version.quorum_default_delivery_limit(),
            duplex_capacity: 512 * 1024,
            cluster_name: "acemq-memory".to_owned(),
            loopback_users: vec!["guest".to_owned()],
            max_connections: None,
            output_limit: 4 * 1024 * 1024,
            write_timeout: Duration::from_secs(15),
        }
    }

    /// The same configuration imitating `version` (and with its default
    /// quorum delivery limit).
    pub fn with_version(mut self, version: RabbitMqVersion) -> Self {
        self.rabbitmq_version = version;
        self.quorum_default_delivery_limit = version.quorum_default_delivery_limit();
        self
    }

    /// The same configuration with another set of virtual hosts.
    pub fn with_vhosts<I, S>(mut self, vhosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.vhosts = vhosts.into_iter().map(Into::into).collect();
        self
    }

    /// The same configuration with one more user (replacing one of the same name).
    pub fn with_user(mut self, user: User) -> Self {
        self.users.retain(|u| u.name != user.name);
        self.users.push(user);
        self
    }

    /// The same configuration with these users only.
    pub fn with_users(mut self, users: impl IntoIterator<Item = User>) -> Self {
        self.users = users.into_iter().collect();
        self
    }

    /// Sets [`BrokerConfig::channel_max`].
    pub fn with_channel_max(mut self, channel_max: u16) -> Self {
        self.channel_max = channel_max;
        self
    }

    /// Sets [`BrokerConfig::frame_max`].
    pub fn with_frame_max(mut self, frame_max: u32) -> Self {
        self.frame_max = frame_max;
        self
    }

    /// Sets [`BrokerConfig::frame_min`].
    pub fn with_frame_min(mut self, frame_min: u32) -> Self {
        self.frame_min = frame_min;
        self
    }

    /// Sets [`BrokerConfig::heartbeat`], in seconds.
    pub fn with_heartbeat(mut self, seconds: u16) -> Self {
        self.heartbeat = seconds;
        self
    }

    /// Sets [`BrokerConfig::handshake_timeout`].
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets [`BrokerConfig::close_timeout`].
    pub fn with_close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Sets [`BrokerConfig::max_message_size`], in bytes.
    pub fn with_max_message_size(mut self, bytes: u64) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Sets [`BrokerConfig::quorum_default_delivery_limit`] (`None`: no
    /// limit). Call it after [`BrokerConfig::with_version`], which resets it.
    pub fn with_quorum_default_delivery_limit(mut self, limit: Option<u64>) -> Self {
        self.quorum_default_delivery_limit = limit;
        self
    }

    /// Sets [`BrokerConfig::duplex_capacity`], in bytes.
    pub fn with_duplex_capacity(mut self, bytes: usize) -> Self {
        self.duplex_capacity = bytes;
        self
    }

    /// Sets [`BrokerConfig::loopback_users`] (an empty list lets every user
    /// log in from anywhere, as `--allow-remote-guest` does for `guest`).
    pub fn with_loopback_users<I, S>(mut self, users: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.loopback_users = users.into_iter().map(Into::into).collect();
        self
    }

    /// Sets [`BrokerConfig::max_connections`].
    pub fn with_max_connections(mut self, max: Option<usize>) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets [`BrokerConfig::output_limit`], in bytes (at least 4 KiB is used).
    pub fn with_output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes;
        self
    }

    /// Sets [`BrokerConfig::write_timeout`].
    pub fn with_write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// Sets [`BrokerConfig::cluster_name`].
    pub fn with_cluster_name(mut self, name: impl Into<String>) -> Self {
        self.cluster_name = name.into();
        self
    }
}
