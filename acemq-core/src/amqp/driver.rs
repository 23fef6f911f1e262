//! The tokio driver: one task per connection that owns the socket (any
//! transport from `io`) and the protocol machine. It reads into one buffer and lets the machine parse in
//! place; it writes everything queued while the previous write was in flight
//! in one go; it carries out commands from the API handles and routes the
//! machine's events to them. It makes no protocol decision.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use amqp_codec::{FieldTable, Method, ShortString};
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::error::Error;
use super::message::{Acker, Command, Confirmation, ConnectionEvent, Delivery, Reply1, ReturnedMessage};
use crate::proto::{self, CloseReason, CommandError, Event, Reply, Token, Tuned};
use crate::time::sleep_until;

/// State the handles read without asking the driver.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tuned: OnceLock<Tuned>,
    pub(crate) server_properties: OnceLock<FieldTable>,
    /// The broker's reason while it blocks this connection.
    pub(crate) blocked: watch::Sender<Option<String>>,
    pub(crate) close_reason: Mutex<Option<CloseReason>>,
    pub(crate) closed: watch::Sender<bool>,
    pub(crate) events: broadcast::Sender<ConnectionEvent>,
}

impl Shared {
    pub(crate) fn new() -> Self {
        Shared {
            tuned: OnceLock::new(),
            server_properties: OnceLock::new(),
            blocked: watch::channel(None).0,
            close_reason: Mutex::new(None),
            closed: watch::channel(false).0,
            events: broadcast::channel(256).0,
        }
    }

    pub(crate) fn closed_error(&self) -> Error {
        let reason = self.close_reason.lock().ok().and_then(|r| r.clone());
        Error::ConnectionClosed(reason.unwrap_or(CloseReason::ConnectionLost))
    }
}

enum Pending {
    Open(Reply1<(u16, u64, Arc<AtomicBool>)>),
    Call(Reply1<Option<Reply>>),
    Consume {
        deliveries: mpsc::UnboundedSender<Delivery>,
        reply: Reply1<ShortString>,
    },
}

#[derive(Default)]
struct ChannelRoutes {
    generation: u64,
    /// Shared with the channel's handles: false once the channel is gone.
    open: Arc<AtomicBool>,
    confirms: VecDeque<(u64, Reply1<Confirmation>)>,
    consumers: HashMap<ShortString, mpsc::UnboundedSender<Delivery>>,
}

struct Driver {
    machine: proto::Connection,
    shared: Arc<Shared>,
    /// Weak, so that the command stream ends when every handle is gone.
    commands_tx: mpsc::WeakUnboundedSender<Command>,
    pending: HashMap<Token, Pending>,
    channels: Vec<Option<ChannelRoutes>>,
    next_generation: u64,
    opened: Option<oneshot::Sender<Result<(), Error>>>,
    closers: Vec<Reply1<()>>,
}

/// Runs a connection over `stream` until it ends. `opened` hears when the
/// handshake is done (or failed).
pub(crate) async fn run<S>(
    stream: S,
    machine: proto::Connection,
    shared: Arc<Shared>,
    commands_tx: mpsc::WeakUnboundedSender<Command>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    opened: oneshot::Sender<Result<(), Error>>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut driver = Driver {
        machine,
        shared,
        commands_tx,
        pending: HashMap::new(),
        channels: Vec::new(),
        next_generation: 0,
        opened: Some(opened),
        closers: Vec::new(),
    };
    let mut read_buf = BytesMut::with_capacity(128 * 1024);
    let mut write_buf = BytesMut::with_capacity(128 * 1024);
    let mut commands_open = true;
    loop {
        driver.drain_events();
        driver.machine.poll_transmit(&mut write_buf, now());
        if driver.machine.is_closed() {
            // Say close-ok (or close) before hanging up, briefly.
            if !write_buf.is_empty() {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer.write_all(&write_buf)).await;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer.shutdown()).await;
            break;
        }
        let deadline = driver.machine.poll_timeout();
        if read_buf.capacity() - read_buf.len() < 16 * 1024 {
            read_buf.reserve(64 * 1024);
        }
        tokio::select! {
            biased;
            result = reader.read_buf(&mut read_buf) => match result {
                Ok(0) | Err(_) => driver.machine.handle_eof(),
                Ok(_) => driver.machine.handle_input(&mut read_buf, now()),
            },
            result = writer.write(&write_buf), if !write_buf.is_empty() => match result {
                Ok(0) | Err(_) => driver.machine.handle_eof(),
                Ok(n) => write_buf.advance(n),
            },
            command = commands.recv(), if commands_open => match command {
                Some(command) => {
                    driver.apply(command);
                    // Take what else is queued now: it goes out in the same write.
                    for _ in 0..1024 {
                        match commands.try_recv() {
                            Ok(command) => driver.apply(command),
                            Err(_) => break,
                        }
                    }
                }
                None => {
                    commands_open = false;
                    driver.machine.close();
                }
            },
            _ = sleep_until(deadline.map(tokio::time::Instant::from_std)), if deadline.is_some() => {
                driver.machine.handle_timeout(now())
            }
        }
    }
    driver.drain_events();
    driver.fail_everything();
}

fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Driver {
    fn routes(&mut self, channel: u16, generation: u64) -> Option<&mut ChannelRoutes> {
        self.channels
            .get_mut(usize::from(channel))
            .and_then(Option::as_mut)
            .filter(|r| r.generation == generation)
    }

    fn command_error(&self, err: CommandError) -> Error {
        match err {
            CommandError::ConnectionNotOpen if self.machine.is_closed() => self.shared.closed_error(),
            other => Error::Command(other),
        }
    }

    /// Carries out one command from the handles.
    fn apply(&mut self, command: Command) {
        match command {
            Command::OpenChannel { reply } => self.open_channel(reply),
            Command::Call {
                channel,
                generation,
                method,
                reply,
            } => self.call(channel, generation, method, reply),
            Command::Send {
                channel,
                generation,
                method,
            } => self.send(channel, generation, method),
            Command::Publish {
                channel,
                generation,
                publish,
                properties,
                body,
                confirm,
            } => self.publish(channel, generation, &publish, &properties, &body, confirm),
            Command::Consume {
                channel,
                generation,
                method,
                deliveries,
                reply,
            } => self.consume(channel, generation, method, deliveries, reply),
            Command::Close { reply } => self.close(reply),
        }
    }

    fn open_channel(&mut self, reply: Reply1<(u16, u64, Arc<AtomicBool>)>) {
        match self.machine.open_channel() {
            Ok((_, token)) => {
                self.pending.insert(token, Pending::Open(reply));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn call(&mut self, channel: u16, generation: u64, method: Method, reply: Reply1<Option<Reply>>) {
        if self.routes(channel, generation).is_none() {
            let _ = reply.send(Err(Error::ChannelNotOpen(channel)));
            return;
        }
        match self.machine.call(channel, method) {
            Ok(Some(token)) => {
                self.pending.insert(token, Pending::Call(reply));
            }
            Ok(None) => {
                let _ = reply.send(Ok(None));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn send(&mut self, channel: u16, generation: u64, method: Method) {
        if self.routes(channel, generation).is_none() {
            tracing::debug!(channel, method = method.name(), "dropped: the channel has closed since");
            return;
        }
        if let Err(err) = self.machine.call(channel, method) {
            tracing::debug!(channel, %err, "could not send");
        }
    }

    fn publish(
        &mut self,
        channel: u16,
        generation: u64,
        publish: &amqp_codec::BasicPublish,
        properties: &amqp_codec::BasicProperties,
        body: &[u8],
        confirm: Option<Reply1<Confirmation>>,
    ) {
        if self.routes(channel, generation).is_none() {
            if let Some(confirm) = confirm {
                let _ = confirm.send(Err(Error::ChannelNotOpen(channel)));
            }
            return;
        }
        match self.machine.publish(channel, publish, properties, body) {
            Ok(Some(seq)) => {
                if let (Some(confirm), Some(routes)) = (confirm, self.routes(channel, generation)) {
                    routes.confirms.push_back((seq, confirm));
                }
            }
            Ok(None) => {
                if let Some(confirm) = confirm {
                    let _ = confirm.send(Ok(Confirmation::NotRequested));
                }
            }
            Err(err) => {
                if let Some(confirm) = confirm {
                    let _ = confirm.send(Err(self.command_error(err)));
                }
            }
        }
    }

    fn consume(
        &mut self,
        channel: u16,
        generation: u64,
        method: amqp_codec::BasicConsume,
        deliveries: mpsc::UnboundedSender<Delivery>,
        reply: Reply1<ShortString>,
    ) {
        if self.routes(channel, generation).is_none() {
            let _ = reply.send(Err(Error::ChannelNotOpen(channel)));
            return;
        }
        let no_wait_tag = method.no_wait.then(|| method.consumer_tag.clone());
        match self.machine.call(channel, Method::BasicConsume(method)) {
            Ok(Some(token)) => {
                self.pending.insert(token, Pending::Consume { deliveries, reply });
            }
            Ok(None) => {
                // no-wait: the tag must be ours, and deliveries may follow at once.
                let tag = no_wait_tag.unwrap_or_default();
                if let Some(routes) = self.routes(channel, generation) {
                    routes.consumers.insert(tag.clone(), deliveries);
                }
                let _ = reply.send(Ok(tag));
            }
            Err(err) => {
                let _ = reply.send(Err(self.command_error(err)));
            }
        }
    }

    fn close(&mut self, reply: Reply1<()>) {
        if self.machine.is_closed() {
            let _ = reply.send(Ok(()));
        } else {
            self.closers.push(reply);
            self.machine.close();
        }
    }

    fn drain_events(&mut self) {
        while let Some(event) = self.machine.poll_event() {
            self.on_event(event);
        }
    }

    /// Routes one event of the machine to the handles that wait for it.
    fn on_event(&mut self, event: Event) {
        match event {
            Event::Opened => self.opened(),
            Event::Reply { channel, token, result } => self.on_reply(channel, token, result),
            Event::Delivery { channel, content } => self.deliver(channel, content),
            Event::Confirm {
                channel,
                seq,
                outcome,
                returned,
            } => self.confirm(channel, seq, outcome, returned),
            Event::Return { channel, content } => self.unmatched_return(channel, content),
            Event::ConsumerCancelled { channel, consumer_tag } => self.consumer_cancelled(channel, consumer_tag),
            Event::Flow { .. } => {}
            Event::ChannelClosed { channel, refusal, .. } => self.channel_closed(channel, refusal),
            Event::Blocked { reason } => {
                self.shared.blocked.send_replace(Some(reason.clone()));
                let _ = self.shared.events.send(ConnectionEvent::Blocked { reason });
            }
            Event::Unblocked => {
                self.shared.blocked.send_replace(None);
                let _ = self.shared.events.send(ConnectionEvent::Unblocked);
            }
            Event::Closed(reason) => self.closed(reason),
        }
    }

    fn opened(&mut self) {
        if let Some(tuned) = self.machine.tuned() {
            let _ = self.shared.tuned.set(tuned);
        }
        let _ = self
            .shared
            .server_properties
            .set(self.machine.server_properties().clone());
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Ok(()));
        }
    }

    #[inline]
    fn deliver(&mut self, channel: u16, content: amqp_codec::track::Content) {
        let generation = match self.channels.get(usize::from(channel)).and_then(Option::as_ref) {
            Some(routes) => routes.generation,
            None => return,
        };
        let Method::BasicDeliver(deliver) = content.method else {
            return;
        };
        let delivery = Delivery {
            consumer_tag: deliver.consumer_tag,
            delivery_tag: deliver.delivery_tag,
            redelivered: deliver.redelivered,
            exchange: deliver.exchange,
            routing_key: deliver.routing_key,
            properties: content.header.map(|h| h.properties),
            body: content.body,
            acker: Acker {
                commands: self.commands_tx.clone(),
                channel,
                generation,
            },
        };
        let routes = self.channels[usize::from(channel)].as_mut().expect("checked above");
        match routes.consumers.get(&delivery.consumer_tag) {
            Some(tx) => {
                if let Err(mpsc::error::SendError(lost)) = tx.send(delivery) {
                    tracing::warn!(
                        channel,
                        consumer = %lost.consumer_tag,
                        "delivery for a consumer whose stream was dropped; it stays unacknowledged"
                    );
                }
            }
            None => {
                tracing::warn!(channel, consumer = %delivery.consumer_tag, "delivery for an unknown consumer")
            }
        }
    }

    #[inline]
    fn confirm(
        &mut self,
        channel: u16,
        seq: u64,
        outcome: amqp_codec::track::Outcome,
        returned: Option<amqp_codec::track::Content>,
    ) {
        let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) else {
            return;
        };
        let waiter = if routes.confirms.front().map(|(s, _)| *s) == Some(seq) {
            routes.confirms.pop_front()
        } else {
            routes
                .confirms
                .iter()
                .position(|(s, _)| *s == seq)
                .and_then(|at| routes.confirms.remove(at))
        };
        if let Some((_, tx)) = waiter {
            let confirmation = match (outcome, returned.and_then(ReturnedMessage::from_content)) {
                (amqp_codec::track::Outcome::Nack, _) => Confirmation::Nack,
                (_, Some(returned)) => Confirmation::Returned(Box::new(returned)),
                (_, None) => Confirmation::Ack,
            };
            let _ = tx.send(Ok(confirmation));
        }
    }

    fn unmatched_return(&mut self, channel: u16, content: amqp_codec::track::Content) {
        if let Some(message) = ReturnedMessage::from_content(content) {
            tracing::warn!(channel, exchange = %message.exchange, routing_key = %message.routing_key, "returned message matches no publish");
            let _ = self.shared.events.send(ConnectionEvent::Returned {
                channel,
                message: Box::new(message),
            });
        }
    }

    fn consumer_cancelled(&mut self, channel: u16, consumer_tag: ShortString) {
        if let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) {
            routes.consumers.remove(&consumer_tag);
        }
        let _ = self
            .shared
            .events
            .send(ConnectionEvent::ConsumerCancelled { channel, consumer_tag });
    }

    fn channel_closed(&mut self, channel: u16, refusal: Option<proto::Refusal>) {
        let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::take) else {
            return;
        };
        routes.open.store(false, Ordering::SeqCst);
        let error = match refusal {
            Some(r) => Error::ChannelClosed(r),
            None => Error::ChannelNotOpen(channel),
        };
        for (_, tx) in routes.confirms {
            let _ = tx.send(Err(error.clone()));
        }
        // Dropping the consumers' senders ends their streams.
    }

    fn closed(&mut self, reason: CloseReason) {
        if let Ok(mut slot) = self.shared.close_reason.lock() {
            slot.get_or_insert(reason.clone());
        }
        self.shared.blocked.send_replace(None);
        let error = Error::ConnectionClosed(reason.clone());
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error));
        }
        let closed = match reason {
            CloseReason::TimedOut { waiting_for, after } => Err(Error::NoReply { waiting_for, after }),
            _ => Ok(()),
        };
        for closer in self.closers.drain(..) {
            let _ = closer.send(closed.clone());
        }
        let _ = self.shared.events.send(ConnectionEvent::Closed(reason));
        self.shared.closed.send_replace(true);
    }

    fn on_reply(&mut self, channel: u16, token: Token, result: Result<Reply, proto::CallError>) {
        let Some(pending) = self.pending.remove(&token) else {
            return;
        };
        match pending {
            Pending::Open(reply) => match result {
                Ok(_) => {
                    self.next_generation += 1;
                    let generation = self.next_generation;
                    let index = usize::from(channel);
                    if self.channels.len() <= index {
                        self.channels.resize_with(index + 1, || None);
                    }
                    let open = Arc::new(AtomicBool::new(true));
                    self.channels[index] = Some(ChannelRoutes {
                        generation,
                        open: open.clone(),
                        ..ChannelRoutes::default()
                    });
                    let _ = reply.send(Ok((channel, generation, open)));
                }
                Err(err) => {
                    let _ = reply.send(Err(err.into()));
                }
            },
            Pending::Call(reply) => {
                if let Ok(Reply::Method(Method::BasicCancelOk(ok))) = &result {
                    if let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) {
                        routes.consumers.remove(&ok.consumer_tag);
                    }
                }
                let _ = reply.send(result.map(Some).map_err(Error::from));
            }
            Pending::Consume { deliveries, reply } => match result {
                Ok(Reply::Method(Method::BasicConsumeOk(ok))) => {
                    if let Some(routes) = self.channels.get_mut(usize::from(channel)).and_then(Option::as_mut) {
                        routes.consumers.insert(ok.consumer_tag.clone(), deliveries);
                    }
                    let _ = reply.send(Ok(ok.consumer_tag));
                }
                Ok(other) => {
                    let _ = reply.send(Err(Error::UnexpectedReply(format!("{other:?}"))));
                }
                Err(err) => {
                    let _ = reply.send(Err(err.into()));
                }
            },
        }
    }

    /// The connection is over: everyone still waiting hears why.
    fn fail_everything(&mut self) {
        let error = self.shared.closed_error();
        for (_, pending) in self.pending.drain() {
            match pending {
                Pending::Open(r) => drop(r.send(Err(error.clone()))),
                Pending::Call(r) => drop(r.send(Err(error.clone()))),
                Pending::Consume { reply, .. } => drop(reply.send(Err(error.clone()))),
            }
        }
        for routes in self.channels.drain(..).flatten() {
            routes.open.store(false, Ordering::SeqCst);
            for (_, tx) in routes.confirms {
                let _ = tx.send(Err(error.clone()));
            }
        }
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error));
        }
        for closer in self.closers.drain(..) {
            let _ = closer.send(Ok(()));
        }
        self.shared.closed.send_replace(true);
    }
}
