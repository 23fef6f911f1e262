//! The tokio layer: a cheap-to-clone [`Broker`] handle over one
//! [`BrokerMachine`] behind a lock, one task per connection that moves bytes
//! and sleeps until the next deadline, named instances, the TCP listener,
//! and the fault controls. It makes no protocol decision.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::broker::{BrokerMachine, ConnId, QueueInfo};
use crate::config::BrokerConfig;
use crate::session::{Fate, Session};

/// The broker's machine and the wakers of the connection tasks it serves:
/// what the hub's lock guards.
struct Machinery {
    machine: BrokerMachine,
    notifiers: HashMap<ConnId, Arc<Notify>>,
}

impl Machinery {
    fn wake(&mut self, except: Option<ConnId>) -> Vec<Arc<Notify>> {
        self.machine
            .take_woken()
            .into_iter()
            .filter(|id| Some(*id) != except)
            .filter_map(|id| self.notifiers.get(&id).cloned())
            .collect()
    }
}

/// What one broker's handles and connection tasks share: the machinery
/// behind one lock, and the buffer size of in-process connections.
struct Hub {
    machinery: Mutex<Machinery>,
    duplex_capacity: usize,
    /// The bytes reserved for the connections' input buffers.
    input_reserved: AtomicUsize,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Machinery> {
        self.machinery.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the machine and wakes the connections it gave work to.
    fn with_machine<T>(&self, f: impl FnOnce(&mut BrokerMachine, std::time::Instant) -> T) -> T {
        let (result, woken) = {
            let mut machinery = self.lock();
            let result = f(&mut machinery.machine, now());
            (result, machinery.wake(None))
        };
        for notify in woken {
            notify.notify_one();
        }
        result
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// An in-process AMQP 0-9-1 broker. Cloning is cheap: clones share one broker.
#[derive(Clone)]
pub struct Broker {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").finish_non_exhaustive()
    }
}

impl Default for Broker {
    fn default() -> Self {
        Broker::new(BrokerConfig::default())
    }
}

fn registry() -> &'static Mutex<HashMap<String, Broker>> {
    static NAMED: OnceLock<Mutex<HashMap<String, Broker>>> = OnceLock::new();
    NAMED.get_or_init(Default::default)
}

impl Broker {
    /// A new broker with `config`.
    pub fn new(config: BrokerConfig) -> Broker {
        let duplex_capacity = config.duplex_capacity.max(4096);
        Broker {
            hub: Arc::new(Hub {
                machinery: Mutex::new(Machinery {
                    machine: BrokerMachine::new(config, now()),
                    notifiers: HashMap::new(),
                }),
                duplex_capacity,
                input_reserved: AtomicUsize::new(0),
            }),
        }
    }

    /// The broker called `name` in this process (`memory://name`), created
    /// with the default configuration on first use.
    pub fn named(name: &str) -> Broker {
        Broker::named_with(name, BrokerConfig::default)
    }

    /// The broker called `name`, created with `config()` on first use; an
    /// existing one is returned as it is.
    pub fn named_with(name: &str, config: impl FnOnce() -> BrokerConfig) -> Broker {
        let mut named = registry().lock().unwrap_or_else(|p| p.into_inner());
        named
            .entry(name.to_owned())
            .or_insert_with(|| Broker::new(config()))
            .clone()
    }

    /// Forgets the broker called `name` (the broker lives on while handles
    /// to it exist). Returns whether there was one.
    pub fn forget_named(name: &str) -> bool {
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name)
            .is_some()
    }

    /// Opens an in-process connection: the client end of a duplex stream.
    /// The broker's session runs in a task spawned on the current tokio
    /// runtime (so this must be called inside one).
    pub fn connect(&self) -> DuplexStream {
        let (client, server) = tokio::io::duplex(self.hub.duplex_capacity);
        tokio::spawn(serve(self.hub.clone(), server, true));
        client
    }

