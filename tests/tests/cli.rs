//! The `acemq` operator CLI (the acemq-cli package), run as a child process
//! the way an operator runs it, against the `acemq-memory` server binary
//! over TCP and against RabbitMQ: `dlq list|show|replay|purge` on set-aside
//! messages made by a real consumer, the dead-letter workflow (summary,
//! filters, delete, move, export and import), `topology declare|check` and
//! every difference `check` must name, the exit codes, text that cannot
//! drive the terminal, and a password that never appears in any output.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use acemq_codec::{ExchangeDelete, FieldTable, FieldValue, QueueBind, QueueDeclare, QueueDelete, QueueUnbind};
use acemq_core::{consume, fatal, Ack, Config, Conn, Envelope, Message, Topology};
use acemq_tests::{brokers, depth, step, unique, RabbitVersion};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How long one run of the CLI may take.
const RUN_LIMIT: Duration = Duration::from_secs(60);
/// The password of the RabbitMQ user the CLI runs as (never printed).
const RABBIT_PASSWORD: &str = "cli-S3cret-pw-7781";
const RABBIT_USER: &str = "acemq-cli-test";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

#[derive(Debug)]
struct Declined(u32);
impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "card declined for order {}", self.0)
    }
}
impl std::error::Error for Declined {}

// ---- the binaries ----

use acemq_tests::binaries::{acemq as acemq_binary, acemq_memory as server_binary, drain, run_acemq, wait_for, Run};

/// A running `acemq-memory` server; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(server_binary())
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("acemq-memory starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut lines = std::io::BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Keep reading: a full pipe must never block the server.
            for _ in lines {}
        });
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("acemq-memory printed no address: {other:?}");
            }
        };
        let addr = line
            .strip_prefix("acemq-memory: listening on ")
            .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("not the listening line: {line:?}"));
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- where the CLI runs ----

/// A broker the CLI runs against.
struct Target {
    kind: &'static str,
    /// Which RabbitMQ (`None`: the acemq-memory server).
    version: Option<RabbitVersion>,
    /// For the test's own connection.
    url: String,
    /// For the CLI (on RabbitMQ, a user of its own with a password to look for).
    cli_url: String,
    /// A password that must not appear in any output.
    secret: Option<&'static str>,
    _server: Option<Server>,
}

/// The acemq-memory server binary, and RabbitMQ over TCP when there is one
/// (under `CI=true` a missing RabbitMQ fails, as `brokers()` says).
async fn targets() -> Vec<Target> {
    let server = step("the acemq-memory server", tokio::task::spawn_blocking(Server::start))
        .await
        .unwrap();
    let url = format!("amqp://guest:guest@{}/", server.addr);
    let mut out = vec![Target {
        kind: "acemq-memory server",
        version: None,
        url: url.clone(),
        cli_url: url,
        secret: None,
        _server: Some(server),
    }];
    for b in brokers().await {
        if b.kind.is_rabbit_tcp() {
            let version = b.rabbit();
            step(
                format!("the CLI's user on {version}"),
                tokio::task::spawn_blocking(move || rabbit_user(version)),
            )
            .await
            .unwrap();
            let parsed: acemq_core::amqp::AmqpUrl = b.url.parse().unwrap();
            let (host, port) = &parsed.hosts[0];
            out.push(Target {
                kind: match version {
                    RabbitVersion::V3_10 => "RabbitMQ 3.10",
                    RabbitVersion::V4_0 => "RabbitMQ 4.0",
                },
                version: Some(version),
                url: b.url.clone(),
                cli_url: format!("amqp://{RABBIT_USER}:{RABBIT_PASSWORD}@{host}:{port}/"),
                secret: Some(RABBIT_PASSWORD),
                _server: None,
            });
        }
    }
    out
}

/// Creates (once per version) the RabbitMQ user the CLI runs as, with all
/// permissions on `/`.
fn rabbit_user(version: RabbitVersion) {
    static DONE: [OnceLock<()>; 2] = [OnceLock::new(), OnceLock::new()];
    DONE[version as usize].get_or_init(|| {
        let ctl = |args: &[&str]| {
            Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/rabbitmq.sh"))
                .env("ACEMQ_RABBITMQ_VERSION", version.as_str())
                .arg("ctl")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map(|mut c| wait_for(&mut c, RUN_LIMIT, "rabbitmqctl").success())
                .unwrap_or(false)
        };
        if !ctl(&["add_user", RABBIT_USER, RABBIT_PASSWORD]) {
            assert!(
                ctl(&["change_password", RABBIT_USER, RABBIT_PASSWORD]),
                "rabbitmqctl cannot create the CLI's user"
            );
        }
        assert!(ctl(&["set_permissions", "-p", "/", RABBIT_USER, ".*", ".*", ".*"]));
    });
}

impl Target {
    async fn conn(&self) -> Conn {
        let mut config = Config::default();
        config.engine.connection_timeout = Duration::from_secs(10);
        Conn::open(&self.url, config)
            .await
            .unwrap_or_else(|e| panic!("opening a Conn to the {}: {e}", self.kind))
    }

    /// Runs `acemq ARGS` with `AMQP_URL` set to the CLI's URL.
    async fn acemq(&self, args: &[&str]) -> Run {
        self.acemq_input(args, None).await
    }

    /// [`Target::acemq`] with `input` on its stdin.
    async fn acemq_input(&self, args: &[&str], input: Option<Vec<u8>>) -> Run {
        let run = acemq_io(Some(&self.cli_url), args, input).await;
        if let Some(secret) = self.secret {
            assert!(
                !run.stdout.contains(secret) && !run.stderr.contains(secret),
                "the password was printed by acemq {args:?}:\n{run:?}"
            );
        }
        run
    }
}

/// Runs the CLI with `AMQP_URL` = `url` (unset when `None`), stdin closed,
/// within [`RUN_LIMIT`].
async fn acemq_with(url: Option<&str>, args: &[&str]) -> Run {
    acemq_io(url, args, None).await
}

/// [`acemq_with`], with `input` on stdin (closed when `None`).
async fn acemq_io(url: Option<&str>, args: &[&str], input: Option<Vec<u8>>) -> Run {
    run_acemq(url, args, input, RUN_LIMIT).await
}

/// Runs `scenario` on every target, each on a runtime of its own, under the
/// test deadline. The binaries are built first, outside it (within
/// `acemq_tests::binaries`' own limit).
fn on_every_target<F, Fut>(scenario: F)
where
    F: Fn(Target) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    acemq_binary();
    server_binary();
    acemq_tests::deadline_blocking(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let all = runtime.block_on(acemq_tests::deadline(targets()));
        for target in all {
            eprintln!("acemq CLI scenario on the {}", target.kind);
            let _label = acemq_tests::waiting_for(format!("the scenario on the {}", target.kind));
            runtime.block_on(acemq_tests::deadline(scenario(target)));
        }
    });
}

async fn queue_depth(conn: &Conn, queue: &str) -> u32 {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let n = depth(&ch, queue).await;
    let _ = ch.close().await;
    n
}

