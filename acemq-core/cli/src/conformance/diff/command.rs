//! `acemq conformance diff URL_A URL_B`: generates the sequences (proptest,
//! from a seed), runs each on both brokers, shrinks the first difference
//! for a bounded time, and reports it as a transcript (text or JSON). Must
//! never print a broker's text unescaped, nor the URLs' passwords.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use acemq_codec::FieldValue;
use acemq_core::amqp::TlsConfig;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

use super::{compare, ops, Broker, Difference, Line, Op};
use crate::render;

/// Exit code: no difference in the sequences run.
pub const SAME: u8 = 0;
/// Exit code: a difference found, or the run could not finish (`--timeout`).
pub const DIFFERENT: u8 = 1;
/// Exit code: the command line cannot be run (a bad URL or file).
pub const USAGE: u8 = 2;
/// Exit code: a broker could not be reached, or refused the connection.
pub const UNREACHABLE: u8 = 3;

/// How long one sequence may take on both brokers together; every reply
/// it waits for is bounded far below this already.
const PER_SEQUENCE: Duration = Duration::from_secs(300);
/// How long the first connection to each broker may take.
const CONNECT: Duration = Duration::from_secs(10);

/// The `--help` of `acemq conformance diff`, after the options.
pub const HELP: &str = "\
Runs random sequences of AMQP 0-9-1 operations on two brokers, one after the other, and compares
what they answered. A sequence uses two connections of two channels each, a classic queue, a quorum
queue, a stream and an exchange of each type: declarations (with TTLs, lengths, overflow,
dead-lettering, expiry, delivery limits, and inequivalent redeclarations), deletions, purges,
bindings of queues and exchanges, publishes (mandatory, with properties and headers), gets,
consumers (exclusive, no-ack, prefetch, stream offsets), acks, nacks, rejects, recover, qos,
confirms, transactions, channel.flow, channel.close, and, where both URLs are amqp://, a body frame
written by hand at the edges of frame_max. After each operation every channel makes a round trip
and the queues are awaited until quiet, so a transcript does not depend on timing.

Names are unique to each sequence and broker (written P in a transcript: P.qc, P.qq, P.qs, P.direct)
and deleted at the end; the URL's user needs configure, write and read permission on its vhost.
Reply texts that name the vhost differ unless both URLs name the same one.

