//! `acemq`: acemq's operator tool. Works through the dead letters and
//! parked messages of a queue (grouped by failure, filtered, replayed,
//! deleted, moved, exported and imported), and checks or declares a
//! queue's topology against the wire contract (`docs/wire-contract.md`).
//!
//! `cargo install acemq-cli` (or `cargo install --path acemq-core/cli`)
//! installs it; `acemq --help` shows the workflow and the exit codes.
#![forbid(unsafe_code)]
// The doc comments of the command line are its `--help` text, where
// `amqp[s]://` and `INITIAL[:MAX]` are literal brackets, not links.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;
use std::time::Duration;

use acemq_core::amqp::{AmqpUrl, CloseReason, Config as EngineConfig, TlsConfig};
use acemq_core::{Config, Conn};
use clap::{Args, Parser, Subcommand};

mod dlq;
mod filter;
use acemq_cli::render;
mod topology;
mod transfer;

/// The exit code of a run that did what it was asked (no differences).
const OK: u8 = 0;
/// The exit code of differences found, of messages kept back (they could
/// not go where they were sent, and stay where they were), or of a command
/// that could not finish (e.g. no such queue).
const FAILED: u8 = 1;
/// The exit code of a command line that cannot be run (as clap exits).
const USAGE: u8 = 2;
/// The exit code of a broker that could not be reached, or refused:
/// connection refused or timed out, authentication failed, access refused.
const UNREACHABLE: u8 = 3;

const WORKFLOW: &str = "\
The dead-letter workflow (QUEUE is the source queue: `orders` works on orders.dlq,
or with --parked on orders.parked):
  acemq dlq summary orders                      counts by failure group, original destination and age
  acemq dlq list orders --group 1               the messages of failure group 1, in order
  acemq dlq show orders MESSAGE_ID              one message: envelope, error, headers, body
  acemq dlq replay orders --group 1 --dry-run   what would go back into orders, and where
  acemq dlq replay orders --group 1             send them back (attempt 1, same message-id)
  acemq dlq delete orders --error-contains 'card declined' --older-than 7d --yes
  acemq dlq move orders --to orders.archive --older-than 30d
  acemq dlq export orders > orders-dlq.ndjson   a copy (--remove takes them out as written)
  acemq dlq import orders < orders-dlq.ndjson   back into orders.dlq, exactly as exported
Filters (list, replay, delete, move, export; all must match): --error-contains TEXT,
--older-than DURATION (since first seen), --header K=V (repeatable), --group N (from summary).
Nothing is consumed that a command does not finish with: every message is read without
an ack, and only what was handled is removed; the rest stay, in their order.

Comparing two brokers (no --url; see `acemq conformance diff --help`):
  acemq conformance diff URL_A URL_B --cases 200 [--seed S]

Exit codes:
  0  done; no differences
  1  differences found, messages kept back, or the command could not finish
  2  the command line is wrong (a bad flag or value, no URL)
  3  the broker could not be reached or refused (connection, authentication, access)";

/// acemq's operator tool: dead letters and parked messages, and the wire
/// contract's topology.
#[derive(Debug, Parser)]
#[command(name = "acemq", version, propagate_version = true, after_help = WORKFLOW)]
struct Cli {
    /// The broker: amqp[s]://user:password@host:port/vhost (the password is
    /// never printed).
    #[arg(long, global = true, env = "AMQP_URL", hide_env_values = true, value_name = "URL")]
    url: Option<String>,
    /// PEM file of the CA that signed the broker's certificate (amqps://;
    /// by default the web's root CAs).
    #[arg(
        long,
        global = true,
        env = "AMQP_CA_FILE",
        hide_env_values = true,
        value_name = "PEM"
    )]
    ca_file: Option<std::path::PathBuf>,
    /// Give up after this long (e.g. 30s, 10m, 1h 30m).
    #[arg(long, global = true, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The dead letters ({queue}.dlq) or parked messages ({queue}.parked) of a queue.
    #[command(subcommand)]
    Dlq(dlq::DlqCommand),
    /// A queue's topology: is it the wire contract? Declare it.
    #[command(subcommand)]
    Topology(topology::TopologyCommand),
    /// Tools for broker authors: RabbitMQ's behaviours checked against any
    /// broker, and two brokers compared.
    #[command(subcommand)]
    Conformance(ConformanceCommand),
}

/// `acemq conformance ...`.
#[derive(Debug, Subcommand)]
enum ConformanceCommand {
    /// Runs the catalogue of RabbitMQ behaviours against a broker and
    /// prints pass, fail (expected and got) or n/a for each check.
    #[command(after_help = acemq_cli::conformance::check::HELP)]
    Check(acemq_cli::conformance::check::CheckArgs),
    /// Two brokers on the same random operation sequences: where do they answer differently?
    Diff(acemq_cli::conformance::diff::DiffArgs),
}