/// Waits until `queue` holds `n` messages, for at most 30 s.
async fn until_depth(conn: &Conn, queue: &str, n: u32) {
    let _label = acemq_tests::waiting_for(format!("{queue} to hold {n} messages"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = queue_depth(conn, queue).await;
        if now == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{queue} holds {now}, not {n}, after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete_queues(conn: &Conn, names: &[String]) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    for name in names {
        let _ = ch
            .queue_delete(QueueDelete {
                queue: name.as_str().into(),
                ..Default::default()
            })
            .await;
    }
    let _ = ch.close().await;
}

/// The positions of `ids` in `text`, which must be increasing.
fn assert_in_order(text: &str, ids: &[String]) {
    let positions: Vec<usize> = ids
        .iter()
        .map(|id| text.find(id.as_str()).unwrap_or_else(|| panic!("{id} not in:\n{text}")))
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "not in order {ids:?}:\n{text}"
    );
}

// ---- the scenarios ----

#[test]
fn dlq_list_show_replay_and_purge_set_aside_messages() {
    on_every_target(|t| async move {
        let conn = t.conn().await;
        let q = unique("cli");
        let (x, y) = (unique("cli-orders"), unique("cli-other"));
        Topology::new()
            .queue(&q)
            .dead_letters(&q)
            .exchange(&x, "topic")
            .exchange(&y, "topic")
            .bind(&q, &x, "order.#")
            .bind(&q, &y, "other.#")
            .declare(&conn)
            .await
            .unwrap();

        // Orders 1-3 and 5 are dead-lettered (a fatal error), 4 is parked;
        // 5 first went through `y`, the others through `x`. One at a time:
        // the set-aside hops of a consumer are not ordered among themselves.
        let consumer = consume(&conn, &q, |m: Message<Order>| async move {
            match m.payload.id {
                4 => Ack::park("needs a human: address unknown"),
                id => Ack::retry(fatal(Declined(id))),
            }
        })
        .await
        .unwrap();
        let (dlq, parked) = (format!("{q}.dlq"), format!("{q}.parked"));
        let via_x = conn.publisher::<Order>(&x, "order.placed").mandatory();
        let via_y = conn.publisher::<Order>(&y, "other.placed").mandatory();
        let mut ids = Vec::new();
        for id in 1..=5 {
            let envelope = Envelope::new().with_correlation_id(format!("corr-{id}"));
            ids.push(envelope.id.clone());
            let publisher = if id == 5 { &via_y } else { &via_x };
            publisher.send_envelope(envelope, &Order { id }).await.unwrap();
            until_depth(&conn, &dlq, if id < 4 { id } else { id - 1 }).await;
        }
        until_depth(&conn, &parked, 1).await;
        consumer.close().await.unwrap();
        let dead: Vec<String> = [0, 1, 2, 4].iter().map(|&i| ids[i].clone()).collect();

        // list: in order, nothing removed.
        let run = t.acemq(&["dlq", "list", &q]).await;
        run.assert_code(0);
        assert!(run.stdout.starts_with(&format!("{dlq}: 4 messages\n")), "{run:?}");
        assert_in_order(&run.stdout, &dead);
        assert!(run.stdout.contains("fatal: card declined for order 1"), "{run:?}");
        assert!(run.stdout.contains(&format!("{x}/order.placed")), "{run:?}");
        assert!(
            !run.stdout.contains(&ids[3]),
            "the parked one is not a dead letter: {run:?}"
        );
        assert_eq!(queue_depth(&conn, &dlq).await, 4, "a listing removes nothing");

        // --json parses, in the same order, with everything an operator needs.
        let run = t.acemq(&["dlq", "list", &q, "--json"]).await;
        let listing = run.assert_code(0).json();
        assert_eq!(listing["queue"], dlq.as_str());
        assert_eq!(listing["depth"], 4);
        let messages = listing["messages"].as_array().unwrap();
        let listed: Vec<&str> = messages.iter().map(|m| m["message_id"].as_str().unwrap()).collect();
        assert_eq!(listed, dead);
        assert_eq!(messages[0]["position"], 1);
        assert_eq!(messages[0]["correlation_id"], "corr-1");
        assert_eq!(messages[0]["original_exchange"], x.as_str());
        assert_eq!(messages[0]["original_routing_key"], "order.placed");
        assert_eq!(messages[3]["original_exchange"], y.as_str());
        assert_eq!(messages[1]["error"], "fatal: card declined for order 2");
        assert_eq!(messages[1]["replayed"], 0);
        let body: Order = serde_json::from_str(messages[2]["body"].as_str().unwrap()).unwrap();
        assert_eq!(body, Order { id: 3 });
        assert_eq!(messages[0]["headers"]["x-acemq-original-exchange"], x.as_str());
        assert_eq!(queue_depth(&conn, &dlq).await, 4, "a listing removes nothing");

        // --limit lists from the head.
        let run = t.acemq(&["dlq", "list", &q, "--limit", "2", "--json"]).await;
        let listed = run.assert_code(0).json()["messages"].as_array().unwrap().len();
        assert_eq!(listed, 2, "{run:?}");

        // --parked.
        let run = t.acemq(&["dlq", "list", &q, "--parked"]).await;
        run.assert_code(0);
        assert!(run.stdout.starts_with(&format!("{parked}: 1 message\n")), "{run:?}");
        assert!(run.stdout.contains(&ids[3]), "{run:?}");
        assert!(run.stdout.contains("needs a human: address unknown"), "{run:?}");

        // show: the first message, or one by id.
        let run = t.acemq(&["dlq", "show", &q]).await;
        run.assert_code(0);
        for expected in [
            format!("message 1 of 4 in {dlq}"),
            format!("message-id:      {}", ids[0]),
            "correlation-id:  corr-1".to_string(),
            "error:           fatal: card declined for order 1".to_string(),
            format!("original:        exchange {x:?} key \"order.placed\""),
            "content-type:    application/json".to_string(),
            "x-acemq-error: \"fatal: card declined for order 1\"".to_string(),
            "{\"id\":1}".to_string(),
        ] {
            assert!(run.stdout.contains(&expected), "no {expected:?} in {run:?}");
        }
        let run = t.acemq(&["dlq", "show", &q, &ids[2], "--json"]).await;
        let shown = run.assert_code(0).json();
        assert_eq!(shown["message_id"], ids[2].as_str());
        assert_eq!(shown["position"], 3);
        let run = t.acemq(&["dlq", "show", &q, "no-such-id"]).await;
        run.assert_code(1);
        assert_eq!(queue_depth(&conn, &dlq).await, 4, "show removes nothing");

        // replay --dry-run moves nothing.
        let run = t.acemq(&["dlq", "replay", &q, "--dry-run"]).await;
        run.assert_code(0);
        assert!(
            run.stdout
                .contains(&format!("dry run: 4 of 4 messages examined in {dlq} would be replayed")),
            "{run:?}"
        );
        for id in &dead {
            assert!(run.stdout.contains(&format!("  {id} -> queue {q}\n")), "{run:?}");
        }
        // --to-original lists the exchanges and keys they were first published with.
        let run = t.acemq(&["dlq", "replay", &q, "--dry-run", "--to-original"]).await;
        run.assert_code(0);
        for (id, exchange, key) in [(&ids[0], &x, "order.placed"), (&ids[4], &y, "other.placed")] {
            let line = format!("  {id} -> exchange {exchange:?} key {key:?}\n");
            assert!(run.stdout.contains(&line), "no {line:?} in {run:?}");
        }
        assert_eq!(queue_depth(&conn, &dlq).await, 4, "a dry run moves nothing");
        assert_eq!(queue_depth(&conn, &q).await, 0, "a dry run moves nothing");

        // replay --limit 1 moves the first one back into its queue.
        let run = t.acemq(&["dlq", "replay", &q, "--limit", "1"]).await;
        run.assert_code(0);
        assert!(
            run.stdout
                .contains(&format!("replayed 1 of 1 message examined in {dlq}")),
            "{run:?}"
        );
        assert!(
            run.stderr.contains("replayed 1/1"),
            "plain progress lines off a terminal: {run:?}"
        );
        until_depth(&conn, &q, 1).await;
        assert_eq!(queue_depth(&conn, &dlq).await, 3);
        let ch = conn.consuming_connection().channel().await.unwrap();
        let back = ch.basic_get(&q, true).await.unwrap().expect("the replayed message");
        let props = back.properties.as_ref().unwrap();
        assert_eq!(props.message_id.as_ref().unwrap().as_str(), Some(ids[0].as_str()));
        let headers = props.headers.as_ref().unwrap();
        assert_eq!(headers.get("x-acemq-replayed").and_then(FieldValue::as_i64), Some(1));
        assert_eq!(back.exchange.as_str(), Some(""), "through the default exchange");
        assert_eq!(back.routing_key.as_str(), Some(q.as_str()));

        // --id replays only that one; the others stay, and that is no failure.
        let run = t.acemq(&["dlq", "replay", &q, "--id", &ids[2], "--json"]).await;
        let report = run.assert_code(0).json();
        assert_eq!(report["replayed"], 1, "{run:?}");
        assert_eq!(report["not_selected"], 2, "{run:?}");
        assert_eq!(report["kept"].as_array().unwrap().len(), 0, "{run:?}");
        until_depth(&conn, &q, 1).await;
        assert_eq!(queue_depth(&conn, &dlq).await, 2);
        let left = t.acemq(&["dlq", "list", &q, "--json"]).await.json();
        let left: Vec<&str> = left["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["message_id"].as_str().unwrap())
            .collect();
        assert_eq!(left, [ids[1].as_str(), ids[4].as_str()]);

        // To the original exchanges: a message whose exchange is gone stays,
        // with the reason, and the exit code says so.
        let ch = conn.consuming_connection().channel().await.unwrap();
        ch.exchange_delete(ExchangeDelete {
            exchange: y.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let run = t.acemq(&["dlq", "replay", &q, "--to-original"]).await;
        run.assert_code(1);
        assert!(
            run.stdout
                .contains(&format!("replayed 1 of 2 messages examined in {dlq}")),
            "{run:?}"
        );
        assert!(run.stdout.contains("1 message cannot go back"), "{run:?}");
        assert!(
            run.stdout.contains(&ids[4]) && run.stdout.contains("no longer exists"),
            "{run:?}"
        );
        assert_eq!(queue_depth(&conn, &dlq).await, 1);

        // purge: refused without --yes off a terminal, then done.
        let run = t.acemq(&["dlq", "purge", &q]).await;
        run.assert_code(2);
        assert!(run.stderr.contains("--yes"), "{run:?}");
        assert_eq!(queue_depth(&conn, &dlq).await, 1);
        let run = t.acemq(&["dlq", "purge", &q, "--yes"]).await;
        run.assert_code(0);
        assert_eq!(run.stdout.trim(), format!("purged 1 message from {dlq}"));
        assert_eq!(queue_depth(&conn, &dlq).await, 0);
        let run = t.acemq(&["dlq", "purge", &q, "--parked", "--yes"]).await;
        run.assert_code(0);
        assert_eq!(queue_depth(&conn, &parked).await, 0);
        let run = t.acemq(&["dlq", "list", &q]).await;
        run.assert_code(0);
        assert_eq!(run.stdout.trim(), format!("{dlq}: 0 messages"));

        // A queue that is not there.
        let run = t.acemq(&["dlq", "list", &dlq]).await;
        run.assert_code(1);
        assert!(run.stderr.contains(&format!("there is no queue {dlq}.dlq")), "{run:?}");

        delete_queues(&conn, &[q.clone(), dlq, parked]).await;
        let ch = conn.consuming_connection().channel().await.unwrap();
        let _ = ch
            .exchange_delete(ExchangeDelete {
                exchange: x.as_str().into(),
                ..Default::default()
            })
            .await;
        conn.close().await.unwrap();
    });
}

#[test]
fn topology_declare_then_check_and_every_difference_named() {
    on_every_target(|t| async move {
        let conn = t.conn().await;
        let q = unique("cli-topology");
        let retries = ["--retries", "exponential:4:10s:0", "--wait-in-broker-from", "20s"];
        let with =
            |args: &[&str]| -> Vec<String> { args.iter().chain(retries.iter()).map(|s| s.to_string()).collect() };
        let run = |args: Vec<String>| {
            let t = &t;
            async move { t.acemq(&args.iter().map(String::as_str).collect::<Vec<_>>()).await }
        };

        let declared = run(with(&["topology", "declare", &q])).await;
        declared.assert_code(0);
        for expected in [
            format!("declared queue {q} (quorum, dead letters to acemq.dlx under {q}.dlq)"),
            format!("bound {q}.parked to acemq.dlx under {q}.parked"),
            format!("declared queue {q}.retry.20s (classic, TTL 20s, then back to {q})"),
            format!("declared queue {q}.retry.40s (classic, TTL 40s, then back to {q})"),
        ] {
            assert!(declared.stdout.contains(&expected), "no {expected:?} in {declared:?}");
        }
        let rungs = [format!("{q}.retry.20s"), format!("{q}.retry.40s")];

        let checked = run(with(&["topology", "check", &q])).await;
        checked.assert_code(0);
        assert!(
            checked
                .stdout
                .contains(&format!("{q}: the topology is the wire contract")),
            "{checked:?}"
        );
        let checked = run(with(&["topology", "check", &q, "--json"])).await;
        assert_eq!(checked.assert_code(0).json()["differences"], serde_json::json!([]));
        assert_eq!(
            queue_depth(&conn, &format!("{q}.dlq")).await,
            0,
            "no probe is left behind"
        );
        assert_eq!(
            queue_depth(&conn, &format!("{q}.parked")).await,
            0,
            "no probe is left behind"
        );

        // Without --retries, the rungs are not part of what is checked.
        run(vec!["topology".into(), "check".into(), q.clone()])
            .await
            .assert_code(0);

        // A missing .parked: the queue and its binding; check creates nothing.
        delete_queues(&conn, &[format!("{q}.parked")]).await;
        let checked = run(with(&["topology", "check", &q])).await;
        checked.assert_code(1);
        assert!(
            checked.stdout.contains(&format!("missing queue {q}.parked\n")),
            "{checked:?}"
        );
        assert!(
            checked.stdout.contains(&format!(
                "binding of {q}.parked to acemq.dlx under key {q}.parked is missing"
            )),
            "{checked:?}"
        );
        assert!(checked.stdout.contains(&format!("{q}: 2 differences")), "{checked:?}");
        let ch = conn.consuming_connection().channel().await.unwrap();
        let passive = QueueDeclare {
            queue: format!("{q}.parked").as_str().into(),
            passive: true,
            ..Default::default()
        };
        let still_missing = ch.queue_declare(passive).await.unwrap_err();
        assert_eq!(still_missing.reply_code(), Some(404), "check never creates a queue");

        // A rung with another TTL, the source queue without its dead-letter
        // arguments, and the dlq bound under the wrong key: all named at once.
        run(with(&["topology", "declare", &q])).await.assert_code(0);
        delete_queues(&conn, &[rungs[1].clone(), q.clone()]).await;
        let ch = conn.consuming_connection().channel().await.unwrap();
        let mut ttl = FieldTable::new();
        ttl.push("x-message-ttl", FieldValue::I32(30_000));
        ttl.push("x-dead-letter-exchange", FieldValue::from(""));
        ttl.push("x-dead-letter-routing-key", FieldValue::from(q.as_str()));
        ch.queue_declare(QueueDeclare {
            queue: rungs[1].as_str().into(),
            durable: true,
            arguments: ttl,
            ..Default::default()
        })
        .await
        .unwrap();
        let mut quorum = FieldTable::new();
        quorum.push("x-queue-type", FieldValue::from("quorum"));
        ch.queue_declare(QueueDeclare {
            queue: q.as_str().into(),
            durable: true,
            arguments: quorum,
            ..Default::default()
        })
        .await
        .unwrap();
        // .parked as a quorum queue (RabbitMQ takes a redeclare without
        // x-queue-type as equivalent to any type: check asks again).
        let parked = format!("{q}.parked");
        delete_queues(&conn, std::slice::from_ref(&parked)).await;
        let mut quorum = FieldTable::new();
        quorum.push("x-queue-type", FieldValue::from("quorum"));
        ch.queue_declare(QueueDeclare {
            queue: parked.as_str().into(),
            durable: true,
            arguments: quorum,
            ..Default::default()
        })
        .await
        .unwrap();
        ch.queue_bind(QueueBind {
            queue: parked.as_str().into(),
            exchange: "acemq.dlx".into(),
            routing_key: parked.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let dlq = format!("{q}.dlq");
        ch.queue_unbind(QueueUnbind {
            queue: dlq.as_str().into(),
            exchange: "acemq.dlx".into(),
            routing_key: dlq.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        ch.queue_bind(QueueBind {
            queue: dlq.as_str().into(),
            exchange: "acemq.dlx".into(),
            routing_key: format!("{q}.wrong").as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let checked = run(with(&["topology", "check", &q])).await;
        checked.assert_code(1);
        for expected in [
            format!(
                "queue {}: argument x-message-ttl differs: the contract has 40000 (signedint), the broker has 30000 (signedint)",
                rungs[1]
            ),
            format!(
                "queue {q}: argument x-dead-letter-exchange differs: the contract has \"acemq.dlx\" (longstr), the broker has none"
            ),
            format!(
                "queue {q}: argument x-dead-letter-routing-key differs: the contract has \"{q}.dlq\" (longstr), the broker has none"
            ),
            format!("binding of {dlq} to acemq.dlx under key {dlq} is missing"),
            format!("queue {parked}: argument x-queue-type differs: the contract has none"),
        ] {
            assert!(checked.stdout.contains(&expected), "no {expected:?} in {checked:?}");
        }
        // RabbitMQ 3.10 names the type of the value it has; 4.0's refusal
        // gives a bare 'quorum', which the check prints as it is.
        let has_quorum = match t.version {
            Some(RabbitVersion::V4_0) => "the broker has quorum\n",
            _ => "the broker has \"quorum\" (longstr)",
        };
        assert!(checked.stdout.contains(has_quorum), "no {has_quorum:?} in {checked:?}");
        assert!(checked.stdout.contains(&format!("{q}: 5 differences")), "{checked:?}");
        let listed = run(with(&["topology", "check", &q, "--json"])).await;
        assert_eq!(listed.assert_code(1).json()["differences"].as_array().unwrap().len(), 5);

        // A dlq that holds messages: the probe is never delivered to a
        // reader and the listing is complete.
        ch.queue_bind(QueueBind {
            queue: dlq.as_str().into(),
            exchange: "acemq.dlx".into(),
            routing_key: dlq.as_str().into(),
            ..Default::default()
        })
        .await
        .unwrap();
        conn.publish_confirmed("", &dlq, true, Default::default(), "held".into())
            .await
            .unwrap();
        run(vec!["topology".into(), "check".into(), q.clone()])
            .await
            .assert_code(1);
        // As the guide says (dead_letters): behind a message the probe waits, counted in
        // the depth, until it reaches the head, where it is dropped unseen.
        assert_eq!(queue_depth(&conn, &dlq).await, 2, "the probe waits behind the message");
        let listing = t.acemq(&["dlq", "list", &q, "--json"]).await;
        let messages = listing.assert_code(0).json()["messages"].as_array().unwrap().clone();
        assert_eq!(messages.len(), 1, "{listing:?}");
        assert_eq!(messages[0]["body"], "held");
        until_depth(&conn, &dlq, 1).await;

        let mut all = vec![q.clone(), dlq, parked];
        all.extend(rungs);
        delete_queues(&conn, &all).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn the_url_is_required_and_the_password_is_never_printed() {
    on_every_target(|t| async move {
        // No URL at all: a usage error.
        let run = acemq_with(None, &["dlq", "list", "orders"]).await;
        run.assert_code(2);
        assert!(
            run.stderr.contains("no broker URL: pass --url or set AMQP_URL"),
            "{run:?}"
        );

        // A wrong password, through --url: refused (exit code 3), and not printed.
        let secret = "Wr0ng-pa55word-do-not-print";
        let wrong = t.url.replacen(":guest@", &format!(":{secret}@"), 1);
        assert!(wrong.contains(secret), "{wrong}");
        let run = acemq_with(None, &["--url", &wrong, "topology", "check", "orders"]).await;
        run.assert_code(3);
        assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret), "{run:?}");
        assert!(run.stderr.contains("cannot connect to amqp://guest:***@"), "{run:?}");

        // A malformed URL that quotes its password.
        let bad = format!("amqp://guest:{secret}%zz@127.0.0.1:1/");
        let run = acemq_with(Some(&bad), &["dlq", "list", "orders"]).await;
        run.assert_code(2);
        assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret), "{run:?}");

        // Help and usage errors never show the URL from the environment.
        let run = t.acemq(&["--help"]).await;
        run.assert_code(0);
        assert!(!run.stdout.contains("guest:"), "{run:?}");
        t.acemq(&["dlq", "lsit", "orders"]).await.assert_code(2);
    });
}

// ---- the dead-letter workflow ----

/// Seconds since the epoch, `ago` back.
fn secs_ago(ago: Duration) -> u64 {
    (std::time::SystemTime::now() - ago)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A set-aside message as a consumer writes one, put straight into `queue`:
/// message-id `id`, `error` (none: no `x-acemq-error`), first seen `age`
/// ago, first published to `exchange`/`key`, and `extra` headers.
#[allow(clippy::too_many_arguments)]
async fn put_aside(
    conn: &Conn,
    queue: &str,
    id: &str,
    error: Option<&str>,
    age: Duration,
    (exchange, key): (&str, &str),
    extra: &[(&str, FieldValue)],
    body: &[u8],
) {
    let mut headers = FieldTable::new();
    headers.push("x-acemq-attempt", FieldValue::I32(3));
    headers.push("x-acemq-first-seen", FieldValue::Timestamp(secs_ago(age)));
    if let Some(error) = error {
        headers.push("x-acemq-error", FieldValue::from(error));
    }
    headers.push("x-acemq-original-exchange", FieldValue::from(exchange));
    headers.push("x-acemq-original-routing-key", FieldValue::from(key));
    for (k, v) in extra {
        headers.push(*k, v.clone());
    }
    let props = acemq_codec::BasicProperties {
        message_id: Some(acemq_codec::ShortString::from_bytes(bytes::Bytes::copy_from_slice(id.as_bytes())).unwrap()),
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        headers: Some(headers),
        ..Default::default()
    };
    conn.publish_confirmed("", queue, true, props, bytes::Bytes::copy_from_slice(body))
        .await
        .unwrap_or_else(|e| panic!("putting {id} into {queue}: {e}"));
}

/// The message-ids `acemq dlq list QUEUE ARGS --json` lists, in order.
async fn listed(t: &Target, q: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec!["dlq", "list", q, "--json"];
    all.extend_from_slice(args);
    let run = t.acemq(&all).await;
    run.assert_code(0).json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_string())
        .collect()
}

/// A set-aside message to put: its error, age, first destination and `region` header.
type Aside<'a> = (Option<&'a str>, Duration, (&'a str, &'a str), &'a str);

/// `ids` at these places.
fn pick(ids: &[String], at: &[usize]) -> Vec<String> {
    at.iter().map(|&i| ids[i].clone()).collect()
}

/// A classic queue that takes at most `max` messages and refuses the next
/// publish (`x-overflow=reject-publish`: the broker nacks it).
async fn bounded_queue(conn: &Conn, name: &str, max: i32) {
    let ch = conn.consuming_connection().channel().await.unwrap();
    let mut args = FieldTable::new();
    args.push("x-max-length", FieldValue::I32(max));
    args.push("x-overflow", FieldValue::from("reject-publish"));
    ch.queue_declare(QueueDeclare {
        queue: name.into(),
        durable: true,
        arguments: args,
        ..Default::default()
    })
    .await
    .unwrap();
    let _ = ch.close().await;
}

#[test]
fn dlq_summary_groups_failures_and_the_filters_select_what_delete_and_move_take() {
    on_every_target(|t| async move {
        let conn = t.conn().await;
        let q = unique("cli-flow");
        Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
        let dlq = format!("{q}.dlq");
        let ids: Vec<String> = (0..6).map(|i| format!("{q}-m{i}")).collect();
        let hour = Duration::from_secs(3600);
        let region = |r: &str| [("region", FieldValue::from(r))];
        let uuid_a = "3f2a0c7e-1b2c-4d5e-8f90-a1b2c3d4e5f6";
        let uuid_b = "0a1b2c3d-4e5f-4a6b-8c7d-9e8f7a6b5c4d";
        let to = ("orders", "order.placed");
        let timeout_a = format!("timeout after 3000 ms talking to {uuid_a}");
        let timeout_b = format!("timeout after 5000 ms talking to {uuid_b}");
        let messages: [Aside; 6] = [
            (Some("fatal: card declined for order 17"), 48 * hour, to, "eu"),
            (
                Some(timeout_a.as_str()),
                Duration::ZERO,
                ("billing", "invoice.due"),
                "us",
            ),
            (Some("fatal: card declined for order 18"), 240 * hour, to, "us"),
            (Some("fatal: card declined for order 19"), hour / 2, to, "eu"),
            (Some(timeout_b.as_str()), 3 * hour, ("billing", "invoice.due"), "us"),
            (None, Duration::ZERO, to, "ap"),
        ];
        for (i, (error, age, dest, r)) in messages.iter().enumerate() {
            put_aside(
                &conn,
                &dlq,
                &ids[i],
                *error,
                *age,
                *dest,
                &region(r),
                format!("{{\"n\":{i}}}").as_bytes(),
            )
            .await;
        }

        // summary: three failure groups, biggest first; destinations; ages.
        let run = t.acemq(&["dlq", "summary", &q, "--json"]).await;
        let s = run.assert_code(0).json();
        let groups = s["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 3, "{run:?}");
        assert_eq!(groups[0]["error"], "fatal: card declined for order <n>");
        assert_eq!(groups[0]["count"], 3);
        assert_eq!(groups[0]["message_ids"], serde_json::json!([ids[0], ids[2], ids[3]]));
        assert_eq!(groups[1]["error"], "timeout after <n> ms talking to <uuid>");
        assert_eq!(groups[1]["count"], 2);
        assert_eq!(groups[2]["error"], "(no error recorded)");
        let dests = s["destinations"].as_array().unwrap();
        assert_eq!(
            dests[0],
            serde_json::json!({"exchange": "orders", "routing_key": "order.placed", "count": 4})
        );
        assert_eq!(
            dests[1],
            serde_json::json!({"exchange": "billing", "routing_key": "invoice.due", "count": 2})
        );
        let ages: Vec<u64> = s["ages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["count"].as_u64().unwrap())
            .collect();
        assert_eq!(ages, [3, 1, 1, 1], "{run:?}");
        let run = t.acemq(&["dlq", "summary", &q]).await;
        run.assert_code(0);
        for expected in [
            format!("{dlq}: 6 messages"),
            "By error (--group N selects a group):".to_string(),
            "1      3      fatal: card declined for order <n>".to_string(),
            "4      orders/order.placed".to_string(),
            "1      7 days or more".to_string(),
        ] {
            assert!(run.stdout.contains(&expected), "no {expected:?} in {run:?}");
        }
        assert_eq!(queue_depth(&conn, &dlq).await, 6, "a summary consumes nothing");

        // The filters, alone and together; positions are places in the queue.
        assert_eq!(listed(&t, &q, &["--group", "1"]).await, pick(&ids, &[0, 2, 3]));
        let run = t.acemq(&["dlq", "list", &q, "--group", "1", "--json"]).await;
        let positions: Vec<u64> = run.json()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["position"].as_u64().unwrap())
            .collect();
        assert_eq!(positions, [1, 3, 4]);
        assert_eq!(listed(&t, &q, &["--group", "3"]).await, pick(&ids, &[5]));
        assert_eq!(
            listed(&t, &q, &["--error-contains", "timeout", "--older-than", "1h"]).await,
            pick(&ids, &[4])
        );
        assert_eq!(listed(&t, &q, &["--older-than", "1d"]).await, pick(&ids, &[0, 2]));
        assert_eq!(listed(&t, &q, &["--header", "region=eu"]).await, pick(&ids, &[0, 3]));
        assert_eq!(
            listed(
                &t,
                &q,
                &["--header", "region=us", "--header", "x-acemq-attempt=3", "--group", "1"]
            )
            .await,
            pick(&ids, &[2])
        );
        let run = t.acemq(&["dlq", "list", &q, "--group", "4"]).await;
        run.assert_code(2);
        assert!(run.stderr.contains("has 3 failure groups"), "{run:?}");
        let run = t.acemq(&["dlq", "list", &q, "--group", "1"]).await;
        run.assert_code(0);
        assert!(
            run.stdout.starts_with(&format!("{dlq}: 6 messages, 3 selected\n")),
            "{run:?}"
        );
        assert_eq!(queue_depth(&conn, &dlq).await, 6, "listings consume nothing");

        // replay of one group, dry: the others are not selected, nothing moves.
        let run = t
            .acemq(&["dlq", "replay", &q, "--group", "2", "--dry-run", "--json"])
            .await;
        let report = run.assert_code(0).json();
        assert_eq!(report["replayed"], 2, "{run:?}");
        assert_eq!(report["not_selected"], 4, "{run:?}");

        // delete: a selection is required; a dry run deletes nothing.
        let run = t.acemq(&["dlq", "delete", &q, "--yes"]).await;
        run.assert_code(2);
        assert!(run.stderr.contains("needs a filter"), "{run:?}");
        let run = t.acemq(&["dlq", "delete", &q, "--group", "2"]).await;
        run.assert_code(2);
        assert!(run.stderr.contains("--yes"), "{run:?}");
        let run = t.acemq(&["dlq", "delete", &q, "--group", "2", "--dry-run"]).await;
        run.assert_code(0);
        assert!(run.stdout.contains("2 of 6 messages examined"), "{run:?}");
        assert_eq!(queue_depth(&conn, &dlq).await, 6, "a dry run deletes nothing");
        // Group 2 goes; the rest stay, in their order.
        let run = t.acemq(&["dlq", "delete", &q, "--group", "2", "--yes"]).await;
        run.assert_code(0);
        assert!(
            run.stdout
                .contains(&format!("deleted 2 of 6 messages examined in {dlq} (4 left in place)")),
            "{run:?}"
        );
        assert_eq!(listed(&t, &q, &[]).await, pick(&ids, &[0, 2, 3, 5]));

        // move: to a queue that is not there, nothing is touched.
        let missing = unique("cli-nowhere");
        let run = t.acemq(&["dlq", "move", &q, "--to", &missing]).await;
        run.assert_code(1);
        assert!(run.stderr.contains(&format!("there is no queue {missing}")), "{run:?}");
        assert_eq!(queue_depth(&conn, &dlq).await, 4);
        // To a queue that takes one more message: the first selected moves,
        // the second cannot go there and stays in its place (exit code 1).
        let archive = unique("cli-archive");
        bounded_queue(&conn, &archive, 1).await;
        let run = t
            .acemq(&["dlq", "move", &q, "--to", &archive, "--header", "region=eu"])
            .await;
        run.assert_code(1);
        assert!(
            run.stdout
                .contains(&format!("moved 1 of 4 messages examined in {dlq} to {archive}")),
            "{run:?}"
        );
        assert!(run.stdout.contains("1 message could not be moved"), "{run:?}");
        assert!(run.stdout.contains(&format!("  {}: ", ids[3])), "{run:?}");
        assert_eq!(listed(&t, &q, &[]).await, pick(&ids, &[2, 3, 5]));
        // The moved message is unchanged: body, properties, headers.
        let ch = conn.consuming_connection().channel().await.unwrap();
        let moved = ch.basic_get(&archive, true).await.unwrap().expect("the moved message");
        assert_eq!(&moved.body[..], b"{\"n\":0}");
        let props = moved.properties.as_ref().unwrap();
        assert_eq!(props.message_id.as_ref().unwrap().as_str(), Some(ids[0].as_str()));
        let headers = props.headers.as_ref().unwrap();
        assert_eq!(headers.get("region").and_then(FieldValue::as_str), Some("eu"));
        assert_eq!(headers.get("x-acemq-attempt"), Some(&FieldValue::I32(3)));
        assert_eq!(
            headers.get("x-acemq-error").and_then(FieldValue::as_str),
            Some("fatal: card declined for order 17")
        );
        let _ = ch.close().await;
        // Moving everything that is left (no filter), now that there is room.
        delete_queues(&conn, std::slice::from_ref(&archive)).await;
        bounded_queue(&conn, &archive, 10).await;
        let run = t.acemq(&["dlq", "move", &q, "--to", &archive, "--json"]).await;
        let report = run.assert_code(0).json();
        assert_eq!(report["done"], 3, "{run:?}");
        assert_eq!(queue_depth(&conn, &dlq).await, 0);
        assert_eq!(queue_depth(&conn, &archive).await, 3);

        delete_queues(&conn, &[q.clone(), dlq, format!("{q}.parked"), archive]).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn dlq_export_then_import_gives_back_every_byte_and_a_message_refused_stays_out() {
    on_every_target(|t| async move {
        let conn = t.conn().await;
        let q = unique("cli-export");
        Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
        let dlq = format!("{q}.dlq");
        // Headers of every type RabbitMQ keeps, a nested table, an array,
        // a repeated name, bytes that are not UTF-8, and every property.
        let mut nested = FieldTable::new();
        nested.push("deep", FieldValue::I64(-7));
        let mut headers = FieldTable::new();
        headers.push("t", FieldValue::Bool(false));
        headers.push("b", FieldValue::I8(-8));
        headers.push("s", FieldValue::I16(-1600));
        headers.push("I", FieldValue::I32(-320_000));
        headers.push("l", FieldValue::I64(i64::MIN));
        headers.push("f", FieldValue::F32(1.5));
        headers.push("d", FieldValue::F64(-2.25e300));
        headers.push(
            "D",
            FieldValue::Decimal(acemq_codec::Decimal {
                scale: 3,
                value: 12_345,
            }),
        );
        headers.push("S", FieldValue::LongString(vec![0xff, 0xfe, b'x'].into()));
        headers.push(
            "A",
            FieldValue::Array(acemq_codec::FieldArray(vec![
                FieldValue::I32(1),
                FieldValue::from("two"),
            ])),
        );
        headers.push("T", FieldValue::Timestamp(1_700_000_000));
        headers.push("F", FieldValue::Table(nested));
        headers.push("V", FieldValue::Void);
        headers.push("x", FieldValue::ByteArray(bytes::Bytes::from_static(b"\x00\x01\xff")));
        headers.push(
            "x-acemq-error",
            FieldValue::from("fatal: \u{1b}]52;c;ZXZpbA==\u{7} declined"),
        );
        let rich = acemq_codec::BasicProperties {
            content_type: Some("application/octet-stream".into()),
            content_encoding: Some("identity".into()),
            headers: Some(headers),
            delivery_mode: Some(2),
            priority: Some(4),
            correlation_id: Some("corr-1".into()),
            reply_to: Some("replies".into()),
            expiration: Some("86400000".into()),
            message_id: Some(format!("{q}-rich").as_str().into()),
            timestamp: Some(1_700_000_001),
            kind: Some("order.placed".into()),
            app_id: Some("shop".into()),
            ..Default::default()
        };
        let body: Vec<u8> = (0..=255u8).chain([0x1b, b']', b'5', b'2', 0x07]).collect();
        conn.publish_confirmed("", &dlq, true, rich, bytes::Bytes::from(body.clone()))
            .await
            .unwrap();
        put_aside(
            &conn,
            &dlq,
            &format!("{q}-b"),
            Some("boom 1"),
            Duration::ZERO,
            ("x", "k"),
            &[],
            b"{}",
        )
        .await;
        put_aside(
            &conn,
            &dlq,
            &format!("{q}-c"),
            None,
            Duration::ZERO,
            ("x", "k"),
            &[],
            b"",
        )
        .await;
        let ch = conn.consuming_connection().channel().await.unwrap();
        let direct = ch.basic_get(&dlq, false).await.unwrap().expect("the first message");
        let wire_props = direct.properties.as_ref().unwrap().as_ref().clone();
        drop(direct);
        let _ = ch.close().await;
        until_depth(&conn, &dlq, 3).await;

        // export: a copy; the queue keeps every message.
        let first = t.acemq(&["dlq", "export", &q]).await;
        first.assert_code(0);
        let lines: Vec<Value> = first.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3, "{first:?}");
        assert!(first.stderr.contains("exported 3 of 3 messages examined"), "{first:?}");
        assert_eq!(lines[0]["format"], "acemq-dlq/1");
        let exported_body = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(lines[0]["body"].as_str().unwrap())
                .unwrap()
        };
        assert_eq!(exported_body, body, "the body, byte for byte");
        let header = |name: &str| {
            lines[0]["properties"]["headers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h[0] == name)
                .unwrap_or_else(|| panic!("no header {name} in {first:?}"))[1]
                .clone()
        };
        assert_eq!(header("b"), serde_json::json!({"b": -8}));
        assert_eq!(header("S"), serde_json::json!({"S": {"base64": "//54"}}));
        assert_eq!(header("f"), serde_json::json!({"f": "0x3fc00000"}));
        assert_eq!(header("A"), serde_json::json!({"A": [{"I": 1}, {"S": "two"}]}));
        assert_eq!(lines[0]["properties"]["priority"], 4);
        assert_eq!(
            queue_depth(&conn, &dlq).await,
            3,
            "export without --remove removes nothing"
        );

        // A filtered export with --remove takes out only what it wrote.
        let run = t
            .acemq(&["dlq", "export", &q, "--error-contains", "boom", "--remove"])
            .await;
        run.assert_code(0);
        assert_eq!(run.stdout.lines().count(), 1, "{run:?}");
        assert_eq!(run.stdout.lines().next().unwrap(), first.stdout.lines().nth(1).unwrap());
        assert_eq!(listed(&t, &q, &[]).await, [format!("{q}-rich"), format!("{q}-c")]);

        // Everything out, then back in from the first export: the same queue,
        // exported again, is the same file.
        let run = t.acemq(&["dlq", "export", &q, "--remove"]).await;
        run.assert_code(0);
        assert_eq!(queue_depth(&conn, &dlq).await, 0);
        let run = t
            .acemq_input(&["dlq", "import", &q], Some(first.stdout.clone().into_bytes()))
            .await;
        run.assert_code(0);
        assert!(
            run.stdout.contains(&format!("imported 3 messages into {dlq}")),
            "{run:?}"
        );
        let again = t.acemq(&["dlq", "export", &q]).await;
        again.assert_code(0);
        assert_eq!(again.stdout, first.stdout, "export -> import -> export changes nothing");
        // And on the wire: the properties decode to the same bytes.
        let ch = conn.consuming_connection().channel().await.unwrap();
        let back = ch.basic_get(&dlq, false).await.unwrap().expect("the imported message");
        let encode = |p: &acemq_codec::BasicProperties| {
            let mut buf = bytes::BytesMut::new();
            p.encode(&mut buf).unwrap();
            buf
        };
        assert_eq!(encode(back.properties.as_ref().unwrap()), encode(&wire_props));
        assert_eq!(&back.body[..], &body[..]);
        drop(back);
        let _ = ch.close().await;
        until_depth(&conn, &dlq, 3).await;

        // A file with a bad line imports nothing.
        let broken = format!("{}\nnot json\n", first.stdout.lines().next().unwrap());
        let run = t.acemq_input(&["dlq", "import", &q], Some(broken.into_bytes())).await;
        run.assert_code(1);
        assert!(run.stderr.contains("line 2: not JSON"), "{run:?}");
        assert_eq!(queue_depth(&conn, &dlq).await, 3);

        // An export whose reader went away: --remove removes nothing it
        // could not write, and says so (exit code 1).
        let url = t.cli_url.clone();
        let queue = q.clone();
        let (code, stderr) = step(
            "acemq dlq export --remove into a closed pipe",
            tokio::task::spawn_blocking(move || {
                let mut child = Command::new(acemq_binary())
                    .args(["dlq", "export", &queue, "--remove"])
                    .env("AMQP_URL", &url)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("acemq starts");
                drop(child.stdout.take());
                let (stderr, reader) = drain(child.stderr.take().unwrap());
                let status = wait_for(&mut child, RUN_LIMIT, "acemq dlq export into a closed pipe");
                let _ = reader.join();
                let stderr = stderr.lock().unwrap().clone();
                (status.code(), stderr)
            }),
        )
        .await
        .unwrap();
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("cannot write the export"), "{stderr}");
        assert_eq!(queue_depth(&conn, &dlq).await, 3, "nothing unwritten is removed");
        assert_eq!(
            listed(&t, &q, &[]).await,
            [format!("{q}-rich"), format!("{q}-b"), format!("{q}-c")],
            "in order"
        );

        // --limit examines the head only.
        let run = t.acemq(&["dlq", "export", &q, "--limit", "1"]).await;
        assert_eq!(
            run.assert_code(0).stdout,
            format!("{}\n", first.stdout.lines().next().unwrap())
        );

        // Into a set-aside queue that takes two: the third is refused, and
        // the import stops there (exit code 1).
        let q2 = unique("cli-import");
        bounded_queue(&conn, &format!("{q2}.dlq"), 2).await;
        let run = t
            .acemq_input(&["dlq", "import", &q2], Some(first.stdout.clone().into_bytes()))
            .await;
        run.assert_code(1);
        assert!(run.stderr.contains("message 3 of 3 was not imported"), "{run:?}");
        assert!(run.stderr.contains("2 imported before it"), "{run:?}");
        assert_eq!(queue_depth(&conn, &format!("{q2}.dlq")).await, 2);
        // Into a queue that is not there: nothing.
        let run = t
            .acemq_input(&["dlq", "import", &unique("cli-none")], Some(first.stdout.into_bytes()))
            .await;
        run.assert_code(1);
        assert!(run.stderr.contains("there is no queue"), "{run:?}");

        // delete --all takes every message, one by one.
        let run = t.acemq(&["dlq", "delete", &q, "--all", "--yes"]).await;
        run.assert_code(0);
        assert!(
            run.stdout
                .contains(&format!("deleted 3 of 3 messages examined in {dlq} (0 left in place)")),
            "{run:?}"
        );
        assert_eq!(queue_depth(&conn, &dlq).await, 0);

        delete_queues(&conn, &[q.clone(), dlq, format!("{q}.parked"), format!("{q2}.dlq")]).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn control_characters_are_escaped_in_text_and_exact_in_json() {
    on_every_target(|t| async move {
        let conn = t.conn().await;
        let q = unique("cli-hostile");
        Topology::new().queue(&q).dead_letters(&q).declare(&conn).await.unwrap();
        let dlq = format!("{q}.dlq");
        // OSC 52 (writes the clipboard), a clear screen, a C1 CSI, DEL, a
        // carriage return that would overwrite the line, a bidi override.
        let id = format!("{q}-\u{1b}]52;c;SGk=\u{7}");
        let error = "boom \u{1b}[2J\u{9b}31m\r\nspoofed \u{7f}\u{202e}";
        let body = "hello \u{1b}]52;c;ZXZpbA==\u{7} world";
        let evil_value = "v\u{1b}]0;title\u{7}";
        put_aside(
            &conn,
            &dlq,
            &id,
            Some(error),
            Duration::ZERO,
            ("x\u{1b}[1m", "k\u{9b}"),
            &[("x-\u{1b}[31mevil", FieldValue::from(evil_value))],
            body.as_bytes(),
        )
        .await;
        let hostile = ['\u{1b}', '\u{7}', '\u{9b}', '\u{7f}', '\u{202e}', '\r'];
        for args in [
            vec!["dlq", "list", q.as_str()],
            vec!["dlq", "show", q.as_str()],
            vec!["dlq", "summary", q.as_str()],
            vec!["dlq", "replay", q.as_str(), "--dry-run"],
            vec!["dlq", "delete", q.as_str(), "--error-contains", "boom", "--dry-run"],
            vec!["dlq", "show", q.as_str(), "no-such-id\u{1b}[2J"],
            // JSON too: exact, with what a terminal obeys written as \u escapes.
            vec!["dlq", "list", q.as_str(), "--json"],
            vec!["dlq", "show", q.as_str(), "--json"],
            vec!["dlq", "summary", q.as_str(), "--json"],
            vec!["dlq", "export", q.as_str()],
        ] {
            let run = t.acemq(&args).await;
            for c in hostile {
                assert!(
                    !run.stdout.contains(c) && !run.stderr.contains(c),
                    "{c:?} reached the terminal in {run:?}"
                );
            }
            let all = format!("{}{}", run.stdout, run.stderr);
            assert!(
                all.contains("\\x1b") || all.contains("\\u{1b}") || all.contains("\\u001b"),
                "escaped, not dropped: {run:?}"
            );
        }
        let shown = t.acemq(&["dlq", "show", &q]).await;
        for expected in [
            format!("message-id:      {q}-\\x1b]52;c;SGk=\\x07"),
            "error:           boom \\x1b[2J\\u{9b}31m\\r\\nspoofed \\x7f\\u{202e}".to_string(),
            "x-\\x1b[31mevil: \"v\\u{1b}]0;title\\u{7}\"".to_string(),
            "hello \\x1b]52;c;ZXZpbA==\\x07 world".to_string(),
        ] {
            assert!(shown.stdout.contains(&expected), "no {expected:?} in {shown:?}");
        }

        // JSON output is exact: it parses back to the producer's bytes.
        let listing = t.acemq(&["dlq", "list", &q, "--json"]).await.json();
        let m = &listing["messages"][0];
        assert_eq!(m["message_id"], id.as_str());
        assert_eq!(m["error"], error);
        assert_eq!(m["body"], body);
        assert_eq!(m["original_exchange"], "x\u{1b}[1m");
        assert_eq!(m["headers"]["x-\u{1b}[31mevil"], evil_value);
        let exported = t.acemq(&["dlq", "export", &q]).await;
        let line: Value = serde_json::from_str(exported.assert_code(0).stdout.trim()).unwrap();
        assert_eq!(line["message_id"], id.as_str());
        assert_eq!(line["properties"]["message_id"], id.as_str());
        assert_eq!(queue_depth(&conn, &dlq).await, 1);

        delete_queues(&conn, &[q.clone(), dlq, format!("{q}.parked")]).await;
        conn.close().await.unwrap();
    });
}

#[test]
fn exit_codes_tell_usage_differences_and_an_unreachable_broker_apart() {
    on_every_target(|t| async move {
        // A port nothing listens on: 3.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let nowhere = format!("amqp://guest:guest@127.0.0.1:{port}/");
        let run = acemq_with(Some(&nowhere), &["dlq", "list", "orders"]).await;
        run.assert_code(3);
        assert!(run.stderr.contains("cannot connect to"), "{run:?}");
        // A virtual host the user may not open (530 NOT_ALLOWED): 3.
        assert!(t.cli_url.ends_with('/'), "{}", t.cli_url);
        let vhost = format!("{}acemq-no-such-vhost", t.cli_url);
        let run = t
            .acemq_input(&["--url", &vhost, "topology", "check", "orders"], None)
            .await;
        run.assert_code(3);
        // Usage errors: 2 (a bad flag, a bad value, a duration past the clock).
        t.acemq(&["dlq", "list", "orders", "--no-such-flag"])
            .await
            .assert_code(2);
        t.acemq(&["dlq", "list", "orders", "--older-than", "soon"])
            .await
            .assert_code(2);
        let run = t
            .acemq(&["--timeout", "307445734561825861m", "dlq", "list", "orders"])
            .await;
        run.assert_code(2);
        assert!(run.stderr.contains("307445734561825861m"), "{run:?}");
        // No differences: 0; a difference: 1.
        let conn = t.conn().await;
        let q = unique("cli-codes");
        t.acemq(&["topology", "declare", &q]).await.assert_code(0);
        t.acemq(&["topology", "check", &q]).await.assert_code(0);
        delete_queues(&conn, &[format!("{q}.parked")]).await;
        t.acemq(&["topology", "check", &q]).await.assert_code(1);
        // The help lists the workflow and the codes.
        let help = t.acemq(&["--help"]).await;
        help.assert_code(0);
        for expected in [
            "acemq dlq summary orders",
            "acemq dlq export orders > orders-dlq.ndjson",
            "acemq dlq import orders < orders-dlq.ndjson",
            "3  the broker could not be reached or refused",
        ] {
            assert!(help.stdout.contains(expected), "no {expected:?} in {help:?}");
        }
        delete_queues(&conn, &[q.clone(), format!("{q}.dlq")]).await;
        conn.close().await.unwrap();
    });
}
