//! `acemq dlq list|show|replay|purge QUEUE`.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_codec::QueueDeclare;
use acemq_core::{Conn, ReplayDestination, ReplayOptions, ReplayProgress, ReplayReport, SetAside};
use clap::Subcommand;
use serde_json::json;

use crate::render;
use crate::{Outcome, SetAsideQueue, FAILED, OK, USAGE};

#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Lists the messages in order, without consuming them: they are read
    /// without acks and handed back in their places (marked redelivered).
    #[command(
        after_help = "Example: acemq dlq list orders          # orders.dlq\n         acemq dlq list orders --parked --json"
    )]
    List {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// At most this many, from the head of the queue.
        #[arg(long, default_value_t = 1000, value_name = "N")]
        limit: usize,
        /// One JSON document: {"queue", "depth", "messages": [...]}.
        #[arg(long)]
        json: bool,
    },
    /// Shows one message: envelope, error, where it first went, headers and
    /// body (as text if it is UTF-8). Without MESSAGE_ID, the first one.
    Show {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// The message-id to show (searched from the head of the queue).
        #[arg(value_name = "MESSAGE_ID")]
        message_id: Option<String>,
        /// Search at most this many messages for MESSAGE_ID (all by default).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// The message as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Moves messages back into QUEUE itself (attempt 1, the same
    /// message-id), or with --to-original to the exchange and routing key
    /// they were first published with; what cannot go back stays, with the
    /// reason, and the exit code is 1.
    #[command(
        after_help = "Example: acemq dlq replay orders --dry-run\n         acemq dlq replay orders --limit 100\n         acemq dlq replay orders --parked --id 3f2a0c7e-...\n         acemq dlq replay orders --to-original --dry-run"
    )]
    Replay {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// At most this many messages, from the head of the queue.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Examine and report what would go back, and where; move nothing.
        #[arg(long)]
        dry_run: bool,
        /// Send each message to the exchange and routing key it was first
        /// published with, instead of into QUEUE: every queue bound there
        /// gets it again, so other services may do their work twice.
        #[arg(long)]
        to_original: bool,
        /// Only the message with this message-id (repeatable); the others stay.
        #[arg(long = "id", value_name = "MESSAGE_ID")]
        ids: Vec<String>,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deletes every message of the queue.
    Purge {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long)]
        yes: bool,
    },
}

pub(crate) async fn run(conn: &Conn, command: DlqCommand) -> Outcome {
    match command {
        DlqCommand::List { queue, limit, json } => list(conn, &queue, limit, json).await,
        DlqCommand::Show {
            queue,
            message_id,
            limit,
            json,
        } => show(conn, &queue, message_id.as_deref(), limit, json).await,
        DlqCommand::Replay {
            queue,
            limit,
            dry_run,
            to_original,
            ids,
            json,
        } => {
            let how = How {
                limit,
                dry_run,
                to_original,
            };
            replay(conn, &queue, how, ids, json).await
        }
        DlqCommand::Purge { queue, yes } => purge(conn, &queue, yes).await,
    }
}

/// How many messages `name` holds (a passive declare), or why it cannot be read.
async fn depth(conn: &Conn, queue: &SetAsideQueue) -> Result<u32, String> {
    let name = queue.name();
    let ch = conn
        .consuming_connection()
        .channel()
        .await
        .map_err(|e| format!("cannot open a channel: {e}"))?;
    let passive = QueueDeclare {
        queue: name.as_str().into(),
        passive: true,
        ..Default::default()
    };
    match ch.queue_declare(passive).await {
        Ok(ok) => {
            let _ = ch.close().await;
            Ok(ok.map_or(0, |ok| ok.message_count))
        }
        Err(e) if e.reply_code() == Some(404) => Err(format!(
            "there is no queue {name} (QUEUE is the source queue's name: `{}` reads `{}`)",
            queue.queue, name
        )),
        Err(e) => Err(format!("cannot read {name}: {e}")),
    }
}

fn messages(n: u32) -> String {
    if n == 1 {
        "1 message".into()
    } else {
        format!("{n} messages")
    }
}

async fn list(conn: &Conn, queue: &SetAsideQueue, limit: usize, json: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    let listed = if depth == 0 {
        Vec::new()
    } else {
        conn.peek(&name, limit)
            .await
            .map_err(|e| format!("cannot read {name}: {e}"))?
    };
    if json {
        let messages: Vec<_> = listed
            .iter()
            .enumerate()
            .map(|(i, m)| render::json_message(i + 1, m))
            .collect();
        println!("{}", json!({ "queue": name, "depth": depth, "messages": messages }));
        return Ok(OK);
    }
    let mut header = format!("{name}: {}", messages(depth));
    if (listed.len() as u64) < u64::from(depth) {
        header.push_str(&format!(" (showing the first {})", listed.len()));
    }
    println!("{header}");
    if listed.is_empty() {
        return Ok(OK);
    }
    let rows: Vec<[String; 7]> = listed
        .iter()
        .enumerate()
        .map(|(i, m)| {
            [
                (i + 1).to_string(),
                m.envelope.id.clone(),
                m.envelope.attempt.to_string(),
                render::time(m.envelope.first_seen),
                m.replayed.to_string(),
                match (&m.original_exchange, &m.original_routing_key) {
                    (Some(x), Some(k)) => format!("{}/{k}", if x.is_empty() { "(default)" } else { x }),
                    _ => "?".into(),
                },
                render::short(m.error.as_deref().unwrap_or("-"), 72),
            ]
        })
        .collect();
    print_table(
        &[
            "#",
            "MESSAGE-ID",
            "ATTEMPT",
            "FIRST SEEN",
            "REPLAYED",
            "ORIGINAL",
            "ERROR",
        ],
        &rows,
    );
    Ok(OK)
}

fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

async fn show(conn: &Conn, queue: &SetAsideQueue, id: Option<&str>, limit: Option<usize>, json: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    if depth == 0 {
        eprintln!("acemq: {name} is empty");
        return Ok(FAILED);
    }
    let read = match id {
        None => 1,
        Some(_) => limit.unwrap_or(depth as usize),
    };
    let listed = conn
        .peek(&name, read)
        .await
        .map_err(|e| format!("cannot read {name}: {e}"))?;
    let found = match id {
        None => listed.first().map(|m| (1, m)),
        Some(id) => listed
            .iter()
            .enumerate()
            .find(|(_, m)| m.envelope.id == id)
            .map(|(i, m)| (i + 1, m)),
    };
    let Some((position, m)) = found else {
        eprintln!(
            "acemq: no message with message-id {:?} among the first {} of {name}",
            id.unwrap_or_default(),
            listed.len()
        );
        return Ok(FAILED);
    };
    if json {
        println!("{}", render::json_message(position, m));
        return Ok(OK);
    }
    print_message(&name, position, depth, m);
    Ok(OK)
}

fn print_message(name: &str, position: usize, depth: u32, m: &SetAside) {
    let e = &m.envelope;
    let or_none = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    println!("message {position} of {depth} in {name}");
    println!("message-id:      {}", e.id);
    println!("correlation-id:  {}", or_none(&e.correlation_id));
    println!("causation-id:    {}", or_none(&e.causation_id));
    println!("attempt:         {}", e.attempt);
    println!("first seen:      {}", render::time(e.first_seen));
    println!("replayed:        {}", m.replayed);
    println!("redelivered:     {}", if m.redelivered { "yes" } else { "no" });
    println!("error:           {}", or_none(&m.error));
    println!("original:        {}", render::original(m));
    println!("content-type:    {}", or_none(&m.content_type));
    match m.properties.headers.as_ref().filter(|h| !h.is_empty()) {
        None => println!("headers:         -"),
        Some(headers) => {
            println!("headers:");
            for (key, value) in headers.iter() {
                println!("  {}: {}", key.to_string_lossy(), render::value(value));
            }
        }
    }
    match std::str::from_utf8(&m.body) {
        Ok(text) => {
            println!("body ({} bytes):", m.body.len());
            println!("{text}");
        }
        Err(_) => {
            println!("body ({} bytes, not UTF-8; base64):", m.body.len());
            println!("{}", render::base64(&m.body));
        }
    }
}

/// Reports a replay's progress: a bar on a terminal, otherwise a line
/// `replayed N/M` at most every second (and one at the end).
struct Progress {
    dry_run: bool,
    bar: Option<indicatif::ProgressBar>,
    plain: Mutex<(Instant, Option<ReplayProgress>)>,
}

impl Progress {
    fn new(dry_run: bool, total: u64) -> Arc<Progress> {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            let style = indicatif::ProgressStyle::with_template(
                "{spinner} {prefix} [{bar:40}] {pos}/{len} examined, {msg}, eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(if dry_run { "dry run" } else { "replaying" });
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Arc::new(Progress {
            dry_run,
            bar,
            // The first line after a second: a short replay prints only its last.
            plain: Mutex::new((Instant::now(), None)),
        })
    }

    fn line(&self, p: &ReplayProgress) -> String {
        let verb = if self.dry_run { "would replay" } else { "replayed" };
        let mut line = format!("{verb} {}/{}", p.replayed, p.total);
        if p.kept > 0 {
            line.push_str(&format!(" (kept {})", p.kept));
        }
        line
    }

    fn update(&self, p: ReplayProgress) {
        if let Some(bar) = &self.bar {
            bar.set_length(p.total as u64);
            bar.set_position(p.examined as u64);
            let rate = p.examined as f64 / bar.elapsed().as_secs_f64().max(0.001);
            bar.set_message(format!(
                "{} {}, kept {}, {rate:.0} msg/s",
                if self.dry_run { "would replay" } else { "replayed" },
                p.replayed,
                p.kept
            ));
            return;
        }
        let mut plain = self.plain.lock().unwrap_or_else(|p| p.into_inner());
        if plain.0.elapsed() >= Duration::from_secs(1) {
            eprintln!("{}", self.line(&p));
            plain.0 = Instant::now();
        }
        plain.1 = Some(p);
    }

    fn finish(&self, report: &ReplayReport) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
            return;
        }
        let plain = self.plain.lock().unwrap_or_else(|p| p.into_inner());
        let total = plain.1.map_or(report.examined, |p| p.total);
        eprintln!(
            "{}",
            self.line(&ReplayProgress {
                examined: report.examined,
                replayed: report.replayed,
                kept: report.kept.len(),
                total,
            })
        );
    }
}

