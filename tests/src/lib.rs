//! The acemq behaviour suite's harness: the brokers every scenario runs
//! against, and what a test may do to them.
//!
//! Brokers: acemq-memory (a fresh in-process broker for every scenario, so
//! scenarios never see each other's faults), and RabbitMQ over TCP and over
//! TLS (the private node started by `scripts/rabbitmq.sh`, found through the
//! `ACEMQ_RABBITMQ_*` variables that `scripts/test.sh` exports). Under
//! `CI=true` a RabbitMQ that is not there is a failure; elsewhere the
//! RabbitMQ runs are skipped with a loud message.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use acemq_core::amqp::{Config, Connection, TlsConfig};
/// Every test runs under a deadline: a hang fails naming the test and what
/// it waited for (see `acemq_memory::deadline`).
pub use acemq_memory::deadline::{deadline, deadline_blocking, step, waiting_for};

/// Breaking the real RabbitMQ on purpose: kill, restart, pause, forced
/// closes, and an in-test TCP proxy that cuts or blackholes connections.
pub mod chaos;

/// The databases of the outbox scenarios: the private PostgreSQL cluster
/// and SQLite files.
pub mod db;

/// Which broker a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// acemq-memory, in process.
    Memory,
    /// RabbitMQ over plain TCP.
    RabbitTcp,
    /// RabbitMQ over TLS with the CA generated for the run.
    RabbitTls,
}

/// A broker a scenario can run against.
#[derive(Debug, Clone)]
pub struct Broker {
    /// Which one.
    pub kind: Kind,
    /// Its URL.
    pub url: String,
    /// The TLS settings that trust it.
    pub tls: TlsConfig,
    /// Where the run's CA and client certificate (`client.pem`, `client.key`) are.
    pub tls_dir: Option<PathBuf>,
    /// The in-process broker, for [`Kind::Memory`].
    pub memory: Option<acemq_memory::Broker>,
    /// While a scenario runs on this broker, its deadline says so.
    on: Option<Arc<acemq_memory::deadline::Waiting>>,
}

/// The brokers of [`brokers`]. Iterating labels each scenario's run with
/// its broker, so a deadline that passes says which broker it was on.
#[derive(Debug)]
pub struct Brokers(Vec<Broker>);

impl IntoIterator for Brokers {
    type Item = Broker;
    type IntoIter = std::iter::Map<std::vec::IntoIter<Broker>, fn(Broker) -> Broker>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter().map(|mut b| {
            b.on = Some(Arc::new(waiting_for(format!("the scenario on {:?}", b.kind))));
            b
        })
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true" || v == "1").unwrap_or(false)
}

/// The RabbitMQ settings from the environment `scripts/test.sh` exports, or
/// from the node's files when it runs under the default layout.
fn rabbit_env() -> Option<(String, String, PathBuf)> {
    let tcp = std::env::var("ACEMQ_RABBITMQ_URL").ok();
    let tls = std::env::var("ACEMQ_RABBITMQ_TLS_URL").ok();
    let ca = std::env::var("ACEMQ_RABBITMQ_CA").ok().map(PathBuf::from);
    match (tcp, tls, ca) {
        (Some(tcp), Some(tls), Some(ca)) => Some((tcp, tls, ca)),
        _ => {
            let ca = root().join("target/rabbitmq/tls/ca.pem");
            ca.exists().then(|| {
                (
                    "amqp://guest:guest@127.0.0.1:5672/".to_string(),
                    "amqps://guest:guest@localhost:5671/".to_string(),
                    ca,
                )
            })
        }
    }
}

/// Every broker to run scenarios against. Panics under `CI=true` when
/// RabbitMQ is missing; elsewhere says loudly that it is skipped.
pub async fn brokers() -> Brokers {
    let name = unique("memory");
    let mut out = vec![Broker {
        kind: Kind::Memory,
        url: format!("memory://{name}/"),
        tls: TlsConfig::new(),
        tls_dir: None,
        memory: Some(acemq_memory::Broker::named(&name)),
        on: None,
    }];
    match rabbit_env() {
        Some((tcp, tls_url, ca)) if reachable(&tcp).await => {
            let pem = std::fs::read(&ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
            let tls = TlsConfig::new().with_root_pem(&pem).expect("the generated CA parses");
            let tls_dir = ca.parent().map(PathBuf::from);
            out.push(Broker {
                kind: Kind::RabbitTcp,
                url: tcp,
                tls: tls.clone(),
                tls_dir: tls_dir.clone(),
                memory: None,
                on: None,
            });
            out.push(Broker {
                kind: Kind::RabbitTls,
                url: tls_url,
                tls,
                tls_dir,
                memory: None,
                on: None,
            });
        }
        _ if in_ci() => {
            panic!("RabbitMQ is not running under CI=true: scripts/test.sh must start it (scripts/rabbitmq.sh start)")
        }
        _ => eprintln!(
            "\n!!!! SKIPPING the RabbitMQ runs: no broker found. Start one with `scripts/rabbitmq.sh start` \
             or run `scripts/test.sh`. !!!!\n"
        ),
    }
    Brokers(out)
}

async fn reachable(url: &str) -> bool {
    let Ok(parsed) = url.parse::<acemq_core::amqp::AmqpUrl>() else {
        return false;
    };
    let (host, port) = &parsed.hosts[0];
    tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((host.as_str(), *port)),
    )
    .await
    .is_ok_and(|r| r.is_ok())
}