What counts as the same: every reply (method, reply code and text), delivery, confirm, return,
cancel, close and queue count, in order on each channel. Only names and ids are normalised: the
name prefix (P), consumer tags the broker generated (amq.ctag-#N, numbered as they first appear),
the order of keys in header tables, the time of an x-death entry, and a stream's message count in
declare-ok (a sampled metric on RabbitMQ). Versions are not: two RabbitMQ versions differ wherever
their behaviour or their texts do.

The first sequence that differs is shrunk (fewer and simpler operations that still differ) for at
most --shrink-for and printed as a transcript: each step's operation, then `=` and what both said,
or `A` and `B` and what each said where they differ; `>>` marks the first step that differs. The
seed and the command that runs the same sequences again come last. Control characters in the
brokers' texts are shown escaped.

Exit codes:
  0  no difference in the sequences run
  1  a difference, or --timeout passed first
  2  the command line is wrong (a bad URL, an unreadable --ca-file)
  3  a broker could not be reached or refused the connection (also in the middle of the run)

Example:
  acemq conformance diff amqp://guest:guest@localhost:5672/ amqp://guest:guest@localhost:5674/ \\
      --cases 200 --seed 7";

/// `acemq conformance diff URL_A URL_B --cases N [--seed S]`: compares two
/// brokers on random operation sequences.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = HELP)]
pub struct DiffArgs {
    /// The first broker: amqp:// or amqps://user:password@host:port/vhost (passwords
    /// are never printed).
    #[arg(value_name = "URL_A")]
    pub a: String,
    /// The second broker, compared with the first.
    #[arg(value_name = "URL_B")]
    pub b: String,
    /// How many random sequences to run.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub cases: u32,
    /// The seed of the sequences (a number); the same seed, cases and
    /// --max-len run the same sequences again. Random when not given, and
    /// printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The most operations a sequence has after its set-up.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub max_len: u16,
    /// How long shrinking a difference may take (e.g. 30s, 2m).
    #[arg(long, default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub shrink_for: Duration,
    /// The report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("{text:?} is not a duration like 30s or 2m: {e}"))
}

/// What a search found.
#[derive(Debug, Clone)]
pub enum Found {
    /// Every sequence answered the same on both brokers.
    Same {
        /// How many ran.
        cases: u32,
    },
    /// The deadline came first; `cases` sequences ran with no difference.
    GaveUp {
        /// How many ran.
        cases: u32,
    },
    /// A sequence differed.
    Different {
        /// Which sequence (from 1): `--cases case` with the same seed runs
        /// it again, last.
        case: u32,
        /// How many operations it had before shrinking.
        shrunk_from: usize,
        /// How many shrunk candidates were run.
        shrink_runs: u32,
        /// The smallest difference found.
        difference: Box<Difference>,
    },
}

/// What to search: how many sequences, from which seed, how long.
#[derive(Debug, Clone)]
pub struct Search {
    /// How many sequences.
    pub cases: u32,
    /// Their seed.
    pub seed: u64,
    /// The most operations of a sequence after its set-up.
    pub max_len: usize,
    /// How long shrinking may take.
    pub shrink_for: Duration,
    /// When to stop, if ever.
    pub deadline: Option<Instant>,
}

fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// One sequence on both brokers, bounded by [`PER_SEQUENCE`].
fn one(rt: &tokio::runtime::Runtime, ops: &[Op], a: &Broker, b: &Broker) -> Result<Option<Difference>, String> {
    match rt.block_on(async { tokio::time::timeout(PER_SEQUENCE, compare(ops, a, b)).await }) {
        Ok(Ok(_)) => Ok(None),
        Ok(Err(d)) => Ok(Some(*d)),
        Err(_) => Err(format!(
            "a sequence of {} operations did not finish within {}",
            ops.len(),
            render::duration(PER_SEQUENCE)
        )),
    }
}

/// Runs `search.cases` sequences on `a` and `b` on `rt` (a current-thread
/// runtime: the engine's driver then runs only when the runner awaits, so
/// what the runner queues together is written together), and shrinks the
/// first that differs. `progress` hears of each sequence run.
pub fn search(
    rt: &tokio::runtime::Runtime,
    a: &Broker,
    b: &Broker,
    search: &Search,
    mut progress: impl FnMut(u32),
) -> Result<Found, String> {
    let strategy = ops::sequence(search.max_len, a.raw_frames() && b.raw_frames());
    let config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng(search.seed));
    let past = |deadline: Option<Instant>| deadline.is_some_and(|d| Instant::now() >= d);
    for case in 1..=search.cases {
        if past(search.deadline) {
            return Ok(Found::GaveUp { cases: case - 1 });
        }
        let mut tree = strategy.new_tree(&mut runner).map_err(|e| e.to_string())?;
        let ops = tree.current();
        let found = one(rt, &ops, a, b)?;
        progress(case);
        let Some(mut best) = found else { continue };
        // proptest's shrinking: simplify while it still differs, otherwise
        // step back (complicate) and try another simplification.
        let started = Instant::now();
        let mut runs = 0;
        if tree.simplify() {
            while started.elapsed() < search.shrink_for && !past(search.deadline) {
                runs += 1;
                match one(rt, &tree.current(), a, b)? {
                    Some(d) => {
                        best = d;
                        if !tree.simplify() {
                            break;
                        }
                    }
                    None => {
                        if !tree.complicate() {
                            break;
                        }
                    }
                }
            }
        }
        return Ok(Found::Different {
            case,
            shrunk_from: ops.len(),
            shrink_runs: runs,
            difference: Box::new(best),
        });
    }
    Ok(Found::Same { cases: search.cases })
}

/// The product and version a broker names in `connection.start`, after a
/// first connection that shows it can be reached.
async fn server(broker: &Broker) -> Result<String, String> {
    let conn = match tokio::time::timeout(CONNECT, broker.open()).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no connection within {}", render::duration(CONNECT))),
    };
    let text = |key: &str| match conn.server_properties().get(key) {
        Some(FieldValue::LongString(s)) => Some(s.to_string_lossy().into_owned()),
        _ => None,
    };
    let said = match (text("product"), text("version")) {
        (Some(p), Some(v)) => format!("{p} {v}"),
        (Some(p), None) => p,
        (None, Some(v)) => format!("version {v}"),
        (None, None) => "a broker that does not say what it is".into(),
    };
    let _ = tokio::time::timeout(CONNECT, conn.close()).await;
    Ok(said)
}

