//! The low-level engine API: [`Connection`] and [`Channel`] with every method
//! of AMQP 0-9-1, replies as values and broker refusals as typed errors with
//! their reply code and text — enough to write a broker-conformance suite on.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), acemq_core::amqp::Error> {
//! use acemq_core::amqp::{Config, Connection, Confirmation};
//! use acemq_codec::{BasicProperties, QueueDeclare};
//!
//! // or "amqp://guest:guest@localhost:5672/%2f"
//! let conn = Connection::open("memory://amqp-doc", Config::default()).await?;
//! let ch = conn.channel().await?;
//! ch.confirm_select().await?;
//! ch.queue_declare(QueueDeclare { queue: "orders".into(), durable: true, ..Default::default() }).await?;
//! let confirm = ch.publish("", "orders", true, BasicProperties::default(), "hello").await?;
//! assert_eq!(confirm.await?, Confirmation::Ack);
//! conn.close().await?;
//! # Ok(()) }
//! ```

mod batch_queue;
mod channel;
mod connection;
mod driver;
mod error;
mod message;
mod pending_confirms;
#[cfg(feature = "conformance")]
mod raw;
pub(crate) mod state;
mod transcript;
mod url;

pub use channel::{Channel, Consumer, PublishBody, PublishConfirm, PublishProperties};
pub use connection::{Config, Connection, Credentials, CredentialsFuture, CredentialsProvider};
pub use error::{CredentialsError, Error};
pub use message::{Confirmation, ConnectionEvent, Properties, ReturnedMessage};
#[cfg(feature = "conformance")]
pub use raw::{RawConnection, RawError, DEFAULT_RAW_TIMEOUT, READ_AHEAD};
pub use state::{Delivery, GetMessage};
pub use transcript::{Direction, Transcript, TranscriptEntry, WireFrame, DISPLAY_BUDGET, MAX_DECODED_FRAME};
pub use url::{AmqpUrl, UrlError};

pub use crate::io::TlsConfig;
pub use crate::proto::{Auth, CloseReason, CommandError, Initiator, Refusal, Secret, TuneRequest, Tuned, Wait};
/// The rustls that [`TlsConfig::from_client_config`] takes a
/// `ClientConfig` of: build yours with this one, so the versions match.
pub use rustls;
