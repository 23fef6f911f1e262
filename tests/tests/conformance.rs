//! `acemq conformance check`, run as a child process the way a broker's
//! author runs it: it passes on RabbitMQ 3.10 and 4.0 (each with its own
//! `--rabbitmq-version`) and on acemq-memory imitating each version over
//! TCP; behind a small frame-rewriting proxy (a broker with one rule
//! broken) exactly the affected check fails, with the difference shown and
//! the broker's hostile text escaped; `--json` parses and its totals match;
//! the exit codes for an unreachable or refusing broker and a bad command
//! line.

use std::collections::HashMap;
use std::net::SocketAddr;

use std::time::Duration;

use acemq_codec::{Frame, FrameDecoder, Method};
use acemq_memory::{Broker, BrokerConfig, RabbitMqVersion};
use acemq_tests::{brokers, RabbitVersion};
use bytes::BytesMut;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long one run of the whole catalogue may take.
const RUN_LIMIT: Duration = Duration::from_secs(120);

// ---- the binary ----

use acemq_tests::binaries::{acemq as acemq_binary, run_acemq, Run};

/// `acemq ARGS`, with `AMQP_URL` unset, within [`RUN_LIMIT`].
async fn acemq(args: &[&str]) -> Run {
    run_acemq(None, args, None, RUN_LIMIT).await
}

/// The failed checks of a JSON report: `id: expected …, got …`.
fn failures(report: &Value) -> Vec<String> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["verdict"] == "fail")
        .map(|c| {
            format!(
                "{}: expected {}, got {} ({})",
                c["id"], c["expected"], c["got"], c["text"]
            )
        })
        .collect()
}

/// The totals must be what the checks say.
fn assert_totals(report: &Value) {
    let checks = report["checks"].as_array().expect("checks");
    let count = |v: &str| checks.iter().filter(|c| c["verdict"] == v).count();
    let totals = &report["totals"];
    assert_eq!(totals["checks"], checks.len(), "{report}");
    assert_eq!(totals["pass"], count("pass"), "{report}");
    assert_eq!(totals["fail"], count("fail"), "{report}");
    assert_eq!(totals["not_applicable"], count("n/a"), "{report}");
    assert!(checks.len() >= 60, "{} checks", checks.len());
}

/// acemq-memory imitating `version`, served on a loopback port (the
/// broker lives as long as the returned handle).
async fn memory(version: RabbitMqVersion) -> (Broker, String) {
    let broker = Broker::new(BrokerConfig::for_version(version));
    let addr = broker.listen_tcp("127.0.0.1:0").await.expect("acemq-memory listens");
    (broker, format!("amqp://guest:guest@{addr}/"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn check_passes_on_rabbitmq_and_acemq_memory_each_as_its_own_version() {
    acemq_binary();
    acemq_tests::deadline_blocking(|| {
        runtime().block_on(acemq_tests::deadline(async {
            let (_m3, m3_url) = memory(RabbitMqVersion::V3_10).await;
            let (_m4, m4_url) = memory(RabbitMqVersion::V4_0).await;
            let mut targets = vec![
                ("acemq-memory 3.10".to_string(), m3_url, "3.10"),
                ("acemq-memory 4.0".to_string(), m4_url, "4.0"),
            ];
            for b in brokers().await {
                if b.kind.is_rabbit_tcp() {
                    let v = b.rabbit();
                    targets.push((v.to_string(), b.url.clone(), v.as_str()));
                }
            }
            let runs = targets.into_iter().map(|(label, url, version)| {
                tokio::spawn(async move {
                    let run = acemq(&["conformance", "check", &url, "--rabbitmq-version", version, "--json"]).await;
                    (label, run)
                })
            });
            let mut problems = Vec::new();
            for run in runs.collect::<Vec<_>>() {
                let (label, run) = run.await.unwrap();
                let report = run.json();
                assert_totals(&report);
                let failed = failures(&report);
                if run.code != Some(0) || !failed.is_empty() {
                    problems.push(format!("{label} (exit {:?}):\n  {}", run.code, failed.join("\n  ")));
                }
                assert_eq!(
                    report["totals"]["not_applicable"], 0,
                    "{label}: every check applies to both RabbitMQ and acemq-memory: {report}"
                );
            }
            assert!(problems.is_empty(), "checks failed:\n{}", problems.join("\n"));
        }))
    });
}

/// What the proxy changes in the broker's frames.
#[derive(Clone, Copy)]
enum Rule {
    /// `channel.close` with code `from` goes out as `to`, with `text`.
    RewriteChannelClose { from: u16, to: u16, text: &'static str },
    /// Every `basic.return` (and its content) is dropped.
    DropReturns,
}

/// A proxy in front of `upstream` that applies `rule` to the broker's frames.
async fn proxy(upstream: SocketAddr, rule: Rule) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if let Ok(server) = TcpStream::connect(upstream).await {
                tokio::spawn(pipe(client, server, rule));
            }
        }
    });
    addr
}

