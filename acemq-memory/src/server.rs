//! The tokio layer: a cheap-to-clone [`Broker`] handle over one
//! [`BrokerMachine`] behind a lock, one task per connection that moves bytes
//! and sleeps until the next deadline, named instances, the TCP listener,
//! and the fault controls. It makes no protocol decision.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, ToSocketAddrs};
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
        tokio::spawn(serve(self.hub.clone(), server));
        client
    }

    /// Serves any stream (a socket, a duplex half, ...) as one connection,
    /// until it closes.
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(&self, stream: S) {
        serve(self.hub.clone(), stream).await;
    }

    /// Listens for AMQP clients on a TCP address (use port 0 for any free
    /// one) and returns the address bound. The accept loop runs on the
    /// current runtime.
    pub async fn listen_tcp(&self, addr: impl ToSocketAddrs) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let hub = self.hub.clone();
        tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((socket, _)) => {
                        let _ = socket.set_nodelay(true);
                        tokio::spawn(serve(hub.clone(), socket));
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

/// One connection: read, feed the session, write what the machine has for
/// it, sleep until the next deadline or until another connection wakes it.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(hub: Arc<Hub>, mut io: S) {
    let notify = Arc::new(Notify::new());
    let mut session = {
        let mut machinery = hub.lock();
        let session = Session::new(&mut machinery.machine, now());
        machinery.notifiers.insert(session.id(), notify.clone());
        session
    };
    let id = session.id();
    // Runs when the task ends or is dropped with its runtime (a test that
    // finishes while connected to a named broker): the connection must not
    // linger with its consumers.
    let _guard = ConnGuard { hub: hub.clone(), id };
    let mut input = BytesMut::with_capacity(64 * 1024);
    loop {
        let (deadline, want_read) = {
            let machinery = hub.lock();
            let deadline = match (session.poll_timeout(), machinery.machine.poll_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            (deadline, session.wants_read())
        };
        if input.capacity() - input.len() < 16 * 1024 {
            input.reserve(64 * 1024);
        }
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
        };
        let mut read = false;
        let mut eof = false;
        tokio::select! {
            biased;
            _ = notify.notified() => {}
            result = io.read_buf(&mut input), if want_read => match result {
                Ok(0) | Err(_) => eof = true,
                Ok(_) => read = true,
            },
            _ = sleep => {}
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
            if io.write_all(&output).await.is_err() {
                break;
            }
            session.transmitted(now);
        }
        if fate == Fate::Close {
            let _ = io.flush().await;
            let _ = io.shutdown().await;
            break;
        }
    }
}

struct ConnGuard {
    hub: Arc<Hub>,
    id: ConnId,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
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
