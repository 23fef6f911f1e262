//! Breaking the real RabbitMQ node on purpose, for recovery tests.
//!
//! Every helper takes the [`RabbitVersion`] of the broker under test and
//! acts on that version's node as `scripts/rabbitmq.sh` manages it (run
//! with `ACEMQ_RABBITMQ_VERSION` set to it), which the child script finds
//! through the same `ACEMQ_RABBITMQ_PORT`, `_NODENAME` and `_DIR` variables
//! (`ACEMQ_RABBITMQ4_*` for 4.0) it reads by hand (the default is the
//! private node `scripts/test.sh` starts). The first helper called for a
//! version checks that this node is the one the harness connects to
//! (`ACEMQ_RABBITMQ_URL`, `ACEMQ_RABBITMQ4_URL`), and panics if not: a test
//! must never kill one node while it talks to another.
//!
//! Disruptive tests hold [`serial`] so they never overlap within one test
//! binary; a test that ends (or panics) with the node killed, paused or its
//! app stopped gets it back when the guard drops, so the next test finds a
//! running broker.
//!
//! Every wait has a deadline and a [`waiting_for`]
//! label; every failure panics saying what failed and with the script's
//! output. [`Proxy`] is an in-test TCP proxy that cuts or blackholes
//! connections without touching the broker.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::{waiting_for, RabbitVersion};

/// How long `scripts/rabbitmq.sh restart` may take (its own boot timeout is
/// 120 s by default).
const RESTART_TIMEOUT: Duration = Duration::from_secs(150);
/// How long `kill`, `pause`, `resume` and `env` may take.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `rabbitmqctl` command may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the AMQP port may take to answer after `start_app` returned.
const PORT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the AMQP port is probed while a node comes back.
const PROBE_EVERY: Duration = Duration::from_millis(25);

// ------------------------------------------------------------ the lock ---

/// The guard of [`serial`]: while it lives no other disruptive test of this
/// binary runs. When it drops it undoes what the test left broken: a paused
/// node is resumed, a killed one restarted, a stopped app started, a killed
/// cluster node restarted (failures there are printed, never panicked: the
/// guard may drop while a test unwinds).
#[must_use = "the lock is released when the guard is dropped"]
pub struct Serial {
    _guard: tokio::sync::MutexGuard<'static, ()>,
}

impl std::fmt::Debug for Serial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serial").finish_non_exhaustive()
    }
}

/// Takes the process-wide lock that disruptive tests hold, so that they
/// never overlap inside one test binary (`cargo test` runs the tests of a
/// binary in parallel threads, and the binaries one after another).
pub async fn serial() -> Serial {
    static LOCK: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    let lock = LOCK.get_or_init(|| tokio::sync::Mutex::new(()));
    let _label = waiting_for("chaos::serial (another disruptive test holds the broker)");
    Serial {
        _guard: lock.lock().await,
    }
}

/// What the helpers broke on one node and nobody repaired yet.
#[derive(Debug, Default, Clone, Copy)]
struct NodeDamage {
    killed: bool,
    paused: bool,
    app_stopped: bool,
}

/// What the helpers broke and nobody repaired yet (each version's node,
/// the cluster's nodes); [`Serial`] repairs it.
#[derive(Debug, Default)]
struct Damage {
    node: [NodeDamage; 2],
    cluster_killed: [bool; 3],
}

impl Damage {
    fn of(&mut self, version: RabbitVersion) -> &mut NodeDamage {
        &mut self.node[version.index()]
    }
}

