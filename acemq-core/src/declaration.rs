//! One declaration as it goes on the wire: what `Topology` and consumers
//! declare, and what `Conn` records (in order) for recovery to replay. A
//! leaf: it knows channels, not connections or topologies.

use amqp_codec::{ExchangeDeclare, FieldTable, QueueBind, QueueDeclare};

use crate::amqp::Channel;
use crate::error::Error;

/// One declaration, as it goes on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum Declaration {
    /// `exchange.declare`
    Exchange {
        /// The name.
        name: String,
        /// The type (`direct`, ...).
        kind: String,
        /// Durable.
        durable: bool,
    },
    /// `queue.declare`
    Queue {
        /// The name.
        name: String,
        /// Durable.
        durable: bool,
        /// The arguments, exactly.
        arguments: FieldTable,
    },
    /// `queue.bind`
    Bind {
        /// The queue.
        queue: String,
        /// The exchange.
        exchange: String,
        /// The binding key.
        routing_key: String,
    },
}

impl Declaration {
    /// Sends it on `ch` and waits for the broker's answer.
    pub(crate) async fn apply(&self, ch: &Channel) -> Result<(), Error> {
        match self {
            Declaration::Exchange { name, kind, durable } => {
                ch.exchange_declare(ExchangeDeclare {
                    exchange: name.as_str().into(),
                    kind: kind.as_str().into(),
                    durable: *durable,
                    ..Default::default()
                })
                .await?;
            }
            Declaration::Queue {
                name,
                durable,
                arguments,
            } => {
                ch.queue_declare(QueueDeclare {
                    queue: name.as_str().into(),
                    durable: *durable,
                    arguments: arguments.clone(),
                    ..Default::default()
                })
                .await?;
            }
            Declaration::Bind {
                queue,
                exchange,
                routing_key,
            } => {
                ch.queue_bind(QueueBind {
                    queue: queue.as_str().into(),
                    exchange: exchange.as_str().into(),
                    routing_key: routing_key.as_str().into(),
                    ..Default::default()
                })
                .await?;
            }
        }
        Ok(())
    }
}
