//! `acemq conformance check URL`: a catalogue of RabbitMQ behaviours run
//! against any AMQP 0-9-1 broker, h2spec-style. Each [`Check`] has a stable
//! id, a section, a one-line description and the reply RabbitMQ 3.10 and
//! 4.0 give ([`Expect`]); [`run`] runs the selected checks (each on its own
//! connections, with names of its own that it deletes afterwards, under a
//! deadline, a bounded number at a time) and [`judge`] compares what each
//! saw with what the chosen version answers.
//!
//! It speaks to the broker through its own raw client (`wire.rs`), so a
//! check can send frames no well-behaved client would: malformed,
//! oversized, out of order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{FieldTable, FieldValue, Method, QueueDelete};

mod channel;
mod command;
mod confirms;
mod consumers;
mod dead_letter;
mod frames;
mod handshake;
mod not_implemented;
mod queues;
mod quorum;
mod report;
mod stream;
mod wire;

pub use command::{command, CheckArgs, Output, HELP};
pub use report::{exit_code, json, table};
use wire::{Hello, Wire};

/// The RabbitMQ release whose answers are expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// RabbitMQ 3.10.
    V3_10,
    /// RabbitMQ 4.0.
    V4_0,
}

impl Version {
    /// `3.10` or `4.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V3_10 => "3.10",
            Version::V4_0 => "4.0",
        }
    }

    /// The release line a version string names (`3.10`, `3.10.8`, `4.0.5`),
    /// if it is one of the two.
    pub fn of_release(text: &str) -> Option<Version> {
        let text = text.trim();
        let line = |p: &str| text == p || text.strip_prefix(p).is_some_and(|r| r.starts_with('.'));
        if line("3.10") {
            Some(Version::V3_10)
        } else if line("4.0") {
            Some(Version::V4_0)
        } else {
            None
        }
    }
}

impl std::str::FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Version, String> {
        match s.trim() {
            "3.10" => Ok(Version::V3_10),
            "4.0" => Ok(Version::V4_0),
            other => Err(format!(
                "{other:?} is not a RabbitMQ version this catalogue knows (3.10 or 4.0)"
            )),
        }
    }
}

/// What a check saw: a one-line summary (compared with the expectation)
/// and the broker's reply text when there was one (shown, not compared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obs {
    /// E.g. `channel.close 404 NOT_FOUND`, `basic.return 312 NO_ROUTE, then basic.ack 1`.
    pub summary: String,
    /// The reply text of a close or return, as the broker wrote it.
    pub text: Option<String>,
}

impl Obs {
    /// A summary without text.
    pub fn new(summary: impl Into<String>) -> Obs {
        Obs {
            summary: summary.into(),
            text: None,
        }
    }

    /// A summary with the broker's text.
    pub fn with_text(summary: impl Into<String>, text: &str) -> Obs {
        Obs {
            summary: summary.into(),
            text: Some(text.to_string()),
        }
    }
}

/// How a check ended before judgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// What the broker did.
    Saw(Obs),
    /// The check does not apply to this broker (e.g. it has no quorum
    /// queues), and why.
    NotApplicable(String),
}

impl Got {
    /// [`Got::Saw`] of a summary.
    pub fn saw(summary: impl Into<String>) -> Got {
        Got::Saw(Obs::new(summary))
    }
}

/// A step of a check: what it goes on with, or how the check ended early
/// (a close from the broker where a reply was wanted is what it saw).
pub type Step<T> = Result<T, Got>;

/// The reply each version gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The same on both.
    Both(&'static str),
    /// Each its own; `None`: the check is only for the other version.
    Each {
        /// RabbitMQ 3.10's answer.
        v3_10: Option<&'static str>,
        /// RabbitMQ 4.0's answer.
        v4_0: Option<&'static str>,
    },
}

impl Expect {
    /// What `version` answers, or `None` if the check is not for it.
    pub fn of(self, version: Version) -> Option<&'static str> {
        match (self, version) {
            (Expect::Both(e), _) => Some(e),
            (Expect::Each { v3_10, .. }, Version::V3_10) => v3_10,
            (Expect::Each { v4_0, .. }, Version::V4_0) => v4_0,
        }
    }
}

/// What a check's body is: a boxed future of its observation.
pub(crate) type CheckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Step<Obs>> + Send>>;