fn damage() -> std::sync::MutexGuard<'static, Damage> {
    const WHOLE: NodeDamage = NodeDamage {
        killed: false,
        paused: false,
        app_stopped: false,
    };
    static DAMAGE: Mutex<Damage> = Mutex::new(Damage {
        node: [WHOLE; 2],
        cluster_killed: [false; 3],
    });
    DAMAGE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Serial {
    fn drop(&mut self) {
        let d = std::mem::take(&mut *damage());
        let repair = |version: RabbitVersion, what: &str, args: &[&str], timeout: Duration| {
            eprintln!("chaos::serial: the test left {version} with {what}; repairing it");
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            if let Err(e) = run_script(version, &args, timeout) {
                eprintln!("\n!!!! chaos::serial could not repair {what} on {version}: {e} !!!!\n");
            }
        };
        for version in RabbitVersion::ALL {
            let mut n = d.node[version.index()];
            if n.paused && !n.killed {
                repair(version, "the node paused", &["resume"], SIGNAL_TIMEOUT);
            }
            if n.killed {
                repair(version, "the node killed", &["restart"], RESTART_TIMEOUT);
                n.app_stopped = false;
            }
            if n.app_stopped {
                repair(version, "the app stopped", &["ctl", "start_app"], CTL_TIMEOUT);
            }
        }
        for (i, killed) in d.cluster_killed.iter().enumerate() {
            if *killed {
                let n = (i + 1).to_string();
                repair(
                    RabbitVersion::V3_10,
                    &format!("cluster node {n} killed"),
                    &["cluster", "restart", &n],
                    RESTART_TIMEOUT,
                );
            }
        }
    }
}

// ------------------------------------------------------------ the node ---

/// The AMQP URL (plain TCP) of every RabbitMQ node the helpers can act on,
/// with its version, oldest first. A version whose node does not run: under
/// `CI=true` a panic when the suite must have started it; elsewhere it is
/// left out after a loud message, and the caller skips it.
pub async fn rabbitmq_nodes() -> Vec<(RabbitVersion, String)> {
    let mut out = Vec::new();
    for version in RabbitVersion::ALL {
        match crate::rabbit_env(version).map(|env| env.url) {
            Some(url) if amqp_answers(&host_port(&url)).await => {
                node(version);
                out.push((version, url));
            }
            _ if crate::required(version) => panic!(
                "{version} is not running under CI=true: scripts/test.sh must start it (scripts/rabbitmq.sh {} start)",
                version.as_str()
            ),
            _ => eprintln!(
                "\n!!!! SKIPPING a chaos test on {version}: no node found. Start one with \
                 `scripts/rabbitmq.sh {} start` or run `scripts/test.sh`. !!!!\n",
                version.as_str()
            ),
        }
    }
    out
}

/// The node both the harness and `scripts/rabbitmq.sh` talk to.
struct Node {
    /// `host:port` of its AMQP listener.
    amqp: String,
}

/// The node of `version`, checked once: `scripts/rabbitmq.sh env` (what the
/// helpers act on) must name the port the harness connects to.
fn node(version: RabbitVersion) -> &'static Node {
    static NODES: [OnceLock<Node>; 2] = [OnceLock::new(), OnceLock::new()];
    NODES[version.index()].get_or_init(|| {
        let (url_var, vars) = match version {
            RabbitVersion::V3_10 => (
                "ACEMQ_RABBITMQ_URL",
                "ACEMQ_RABBITMQ_PORT, ACEMQ_RABBITMQ_NODENAME and ACEMQ_RABBITMQ_DIR",
            ),
            RabbitVersion::V4_0 => (
                "ACEMQ_RABBITMQ4_URL",
                "ACEMQ_RABBITMQ4_PORT, ACEMQ_RABBITMQ4_NODENAME, ACEMQ_RABBITMQ4_ROOT and ACEMQ_RABBITMQ4_DIR",
            ),
        };
        let harness = crate::rabbit_env(version).map(|env| env.url).unwrap_or_else(|| {
            panic!("chaos: the harness finds no {version} ({url_var} is not set and there is no default node)")
        });
        let env = run_script(version, &["env".to_string()], SIGNAL_TIMEOUT).unwrap_or_else(|e| panic!("chaos: {e}"));
        let script = env
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{url_var}=")))
            .unwrap_or_else(|| panic!("chaos: `scripts/rabbitmq.sh {version} env` printed no {url_var}:\n{env}"));
        let (ours, theirs) = (host_port(&harness), host_port(script));
        assert_eq!(
            port_of(&ours),
            port_of(&theirs),
            "chaos: the tests connect to {version} at {harness} but scripts/rabbitmq.sh would act on the node at \
             {script}; export the node's {vars} along with the URLs `scripts/rabbitmq.sh {} env` prints",
            version.as_str()
        );
        Node { amqp: ours }
    })
}

fn port_of(host_port: &str) -> &str {
    host_port.rsplit_once(':').map_or("", |(_, p)| p)
}

