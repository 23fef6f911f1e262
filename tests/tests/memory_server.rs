//! The `acemq-memory` server binary, run as a child process
//! the way a service in another language would use it: it prints the port
//! it listens on, serves a whole session over TCP (the engine, then `Conn`,
//! `Publisher` and `consume`), and on SIGTERM or SIGINT closes every client
//! connection with 320 CONNECTION_FORCED and exits 0. A usage error exits 2.

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_codec::{BasicProperties, QueueDeclare};
use acemq_core::amqp::{CloseReason, Config, Confirmation, Connection};
use acemq_core::{consume, Ack, Conn, Message};
use acemq_tests::{step, unique};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

/// How long the server may take to print its address, and to exit once signalled.
const START_LIMIT: Duration = Duration::from_secs(30);
const EXIT_LIMIT: Duration = Duration::from_secs(10);

use acemq_tests::binaries::{acemq_memory as server_binary, wait_for as wait_blocking};

/// A running `acemq-memory` child process; killed if the test fails first.
struct Server {
    child: Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the binary on `127.0.0.1:0` and reads the port it prints.
    async fn start() -> Server {
        Server::start_with(&["--listen", "127.0.0.1:0"]).await
    }

    /// Starts the binary with `args` (a `--listen` with port 0 among them)
    /// and reads the port it prints.
    async fn start_with(args: &[&str]) -> Server {
        let binary = step("the acemq-memory binary", async {
            tokio::task::spawn_blocking(server_binary).await.unwrap()
        })
        .await;
        let mut child = Command::new(binary)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("acemq-memory starts");
        let stderr = drain(child.stderr.take().unwrap());
        let (first, line) = oneshot::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = first.send(lines.next());
            // Keep reading: a full pipe must never block the server.
            for _ in lines {}
        });
        let line = step(
            "the server's `listening on` line",
            tokio::time::timeout(START_LIMIT, line),
        )
        .await;
        let line = match line {
            Ok(Ok(Some(Ok(line)))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "acemq-memory printed no address ({other:?}); stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let addr = line
            .strip_prefix("acemq-memory: listening on ")
            .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("not the listening line: {line:?}"));
        assert_ne!(addr.port(), 0, "the real port is printed");
        Server { child, addr, stderr }
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/", self.addr.port())
    }

    /// The URL of `user` reaching the server at `ip`.
    fn url_as(&self, user: &str, password: &str, ip: IpAddr) -> String {
        format!("amqp://{user}:{password}@{}/", SocketAddr::new(ip, self.addr.port()))
    }

    /// The server process's peak resident memory (`VmHWM`), in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// Waits until stderr contains `text`, up to 5 s.
    async fn logged(&self, text: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            if self.stderr().contains(text) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// Sends `signal` (`TERM`, `INT`) with `kill`.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed: {status}");
    }

    /// The exit status, within [`EXIT_LIMIT`].
    async fn exited(&mut self) -> ExitStatus {
        let _label = acemq_tests::waiting_for("the server to exit");
        let deadline = tokio::time::Instant::now() + EXIT_LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "acemq-memory did not exit within {EXIT_LIMIT:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What it wrote on stderr so far.
    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// All it wrote on stderr, once it has exited.
    async fn final_stderr(&self) -> String {
        drained(&self.stderr).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Everything `pipe` says, collected by a thread (which holds the other
/// handle to it until the pipe ends).
fn drain(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    text
}

/// The text of [`drain`] once its pipe has ended (the process exited),
/// within a second.
async fn drained(text: &Arc<Mutex<String>>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while Arc::strong_count(text) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    text.lock().unwrap().clone()
}

/// How a connection open to the server ends at its shutdown: RabbitMQ's 320.
async fn assert_shutdown_close(conn: &Connection) {
    let reason = step(
        "the client connection to see the shutdown close",
        tokio::time::timeout(EXIT_LIMIT, conn.closed()),
    )
    .await
    .expect("the connection is closed by the shutdown");
    match reason {
        CloseReason::ByServer(refusal) => {
            assert_eq!(refusal.code, 320, "{refusal:?}");
            assert_eq!(
                refusal.text,
                "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
            );
        }
        other => panic!("not a broker close: {other:?}"),
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_whole_session_over_tcp_then_sigterm_closes_it_with_320_and_exits_0() {
    acemq_tests::deadline(async {
        let mut server = Server::start().await;
        let url = server.url();

        // The engine: declare, confirm, publish, get, ack.
        let conn = Connection::open(&url, Config::default()).await.unwrap();
        let product = conn.server_properties().get("product").and_then(|v| v.as_str());
        assert_eq!(product, Some("acemq-memory"));
        let ch = conn.channel().await.unwrap();
        ch.confirm_select().await.unwrap();
        let q = unique("memory-server");
        ch.queue_declare(QueueDeclare {
            queue: q.as_str().into(),
            durable: true,
            ..Default::default()
        })
        .await
        .unwrap();
        let confirm = ch
            .publish("", &q, true, BasicProperties::default(), "over tcp")
            .await
            .unwrap();
        assert_eq!(step("the publish's confirm", confirm).await.unwrap(), Confirmation::Ack);
        let got = ch.basic_get(&q, false).await.unwrap().expect("the message is there");
        assert_eq!(&got.body[..], b"over tcp");
        assert!(!got.redelivered);
        got.ack().unwrap();
        assert!(ch.basic_get(&q, false).await.unwrap().is_none(), "acked, gone");

        // The acemq API: Conn, Publisher, consume.
        let api = Conn::open(&url, acemq_core::Config::default()).await.unwrap();
        let orders = unique("memory-server-orders");
        api.consuming_connection()
            .channel()
            .await
            .unwrap()
            .queue_declare(QueueDeclare {
                queue: orders.as_str().into(),
                durable: true,
                ..Default::default()
            })
            .await
            .unwrap();
        let (seen, mut received) = mpsc::unbounded_channel();
        let consumer = consume(&api, &orders, move |m: Message<Order>| {
            let _ = seen.send((m.payload, m.envelope.attempt));
            async { Ack::accept() }
        })
        .await
        .unwrap();
        let publisher = api.publisher::<Order>("", &orders);
        for id in 1..=3 {
            publisher.send(&Order { id }).await.unwrap();
        }
        // Each delivery runs in its own task: handlers may see them in any order.
        let mut got = Vec::new();
        while got.len() < 3 {
            let next = step(
                format!("order {} of 3 at the consumer", got.len() + 1),
                tokio::time::timeout(Duration::from_secs(10), received.recv()),
            )
            .await
            .expect("delivered in time");
            got.push(next.expect("the consumer is running"));
        }
        got.sort_by_key(|(order, _)| order.id);
        assert_eq!(got, (1..=3).map(|id| (Order { id }, 1)).collect::<Vec<_>>());
        consumer.close().await.unwrap();
        api.close().await.unwrap();

        // SIGTERM: the open connection gets RabbitMQ's shutdown close, the process exits 0.
        server.signal("TERM");
        assert_shutdown_close(&conn).await;
        let status = server.exited().await;
        let stderr = server.final_stderr().await;
        assert_eq!(status.code(), Some(0), "{status}; stderr:\n{stderr}");
        assert!(stderr.contains("SIGTERM"), "the shutdown is logged:\n{stderr}");
        // Nothing listens any more.
        assert!(tokio::net::TcpStream::connect(server.addr).await.is_err());
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_closes_open_and_half_open_connections_and_exits_0() {
    acemq_tests::deadline(async {
        let mut server = Server::start().await;
        let url = server.url();
        let first = Connection::open(&url, Config::default()).await.unwrap();
        let second = Connection::open(&url, Config::default()).await.unwrap();
        let ch = second.channel().await.unwrap();
        let q = unique("memory-server-sigint");
        ch.queue_declare(QueueDeclare {
            queue: q.as_str().into(),
            exclusive: true,
            ..Default::default()
        })
        .await
        .unwrap();
        // A client that sent its protocol header and then nothing: mid-handshake.
        let mut raw = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut raw, b"AMQP\x00\x00\x09\x01")
            .await
            .unwrap();

        server.signal("INT");
        assert_shutdown_close(&first).await;
        assert_shutdown_close(&second).await;
        // The half-open one is dropped: after connection.start, end of stream.
        let mut rest = Vec::new();
        let ended = step(
            "the half-open connection to end",
            tokio::time::timeout(EXIT_LIMIT, raw.read_to_end(&mut rest)),
        )
        .await;
        assert!(ended.is_ok(), "the half-open socket is still open");
        let status = server.exited().await;
        let stderr = server.final_stderr().await;
        assert_eq!(status.code(), Some(0), "{status}; stderr:\n{stderr}");
        assert!(stderr.contains("SIGINT"), "the shutdown is logged:\n{stderr}");
    })
    .await
}

/// Runs the binary with `args` to its end; its status, stdout and stderr.
async fn run_to_end(args: &[&str]) -> (ExitStatus, String, String) {
    let binary = tokio::task::spawn_blocking(server_binary).await.unwrap();
    let mut child = Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acemq-memory starts");
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let what = format!("acemq-memory {}", args.join(" "));
    let status = step(what.clone(), async {
        tokio::task::spawn_blocking(move || wait_blocking(&mut child, EXIT_LIMIT, &what))
            .await
            .unwrap()
    })
    .await;
    (status, drained(&stdout).await, drained(&stderr).await)
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_errors_exit_2_with_a_message_and_help_exits_0() {
    acemq_tests::deadline(async {
        let (status, stdout, stderr) = run_to_end(&["--bogus"]).await;
        assert_eq!(status.code(), Some(2), "{status}");
        assert!(stderr.contains("unknown option '--bogus'"), "{stderr}");
        assert!(stderr.contains("--help"), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");

        let (status, _, stderr) = run_to_end(&["--listen"]).await;
        assert_eq!(status.code(), Some(2), "{status}");
        assert!(stderr.contains("--listen needs an address"), "{stderr}");

        let (status, stdout, _) = run_to_end(&["--help"]).await;
        assert_eq!(status.code(), Some(0), "{status}");
        assert!(stdout.contains("Usage: acemq-memory [--listen ADDR]"), "{stdout}");

        // An address that is taken: a clear error, not a usage error.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let (status, stdout, stderr) = run_to_end(&["--listen", &addr]).await;
        assert_eq!(status.code(), Some(1), "{status}");
        assert!(stderr.contains(&format!("cannot listen on {addr}")), "{stderr}");
        assert!(!stdout.contains("listening on"), "{stdout}");
    })
    .await
}

/// The first IPv4 address of this machine that is not loopback (from
/// `hostname -I`), to connect from "another host".
fn non_loopback_ip() -> IpAddr {
    let out = Command::new("hostname").arg("-I").output().expect("hostname -I runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback())
        .expect("this machine has a non-loopback address (hostname -I)")
}

/// The reply code and text a connection attempt was refused with.
async fn refused(url: &str) -> (u16, String) {
    match Connection::open(url, Config::default()).await {
        Ok(_) => panic!("{url} was not refused"),
        Err(err) => (
            err.reply_code().unwrap_or(0),
            err.refusal()
                .map(|r| r.text.to_string())
                .unwrap_or_else(|| err.to_string()),
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn guest_is_refused_from_a_remote_address_unless_allowed_and_listening_beyond_loopback_warns() {
    acemq_tests::deadline(async {
        let ip = non_loopback_ip();
        let exposed = Server::start_with(&["--listen", "0.0.0.0:0"]).await;
        assert!(
            exposed.logged("listening beyond loopback").await,
            "no warning: {}",
            exposed.stderr()
        );
        assert_eq!(
            refused(&exposed.url_as("guest", "guest", ip)).await,
            (
                403,
                "ACCESS_REFUSED - user 'guest' can only connect via localhost".to_owned()
            )
        );
        let local = Connection::open(&exposed.url(), Config::default()).await.unwrap();
        local.channel().await.unwrap();

        let allowed = Server::start_with(&["--listen", "0.0.0.0:0", "--allow-remote-guest"]).await;
        let remote = Connection::open(&allowed.url_as("guest", "guest", ip), Config::default())
            .await
            .unwrap();
        remote.channel().await.unwrap();

        let quiet = Server::start().await;
        Connection::open(&quiet.url(), Config::default()).await.unwrap();
        assert!(!quiet.stderr().contains("beyond loopback"), "{}", quiet.stderr());
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn users_given_with_user_log_in_from_anywhere_and_replace_guest() {
    acemq_tests::deadline(async {
        let ip = non_loopback_ip();
        let server = Server::start_with(&["--listen", "0.0.0.0:0", "--user", "app:s3:cret", "--user", "ops:pw"]).await;
        let app = Connection::open(&server.url_as("app", "s3:cret", ip), Config::default())
            .await
            .unwrap();
        app.channel().await.unwrap();
        let ops = Connection::open(
            &server.url_as("ops", "pw", "127.0.0.1".parse().unwrap()),
            Config::default(),
        )
        .await
        .unwrap();
        ops.channel().await.unwrap();
        let login_refused = (
            403,
            "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker \
             logfile."
                .to_owned(),
        );
        assert_eq!(refused(&server.url_as("app", "wrong", ip)).await, login_refused);
        assert_eq!(refused(&server.url()).await, login_refused, "guest is not a user now");
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn max_connections_refuses_the_open_past_the_limit_with_530() {
    acemq_tests::deadline(async {
        let server = Server::start_with(&["--listen", "127.0.0.1:0", "--max-connections", "2"]).await;
        let first = Connection::open(&server.url(), Config::default()).await.unwrap();
        let second = Connection::open(&server.url(), Config::default()).await.unwrap();
        assert_eq!(
            refused(&server.url()).await,
            (
                530,
                "NOT_ALLOWED - connection refused: node connection limit (2) is reached".to_owned()
            )
        );
        first.close().await.unwrap();
        let third = Connection::open(&server.url(), Config::default()).await.unwrap();
        third.channel().await.unwrap();
        second.channel().await.unwrap();
    })
    .await
}

/// The bytes of a client that logs in as guest and consumes `queue` with
/// no-ack, written at once: it never reads anything.
fn stalled_consumer_script(queue: &str) -> Vec<u8> {
    use acemq_codec::{
        encode_method, BasicConsume, ChannelOpen, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, Method,
        PROTOCOL_HEADER,
    };
    let mut out = bytes::BytesMut::new();
    out.extend_from_slice(&PROTOCOL_HEADER);
    let methods: [(u16, Method); 5] = [
        (
            0,
            ConnectionStartOk {
                mechanism: "PLAIN".into(),
                response: b"\0guest\0guest".as_slice().into(),
                locale: "en_US".into(),
                ..Default::default()
            }
            .into(),
        ),
        (
            0,
            ConnectionTuneOk {
                channel_max: 2047,
                frame_max: 131_072,
                heartbeat: 0,
            }
            .into(),
        ),
        (
            0,
            ConnectionOpen {
                virtual_host: "/".into(),
                ..Default::default()
            }
            .into(),
        ),
        (1, ChannelOpen::default().into()),
        (
            1,
            BasicConsume {
                queue: queue.into(),
                consumer_tag: "stalled".into(),
                no_ack: true,
                ..Default::default()
            }
            .into(),
        ),
    ];
    for (ch, m) in methods {
        encode_method(ch, &m, &mut out).unwrap();
    }
    out.to_vec()
}

/// A round trip on a queue of its own: declare, publish confirmed, get.
async fn round_trip(conn: &Connection) {
    let ch = conn.channel().await.unwrap();
    ch.confirm_select().await.unwrap();
    let q = acemq_tests::exclusive_queue(&ch).await;
    let confirm = ch
        .publish("", &q, true, BasicProperties::default(), "still here")
        .await
        .unwrap();
    assert_eq!(confirm.await.unwrap(), Confirmation::Ack);
    let got = ch.basic_get(&q, true).await.unwrap().expect("the message");
    assert_eq!(&got.body[..], b"still here");
    ch.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_that_stops_reading_while_1_gib_is_published_leaves_the_broker_bounded_and_others_working() {
    acemq_tests::deadline(async {
        use tokio::io::AsyncWriteExt;

        let server = Server::start().await;
        let setup = Connection::open(&server.url(), Config::default()).await.unwrap();
        let ch = setup.channel().await.unwrap();
        let q = unique("stalled");
        let mut arguments = acemq_codec::FieldTable::new();
        arguments.insert("x-max-length-bytes", acemq_codec::FieldValue::I64(64 << 20));
        ch.queue_declare(QueueDeclare {
            queue: q.as_str().into(),
            arguments,
            ..Default::default()
        })
        .await
        .unwrap();

        let mut stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        stalled.write_all(&stalled_consumer_script(&q)).await.unwrap();
        let passive = |ch: &acemq_core::amqp::Channel, q: &str| {
            let declare = QueueDeclare {
                queue: q.into(),
                passive: true,
                ..Default::default()
            };
            let ch = ch.clone();
            async move { ch.queue_declare(declare).await.unwrap().expect("declare-ok") }
        };
        let attached = tokio::time::Instant::now() + Duration::from_secs(10);
        while passive(&ch, &q).await.consumer_count == 0 {
            assert!(
                tokio::time::Instant::now() < attached,
                "the stalled consumer never attached"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let other = Connection::open(&server.url(), Config::default()).await.unwrap();
        let publisher = Connection::open(&server.url(), Config::default()).await.unwrap();
        let pch = publisher.channel().await.unwrap();
        pch.confirm_select().await.unwrap();
        let body = bytes::Bytes::from(vec![0x5Au8; 1 << 20]);
        let mut in_flight = std::collections::VecDeque::new();
        let started = std::time::Instant::now();
        for n in 1..=1024u32 {
            let confirm = pch
                .publish("", &q, false, BasicProperties::default(), body.clone())
                .await
                .unwrap();
            in_flight.push_back(confirm);
            if in_flight.len() > 16 {
                let confirm = in_flight.pop_front().unwrap();
                assert_eq!(step("a confirm", confirm).await.unwrap(), Confirmation::Ack);
            }
            if n % 256 == 0 {
                step(
                    "another client's round trip during the flood",
                    tokio::time::timeout(Duration::from_secs(10), round_trip(&other)),
                )
                .await
                .expect("another client is served within 10 s");
            }
        }
        for confirm in in_flight {
            assert_eq!(step("a confirm", confirm).await.unwrap(), Confirmation::Ack);
        }
        let took = started.elapsed();
        let peak_mib = server.peak_rss_kib() / 1024;
        let queued = passive(&ch, &q).await.message_count;
        eprintln!("1 GiB published in {took:?}; broker peak RSS {peak_mib} MiB; {queued} messages queued");
        assert!(
            peak_mib < 384,
            "the broker's peak memory reached {peak_mib} MiB while 1 GiB went to a consumer that does not read"
        );
        assert!(queued >= 32, "the messages stay queued (capped at 64 MiB): {queued}");
        round_trip(&other).await;
        drop(stalled);
    })
    .await
}
