//! The differential test's brokers: the harness itself is acemq-cli's
//! (`acemq_cli::conformance::diff`, re-exported here); this module finds
//! the RabbitMQ nodes to compare with and runs each sequence on a fresh
//! in-process acemq-memory imitating the node's version, then on the node.

use std::sync::Arc;

pub use acemq_cli::conformance::diff::*;
use acemq_memory::{BrokerConfig, RabbitMqVersion};

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
pub async fn version_of(url: &str) -> RabbitMqVersion {
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

/// The in-process acemq-memory broker `name` as the harness reaches it:
/// `memory://name/`, with its raw frames over a duplex of its own.
pub fn memory_broker(name: &str) -> Broker {
    let url = format!("memory://{name}/");
    let name = name.to_string();
    let dial: DialRaw = Arc::new(move || -> RawFuture {
        let name = name.clone();
        Box::pin(async move { Ok(Box::new(acemq_memory::Broker::named(&name).connect()) as RawStream) })
    });
    Broker::new(&url).expect("a memory:// URL").with_raw_dialer(dial)
}

/// Runs `ops` on a fresh acemq-memory broker imitating `rabbitmq`'s
/// version and on `rabbitmq`, and returns both transcripts (acemq-memory's
/// first).
pub async fn transcripts_with(ops: &[Op], rabbitmq: &Rabbit) -> (Transcript, Transcript) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let memory_name = format!("diff.{}.{n}.broker", std::process::id());
    let memory = acemq_memory::Broker::named_with(&memory_name, || BrokerConfig::for_version(rabbitmq.version));
    let rabbit = Broker::new(&rabbitmq.url).expect("the harness's RabbitMQ URL");
    let out = transcripts(ops, &memory_broker(&memory_name), &rabbit).await;
    drop(memory);
    acemq_memory::Broker::forget_named(&memory_name);
    out
}

/// Runs `ops` on both brokers; `Err` shows where the transcripts part,
/// with the lines before it for context.
pub async fn compare_with(ops: &[Op], rabbitmq: &Rabbit) -> Result<usize, String> {
    let (memory, rabbit) = transcripts_with(ops, rabbitmq).await;
    let len = memory.len();
    match Difference::of(ops, memory, rabbit) {
        None => Ok(len),
        Some(d) => Err(format!(
            "A is acemq-memory imitating {v}, B is RabbitMQ {v} at {}: {d}",
            rabbitmq.url,
            v = rabbitmq.version
        )),
    }
}
