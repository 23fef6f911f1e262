//! The command line of `acemq conformance check` and what it prints.

use std::time::Duration;

use acemq_core::amqp::AmqpUrl;

use super::{exit_code, json, probe, run, table, Options, Target, Version};

/// What `--help` says after the flags.
pub const HELP: &str = "\
Runs a catalogue of RabbitMQ behaviours (handshake and tune limits, frame sizes at the
edges, channel and connection errors and their codes, confirms and returns, dead-lettering
and x-death, quorum and stream rules, the 540s, channel.flow, consumer cancel notifications,
queue lifetimes) against the broker, each check on connections and queues of its own that it
deletes afterwards, at most 10 s each. Every check prints ✔ pass, ✘ fail with what RabbitMQ
answers and what the broker did, or - n/a (e.g. quorum checks on a broker without quorum
queues, or a check for the other version). README.md lists every check id.

Exit codes:
  0  every applicable check passed
  1  a check failed
  2  the command line is wrong (a bad flag or value, no URL, an amqps:// URL)
  3  the broker could not be reached or refused the login";

/// `acemq conformance check [URL]`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The broker: amqp://user:password@host:port/vhost (else --url or AMQP_URL).
    #[arg(value_name = "URL")]
    pub url: Option<String>,
    /// Whose answers are expected: 3.10 or 4.0. By default the version the
    /// broker names in its connection.start (`version`) if it is 3.10.x or
    /// 4.0.x, else 4.0.
    #[arg(long, value_name = "3.10|4.0")]
    pub rabbitmq_version: Option<Version>,
    /// One JSON document (every check with its id, section, verdict,
    /// expected and got, and the totals) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Only the checks whose id contains SUBSTRING.
    #[arg(long, value_name = "SUBSTRING")]
    pub only: Option<String>,
    /// How many checks run at once.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub concurrency: usize,
}

/// What the command prints and its exit code.
#[derive(Debug, Clone)]
pub struct Output {
    /// The table or the JSON document.
    pub stdout: String,
    /// Why it stopped, when it did not run the checks.
    pub stderr: Option<String>,
    /// 0 all passed, 1 a failure, 2 usage, 3 unreachable or refused.
    pub code: u8,
}

impl Output {
    fn stop(code: u8, message: String) -> Output {
        Output {
            stdout: String::new(),
            stderr: Some(message),
            code,
        }
    }
}

/// Runs the command against `url`.
pub async fn command(args: &CheckArgs, url: &AmqpUrl) -> Output {
    if url.memory {
        return Output::stop(2, "conformance check needs a broker on the network (amqp://)".into());
    }
    if url.tls {
        return Output::stop(
            2,
            "conformance check speaks plain amqp:// only (its raw frames go over TCP); amqps:// is not supported"
                .into(),
        );
    }
    let Some((host, port)) = url.hosts.first().cloned() else {
        return Output::stop(2, "the URL names no host".into());
    };
    let target = Target {
        host,
        port,
        username: url.username.clone(),
        password: url.password.expose().to_string(),
        vhost: url.vhost.clone(),
    };
    let (product, release) = match probe(&target, Duration::from_secs(10)).await {
        Ok(found) => found,
        Err(e) => return Output::stop(3, format!("cannot run the checks: {}", e.0)),
    };
    let version = args
        .rabbitmq_version
        .or_else(|| Version::of_release(&release))
        .unwrap_or(Version::V4_0);
    let mut options = Options::new(version);
    options.only = args.only.clone();
    options.concurrency = args.concurrency;
    let broker = format!("{product} {release}").trim().to_string();
    let report = run(&target, broker, &options).await;
    Output {
        stdout: if args.json {
            json(&report) + "\n"
        } else {
            table(&report)
        },
        stderr: None,
        code: exit_code(&report),
    }
}