    /// Serves any stream (a duplex half, a pipe, ...) as one connection,
    /// until it closes. Its peer counts as local (for
    /// [`BrokerConfig::loopback_users`]): serve a socket with
    /// [`Broker::serve_tcp`].
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: S) {
        serve(self.hub.clone(), stream, true).await;
    }

    /// Serves an accepted TCP connection until it closes; its peer address
    /// decides whether [`BrokerConfig::loopback_users`] may log in.
    pub async fn serve_tcp(&self, socket: TcpStream) {
        let _ = socket.set_nodelay(true);
        let loopback = socket.peer_addr().is_ok_and(|peer| is_loopback(peer.ip()));
        serve(self.hub.clone(), socket, loopback).await;
    }

    /// Listens for AMQP clients on a TCP address (use port 0 for any free
    /// one) and returns the address bound. The accept loop runs on the
    /// current runtime.
    pub async fn listen_tcp(&self, addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        warn_if_exposed(local);
        let broker = self.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((socket, _)) => {
                        let broker = broker.clone();
                        tokio::spawn(async move { broker.serve_tcp(socket).await });
                    }
                    Err(err) => {
                        tracing::warn!(%err, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(local)
    }

    /// The fault controls.
    pub fn faults(&self) -> Faults {
        Faults { hub: self.hub.clone() }
    }

    /// A queue's counts, if it exists.
    pub fn queue_info(&self, vhost: &str, queue: &str) -> Option<QueueInfo> {
        self.hub.lock().machine.queue_info(vhost, queue)
    }

    /// Whether an exchange exists.
    pub fn exchange_exists(&self, vhost: &str, exchange: &str) -> bool {
        self.hub.lock().machine.exchange_exists(vhost, exchange)
    }

    /// How many connections are open.
    pub fn connection_count(&self) -> usize {
        self.hub.lock().machine.connection_count()
    }

    /// What the broker holds for its connections right now.
    pub fn stats(&self) -> BrokerStats {
        let machinery = self.hub.lock();
        BrokerStats {
            connections: machinery.machine.connection_count(),
            output_buffered: machinery.machine.buffered_output(),
            input_reserved: self.hub.input_reserved.load(Ordering::Relaxed),
        }
    }
}

/// What a broker holds for its connections, from [`Broker::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BrokerStats {
    /// Connections open (logged in or not).
    pub connections: usize,
    /// Bytes waiting to be written to clients, and being written: at most
    /// about [`BrokerConfig::output_limit`] per connection, plus one message.
    pub output_buffered: usize,
    /// Bytes reserved for the connections' input buffers (small until a
    /// client has logged in).
    pub input_reserved: usize,
}

/// Whether `ip` is a loopback address (an IPv4-mapped IPv6 one included),
/// as RabbitMQ's `loopback_users` check reads it.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
    }
}

/// Logs a warning when `local` is reachable from beyond this host.
pub fn warn_if_exposed(local: SocketAddr) {
    if !is_loopback(local.ip()) {
        tracing::warn!(
            %local,
            "listening beyond loopback: any host that reaches {local} may connect (guest is refused from \
             remote addresses unless allowed; set users of your own)"
        );
    }
}

/// Fault injection for tests, as an operator or a crash would do it.
#[derive(Clone)]
pub struct Faults {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").finish_non_exhaustive()
    }
}

impl Faults {
    /// Every connection's socket dies, with no close frame.
    pub fn sever_all(&self) {
        self.hub.with_machine(|m, _| m.sever_all());
    }

    /// Every connection gets `connection.close` 320 CONNECTION_FORCED with
    /// `reason` (as `rabbitmqctl close_connection` sends it) and is dropped
    /// once it answers `close-ok`.
    pub fn close_all(&self, reason: &str) {
        self.hub.with_machine(|m, _| m.close_all(reason));
    }

    /// Restarts the broker: connections get 320 and are dropped;
    /// non-durable queues and exchanges and non-persistent messages are lost.
    pub fn restart(&self) {
        self.hub.with_machine(|m, now| m.restart(now));
    }

    /// Raises (`true`) or clears a memory alarm: publishing connections are
    /// blocked (`connection.blocked` "low on memory") and no longer read.
    pub fn set_memory_alarm(&self, on: bool) {
        self.hub.with_machine(|m, _| m.set_memory_alarm(on));
    }

    /// Deletes a queue behind its consumers' backs; they get `basic.cancel`
    /// if they advertised `consumer_cancel_notify`. Returns whether it existed.
    pub fn delete_queue(&self, vhost: &str, queue: &str) -> bool {
        self.hub.with_machine(|m, now| m.delete_queue(vhost, queue, now))
    }

    /// Changes `user`'s password, as `rabbitmqctl change_password` does:
    /// the connections already open stay open, and the next login needs
    /// the new password. Returns whether the user exists.
    pub fn change_password(&self, user: &str, password: &str) -> bool {
        self.hub.with_machine(|m, _| {
            let config = Arc::make_mut(&mut m.config);
            match config.users.iter_mut().find(|u| u.name == user) {
                Some(u) => {
                    u.password = password.to_string();
                    true
                }
                None => false,
            }
        })
    }
}

/// The input buffer of a connection that has not logged in: enough for
/// any handshake frame (RabbitMQ's 4096-byte `frame_max` until `tune-ok`).
const PRE_AUTH_BUFFER: usize = 4 * 1024 + 64;
/// The input buffer's growth step once the client has logged in.
const INPUT_CHUNK: usize = 64 * 1024;

