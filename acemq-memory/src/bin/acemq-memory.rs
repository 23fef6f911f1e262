//! `acemq-memory`: the in-process broker served on TCP, so services in any
//! language can run their tests against it.
//!
//! ```text
//! acemq-memory [--listen ADDR] [--rabbitmq-version 3.10|4.0]
//!              [--user NAME:PASSWORD]... [--allow-remote-guest]
//!              [--max-connections N]
//! ```
//!
//! Without `--user` the one user is `guest`/`guest`; each `--user` adds
//! one, and then `guest` exists only if named. `guest` may log in only
//! from a loopback address unless `--allow-remote-guest` (RabbitMQ's
//! `loopback_users`); listening on an address beyond loopback logs a
//! warning.
//!
//! `--rabbitmq-version` chooses the RabbitMQ whose behaviour it imitates
//! where the versions differ (default 4.0; the crate docs list the
//! differences).
//!
//! It prints `acemq-memory: listening on ADDR` on stdout once it accepts
//! connections (with port 0, the port it was given), logs through `tracing`
//! on stderr (`RUST_LOG`, default `info`), and on SIGINT or SIGTERM stops
//! accepting, closes every client connection with 320 CONNECTION_FORCED as
//! RabbitMQ does when it shuts down, and exits 0.
#![forbid(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use acemq_memory::{Broker, BrokerConfig, RabbitMqVersion, User};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Where it listens unless `--listen` says otherwise.
const DEFAULT_LISTEN: &str = "127.0.0.1:5673";

/// The detail of the 320 every client gets at shutdown, RabbitMQ's own:
/// `CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'`.
const SHUTDOWN_REASON: &str = "broker forced connection closure with reason 'shutdown'";

/// How long the clients have, past the broker's own `close-ok` timeout, to
/// answer the shutdown close before their sockets are dropped.
const SHUTDOWN_SLACK: Duration = Duration::from_secs(2);

/// How often the shutdown close is sent again to connections that reached
/// the broker after it was first sent.
const CLOSE_AGAIN: Duration = Duration::from_millis(50);

const USAGE: &str = "\
acemq-memory: an AMQP 0-9-1 broker that behaves like RabbitMQ, for tests

Usage: acemq-memory [--listen ADDR] [--rabbitmq-version 3.10|4.0]
                    [--user NAME:PASSWORD]... [--allow-remote-guest]
                    [--max-connections N]

Options:
  --listen ADDR  the address to listen on (default 127.0.0.1:5673; port 0 picks
                 a free port). Printed once listening as
                 `acemq-memory: listening on ADDR`.
  --rabbitmq-version 3.10|4.0
                 the RabbitMQ whose behaviour to imitate where the versions
                 differ (default 4.0)
  --user NAME:PASSWORD
                 a user who may log in (repeatable; the password is what
                 follows the first ':'). With any --user, guest exists only
                 if named.
  --allow-remote-guest
                 let guest log in from any address (by default only from
                 loopback, as RabbitMQ's loopback_users)
  --max-connections N
                 refuse connection.open past N open connections (530)
  -h, --help     print this help

Users: guest/guest on the virtual host `/` (amqp://guest:guest@127.0.0.1:5673/)
unless --user is given. Listening beyond loopback logs a warning.
Logs go to stderr; RUST_LOG sets the filter (default `info`).
SIGINT or SIGTERM closes every connection with 320 CONNECTION_FORCED and exits 0.";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Serve(Options),
    Help,
}

/// How to serve.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    listen: String,
    version: RabbitMqVersion,
    /// Empty: the default `guest`.
    users: Vec<User>,
    allow_remote_guest: bool,
    max_connections: Option<usize>,
}

impl Options {
    fn config(&self) -> BrokerConfig {
        let mut config = BrokerConfig::for_version(self.version).with_max_connections(self.max_connections);
        if !self.users.is_empty() {
            config = config.with_users(self.users.iter().cloned());
        }
        if self.allow_remote_guest {
            config.loopback_users.retain(|u| u != "guest");
        }
        config
    }
}

/// `NAME:PASSWORD`, split at the first ':'.
fn parse_user(text: &str) -> Result<User, String> {
    match text.split_once(':') {
        Some((name, password)) if !name.is_empty() => Ok(User::new(name, password)),
        _ => Err(format!("--user needs NAME:PASSWORD, got '{text}'")),
    }
}