/// An operation on one line.
fn describe(op: &Op) -> String {
    format!("{op:?}")
}

fn lines_at(t: &[Line], step: usize) -> Vec<&str> {
    t.iter().filter(|l| l.step == step).map(|l| l.text.as_str()).collect()
}

/// The difference as a readable transcript.
fn transcript_text(d: &Difference, out: &mut String) {
    let first = d.step();
    for step in 0..=d.ops.len() {
        let head = match d.ops.get(step) {
            Some(op) => format!("step {step}: {}", describe(op)),
            None => "end: close the connections, delete the queues and exchanges".into(),
        };
        let mark = if step == first { ">> " } else { "   " };
        let tail = if step == first {
            "   <- the first difference"
        } else {
            ""
        };
        out.push_str(&format!("{mark}{}{tail}\n", render::safe(&head)));
        let (a, b) = (lines_at(&d.a, step), lines_at(&d.b, step));
        if a == b {
            for line in a {
                out.push_str(&format!("     = {}\n", render::safe(line)));
            }
        } else {
            for line in a {
                out.push_str(&format!("     A {}\n", render::safe(line)));
            }
            for line in b {
                out.push_str(&format!("     B {}\n", render::safe(line)));
            }
        }
    }
}

fn transcript_json(d: &Difference) -> Value {
    let steps: Vec<Value> = (0..=d.ops.len())
        .map(|step| {
            let (a, b) = (lines_at(&d.a, step), lines_at(&d.b, step));
            json!({
                "step": step,
                "operation": d.ops.get(step).map(describe),
                "same": a == b,
                "a": a,
                "b": b,
            })
        })
        .collect();
    json!({
        "first_step": d.step(),
        "operations": d.ops.iter().map(describe).collect::<Vec<_>>(),
        "steps": steps,
    })
}

