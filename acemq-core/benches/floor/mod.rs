//! The wire floor: the engine's two scenarios (confirmed publish with a
//! window of 1000, consume with acks at prefetch 1000, 256-byte bodies;
//! other windows and body sizes for the peers comparison's large bodies)
//! driven by the least client there can be. One thread, a blocking socket,
//! the publish frames encoded once and copied, frames found by their
//! envelope and only the few bytes that matter read (the ack's tag, the
//! delivery's tag), and every read answered by at most one write. What it
//! spends per message is what the kernel's loopback TCP and this process's
//! system calls cost on this machine: the part of "client CPU" no client can
//! go below, reported beside the engine's figures. [`Waiting::OnTokio`]
//! drives the same bytes through tokio's `TcpStream` instead: the least a
//! tokio client spends.
//!
//! Shared by the engine bench (`benches/engine.rs`) and the peers
//! comparison (`benches/peers`), which both include this file with
//! `#[path = ...] mod floor;`, together with the CPU accounting ([`Cpu`],
//! [`cpu_time`]) and the [`Figures`] both print. Not a bench target of its
//! own: cargo discovers `benches/*.rs` and `benches/*/main.rs` only.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use acemq_codec::{
    decode_frame, encode_content, encode_method, BasicConsume, BasicProperties, BasicPublish, BasicQos, ChannelOpen,
    ConfirmSelect, ConnectionClose, ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, FieldTable, Frame, Method,
    DEFAULT_FRAME_MAX, FRAME_BODY, FRAME_HEADER, FRAME_METHOD, PROTOCOL_HEADER,
};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use acemq_core::amqp::AmqpUrl;

/// CPU time of this process so far: the total from the scheduler (exact,
/// nanoseconds, every thread) and the user/system split from the tick-based
/// accounting (an estimate, in 10 ms ticks), how many times a thread
/// was put on a CPU (each one a wakeup and a context switch), and, in a
/// binary that counts them (see [`ALLOCATIONS`]), the heap allocations
/// made and their bytes.
#[derive(Clone, Copy)]
pub struct Cpu {
    pub total: Duration,
    pub user_ticks: u64,
    pub system_ticks: u64,
    pub runs: u64,
    pub allocations: u64,
    pub allocated: u64,
}

/// Where [`cpu_time`] reads the heap allocations so far (count, bytes):
/// set by a binary with a counting global allocator (the peers
/// comparison); unset, both read 0.
#[allow(dead_code)]
pub static ALLOCATIONS: std::sync::OnceLock<fn() -> (u64, u64)> = std::sync::OnceLock::new();

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            total: self.total.saturating_sub(earlier.total),
            user_ticks: self.user_ticks.saturating_sub(earlier.user_ticks),
            system_ticks: self.system_ticks.saturating_sub(earlier.system_ticks),
            runs: self.runs.saturating_sub(earlier.runs),
            allocations: self.allocations.saturating_sub(earlier.allocations),
            allocated: self.allocated.saturating_sub(earlier.allocated),
        }
    }
}

impl std::ops::Add for Cpu {
    type Output = Cpu;
    fn add(self, other: Cpu) -> Cpu {
        Cpu {
            total: self.total + other.total,
            user_ticks: self.user_ticks + other.user_ticks,
            system_ticks: self.system_ticks + other.system_ticks,
            runs: self.runs + other.runs,
            allocations: self.allocations + other.allocations,
            allocated: self.allocated + other.allocated,
        }
    }
}

pub fn cpu_time() -> Cpu {
    // Time on the CPU of every thread and how many times each ran, from
    // /proc/self/task/*/schedstat (run time in ns, wait time, run count).
    let (mut total_ns, mut runs) = (0u64, 0u64);
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            let fields: Vec<u64> = stat.split_whitespace().map(|n| n.parse().unwrap_or(0)).collect();
            total_ns += fields.first().copied().unwrap_or(0);
            runs += fields.get(2).copied().unwrap_or(0);
        }
    }
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let (allocations, allocated) = ALLOCATIONS.get().map_or((0, 0), |read| read());
    Cpu {
        total: Duration::from_nanos(total_ns),
        user_ticks: ticks(11),
        system_ticks: ticks(12),
        runs,
        allocations,
        allocated,
    }
}

pub struct Figures {
    pub name: &'static str,
    pub messages: u64,
    pub wall: Duration,
    pub cpu: Cpu,
}