async fn pipe(client: TcpStream, server: TcpStream, rule: Rule) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
        let _ = to_server.shutdown().await;
    });
    let decoder = FrameDecoder::new(0);
    let mut buf = BytesMut::new();
    let mut first = true;
    let mut raw = false;
    // Channels whose returned content is being dropped: the body bytes
    // still to drop (`None` until the header says).
    let mut dropping: HashMap<u16, Option<u64>> = HashMap::new();
    loop {
        match from_server.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if first && buf.len() >= 4 && &buf[..4] == b"AMQP" {
            // The broker's answer to a bad protocol header: not a frame.
            raw = true;
        }
        first = false;
        let mut out = BytesMut::new();
        if raw {
            out.extend_from_slice(&buf.split());
        }
        while !raw {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    if let Some(frame) = apply(rule, frame, &mut dropping) {
                        frame.encode(&mut out).unwrap();
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    raw = true;
                    out.extend_from_slice(&buf.split());
                }
            }
        }
        if to_client.write_all(&out).await.is_err() {
            break;
        }
    }
    let _ = to_client.shutdown().await;
}

fn apply(rule: Rule, frame: Frame, dropping: &mut HashMap<u16, Option<u64>>) -> Option<Frame> {
    match (rule, frame) {
        (Rule::RewriteChannelClose { from, to, text }, Frame::Method(ch, Method::ChannelClose(mut c)))
            if c.reply_code == from =>
        {
            c.reply_code = to;
            c.reply_text = text.into();
            Some(Frame::Method(ch, Method::ChannelClose(c)))
        }
        (Rule::DropReturns, Frame::Method(ch, Method::BasicReturn(_))) => {
            dropping.insert(ch, None);
            None
        }
        (Rule::DropReturns, Frame::Header(ch, h)) if dropping.get(&ch) == Some(&None) => {
            if h.body_size == 0 {
                dropping.remove(&ch);
            } else {
                dropping.insert(ch, Some(h.body_size));
            }
            None
        }
        (Rule::DropReturns, Frame::Body(ch, b)) if matches!(dropping.get(&ch), Some(Some(_))) => {
            let left = dropping[&ch].unwrap_or(0).saturating_sub(b.len() as u64);
            if left == 0 {
                dropping.remove(&ch);
            } else {
                dropping.insert(ch, Some(left));
            }
            None
        }
        (_, frame) => Some(frame),
    }
}

/// A hostile reply text: OSC 52 (set the clipboard), a colour, a C1 CSI,
/// a newline.
const HOSTILE: &str = "locked\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[31mred\u{9b}2J\r\nforged line";