/// Parses the arguments after the program name. The error is the message
/// for a usage error (exit code 2).
fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    const NEEDS_ADDRESS: &str = "--listen needs an address, e.g. --listen 127.0.0.1:5673";
    const NEEDS_VERSION: &str = "--rabbitmq-version needs 3.10 or 4.0";
    const NEEDS_USER: &str = "--user needs NAME:PASSWORD";
    const NEEDS_COUNT: &str = "--max-connections needs a number";
    let mut options = Options {
        listen: DEFAULT_LISTEN.to_owned(),
        version: RabbitMqVersion::default(),
        users: Vec::new(),
        allow_remote_guest: false,
        max_connections: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(Command::Help);
        }
        // `--name value` or `--name=value`; a value never starts with '-'.
        let (name, value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = |needs: &str| match value.clone().or_else(|| args.next()) {
            Some(v) if !v.is_empty() && !v.starts_with('-') => Ok(v),
            _ => Err(needs.to_owned()),
        };
        match name {
            "--listen" => options.listen = value(NEEDS_ADDRESS)?,
            "--rabbitmq-version" => {
                options.version = value(NEEDS_VERSION)?
                    .parse()
                    .map_err(|e| format!("--rabbitmq-version: {e}"))?
            }
            "--user" => {
                let user = parse_user(&value(NEEDS_USER)?)?;
                options.users.retain(|u| u.name != user.name);
                options.users.push(user);
            }
            "--allow-remote-guest" => options.allow_remote_guest = true,
            "--max-connections" => {
                let count = value(NEEDS_COUNT)?;
                let max = count
                    .parse::<usize>()
                    .map_err(|_| format!("--max-connections needs a number, got '{count}'"))?;
                options.max_connections = Some(max);
            }
            _ if arg.starts_with('-') => return Err(format!("unknown option '{name}'")),
            _ => return Err(format!("unexpected argument '{arg}'")),
        }
    }
    Ok(Command::Serve(options))
}

fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(Command::Serve(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("acemq-memory: {message}\nTry 'acemq-memory --help'.");
            return ExitCode::from(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("acemq-memory: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("acemq-memory: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Serves a broker on `listen` until a signal, then shuts down.
async fn run(options: &Options) -> io::Result<()> {
    let (listen, version) = (options.listen.as_str(), options.version);
    // Before the address is printed: whoever reads it may signal at once.
    let mut signals = Signals::new()?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|err| io::Error::new(err.kind(), format!("cannot listen on {listen}: {err}")))?;
    let local = listener.local_addr()?;
    let config = options.config();
    let grace = config.close_timeout + SHUTDOWN_SLACK;
    let broker = Broker::new(config);
    // The stable line scripts and tests read.
    println!("acemq-memory: listening on {local}");
    tracing::info!(rabbitmq_version = %version, "imitating RabbitMQ {version}");
    match config_users(options).as_slice() {
        [only] if only == "guest" => tracing::info!(%local, "acemq-memory listening (amqp://guest:guest@{local}/)"),
        users => tracing::info!(%local, ?users, "acemq-memory listening"),
    }
    acemq_memory::warn_if_exposed(local);

    let mut conns: JoinSet<SocketAddr> = JoinSet::new();
    let signal = loop {
        tokio::select! {
            signal = signals.recv() => break signal,
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    tracing::debug!(%peer, "connection accepted");
                    let broker = broker.clone();
                    conns.spawn(async move {
                        broker.serve_tcp(socket).await;
                        peer
                    });
                }
                Err(err) => {
                    // Out of file descriptors, a connection reset before it
                    // was accepted: RabbitMQ goes on accepting too.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(done) = conns.join_next(), if !conns.is_empty() => log_closed(done),
        }
    };

    drop(listener);
    tracing::info!(
        signal,
        connections = conns.len(),
        "shutting down: closing client connections with 320 CONNECTION_FORCED"
    );
    let faults = broker.faults();
    faults.close_all(SHUTDOWN_REASON);
    // A connection accepted just before the listener went may not have
    // reached the broker yet (its task not yet run), and the close above
    // missed it: close again until every connection has gone. A connection
    // already closing is not closed twice.
    let mut again = tokio::time::interval(CLOSE_AGAIN);
    again.reset();
    let drained = tokio::time::timeout(grace, async {
        loop {
            tokio::select! {
                done = conns.join_next() => match done {
                    Some(done) => log_closed(done),
                    None => return true,
                },
                _ = again.tick() => faults.close_all(SHUTDOWN_REASON),
                signal = signals.recv() => {
                    tracing::warn!(signal, "second signal: dropping the connections left");
                    return false;
                }
            }
        }
    })
    .await
    .unwrap_or(false);
    if !drained {
        tracing::warn!(
            connections = conns.len(),
            "connections that did not answer the close are dropped"
        );
        conns.shutdown().await;
    }
    tracing::info!("acemq-memory stopped");
    Ok(())
}

/// The names of the users who may log in.
fn config_users(options: &Options) -> Vec<String> {
    options.config().users.into_iter().map(|u| u.name).collect()
}

fn log_closed(done: Result<SocketAddr, tokio::task::JoinError>) {
    match done {
        Ok(peer) => tracing::debug!(%peer, "connection closed"),
        Err(err) => tracing::error!(%err, "a connection task failed"),
    }
}

/// SIGINT and SIGTERM, listened for from creation on.
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(windows)]
    ctrl_c: tokio::signal::windows::CtrlC,
}

impl Signals {
    #[cfg(unix)]
    fn new() -> io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    #[cfg(windows)]
    fn new() -> io::Result<Signals> {
        Ok(Signals {
            ctrl_c: tokio::signal::windows::ctrl_c()?,
        })
    }

    /// The next signal's name.
    #[cfg(unix)]
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }

    /// The next signal's name.
    #[cfg(windows)]
    async fn recv(&mut self) -> &'static str {
        self.ctrl_c.recv().await;
        "ctrl-c"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Command, String> {
        parse(list.iter().map(|s| s.to_string()))
    }

    fn serve_on(listen: &str, version: RabbitMqVersion) -> Result<Command, String> {
        Ok(Command::Serve(Options {
            listen: listen.into(),
            version,
            users: Vec::new(),
            allow_remote_guest: false,
            max_connections: None,
        }))
    }

    fn options(list: &[&str]) -> Options {
        match args(list) {
            Ok(Command::Serve(options)) => options,
            other => panic!("not a serve command: {other:?}"),
        }
    }

    #[test]
    fn the_default_address_is_5673_on_loopback() {
        assert_eq!(args(&[]), serve_on("127.0.0.1:5673", RabbitMqVersion::V4_0));
    }

    #[test]
    fn the_rabbitmq_version_is_chosen_in_either_form_and_defaults_to_4_0() {
        let serve = |version| serve_on("127.0.0.1:5673", version);
        assert_eq!(args(&["--rabbitmq-version", "3.10"]), serve(RabbitMqVersion::V3_10));
        assert_eq!(args(&["--rabbitmq-version=4.0"]), serve(RabbitMqVersion::V4_0));
        assert_eq!(args(&["--rabbitmq-version", "3.10.8"]), serve(RabbitMqVersion::V3_10));
        assert!(args(&["--rabbitmq-version", "3.9"])
            .unwrap_err()
            .contains("unknown RabbitMQ version"));
        assert!(args(&["--rabbitmq-version"]).unwrap_err().contains("needs 3.10 or 4.0"));
        assert!(args(&["--rabbitmq-version", "--listen", "x"])
            .unwrap_err()
            .contains("needs 3.10 or 4.0"));
    }

    #[test]
    fn listen_takes_an_address_in_either_form() {
        let serve = |addr: &str| serve_on(addr, RabbitMqVersion::V4_0);
        assert_eq!(args(&["--listen", "0.0.0.0:5672"]), serve("0.0.0.0:5672"));
        assert_eq!(args(&["--listen=localhost:0"]), serve("localhost:0"));
        assert!(args(&["--listen"]).unwrap_err().contains("needs an address"));
        assert!(args(&["--listen", "--help"]).unwrap_err().contains("needs an address"));
        assert!(args(&["--listen="]).unwrap_err().contains("needs an address"));
    }

    #[test]
    fn users_replace_guest_and_guest_stays_on_loopback_unless_allowed() {
        let default = options(&[]).config();
        assert_eq!(default.users, vec![User::new("guest", "guest")]);
        assert_eq!(default.loopback_users, vec!["guest".to_owned()]);

        let two = options(&["--user", "app:s3:cret", "--user=ops:pw"]).config();
        assert_eq!(two.users, vec![User::new("app", "s3:cret"), User::new("ops", "pw")]);
        assert_eq!(
            two.loopback_users,
            vec!["guest".to_owned()],
            "guest stays loopback-only if named"
        );

        let remote = options(&["--allow-remote-guest"]).config();
        assert!(remote.loopback_users.is_empty());
        assert_eq!(remote.users, vec![User::new("guest", "guest")]);

        assert_eq!(
            args(&["--user", "nopassword"]),
            Err("--user needs NAME:PASSWORD, got 'nopassword'".into())
        );
        assert_eq!(
            args(&["--user", ":pw"]),
            Err("--user needs NAME:PASSWORD, got ':pw'".into())
        );
        assert_eq!(args(&["--user"]), Err("--user needs NAME:PASSWORD".into()));
    }

    #[test]
    fn max_connections_takes_a_number() {
        assert_eq!(options(&["--max-connections", "3"]).config().max_connections, Some(3));
        assert_eq!(options(&[]).config().max_connections, None);
        assert_eq!(
            args(&["--max-connections", "many"]),
            Err("--max-connections needs a number, got 'many'".into())
        );
    }

    #[test]
    fn help_and_usage_errors() {
        assert_eq!(args(&["--help"]), Ok(Command::Help));
        assert_eq!(args(&["--listen", "127.0.0.1:1", "-h"]), Ok(Command::Help));
        assert_eq!(args(&["--bogus"]), Err("unknown option '--bogus'".into()));
        assert_eq!(args(&["5673"]), Err("unexpected argument '5673'".into()));
    }
}
