//! `acemq`: the operator CLI. Reads, replays and purges the
//! dead letters and parked messages of a queue, and checks or declares a
//! queue's topology against the wire contract (`docs/wire-contract.md`).
//!
//! Built behind the `cli` feature:
//! `cargo run -p acemq-core --features cli --bin acemq -- --help`.
#![forbid(unsafe_code)]
// The doc comments of the command line are its `--help` text, where
// `amqp[s]://` and `INITIAL[:MAX]` are literal brackets, not links.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;
use std::time::Duration;

use acemq_core::amqp::{AmqpUrl, Config as EngineConfig, TlsConfig};
use acemq_core::{Config, Conn};
use clap::{Args, Parser, Subcommand};

mod dlq;
mod render;
mod topology;

/// The exit code of a run that did what it was asked.
const OK: u8 = 0;
/// The exit code of differences found, messages that could not be replayed,
/// or a failure talking to the broker.
const FAILED: u8 = 1;
/// The exit code of a command line that cannot be run (as clap exits).
const USAGE: u8 = 2;

/// acemq's operator tool: dead letters, replays and the wire contract.
///
/// Exit codes: 0 done; 1 differences found, messages kept back, or the broker
/// failed or refused; 2 the command line is wrong (or no URL).
#[derive(Debug, Parser)]
#[command(name = "acemq", version, propagate_version = true)]
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
    /// Give up after this long (e.g. 30s, 10m).
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

/// The outcome of a command: its exit code, or an error to print.
pub(crate) type Outcome = Result<u8, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(raw_url) = cli.url.clone().filter(|u| !u.trim().is_empty()) else {
        eprintln!("acemq: no broker URL: pass --url or set AMQP_URL (e.g. amqp://user:password@localhost:5672/%2f)");
        return ExitCode::from(USAGE);
    };
    let secrets = Secrets::of(&raw_url);
    let url: AmqpUrl = match raw_url.parse() {
        Ok(url) => url,
        Err(e) => {
            eprintln!("acemq: {}", secrets.scrub(&e.to_string()));
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
    let timeout = cli.timeout;
    let outcome = runtime.block_on(async {
        match tokio::time::timeout(timeout, run(cli, raw_url, &url)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!(
                "gave up after {} (--timeout) on {url}",
                render::duration(timeout)
            )),
        }
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("acemq: {}", secrets.scrub(&message));
            ExitCode::from(FAILED)
        }
    }
}

async fn run(cli: Cli, raw_url: String, url: &AmqpUrl) -> Outcome {
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
    let conn = Conn::open(&raw_url, config)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let outcome = match cli.command {
        Command::Dlq(command) => dlq::run(&conn, command).await,
        Command::Topology(command) => topology::run(&conn, command).await,
    };
    let _ = conn.close().await;
    outcome
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

/// `1500ms`, `10s`, `5m`, `1h`, or `0`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?}: give a unit: 1500ms, 10s, 5m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 1500ms, 10s, 5m or 1h"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" | "min" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("{text:?}: the unit must be ms, s, m or h")),
    }
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
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("10x").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
