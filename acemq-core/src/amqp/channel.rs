//! `Channel`: every method of AMQP 0-9-1 a client sends, with the broker's
//! reply as the result and a refusal as [`Error::ChannelClosed`] carrying its
//! code and text.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use acemq_codec::*;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::message::Confirmation;
use super::state::{Acker, ChannelConfirms, Command, Delivery, DeliveryQueue, GetMessage, Outgoing, Published};
use super::{Connection, Error};
use crate::proto::Reply;

/// An open channel. Cheap to clone; all clones are the same channel. When
/// the last clone (including those held by consumers) is dropped, the
/// channel is closed, and deliveries not yet acknowledged go back to the queue.
///
/// A call the broker does not answer within [`super::Config::call_timeout`]
/// fails with [`Error::NoReply`], as does every call queued behind it; the
/// engine then closes the channel (a late answer would be taken for the next
/// call's). The handle is dead from then on, like one the broker closed:
/// [`Channel::is_open`] is false, later calls fail with
/// [`Error::ChannelNotOpen`], its consumers' streams end and its
/// unconfirmed publishes fail with the same `NoReply`. Open a new channel
/// to go on.
#[derive(Clone, Debug)]
pub struct Channel {
    conn: Connection,
    id: u16,
    generation: u64,
    open: Arc<AtomicBool>,
    state: Arc<ChannelState>,
}

/// What every handle of one channel shares; closes the channel when the
/// last handle goes.
#[derive(Debug)]
struct ChannelState {
    commands: super::batch_queue::Sender<Command, Outgoing>,
    id: u16,
    generation: u64,
    open: Arc<AtomicBool>,
    /// Where its publishes wait for their confirms.
    confirms: Arc<ChannelConfirms>,
}

