//! AMQP URLs: `amqp[s]://user:pass@host:port[,host:port...]/vhost?heartbeat=&frame_max=&channel_max=&connection_timeout=`,
//! and `memory://name[/vhost][?confirms=off]` for an in-process acemq-memory broker.
//!
//! The password never appears in `Debug` or `Display`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::proto::Secret;

/// A parsed AMQP URL.
#[derive(Clone, PartialEq, Eq)]
pub struct AmqpUrl {
    /// `amqps`: TLS.
    pub tls: bool,
    /// `memory`: the in-process acemq-memory broker named by the host.
    pub memory: bool,
    /// The hosts to try in turn, with their ports.
    pub hosts: Vec<(String, u16)>,
    /// The user name (`guest` when absent).
    pub username: String,
    /// The password (`guest` when absent).
    pub password: Secret,
    /// The virtual host, percent-decoded (`/` when the path is empty).
    pub vhost: String,
    /// `heartbeat=` seconds.
    pub heartbeat: Option<u16>,
    /// `frame_max=` bytes.
    pub frame_max: Option<u32>,
    /// `channel_max=`.
    pub channel_max: Option<u16>,
    /// `connection_timeout=` milliseconds.
    pub connection_timeout: Option<Duration>,
    /// `auth_mechanism=external` (or `plain`, `amqplain`).
    pub auth_mechanism: Option<String>,
    /// `confirms=off` (or `on`): whether the acemq API publishes with
    /// confirms; the low-level API ignores it.
    pub confirms: Option<bool>,
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid AMQP URL: {0}")]
pub struct UrlError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, UrlError> {
    Err(UrlError(msg.into()))
}

// No error below quotes the URL: whatever part it would quote might be a
// password, or a piece of one (a password with an unescaped `/`, `?` or
// `%`, or a URL whose `@` was forgotten, puts password characters where a
// port, a host or a vhost is expected). Errors say what is wrong and where.

/// Decodes `%XX` escapes in `what` (e.g. `the password`); refuses
/// malformed ones and non-UTF-8 results.
fn percent_decode(s: &str, what: &str) -> Result<String, UrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let byte = s
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .filter(|_| bytes[i + 1].is_ascii_hexdigit() && bytes[i + 2].is_ascii_hexdigit())
                .ok_or_else(|| {
                    UrlError(format!(
                        "{what} has a % that does not start an escape of two hex digits (write % itself as %25)"
                    ))
                })?;
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UrlError(format!("{what} decodes to invalid UTF-8")))
}

/// Host `n` (from 1) of the host list.
fn parse_host(part: &str, n: usize, default_port: u16) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(rest) = part.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| UrlError(format!("host {n} opens a [ it does not close")))?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return err(format!("host {n} has something other than :port after its ]")),
        };
        (host.to_string(), port)
    } else {
        match part.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (part.to_string(), None),
        }
    };
    if host.is_empty() {
        return err(format!("host {n} is empty"));
    }
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p
            .parse()
            .map_err(|_| UrlError(format!("the port of host {n} is not a number from 0 to 65535")))?,
    };
    Ok((percent_decode(&host, &format!("host {n}"))?, port))
}

impl FromStr for AmqpUrl {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, UrlError> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| UrlError("missing scheme (amqp://, amqps:// or memory://)".into()))?;
        let (tls, memory) = match scheme.to_ascii_lowercase().as_str() {
            "amqp" => (false, false),
            "amqps" => (true, false),
            "memory" => (false, true),
            _ => return err("the scheme is not amqp, amqps or memory"),
        };
        let default_port = if tls { 5671 } else { 5672 };
        // The credentials end at the last `@` before the path or query: an
        // `@` after a `/` or `?` means a user name or password with an
        // unescaped `/` or `?` (or a vhost with an unescaped `@`), which
        // would otherwise be read as the host, port, vhost or options.
        if let Some(at) = rest.find(['/', '?']) {
            if rest[at..].contains('@') {
                return err(
                    "there is an @ after the first / or ?: in credentials write / as %2F and ? as %3F; \
                     in a vhost or an option write @ as %40",
                );
            }
        }
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            Some(info) => match info.split_once(':') {
                Some((u, p)) => (percent_decode(u, "the user name")?, percent_decode(p, "the password")?),
                None => (percent_decode(info, "the user name")?, String::new()),
            },
            None => ("guest".to_string(), "guest".to_string()),
        };
        let hosts = if memory {
            if hostlist.is_empty() || hostlist.contains(',') {
                return err("memory:// needs exactly one broker name");
            }
            vec![(percent_decode(hostlist, "the broker name")?, 0)]
        } else if hostlist.is_empty() {
            vec![("localhost".to_string(), default_port)]
        } else {
            hostlist
                .split(',')
                .enumerate()
                .map(|(i, h)| parse_host(h, i + 1, default_port))
                .collect::<Result<Vec<_>, _>>()?
        };
        let vhost = match path {
            None | Some("") => "/".to_string(),
            Some(p) if p.contains('/') => return err("the vhost must be one path segment (write / as %2f)"),
            Some(p) => percent_decode(p, "the vhost")?,
        };
        let mut url = AmqpUrl {
            tls,
            memory,
            hosts,
            username,
            password: Secret::new(password),
            vhost,
            heartbeat: None,
            frame_max: None,
            channel_max: None,
            connection_timeout: None,
            auth_mechanism: None,
            confirms: None,
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |expected: &str| UrlError(format!("the value of option {key} is not {expected}"));
            match key {
                "heartbeat" => url.heartbeat = Some(value.parse().map_err(|_| bad("seconds from 0 to 65535"))?),
                "frame_max" => url.frame_max = Some(value.parse().map_err(|_| bad("a number of bytes"))?),
                "channel_max" => url.channel_max = Some(value.parse().map_err(|_| bad("a number from 0 to 65535"))?),
                "connection_timeout" => {
                    url.connection_timeout =
                        Some(Duration::from_millis(value.parse().map_err(|_| bad("milliseconds"))?))
                }
                "auth_mechanism" => match value.to_ascii_lowercase().as_str() {
                    m @ ("plain" | "amqplain" | "external") => url.auth_mechanism = Some(m.to_string()),
                    _ => return Err(bad("plain, amqplain or external")),
                },
                "confirms" => {
                    url.confirms = Some(match value {
                        "on" | "true" | "1" => true,
                        "off" | "false" | "0" => false,
                        _ => return Err(bad("on or off")),
                    })
                }
                // Other clients' options (e.g. `cacertfile`) are configured
                // in code here. Named only when it is one plain word.
                other
                    if !other.is_empty()
                        && other.len() <= 32
                        && other.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') =>
                {
                    return err(format!("unknown option {other:?}"))
                }
                _ => return err("an option of the query is not known"),
            }
        }
        Ok(url)
    }
}

