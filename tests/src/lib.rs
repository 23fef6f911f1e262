//! The acemq behaviour suite's harness: the brokers every scenario runs
//! against, and what a test may do to them.
//!
//! Brokers: acemq-memory (a fresh in-process broker for every scenario, so
//! scenarios never see each other's faults), and two RabbitMQ releases,
//! each over TCP and over TLS (TLS only for the suites that ask for
//! [`all_brokers`] or [`brokers_with_tls`]): 3.10 (the private node started by
//! `scripts/rabbitmq.sh`, found through the `ACEMQ_RABBITMQ_*` variables
//! that `scripts/test.sh` exports) and 4.0 (the node of
//! `scripts/rabbitmq.sh 4.0`, found through `ACEMQ_RABBITMQ4_*`). Every
//! broker's [`Kind`] names its version, so a failure does. Under `CI=true` a
//! RabbitMQ that is not there is a failure; elsewhere the RabbitMQ runs are
//! skipped with a loud message.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use acemq_core::amqp::{Config, Connection, TlsConfig};
/// Every test runs under a deadline: a hang fails naming the test and what
/// it waited for (see [`deadline`](mod@deadline)).
pub use deadline::{deadline, deadline_blocking, step, waiting_for};

// The watchdog acemq-memory's own tests run under: one file, kept with them
// (test support, not part of acemq-memory's API).
#[path = "../../acemq-memory/tests/common/deadline.rs"]
pub mod deadline;

// Breaking the real RabbitMQ on purpose: kill, restart, pause, forced
// closes, and an in-test TCP proxy that cuts or blackholes connections.
pub mod chaos;

/// The workspace's binaries run as child processes.
pub mod binaries;

/// Recording a `Conn`'s recovery events, to wait on in tests.
mod events;
pub use events::RecoveryLog;

/// The databases of the outbox scenarios: the private PostgreSQL cluster
/// and SQLite files.
pub mod db;

/// Which broker a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// acemq-memory, in process.
    Memory,
    /// RabbitMQ 3.10 over plain TCP.
    RabbitTcp,
    /// RabbitMQ 3.10 over TLS with the CA generated for the run.
    RabbitTls,
    /// RabbitMQ 4.0 over plain TCP.
    Rabbit4Tcp,
    /// RabbitMQ 4.0 over TLS with the CA generated for the run.
    Rabbit4Tls,
}

impl Kind {
    /// The RabbitMQ release, or `None` for acemq-memory.
    pub fn version(self) -> Option<RabbitVersion> {
        match self {
            Kind::Memory => None,
            Kind::RabbitTcp | Kind::RabbitTls => Some(RabbitVersion::V3_10),
            Kind::Rabbit4Tcp | Kind::Rabbit4Tls => Some(RabbitVersion::V4_0),
        }
    }

    /// Whether this is RabbitMQ over TLS (either version).
    pub fn is_tls(self) -> bool {
        matches!(self, Kind::RabbitTls | Kind::Rabbit4Tls)
    }

    /// Whether this is RabbitMQ over plain TCP (either version).
    pub fn is_rabbit_tcp(self) -> bool {
        matches!(self, Kind::RabbitTcp | Kind::Rabbit4Tcp)
    }

    /// RabbitMQ `version` over TCP, or over TLS.
    pub fn rabbit(version: RabbitVersion, tls: bool) -> Kind {
        match (version, tls) {
            (RabbitVersion::V3_10, false) => Kind::RabbitTcp,
            (RabbitVersion::V3_10, true) => Kind::RabbitTls,
            (RabbitVersion::V4_0, false) => Kind::Rabbit4Tcp,
            (RabbitVersion::V4_0, true) => Kind::Rabbit4Tls,
        }
    }
}

/// A RabbitMQ release line the suite runs against. Where the two behave
/// differently a test asserts each one's own behaviour, branching on
/// [`Broker::version`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RabbitVersion {
    /// RabbitMQ 3.10 (Debian bookworm's 3.10.8).
    V3_10,
    /// RabbitMQ 4.0 (Debian trixie's 4.0.5).
    V4_0,
}

impl RabbitVersion {
    /// Both, oldest first.
    pub const ALL: [RabbitVersion; 2] = [RabbitVersion::V3_10, RabbitVersion::V4_0];

