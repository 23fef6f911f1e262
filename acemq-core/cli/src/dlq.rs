//! `acemq dlq summary|list|show|replay|delete|move|export|import|purge QUEUE`:
//! every command reads without acks and removes only what it finished with.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_codec::QueueDeclare;
use acemq_core::{Conn, ReplayDestination, ReplayOptions, ReplayProgress, ReplayReport, SetAside};
use clap::Subcommand;
use serde_json::json;

use crate::filter::{read_all, Filters, Selector, Summary, AGES};
use crate::{render, transfer};
use crate::{Failure, Outcome, SetAsideQueue, FAILED, OK};

#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Counts the messages by failure group (their errors with numbers, UUIDs
    /// and hex ids masked), by the destination they were first published to,
    /// and by age; consumes nothing. `--group N` on the other commands
    /// selects group N.
    #[command(after_help = "Example: acemq dlq summary orders\n         acemq dlq list orders --group 2")]
    Summary {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// One JSON document: {"queue", "examined", "groups", "destinations", "ages"}.
        #[arg(long)]
        json: bool,
    },
    /// Lists the messages in order, without consuming them: they are read
    /// without acks and handed back in their places (marked redelivered).
    #[command(
        after_help = "Example: acemq dlq list orders          # orders.dlq\n         acemq dlq list orders --parked --json\n         acemq dlq list orders --error-contains timeout --older-than 1h"
    )]
    List {
        #[command(flatten)]
        queue: SetAsideQueue,
        #[command(flatten)]
        filters: Filters,
        /// At most this many (of those the filters select), from the head of the queue.
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
        after_help = "Example: acemq dlq replay orders --dry-run\n         acemq dlq replay orders --limit 100\n         acemq dlq replay orders --group 1\n         acemq dlq replay orders --parked --id 3f2a0c7e-...\n         acemq dlq replay orders --to-original --dry-run"
    )]
    Replay {
        #[command(flatten)]
        queue: SetAsideQueue,
        #[command(flatten)]
        filters: Filters,
        /// Examine at most this many messages, from the head of the queue.
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
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Deletes the messages the filters select; the others stay, in order.
    /// A filter, --id or --all is required.
    #[command(
        after_help = "Example: acemq dlq delete orders --group 3 --dry-run\n         acemq dlq delete orders --error-contains 'card declined' --older-than 7d --yes"
    )]
    Delete {
        #[command(flatten)]
        queue: SetAsideQueue,
        #[command(flatten)]
        filters: Filters,
        /// Every message (as purge, but one by one and within --limit).
        #[arg(long)]
        all: bool,
        /// Examine at most this many messages, from the head of the queue.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Report what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long)]
        yes: bool,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Moves the messages the filters select (all without filters) to the
    /// queue OTHER, unchanged (body, properties and headers as they are), in
    /// order; each is removed only once OTHER has it (confirmed). What
    /// cannot go there stays, with the reason, and the exit code is 1.
    #[command(
        after_help = "Example: acemq dlq move orders --to orders.archive --older-than 30d\n         acemq dlq move orders --parked --to orders.dlq --group 1"
    )]
    Move {
        #[command(flatten)]
        queue: SetAsideQueue,
        /// The queue to move them to: its full name (e.g. orders.archive).
        #[arg(long, value_name = "OTHER")]
        to: String,
        #[command(flatten)]
        filters: Filters,
        /// Examine at most this many messages, from the head of the queue.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Report what would be moved; move nothing.
        #[arg(long)]
        dry_run: bool,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Writes the messages the filters select (all without filters) to
    /// stdout as NDJSON, one message a line: body (base64) and every
    /// property and header exactly (the format is in the guide's operators
    /// chapter). Nothing is removed unless --remove: then each message is
    /// removed once its line is written.
    #[command(
        after_help = "Example: acemq dlq export orders > orders-dlq.ndjson\n         acemq dlq export orders --older-than 30d --remove > archive.ndjson"
    )]
    Export {
        #[command(flatten)]
        queue: SetAsideQueue,
        #[command(flatten)]
        filters: Filters,
        /// Examine at most this many messages, from the head of the queue.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Remove each message exported (after its line is written).
        #[arg(long)]
        remove: bool,
    },
    /// Reads NDJSON from stdin (as `export` writes it) and publishes each
    /// message into the set-aside queue, exactly, in order (confirmed, one
    /// after the other). A file with a bad line imports nothing; a message
    /// the broker does not take stops the import (exit code 1).
    #[command(after_help = "Example: acemq dlq import orders < orders-dlq.ndjson")]
    Import {
        #[command(flatten)]
        queue: SetAsideQueue,
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
        DlqCommand::Summary { queue, json } => summary(conn, &queue, json).await,
        DlqCommand::List {
            queue,
            filters,
            limit,
            json,
        } => list(conn, &queue, &filters, limit, json).await,
        DlqCommand::Show {
            queue,
            message_id,
            limit,
            json,
        } => show(conn, &queue, message_id.as_deref(), limit, json).await,
        DlqCommand::Replay {
            queue,
            filters,
            limit,
            dry_run,
            to_original,
            json,
        } => {
            let how = How {
                limit,
                dry_run,
                to_original,
            };
            replay(conn, &queue, how, &filters, json).await
        }
        DlqCommand::Delete {
            queue,
            filters,
            all,
            limit,
            dry_run,
            yes,
            json,
        } => {
            if !all && !filters.any() {
                return Err(Failure::usage(
                    "dlq delete needs a filter (--error-contains, --older-than, --header, --group, --id) or --all"
                        .into(),
                ));
            }
            let name = queue.name();
            if !dry_run && !yes && !confirm(&format!("delete the selected messages of {name}?"))? {
                return Ok(FAILED);
            }
            let selector = filters.selector(conn, &queue).await?;
            let action = if dry_run { Action::Nothing } else { Action::Delete };
            settle(conn, &queue, &selector, limit, action, json).await
        }
        DlqCommand::Move {
            queue,
            to,
            filters,
            limit,
            dry_run,
            json,
        } => {
            let name = queue.name();
            if to == name {
                return Err(Failure::usage(format!("--to {to}: that is the queue they are in")));
            }
            depth_of(conn, &to, None).await?;
            let selector = filters.selector(conn, &queue).await?;
            let action = if dry_run { Action::Nothing } else { Action::Move(to) };
            settle(conn, &queue, &selector, limit, action, json).await
        }
        DlqCommand::Export {
            queue,
            filters,
            limit,
            remove,
        } => export(conn, &queue, &filters, limit, remove).await,
        DlqCommand::Import { queue } => import(conn, &queue).await,
        DlqCommand::Purge { queue, yes } => purge(conn, &queue, yes).await,
    }
}

