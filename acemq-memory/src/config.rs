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

/// How a broker is set up. `BrokerConfig::default()` is RabbitMQ's out-of-the-box
/// shape: vhost `/`, user `guest`/`guest`, channel-max 2047, frame-max 131072,
/// heartbeat 60 s.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// The virtual hosts that exist.
    pub vhosts: Vec<String>,
    /// The users that may log in.
    pub users: Vec<User>,
    /// `channel-max` offered in `connection.tune`.
    pub channel_max: u16,
    /// `frame-max` offered in `connection.tune`.
    pub frame_max: u32,
    /// The smallest `frame-max` a client may choose in `tune-ok` (RabbitMQ 4.1+: 8192).
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
    /// (RabbitMQ 4.0+ uses 20; 3.x has none).
    pub quorum_default_delivery_limit: Option<u64>,
    /// Bytes buffered in each direction of an in-process connection.
    pub duplex_capacity: usize,
    /// `cluster_name` in `connection.start`.
    pub cluster_name: String,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            vhosts: vec!["/".to_owned()],
            users: vec![User::new("guest", "guest")],
            channel_max: 2047,
            frame_max: 131_072,
            frame_min: 8192,
            heartbeat: 60,
            handshake_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(3),
            max_message_size: 128 * 1024 * 1024,
            quorum_default_delivery_limit: None,
            duplex_capacity: 512 * 1024,
            cluster_name: "acemq-memory".to_owned(),
        }
    }
}

impl BrokerConfig {
    /// The same configuration with another set of virtual hosts.
    pub fn with_vhosts<I, S>(mut self, vhosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.vhosts = vhosts.into_iter().map(Into::into).collect();
        self
    }

    /// The same configuration with one more user.
    pub fn with_user(mut self, user: User) -> Self {
        self.users.retain(|u| u.name != user.name);
        self.users.push(user);
        self
    }
}