impl Figures {
    /// What was measured from `t0` and `c0` until now.
    pub fn since(name: &'static str, messages: u64, t0: Instant, c0: Cpu) -> Self {
        Figures {
            name,
            messages,
            wall: t0.elapsed(),
            cpu: cpu_time() - c0,
        }
    }

    pub fn print(&self) {
        let rate = self.messages as f64 / self.wall.as_secs_f64();
        let total = self.cpu.total.as_secs_f64() * 1e6 / self.messages as f64;
        let ticks = (self.cpu.user_ticks + self.cpu.system_ticks).max(1) as f64;
        let system_share = self.cpu.system_ticks as f64 / ticks;
        let runs = self.cpu.runs as f64 * 1000.0 / self.messages as f64;
        println!(
            "{:<31} {:>7} msgs {:>7.0} msg/s {:>6.2} µs CPU/msg (~{:.0}% system) {:>5.0} runs/1k msgs  wall {:.2?}",
            self.name,
            self.messages,
            rate,
            total,
            system_share * 100.0,
            runs,
            self.wall
        );
    }
}

/// The class and method ids of basic.ack (60, 80), basic.nack (60, 120)
/// and basic.deliver (60, 60) as they start a method payload.
pub const BASIC_ACK: [u8; 4] = [0, 60, 0, 80];
pub const BASIC_NACK: [u8; 4] = [0, 60, 0, 120];
pub const BASIC_DELIVER: [u8; 4] = [0, 60, 0, 60];

/// How long one read waits for the broker before the run fails.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A plain blocking AMQP connection with one channel open.
pub struct Wire {
    sock: TcpStream,
    /// Bytes read and not yet taken: `buf[start..end]`.
    pub buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes to write at the next [`Wire::flush`].
    pub out: BytesMut,
    /// Reads spin on a non-blocking socket instead of sleeping in the
    /// kernel (see [`Wire::spin`]).
    spinning: bool,
}

impl Wire {
    /// Connects to the first host of `url` as its user, on its vhost, and
    /// opens channel 1.
    pub fn open(url: &AmqpUrl) -> io::Result<Wire> {
        let (host, port) = url.hosts.first().ok_or_else(|| io::Error::other("no host"))?;
        let sock = TcpStream::connect((host.as_str(), *port))?;
        sock.set_nodelay(true)?;
        // A stalled broker fails the run with a timed-out read rather than
        // hanging it.
        sock.set_read_timeout(Some(READ_TIMEOUT))?;
        let mut wire = Wire {
            sock,
            buf: vec![0; 1 << 20],
            start: 0,
            end: 0,
            out: BytesMut::with_capacity(1 << 20),
            spinning: false,
        };
        wire.sock.write_all(&PROTOCOL_HEADER)?;
        wire.expect(|m| matches!(m, Method::ConnectionStart(_)))?;
        wire.send(
            0,
            ConnectionStartOk {
                client_properties: FieldTable::new(),
                mechanism: "PLAIN".into(),
                response: format!("\0{}\0{}", url.username, url.password.expose()).into(),
                locale: "en_US".into(),
            },
        )?;
        let tune = match wire.expect(|m| matches!(m, Method::ConnectionTune(_)))? {
            Method::ConnectionTune(tune) => tune,
            _ => unreachable!(),
        };
        wire.send(
            0,
            ConnectionTuneOk {
                channel_max: tune.channel_max,
                frame_max: DEFAULT_FRAME_MAX,
                heartbeat: 0,
            },
        )?;
        wire.send(
            0,
            ConnectionOpen {
                virtual_host: url.vhost.as_str().into(),
                ..Default::default()
            },
        )?;
        wire.expect(|m| matches!(m, Method::ConnectionOpenOk(_)))?;
        wire.send(1, ChannelOpen::default())?;
        wire.expect(|m| matches!(m, Method::ChannelOpenOk(_)))?;
        Ok(wire)
    }

