//! The lifecycle of a service: several consumers beside an HTTP health
//! endpoint, waiting for SIGTERM (or Ctrl-C), then shutting down in order
//! within the time the container's orchestrator gives it.
//!
//! `cargo run --example service` runs against an in-process acemq-memory
//! broker and, as a demo, sends itself SIGTERM after a few seconds. With
//! `AMQP_URL=amqp://guest:guest@localhost:5672/` it runs against RabbitMQ
//! until it is signalled (`kill -TERM PID`, Ctrl-C), or for a few seconds
//! with `--demo`. `PORT` chooses the health endpoint's port (any free one
//! by default): `curl localhost:PORT/healthz`.
//!
//! # The arithmetic of a stop
//!
//! When Kubernetes stops a pod it sends SIGTERM, waits
//! `terminationGracePeriodSeconds` (30 s by default), then sends SIGKILL.
//! Docker's `docker stop` does the same with 10 s. Whatever the service has
//! not finished by then is cut off mid-work, so each step of the shutdown
//! gets a bound, and the bounds add up to less than the grace period:
//!
//! ```text
//!   HTTP_GRACE       2 s   requests already accepted finish
//! + DRAIN_TIMEOUT   15 s   consumers: cancel, running handlers finish and settle
//! + 3 × CLOSE_TIMEOUT      each consumer's channel, then the publishing and the
//!                  9 s     consuming connection wait for the broker's close-ok
//! = 26 s                   worst case, against a broker that stops answering
//!   STOP_TIMEOUT    30 s   SIGKILL: 4 s to spare for the last log lines
//! ```
//!
//! The consumers drain at the same time, so DRAIN_TIMEOUT counts once
//! however many there are. Under Docker's 10 s, DRAIN_TIMEOUT would be
//! about 4 s and CLOSE_TIMEOUT 1 s. The usual case takes far less: close
//! waits only as long as the handlers running at that moment.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_core::{consume, Ack, Config, Conn, Message, RetryPolicy, Topology};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long the orchestrator waits between SIGTERM and SIGKILL
/// (Kubernetes' default `terminationGracePeriodSeconds`).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long HTTP requests already accepted get to finish.
const HTTP_GRACE: Duration = Duration::from_secs(2);
/// How long each consumer lets its running handlers finish once `close`
/// begins (the default is 20 s; see the arithmetic above).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a channel or connection close waits for the broker's `close-ok`
/// (the engine's default is 10 s).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the demo runs before it sends itself SIGTERM.
const DEMO_RUN: Duration = Duration::from_secs(3);

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    id: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct EmailRequested {
    order: u64,
}

/// What the handlers did, for the summary at the end.
#[derive(Default)]
struct Counts {
    orders: AtomicU64,
    orders_retried: AtomicU64,
    emails: AtomicU64,
    /// Orders published (each with its email).
    published: AtomicU64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let say = move |what: &str| println!("service: +{:.2}s {what}", started.elapsed().as_secs_f64());

    // The signal handlers go in first: a SIGTERM that arrives before them
    // would kill the process at once, with nothing drained.
    let mut stop_signal = StopSignal::install()?;

    let url = std::env::var("AMQP_URL").ok();
    let demo = url.is_none() || std::env::args().any(|arg| arg == "--demo");
    let url = url.unwrap_or_else(|| "memory://service-example".to_string());

    let config = Config::default()
        .with_engine(acemq_core::amqp::Config::default().with_close_timeout(CLOSE_TIMEOUT))
        .with_on_recovery(move |event| println!("service: +{:.2}s recovery: {event}", started.elapsed().as_secs_f64()));
    let conn = Conn::open(&url, config).await?;
    say(&format!("connected to {}", url.rsplit('@').next().unwrap_or(&url)));

    // Retries wait 500 ms, then 1 s, in the process.
    let policy = RetryPolicy::exponential(3, Duration::from_millis(500), Duration::ZERO);
    Topology::new()
        .queue("service.orders")
        .dead_letters("service.orders")
        .queue("service.emails")
        .dead_letters("service.emails")
        .declare(&conn)
        .await?;