/// The properties a publish takes: a [`BasicProperties`] by value, or an
/// `Arc<BasicProperties>` shared by many publishes, given by value or
/// borrowed (`&Arc<BasicProperties>`).
///
/// With room in the publish buffer the message is encoded as the publish
/// is called, and properties are never copied for it: the channel's
/// encoder compares them with the last message's (shared ones by address,
/// others field by field, never those with headers) and copies that
/// message's header frame when they match. A publish that must wait for
/// room keeps its own `Arc` of them.
pub trait PublishProperties: sealed::Sealed {
    /// Runs `f` with the properties as the encoder takes them.
    #[doc(hidden)]
    fn with_properties<R>(self, f: impl FnOnce(PropertiesRef<'_>) -> R) -> R
    where
        Self: Sized;
}

/// The body a publish takes: [`Bytes`], a `Vec<u8>` or a `String` by
/// value, or bytes borrowed for the call (`&[u8]`, `&Bytes`, `&Vec<u8>`,
/// `&[u8; N]`, `&str`).
///
/// With room in the publish buffer the message is encoded as the publish
/// is called, so a borrowed body costs nothing more; a publish that must
/// wait for room keeps its own copy of a borrowed body (a `Bytes` is kept
/// by its count).
pub trait PublishBody: sealed::SealedBody {
    /// The body's bytes.
    #[doc(hidden)]
    fn as_slice(&self) -> &[u8];

    /// The body itself, when it is a `Bytes` a waiting publish can keep
    /// without copying it.
    #[doc(hidden)]
    fn as_bytes(&self) -> Option<&Bytes>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for acemq_codec::BasicProperties {}
    impl Sealed for std::sync::Arc<acemq_codec::BasicProperties> {}
    impl Sealed for &std::sync::Arc<acemq_codec::BasicProperties> {}

    pub trait SealedBody {}
    impl SealedBody for bytes::Bytes {}
    impl SealedBody for &bytes::Bytes {}
    impl SealedBody for Vec<u8> {}
    impl SealedBody for &Vec<u8> {}
    impl SealedBody for &[u8] {}
    impl<const N: usize> SealedBody for &[u8; N] {}
    impl SealedBody for &str {}
    impl SealedBody for String {}
}

impl PublishProperties for Arc<BasicProperties> {
    #[inline(always)]
    fn with_properties<R>(self, f: impl FnOnce(PropertiesRef<'_>) -> R) -> R {
        f(PropertiesRef::Shared(&self))
    }
}

impl PublishProperties for &Arc<BasicProperties> {
    #[inline(always)]
    fn with_properties<R>(self, f: impl FnOnce(PropertiesRef<'_>) -> R) -> R {
        f(PropertiesRef::Shared(self))
    }
}

impl PublishProperties for BasicProperties {
    #[inline(always)]
    fn with_properties<R>(self, f: impl FnOnce(PropertiesRef<'_>) -> R) -> R {
        f(PropertiesRef::Given(&self))
    }
}

/// `PublishBody` for types whose bytes are `AsRef<[u8]>`: `kept` says
/// whether a waiting publish keeps the value itself (a `Bytes`) or a copy.
macro_rules! publish_body {
    ($kept:ident: $($body:ty),+) => {$(
        impl PublishBody for $body {
            #[inline(always)]
            fn as_slice(&self) -> &[u8] {
                AsRef::<[u8]>::as_ref(self)
            }
            #[inline(always)]
            fn as_bytes(&self) -> Option<&Bytes> {
                publish_body!(@$kept self)
            }
        }
    )+};
    (@kept $body:ident) => { Some($body) };
    (@copied $body:ident) => { None };
}

publish_body!(kept: Bytes, &Bytes);
publish_body!(copied: Vec<u8>, &Vec<u8>, &[u8], &str, String);

impl<const N: usize> PublishBody for &[u8; N] {
    #[inline(always)]
    fn as_slice(&self) -> &[u8] {
        &self[..]
    }
    #[inline(always)]
    fn as_bytes(&self) -> Option<&Bytes> {
        None
    }
}

impl Drop for ChannelState {
    fn drop(&mut self) {
        if !self.open.load(Ordering::SeqCst) {
            return;
        }
        // Nobody waits for the close-ok: the reply goes nowhere.
        let (reply, _) = oneshot::channel();
        let _ = self.commands.send(Command::Call {
            channel: self.id,
            generation: self.generation,
            method: crate::proto::goodbye().into(),
            reply,
        });
    }
}

impl Connection {
    /// Opens a channel.
    pub async fn channel(&self) -> Result<Channel, Error> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::OpenChannel { reply })?;
        let (id, generation, open, confirms) = rx.await.map_err(|_| self.state.closed_error())??;
        Ok(Channel::new(self.clone(), id, generation, open, confirms))
    }
}

/// The `basic.publish` of a message to queue: a method given whole, or
/// what [`Channel::publish`] is given, encoded without building one.
#[derive(Clone, Copy)]
enum Route<'a> {
    Method(&'a BasicPublish),
    Parts {
        exchange: &'a str,
        routing_key: &'a str,
        mandatory: bool,
    },
}

impl Route<'_> {
    fn to_method(self) -> BasicPublish {
        match self {
            Route::Method(publish) => publish.clone(),
            Route::Parts {
                exchange,
                routing_key,
                mandatory,
            } => BasicPublish {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
                mandatory,
                ..Default::default()
            },
        }
    }

    /// What a `basic.return` of a mandatory publish is matched by, boxed
    /// as a [`Published`] record keeps it; `None` when not mandatory.
    #[inline]
    fn return_key(self, properties: &BasicProperties) -> Option<Box<acemq_codec::track::ReturnKey>> {
        let mandatory = match self {
            Route::Method(publish) => publish.mandatory,
            Route::Parts { mandatory, .. } => mandatory,
        };
        if mandatory {
            self.mandatory_return_key(properties)
        } else {
            None
        }
    }

    #[cold]
    #[inline(never)]
    fn mandatory_return_key(self, properties: &BasicProperties) -> Option<Box<acemq_codec::track::ReturnKey>> {
        let key = match self {
            Route::Method(publish) => crate::proto::return_key(publish, properties),
            parts => crate::proto::return_key(&parts.to_method(), properties),
        };
        key.map(Box::new)
    }
}

/// Where a publish's room in the publish buffer comes from.
#[derive(Clone, Copy)]
enum Room {
    /// The command queue's credit, if it holds enough.
    FromCredit,
    /// Taken from the publish buffer already, with `spare` more that goes
    /// to the command queue's credit.
    Taken {
        /// Taken beyond the message's room.
        spare: u32,
    },
}

/// What [`Channel::publish`] returns: ready at once when the message was
/// queued (or refused) as it was called, else a wait for room in the
/// publish buffer.
///
/// 24 bytes: the confirm alone, the rare refusal boxed. (Holding the whole
/// `Result`, 40 bytes whose error puts its fields at odd offsets, it was
/// copied byte-wise on every publish, and read back stalled.)
pub(crate) enum Publishing<'a> {
    /// Queued already; taken by the first poll.
    Queued(Option<PublishConfirm>),
    /// Refused already; taken by the first poll.
    Refused(Option<Box<Error>>),
    /// Waits for room, then queues the message it holds.
    Waiting(Pin<Box<dyn Future<Output = Result<PublishConfirm, Error>> + Send + 'a>>),
}

impl Publishing<'_> {
    /// A publish queued or refused as it was called.
    #[inline]
    fn ready(outcome: Result<PublishConfirm, Error>) -> Self {
        match outcome {
            Ok(confirm) => Publishing::Queued(Some(confirm)),
            Err(err) => Publishing::Refused(Some(Box::new(err))),
        }
    }

    /// The publish's confirm if the message was queued as it was called;
    /// `None` otherwise (refused, or waiting for room: then, as this drops
    /// the wait, nothing is published).
    pub(crate) fn queued(self) -> Option<PublishConfirm> {
        match self {
            Publishing::Queued(confirm) => confirm,
            _ => None,
        }
    }
}

impl Future for Publishing<'_> {
    type Output = Result<PublishConfirm, Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut *self {
            // Polling a future after it returned breaks `Future`'s contract
            // (an `async fn` panics too); it is never a broker's doing.
            Publishing::Queued(confirm) => Poll::Ready(Ok(confirm.take().expect("a publish polled after it returned"))),
            Publishing::Refused(err) => Poll::Ready(Err(*err.take().expect("a publish polled after it returned"))),
            Publishing::Waiting(wait) => wait.as_mut().poll(cx),
        }
    }
}