    pub fn send(&mut self, channel: u16, method: impl Into<Method>) -> io::Result<()> {
        encode_method(channel, &method.into(), &mut self.out).map_err(io::Error::other)?;
        self.flush()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        write_all(&mut self.sock, &self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Writes `bytes` from where they are, [`Wire::out`] left alone (on
    /// the blocking socket, or through `stream`; see [`Wire::waits`]).
    pub async fn write_by(&mut self, bytes: &[u8], stream: &mut Option<tokio::net::TcpStream>) -> io::Result<()> {
        let Some(stream) = stream else {
            return write_all(&mut self.sock, bytes);
        };
        tokio::time::timeout(READ_TIMEOUT, stream.write_all(bytes))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
    }

    /// Reads from now on retry a non-blocking socket until bytes come
    /// (`true`), keeping the CPU busy, instead of sleeping in the kernel
    /// until they do: what a client that never lets its thread sleep gets.
    /// (Only the peers comparison's latency rows spin.)
    #[allow(dead_code)]
    pub fn spin(&mut self, on: bool) -> io::Result<()> {
        self.sock.set_nonblocking(on)?;
        self.spinning = on;
        Ok(())
    }

    /// Moves what is left to the front of the buffer when its free end is
    /// near.
    fn compact(&mut self) {
        if self.buf.len() - self.end < 256 * 1024 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// One read into the free end of the buffer (moving what is left to
    /// the front first when the end is near).
    pub fn read_some(&mut self) -> io::Result<()> {
        self.compact();
        let deadline = Instant::now() + READ_TIMEOUT;
        let n = loop {
            match self.sock.read(&mut self.buf[self.end..]) {
                Err(err) if self.spinning && err.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    std::hint::spin_loop();
                }
                read => break read?,
            }
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.end += n;
        Ok(())
    }

    /// What [`Wire::flush_by`] and [`Wire::read_by`] wait through: `None`
    /// for the blocking socket, else a tokio stream of the same connection
    /// (a second descriptor, made non-blocking, as the first then is too,
    /// until [`Wire::close_from`]) registered with the runtime's I/O
    /// driver.
    pub fn waits(&self, waiting: Waiting) -> io::Result<Option<tokio::net::TcpStream>> {
        if waiting == Waiting::Blocking {
            return Ok(None);
        }
        let sock = self.sock.try_clone()?;
        sock.set_nonblocking(true)?;
        tokio::net::TcpStream::from_std(sock).map(Some)
    }

    /// [`Wire::close`], blocking again after [`Wire::waits`].
    pub fn close_from(self, stream: Option<tokio::net::TcpStream>) -> io::Result<()> {
        if let Some(stream) = stream {
            drop(stream);
            self.sock.set_nonblocking(false)?;
        }
        self.close()
    }

    /// [`Wire::flush`], or the same through `stream`.
    pub async fn flush_by(&mut self, stream: &mut Option<tokio::net::TcpStream>) -> io::Result<()> {
        let Some(stream) = stream else {
            return self.flush();
        };
        tokio::time::timeout(READ_TIMEOUT, stream.write_all(&self.out))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        self.out.clear();
        Ok(())
    }

    /// [`Wire::read_some`] (after [`pause`]), or the same through `stream`.
    pub async fn read_by(&mut self, stream: &mut Option<tokio::net::TcpStream>) -> io::Result<()> {
        let Some(stream) = stream else {
            pause();
            return self.read_some();
        };
        self.compact();
        let n = tokio::time::timeout(READ_TIMEOUT, stream.read(&mut self.buf[self.end..]))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.end += n;
        Ok(())
    }

    /// The next whole frame as (type, payload range), if buffered.
    pub fn next_frame(&mut self) -> Option<(u8, usize, usize)> {
        let head = self
            .buf
            .get(self.start..self.start + 7)
            .filter(|_| self.start + 7 <= self.end)?;
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        if self.start + size + 8 > self.end {
            return None;
        }
        let frame = (head[0], self.start + 7, self.start + 7 + size);
        self.start += size + 8;
        Some(frame)
    }

    /// Reads frames until a method `wanted` accepts, decoded in full
    /// (the handshake and replies; not timed).
    pub fn expect(&mut self, wanted: impl Fn(&Method) -> bool) -> io::Result<Method> {
        loop {
            while let Some((_, from, to)) = self.next_frame() {
                let frame = Bytes::copy_from_slice(&self.buf[from - 7..to + 1]);
                let (frame, _) = decode_frame(&frame, 0).map_err(io::Error::other)?;
                if let Frame::Method(_, method) = frame {
                    if wanted(&method) {
                        return Ok(method);
                    }
                    if matches!(method, Method::ConnectionClose(_) | Method::ChannelClose(_)) {
                        return Err(io::Error::other(format!("closed by the broker: {method:?}")));
                    }
                }
            }
            self.read_some()?;
        }
    }

    pub fn close(mut self) -> io::Result<()> {
        self.send(
            0,
            ConnectionClose {
                reply_code: 200,
                reply_text: "bye".into(),
                ..Default::default()
            },
        )?;
        self.expect(|m| matches!(m, Method::ConnectionCloseOk(_)))?;
        Ok(())
    }
}

/// Writes all of `bytes` to `sock` (spinning while a non-blocking one is
/// full).
fn write_all(sock: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        match sock.write(&bytes[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// `ACEMQ_FLOOR_PAUSE_US=N` waits N µs before every read, so that each
/// read finds more: how far the floor falls when a client trades that
/// much latency for fewer, larger system calls.
fn pause() {
    static PAUSE: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    let pause = PAUSE.get_or_init(|| {
        std::env::var("ACEMQ_FLOOR_PAUSE_US")
            .ok()
            .and_then(|us| us.parse().ok())
            .map(std::time::Duration::from_micros)
    });
    if let Some(pause) = pause {
        std::thread::sleep(*pause);
    }
}

/// `ACEMQ_FLOOR_ACK_EVERY=N` holds the consume's ack back until it covers
/// more than N deliveries (0, the default: one ack per read): fewer writes,
/// with the prefetch credit returned later but no delivery delayed.
fn ack_every() -> u64 {
    static EVERY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *EVERY.get_or_init(|| {
        std::env::var("ACEMQ_FLOOR_ACK_EVERY")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    })
}

pub fn tag_at(payload: &[u8], at: usize) -> u64 {
    let mut tag = [0; 8];
    tag.copy_from_slice(&payload[at..at + 8]);
    u64::from_be_bytes(tag)
}

/// How a floor waits for its socket.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Waiting {
    /// In the kernel: a blocking `read` (and `write`).
    Blocking,
    /// Through tokio's I/O driver: the same bytes, reads and writes on a
    /// non-blocking socket (tokio's `TcpStream`), an `await` wherever the
    /// blocking floor would block, as a tokio client's driver waits. What
    /// it spends beyond the blocking floor in the same run is what waiting
    /// on a reactor (`epoll`) costs here, before any work of a client's
    /// own.
    OnTokio,
}

/// `messages` confirmed publishes of 256-byte bodies with `props` to
/// `queue`, at most `window` unconfirmed. Blocking, the future is ready
/// the first time it is polled (it blocks its thread meanwhile).
pub async fn publish(
    addr: &AmqpUrl,
    queue: &str,
    messages: u64,
    window: u64,
    props: BasicProperties,
    name: &'static str,
    waiting: Waiting,
) -> io::Result<Figures> {
    publish_body(addr, queue, messages, window, props, 256, name, waiting).await
}

/// Bodies from this size up are written from the bytes prepared once, a
/// message a write, rather than copied into the write buffer to go out
/// together with others: copying them would cost more than the system
/// call it saves.
const WRITE_IN_PLACE: usize = 16 * 1024;

/// [`publish`] with bodies of `body` bytes (split at the frame size the
/// floor negotiates, [`DEFAULT_FRAME_MAX`]).
#[allow(clippy::too_many_arguments)]
pub async fn publish_body(
    addr: &AmqpUrl,
    queue: &str,
    messages: u64,
    window: u64,
    props: BasicProperties,
    body: usize,
    name: &'static str,
    waiting: Waiting,
) -> io::Result<Figures> {
    let mut wire = Wire::open(addr)?;
    let one = confirm_mode(&mut wire, queue, &props, body)?;
    let mut stream = wire.waits(waiting)?;
    let (mut published, mut confirmed) = (0u64, 0u64);
    let (t0, c0) = (Instant::now(), cpu_time());
    while confirmed < messages {
        if body >= WRITE_IN_PLACE {
            let room = (window - (published - confirmed)).min(messages - published);
            for _ in 0..room {
                wire.write_by(&one, &mut stream).await?;
            }
            published += room;
        } else {
            published += queue_publishes(&mut wire, &one, window, messages, published, confirmed);
            wire.flush_by(&mut stream).await?;
        }
        wire.read_by(&mut stream).await?;
        confirmed = take_confirms(&mut wire, confirmed)?;
    }
    let figures = Figures::since(name, messages, t0, c0);
    wire.close_from(stream)?;
    Ok(figures)
}

/// Puts channel 1 in confirm mode and encodes the one message both
/// publishes copy.
fn confirm_mode(wire: &mut Wire, queue: &str, props: &BasicProperties, body: usize) -> io::Result<BytesMut> {
    wire.send(1, ConfirmSelect::default())?;
    wire.expect(|m| matches!(m, Method::ConfirmSelectOk(_)))?;
    let publish = BasicPublish {
        routing_key: queue.into(),
        ..Default::default()
    };
    let mut one = BytesMut::new();
    encode_content(
        1,
        &publish.into(),
        props,
        &vec![b'x'; body],
        DEFAULT_FRAME_MAX,
        &mut one,
    )
    .map_err(io::Error::other)?;
    Ok(one)
}

/// Queues as many copies of `one` as the window has room for; returns
/// how many.
fn queue_publishes(wire: &mut Wire, one: &[u8], window: u64, messages: u64, published: u64, confirmed: u64) -> u64 {
    let room = (window - (published - confirmed)).min(messages - published);
    for _ in 0..room {
        wire.out.extend_from_slice(one);
    }
    room
}

/// Takes the buffered frames; returns the highest tag acked so far.
fn take_confirms(wire: &mut Wire, mut confirmed: u64) -> io::Result<u64> {
    while let Some((kind, from, to)) = wire.next_frame() {
        let payload = &wire.buf[from..to];
        if kind == FRAME_METHOD && payload.starts_with(&BASIC_ACK) {
            // Confirms on one queue come in order: the highest tag
            // acked, alone or with `multiple`, covers all before it.
            confirmed = confirmed.max(tag_at(payload, 4));
        } else if kind == FRAME_METHOD && payload.starts_with(&BASIC_NACK) {
            return Err(io::Error::other("nacked"));
        }
    }
    Ok(confirmed)
}

/// Consumes `messages` from `queue` at prefetch `prefetch` (bodies of
/// any size, in one frame or several), answering
/// each read with one `basic.ack` with `multiple` for all it brought
/// (or for more; see [`ack_every`]). Blocking, as [`publish`].
pub async fn consume(
    addr: &AmqpUrl,
    queue: &str,
    messages: u64,
    prefetch: u16,
    name: &'static str,
    waiting: Waiting,
) -> io::Result<Figures> {
    let mut wire = Wire::open(addr)?;
    let (t0, c0) = (Instant::now(), cpu_time());
    start_consuming(&mut wire, queue, prefetch)?;
    let mut stream = wire.waits(waiting)?;
    let mut taken = Taken::default();
    while taken.received < messages {
        if taken.take(&mut wire, messages)? {
            wire.flush_by(&mut stream).await?;
        }
        if taken.received < messages {
            wire.read_by(&mut stream).await?;
        }
    }
    let figures = Figures::since(name, messages, t0, c0);
    wire.close_from(stream)?;
    Ok(figures)
}

/// `basic.qos` and `basic.consume` on channel 1.
fn start_consuming(wire: &mut Wire, queue: &str, prefetch: u16) -> io::Result<()> {
    wire.send(
        1,
        BasicQos {
            prefetch_count: prefetch,
            ..Default::default()
        },
    )?;
    wire.expect(|m| matches!(m, Method::BasicQosOk(_)))?;
    wire.send(
        1,
        BasicConsume {
            queue: queue.into(),
            ..Default::default()
        },
    )?;
    wire.expect(|m| matches!(m, Method::BasicConsumeOk(_)))?;
    Ok(())
}

/// What a consume has taken and acked so far.
#[derive(Default)]
struct Taken {
    /// Messages whose body has come whole.
    received: u64,
    /// Bytes of the current message's body still to come.
    body_left: u64,
    last_tag: u64,
    acked_tag: u64,
}

impl Taken {
    /// Takes the buffered deliveries and queues the ack that is due, if
    /// one is (`true`: write it).
    fn take(&mut self, wire: &mut Wire, messages: u64) -> io::Result<bool> {
        while let Some((kind, from, to)) = wire.next_frame() {
            let payload = &wire.buf[from..to];
            if kind == FRAME_METHOD && payload.starts_with(&BASIC_DELIVER) {
                // class, method, then the consumer tag as a shortstr.
                let tag_len = usize::from(payload[4]);
                self.last_tag = tag_at(payload, 5 + tag_len);
            } else if kind == FRAME_HEADER {
                // class, weight, then the body size.
                self.body_left = tag_at(payload, 4);
                self.received += u64::from(self.body_left == 0);
            } else if kind == FRAME_BODY {
                // A body may come in several frames: the message is in
                // when the last of its bytes is.
                self.body_left = self.body_left.saturating_sub(payload.len() as u64);
                self.received += u64::from(self.body_left == 0);
            }
        }
        let due = self.last_tag > self.acked_tag + ack_every()
            || (self.received >= messages && self.last_tag > self.acked_tag);
        if !due {
            return Ok(false);
        }
        let ack = acemq_codec::BasicAck {
            delivery_tag: self.last_tag,
            multiple: true,
        };
        encode_method(1, &ack.into(), &mut wire.out).map_err(io::Error::other)?;
        self.acked_tag = self.last_tag;
        Ok(true)
    }
}
