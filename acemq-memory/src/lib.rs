//! # acemq-memory
//!
//! An in-process AMQP 0-9-1 broker that behaves like RabbitMQ 3.10+, for
//! fast, deterministic tests. It is a broker, not a mock: clients talk AMQP
//! frames to it (through [`amqp_codec`]) over an in-process duplex stream
//! ([`Broker::connect`]) or a loopback TCP port ([`Broker::listen_tcp`]), so
//! any AMQP 0-9-1 client can use it.
//!
//! What it does as RabbitMQ does: the PLAIN/AMQPLAIN handshake with
//! RabbitMQ's tune validation, heartbeats, channel and connection close
//! handshakes with RabbitMQ's reply codes and texts; default, direct,
//! fanout, topic and headers exchanges, exchange-to-exchange bindings;
//! classic, quorum and stream queues; prefetch, acks, nacks, rejects and
//! redelivery; publisher confirms with `multiple`, `basic.return` before the
//! ack; TTL from the head of the queue, `x-expires`, max-length,
//! dead-lettering with `x-death`; `connection.blocked`; and faults for tests
//! ([`Faults`]): sever every connection, force-close them, restart, raise a
//! memory alarm, delete a queue behind its consumers.
//!
//! Time comes from `tokio::time`, so tests can run on a paused clock: a
//! 160-second TTL takes no real time.
//!
//! ## Addressing
//!
//! [`Broker::named`] returns the same broker for the same name anywhere in
//! the process. Clients address it as `memory://name`; the client side
//! (acemq-core) reads `memory://name?confirms=off` as a connection without
//! publisher confirms. The broker itself only provides the name.
//!
//! ## Layers
//!
//! [`BrokerMachine`] (the broker state) and [`Session`] (one connection's
//! protocol) are sans-IO: frames in, frames out, `now` passed in. [`Broker`]
//! is the thin tokio driver around them: one task per connection, batched
//! writes, one lock per broker.
//!
//! ## Example
//!
//! ```
//! use acemq_memory::Broker;
//! use amqp_codec::{encode_method, ConnectionStartOk, Frame, FrameDecoder, Method, PROTOCOL_HEADER};
//! use bytes::BytesMut;
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let broker = Broker::named("doc-example");
//! let mut client = broker.connect();
//! client.write_all(&PROTOCOL_HEADER).await.unwrap();
//!
//! // The broker answers with connection.start ...
//! let decoder = FrameDecoder::new(131_072);
//! let mut buf = BytesMut::new();
//! let start = loop {
//!     if let Some(frame) = decoder.decode(&mut buf).unwrap() {
//!         break frame;
//!     }
//!     client.read_buf(&mut buf).await.unwrap();
//! };
//! assert!(matches!(start, Frame::Method(0, Method::ConnectionStart(_))));
//!
//! // ... and to guest/guest with connection.tune.
//! let start_ok = ConnectionStartOk {
//!     mechanism: "PLAIN".into(),
//!     response: b"\0guest\0guest".as_slice().into(),
//!     locale: "en_US".into(),
//!     ..Default::default()
//! };
//! let mut out = BytesMut::new();
//! encode_method(0, &start_ok.into(), &mut out).unwrap();
//! client.write_all(&out).await.unwrap();
//! let tune = loop {
//!     if let Some(frame) = decoder.decode(&mut buf).unwrap() {
//!         break frame;
//!     }
//!     client.read_buf(&mut buf).await.unwrap();
//! };
//! assert!(matches!(tune, Frame::Method(0, Method::ConnectionTune(t)) if t.frame_max == 131_072));
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod broker;
mod config;
pub mod deadline;
mod error;
pub mod fuzzing;
mod server;
mod session;
#[cfg(test)]
mod session_tests;

pub use broker::{BrokerMachine, ConnId, QueueInfo};
pub use config::{BrokerConfig, User};
pub use server::{Broker, Faults};
pub use session::{Fate, Session};
