//! acemq-core: an AMQP 0-9-1 client for RabbitMQ, with the reliability a
//! service needs built in.
//!
//! # The acemq API
//!
//! - [`Conn`]: a connection to RabbitMQ (`amqp://`, `amqps://`) or to an
//!   in-process acemq-memory broker (`memory://name`, with the `memory`
//!   feature). It keeps one AMQP connection for publishing and one for
//!   consuming, recovers each when it is lost, and [`Conn::close`] drains
//!   every consumer before it closes them.
//! - [`Publisher`]: sends typed payloads (JSON by default, any [`Codec`])
//!   to one exchange and routing key. [`Publisher::send`] returns once the
//!   broker has confirmed the message; a nack, a mandatory message that
//!   reaches no queue and a blocked broker are errors.
//! - [`consume`](consume()): runs an async handler for each message of a queue. The
//!   handler answers with an [`Ack`]: accept, retry (as the consumer's
//!   [`RetryPolicy`] says: in the process, on a rung queue in the broker,
//!   or to `{queue}.dlq` once the attempts are spent), or park. The
//!   attempt counter travels on the message, in its [`Envelope`].
//! - [`Topology`]: declares a service's queues with their dead-letter
//!   queues and retry rungs, with the arguments every service (in any
//!   language) sharing them must use, and records them so a recovery
//!   declares them again.
//!
//! ```
//! use std::time::Duration;
//! use acemq_core::{consume, Ack, Config, Conn, Message, RetryPolicy, Topology};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced {
//!     id: u64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq_core::Error> {
//! // `amqp://guest:guest@localhost:5672/%2f` for RabbitMQ; here an in-process broker.
//! let conn = Conn::open("memory://crate-doc", Config::default()).await?;
//! let policy = RetryPolicy::exponential(5, Duration::from_secs(1), Duration::from_secs(60));
//! Topology::new().queue("orders").dead_letters("orders").declare(&conn).await?;
//!
//! let (handled, mut seen) = tokio::sync::mpsc::unbounded_channel();
//! let consumer = consume(&conn, "orders", move |m: Message<OrderPlaced>| {
//!     let _ = handled.send((m.payload.id, m.envelope.attempt));
//!     async { Ack::accept() }
//! })
//! .retry_with(policy)
//! .await?;
//!
//! let orders = conn.publisher::<OrderPlaced>("", "orders").mandatory();
//! orders.send(&OrderPlaced { id: 7 }).await?; // confirmed by the broker
//! let first = tokio::time::timeout(Duration::from_secs(5), seen.recv()).await;
//! assert_eq!(first.ok().flatten(), Some((7, 1))); // order 7, first attempt
//!
//! consumer.close().await?; // cancel, let running handlers finish, close
//! conn.close().await?;
//! # Ok(()) }
//! ```
//!
//! [`Config`] holds what a `Conn` is told: confirms, recovery's backoff,
//! `publish_timeout`, `blocked_timeout`, the default retry policy, and the
//! engine's settings (TLS and the connection name among them).
//! [`Conn::replay`] moves dead letters and parked messages back;
//! [`pipeline`] and [`Scheduler`] publish onward on a handler's
//! behalf; the `outbox` feature adds a transactional outbox and inbox.
//!
//! # The guide
//!
//! The [`guide`] explains each part for a service author, one chapter per
//! topic, with examples compiled (and most run) as doc tests:
//! [publishing and confirms](guide::publishing); [consuming, acks and the
//! attempt counter](guide::consuming); [retries, rungs and
//! jitter](guide::retries); [dead letters, parked messages and
//! replay](guide::dead_letters); [recovery](guide::recovery); [blocked
//! connections](guide::blocked); [shutdown and the lifecycle of a
//! service](guide::lifecycle); and [request and reply](guide::request_reply).
//!
//! Two choices are about whom to trust:
//!
//! - [`Conn::replay`] sends a set-aside message back **into the queue it was
//!   set aside from** by default; [`ReplayOptions::to_original`] sends it to
//!   the exchange and routing key it was first published with instead
//!   (where every bound queue gets it again), as recorded by the consumer
//!   from the delivery, never taken from a producer's headers.
//! - Routing slips ([`pipeline::RoutingSlip`]) are followed only by a consumer
//!   built with [`ConsumerBuilder::routing_slips`], and only to the
//!   destinations it allows; any other consumer treats the slip header as
//!   an ordinary header.
//!
//! # Below it: the engine and the machine
//!
//! The acemq API is built on two layers you can use on their own, for
//! instance to write a conformance suite that must see exactly what a
//! broker did:
//!
//! - [`amqp`], the engine: [`amqp::Connection`] and [`amqp::Channel`] with
//!   every method of AMQP 0-9-1 as RabbitMQ speaks it, each returning what
//!   the broker said (a refusal with its reply code and text). It never
//!   recovers: a loss is reported as it happened.
//! - [`proto`], the machine: the sans-IO connection and channel state
//!   machines (frames in, frames and events out, `now` passed in), which
//!   never sleep, spawn or touch a socket.
//! - [`io`]: the transports the engine's tokio driver runs over (TCP,
//!   rustls TLS, any stream).
//!
//! ```
//! use acemq_core::amqp::{Config, Confirmation, Connection};
//! use acemq_codec::{BasicProperties, QueueDeclare};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq_core::amqp::Error> {
//! let conn = Connection::open("memory://crate-doc-engine", Config::default()).await?;
//! let ch = conn.channel().await?;
//! ch.confirm_select().await?;
//! ch.queue_declare(QueueDeclare { queue: "orders".into(), durable: true, ..Default::default() }).await?;
//!
//! let confirm = ch.publish("", "orders", true, BasicProperties::default(), "hello").await?;
//! assert_eq!(confirm.await?, Confirmation::Ack);
//!
//! let message = ch.basic_get("orders", false).await?.expect("one message");
//! assert_eq!(&message.body[..], b"hello");
//! message.ack()?;
//! conn.close().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ack;
pub mod amqp;
pub mod check;
pub mod codec;
mod config;
mod confirm;
mod conn;
pub mod consume;
mod declaration;
pub mod envelope;
mod error;
#[cfg(any(fuzzing, test))]
pub mod fuzzing;
pub mod guide;
mod hop;
pub mod io;
pub mod metrics_names;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod pipeline;
pub mod properties;
pub mod proto;
mod publish;
pub mod replay;
pub mod retry;
pub mod rpc;
pub mod schedule;
mod set_aside;
mod text;
mod time;
pub mod topology;
pub mod trace;

/// The README's example, compiled and run with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub use ack::{fatal, is_fatal, Ack, BoxError, Fatal, ReplyOutput};
pub use codec::{Codec, CodecError, Json};
pub use config::{Config, OnRecovery, RecoveryEvent};
pub use confirm::SendResult;
pub use conn::Conn;
pub use consume::{consume, Consumer, ConsumerBuilder, Message, OnCancel};
pub use envelope::Envelope;
pub use error::{is_blocked, Error};
pub use properties::{MessageProperties, Outgoing};
pub use publish::{PendingSend, Publisher, Resolving};
pub use replay::{
    HeldMessage, Kept, QueueReader, ReplayDestination, ReplayOptions, ReplayProgress, ReplayReport, SetAside,
};
pub use retry::{Decision, RetryPolicy};
pub use rpc::{Reply, Requester};
pub use schedule::{Scheduler, SchedulerBuilder};
pub use topology::{ExchangeOptions, HeadersMatch, QueueOptions, QueueType, Topology};
pub use trace::TraceContext;