impl Broker {
    /// The default connection config for this broker.
    pub fn config(&self) -> Config {
        Config {
            tls: self.tls.clone(),
            connection_timeout: Duration::from_secs(10),
            ..Config::default()
        }
    }

    /// Opens a connection with the default config.
    pub async fn connect(&self) -> Connection {
        self.connect_with(self.config()).await
    }

    /// Opens an acemq [`acemq_core::Conn`] with this config (TLS and
    /// timeouts filled in for this broker).
    pub async fn conn_with(&self, mut config: acemq_core::Config) -> acemq_core::Conn {
        config.tls = self.tls.clone();
        config.engine.connection_timeout = Duration::from_secs(10);
        acemq_core::Conn::open(&self.url, config)
            .await
            .unwrap_or_else(|e| panic!("opening a Conn to {:?} at {}: {e}", self.kind, self.url))
    }

    /// Opens an acemq [`acemq_core::Conn`] with the default config.
    pub async fn conn(&self) -> acemq_core::Conn {
        self.conn_with(acemq_core::Config::default()).await
    }

    /// Opens a connection with this config.
    pub async fn connect_with(&self, config: Config) -> Connection {
        Connection::open(&self.url, config)
            .await
            .unwrap_or_else(|e| panic!("connecting to {:?} at {}: {e}", self.kind, self.url))
    }

    /// Whether this is RabbitMQ.
    pub fn is_rabbitmq(&self) -> bool {
        matches!(self.kind, Kind::RabbitTcp | Kind::RabbitTls)
    }

    /// Runs `rabbitmqctl` against the test node; returns its stdout.
    pub fn rabbitmqctl(&self, args: &[&str]) -> String {
        rabbitmqctl(args)
    }

    /// Closes the connection whose `connection_name` is `name` from the
    /// broker's side with 320 CONNECTION_FORCED (RabbitMQ: `rabbitmqctl
    /// close_connection`; acemq-memory: the fault handle, on this scenario's
    /// own broker).
    pub fn force_close(&self, name: &str) {
        if let Some(memory) = &self.memory {
            memory.faults().close_all("closed by the acemq test suite");
            return;
        }
        let listing = rabbitmqctl(&["list_connections", "pid", "client_properties"]);
        let line = listing
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no connection named {name} in:\n{listing}"));
        let pid = line.split_whitespace().next().expect("a pid column");
        rabbitmqctl(&["close_connection", pid, "closed by the acemq test suite"]);
    }

    /// Raises (or clears) a memory alarm: RabbitMQ blocks publishing connections.
    pub fn set_memory_alarm(&self, on: bool) {
        if let Some(memory) = &self.memory {
            memory.faults().set_memory_alarm(on);
            return;
        }
        rabbitmqctl(&["set_vm_memory_high_watermark", if on { "0" } else { "0.4" }]);
    }
}

/// Runs `rabbitmqctl` through `scripts/rabbitmq.sh ctl`.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = Command::new(root().join("scripts/rabbitmq.sh"))
        .arg("ctl")
        .args(args)
        .output()
        .expect("scripts/rabbitmq.sh runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A moment read on both clocks a broker-timed wait can be measured by:
/// tokio's monotonic clock (paused on acemq-memory) and the system clock.
///
/// RabbitMQ times a TTL on the system clock: a message's expiry is
/// `os:system_time` at enqueue plus the TTL, and the queue drops it once
/// `os:system_time` has passed that. When the system clock runs apart from
/// the monotonic one (stepped, or corrected against a guest clock that runs
/// slow, as happened to a CI run here: a 2 s ladder wait measured 1.994 s on
/// the monotonic clock), a wait the broker kept whole can look short on the
/// monotonic clock, or long. A wait was cut short only when it was short on
/// both.
#[derive(Debug, Clone, Copy)]
pub struct Moment {
    /// The monotonic clock (tokio's, so paused with the runtime).
    pub at: tokio::time::Instant,
    /// The system clock, moved with tokio's when it is paused
    /// ([`acemq_core::schedule::wall_clock`]).
    pub wall: std::time::SystemTime,
}

impl Moment {
    /// This moment, on both clocks.
    pub fn now() -> Moment {
        Moment {
            at: tokio::time::Instant::now(),
            wall: acemq_core::schedule::wall_clock(),
        }
    }

    /// How long from `earlier` to this moment, on each clock (zero where a
    /// clock went back).
    pub fn since(&self, earlier: &Moment) -> Waited {
        Waited {
            monotonic: self.at.saturating_duration_since(earlier.at),
            system: self.wall.duration_since(earlier.wall).unwrap_or_default(),
        }
    }
}

/// The time between two [`Moment`]s, on each clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waited {
    /// On the monotonic clock.
    pub monotonic: Duration,
    /// On the system clock.
    pub system: Duration,
}