/// Which set-aside queue of a source queue.
#[derive(Debug, Args, Clone)]
pub(crate) struct SetAsideQueue {
    /// The source queue's name (e.g. `orders`): its `orders.dlq` is read.
    #[arg(value_name = "QUEUE")]
    queue: String,
    /// The parked messages (`{QUEUE}.parked`) instead of the dead letters (`{QUEUE}.dlq`).
    #[arg(long)]
    parked: bool,
}

impl SetAsideQueue {
    /// `{queue}.dlq` or `{queue}.parked`.
    pub(crate) fn name(&self) -> String {
        format!("{}.{}", self.queue, if self.parked { "parked" } else { "dlq" })
    }
}

/// Why a command stopped: the text to print and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl From<String> for Failure {
    /// A failure that is not the broker's refusal: exit code 1.
    fn from(message: String) -> Failure {
        Failure { code: FAILED, message }
    }
}

impl Failure {
    /// A usage error (exit code 2) found after parsing.
    pub(crate) fn usage(message: String) -> Failure {
        Failure { code: USAGE, message }
    }

    /// A failure talking to the broker while doing `what`: exit code 3 if
    /// the broker refused access or went away, 1 otherwise.
    pub(crate) fn broker(what: impl std::fmt::Display, err: impl Into<acemq_core::Error>) -> Failure {
        let err = err.into();
        Failure {
            code: if unreachable(&err) { UNREACHABLE } else { FAILED },
            message: format!("{what}: {err}"),
        }
    }
}

/// Whether `err` says the broker refused access (403 ACCESS_REFUSED, 530
/// NOT_ALLOWED) or could not be reached or stopped answering.
fn unreachable(err: &acemq_core::Error) -> bool {
    use acemq_core::Error;
    let refused = |code: u16| matches!(code, 403 | 530);
    match err {
        Error::Refused { code, .. } => refused(*code),
        Error::Closed(CloseReason::ByServer(r)) => refused(r.code) || r.code == 320,
        Error::Closed(CloseReason::ByClient | CloseReason::ProtocolError { .. }) => false,
        Error::Closed(_) | Error::Io(_) | Error::ConnectionLost { .. } | Error::RecoveryGaveUp { .. } => true,
        _ => false,
    }
}

/// The outcome of a command: its exit code, or why it stopped.
pub(crate) type Outcome = Result<u8, Failure>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Its brokers are its arguments, not --url; it runs a runtime of its own.
    if let Command::Conformance(ConformanceCommand::Diff(args)) = &cli.command {
        let code = acemq_cli::conformance::diff::command::main(
            args,
            cli.ca_file.as_deref(),
            cli.timeout,
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        );
        return ExitCode::from(code);
    }
    // `conformance check` takes the URL as its argument too.
    let positional = match &cli.command {
        Command::Conformance(ConformanceCommand::Check(args)) => args.url.clone(),
        _ => None,
    };
    let Some(raw_url) = positional.or_else(|| cli.url.clone()).filter(|u| !u.trim().is_empty()) else {
        eprintln!("acemq: no broker URL: pass --url or set AMQP_URL (e.g. amqp://user:password@localhost:5672/%2f)");
        return ExitCode::from(USAGE);
    };
    let secrets = Secrets::of(&raw_url);
    let url: AmqpUrl = match raw_url.parse() {
        Ok(url) => url,
        Err(e) => {
            eprintln!("acemq: {}", render::safe(&secrets.scrub(&e.to_string())));
            return ExitCode::from(USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("acemq: cannot start the runtime: {e}");
            return ExitCode::from(FAILED);
        }
    };
    if let Command::Conformance(ConformanceCommand::Check(args)) = &cli.command {
        let deadline = tokio::time::Instant::now().checked_add(cli.timeout);
        let output = runtime.block_on(async {
            within(deadline, acemq_cli::conformance::check::command(args, &url))
                .await
                .unwrap_or_else(|| acemq_cli::conformance::check::Output {
                    stdout: String::new(),
                    stderr: Some(format!("gave up after {} (--timeout)", render::duration(cli.timeout))),
                    code: FAILED,
                })
        });
        print!("{}", output.stdout);
        if let Some(message) = output.stderr {
            eprintln!("acemq: {}", render::safe(&secrets.scrub(&message)));
        }
        return ExitCode::from(output.code);
    }
    let outcome = runtime.block_on(run(cli, raw_url, &url));
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("acemq: {}", render::safe(&secrets.scrub(&failure.message)));
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli, raw_url: String, url: &AmqpUrl) -> Outcome {
    let timeout = cli.timeout;
    // A deadline past what the clock can hold is no deadline.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    let gave_up = |code: u8| Failure {
        code,
        message: format!("gave up after {} (--timeout) on {url}", render::duration(timeout)),
    };
    let mut tls = TlsConfig::new();
    if let Some(path) = &cli.ca_file {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        tls = tls
            .with_root_pem(&pem)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let config = Config::default()
        // One run, one answer: a lost connection is an error, not a wait.
        .with_without_recovery(true)
        .with_engine(EngineConfig::default().with_connection_timeout(Duration::from_secs(10)))
        .with_connection_name("acemq-cli")
        .with_tls(tls);
    let open = Conn::open(&raw_url, config);
    let conn = match within(deadline, open).await {
        None => return Err(gave_up(UNREACHABLE)),
        // Whatever stops the connection from opening: unreachable or refused.
        Some(Err(e)) => {
            return Err(Failure {
                code: UNREACHABLE,
                message: format!("cannot connect to {url}: {e}"),
            })
        }
        Some(Ok(conn)) => conn,
    };
    let command = async {
        match cli.command {
            Command::Dlq(command) => dlq::run(&conn, command).await,
            Command::Topology(command) => topology::run(&conn, command).await,
            // Handled in `main`, before any `Conn` is opened.
            Command::Conformance(_) => Ok(OK),
        }
    };
    let outcome = within(deadline, command).await.unwrap_or_else(|| Err(gave_up(FAILED)));
    let _ = conn.close().await;
    outcome
}