/// Asks `question` on the terminal; off a terminal, a usage error (--yes).
fn confirm(question: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage(format!(
            "{} needs --yes when stdin is not a terminal",
            render::safe(question.trim_end_matches('?'))
        )));
    }
    eprint!("{} [y/N] ", render::safe(question));
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(true)
    } else {
        eprintln!("acemq: nothing done");
        Ok(false)
    }
}

/// How many messages the set-aside queue holds (a passive declare), or
/// why it cannot be read.
async fn depth(conn: &Conn, queue: &SetAsideQueue) -> Result<u32, Failure> {
    depth_of(conn, &queue.name(), Some(queue)).await
}

/// How many messages `name` holds; `set_aside` says which source queue it
/// was named after, for the message when it is missing.
async fn depth_of(conn: &Conn, name: &str, set_aside: Option<&SetAsideQueue>) -> Result<u32, Failure> {
    let ch = conn
        .consuming_connection()
        .channel()
        .await
        .map_err(|e| Failure::broker("cannot open a channel", e))?;
    let passive = QueueDeclare {
        queue: name.into(),
        passive: true,
        ..Default::default()
    };
    match ch.queue_declare(passive).await {
        Ok(ok) => {
            let _ = ch.close().await;
            Ok(ok.map_or(0, |ok| ok.message_count))
        }
        Err(e) if e.reply_code() == Some(404) => Err(match set_aside {
            Some(queue) => format!(
                "there is no queue {name} (QUEUE is the source queue's name: `{}` reads `{}`)",
                queue.queue, name
            ),
            None => format!("there is no queue {name}"),
        }
        .into()),
        Err(e) => Err(Failure::broker(format!("cannot read {name}"), e)),
    }
}

