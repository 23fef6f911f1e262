//! The connection handshake, client side: what we offer, what we accept, and
//! how the limits are negotiated. Pure functions and data; the connection
//! machine drives them.
//!
//! ```text
//! client                         server
//!   protocol header  ---------->
//!                    <----------  connection.start      (ExpectStart)
//!   start-ok         ---------->
//!                    <----------  connection.tune       (ExpectTune)
//!   tune-ok, open    ---------->
//!                    <----------  connection.open-ok    (ExpectOpenOk)
//! ```

use std::fmt;

use acemq_codec::{ConnectionTune, ConnectionTuneOk, FieldTable, FieldValue, LongString};

/// The smallest `frame_max` acemq negotiates: RabbitMQ 4.1+ refuses less.
pub const MIN_FRAME_MAX: u32 = 8192;

/// How the client authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// SASL PLAIN with a user name and password.
    Plain {
        /// The user name.
        username: String,
        /// The password; never printed.
        password: Secret,
    },
    /// SASL AMQPLAIN (RabbitMQ's table-encoded PLAIN).
    AmqPlain {
        /// The user name.
        username: String,
        /// The password; never printed.
        password: Secret,
    },
    /// SASL EXTERNAL: the identity is the TLS client certificate.
    External,
}

impl Auth {
    /// PLAIN with these credentials.
    pub fn plain(username: impl Into<String>, password: impl Into<String>) -> Self {
        Auth::Plain {
            username: username.into(),
            password: Secret(password.into()),
        }
    }

    /// The SASL mechanism name.
    pub fn mechanism(&self) -> &'static str {
        match self {
            Auth::Plain { .. } => "PLAIN",
            Auth::AmqPlain { .. } => "AMQPLAIN",
            Auth::External => "EXTERNAL",
        }
    }

    /// The user name, if there is one.
    pub fn username(&self) -> Option<&str> {
        match self {
            Auth::Plain { username, .. } | Auth::AmqPlain { username, .. } => Some(username),
            Auth::External => None,
        }
    }

    /// The SASL response for `connection.start-ok`.
    pub(crate) fn response(&self) -> LongString {
        match self {
            Auth::Plain { username, password } => {
                let mut out = Vec::with_capacity(username.len() + password.0.len() + 2);
                out.push(0);
                out.extend_from_slice(username.as_bytes());
                out.push(0);
                out.extend_from_slice(password.0.as_bytes());
                LongString::from(out)
            }
            Auth::AmqPlain { username, password } => {
                let mut table = FieldTable::new();
                table.insert("LOGIN", FieldValue::from(username.as_str()));
                table.insert("PASSWORD", FieldValue::from(password.0.as_str()));
                let mut buf = bytes::BytesMut::new();
                // Keys are short and values are strings: encoding cannot fail
                // unless a credential is longer than 4 GiB.
                if acemq_codec::sasl::encode_amqplain(&table, &mut buf).is_err() {
                    return LongString::new();
                }
                LongString::from(buf.freeze())
            }
            Auth::External => LongString::new(),
        }
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::Plain { username, .. } => write!(f, "Plain {{ username: {username:?}, password: <redacted> }}"),
            Auth::AmqPlain { username, .. } => write!(f, "AmqPlain {{ username: {username:?}, password: <redacted> }}"),
            Auth::External => f.write_str("External"),
        }
    }
}

/// A password: kept out of `Debug`, `Display` and logs.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(pub(crate) String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Secret(secret)
    }
}