impl Waited {
    /// Whether at least `wait` passed on either clock: false only for a wait
    /// cut short on both (see [`Moment`]).
    pub fn at_least(&self, wait: Duration) -> bool {
        self.monotonic >= wait || self.system >= wait
    }
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.monotonic)?;
        let apart = self.system.max(self.monotonic) - self.system.min(self.monotonic);
        if apart >= Duration::from_millis(1) {
            write!(f, " ({:?} on the system clock)", self.system)?;
        }
        Ok(())
    }
}

/// A name unique to this process and call, for queues and connections.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "acemq-test.{prefix}.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Declares a server-named exclusive queue on `ch` and returns its name.
pub async fn exclusive_queue(ch: &acemq_core::amqp::Channel) -> String {
    ch.queue_declare(amqp_codec::QueueDeclare {
        exclusive: true,
        ..Default::default()
    })
    .await
    .unwrap()
    .unwrap()
    .queue
    .to_string()
}

/// How many messages `queue` holds (a passive declare).
pub async fn depth(ch: &acemq_core::amqp::Channel, queue: &str) -> u32 {
    let passive = amqp_codec::QueueDeclare {
        queue: queue.into(),
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(passive).await.unwrap().unwrap().message_count
}

/// The counter `metric` of a snapshot, by its `outcome` label.
pub fn counts_by_outcome(
    snapshotter: &metrics_util::debugging::Snapshotter,
    metric: &str,
) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() != metric {
            continue;
        }
        let outcome = key.key().labels().find(|l| l.key() == "outcome");
        if let (Some(outcome), metrics_util::debugging::DebugValue::Counter(n)) = (outcome, value) {
            *counts.entry(outcome.value().to_string()).or_default() += n;
        }
    }
    counts
}

/// The counter `metric` of a snapshot, summed over every label set. A
/// snapshot resets the recorder's counters: take one per recorder.
pub fn counter_total(snapshotter: &metrics_util::debugging::Snapshotter, metric: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == metric)
        .map(|(_, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// Runs `scenario` on a current-thread runtime of its own, under the test
/// deadline, with a metrics recorder local to it (so the counts are this
/// scenario's alone, whatever else runs), and returns the counter `metric`
/// summed by the value of its `label`.
pub fn counted_by<F>(metric: &str, label: &str, scenario: F) -> std::collections::BTreeMap<String, u64>
where
    F: std::future::Future<Output = ()>,
{
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    metrics::with_local_recorder(&recorder, || runtime.block_on(deadline(scenario)));
    let mut counts = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        if key.key().name() != metric {
            continue;
        }
        let by = key
            .key()
            .labels()
            .find(|l| l.key() == label)
            .map(|l| l.value().to_string());
        if let (Some(by), metrics_util::debugging::DebugValue::Counter(n)) = (by, value) {
            *counts.entry(by).or_default() += n;
        }
    }
    counts
}

/// The differential test of acemq-memory against RabbitMQ
/// (`tests/tests/differential.rs`): operations, the runner, normalisation.
pub mod differential;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn moment(monotonic_ms: u64, system_ms: u64, base: tokio::time::Instant) -> Moment {
        Moment {
            at: base + Duration::from_millis(monotonic_ms),
            wall: UNIX_EPOCH + Duration::from_millis(system_ms),
        }
    }

    #[test]
    fn a_wait_is_short_only_when_it_is_short_on_both_clocks() {
        let base = tokio::time::Instant::now();
        let sent = moment(0, 1_000_000, base);
        let two = Duration::from_secs(2);
        // The CI run's case: the broker kept 2 s on the system clock, the
        // monotonic clock counted 1.994 s.
        let slow_monotonic = moment(1_994, 1_002_000, base).since(&sent);
        assert!(slow_monotonic.at_least(two));
        assert_eq!(slow_monotonic.to_string(), "1.994s (2s on the system clock)");
        // The system clock stepped back during the wait: the monotonic one holds.
        assert!(moment(2_001, 999_000, base).since(&sent).at_least(two));
        // Short on both: early.
        let early = moment(1_500, 1_001_500, base).since(&sent);
        assert!(!early.at_least(two));
        assert_eq!(early.to_string(), "1.5s");
    }
}