fn messages(n: u32) -> String {
    if n == 1 {
        "1 message".into()
    } else {
        format!("{n} messages")
    }
}

async fn list(conn: &Conn, queue: &SetAsideQueue, filters: &Filters, limit: usize, json: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    let listed: Vec<(usize, SetAside)> = if depth == 0 {
        Vec::new()
    } else if filters.any() {
        let selector = filters.selector(conn, queue).await?;
        read_all(conn, &name)
            .await?
            .into_iter()
            .enumerate()
            .filter(|(_, m)| selector.matches(m))
            .take(limit)
            .map(|(i, m)| (i + 1, m))
            .collect()
    } else {
        conn.peek(&name, limit)
            .await
            .map_err(|e| Failure::broker(format!("cannot read {name}"), e))?
            .into_iter()
            .enumerate()
            .map(|(i, m)| (i + 1, m))
            .collect()
    };
    if json {
        let messages: Vec<_> = listed.iter().map(|(i, m)| render::json_message(*i, m)).collect();
        println!(
            "{}",
            render::json(&json!({ "queue": name, "depth": depth, "messages": messages }))
        );
        return Ok(OK);
    }
    let mut header = format!("{name}: {}", messages(depth));
    if filters.any() {
        header.push_str(&format!(", {} selected", listed.len()));
    } else if (listed.len() as u64) < u64::from(depth) {
        header.push_str(&format!(" (showing the first {})", listed.len()));
    }
    println!("{}", render::safe(&header));
    if listed.is_empty() {
        return Ok(OK);
    }
    let rows: Vec<[String; 7]> = listed
        .iter()
        .map(|(i, m)| {
            [
                i.to_string(),
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

/// `dlq summary`: counts by failure group, original destination and age.
async fn summary(conn: &Conn, queue: &SetAsideQueue, json: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    let all = if depth == 0 {
        Vec::new()
    } else {
        read_all(conn, &name).await?
    };
    let summary = Summary::of(&all, std::time::SystemTime::now());
    let destination = |(x, k): &(Option<String>, Option<String>)| match (x, k) {
        (Some(x), Some(k)) => format!("{}/{k}", if x.is_empty() { "(default)" } else { x }),
        (Some(x), None) => format!("{x}/?"),
        (None, Some(k)) => format!("?/{k}"),
        (None, None) => "unknown".into(),
    };
    if json {
        let groups: Vec<_> = summary
            .errors
            .iter()
            .enumerate()
            .map(|(i, g)| {
                json!({ "group": i + 1, "error": g.error, "count": g.count, "example": g.example, "message_ids": g.ids })
            })
            .collect();
        let destinations: Vec<_> = summary
            .destinations
            .iter()
            .map(|(d, n)| json!({ "exchange": d.0, "routing_key": d.1, "count": n }))
            .collect();
        let ages: Vec<_> = AGES
            .iter()
            .zip(summary.ages)
            .map(|((from, label), n)| json!({ "age": label, "from_secs": from.as_secs(), "count": n }))
            .collect();
        println!(
            "{}",
            render::json(
                &json!({ "queue": name, "depth": depth, "examined": all.len(), "groups": groups, "destinations": destinations, "ages": ages })
            )
        );
        return Ok(OK);
    }
    let mut head = format!("{name}: {}", messages(depth));
    if all.len() < depth as usize {
        head.push_str(&format!(" ({} examined)", all.len()));
    }
    println!("{}", render::safe(&head));
    if all.is_empty() {
        return Ok(OK);
    }
    println!();
    println!("By error (--group N selects a group):");
    let rows: Vec<[String; 3]> = summary
        .errors
        .iter()
        .enumerate()
        .map(|(i, g)| [(i + 1).to_string(), g.count.to_string(), render::short(&g.error, 100)])
        .collect();
    print_table(&["GROUP", "COUNT", "ERROR"], &rows);
    println!();
    println!("By original destination (exchange/routing key):");
    let rows: Vec<[String; 2]> = summary
        .destinations
        .iter()
        .map(|(d, n)| [n.to_string(), destination(d)])
        .collect();
    print_table(&["COUNT", "DESTINATION"], &rows);
    println!();
    println!("By age (since first seen):");
    let rows: Vec<[String; 2]> = AGES
        .iter()
        .zip(summary.ages)
        .map(|((_, label), n)| [n.to_string(), label.to_string()])
        .collect();
    print_table(&["COUNT", "AGE"], &rows);
    Ok(OK)
}

/// Prints a table; every cell made safe for the terminal.
fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| row.clone().map(|cell| render::safe(&cell)))
        .collect();
    let rows = &rows;
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
        eprintln!("acemq: {} is empty", render::safe(&name));
        return Ok(FAILED);
    }
    let read = match id {
        None => 1,
        Some(_) => limit.unwrap_or(depth as usize),
    };
    let listed = conn
        .peek(&name, read)
        .await
        .map_err(|e| Failure::broker(format!("cannot read {name}"), e))?;
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
            "acemq: {}",
            render::safe(&format!(
                "no message with message-id {:?} among the first {} of {name}",
                id.unwrap_or_default(),
                listed.len()
            ))
        );
        return Ok(FAILED);
    };
    if json {
        println!("{}", render::json(&render::json_message(position, m)));
        return Ok(OK);
    }
    print_message(&name, position, depth, m);
    Ok(OK)
}

