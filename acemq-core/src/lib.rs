//! acemq-core: the acemq client engine.
//!
//! - [`proto`]: the sans-IO connection and channel machines (frames in,
//!   frames and events out, `now` passed in);
//! - [`io`]: the tokio driver and the transports (TCP, rustls TLS, any stream);
//! - [`amqp`]: the low-level `Connection`/`Channel` API with every method.
//!
//! The acemq API (publishers, consumers, retries, recovery) builds on these
//! and arrives with its own issues.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod amqp;
pub mod io;
pub mod proto;