/// `host:port` of the first host of an AMQP URL (`amqp://u:p@h:1,h:2/v` gives `h:1`).
pub fn host_port(url: &str) -> String {
    let parsed: acemq_core::amqp::AmqpUrl = url.parse().unwrap_or_else(|e| panic!("chaos: {url}: {e}"));
    let (host, port) = &parsed.hosts[0];
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Whether `addr` answers the AMQP protocol header with a frame (its
/// `connection.start`): a broker that accepts AMQP connections, not just a
/// listening socket.
pub async fn amqp_answers(addr: &str) -> bool {
    let probe = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(b"AMQP\x00\x00\x09\x01").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(first[0] == 1)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), probe).await,
        Ok(Some(true))
    )
}

// ----------------------------------------------------- running commands ---

fn root() -> PathBuf {
    crate::root()
}

/// Runs `scripts/rabbitmq.sh ARGS` (blocking) for RabbitMQ `version`,
/// killing it (and its process group) after `timeout`. The child inherits
/// this process's environment, so `ACEMQ_RABBITMQ_*` (`ACEMQ_RABBITMQ4_*`)
/// choose the node. Returns stdout, or what failed.
fn run_script(version: RabbitVersion, args: &[String], timeout: Duration) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let what = format!("scripts/rabbitmq.sh {} {}", version.as_str(), args.join(" "));
    let mut child = Command::new(root().join("scripts/rabbitmq.sh"))
        .env("ACEMQ_RABBITMQ_VERSION", version.as_str())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{what} did not start: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut out);
            }
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < timeout => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => {
                // The whole group: the script and the rabbitmqctl it runs.
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    match status {
        Some(s) if s.success() => Ok(stdout),
        Some(s) => Err(format!("{what} failed ({s}):\n{stdout}{stderr}")),
        None => Err(format!(
            "{what} did not finish within {timeout:?} (killed):\n{stdout}{stderr}"
        )),
    }
}

/// [`run_script`] off the async threads, under a deadline label; panics on
/// failure.
async fn script(version: RabbitVersion, args: &[&str], timeout: Duration) -> String {
    node(version);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let what = format!("scripts/rabbitmq.sh {} {}", version.as_str(), args.join(" "));
    let _label = waiting_for(what.clone());
    match tokio::task::spawn_blocking(move || run_script(version, &args, timeout)).await {
        Ok(Ok(stdout)) => stdout,
        Ok(Err(e)) => panic!("chaos: {e}"),
        Err(e) => panic!("chaos: {what}: {e}"),
    }
}

/// `rabbitmqctl ARGS` against the node of `version` (through
/// `scripts/rabbitmq.sh ctl`, as [`crate::rabbitmqctl`] does), with a
/// deadline; returns its stdout.
pub async fn ctl(version: RabbitVersion, args: &[&str]) -> String {
    let mut all = vec!["ctl"];
    all.extend_from_slice(args);
    script(version, &all, CTL_TIMEOUT).await
}