/// The broker's answer to one publish; resolves when it is confirmed (or at
/// once with [`Confirmation::NotRequested`] on a channel without confirms).
/// Like a delivery, it does not keep the connection or its channel open:
/// hold the [`Channel`] while waiting, or the confirm fails with the close.
#[derive(Debug)]
pub struct PublishConfirm {
    /// The pending confirms of its channel (one reference count, where a
    /// [`Connection`] handle would cost three).
    confirms: Arc<ChannelConfirms>,
    /// Its number in them; [`SPENT`] once its outcome was taken. (No
    /// separate flag: 16 bytes, which a queue of confirms moves whole,
    /// where a flag and its padding made 24 that compilers copy piecemeal.)
    number: u64,
}

/// A [`PublishConfirm`]'s number once its outcome was taken (a tracker never
/// numbers that far).
const SPENT: u64 = u64::MAX;

impl Drop for PublishConfirm {
    #[inline]
    fn drop(&mut self) {
        if self.number != SPENT {
            self.confirms.pending.abandon(self.number);
        }
    }
}

impl PublishConfirm {
    /// Watches the blocked state of the connection the message was written
    /// on (see [`Connection::blocked_changes`]): a confirm does not come
    /// while the broker blocks it.
    pub fn blocked_changes(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.confirms.connection.blocked.subscribe()
    }
}