/// One connection: read, feed the session, write what the machine has for
/// it, sleep until the next deadline or until another connection wakes it.
/// A connection whose output is full is not read (its own replies stay
/// bounded); a write that makes no progress for the write timeout drops it.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(hub: Arc<Hub>, mut io: S, loopback: bool) {
    let notify = Arc::new(Notify::new());
    let (mut session, write_timeout) = {
        let mut machinery = hub.lock();
        let session = Session::new(&mut machinery.machine, now());
        if let Some(conn) = machinery.machine.conns.get_mut(&session.id()) {
            conn.loopback = loopback;
        }
        machinery.notifiers.insert(session.id(), notify.clone());
        (session, machinery.machine.config().write_timeout)
    };
    let id = session.id();
    // Runs when the task ends or is dropped with its runtime (a test that
    // finishes while connected to a named broker): the connection must not
    // linger with its consumers.
    let mut guard = ConnGuard {
        hub: hub.clone(),
        id,
        reserved: 0,
    };
    let mut input = BytesMut::with_capacity(PRE_AUTH_BUFFER);
    loop {
        let (deadline, want_read, authenticated, resume) = {
            let machinery = hub.lock();
            let deadline = match (session.poll_timeout(), machinery.machine.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let room = machinery.machine.output_has_room(id);
            let resume = room && session.input_held();
            (
                deadline,
                session.wants_read() && room,
                session.is_authenticated(),
                resume,
            )
        };
        let chunk = if authenticated { INPUT_CHUNK } else { PRE_AUTH_BUFFER };
        if input.capacity() - input.len() < chunk / 4 {
            input.reserve(chunk);
        }
        guard.reserve(input.capacity());
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        let mut read = false;
        let mut eof = false;
        // Input held back while the output was full goes on at once.
        if !resume {
            tokio::select! {
                biased;
                _ = notify.notified() => {}
                result = io.read_buf(&mut input), if want_read => match result {
                    Ok(0) | Err(_) => eof = true,
                    Ok(_) => read = true,
                },
                _ = sleep => {}
            }
        }
        let now = now();
        let (output, woken, fate) = {
            let mut machinery = hub.lock();
            let machine = &mut machinery.machine;
            if read {
                session.received(now);
            }
            if eof {
                session.handle_eof(machine, now);
            } else {
                session.handle_input(machine, &mut input, now);
                session.handle_timeout(machine, now);
                if machine.poll_timeout().is_some_and(|at| at <= now) {
                    machine.handle_timeout(now);
                }
            }
            let output = machine.take_output(id);
            (output, machinery.wake(Some(id)), session.fate())
        };
        for n in woken {
            n.notify_one();
        }
        if fate == Fate::Sever {
            break;
        }
        if !output.is_empty() {
            let written = output.len();
            if write_with_progress(&mut io, output, write_timeout).await.is_err() {
                tracing::info!(conn = id, "dropping a connection whose writes made no progress");
                break;
            }
            session.transmitted(now);
            hub.with_machine(|m, now| m.output_written(id, written, now));
        }
        if fate == Fate::Close {
            let _ = tokio::time::timeout(write_timeout, io.flush()).await;
            let _ = tokio::time::timeout(write_timeout, io.shutdown()).await;
            break;
        }
    }
}

/// Writes all of `buf`; fails when a write makes no progress within
/// `timeout` (the peer does not read) or the stream fails.
async fn write_with_progress<S: AsyncWrite + Unpin>(
    io: &mut S,
    mut buf: BytesMut,
    timeout: Duration,
) -> io::Result<()> {
    while !buf.is_empty() {
        match tokio::time::timeout(timeout, io.write(&buf)).await {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf.advance(n),
            Ok(Err(err)) => return Err(err),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    Ok(())
}

struct ConnGuard {
    hub: Arc<Hub>,
    id: ConnId,
    /// The input buffer's capacity, counted in [`Hub::input_reserved`].
    reserved: usize,
}

impl ConnGuard {
    fn reserve(&mut self, capacity: usize) {
        if capacity != self.reserved {
            self.hub.input_reserved.fetch_add(capacity, Ordering::Relaxed);
            self.hub.input_reserved.fetch_sub(self.reserved, Ordering::Relaxed);
            self.reserved = capacity;
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.reserve(0);
        let woken = {
            let mut machinery = self.hub.lock();
            machinery.machine.remove_conn(self.id, now());
            machinery.notifiers.remove(&self.id);
            machinery.wake(Some(self.id))
        };
        for n in woken {
            n.notify_one();
        }
    }
}
