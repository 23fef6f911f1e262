//! `acemq topology check|declare QUEUE`.

use std::time::Duration;

use acemq_codec::FieldValue;
use acemq_core::check::check;
use acemq_core::retry::DEFAULT_WAIT_IN_BROKER_FROM;
use acemq_core::topology::Declaration;
use acemq_core::{Conn, RetryPolicy, Topology};
use clap::{Args, Subcommand};
use serde_json::json;

use crate::render;
use crate::{parse_duration, Failure, Outcome, FAILED, OK};

const POLICY_HELP: &str = "\
Retry policies (--retries):
  exponential:ATTEMPTS:INITIAL[:MAX]  waits INITIAL, 2×INITIAL, 4×INITIAL, … capped at MAX (0 or absent: uncapped)
  fixed:ATTEMPTS:DELAY                waits DELAY every time
ATTEMPTS counts the first delivery (3 = one try and two retries). Durations: 1500ms, 10s, 5m, 1h.
Waits of at least --wait-in-broker-from (30s by default) are spent in the broker, each on a rung queue
{QUEUE}.retry.{delay}; without --retries there are no rungs.

Example: --retries exponential:6:10s:0 waits 10s, 20s, 40s, 80s, 160s: the rungs are
orders.retry.40s, orders.retry.80s and orders.retry.160s.";

#[derive(Debug, Subcommand)]
pub(crate) enum TopologyCommand {
    /// Compares the broker's topology for QUEUE with the wire contract: the
    /// queue (quorum, dead-lettering to acemq.dlx), acemq.dlx, QUEUE.dlq and
    /// QUEUE.parked with their bindings, and the rungs of --retries. Prints
    /// every difference; exit code 1 if there is any. Changes nothing (a
    /// binding is checked with a probe message that expires at once; see the
    /// dead letters chapter of acemq-core's guide).
    #[command(after_help = POLICY_HELP)]
    Check {
        /// The source queue's name, e.g. `orders`.
        #[arg(value_name = "QUEUE")]
        queue: String,
        #[command(flatten)]
        retry: RetryArgs,
        /// The differences as JSON: {"queue", "differences": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Declares the wire contract's topology for QUEUE (what `check`
    /// checks). Declaring what exists with the same arguments is a no-op; a
    /// queue that exists with other arguments is refused (406) and left as
    /// it is.
    #[command(after_help = POLICY_HELP)]
    Declare {
        /// The source queue's name, e.g. `orders`.
        #[arg(value_name = "QUEUE")]
        queue: String,
        #[command(flatten)]
        retry: RetryArgs,
    },
}

/// The retry policy whose rungs belong to a topology.
#[derive(Debug, Args, Clone)]
pub(crate) struct RetryArgs {
    /// The retry policy: exponential:ATTEMPTS:INITIAL[:MAX] or
    /// fixed:ATTEMPTS:DELAY (see below). Without it, no rung queues.
    #[arg(long, value_name = "POLICY", value_parser = parse_policy)]
    retries: Option<RetryPolicy>,
    /// Waits of at least this long are spent in the broker, on rung queues
    /// (0: none are).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    wait_in_broker_from: Duration,
}

impl RetryArgs {
    fn policy(&self) -> Option<RetryPolicy> {
        let policy = self.retries.clone()?;
        if self.wait_in_broker_from == DEFAULT_WAIT_IN_BROKER_FROM {
            return Some(policy);
        }
        Some(policy.wait_in_broker_from(self.wait_in_broker_from))
    }
}

/// `exponential:6:10s:0`, `exponential:6:10s`, `fixed:3:1m`.
fn parse_policy(text: &str) -> Result<RetryPolicy, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let attempts = |s: &str| -> Result<u32, String> {
        match s.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("{s:?}: ATTEMPTS must be a whole number of at least 1")),
        }
    };
    match parts.as_slice() {
        ["exponential", n, initial] => Ok(RetryPolicy::exponential(
            attempts(n)?,
            parse_duration(initial)?,
            Duration::ZERO,
        )),
        ["exponential", n, initial, max] => Ok(RetryPolicy::exponential(
            attempts(n)?,
            parse_duration(initial)?,
            parse_duration(max)?,
        )),
        ["fixed", n, delay] => Ok(RetryPolicy::fixed(attempts(n)?, parse_duration(delay)?)),
        _ => Err(format!(
            "{text:?}: write exponential:ATTEMPTS:INITIAL[:MAX] or fixed:ATTEMPTS:DELAY (e.g. exponential:6:10s:0)"
        )),
    }
}