fn print_message(name: &str, position: usize, depth: u32, m: &SetAside) {
    let e = &m.envelope;
    let or_none = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
    // Every line made safe: ids, errors, header names and values are the
    // producer's bytes.
    let line = |text: String| println!("{}", render::safe(&text));
    line(format!("message {position} of {depth} in {name}"));
    line(format!("message-id:      {}", e.id));
    line(format!("correlation-id:  {}", or_none(&e.correlation_id)));
    line(format!("causation-id:    {}", or_none(&e.causation_id)));
    line(format!("attempt:         {}", e.attempt));
    line(format!("first seen:      {}", render::time(e.first_seen)));
    line(format!("replayed:        {}", m.replayed));
    line(format!("redelivered:     {}", if m.redelivered { "yes" } else { "no" }));
    line(format!("error:           {}", or_none(&m.error)));
    line(format!("original:        {}", render::original(m)));
    line(format!("content-type:    {}", or_none(&m.content_type)));
    match m.properties.headers.as_ref().filter(|h| !h.is_empty()) {
        None => line("headers:         -".into()),
        Some(headers) => {
            line("headers:".into());
            for (key, value) in headers.iter() {
                line(format!("  {}: {}", key.to_string_lossy(), render::value(value)));
            }
        }
    }
    match std::str::from_utf8(&m.body) {
        Ok(text) => {
            println!("body ({} bytes):", m.body.len());
            println!("{}", render::safe_body(text));
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

async fn replay(conn: &Conn, queue: &SetAsideQueue, how: How, filters: &Filters, json: bool) -> Outcome {
    let How {
        limit,
        dry_run,
        to_original,
    } = how;
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    let selector = Arc::new(filters.selector(conn, queue).await?);
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
    if filters.any() {
        let left_out = not_selected.clone();
        options.filter = Some(Arc::new(move |m: &SetAside| {
            let selected = selector.matches(m);
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
        result.map_err(|e| Failure::broker(format!("replay of {name} failed"), e))?
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
        println!("{}", render::safe(&format!("{name} is empty: nothing to replay")));
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
            render::json(&json!({
                "queue": name,
                "dry_run": dry_run,
                "to_original": to_original,
                "examined": report.examined,
                "replayed": report.replayed,
                "not_selected": left_out,
                "kept": kept,
                "destinations": destinations,
            }))
        );
    } else {
        let by = if filters.ids_only() { "--id" } else { "the filters" };
        let selection = if left_out > 0 {
            format!(" ({left_out} not selected by {by}, left in place)")
        } else {
            String::new()
        };
        let line = |text: String| println!("{}", render::safe(&text));
        if dry_run {
            line(format!(
                "dry run: {} of {} examined in {name} would be replayed{selection}; nothing was moved",
                report.replayed,
                messages(report.examined as u32)
            ));
            for d in &report.destinations {
                line(format!("  {} -> {}", d.message_id, destination(d)));
            }
        } else {
            line(format!(
                "replayed {} of {} examined in {name}{selection}",
                report.replayed,
                messages(report.examined as u32)
            ));
        }
        if !failed.is_empty() {
            line(format!(
                "{} cannot go back (left in {name}):",
                if failed.len() == 1 {
                    "1 message".to_string()
                } else {
                    format!("{} messages", failed.len())
                }
            ));
            for k in &failed {
                line(format!("  {}: {}", k.message_id, k.reason));
            }
        }
    }
    Ok(if failed.is_empty() { OK } else { FAILED })
}

async fn purge(conn: &Conn, queue: &SetAsideQueue, yes: bool) -> Outcome {
    let name = queue.name();
    let depth = depth(conn, queue).await?;
    if !yes && !confirm(&format!("purge {} from {name}?", messages(depth)))? {
        return Ok(FAILED);
    }
    let purged = conn
        .purge(&name)
        .await
        .map_err(|e| Failure::broker(format!("cannot purge {name}"), e))?;
    println!("{}", render::safe(&format!("purged {} from {name}", messages(purged))));
    Ok(OK)
}

/// What `settle` does with a selected message.
enum Action {
    /// A dry run: report it, keep it.
    Nothing,
    /// Remove it.
    Delete,
    /// Publish it to this queue (confirmed), then remove it.
    Move(String),
}

/// `dlq delete` and `dlq move`: reads the queue in order, every message
/// held without an ack; a selected one is deleted, or moved and then
/// removed, and the rest (and whatever could not be moved) go back in
/// their places.
async fn settle(
    conn: &Conn,
    queue: &SetAsideQueue,
    selector: &Selector,
    limit: Option<usize>,
    action: Action,
    json: bool,
) -> Outcome {
    let name = queue.name();
    depth(conn, queue).await?;
    let mut reader = conn
        .read_queue(&name, limit)
        .await
        .map_err(|e| Failure::broker(format!("cannot read {name}"), e))?;
    let (mut examined, mut selected, mut done) = (0usize, Vec::new(), 0usize);
    let mut kept: Vec<(String, String)> = Vec::new();
    let mut failure = None;
    while let Some(held) = reader.next().await {
        examined += 1;
        if !selector.matches(&held.message) {
            reader.keep(held);
            continue;
        }
        let id = held.message.envelope.id.clone();
        selected.push(id.clone());
        let result = match &action {
            Action::Nothing => {
                reader.keep(held);
                continue;
            }
            Action::Delete => reader.remove(held),
            Action::Move(to) => {
                let sent = conn
                    .publish_confirmed("", to, true, held.message.properties.clone(), held.message.body.clone())
                    .await;
                match sent {
                    Ok(()) => reader.remove(held),
                    Err(e) => {
                        kept.push((id, e.to_string()));
                        reader.keep(held);
                        continue;
                    }
                }
            }
        };
        match result {
            Ok(()) => done += 1,
            Err(e) => {
                failure = Some(Failure::broker(format!("cannot settle {id} in {name}"), e));
                break;
            }
        }
    }
    reader.close().await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    let (verb, dry) = match &action {
        Action::Nothing => ("would be", true),
        Action::Delete => ("deleted", false),
        Action::Move(_) => ("moved", false),
    };
    if json {
        let kept: Vec<_> = kept
            .iter()
            .map(|(id, reason)| json!({ "message_id": id, "reason": reason }))
            .collect();
        println!(
            "{}",
            render::json(&json!({
                "queue": name,
                "dry_run": dry,
                "examined": examined,
                "selected": selected,
                "done": done,
                "kept": kept,
            }))
        );
    } else {
        let line = |text: String| println!("{}", render::safe(&text));
        let what = match &action {
            Action::Move(to) => format!(" to {to}"),
            _ => String::new(),
        };
        if dry {
            line(format!(
                "dry run: {} of {} examined in {name} selected; nothing was changed",
                selected.len(),
                messages(examined as u32)
            ));
            for id in &selected {
                line(format!("  {id}"));
            }
        } else {
            line(format!(
                "{verb} {done} of {} examined in {name}{what} ({} left in place)",
                messages(examined as u32),
                examined - done
            ));
        }
        if !kept.is_empty() {
            line(format!(
                "{} could not be moved (left in {name}):",
                messages(kept.len() as u32)
            ));
            for (id, reason) in &kept {
                line(format!("  {id}: {reason}"));
            }
        }
    }
    Ok(if kept.is_empty() { OK } else { FAILED })
}

/// `dlq export`: the selected messages as NDJSON on stdout, each written
/// (and flushed) before it is removed with --remove.
async fn export(conn: &Conn, queue: &SetAsideQueue, filters: &Filters, limit: Option<usize>, remove: bool) -> Outcome {
    let name = queue.name();
    depth(conn, queue).await?;
    let selector = filters.selector(conn, queue).await?;
    let mut reader = conn
        .read_queue(&name, limit)
        .await
        .map_err(|e| Failure::broker(format!("cannot read {name}"), e))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut examined, mut exported) = (0usize, 0usize);
    let mut failure = None;
    while let Some(held) = reader.next().await {
        examined += 1;
        if !selector.matches(&held.message) {
            reader.keep(held);
            continue;
        }
        let line = transfer::export_line(&name, examined, &held.message);
        if let Err(e) = transfer::write_line(&mut out, &line) {
            reader.keep(held);
            failure = Some(Failure::from(format!(
                "cannot write the export ({e}); {exported} exported, the rest left in {name}"
            )));
            break;
        }
        exported += 1;
        if !remove {
            reader.keep(held);
        } else if let Err(e) = reader.remove(held) {
            failure = Some(Failure::broker(
                format!("cannot remove an exported message from {name}"),
                e,
            ));
            break;
        }
    }
    reader.close().await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    eprintln!(
        "{}",
        render::safe(&format!(
            "exported {exported} of {} examined in {name}{}",
            messages(examined as u32),
            if remove { " (removed)" } else { " (left in place)" }
        ))
    );
    Ok(OK)
}

/// `dlq import`: NDJSON from stdin into the set-aside queue.
async fn import(conn: &Conn, queue: &SetAsideQueue) -> Outcome {
    let name = queue.name();
    depth(conn, queue).await?;
    let messages_in = transfer::read_import(std::io::stdin().lock())?;
    let total = messages_in.len();
    match transfer::import(conn, &name, messages_in).await {
        Ok(()) => {
            println!(
                "{}",
                render::safe(&format!("imported {} into {name}", messages(total as u32)))
            );
            Ok(OK)
        }
        // A refusal of the message: 1; the broker gone or refusing access: 3.
        Err((done, e)) => Err(Failure::broker(
            format!(
                "message {} of {total} was not imported ({done} imported before it, the rest not)",
                done + 1
            ),
            e,
        )),
    }
}
