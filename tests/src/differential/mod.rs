//! The differential test's machinery: sequences of operations ([`ops`]),
//! a runner that records a broker's every answer to one ([`run`]), the one
//! place where what may legitimately differ is normalised ([`normalise`]),
//! and [`compare`], which runs a sequence on acemq-memory and on RabbitMQ
//! and says where their transcripts part.

pub mod normalise;
pub mod ops;
pub mod raw;
pub mod run;

use std::sync::atomic::{AtomicU64, Ordering};

use acemq_memory::{BrokerConfig, RabbitMqVersion};
pub use ops::Op;

/// A RabbitMQ the differential test compares with, and the version it
/// says it is (its `connection.start`), which acemq-memory then imitates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rabbit {
    /// Its `amqp://` URL.
    pub url: String,
    /// Its release line.
    pub version: RabbitMqVersion,
}

/// Every RabbitMQ the differential test runs against, or only those of
/// version `only`: the harness's RabbitMQ nodes over TCP (see
/// [`crate::brokers`]: 3.10, and 4.0 when `ACEMQ_RABBITMQ4_URL` or its
/// default node is there; a missing 3.10 is a failure under `CI=true`).
/// When only 4.0 is wanted, 3.10 is not looked for. Each is asked its
/// version; one acemq-memory cannot imitate is a failure.
pub async fn rabbitmqs(only: Option<RabbitMqVersion>) -> Vec<Rabbit> {
    let urls: Vec<String> = if only == Some(RabbitMqVersion::V4_0) {
        crate::rabbit_env(crate::RabbitVersion::V4_0)
            .map(|env| env.url)
            .into_iter()
            .collect()
    } else {
        crate::brokers()
            .await
            .into_iter()
            .filter(|b| b.kind.is_rabbit_tcp())
            .map(|b| b.url)
            .collect()
    };
    let mut out = Vec::new();
    for url in urls {
        let version = version_of(&url).await;
        out.push(Rabbit { url, version });
    }
    out.retain(|r| only.is_none_or(|v| r.version == v));
    out.sort_by_key(|r| r.version);
    out
}

/// The release line the RabbitMQ at `url` names in `connection.start`.
async fn version_of(url: &str) -> RabbitMqVersion {
    let conn = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        acemq_core::amqp::Connection::open(url, Default::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("RabbitMQ at {url} did not answer within 10 s"))
    .unwrap_or_else(|e| panic!("RabbitMQ at {url}: {e}"));
    let said = conn
        .server_properties()
        .get("version")
        .and_then(|v| match v {
            acemq_codec::FieldValue::LongString(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .unwrap_or_default();
    let _ = conn.close().await;
    said.parse()
        .unwrap_or_else(|e| panic!("RabbitMQ at {url} says it is version {said:?}: {e}"))
}

/// A prefix for one sequence's names, unique to this process and call.
fn prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("diff.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Runs `ops` on a fresh acemq-memory broker imitating `rabbitmq`'s
/// version and on `rabbitmq`, with the same names on both, and returns
/// both transcripts (acemq-memory's first).
pub async fn transcripts(ops: &[Op], rabbitmq: &Rabbit) -> (Vec<String>, Vec<String>) {
    let prefix = prefix();
    let memory_name = format!("{prefix}.broker");
    let broker = acemq_memory::Broker::named_with(&memory_name, || BrokerConfig::for_version(rabbitmq.version));
    let started = std::time::Instant::now();
    let memory = run::run(&format!("memory://{memory_name}/"), &prefix, ops).await;
    drop(broker);
    acemq_memory::Broker::forget_named(&memory_name);
    let on_memory = started.elapsed();
    let rabbit = run::run(&rabbitmq.url, &prefix, ops).await;
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
pub async fn compare(ops: &[Op], rabbitmq: &Rabbit) -> Result<usize, String> {
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
    let mut out = format!(
        "the transcripts differ (acemq-memory imitating {v}, RabbitMQ {v} at {})\n--- common\n",
        rabbitmq.url,
        v = rabbitmq.version
    );
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