/// Runs the command: the report on `out`, errors on `err`; returns the
/// exit code. `ca_file` is the CLI's `--ca-file` (for `amqps://` URLs),
/// `timeout` its `--timeout`. Starts a runtime of its own: call it outside
/// one.
pub fn main(
    args: &DiffArgs,
    ca_file: Option<&Path>,
    timeout: Duration,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let tls = match ca_file {
        None => None,
        Some(path) => match std::fs::read(path) {
            Err(e) => return fail(err, USAGE, format!("cannot read {}: {e}", path.display())),
            Ok(pem) => match TlsConfig::new().with_root_pem(&pem) {
                Err(e) => return fail(err, USAGE, format!("{}: {e}", path.display())),
                Ok(tls) => Some(tls),
            },
        },
    };
    let mut brokers = Vec::new();
    for (name, url) in [("URL_A", &args.a), ("URL_B", &args.b)] {
        // The URL parser's errors never quote the URL.
        let mut broker = match Broker::new(url) {
            Ok(b) => b,
            Err(e) => return fail(err, USAGE, format!("{name}: {e}")),
        };
        if let (Some(tls), true) = (&tls, broker.url().tls) {
            broker = broker.with_tls(tls.clone());
        }
        brokers.push(broker);
    }
    let (a, b) = (&brokers[0], &brokers[1]);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(err, DIFFERENT, format!("cannot start the runtime: {e}")),
    };
    let mut servers = Vec::new();
    for (name, broker) in [("A", a), ("B", b)] {
        match rt.block_on(server(broker)) {
            Ok(said) => servers.push(said),
            Err(e) => {
                return fail(
                    err,
                    UNREACHABLE,
                    format!("cannot connect to {name} ({}): {e}", broker.url()),
                )
            }
        }
    }
    let seed = args.seed.unwrap_or_else(random_seed);
    let search_for = Search {
        cases: args.cases,
        seed,
        max_len: usize::from(args.max_len),
        shrink_for: args.shrink_for,
        deadline: Instant::now().checked_add(timeout),
    };
    let started = Instant::now();
    let found = search(&rt, a, b, &search_for, |n| {
        if n % 100 == 0 {
            let _ = writeln!(
                err,
                "acemq: {n} of {} sequences in {:.0?}",
                args.cases,
                started.elapsed()
            );
        }
    });
    let found = match found {
        Ok(found) => found,
        Err(e) => return fail(err, DIFFERENT, e),
    };
    let rerun = |cases: u32| {
        format!(
            "acemq conformance diff {} {} --cases {cases} --seed {seed} --max-len {}",
            a.url(),
            b.url(),
            args.max_len
        )
    };
    let elapsed = started.elapsed();
    let code = match &found {
        Found::Same { .. } => SAME,
        // A broker that went away during the run is no difference of behaviour.
        Found::Different { difference, .. } if unreachable(difference) => UNREACHABLE,
        Found::GaveUp { .. } | Found::Different { .. } => DIFFERENT,
    };
    if args.json {
        let mut value = json!({
            "a": { "url": a.url().to_string(), "server": servers[0] },
            "b": { "url": b.url().to_string(), "server": servers[1] },
            "seed": seed,
            "cases": args.cases,
            "max_len": args.max_len,
            "seconds": elapsed.as_secs_f64(),
        });
        match &found {
            Found::Same { cases } => {
                value["result"] = json!("same");
                value["ran"] = json!(cases);
            }
            Found::GaveUp { cases } => {
                value["result"] = json!("gave up");
                value["ran"] = json!(cases);
            }
            Found::Different {
                case,
                shrunk_from,
                shrink_runs,
                difference,
            } => {
                value["result"] = json!(if code == UNREACHABLE {
                    "unreachable"
                } else {
                    "different"
                });
                value["ran"] = json!(case);
                value["shrunk_from"] = json!(shrunk_from);
                value["shrink_runs"] = json!(shrink_runs);
                value["difference"] = transcript_json(difference);
                value["reproduce"] = json!(rerun(*case));
            }
        }
        let _ = writeln!(out, "{}", render::json(&value));
        return code;
    }
    let mut text = format!(
        "A: {} ({})\nB: {} ({})\n",
        a.url(),
        render::safe(&servers[0]),
        b.url(),
        render::safe(&servers[1])
    );
    match &found {
        Found::Same { cases } => text.push_str(&format!(
            "no difference in {cases} sequences (seed {seed}, at most {} operations) in {}\n",
            args.max_len,
            render::duration(Duration::from_secs(elapsed.as_secs()))
        )),
        Found::GaveUp { cases } => text.push_str(&format!(
            "gave up after {} (--timeout): no difference in the {cases} of {} sequences run (seed {seed})\n",
            render::duration(timeout),
            args.cases
        )),
        Found::Different {
            case,
            shrunk_from,
            shrink_runs,
            difference,
        } => {
            text.push_str(&format!(
                "sequence {case} of {} differs at step {}; shrunk from {shrunk_from} to {} operations ({shrink_runs} runs):\n\n",
                args.cases,
                difference.step(),
                difference.ops.len()
            ));
            transcript_text(difference, &mut text);
            if code == UNREACHABLE {
                text.push_str("\na broker could not be reached during the run (exit code 3)\n");
            }
            text.push_str(&format!("\nseed {seed}; the same sequences again: {}\n", rerun(*case)));
        }
    }
    let _ = out.write_all(text.as_bytes());
    code
}

/// Whether a side of `d` could not reach its broker at some step (the
/// runner records it so and goes on).
fn unreachable(d: &Difference) -> bool {
    d.a.iter().chain(&d.b).any(|l| {
        (l.text.starts_with("connection ") && l.text.contains(" could not open: "))
            || l.text.ends_with("no probe connection")
    })
}

/// Prints `message` (escaped) on `err` and returns `code`.
fn fail(err: &mut dyn Write, code: u8, message: String) -> u8 {
    let _ = writeln!(err, "acemq: {}", render::safe(&message));
    code
}