    /// The version as `scripts/rabbitmq.sh` takes it (`ACEMQ_RABBITMQ_VERSION`).
    pub fn as_str(self) -> &'static str {
        match self {
            RabbitVersion::V3_10 => "3.10",
            RabbitVersion::V4_0 => "4.0",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for RabbitVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RabbitMQ {}", self.as_str())
    }
}

/// A broker a scenario can run against.
#[derive(Debug, Clone)]
pub struct Broker {
    /// Which one.
    pub kind: Kind,
    /// Its URL.
    pub url: String,
    /// The TLS settings that trust it (none for a broker over plain TCP:
    /// acemq refuses TLS settings with an `amqp://` URL).
    pub tls: TlsConfig,
    /// Where the run's CA and client certificate (`client.pem`, `client.key`) are.
    pub tls_dir: Option<PathBuf>,
    /// The in-process broker, for [`Kind::Memory`].
    pub memory: Option<acemq_memory::Broker>,
    /// While a scenario runs on this broker, its deadline says so.
    on: Option<Arc<deadline::Waiting>>,
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
            let on = match b.version() {
                Some(v) => format!("the scenario on {:?} ({v})", b.kind),
                None => format!("the scenario on {:?}", b.kind),
            };
            b.on = Some(Arc::new(waiting_for(on)));
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

/// Whether a missing RabbitMQ 4.0 node fails a run under `CI=true` (as a
/// missing 3.10 node does).
const REQUIRE_4_0_IN_CI: bool = true;

/// Where one RabbitMQ node is, from the environment `scripts/test.sh`
/// exports or from the node's files under the default layout.
#[derive(Debug, Clone)]
pub struct RabbitEnv {
    /// Which release.
    pub version: RabbitVersion,
    /// Its AMQP URL (plain TCP).
    pub url: String,
    /// Its AMQPS URL and the CA that trusts it, when it serves TLS.
    pub tls: Option<(String, PathBuf)>,
}

/// The settings of RabbitMQ `version`: `ACEMQ_RABBITMQ_URL`,
/// `ACEMQ_RABBITMQ_TLS_URL` and `ACEMQ_RABBITMQ_CA` for 3.10,
/// `ACEMQ_RABBITMQ4_URL`, `ACEMQ_RABBITMQ4_TLS_URL` and `ACEMQ_RABBITMQ4_CA`
/// for 4.0 (whose TLS may be absent), else the default node's files.
pub fn rabbit_env(version: RabbitVersion) -> Option<RabbitEnv> {
    let (prefix, default_ca, tcp_port, tls_port) = match version {
        RabbitVersion::V3_10 => ("ACEMQ_RABBITMQ", "target/rabbitmq/tls/ca.pem", 5672, 5671),
        RabbitVersion::V4_0 => ("ACEMQ_RABBITMQ4", "target/trixie-root/srv/acemq/tls/ca.pem", 5674, 5675),
    };
    let var = |name: &str| std::env::var(format!("{prefix}_{name}")).ok();
    let (tcp, tls, ca) = (var("URL"), var("TLS_URL"), var("CA").map(PathBuf::from));
    match (tcp, tls, ca) {
        (Some(url), Some(tls), Some(ca)) => Some(RabbitEnv {
            version,
            url,
            tls: Some((tls, ca)),
        }),
        (Some(url), _, _) if version == RabbitVersion::V4_0 => Some(RabbitEnv {
            version,
            url,
            tls: None,
        }),
        _ => {
            let ca = root().join(default_ca);
            ca.exists().then(|| RabbitEnv {
                version,
                url: format!("amqp://guest:guest@127.0.0.1:{tcp_port}/"),
                tls: Some((format!("amqps://guest:guest@localhost:{tls_port}/"), ca)),
            })
        }
    }
}

/// Whether a run without RabbitMQ `version` is a failure (`CI=true`).
fn required(version: RabbitVersion) -> bool {
    in_ci() && (version == RabbitVersion::V3_10 || REQUIRE_4_0_IN_CI)
}

/// The brokers most scenarios run against: acemq-memory, and RabbitMQ 3.10
/// and 4.0 over TCP. TLS is acemq's own layer (rustls), the same whatever
/// runs above it: the engine suite and the chaos harness test it on both
/// versions ([`all_brokers`]), and the scenarios where TLS changes what
/// happens (a reconnect's handshake, a blocked publisher whose bytes the TLS
/// listener goes on reading, the scheduler's clock over TLS) run over 3.10's
/// TLS as well ([`brokers_with_tls`]). Every suite over TLS once more did
/// not fit CI's 25 minutes (see `scripts/test.sh`).
/// Panics under `CI=true` when RabbitMQ is missing; elsewhere says loudly
/// that it is skipped.
pub async fn brokers() -> Brokers {
    let mut all = all_brokers().await;
    all.0.retain(|b| !b.kind.is_tls());
    all
}

/// [`brokers`] and RabbitMQ 3.10 over TLS.
pub async fn brokers_with_tls() -> Brokers {
    let mut all = all_brokers().await;
    all.0.retain(|b| b.kind != Kind::Rabbit4Tls);
    all
}

/// Every broker: [`brokers`] and RabbitMQ 3.10 and 4.0 over TLS.
pub async fn all_brokers() -> Brokers {
    let name = unique("memory");
    let mut out = vec![Broker {
        kind: Kind::Memory,
        url: format!("memory://{name}/"),
        tls: TlsConfig::new(),
        tls_dir: None,
        // Imitating RabbitMQ 3.10 (acemq-memory's default is 4.0): where the
        // versions differ, a scenario expects 3.10's behaviour of every
        // broker whose `version()` is not 4.0.
        memory: Some(acemq_memory::Broker::named_with(&name, || {
            acemq_memory::BrokerConfig::for_version(acemq_memory::RabbitMqVersion::V3_10)
        })),
        on: None,
    }];
    for version in RabbitVersion::ALL {
        match rabbit_env(version) {
            Some(env) if reachable(&env.url).await => {
                let (tls, tls_dir) = match &env.tls {
                    Some((_, ca)) => {
                        let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display()));
                        let tls = TlsConfig::new().with_root_pem(&pem).expect("the generated CA parses");
                        (tls, ca.parent().map(PathBuf::from))
                    }
                    None => (TlsConfig::new(), None),
                };
                out.push(Broker {
                    kind: Kind::rabbit(version, false),
                    url: env.url,
                    // No TLS settings for amqp://: acemq refuses them there
                    // (the connection would go in clear).
                    tls: TlsConfig::new(),
                    tls_dir: tls_dir.clone(),
                    memory: None,
                    on: None,
                });
                if let Some((tls_url, _)) = env.tls {
                    out.push(Broker {
                        kind: Kind::rabbit(version, true),
                        url: tls_url,
                        tls,
                        tls_dir,
                        memory: None,
                        on: None,
                    });
                }
            }
            _ if required(version) => panic!(
                "{version} is not running under CI=true: scripts/test.sh must start it \
                 (scripts/rabbitmq.sh {} start)",
                version.as_str()
            ),
            _ => eprintln!(
                "\n!!!! SKIPPING the {version} runs: no broker found. Start one with \
                 `scripts/rabbitmq.sh {} start` or run `scripts/test.sh`. !!!!\n",
                version.as_str()
            ),
        }
    }
    Brokers(out)
}