impl From<&str> for Secret {
    fn from(secret: &str) -> Self {
        Secret(secret.to_string())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What the client asks for in `tune-ok` (each is a maximum; 0 = no preference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneRequest {
    /// Highest channel number wanted (0 = the server's).
    pub channel_max: u16,
    /// Largest frame wanted (0 = the server's); raised to [`MIN_FRAME_MAX`].
    pub frame_max: u32,
    /// Heartbeat interval wanted in seconds (0 = the server's).
    pub heartbeat: u16,
}

impl Default for TuneRequest {
    fn default() -> Self {
        TuneRequest {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat: 60,
        }
    }
}

/// The limits both sides agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuned {
    /// Highest usable channel number.
    pub channel_max: u16,
    /// Largest frame in bytes, envelope included.
    pub frame_max: u32,
    /// Heartbeat interval in seconds (0 = none).
    pub heartbeat: u16,
}

/// The smaller of two limits where 0 means "no limit".
fn smaller_nonzero<T: Ord + Default + Copy>(a: T, b: T) -> T {
    let zero = T::default();
    if a == zero {
        b
    } else if b == zero {
        a
    } else {
        a.min(b)
    }
}

/// Negotiates `tune-ok` from the server's `tune` and our request, as
/// RabbitMQ expects: `frame_max` at least [`MIN_FRAME_MAX`] and at most the
/// server's; `channel_max` between 1 and the server's; heartbeat the smaller
/// non-zero of the two.
pub(crate) fn negotiate(server: &ConnectionTune, ours: &TuneRequest) -> Tuned {
    let channel_max = match smaller_nonzero(server.channel_max, ours.channel_max) {
        0 => u16::MAX,
        n => n,
    };
    let wanted_frame = ours.frame_max.max(MIN_FRAME_MAX);
    let frame_max = match server.frame_max {
        0 => wanted_frame,
        // A server that allows less than our floor gets what it allows:
        // exceeding its maximum is a certain refusal.
        server_max => wanted_frame.min(server_max),
    };
    Tuned {
        channel_max,
        frame_max,
        heartbeat: smaller_nonzero(server.heartbeat, ours.heartbeat),
    }
}

impl From<Tuned> for ConnectionTuneOk {
    fn from(t: Tuned) -> Self {
        ConnectionTuneOk {
            channel_max: t.channel_max,
            frame_max: t.frame_max,
            heartbeat: t.heartbeat,
        }
    }
}

/// The client properties acemq sends: product, version, platform, and the
/// capabilities RabbitMQ looks for before it uses its extensions.
pub(crate) fn client_properties(connection_name: Option<&str>) -> FieldTable {
    let mut capabilities = FieldTable::new();
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ] {
        capabilities.insert(cap, FieldValue::Bool(true));
    }
    let mut props = FieldTable::new();
    props.insert("product", FieldValue::from("acemq"));
    props.insert("version", FieldValue::from(env!("CARGO_PKG_VERSION")));
    props.insert("platform", FieldValue::from("Rust"));
    props.insert("information", FieldValue::from("https://example.invalid/acemq"));
    props.insert("capabilities", FieldValue::Table(capabilities));
    if let Some(name) = connection_name {
        props.insert("connection_name", FieldValue::from(name));
    }
    props
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tune(channel_max: u16, frame_max: u32, heartbeat: u16) -> ConnectionTune {
        ConnectionTune {
            channel_max,
            frame_max,
            heartbeat,
        }
    }

    #[test]
    fn heartbeat_is_the_smaller_non_zero_of_the_two() {
        let ours = |heartbeat| TuneRequest {
            heartbeat,
            ..TuneRequest::default()
        };
        assert_eq!(negotiate(&tune(0, 0, 60), &ours(10)).heartbeat, 10);
        assert_eq!(negotiate(&tune(0, 0, 5), &ours(10)).heartbeat, 5);
        assert_eq!(negotiate(&tune(0, 0, 60), &ours(0)).heartbeat, 60);
        assert_eq!(negotiate(&tune(0, 0, 0), &ours(30)).heartbeat, 30);
        assert_eq!(negotiate(&tune(0, 0, 0), &ours(0)).heartbeat, 0);
    }

    #[test]
    fn frame_max_is_at_least_8192_and_at_most_the_servers() {
        let ours = |frame_max| TuneRequest {
            frame_max,
            ..TuneRequest::default()
        };
        assert_eq!(negotiate(&tune(0, 131_072, 0), &ours(4096)).frame_max, 8192);
        assert_eq!(negotiate(&tune(0, 131_072, 0), &ours(1 << 20)).frame_max, 131_072);
        assert_eq!(negotiate(&tune(0, 0, 0), &ours(0)).frame_max, 8192);
        assert_eq!(negotiate(&tune(0, 65_536, 0), &ours(0)).frame_max, 8192);
    }

    #[test]
    fn channel_max_is_between_one_and_the_servers() {
        let ours = |channel_max| TuneRequest {
            channel_max,
            ..TuneRequest::default()
        };
        assert_eq!(negotiate(&tune(2047, 0, 0), &ours(0)).channel_max, 2047);
        assert_eq!(negotiate(&tune(2047, 0, 0), &ours(10)).channel_max, 10);
        assert_eq!(negotiate(&tune(0, 0, 0), &ours(0)).channel_max, u16::MAX);
    }

    #[test]
    fn passwords_never_appear_in_debug_output() {
        let auth = Auth::plain("guest", "hunter2");
        assert!(!format!("{auth:?}").contains("hunter2"));
        assert_eq!(auth.response().as_bytes(), b"\0guest\0hunter2");
    }

    #[test]
    fn client_properties_advertise_the_capabilities_rabbitmq_needs() {
        let props = client_properties(Some("orders"));
        let caps = props.get("capabilities").and_then(FieldValue::as_table).unwrap();
        for cap in [
            "publisher_confirms",
            "exchange_exchange_bindings",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "authentication_failure_close",
        ] {
            assert_eq!(caps.get(cap), Some(&FieldValue::Bool(true)), "{cap}");
        }
    }
}