/// A seed when none is given: the clock's nanoseconds and the process id.
fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ (u64::from(std::process::id()) << 32)) % 1_000_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: usize, text: &str) -> Line {
        Line {
            step,
            text: text.into(),
        }
    }

    #[test]
    fn the_transcript_marks_the_first_different_step_and_escapes_broker_text() {
        let ops = vec![Op::Recover { ch: ops::Ch(0) }, Op::Recover { ch: ops::Ch(1) }];
        let a = vec![line(0, "ch0 basic.recover -> ()"), line(1, "ch1 basic.recover -> ()")];
        let b = vec![
            line(0, "ch0 basic.recover -> ()"),
            line(
                1,
                "ch1 basic.recover -> channel closed 540 \"\u{1b}]52;c;aGk=\u{7}\u{202e}\"",
            ),
        ];
        let d = Difference::of(&ops, a.clone(), b).expect("a difference");
        assert_eq!(d.step(), 1);
        assert!(Difference::of(&ops, a.clone(), a).is_none());
        let mut text = String::new();
        transcript_text(&d, &mut text);
        assert!(
            text.contains(">> step 1: Recover { ch: Ch(1) }   <- the first difference"),
            "{text}"
        );
        assert!(text.contains("     = ch0 basic.recover -> ()"), "{text}");
        assert!(text.contains("     A ch1 basic.recover -> ()"), "{text}");
        assert!(text.contains("\\x1b]52;c;aGk=\\x07\\u{202e}"), "{text}");
        assert!(text.chars().all(|c| c == '\n' || !c.is_control()), "{text}");
        assert!(!text.contains('\u{202e}'));
        assert!(!unreachable(&d));
        let mut lost = d.clone();
        lost.b
            .push(line(2, "connection 1 could not open: Ok(Err(Io(ConnectionRefused)))"));
        assert!(unreachable(&lost));
    }

    #[test]
    fn zero_cases_a_bad_duration_or_one_url_is_a_usage_error() {
        use clap::Parser;
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            diff: DiffArgs,
        }
        for bad in [
            &["x", "a", "b", "--cases", "0"][..],
            &["x", "a", "b", "--shrink-for", "soon"],
            &["x", "a", "b", "--max-len", "0"],
            &["x", "a"],
        ] {
            let err = Cli::try_parse_from(bad).unwrap_err();
            assert_eq!(err.exit_code(), i32::from(USAGE), "{bad:?}");
        }
        let ok = Cli::try_parse_from([
            "x",
            "a",
            "b",
            "--cases",
            "3",
            "--seed",
            "9",
            "--shrink-for",
            "10s",
            "--json",
        ])
        .unwrap()
        .diff;
        assert_eq!(
            (ok.cases, ok.seed, ok.shrink_for, ok.json, ok.max_len),
            (3, Some(9), Duration::from_secs(10), true, 24)
        );
    }

    #[test]
    fn a_seed_gives_the_same_sequences() {
        let strategy = ops::sequence(10, true);
        let draw = |seed| {
            let mut runner = TestRunner::new_with_rng(ProptestConfig::default(), rng(seed));
            (0..5)
                .map(|_| strategy.new_tree(&mut runner).unwrap().current())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // Without raw frames, no hand-written body frame.
        let strategy = ops::sequence(30, false);
        let mut runner = TestRunner::new_with_rng(ProptestConfig::default(), rng(1));
        for _ in 0..200 {
            let ops = strategy.new_tree(&mut runner).unwrap().current();
            assert!(!ops.iter().any(|op| matches!(op, Op::BodyFrame { .. })));
        }
    }

    #[test]
    fn a_bad_url_is_a_usage_error_and_a_closed_port_is_unreachable() {
        let args = |a: &str, b: &str| DiffArgs {
            a: a.into(),
            b: b.into(),
            cases: 1,
            seed: Some(1),
            max_len: 3,
            shrink_for: Duration::from_secs(1),
            json: false,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = main(
            &args("amqp://u:hunter2@host:notaport/", "amqp://localhost/"),
            None,
            Duration::from_secs(30),
            &mut out,
            &mut err,
        );
        assert_eq!(code, USAGE);
        assert!(!String::from_utf8_lossy(&err).contains("hunter2"));
        // A port nothing listens on: bind one, then let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let url = format!("amqp://u:hunter2@127.0.0.1:{port}/");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = main(&args(&url, &url), None, Duration::from_secs(30), &mut out, &mut err);
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, UNREACHABLE, "{err}");
        assert!(err.contains("cannot connect to A"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