    // Two consumers, each with its own drain bound.
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    let orders = consume(&conn, "service.orders", move |m: Message<OrderPlaced>| {
        let seen = seen.clone();
        async move {
            // Every seventh order fails once: its retry waits in the process,
            // so some are waiting when the stop comes.
            if m.payload.id.is_multiple_of(7) && m.envelope.attempt == 1 {
                seen.orders_retried.fetch_add(1, Ordering::Relaxed);
                return Ack::retry("the stock service timed out");
            }
            tokio::time::sleep(Duration::from_millis(300)).await; // the work
            seen.orders.fetch_add(1, Ordering::Relaxed);
            Ack::accept()
        }
    })
    .prefetch(10)
    .retry_with(policy.clone())
    .drain_timeout(DRAIN_TIMEOUT)
    .await?;
    let seen = counts.clone();
    let emails = consume(&conn, "service.emails", move |_: Message<EmailRequested>| {
        let seen = seen.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await; // the work
            seen.emails.fetch_add(1, Ordering::Relaxed);
            Ack::accept()
        }
    })
    .prefetch(10)
    .retry_with(policy)
    .drain_timeout(DRAIN_TIMEOUT)
    .await?;
    say("consuming service.orders and service.emails");

    // The HTTP endpoint, and the service's own publishing (here, a stand-in
    // for what its HTTP requests would publish).
    let port = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(0);
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let address = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let http = tokio::spawn(serve(listener, conn.clone(), stop_rx.clone()));
    let producer = tokio::spawn(produce(conn.clone(), counts.clone(), stop_rx));
    say(&format!("health endpoint on http://{address}/healthz"));

    if demo {
        tokio::time::sleep(Duration::from_millis(500)).await;
        say(&format!("GET /healthz: {}", probe(address).await));
        tokio::spawn(async move {
            tokio::time::sleep(DEMO_RUN).await;
            // As an orchestrator would: SIGTERM to this process.
            let pid = std::process::id().to_string();
            let _ =
                tokio::task::spawn_blocking(move || std::process::Command::new("kill").args(["-TERM", &pid]).status())
                    .await;
        });
    }

    let which = stop_signal.wait().await;
    let stopping = Instant::now();
    say(&format!(
        "{which}: stopping (SIGKILL expected {STOP_TIMEOUT:?} from now)"
    ));

    // 1. Stop taking HTTP traffic: the listener closes (new connections
    //    are refused, so a load balancer moves on), requests already
    //    accepted get HTTP_GRACE. Then the service's own publishing stops:
    //    a send after `close` would fail with `Error::Closed`.
    stop_tx.send_replace(true);
    let _ = tokio::time::timeout(HTTP_GRACE, http).await;
    let _ = producer.await;
    say(&format!(
        "1. HTTP stopped (GET /healthz now: {}); publishing stopped",
        probe(address).await
    ));

    // 2. Close the connection. For every consumer at once, `close`:
    //    - cancels the subscription, so the broker sends no more;
    //    - hands back to the broker (requeued, in their places) the
    //      deliveries that arrived but never reached a handler: they are not
    //      run here, the next instance gets them;
    //    - lets the handlers already running finish and settles what they
    //      answer (an ack, a retry, a set-aside), up to DRAIN_TIMEOUT;
    //    - ends a retry waiting in the process at once: the message is
    //      republished with its attempt advanced, so its wait is not spent
    //      here and it is neither lost nor run twice;
    //    - cuts off a handler still running after DRAIN_TIMEOUT: its message
    //      stays unacknowledged and the broker redelivers it (marked
    //      redelivered, so its attempt counts), and that work may be done
    //      twice. Handlers should be idempotent on `Envelope::id` anyway.
    //    Then it closes the channels and both connections (CLOSE_TIMEOUT
    //    each). The outer timeout is a backstop below SIGKILL: it should
    //    never fire, and if it does, dropping the sockets has the same
    //    effect on the broker as SIGKILL would, with a log line first.
    let left = STOP_TIMEOUT.saturating_sub(stopping.elapsed() + Duration::from_secs(2));
    match tokio::time::timeout(left, conn.close()).await {
        Ok(Ok(())) => say("2. consumers drained, connection closed"),
        Ok(Err(err)) => say(&format!("2. closed, with an error: {err}")),
        Err(_) => {
            say("2. close did not finish before the backstop; exiting anyway");
            std::process::exit(1);
        }
    }
    // `close` has ended both consumers; these say how (an error they had
    // ended with before, or Ok).
    orders.close().await?;
    emails.close().await?;

    let published = counts.published.load(Ordering::Relaxed);
    let done = [
        counts.orders.load(Ordering::Relaxed),
        counts.emails.load(Ordering::Relaxed),
    ];
    say(&format!(
        "stopped in {:.2}s: {published} orders published with their emails; {} orders done ({} failed once and were retried), {} emails sent",
        stopping.elapsed().as_secs_f64(),
        done[0],
        counts.orders_retried.load(Ordering::Relaxed),
        done[1],
    ));
    if demo {
        // What the next instance will find: what was handed back, and the
        // retries cut short, still in their queues.
        let engine = acemq_core::amqp::Connection::open(&url, acemq_core::amqp::Config::default()).await?;
        let channel = engine.channel().await?;
        for (queue, done) in ["service.orders", "service.emails"].into_iter().zip(done) {
            let declared = channel
                .queue_declare(acemq_codec::QueueDeclare {
                    queue: queue.into(),
                    passive: true,
                    ..Default::default()
                })
                .await?;
            // `None` only with `no_wait`.
            let ready = declared.map_or(0, |ok| ok.message_count);
            say(&format!("left in {queue} for the next instance: {ready}"));
            // On the in-process broker, which this run alone has used,
            // every message is either done or still there: nothing lost,
            // nothing run twice.
            if url.starts_with("memory://") && done + u64::from(ready) != published {
                return Err(format!("{queue}: {done} done + {ready} left != {published} published").into());
            }
        }
        engine.close().await?;
    }
    Ok(())
}