pub(crate) async fn run(conn: &Conn, command: TopologyCommand) -> Outcome {
    match command {
        TopologyCommand::Check { queue, retry, json } => run_check(conn, &queue, retry.policy(), json).await,
        TopologyCommand::Declare { queue, retry } => declare(conn, &queue, retry.policy()).await,
    }
}

fn topology(queue: &str, policy: Option<&RetryPolicy>) -> Topology {
    let topology = Topology::new().queue(queue).dead_letters(queue);
    match policy {
        Some(policy) => topology.retries(queue, policy),
        None => topology,
    }
}

/// What a topology holds, in a few words: `exchange acemq.dlx; queues a, b; 2 bindings`.
fn summary(declarations: &[Declaration]) -> String {
    let mut exchanges = Vec::new();
    let mut queues = Vec::new();
    let mut bindings = 0;
    for d in declarations {
        match d {
            Declaration::Exchange { name, .. } => exchanges.push(name.as_str()),
            Declaration::Queue { name, .. } => queues.push(name.as_str()),
            Declaration::Bind { .. } => bindings += 1,
            _ => {}
        }
    }
    format!(
        "exchange {}; queues {}; {bindings} bindings",
        exchanges.join(", "),
        queues.join(", ")
    )
}

async fn run_check(conn: &Conn, queue: &str, policy: Option<RetryPolicy>, json: bool) -> Outcome {
    let declarations = topology(queue, policy.as_ref())
        .declarations()
        .map_err(|e| e.to_string())?;
    let differences = check(conn, queue, policy.as_ref())
        .await
        .map_err(|e| Failure::broker(format!("cannot check {queue}"), e))?;
    if json {
        let list: Vec<String> = differences.iter().map(ToString::to_string).collect();
        println!("{}", render::json(&json!({ "queue": queue, "differences": list })));
    } else if differences.is_empty() {
        println!(
            "{queue}: the topology is the wire contract ({})",
            summary(&declarations)
        );
    } else {
        let n = differences.len();
        println!(
            "{queue}: {n} difference{} from the wire contract:",
            if n == 1 { "" } else { "s" }
        );
        for d in &differences {
            println!("{d}");
        }
    }
    Ok(if differences.is_empty() { OK } else { FAILED })
}

async fn declare(conn: &Conn, queue: &str, policy: Option<RetryPolicy>) -> Outcome {
    let topology = topology(queue, policy.as_ref());
    let declarations = topology.declarations().map_err(|e| e.to_string())?;
    topology
        .declare(conn)
        .await
        .map_err(|e| Failure::broker(format!("cannot declare the topology of {queue}"), e))?;
    for d in &declarations {
        println!("{}", describe(d));
    }
    Ok(OK)
}

/// One declaration as the operator reads it.
fn describe(d: &Declaration) -> String {
    match d {
        Declaration::Exchange {
            name, kind, durable, ..
        } => format!(
            "declared exchange {name} ({kind}{})",
            if *durable { ", durable" } else { "" }
        ),
        Declaration::Queue { name, arguments, .. } => {
            let kind = arguments
                .get("x-queue-type")
                .and_then(FieldValue::as_str)
                .unwrap_or("classic");
            let mut details = vec![kind.to_string()];
            if let Some(ttl) = arguments.get("x-message-ttl").and_then(FieldValue::as_i64) {
                details.push(format!(
                    "TTL {}",
                    render::duration(Duration::from_millis(ttl.max(0) as u64))
                ));
            }
            let dlx = arguments.get("x-dead-letter-exchange").and_then(FieldValue::as_str);
            let key = arguments.get("x-dead-letter-routing-key").and_then(FieldValue::as_str);
            match (dlx, key) {
                (Some(""), Some(key)) => details.push(format!("then back to {key}")),
                (Some(dlx), Some(key)) => details.push(format!("dead letters to {dlx} under {key}")),
                (Some(dlx), None) => details.push(format!("dead letters to {dlx}")),
                _ => {}
            }
            format!("declared queue {name} ({})", details.join(", "))
        }
        Declaration::Bind {
            queue,
            exchange,
            routing_key,
            ..
        } => format!("bound {queue} to {exchange} under {routing_key}"),
        other => format!("declared {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        let s = Duration::from_secs;
        let p = parse_policy("exponential:6:10s:0").unwrap();
        assert_eq!(p.rungs(), [s(40), s(80), s(160)]);
        assert_eq!(parse_policy("exponential:6:10s").unwrap(), p);
        assert_eq!(parse_policy("fixed:3:1m").unwrap().rungs(), [s(60)]);
        assert!(parse_policy("exponential:0:10s").is_err());
        assert!(parse_policy("linear:3:10s").is_err());
        assert!(parse_policy("fixed:3:10").is_err());
    }
}