/// One named check of the catalogue.
#[derive(Clone, Copy)]
pub struct Check {
    /// Stable id, e.g. `handshake.tune.frame-max-floor`.
    pub id: &'static str,
    /// The section it is listed under (the id's first word).
    pub section: &'static str,
    /// One line: what RabbitMQ does.
    pub description: &'static str,
    /// The reply expected of each version.
    pub expect: Expect,
    run: fn(Ctx) -> CheckFuture,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Declares a check: `check!(id, description, expect, async fn)`.
macro_rules! check {
    ($id:literal, $desc:literal, $expect:expr, $run:path) => {
        $crate::conformance::check::Check::new($id, $desc, $expect, |cx| {
            let run: $crate::conformance::check::CheckFuture = Box::pin($run(cx));
            run
        })
    };
}
pub(crate) use check;

impl Check {
    /// A check; its section is the id's first word.
    pub(crate) fn new(
        id: &'static str,
        description: &'static str,
        expect: Expect,
        run: fn(Ctx) -> CheckFuture,
    ) -> Check {
        let section = id.split('.').next().unwrap_or(id);
        Check {
            id,
            section,
            description,
            expect,
            run,
        }
    }
}

/// The whole catalogue, in the order it is printed.
pub fn catalogue() -> Vec<Check> {
    let mut all = Vec::new();
    all.extend(handshake::checks());
    all.extend(frames::checks());
    all.extend(channel::checks());
    all.extend(not_implemented::checks());
    all.extend(confirms::checks());
    all.extend(dead_letter::checks());
    all.extend(quorum::checks());
    all.extend(stream::checks());
    all.extend(consumers::checks());
    all.extend(queues::checks());
    all
}

/// Where the broker is and who logs in.
#[derive(Clone)]
pub struct Target {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User name.
    pub username: String,
    /// Password (never printed).
    pub password: String,
    /// Virtual host.
    pub vhost: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for Target {
    /// `amqp://user@host:port/vhost`, without the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let vhost = if self.vhost == "/" { "%2f" } else { &self.vhost };
        write!(f, "amqp://{}@{}:{}/{}", self.username, self.host, self.port, vhost)
    }
}

/// A check's view of the run: the target, the version, and the names it
/// creates (deleted after it).
#[derive(Clone)]
pub(crate) struct Ctx(Arc<CtxInner>);

struct CtxInner {
    target: Target,
    id: &'static str,
    run_id: String,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl Ctx {
    fn new(target: Target, id: &'static str, run_id: String) -> Ctx {
        Ctx(Arc::new(CtxInner {
            target,
            id,
            run_id,
            queues: Mutex::new(Vec::new()),
            exchanges: Mutex::new(Vec::new()),
        }))
    }

    pub fn target(&self) -> &Target {
        &self.0.target
    }

    /// A name of this check's own (not recorded for deletion).
    pub fn name(&self, what: &str) -> String {
        format!("acemq-conformance.{}.{}.{what}", self.0.run_id, self.0.id)
    }

    /// A queue name of this check's own, deleted after the check.
    pub fn queue(&self, what: &str) -> String {
        let name = self.name(what);
        self.0.queues.lock().expect("the names").push(name.clone());
        name
    }

    /// An exchange name of this check's own, deleted after the check.
    pub fn exchange(&self, what: &str) -> String {
        let name = self.name(what);
        self.0.exchanges.lock().expect("the names").push(name.clone());
        name
    }

    /// A connection with the default handshake.
    pub async fn open(&self) -> Step<Wire> {
        Wire::open(self.target(), &Hello::default()).await
    }

    /// A connection with channel 1 open.
    pub async fn channel(&self) -> Step<Wire> {
        let mut w = self.open().await?;
        w.open_channel(1).await?;
        Ok(w)
    }

    /// Deletes what the check created, on a connection of its own.
    async fn clean_up(&self) {
        let queues = std::mem::take(&mut *self.0.queues.lock().expect("the names"));
        let exchanges = std::mem::take(&mut *self.0.exchanges.lock().expect("the names"));
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let Ok(mut w) = self.open().await else { return };
        let mut ch = 1;
        let mut channel_ok = w.open_channel(ch).await.is_ok();
        for (is_queue, name) in queues
            .into_iter()
            .map(|q| (true, q))
            .chain(exchanges.into_iter().map(|e| (false, e)))
        {
            if !channel_ok {
                ch += 1;
                channel_ok = w.open_channel(ch).await.is_ok();
                if !channel_ok {
                    break;
                }
            }
            let method: Method = if is_queue {
                QueueDelete {
                    queue: name.as_str().into(),
                    ..Default::default()
                }
                .into()
            } else {
                acemq_codec::ExchangeDelete {
                    exchange: name.as_str().into(),
                    ..Default::default()
                }
                .into()
            };
            channel_ok = w.call(ch, method).await.is_ok();
        }
        w.close().await;
    }
}

/// A table of arguments.
pub(crate) fn args<const N: usize>(entries: [(&str, FieldValue); N]) -> FieldTable {
    let mut t = FieldTable::new();
    for (k, v) in entries {
        t.push(k, v);
    }
    t
}

/// A reply as a summary: the method's name, or the close that came instead.
pub(crate) fn answer(reply: Step<Method>) -> Step<Obs> {
    match reply {
        Ok(m) => Ok(Obs::new(m.name())),
        Err(Got::Saw(obs)) => Ok(obs),
        Err(other) => Err(other),
    }
}

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// Whose answers are expected.
    pub version: Version,
    /// Only the checks whose id contains this.
    pub only: Option<String>,
    /// How many checks run at once.
    pub concurrency: usize,
    /// How long one check may take.
    pub deadline: Duration,
}

impl Options {
    /// 8 at a time, 10 s each.
    pub fn new(version: Version) -> Options {
        Options {
            version,
            only: None,
            concurrency: 8,
            deadline: Duration::from_secs(10),
        }
    }
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The broker answered as the version does.
    Pass,
    /// It answered otherwise.
    Fail,
    /// The check does not apply.
    NotApplicable,
}

impl Verdict {
    /// `pass`, `fail`, `n/a`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::NotApplicable => "n/a",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The check.
    pub check: Check,
    /// Its verdict.
    pub verdict: Verdict,
    /// What was expected (`None` when not applicable to the version).
    pub expected: Option<String>,
    /// What the broker did (or why the check does not apply).
    pub got: String,
    /// The broker's reply text, if any.
    pub text: Option<String>,
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// The broker.
    pub target: Target,
    /// Whose answers were expected.
    pub version: Version,
    /// What the broker says it is (`product version` of `connection.start`).
    pub broker: String,
    /// Every check run, in catalogue order.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// Checks passed, failed, not applicable.
    pub fn totals(&self) -> (usize, usize, usize) {
        let count = |v| self.outcomes.iter().filter(|o| o.verdict == v).count();
        (
            count(Verdict::Pass),
            count(Verdict::Fail),
            count(Verdict::NotApplicable),
        )
    }
}

/// The verdict on what `check` saw, for `version`.
pub fn judge(check: &Check, version: Version, got: Got) -> Outcome {
    let expected = check.expect.of(version);
    let (verdict, got, text) = match (expected, got) {
        (None, _) => (
            Verdict::NotApplicable,
            format!("only for RabbitMQ {}", other(version).as_str()),
            None,
        ),
        (Some(_), Got::NotApplicable(why)) => (Verdict::NotApplicable, why, None),
        (Some(e), Got::Saw(obs)) => {
            let verdict = if obs.summary == e { Verdict::Pass } else { Verdict::Fail };
            (verdict, obs.summary, obs.text)
        }
    };
    Outcome {
        check: *check,
        verdict,
        expected: expected.map(str::to_string),
        got,
        text,
    }
}

fn other(version: Version) -> Version {
    match version {
        Version::V3_10 => Version::V4_0,
        Version::V4_0 => Version::V3_10,
    }
}

/// Why the broker could not be checked at all.
#[derive(Debug, Clone)]
pub struct Unreachable(
    /// What happened.
    pub String,
);

/// Opens one connection to see that the broker is there and lets us in;
/// returns its `product` and `version` server properties.
pub async fn probe(target: &Target, deadline: Duration) -> Result<(String, String), Unreachable> {
    let opened = tokio::time::timeout(deadline, Wire::open(target, &Hello::default())).await;
    let w = match opened {
        Err(_) => {
            return Err(Unreachable(format!(
                "{target}: no handshake within {}s",
                deadline.as_secs()
            )))
        }
        Ok(Err(Got::Saw(obs))) => {
            let text = obs.text.map(|t| format!(" ({t})")).unwrap_or_default();
            return Err(Unreachable(format!("{target}: {}{text}", obs.summary)));
        }
        Ok(Err(Got::NotApplicable(why))) => return Err(Unreachable(why)),
        Ok(Ok(w)) => w,
    };
    let props = w
        .start
        .as_ref()
        .map(|s| s.server_properties.clone())
        .unwrap_or_default();
    let text = |k: &str| props.get(k).and_then(FieldValue::as_str).unwrap_or("").to_string();
    w.close().await;
    Ok((text("product"), text("version")))
}

/// The checks `options` selects.
pub fn selected(options: &Options) -> Vec<Check> {
    catalogue()
        .into_iter()
        .filter(|c| options.only.as_deref().is_none_or(|s| c.id.contains(s)))
        .collect()
}

/// Runs the selected checks against `target`, `options.concurrency` at a
/// time; each ends within `options.deadline` (plus its clean-up's).
pub async fn run(target: &Target, broker: String, options: &Options) -> Report {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let run_id = format!(
        "{}-{:x}-{}",
        std::process::id(),
        nanos & 0xffff_ffff,
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let checks = selected(options);
    let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, check) in checks.iter().copied().enumerate() {
        let permits = permits.clone();
        let cx = Ctx::new(target.clone(), check.id, run_id.clone());
        let (version, deadline) = (options.version, options.deadline);
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let got = if check.expect.of(version).is_none() {
                Got::NotApplicable(String::new())
            } else {
                match tokio::time::timeout(deadline, (check.run)(cx.clone())).await {
                    Ok(Ok(obs)) => Got::Saw(obs),
                    Ok(Err(got)) => got,
                    Err(_) => Got::saw(format!("no reply within {} s", deadline.as_secs())),
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(10), cx.clean_up()).await;
            (index, judge(&check, version, got))
        });
    }
    let mut outcomes: Vec<Option<Outcome>> = vec![None; checks.len()];
    while let Some(done) = tasks.join_next().await {
        if let Ok((index, outcome)) = done {
            outcomes[index] = Some(outcome);
        }
    }
    let outcomes = outcomes
        .into_iter()
        .zip(&checks)
        .map(|(o, c)| o.unwrap_or_else(|| judge(c, options.version, Got::saw("the check crashed"))))
        .collect();
    Report {
        target: target.clone(),
        version: options.version,
        broker,
        outcomes,
    }
}

#[cfg(test)]
mod tests;