async fn reachable(url: &str) -> bool {
    let Ok(parsed) = url.parse::<acemq_core::amqp::AmqpUrl>() else {
        return false;
    };
    let (host, port) = &parsed.hosts[0];
    // Under CI a node must be there, but one may be booting again after a
    // suite restarted it: it gets 30 s before the suite fails for it.
    let patience = if in_ci() {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    };
    let until = tokio::time::Instant::now() + patience;
    loop {
        let connect = tokio::net::TcpStream::connect((host.as_str(), *port));
        if tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Broker {
    /// The default connection config for this broker.
    pub fn config(&self) -> Config {
        Config::default()
            .with_tls(self.tls.clone())
            .with_connection_timeout(Duration::from_secs(10))
    }

    /// Opens a connection with the default config.
    pub async fn connect(&self) -> Connection {
        self.connect_with(self.config()).await
    }

    /// Opens an acemq [`acemq_core::Conn`] with this config (TLS and
    /// timeouts filled in for this broker).
    pub async fn conn_with(&self, mut config: acemq_core::Config) -> acemq_core::Conn {
        config.engine.tls = self.tls.clone();
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

    /// Whether this is RabbitMQ (either version).
    pub fn is_rabbitmq(&self) -> bool {
        self.kind.version().is_some()
    }

    /// The RabbitMQ release this broker is, or `None` for acemq-memory.
    pub fn version(&self) -> Option<RabbitVersion> {
        self.kind.version()
    }

    /// The RabbitMQ release this broker is; panics on acemq-memory (for
    /// code that acts on the RabbitMQ node, such as [`chaos`]).
    pub fn rabbit(&self) -> RabbitVersion {
        self.version()
            .unwrap_or_else(|| panic!("{:?} is not RabbitMQ", self.kind))
    }

    /// Runs `rabbitmqctl` against this broker's node; returns its stdout.
    pub fn rabbitmqctl(&self, args: &[&str]) -> String {
        rabbitmqctl(self.rabbit(), args)
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
        let listing = self.rabbitmqctl(&["list_connections", "pid", "client_properties"]);
        let line = listing
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no connection named {name} in:\n{listing}"));
        let pid = line.split_whitespace().next().expect("a pid column");
        self.rabbitmqctl(&["close_connection", pid, "closed by the acemq test suite"]);
    }

    /// Raises (or clears) a memory alarm: RabbitMQ blocks publishing connections.
    pub fn set_memory_alarm(&self, on: bool) {
        if let Some(memory) = &self.memory {
            memory.faults().set_memory_alarm(on);
            return;
        }
        self.rabbitmqctl(&["set_vm_memory_high_watermark", if on { "0" } else { "0.4" }]);
    }
}

/// Runs `rabbitmqctl` against the node of RabbitMQ `version` through
/// `scripts/rabbitmq.sh ctl`.
pub fn rabbitmqctl(version: RabbitVersion, args: &[&str]) -> String {
    let out = Command::new(root().join("scripts/rabbitmq.sh"))
        .env("ACEMQ_RABBITMQ_VERSION", version.as_str())
        .arg("ctl")
        .args(args)
        .output()
        .expect("scripts/rabbitmq.sh runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} on {version} failed: {}{}",
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
    ch.queue_declare(acemq_codec::QueueDeclare {
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
    let passive = acemq_codec::QueueDeclare {
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

// The differential test of acemq-memory against RabbitMQ
// (`tests/tests/differential.rs`): acemq-cli's harness, run on a fresh
// acemq-memory imitating each RabbitMQ.
pub mod differential;

// The model-based test of the consumer (`tests/tests/model.rs`):
// operations, the runner, the model.
pub mod model;

/// A handler of `u32` messages that sends each to `tx` and accepts it,
/// for scenarios that watch what a consumer receives.
pub fn forward(
    tx: tokio::sync::mpsc::UnboundedSender<acemq_core::Message<u32>>,
) -> impl Fn(acemq_core::Message<u32>) -> std::future::Ready<acemq_core::Ack> + Clone {
    move |m| {
        let _ = tx.send(m);
        std::future::ready(acemq_core::Ack::accept())
    }
}

/// The next message [`forward`] sent, within 30 s (`what` names it in the
/// failure and in the deadline's report).
pub async fn next(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<acemq_core::Message<u32>>,
    what: &str,
) -> acemq_core::Message<u32> {
    let _label = waiting_for(what.to_string());
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} within 30 s"))
        .expect("the handler is alive")
}

/// Runs `scenario` on every broker: acemq-memory on a paused clock with
/// `scale` 1, RabbitMQ on a real clock with `scale` 100 (divide delays by it).
pub fn on_every_broker<F, Fut>(scenario: F)
where
    F: Fn(Broker, u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let all = tokio::runtime::Runtime::new().unwrap().block_on(brokers());
    for b in all {
        let kind = b.kind;
        let runtime = if kind == Kind::Memory {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread().enable_all().build()
        }
        .unwrap();
        let scale = if kind == Kind::Memory { 1 } else { 100 };
        runtime.block_on(deadline(scenario(b, scale)));
    }
}

/// `n` seconds on a broker run with `scale` (see [`on_every_broker`]).
pub fn secs(n: u64, scale: u32) -> Duration {
    Duration::from_secs(n) / scale
}

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
