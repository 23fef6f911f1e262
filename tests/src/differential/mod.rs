//! The differential test's machinery: sequences of operations ([`ops`]),
//! a runner that records a broker's every answer to one ([`run`]), the one
//! place where what may legitimately differ is normalised ([`normalise`]),
//! and [`compare`], which runs a sequence on acemq-memory and on RabbitMQ
//! and says where their transcripts part.

pub mod normalise;
pub mod ops;
pub mod run;

use std::sync::atomic::{AtomicU64, Ordering};

pub use ops::Op;

/// The RabbitMQ the differential test runs against: its URL, or `None`
/// when there is none (a failure under `CI=true`, see [`crate::brokers`]).
pub async fn rabbitmq_url() -> Option<String> {
    crate::brokers()
        .await
        .into_iter()
        .find(|b| b.kind == crate::Kind::RabbitTcp)
        .map(|b| b.url)
}

/// A prefix for one sequence's names, unique to this process and call.
fn prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("diff.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs `ops` on a fresh acemq-memory broker and on the RabbitMQ at
/// `rabbitmq`, with the same names on both, and returns both transcripts
/// (acemq-memory's first).
pub async fn transcripts(ops: &[Op], rabbitmq: &str) -> (Vec<String>, Vec<String>) {
    let prefix = prefix();
    let memory_name = format!("{prefix}.broker");
    let broker = acemq_memory::Broker::named(&memory_name);
    let started = std::time::Instant::now();
    let memory = run::run(&format!("memory://{memory_name}/"), &prefix, ops).await;
    drop(broker);
    acemq_memory::Broker::forget_named(&memory_name);
    let on_memory = started.elapsed();
    let rabbit = run::run(rabbitmq, &prefix, ops).await;
    if std::env::var_os("ACEMQ_DIFF_TIMES").is_some() {
        eprintln!(
            "{} ops: acemq-memory {on_memory:.1?}, RabbitMQ {:.1?}",
            ops.len(),
            started.elapsed() - on_memory
        );
    }
    (memory, rabbit)
}

/// Runs `ops` on both brokers; `Err` shows where the transcripts part,
/// with the lines before it for context.
pub async fn compare(ops: &[Op], rabbitmq: &str) -> Result<usize, String> {
    let started = std::time::Instant::now();
    let (memory, rabbit) = transcripts(ops, rabbitmq).await;
    if std::env::var_os("ACEMQ_DIFF_SLOW").is_some() && started.elapsed() > std::time::Duration::from_secs(3) {
        eprintln!("slow sequence ({:.1?}):", started.elapsed());
        for line in rabbit
            .iter()
            .filter(|l| l.contains("not quiet") || l.contains("no reply"))
        {
            eprintln!("  {line}");
        }
    }
    if memory == rabbit {
        return Ok(memory.len());
    }
    let first = memory
        .iter()
        .zip(&rabbit)
        .position(|(a, b)| a != b)
        .unwrap_or(memory.len().min(rabbit.len()));
    let mut out = String::from("the transcripts differ\n--- common\n");
    for line in &memory[first.saturating_sub(30)..first] {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str("--- acemq-memory\n");
    for line in memory.iter().skip(first).take(15) {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str("--- RabbitMQ\n");
    for line in rabbit.iter().skip(first).take(15) {
        out.push_str(&format!("  {line}\n"));
    }
    Err(out)
}