/// `work`, or `None` if `deadline` passes first.
async fn within<T>(deadline: Option<tokio::time::Instant>, work: impl std::future::Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
        None => Some(work.await),
    }
}

/// The URL's password, as written and decoded, to take out of any text
/// before it is printed (error texts may quote parts of the URL).
struct Secrets(Vec<String>);

impl Secrets {
    fn of(raw_url: &str) -> Secrets {
        let mut out = Vec::new();
        if let Some((_, rest)) = raw_url.split_once("://") {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                if let Some((_, password)) = userinfo.split_once(':') {
                    if !password.is_empty() {
                        out.push(password.to_string());
                        if let Ok(url) = raw_url.parse::<AmqpUrl>() {
                            out.push(url.password.expose().to_string());
                        }
                    }
                }
            }
        }
        out.retain(|s| !s.is_empty());
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out.dedup();
        Secrets(out)
    }

    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in &self.0 {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

/// A duration as humantime writes it (`1500ms`, `10s`, `5m`, `1h 30m`,
/// `7d`), or `0`; one too long for the clock is refused, not wrapped.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 1500ms, 10s, 5m, 1h or 7d: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed_as_written_and_decoded() {
        let s = Secrets::of("amqp://ops:p%40ss-w0rd@host:5672/%2f");
        assert_eq!(s.scrub("bad p%40ss-w0rd and p@ss-w0rd"), "bad *** and ***");
        assert!(Secrets::of("amqp://host/").0.is_empty());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("").is_err());
        // 307445734561825861 minutes is 2^64 seconds and a bit: refused,
        // not wrapped round to 44 s.
        assert!(parse_duration("307445734561825861m").is_err());
        assert!(parse_duration("18446744073709551616s").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn refusals_of_access_and_lost_brokers_are_exit_code_3() {
        use acemq_core::amqp::Refusal;
        use acemq_core::Error;
        let refused = |code: u16| Error::Refused {
            code,
            text: "refused".into(),
            class_id: 50,
            method_id: 10,
        };
        let closed = |code: u16| {
            Error::Closed(CloseReason::ByServer(Refusal {
                code,
                text: "closed".into(),
                class_id: 0,
                method_id: 0,
            }))
        };
        for (err, code) in [
            (refused(403), UNREACHABLE),
            (refused(530), UNREACHABLE),
            (refused(404), FAILED),
            (refused(406), FAILED),
            (closed(403), UNREACHABLE),
            (closed(320), UNREACHABLE),
            (Error::Closed(CloseReason::ConnectionLost), UNREACHABLE),
            (Error::Closed(CloseReason::ByClient), FAILED),
            (
                Error::Io(std::sync::Arc::new(std::io::Error::from(
                    std::io::ErrorKind::ConnectionReset,
                ))),
                UNREACHABLE,
            ),
            (Error::Nacked { message_id: "m".into() }, FAILED),
        ] {
            assert_eq!(Failure::broker("doing it", err.clone()).code, code, "{err:?}");
        }
    }

    #[test]
    fn a_duration_that_overflows_is_a_usage_error() {
        let err = Cli::try_parse_from(["acemq", "--timeout", "307445734561825861m", "dlq", "list", "q"]).unwrap_err();
        assert_eq!(err.exit_code(), i32::from(USAGE));
        assert!(Cli::try_parse_from(["acemq", "--timeout", "90s", "dlq", "list", "q"]).is_ok());
    }
}
