//! One declaration as it goes on the wire: what `Topology` and consumers
//! declare, and what `Conn` records (in order) for recovery to replay. A
//! leaf: it knows channels, not connections or topologies.

use acemq_codec::{ExchangeBind, ExchangeDeclare, FieldTable, QueueBind, QueueDeclare};

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
        /// The arguments, exactly (e.g. `alternate-exchange`).
        arguments: FieldTable,
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
    /// `queue.declare` of a server-named queue (empty name; exclusive to the
    /// consuming connection, deleted with it). `name` is the name the broker
    /// gave; recovery declares it anew and records the new one.
    ServerNamedQueue {
        /// The name the broker gave.
        name: String,
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
        /// The binding's arguments, exactly (e.g. `x-match` and the
        /// headers of a headers exchange's binding).
        arguments: FieldTable,
    },
    /// `exchange.bind`: messages of `source` matching the key also go to
    /// `destination`.
    ExchangeBind {
        /// Where messages go.
        destination: String,
        /// Where they come from.
        source: String,
        /// The binding key.
        routing_key: String,
        /// The binding's arguments, exactly.
        arguments: FieldTable,
    },
}

impl Declaration {
    /// A durable exchange of type `kind`, without arguments.
    pub fn exchange(name: &str, kind: &str) -> Declaration {
        Declaration::Exchange {
            name: name.into(),
            kind: kind.into(),
            durable: true,
            arguments: FieldTable::new(),
        }
    }

    /// `queue` bound to `exchange` under `routing_key`, without arguments.
    pub fn bind(queue: &str, exchange: &str, routing_key: &str) -> Declaration {
        Declaration::Bind {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments: FieldTable::new(),
        }
    }

    /// Exchange `destination` bound to `source` under `routing_key`,
    /// without arguments.
    pub fn exchange_bind(destination: &str, source: &str, routing_key: &str) -> Declaration {
        Declaration::ExchangeBind {
            destination: destination.into(),
            source: source.into(),
            routing_key: routing_key.into(),
            arguments: FieldTable::new(),
        }
    }

    /// Sends it on `ch` and waits for the broker's answer; for a queue, the
    /// name the broker declared.
    pub(crate) async fn apply(&self, ch: &Channel) -> Result<Option<String>, Error> {
        match self {
            Declaration::Exchange {
                name,
                kind,
                durable,
                arguments,
            } => {
                ch.exchange_declare(ExchangeDeclare {
                    exchange: name.as_str().into(),
                    kind: kind.as_str().into(),
                    durable: *durable,
                    arguments: arguments.clone(),
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
            Declaration::ServerNamedQueue { arguments, .. } => {
                let ok = ch
                    .queue_declare(QueueDeclare {
                        queue: "".into(),
                        exclusive: true,
                        auto_delete: true,
                        arguments: arguments.clone(),
                        ..Default::default()
                    })
                    .await?;
                return match ok {
                    Some(ok) => Ok(Some(ok.queue.to_string())),
                    None => Err(Error::Engine(crate::amqp::Error::UnexpectedReply {
                        expected: acemq_codec::QueueDeclareOk::NAME,
                        got: None,
                    })),
                };
            }
            Declaration::Bind {
                queue,
                exchange,
                routing_key,
                arguments,
            } => {
                ch.queue_bind(QueueBind {
                    queue: queue.as_str().into(),
                    exchange: exchange.as_str().into(),
                    routing_key: routing_key.as_str().into(),
                    arguments: arguments.clone(),
                    ..Default::default()
                })
                .await?;
            }
            Declaration::ExchangeBind {
                destination,
                source,
                routing_key,
                arguments,
            } => {
                ch.exchange_bind(ExchangeBind {
                    destination: destination.as_str().into(),
                    source: source.as_str().into(),
                    routing_key: routing_key.as_str().into(),
                    arguments: arguments.clone(),
                    ..Default::default()
                })
                .await?;
            }
        }
        Ok(None)
    }

    /// Puts the new names of server-named queues (`(old, new)` pairs) into
    /// this declaration.
    pub(crate) fn rename_queues(&mut self, renames: &[(String, String)]) {
        let Declaration::Bind { queue, .. } = self else {
            return;
        };
        if let Some((_, new)) = renames.iter().find(|(old, _)| old == queue) {
            *queue = new.clone();
        }
    }
}