/// How a replay runs, as the command line says.
struct How {
    limit: Option<usize>,
    dry_run: bool,
    to_original: bool,
}

/// A destination as an operator reads it.
fn destination(d: &ReplayDestination) -> String {
    if d.exchange.is_empty() {
        format!("queue {}", d.routing_key)
    } else {
        format!("exchange {:?} key {:?}", d.exchange, d.routing_key)
    }
}

async fn replay(conn: &Conn, queue: &SetAsideQueue, how: How, ids: Vec<String>, json: bool) -> Outcome {
    let How {
        limit,
        dry_run,
        to_original,
    } = how;
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    let total = limit.map_or(u64::from(depth), |l| (l as u64).min(u64::from(depth)));
    let progress = Progress::new(dry_run, total);
    // The ids the filter left out: kept, but not a failure.
    let not_selected: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut options = ReplayOptions {
        limit,
        dry_run,
        to_original,
        ..Default::default()
    };
    let reporter = progress.clone();
    options.progress = Some(Arc::new(move |p| reporter.update(p)));
    if !ids.is_empty() {
        let wanted: HashSet<String> = ids.iter().cloned().collect();
        let left_out = not_selected.clone();
        options.filter = Some(Arc::new(move |m: &SetAside| {
            let selected = wanted.contains(&m.envelope.id);
            if !selected {
                left_out
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(m.envelope.id.clone());
            }
            selected
        }));
    }
    let report = if depth == 0 {
        ReplayReport::default()
    } else {
        let result = conn.replay(&name, options).await;
        if let Some(bar) = &progress.bar {
            bar.finish_and_clear();
        }
        result.map_err(|e| format!("replay of {name} failed: {e}"))?
    };
    if depth > 0 {
        progress.finish(&report);
    }
    let not_selected = not_selected.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let failed: Vec<_> = report
        .kept
        .iter()
        .filter(|k| !not_selected.contains(&k.message_id))
        .collect();
    let left_out = report.kept.len() - failed.len();
    if depth == 0 && !json {
        println!("{name} is empty: nothing to replay");
        return Ok(OK);
    }
    if json {
        let kept: Vec<_> = failed
            .iter()
            .map(|k| json!({ "message_id": k.message_id, "reason": k.reason }))
            .collect();
        let destinations: Vec<_> = report
            .destinations
            .iter()
            .map(|d| json!({ "message_id": d.message_id, "exchange": d.exchange, "routing_key": d.routing_key }))
            .collect();
        println!(
            "{}",
            json!({
                "queue": name,
                "dry_run": dry_run,
                "to_original": to_original,
                "examined": report.examined,
                "replayed": report.replayed,
                "not_selected": left_out,
                "kept": kept,
                "destinations": destinations,
            })
        );
    } else {
        let selection = if left_out > 0 {
            format!(" ({left_out} not selected by --id, left in place)")
        } else {
            String::new()
        };
        if dry_run {
            println!(
                "dry run: {} of {} examined in {name} would be replayed{selection}; nothing was moved",
                report.replayed,
                messages(report.examined as u32)
            );
            for d in &report.destinations {
                println!("  {} -> {}", d.message_id, destination(d));
            }
        } else {
            println!(
                "replayed {} of {} examined in {name}{selection}",
                report.replayed,
                messages(report.examined as u32)
            );
        }
        if !failed.is_empty() {
            println!(
                "{} cannot go back (left in {name}):",
                if failed.len() == 1 {
                    "1 message".to_string()
                } else {
                    format!("{} messages", failed.len())
                }
            );
            for k in &failed {
                println!("  {}: {}", k.message_id, k.reason);
            }
        }
    }
    Ok(if failed.is_empty() { OK } else { FAILED })
}

async fn purge(conn: &Conn, queue: &SetAsideQueue, yes: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    if !yes {
        if !std::io::stdin().is_terminal() {
            eprintln!("acemq: refusing to purge {name} without --yes (stdin is not a terminal)");
            return Ok(USAGE);
        }
        eprint!("purge {} from {name}? [y/N] ", messages(depth));
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("acemq: nothing purged");
            return Ok(FAILED);
        }
    }
    let purged = conn
        .purge(&name)
        .await
        .map_err(|e| format!("cannot purge {name}: {e}"))?;
    println!("purged {} from {name}", messages(purged));
    Ok(OK)
}