#[test]
fn a_broker_with_one_rule_broken_fails_exactly_that_check_with_the_difference_shown() {
    acemq_binary();
    acemq_tests::deadline_blocking(|| {
        runtime().block_on(acemq_tests::deadline(async {
            let broker = Broker::new(BrokerConfig::for_version(RabbitMqVersion::V4_0));
            let upstream = broker.listen_tcp("127.0.0.1:0").await.unwrap();

            // 405 RESOURCE_LOCKED comes out as 403, with a hostile text.
            let rewrite = proxy(
                upstream,
                Rule::RewriteChannelClose {
                    from: 405,
                    to: 403,
                    text: HOSTILE,
                },
            )
            .await;
            let url = format!("amqp://guest:guest@{rewrite}/");
            let table = tokio::spawn(async move { acemq(&["conformance", "check", &url, "--rabbitmq-version", "4.0"]).await });

            // basic.return never arrives.
            let dropped = proxy(upstream, Rule::DropReturns).await;
            let url = format!("amqp://guest:guest@{dropped}/");
            let json = tokio::spawn(async move {
                acemq(&["conformance", "check", &url, "--rabbitmq-version", "4.0", "--json"]).await
            });

            let run = table.await.unwrap();
            assert_eq!(run.code, Some(1), "{run:?}");
            let failed: Vec<&str> = run.stdout.lines().filter(|l| l.contains('✘')).collect();
            assert_eq!(
                failed,
                ["  ✘ channel.queue.exclusive-other-connection-405  another connection's exclusive queue cannot be declared: the channel closes with 405"],
                "{run:?}"
            );
            assert!(run.stdout.contains("expected: channel.close 405 RESOURCE_LOCKED"), "{run:?}");
            assert!(run.stdout.contains("got:      channel.close 403 ACCESS_REFUSED"), "{run:?}");
            assert!(
                run.stdout.contains("text:     locked\\x1b]52;c;ZXZpbA==\\x07\\x1b[31mred\\u{9b}2J\\r\\nforged line"),
                "{run:?}"
            );
            assert!(
                run.stdout.chars().all(|c| c == '\n' || !c.is_control()),
                "a control character reached the terminal: {run:?}"
            );
            assert!(!run.stdout.contains("\nforged line"), "{run:?}");

            let run = json.await.unwrap();
            assert_eq!(run.code, Some(1), "{run:?}");
            let report = run.json();
            assert_totals(&report);
            assert_eq!(report["totals"]["fail"], 1, "{run:?}");
            assert_eq!(
                failures(&report),
                ["\"confirms.return-before-ack\": expected \"basic.return 312 NO_ROUTE, then basic.ack 1\", got \"basic.ack 1\" (null)"],
                "{run:?}"
            );
            drop(broker);
        }))
    });
}

#[test]
fn an_unreachable_or_refusing_broker_is_exit_code_3_and_a_bad_command_line_2() {
    acemq_binary();
    acemq_tests::deadline_blocking(|| {
        runtime().block_on(acemq_tests::deadline(async {
            // Nothing listens on a port just freed.
            let port = {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let run = acemq(&["conformance", "check", &format!("amqp://guest:guest@127.0.0.1:{port}/")]).await;
            assert_eq!(run.code, Some(3), "{run:?}");
            assert!(run.stdout.is_empty(), "{run:?}");

            let broker = Broker::new(BrokerConfig::for_version(RabbitMqVersion::V4_0));
            let addr = broker.listen_tcp("127.0.0.1:0").await.unwrap();
            let run = acemq(&[
                "conformance",
                "check",
                &format!("amqp://guest:not-the-password@{addr}/"),
            ])
            .await;
            assert_eq!(run.code, Some(3), "{run:?}");
            assert!(!run.stderr.contains("not-the-password"), "{run:?}");

            let url = format!("amqp://guest:guest@{addr}/");
            for args in [
                vec!["conformance", "check", url.as_str(), "--rabbitmq-version", "3.11"],
                vec!["conformance", "check", "amqps://guest:guest@localhost:5671/"],
                vec!["conformance", "check"],
            ] {
                let run = acemq(&args).await;
                assert_eq!(run.code, Some(2), "{run:?}");
            }

            // The URL from --url; --only narrows the catalogue; the default
            // version is 4.0 for a broker that names neither.
            let run = acemq(&["--url", &url, "conformance", "check", "--only", "flow.", "--json"]).await;
            assert_eq!(run.code, Some(0), "{run:?}");
            let report = run.json();
            assert_eq!(report["rabbitmq_version"], "4.0");
            let ids: Vec<&str> = report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["flow.inactive-540", "flow.active-ok"], "{run:?}");

            let help = acemq(&["conformance", "check", "--help"]).await;
            assert_eq!(help.code, Some(0), "{help:?}");
            assert!(help.stdout.contains("--rabbitmq-version"), "{help:?}");
            assert!(help.stdout.contains("else 4.0"), "{help:?}");
            assert!(help.stdout.contains("3  the broker could not be reached"), "{help:?}");
        }))
    });
}

#[test]
fn the_default_version_is_the_one_rabbitmq_names() {
    acemq_binary();
    acemq_tests::deadline_blocking(|| {
        runtime().block_on(acemq_tests::deadline(async {
            for b in brokers().await {
                if b.kind.is_rabbit_tcp() {
                    let run = acemq(&["conformance", "check", &b.url, "--only", "flow.active", "--json"]).await;
                    assert_eq!(run.code, Some(0), "{run:?}");
                    let want = match b.rabbit() {
                        RabbitVersion::V3_10 => "3.10",
                        RabbitVersion::V4_0 => "4.0",
                    };
                    assert_eq!(run.json()["rabbitmq_version"], want, "{run:?}");
                }
            }
        }))
    });
}