/// Runs `action` (a script command that brings a node back) and probes
/// `addr` meanwhile; returns the first instant the node answered AMQP after
/// having been silent, or, if it never looked silent, the instant it
/// answered once `action` was done. Panics if it does not answer within
/// [`PORT_TIMEOUT`] after that.
async fn back_up(addr: &str, action: impl std::future::Future<Output = String>) -> Instant {
    let _label = waiting_for(format!("the AMQP port {addr} to answer again"));
    tokio::pin!(action);
    let (mut saw_down, mut first_up) = (false, None);
    let mut done = false;
    while !done {
        tokio::select! {
            _ = &mut action => done = true,
            _ = tokio::time::sleep(PROBE_EVERY) => {
                if first_up.is_none() {
                    let up = amqp_answers(addr).await;
                    if !up {
                        saw_down = true;
                    } else if saw_down {
                        first_up = Some(Instant::now());
                    }
                }
            }
        }
    }
    if let Some(at) = first_up {
        return at;
    }
    let deadline = Instant::now() + PORT_TIMEOUT;
    loop {
        if amqp_answers(addr).await {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "chaos: the node at {addr} does not answer AMQP {PORT_TIMEOUT:?} after it was brought back"
        );
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

// --------------------------------------------------------------- helpers ---

/// Closes every client connection of the node of `version` from the
/// broker's side (`rabbitmqctl close_all_connections --global`): each gets
/// `connection.close` 320 CONNECTION_FORCED with `reason` in its text.
/// Closes (320, with `reason`) the connections whose `rabbitmqctl
/// list_connections pid COLUMN` line `pick` accepts, once at least `count`
/// are listed: RabbitMQ lists a connection a moment after it opens, and one
/// not yet listed would stay open. Fails the test after 15 s.
pub async fn close_when_listed(
    version: RabbitVersion,
    column: &str,
    count: usize,
    reason: &str,
    pick: impl Fn(&str) -> bool,
) {
    let until = Instant::now() + Duration::from_secs(15);
    let pids = loop {
        let listing = ctl(version, &["list_connections", "pid", column]).await;
        let pids: Vec<String> = listing
            .lines()
            .filter(|line| pick(line))
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect();
        if pids.len() >= count {
            break pids;
        }
        assert!(
            Instant::now() < until,
            "fewer than {count} connections listed after 15 s:\n{listing}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for pid in &pids {
        ctl(version, &["close_connection", pid, reason]).await;
    }
}

pub async fn close_all_connections(version: RabbitVersion, reason: &str) {
    ctl(version, &["close_all_connections", "--global", reason]).await;
}

/// Stops the RabbitMQ application of `version`'s node (`rabbitmqctl
/// stop_app`): the Erlang VM keeps running, every connection is closed and
/// the AMQP port stops accepting. [`start_app`] undoes it.
pub async fn stop_app(version: RabbitVersion) {
    damage().of(version).app_stopped = true;
    ctl(version, &["stop_app"]).await;
}

/// Starts the application again (`rabbitmqctl start_app`); returns the
/// instant the AMQP port first answered again.
pub async fn start_app(version: RabbitVersion) -> Instant {
    let at = back_up(&node(version).amqp, ctl(version, &["start_app"])).await;
    damage().of(version).app_stopped = false;
    at
}

/// `kill -9` of the Erlang VM of `version`'s node and every other process
/// of it (never epmd); its data stays (`scripts/rabbitmq.sh kill`). Returns
/// once the processes are gone and the AMQP port is closed. [`restart`]
/// brings it back.
///
/// First it flushes the broker's metadata log ([`sync_metadata`]), so every
/// declaration the test saw confirmed survives the crash, as persistent
/// messages the broker confirmed do. [`kill_unsynced`] does not.
pub async fn kill(version: RabbitVersion) {
    if !damage().of(version).paused {
        sync_metadata(version).await;
    }
    kill_unsynced(version).await;
}

/// [`kill`] without flushing the metadata log first: exactly a crash. On
/// RabbitMQ 3.x, whose metadata lives in Mnesia, a queue, exchange or binding
/// declared a few milliseconds before may then be gone after [`restart`]
/// (Mnesia appends its transaction log asynchronously).
pub async fn kill_unsynced(version: RabbitVersion) {
    damage().of(version).killed = true;
    script(version, &["kill"], SIGNAL_TIMEOUT).await;
    // A paused VM dies as well.
    damage().of(version).paused = false;
}

/// Makes the node of `version` write every metadata change it has
/// acknowledged (queue, exchange and binding declarations, in Mnesia on
/// RabbitMQ 3.x and, unless Khepri is enabled, 4.0) to disk: `rabbitmqctl
/// eval 'catch mnesia:sync_log().'`. Harmless where there is nothing to sync.
pub async fn sync_metadata(version: RabbitVersion) {
    ctl(version, &["eval", "catch mnesia:sync_log()."]).await;
}

/// Boots the node of `version` again on its own data
/// (`scripts/rabbitmq.sh restart`: durable queues and persistent messages
/// survive, the TLS files stay); returns the instant its AMQP port first
/// answered.
pub async fn restart(version: RabbitVersion) -> Instant {
    let at = back_up(&node(version).amqp, script(version, &["restart"], RESTART_TIMEOUT)).await;
    *damage().of(version) = NodeDamage::default();
    at
}

/// [`kill`], `down_for` with no broker at all, then [`restart`]; returns the
/// instant the AMQP port first answered again.
pub async fn kill_and_restart(version: RabbitVersion, down_for: Duration) -> Instant {
    kill(version).await;
    {
        let _label = waiting_for(format!("chaos::kill_and_restart: {down_for:?} with {version} down"));
        tokio::time::sleep(down_for).await;
    }
    restart(version).await
}

/// SIGSTOP of every process of `version`'s node except epmd
/// (`scripts/rabbitmq.sh pause`): the broker goes silent, its sockets stay
/// open (the kernel still accepts and buffers). [`resume`] undoes it.
pub async fn pause(version: RabbitVersion) {
    damage().of(version).paused = true;
    script(version, &["pause"], SIGNAL_TIMEOUT).await;
}

/// SIGCONT of the paused node (`scripts/rabbitmq.sh resume`); it answers
/// what was sent meanwhile.
pub async fn resume(version: RabbitVersion) {
    script(version, &["resume"], SIGNAL_TIMEOUT).await;
    damage().of(version).paused = false;
}

/// The cluster's URL (`ACEMQ_RABBITMQ_CLUSTER_URL`, which
/// `scripts/rabbitmq.sh cluster env` prints), when it is set and node 1
/// answers. `scripts/test.sh` starts the cluster and exports it; under
/// `CI=true` a missing cluster is a panic, elsewhere `None` with a loud note.
pub async fn cluster_url() -> Option<String> {
    match std::env::var("ACEMQ_RABBITMQ_CLUSTER_URL") {
        Ok(url) if amqp_answers(&host_port(&url)).await => Some(url),
        Ok(url) => panic!("chaos: ACEMQ_RABBITMQ_CLUSTER_URL={url} is set but node 1 does not answer"),
        Err(_) if crate::in_ci() => {
            panic!("chaos: no cluster under CI=true: scripts/test.sh must start it (scripts/rabbitmq.sh cluster start)")
        }
        Err(_) => {
            eprintln!(
                "\n!!!! SKIPPING a cluster test: ACEMQ_RABBITMQ_CLUSTER_URL is not set \
                 (`scripts/rabbitmq.sh cluster start`, then export the lines of `cluster env`)"
            );
            None
        }
    }
}

/// The AMQP `host:port` of cluster node `n` (1..=3), from `ACEMQ_RABBITMQ_CLUSTER_URL`.
pub fn cluster_node(n: usize) -> String {
    let url = std::env::var("ACEMQ_RABBITMQ_CLUSTER_URL").expect("chaos: ACEMQ_RABBITMQ_CLUSTER_URL is set");
    let parsed: acemq_core::amqp::AmqpUrl = url.parse().unwrap_or_else(|e| panic!("chaos: {url}: {e}"));
    let (host, port) = parsed
        .hosts
        .get(n.wrapping_sub(1))
        .unwrap_or_else(|| panic!("chaos: no cluster node {n} in {url}"));
    format!("{host}:{port}")
}

/// `kill -9` of cluster node `n` (1..=3; `scripts/rabbitmq.sh cluster kill N`),
/// after flushing its metadata log as [`kill`] does.
pub async fn cluster_kill(n: usize) {
    assert!((1..=3).contains(&n), "chaos: cluster nodes are 1..=3, not {n}");
    let arg = n.to_string();
    let v = RabbitVersion::V3_10;
    script(
        v,
        &["cluster", "ctl", &arg, "eval", "catch mnesia:sync_log()."],
        CTL_TIMEOUT,
    )
    .await;
    damage().cluster_killed[n - 1] = true;
    script(v, &["cluster", "kill", &arg], SIGNAL_TIMEOUT).await;
}

/// Boots cluster node `n` again on its data (it rejoins the cluster);
/// returns the instant its AMQP port first answered.
pub async fn cluster_restart(n: usize) -> Instant {
    assert!((1..=3).contains(&n), "chaos: cluster nodes are 1..=3, not {n}");
    let n_str = n.to_string();
    let at = back_up(
        &cluster_node(n),
        script(RabbitVersion::V3_10, &["cluster", "restart", &n_str], RESTART_TIMEOUT),
    )
    .await;
    damage().cluster_killed[n - 1] = false;
    at
}

// ----------------------------------------------------------------- proxy ---

/// A TCP proxy in the test process, in front of one upstream `host:port`:
/// it cuts or blackholes connections without touching the broker. Every
/// accepted connection gets its own upstream connection. Dropping the proxy
/// closes its listener and every connection through it.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    upstream: String,
    /// Bumped by [`Proxy::cut_all`]; dropped with the proxy, which ends
    /// every connection task.
    cut: watch::Sender<u64>,
    blackhole: watch::Sender<bool>,
    live: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and relays to `upstream` (`host:port`).
    pub async fn start(upstream: impl Into<String>) -> Proxy {
        let upstream = upstream.into();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("chaos::Proxy: cannot listen on 127.0.0.1: {e}"));
        let port = listener.local_addr().expect("a bound listener has an address").port();
        let (cut, _) = watch::channel(0u64);
        let (blackhole, _) = watch::channel(false);
        let live = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream.clone(),
            cut.subscribe(),
            blackhole.subscribe(),
            live.clone(),
        ));
        Proxy {
            port,
            upstream,
            cut,
            blackhole,
            live,
            accept,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where it relays to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// `url` with its host list replaced by this proxy's `127.0.0.1:port`
    /// (user, vhost and query kept).
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url
            .split_once("://")
            .unwrap_or_else(|| panic!("chaos::Proxy::url_for: no scheme in {url}"));
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let user = authority
            .rsplit_once('@')
            .map(|(u, _)| format!("{u}@"))
            .unwrap_or_default();
        format!("{scheme}://{user}127.0.0.1:{}{tail}", self.port)
    }

    /// Closes every proxied connection now, both sides (each peer sees the
    /// socket close, as if the network dropped it); new connections are
    /// still accepted. [`Proxy::connections`] reaches 0 once the relays end.
    pub fn cut_all(&self) {
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// While on, every byte of every connection, existing or new, is
    /// silently dropped in both directions and every socket stays open (a
    /// side that closes meanwhile is closed on the other only once the
    /// blackhole ends), as in a network partition. Off: bytes flow again.
    pub fn blackhole(&self, on: bool) {
        self.blackhole.send_replace(on);
    }

    /// How many proxied connections are open.
    pub fn connections(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Waits until exactly `n` proxied connections are open; panics after `within`.
    pub async fn wait_connections(&self, n: usize, within: Duration) {
        let _label = waiting_for(format!("{n} connections through the proxy on port {}", self.port));
        let deadline = Instant::now() + within;
        while self.connections() != n {
            assert!(
                Instant::now() < deadline,
                "chaos::Proxy: {} connections through port {} after {within:?}, not {n}",
                self.connections(),
                self.port
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Dropping `cut` (a field) ends every connection task.
    }
}

/// Counts one open proxied connection while it lives.
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts until aborted. It holds only receivers, so that dropping the
/// proxy's senders is what ends the relays.
async fn accept_loop(
    listener: TcpListener,
    upstream: String,
    cut: watch::Receiver<u64>,
    blackhole: watch::Receiver<bool>,
    live: Arc<AtomicUsize>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        live.fetch_add(1, Ordering::SeqCst);
        let guard = Live(live.clone());
        let mut cut = cut.clone();
        // Only cuts after this connection was accepted end it.
        cut.mark_unchanged();
        tokio::spawn(relay(client, upstream.clone(), cut, blackhole.clone(), guard));
    }
}

/// One proxied connection, until either side closes (then both are), a cut,
/// or the proxy is dropped.
async fn relay(
    client: TcpStream,
    upstream: String,
    mut cut: watch::Receiver<u64>,
    blackhole: watch::Receiver<bool>,
    _live: Live,
) {
    let pipe = async {
        let server = match tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(&upstream)).await {
            Ok(Ok(server)) => server,
            _ => {
                until_open(blackhole.clone()).await;
                return;
            }
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::select! {
            _ = pump(client_read, server_write, blackhole.clone()) => {}
            _ = pump(server_read, client_write, blackhole.clone()) => {}
        }
    };
    tokio::select! {
        _ = pipe => {}
        // A cut, or the proxy dropped (the sender is gone).
        _ = cut.changed() => {}
    }
    // Every half is dropped here: both sockets close.
}

/// Copies `from` to `to`, dropping what it reads while blackholed; returns
/// when `from` ends or `to` fails, but not while blackholed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blackhole: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if *blackhole.borrow() {
                    continue;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        }
    }
    until_open(blackhole).await;
}

/// Returns once the blackhole is off (at once if it is), or the proxy is gone.
async fn until_open(mut blackhole: watch::Receiver<bool>) {
    let _ = blackhole.wait_for(|on| !on).await;
}