/// SIGTERM (what orchestrators send) or Ctrl-C.
struct StopSignal {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignal {
    fn install() -> std::io::Result<StopSignal> {
        Ok(StopSignal {
            #[cfg(unix)]
            terminate: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        })
    }

    /// Waits for the first of them; which it was.
    async fn wait(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "Ctrl-C",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// Publishes an order (and its email) every 100 ms until told to stop.
async fn produce(conn: Conn, counts: Arc<Counts>, mut stop: watch::Receiver<bool>) {
    let orders = conn.publisher::<OrderPlaced>("", "service.orders").mandatory();
    let emails = conn.publisher::<EmailRequested>("", "service.emails").mandatory();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for id in 1.. {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            _ = tick.tick() => {}
        }
        let sent = async {
            orders.send(&OrderPlaced { id }).await?;
            emails.send(&EmailRequested { order: id }).await
        };
        match sent.await {
            Ok(()) => {
                counts.published.fetch_add(1, Ordering::Relaxed);
            }
            // A blocked broker, a recovery that took too long: a real
            // service would answer its HTTP request with 503 here.
            Err(err) => println!("service: publishing order {id} failed: {err}"),
        }
    }
}

/// Answers `GET /healthz` until `stop`; then drops the listener, so new
/// connections are refused, and waits for the requests already accepted.
async fn serve(listener: TcpListener, conn: Conn, mut stop: watch::Receiver<bool>) {
    let mut requests = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    requests.spawn(answer(stream, conn.clone()));
                }
            }
        }
    }
    drop(listener);
    while requests.join_next().await.is_some() {}
}

/// One request: 200 while both AMQP connections are up, 503 while they
/// recover. A request that does not arrive whole within a second, or is
/// larger than 8 KiB, gets no answer.
async fn answer(mut stream: TcpStream, conn: Conn) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    let read_head = async {
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => request.extend_from_slice(&buffer[..n]),
            }
        }
        true
    };
    if !matches!(tokio::time::timeout(Duration::from_secs(1), read_head).await, Ok(true)) {
        return;
    }
    let (status, body) = if !request.starts_with(b"GET /healthz ") {
        ("404 Not Found", "not found\n")
    } else if conn.is_connected() {
        ("200 OK", "ok\n")
    } else {
        ("503 Service Unavailable", "recovering\n")
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// `GET /healthz` on `address`: the status line, or why there is none.
async fn probe(address: std::net::SocketAddr) -> String {
    let attempt = async {
        let mut stream = TcpStream::connect(address).await?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response);
        Ok::<_, std::io::Error>(text.lines().next().unwrap_or_default().to_string())
    };
    match tokio::time::timeout(Duration::from_secs(2), attempt).await {
        Ok(Ok(status)) => status,
        Ok(Err(err)) => format!("no answer ({err})"),
        Err(_) => "no answer within 2 s".to_string(),
    }
}