impl Future for PublishConfirm {
    type Output = Result<Confirmation, Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        // Polled again after it returned: the connection's error, as a
        // dropped confirm would give (its outcome was taken).
        if this.number == SPENT {
            return Poll::Ready(Err(this.confirms.connection.closed_error()));
        }
        let outcome = std::task::ready!(this.confirms.pending.poll(this.number, cx));
        this.number = SPENT;
        Poll::Ready(outcome)
    }
}

/// The deliveries of one consumer, in order. Ends when the consumer is
/// cancelled (by us or the broker) or the channel closes.
#[derive(Debug)]
pub struct Consumer {
    tag: ShortString,
    channel: Channel,
    deliveries: DeliveryQueue,
}

impl Consumer {
    /// The consumer tag.
    pub fn tag(&self) -> &ShortString {
        &self.tag
    }

    /// The channel it consumes on.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The next delivery, or `None` once the consumer has ended.
    pub async fn next(&mut self) -> Option<Delivery> {
        // Polled in place: each async layer would move the delivery once more.
        std::future::poll_fn(|cx| {
            let polled = self.deliveries.poll_recv(cx);
            if polled.is_ready() {
                self.channel.conn.state.took_delivery();
            }
            polled
        })
        .await
    }

    /// Deliveries already here, without waiting.
    pub fn try_next(&mut self) -> Option<Delivery> {
        let delivery = self.deliveries.try_recv();
        self.channel.conn.state.took_delivery();
        delivery
    }

    /// How many deliveries wait to be taken. At most
    /// [`super::Config::delivery_buffer`] (or the channel's prefetch when
    /// the consumer started, if larger): when it is full the connection
    /// stops reading until one is taken.
    pub fn buffered(&self) -> usize {
        self.deliveries.len()
    }

    /// Cancels the consumer (`basic.cancel`); deliveries already received
    /// can still be taken and acknowledged.
    pub async fn cancel(&self) -> Result<(), Error> {
        self.channel
            .basic_cancel(BasicCancel {
                consumer_tag: self.tag.clone(),
                no_wait: false,
            })
            .await
            .map(|_| ())
    }
}

/// What `basic.get` waits for, in an [`Error::UnexpectedReply`].
const BASIC_GET_REPLIES: &str = "basic.get-ok or basic.get-empty";

