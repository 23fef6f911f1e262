//! The differential harness behind `acemq conformance diff`: random
//! sequences of operations ([`ops`]) run on two brokers by a runner that
//! records every answer ([`run`]), with what may legitimately differ
//! normalised in one place ([`normalise`]), and [`compare`], which says
//! where two transcripts part. The command itself (generation, shrinking,
//! the report) is [`command`].
//!
//! Any two brokers given by URL: `amqp://`, `amqps://` (the engine's
//! [`TlsConfig`]), and `memory://name` when acemq-core is built with its
//! `memory` feature (the tests do). Each sequence runs on fresh queues and
//! exchanges whose names are unique to it and to the broker, and deletes
//! them at the end. Must never wait without a deadline.

pub mod command;
pub mod normalise;
pub mod ops;
mod raw;
pub mod run;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_core::amqp::{AmqpUrl, Config, Connection, Error, TlsConfig, UrlError};
use tokio::io::{AsyncRead, AsyncWrite};

pub use command::{DiffArgs, Found};
pub use ops::Op;

/// A byte stream to a broker, for the frames the harness writes by hand.
pub type RawStream = Box<dyn RawIo>;

/// What a [`RawStream`] is: any async byte stream.
pub trait RawIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawIo for T {}

/// A [`RawStream`] being opened.
pub type RawFuture = Pin<Box<dyn Future<Output = std::io::Result<RawStream>> + Send>>;

/// Opens a new [`RawStream`] to a broker.
pub type DialRaw = Arc<dyn Fn() -> RawFuture + Send + Sync>;

/// How long opening the engine's connection may take.
const CONNECT: Duration = Duration::from_secs(10);

/// A broker the harness runs sequences on: its URL, the engine's settings
/// (TLS), and how to reach it byte by byte, if it can be.
#[derive(Clone)]
pub struct Broker {
    url: AmqpUrl,
    config: Config,
    raw: Option<DialRaw>,
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Broker")
            .field("url", &self.url)
            .field("raw_frames", &self.raw.is_some())
            .finish()
    }
}

impl Broker {
    /// The broker at `url`. An `amqp://` broker is also written raw frames
    /// over TCP (to its first host); an `amqps://` or `memory://` one is
    /// not unless [`Broker::with_raw_dialer`] says how.
    pub fn new(url: &str) -> Result<Broker, UrlError> {
        let url: AmqpUrl = url.parse()?;
        let raw = match (url.hosts.first(), url.tls || url.memory) {
            (Some((host, port)), false) => {
                let (host, port) = (host.clone(), *port);
                let dial: DialRaw = Arc::new(move || -> RawFuture {
                    let host = host.clone();
                    Box::pin(async move {
                        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                        let _ = tcp.set_nodelay(true);
                        Ok(Box::new(tcp) as RawStream)
                    })
                });
                Some(dial)
            }
            _ => None,
        };
        Ok(Broker {
            url,
            config: Config::default().with_connection_timeout(CONNECT),
            raw,
        })
    }

    /// The TLS settings of an `amqps://` broker (e.g. the CA that signed
    /// its certificate).
    pub fn with_tls(mut self, tls: TlsConfig) -> Broker {
        self.config = self.config.with_tls(tls);
        self
    }

    /// How to open a byte stream to the broker for hand-written frames
    /// (e.g. a duplex to an in-process acemq-memory).
    pub fn with_raw_dialer(mut self, dial: DialRaw) -> Broker {
        self.raw = Some(dial);
        self
    }

    /// Its URL (shown with the password hidden).
    pub fn url(&self) -> &AmqpUrl {
        &self.url
    }

    /// Whether the harness can write frames to it by hand: only then do
    /// sequences hold [`Op::BodyFrame`].
    pub fn raw_frames(&self) -> bool {
        self.raw.is_some()
    }

    pub(crate) fn dial_raw(&self) -> Option<DialRaw> {
        self.raw.clone()
    }

    /// A connection through the engine, as the runner opens them.
    pub async fn open(&self) -> Result<Connection, Error> {
        Connection::open_url(&self.url, self.config.clone()).await
    }
}

/// One line of a transcript: what happened at one step of a sequence (the
/// step after the last operation is the cleanup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The operation's index in the sequence.
    pub step: usize,
    /// What was sent and what came back, normalised.
    pub text: String,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.step, self.text)
    }
}

/// Everything one broker said during one sequence, in order.
pub type Transcript = Vec<Line>;

/// The names of one sequence on each broker: unique to this process, the
/// sequence and the broker, of the same length on both (so texts that
/// quote them compare alike once the prefix is normalised).
fn prefixes() -> (String, String) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let base = format!("acemq-diff.{}.{n}", std::process::id());
    (format!("{base}.a"), format!("{base}.b"))
}

/// Runs `ops` on `a`, then on `b`, and returns both transcripts.
pub async fn transcripts(ops: &[Op], a: &Broker, b: &Broker) -> (Transcript, Transcript) {
    let (prefix_a, prefix_b) = prefixes();
    let on_a = run::run(a, &prefix_a, ops).await;
    let on_b = run::run(b, &prefix_b, ops).await;
    (on_a, on_b)
}

/// Where two transcripts of one sequence part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The sequence.
    pub ops: Vec<Op>,
    /// What the first broker said.
    pub a: Transcript,
    /// What the second broker said.
    pub b: Transcript,
    /// The index of the first line that differs (or that one side lacks).
    pub line: usize,
}

impl Difference {
    /// The transcripts' first difference, if they differ.
    pub fn of(ops: &[Op], a: Transcript, b: Transcript) -> Option<Difference> {
        if a == b {
            return None;
        }
        let line = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        Some(Difference {
            ops: ops.to_vec(),
            a,
            b,
            line,
        })
    }

    /// The step of the first line that differs.
    pub fn step(&self) -> usize {
        let at = |t: &Transcript| t.get(self.line).map(|l| l.step);
        match (at(&self.a), at(&self.b)) {
            (Some(x), Some(y)) => x.min(y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => self.ops.len(),
        }
    }
}

impl fmt::Display for Difference {
    /// The lines before the difference (30 at most), then 15 of each side
    /// from it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "the transcripts differ at step {}\n--- common", self.step())?;
        for line in &self.a[self.line.saturating_sub(30)..self.line] {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "--- A")?;
        for line in self.a.iter().skip(self.line).take(15) {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "--- B")?;
        for line in self.b.iter().skip(self.line).take(15) {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Runs `ops` on both brokers: the number of lines they agree on, or
/// where they part.
pub async fn compare(ops: &[Op], a: &Broker, b: &Broker) -> Result<usize, Box<Difference>> {
    let (on_a, on_b) = transcripts(ops, a, b).await;
    let len = on_a.len();
    match Difference::of(ops, on_a, on_b) {
        None => Ok(len),
        Some(d) => Err(Box::new(d)),
    }
}