impl fmt::Display for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (self.memory, self.tls) {
            (true, _) => "memory",
            (false, true) => "amqps",
            (false, false) => "amqp",
        };
        write!(f, "{scheme}://{}:***@", self.username)?;
        for (i, (host, port)) in self.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if host.contains(':') {
                write!(f, "[{host}]:{port}")?;
            } else {
                write!(f, "{host}:{port}")?;
            }
        }
        let vhost = self.vhost.replace('%', "%25").replace('/', "%2f");
        write!(f, "/{vhost}")
    }
}

impl fmt::Debug for AmqpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmqpUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_url_parses_with_a_percent_decoded_vhost() {
        let url: AmqpUrl = "amqps://user:p%40ss@broker.example:5999/%2f?heartbeat=10&frame_max=65536&channel_max=64&connection_timeout=2500"
            .parse()
            .unwrap();
        assert!(url.tls);
        assert_eq!(url.hosts, [("broker.example".to_string(), 5999)]);
        assert_eq!(url.username, "user");
        assert_eq!(url.password.expose(), "p@ss");
        assert_eq!(url.vhost, "/");
        assert_eq!(url.heartbeat, Some(10));
        assert_eq!(url.frame_max, Some(65536));
        assert_eq!(url.channel_max, Some(64));
        assert_eq!(url.connection_timeout, Some(Duration::from_millis(2500)));
    }

    #[test]
    fn defaults_and_several_hosts() {
        let url: AmqpUrl = "amqp://h1,h2:5673,[::1]:5674/orders".parse().unwrap();
        assert_eq!(
            url.hosts,
            [
                ("h1".to_string(), 5672),
                ("h2".to_string(), 5673),
                ("::1".to_string(), 5674)
            ]
        );
        assert_eq!((url.username.as_str(), url.password.expose()), ("guest", "guest"));
        assert_eq!(url.vhost, "orders");
        let url: AmqpUrl = "amqps://localhost".parse().unwrap();
        assert_eq!(url.hosts, [("localhost".to_string(), 5671)]);
        assert_eq!(url.vhost, "/");
    }

    #[test]
    fn the_password_never_appears_in_debug_or_display() {
        let url: AmqpUrl = "amqp://admin:s3cret-pw@localhost/".parse().unwrap();
        assert!(!format!("{url}").contains("s3cret"));
        assert!(!format!("{url:?}").contains("s3cret"));
        assert_eq!(url.to_string(), "amqp://admin:***@localhost:5672/%2f");
    }

    #[test]
    fn refused_urls_quote_no_part_of_the_password() {
        for (url, secret) in [
            ("amqp://u:s3cr3t%@h/", "s3cr3t"),
            ("amqp://u:pa/ss@h", "pa"),
            ("amqp://u:pa?ss@h", "pa"),
            ("amqp://u:9999x/", "9999x"),
            ("amqp://u:pw%zz@h/", "pw"),
            ("amqp:u:hunter2@h://x", "hunter2"),
            ("amqp://u:ok@h?heartbeat=hunter2", "hunter2"),
        ] {
            let err = url.parse::<AmqpUrl>().unwrap_err();
            assert!(!err.to_string().contains(secret), "{url}: {err}");
            assert!(!format!("{err:?}").contains(secret), "{url}: {err:?}");
        }
        let err = "amqp://u:pa/ss@h".parse::<AmqpUrl>().unwrap_err();
        assert!(err.to_string().contains("%2F"), "says how to write it: {err}");
    }

    #[test]
    fn memory_urls_name_a_broker_and_may_turn_confirms_off() {
        let url: AmqpUrl = "memory://orders-test?confirms=off".parse().unwrap();
        assert!(url.memory);
        assert_eq!(url.hosts, [("orders-test".to_string(), 0)]);
        assert_eq!(url.vhost, "/");
        assert_eq!(url.confirms, Some(false));
        assert!("memory://".parse::<AmqpUrl>().is_err());
    }

    #[test]
    fn malformed_urls_are_refused() {
        for bad in [
            "http://localhost",
            "localhost:5672",
            "amqp://host:notaport",
            "amqp://host/a/b",
            "amqp://host/%zz",
            "amqp://host?heartbeat=-1",
            "amqp://host?bogus=1",
            "amqp://[::1/",
        ] {
            assert!(bad.parse::<AmqpUrl>().is_err(), "{bad}");
        }
    }
}