macro_rules! rpc {
    ($(#[$doc:meta])* $name:ident($method:ident) -> $reply:ident) => {
        $(#[$doc])*
        pub async fn $name(&self, method: $method) -> Result<Option<$reply>, Error> {
            match self.call(Method::$method(method)).await? {
                Some(Reply::Method(Method::$reply(ok))) => Ok(Some(ok)),
                None => Ok(None),
                Some(other) => Err(Error::unexpected($reply::NAME, Some(&other))),
            }
        }
    };
}

impl Channel {
    pub(crate) fn new(
        conn: Connection,
        id: u16,
        generation: u64,
        open: Arc<AtomicBool>,
        confirms: Arc<ChannelConfirms>,
    ) -> Self {
        let state = Arc::new(ChannelState {
            commands: conn.commands.clone(),
            id,
            generation,
            open: open.clone(),
            confirms,
        });
        Channel {
            conn,
            id,
            generation,
            open,
            state,
        }
    }

    /// The channel number.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The connection it belongs to.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Whether the channel is still open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::SeqCst)
    }

    /// Why the channel closed, once it has: [`Error::ChannelClosed`] with
    /// the broker's code and text when the broker closed it (e.g. 406
    /// PRECONDITION_FAILED for a delivery acknowledgement that timed out),
    /// [`Error::NoReply`] when a call went unanswered,
    /// [`Error::ChannelNotOpen`] when this side closed it, the
    /// connection's error when the connection ended. `None` while open.
    pub fn close_error(&self) -> Option<Error> {
        if self.is_open() {
            return None;
        }
        Some(
            self.state
                .confirms
                .pending
                .failure()
                .unwrap_or_else(|| self.conn.state.closed_error()),
        )
    }

    /// Sends any client method and waits for its reply, if it has one
    /// (`None` for methods without a reply or sent with `no-wait`). A
    /// refusal closes the channel and comes back as [`Error::ChannelClosed`].
    pub async fn call(&self, method: impl Into<Method>) -> Result<Option<Reply>, Error> {
        let (reply, rx) = oneshot::channel();
        self.conn.send(Command::Call {
            channel: self.id,
            generation: self.generation,
            method: method.into(),
            reply,
        })?;
        rx.await.map_err(|_| self.conn.state.closed_error())?
    }

    fn send(&self, method: Method) -> Result<(), Error> {
        self.conn.send(Command::Send {
            channel: self.id,
            generation: self.generation,
            method,
        })
    }

    rpc!(
        /// `exchange.declare`
        exchange_declare(ExchangeDeclare) -> ExchangeDeclareOk
    );
    rpc!(
        /// `exchange.delete`
        exchange_delete(ExchangeDelete) -> ExchangeDeleteOk
    );
    rpc!(
        /// `exchange.bind` (exchange to exchange)
        exchange_bind(ExchangeBind) -> ExchangeBindOk
    );
    rpc!(
        /// `exchange.unbind`
        exchange_unbind(ExchangeUnbind) -> ExchangeUnbindOk
    );
    rpc!(
        /// `queue.declare`: the reply has the name (server-chosen if empty) and counts.
        queue_declare(QueueDeclare) -> QueueDeclareOk
    );
    rpc!(
        /// `queue.bind`
        queue_bind(QueueBind) -> QueueBindOk
    );
    rpc!(
        /// `queue.unbind`
        queue_unbind(QueueUnbind) -> QueueUnbindOk
    );
    rpc!(
        /// `queue.purge`: the reply has the number of messages purged.
        queue_purge(QueuePurge) -> QueuePurgeOk
    );
    rpc!(
        /// `queue.delete`: the reply has the number of messages deleted.
        queue_delete(QueueDelete) -> QueueDeleteOk
    );
    rpc!(
        /// `basic.qos`
        basic_qos(BasicQos) -> BasicQosOk
    );
    rpc!(
        /// `basic.cancel`
        basic_cancel(BasicCancel) -> BasicCancelOk
    );
    rpc!(
        /// `basic.recover`
        basic_recover(BasicRecover) -> BasicRecoverOk
    );
    rpc!(
        /// `channel.flow`
        flow(ChannelFlow) -> ChannelFlowOk
    );

    /// `basic.qos` for a per-consumer prefetch of `count` messages.
    pub async fn qos(&self, count: u16) -> Result<(), Error> {
        self.basic_qos(BasicQos {
            prefetch_count: count,
            ..Default::default()
        })
        .await
        .map(|_| ())
    }

    /// `confirm.select`: numbers every later publish from 1; each
    /// [`PublishConfirm`] then resolves with the broker's ack or nack.
    pub async fn confirm_select(&self) -> Result<(), Error> {
        self.call(ConfirmSelect { no_wait: false }).await.map(|_| ())
    }

    /// `tx.select`
    pub async fn tx_select(&self) -> Result<(), Error> {
        self.call(TxSelect {}).await.map(|_| ())
    }

    /// `tx.commit`
    pub async fn tx_commit(&self) -> Result<(), Error> {
        self.call(TxCommit {}).await.map(|_| ())
    }

    /// `tx.rollback`
    pub async fn tx_rollback(&self) -> Result<(), Error> {
        self.call(TxRollback {}).await.map(|_| ())
    }

    /// Publishes a message: queues it for the socket and returns a future
    /// that resolves with the broker's confirmation, so many publishes can
    /// be in flight at once. It waits only when the connection's publish
    /// buffer ([`super::Config::publish_buffer`]) is full, i.e. when the
    /// socket takes less than is published (a broker that stops reading):
    /// that is the backpressure that bounds a publisher's memory.
    ///
    /// When there is room, the message is queued as `publish` is called,
    /// and the future is ready at once; when there is not, it is queued
    /// once the future has waited for the room, and a future dropped before
    /// then publishes nothing.
    ///
    /// `properties` are a [`BasicProperties`], or an
    /// `Arc<BasicProperties>` (or a reference to one) to publish the same
    /// properties many times without copying them for each message.
    /// Properties given by value are encoded from where they are, and
    /// never copied when they equal the last message's (see
    /// [`PublishProperties`]).
    ///
    /// `body` is a [`Bytes`] or `Vec<u8>`, or borrowed (`&[u8]`, `&Bytes`):
    /// a body serialized into a buffer that is reused costs no allocation
    /// (see [`PublishBody`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), acemq_core::amqp::Error> {
    /// use std::sync::Arc;
    /// use acemq_core::amqp::{Config, Confirmation, Connection};
    /// use acemq_codec::{BasicProperties, QueueDeclare};
    /// let conn = Connection::open("memory://publish-doc", Config::default()).await?;
    /// let ch = conn.channel().await?;
    /// ch.confirm_select().await?;
    /// ch.queue_declare(QueueDeclare { queue: "orders".into(), ..Default::default() }).await?;
    /// // One `Arc` of properties and one buffer for every message.
    /// let props = Arc::new(BasicProperties { delivery_mode: Some(2), ..Default::default() });
    /// let mut buffer = Vec::new();
    /// let mut confirms = Vec::new();
    /// for n in 0..3 {
    ///     buffer.clear();
    ///     buffer.extend_from_slice(format!("order {n}").as_bytes());
    ///     confirms.push(ch.publish("", "orders", false, &props, &buffer).await?);
    /// }
    /// for confirm in confirms {
    ///     assert_eq!(confirm.await?, Confirmation::Ack);
    /// }
    /// let first = ch.basic_get("orders", true).await?.expect("a message");
    /// assert_eq!(&first.body[..], b"order 0");
    /// conn.close().await?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        mandatory: bool,
        properties: impl PublishProperties,
        body: impl PublishBody,
    ) -> impl Future<Output = Result<PublishConfirm, Error>> + Send + '_ {
        let route = Route::Parts {
            exchange,
            routing_key,
            mandatory,
        };
        properties
            .with_properties(|properties| self.start_publish(&route, properties, body.as_slice(), body.as_bytes()))
    }

    /// `basic.publish` with every field of the method under your control
    /// (see [`Channel::publish`]).
    pub fn basic_publish(
        &self,
        publish: BasicPublish,
        properties: impl PublishProperties,
        body: impl PublishBody,
    ) -> impl Future<Output = Result<PublishConfirm, Error>> + Send + '_ {
        properties.with_properties(|properties| {
            self.start_publish(&Route::Method(&publish), properties, body.as_slice(), body.as_bytes())
        })
    }

    /// [`Channel::basic_publish`] with properties the caller keeps too.
    ///
    /// The message is encoded here, in the caller's task, under the command
    /// command queue's lock: its frames go straight into the bytes the driver takes
    /// next, and the driver only checks the channel, numbers the confirm and
    /// copies them to the write buffer (see [`Outgoing`]).
    ///
    /// When the publish buffer has room, that happens here and now, and
    /// the future returned is ready: it holds nothing but the outcome, so
    /// awaiting it moves no message about. Otherwise the future waits for
    /// the room (holding a copy of the message: the method cloned, the
    /// properties' and body's counts raised) and queues the message once it
    /// has it; dropped before then, it publishes nothing.
    pub(crate) fn publish_shared(
        &self,
        publish: &BasicPublish,
        properties: &Arc<BasicProperties>,
        body: &Bytes,
    ) -> Publishing<'_> {
        self.start_publish(
            &Route::Method(publish),
            PropertiesRef::Shared(properties),
            body,
            Some(body),
        )
    }

    /// Queues the message now if there is room, else returns the wait for
    /// it. `owned` is `body` as a `Bytes` a waiting publish keeps, when
    /// there is one (else it keeps a copy).
    ///
    /// The room comes from the command queue's credit (see [`Outgoing::credit`]),
    /// taken under the lock the publish is queued under anyway; only when
    /// that runs short does it go to the publish buffer's semaphore, for
    /// this message's room and a chunk of credit besides.
    fn start_publish(
        &self,
        route: &Route<'_>,
        properties: PropertiesRef<'_>,
        body: &[u8],
        owned: Option<&Bytes>,
    ) -> Publishing<'_> {
        let connection = &self.conn.state;
        let room = connection.room_for(body.len());
        if let Some(queued) = self.queue_publish(route, properties, body, room, Room::FromCredit) {
            return Publishing::ready(queued);
        }
        match connection.try_take_room_and_credit(room) {
            Ok(Some(spare)) => {
                let queued = self.queue_publish(route, properties, body, room, Room::Taken { spare });
                Publishing::ready(queued.unwrap_or_else(|| Err(connection.closed_error())))
            }
            Ok(None) => {
                let publish = route.to_method();
                let properties = match properties {
                    PropertiesRef::Shared(shared) => shared.clone(),
                    PropertiesRef::Given(given) => Arc::new(given.clone()),
                };
                let body = owned.cloned().unwrap_or_else(|| Bytes::copy_from_slice(body));
                Publishing::Waiting(Box::pin(async move {
                    self.conn.state.take_room(room).await?;
                    let taken = Room::Taken { spare: 0 };
                    self.queue_publish(
                        &Route::Method(&publish),
                        PropertiesRef::Shared(&properties),
                        &body,
                        room,
                        taken,
                    )
                    .unwrap_or_else(|| Err(self.conn.state.closed_error()))
                }))
            }
            Err(err) => Publishing::ready(Err(err)),
        }
    }

    /// Encodes a message into the command queue, its room taken as `from`
    /// says. `None` only when the command queue's credit is short of `room`
    /// ([`Room::FromCredit`]): then nothing was queued nor taken.
    #[inline]
    fn queue_publish(
        &self,
        route: &Route<'_>,
        properties: PropertiesRef<'_>,
        body: &[u8],
        room: u32,
        from: Room,
    ) -> Option<Result<PublishConfirm, Error>> {
        let connection = &self.conn.state;
        let frame_max = connection.tuned.get().map_or(FRAME_MIN_SIZE, |tuned| tuned.frame_max);
        let (channel, generation) = (self.id, self.generation);
        let confirms = &self.state.confirms;
        let queued = self.conn.commands.send_with(|commands, outgoing| {
            match from {
                Room::FromCredit => match outgoing.credit.checked_sub(room) {
                    Some(left) => outgoing.credit = left,
                    None => return Err(None),
                },
                Room::Taken { spare } => outgoing.credit += spare,
            }
            let start = outgoing.frames.len();
            let frames = &mut outgoing.frames;
            let encoded = match *route {
                Route::Method(publish) => outgoing
                    .encoder
                    .encode(channel, publish, properties, body, frame_max, frames),
                Route::Parts {
                    exchange,
                    routing_key,
                    mandatory,
                } => outgoing.encoder.encode_route(
                    channel,
                    exchange,
                    routing_key,
                    mandatory,
                    properties,
                    body,
                    frame_max,
                    frames,
                ),
            };
            if let Err(err) = encoded {
                // Nothing was queued: its room becomes credit for the next.
                outgoing.credit += room;
                return Err(Some(err));
            }
            outgoing.records.push(Published {
                channel,
                generation,
                len: frames.len() - start,
                room,
                returned: route.return_key(properties.get()),
            });
            match commands.last_mut() {
                Some(Command::Publishes(run)) => *run += 1,
                _ => commands.push(Command::Publishes(1)),
            }
            // Numbered under the command queue's lock, as the driver counts it.
            Ok(confirms.pending.number())
        });
        match queued {
            Some(Ok(number)) => Some(Ok(PublishConfirm {
                confirms: confirms.clone(),
                number,
            })),
            Some(Err(None)) => None,
            Some(Err(Some(err))) => Some(Err(Error::Command(crate::proto::CommandError::Encode(err)))),
            // The driver is gone (and the room with it).
            None => Some(Err(connection.closed_error())),
        }
    }

    /// `basic.consume`; deliveries come through the returned [`Consumer`].
    pub async fn basic_consume(&self, method: BasicConsume) -> Result<Consumer, Error> {
        let (reply, rx) = oneshot::channel();
        self.conn.send(Command::Consume {
            channel: self.id,
            generation: self.generation,
            method,
            reply,
        })?;
        let (tag, deliveries) = rx.await.map_err(|_| self.conn.state.closed_error())??;
        Ok(Consumer {
            tag,
            channel: self.clone(),
            deliveries,
        })
    }

    /// `basic.consume` on `queue` with a server-chosen tag and acks on.
    pub async fn consume(&self, queue: &str) -> Result<Consumer, Error> {
        self.basic_consume(BasicConsume {
            queue: queue.into(),
            ..Default::default()
        })
        .await
    }

    /// `basic.get`: one message, or `None` when the queue is empty.
    pub async fn basic_get(&self, queue: &str, no_ack: bool) -> Result<Option<GetMessage>, Error> {
        let method = BasicGet {
            queue: queue.into(),
            no_ack,
            ..Default::default()
        };
        match self.call(method).await? {
            Some(Reply::Content(content)) => {
                let content = *content;
                let Method::BasicGetOk(ok) = content.method else {
                    return Err(Error::UnexpectedReply {
                        expected: BASIC_GET_REPLIES,
                        got: Some(content.method.name()),
                    });
                };
                Ok(Some(GetMessage {
                    delivery_tag: ok.delivery_tag,
                    redelivered: ok.redelivered,
                    exchange: ok.exchange,
                    routing_key: ok.routing_key,
                    message_count: ok.message_count,
                    properties: content.header.map(|h| h.properties),
                    body: content.body,
                    acker: Acker {
                        connection: self.conn.state.clone(),
                        channel: self.id,
                        generation: self.generation,
                    },
                }))
            }
            Some(Reply::Method(Method::BasicGetEmpty(_))) => Ok(None),
            other => Err(Error::unexpected(BASIC_GET_REPLIES, other.as_ref())),
        }
    }

    /// `basic.ack` (queued at once).
    pub fn basic_ack(&self, delivery_tag: u64, multiple: bool) -> Result<(), Error> {
        self.send(BasicAck { delivery_tag, multiple }.into())
    }

    /// `basic.nack` (queued at once).
    pub fn basic_nack(&self, delivery_tag: u64, multiple: bool, requeue: bool) -> Result<(), Error> {
        self.send(
            BasicNack {
                delivery_tag,
                multiple,
                requeue,
            }
            .into(),
        )
    }

    /// `basic.reject` (queued at once).
    pub fn basic_reject(&self, delivery_tag: u64, requeue: bool) -> Result<(), Error> {
        self.send(BasicReject { delivery_tag, requeue }.into())
    }

    /// `channel.close` with a normal close; waits for `close-ok`.
    pub async fn close(&self) -> Result<(), Error> {
        self.call(crate::proto::goodbye()).await.map(|_| ())
    }
}
