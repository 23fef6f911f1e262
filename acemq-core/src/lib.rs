//! acemq-core: the acemq client engine.
//!
//! - [`proto`]: the sans-IO connection and channel machines (frames in,
//!   frames and events out, `now` passed in);
//! - [`io`]: the tokio driver and the transports (TCP, rustls TLS, any stream);
//! - [`amqp`]: the low-level `Connection`/`Channel` API with every method.
//!
//! The acemq API (publishers, consumers, retries, recovery) builds on these.
//! Two of its choices are about whom to trust:
//!
//! - [`Conn::replay`] sends a set-aside message back **into the queue it was
//!   set aside from** by default; [`ReplayOptions::to_original`] sends it to
//!   the exchange and routing key it was first published with instead
//!   (where every bound queue gets it again), as recorded by the consumer
//!   from the delivery, never taken from a producer's headers.
//! - Routing slips ([`hops::RoutingSlip`]) are followed only by a consumer
//!   built with [`ConsumerBuilder::routing_slips`], and only to the
//!   destinations it allows; any other consumer treats the slip header as
//!   an ordinary header.
//!
//! ```
//! use acemq_core::amqp::{Config, Confirmation, Connection};
//! use acemq_codec::{BasicProperties, QueueDeclare};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq_core::amqp::Error> {
//! // `amqp://guest:guest@localhost:5672/%2f` for RabbitMQ; here an in-process broker.
//! let conn = Connection::open("memory://crate-doc", Config::default()).await?;
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
mod attached;
pub mod check;
pub mod codec;
mod config;
mod confirm;
mod conn;
pub mod consume;
mod declaration;
pub mod envelope;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod hop;
pub mod hops;
pub mod io;
pub mod metrics_names;
#[cfg(feature = "outbox")]
pub mod outbox;
pub mod proto;
mod publish;
mod recovery;
pub mod replay;
pub mod retry;
pub mod schedule;
mod set_aside;
mod text;
mod time;
pub mod topology;

pub use ack::{fatal, is_fatal, Ack, BoxError, Fatal};
pub use attached::OnCancel;
pub use codec::{Codec, CodecError, Json};
pub use config::{Config, OnRecovery, RecoveryEvent};
pub use confirm::SendResult;
pub use conn::Conn;
pub use consume::{consume, Consumer, ConsumerBuilder, Message};
pub use envelope::Envelope;
pub use error::{is_blocked, Error};
pub use publish::{PendingSend, Publisher, Settling};
pub use replay::{Kept, ReplayDestination, ReplayOptions, ReplayProgress, ReplayReport, SetAside};
pub use retry::{Decision, RetryPolicy};
pub use schedule::{Scheduler, SchedulerBuilder};
pub use topology::Topology;
