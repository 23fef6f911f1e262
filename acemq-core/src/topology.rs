//! `Topology`: the queues, exchanges and bindings of `docs/wire-contract.md`, declared
//! exactly as the wire contract says, so that every service (in any
//! language) declaring the same names gets the same arguments and no 406.

use std::collections::BTreeSet;

use acemq_codec::{FieldTable, FieldValue};

use crate::conn::Conn;
pub use crate::declaration::Declaration;
use crate::error::Error;
use crate::retry::{rung_name, RetryPolicy};

/// The dead-letter exchange every `{queue}.dlq` and `{queue}.parked` hangs off.
pub const DLX: &str = "acemq.dlx";

/// `acemq.dlx`, `{queue}.dlq` and `{queue}.parked` with their bindings: what
/// both `Topology::dead_letters` and a starting consumer declare.
pub(crate) fn set_aside_declarations(queue: &str) -> Vec<Declaration> {
    set_aside_queue_declarations(queue, &["dlq", "parked"])
}

/// `acemq.dlx` and `{queue}.{suffix}` for each of `suffixes`, each bound to
/// it under its own name (as [`set_aside_declarations`] declares them).
pub(crate) fn set_aside_queue_declarations(queue: &str, suffixes: &[&str]) -> Vec<Declaration> {
    let mut out = vec![Declaration::Exchange {
        name: DLX.into(),
        kind: "direct".into(),
        durable: true,
    }];
    for suffix in suffixes {
        let name = format!("{queue}.{suffix}");
        out.push(Declaration::Queue {
            name: name.clone(),
            durable: true,
            arguments: FieldTable::new(),
        });
        out.push(Declaration::Bind {
            queue: name.clone(),
            exchange: DLX.into(),
            routing_key: name,
        });
    }
    out
}

/// Where a consumer of `queue` sets its give-ups aside when the queue
/// dead-letters somewhere of the service's own: the `x-dead-letter-exchange`
/// (and `x-dead-letter-routing-key`, if any) `queue` was declared with
/// through this `Conn` (e.g. [`Topology::dead_letter_to`]), unless that is
/// `acemq.dlx` (then `{queue}.dlq`, as usual). `None`: `{queue}.dlq`.
pub(crate) fn declared_dead_letter_to(declared: &[Declaration], queue: &str) -> Option<(String, Option<String>)> {
    let arguments = declared.iter().rev().find_map(|d| match d {
        Declaration::Queue { name, arguments, .. } if name == queue => Some(arguments),
        _ => None,
    })?;
    let text = |key: &str| arguments.get(key).and_then(FieldValue::as_str).map(str::to_string);
    let exchange = text("x-dead-letter-exchange").filter(|x| x != DLX)?;
    Some((exchange, text("x-dead-letter-routing-key")))
}

/// The rung queues of `policy` for `queue`: durable classic queues with
/// exactly `x-message-ttl` (I, ms), `x-dead-letter-exchange` (S "") and
/// `x-dead-letter-routing-key` (S `{queue}`).
pub(crate) fn rung_declarations(queue: &str, policy: &RetryPolicy) -> Vec<Declaration> {
    policy
        .rungs()
        .into_iter()
        .map(|delay| {
            let ttl = i32::try_from(delay.as_millis()).unwrap_or(i32::MAX);
            let mut arguments = FieldTable::new();
            arguments.push("x-message-ttl", FieldValue::I32(ttl));
            arguments.push("x-dead-letter-exchange", FieldValue::from(""));
            arguments.push("x-dead-letter-routing-key", FieldValue::from(queue));
            Declaration::Queue {
                name: rung_name(queue, delay),
                durable: true,
                arguments,
            }
        })
        .collect()
}

/// Declares `declarations` in order on one channel of the consuming connection.
/// During a recovery it waits for it, and a loss cuts it short only to
/// start again on the new connection.
pub(crate) async fn apply(conn: &Conn, declarations: &[Declaration]) -> Result<(), Error> {
    conn.inner
        .on_consuming(|connection| async move {
            let ch = connection.channel().await?;
            for declaration in declarations {
                declaration.apply(&ch).await?;
            }
            ch.close().await?;
            Ok(())
        })
        .await
        .map(|_| ())
}

/// A service's topology, declared in one call.
///
/// ```
/// use std::time::Duration;
/// use acemq_core::{RetryPolicy, Topology};
/// let policy = RetryPolicy::exponential(6, Duration::from_secs(10), Duration::ZERO);
/// let topology = Topology::new().queue("orders").dead_letters("orders").retries("orders", &policy);
/// let names: Vec<String> = topology.declarations().unwrap().iter().filter_map(|d| match d {
///     acemq_core::topology::Declaration::Queue { name, .. } => Some(name.clone()),
///     _ => None,
/// }).collect();
/// assert_eq!(names, ["orders", "orders.dlq", "orders.parked",
///     "orders.retry.40s", "orders.retry.80s", "orders.retry.160s"]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Topology {
    queues: Vec<(String, FieldTable)>,
    dead_letters: BTreeSet<String>,
    dead_letter_to: Vec<(String, String)>,
    retries: Vec<(String, RetryPolicy)>,
    /// Exchanges and bindings of the service's own, declared last, in order.
    extra: Vec<Declaration>,
}

impl Topology {
    /// Nothing declared yet.
    pub fn new() -> Self {
        Topology::default()
    }

    /// A durable quorum queue.
    pub fn queue(self, name: &str) -> Self {
        self.queue_with_arguments(name, FieldTable::new())
    }

    /// A durable quorum queue with arguments of the service's own (e.g.
    /// `x-message-ttl`, `x-max-length`), written after acemq's.
    pub fn queue_with_arguments(mut self, name: &str, arguments: FieldTable) -> Self {
        if !self.queues.iter().any(|(q, _)| q == name) {
            self.queues.push((name.to_string(), arguments));
        }
        self
    }

    /// `queue` dead-letters into `{queue}.dlq` through `acemq.dlx`; also
    /// declares `acemq.dlx`, `{queue}.dlq` and `{queue}.parked`.
    pub fn dead_letters(mut self, queue: &str) -> Self {
        self.dead_letters.insert(queue.to_string());
        self
    }

    /// `queue` dead-letters into the service's own `exchange` instead, and
    /// so do the consumers of `queue` on the same `Conn`: a message they
    /// give up on is published there (confirmed, with `x-acemq-error` and
    /// its envelope), and no `{queue}.dlq` is declared. The routing key is
    /// the queue's `x-dead-letter-routing-key` if it was given one (see
    /// [`Topology::queue_with_arguments`]), else the key the message was
    /// first published with. `Ack::park` still goes to `{queue}.parked`.
    pub fn dead_letter_to(mut self, queue: &str, exchange: &str) -> Self {
        self.dead_letter_to.push((queue.to_string(), exchange.to_string()));
        self
    }

    /// The rung queues of `policy` for `queue`.
    pub fn retries(mut self, queue: &str, policy: &RetryPolicy) -> Self {
        self.retries.push((queue.to_string(), policy.clone()));
        self
    }

    /// A durable exchange of the service's own (`direct`, `topic`, `fanout`,
    /// `headers`).
    pub fn exchange(mut self, name: &str, kind: &str) -> Self {
        self.extra.push(Declaration::Exchange {
            name: name.into(),
            kind: kind.into(),
            durable: true,
        });
        self
    }

    /// Binds `queue` to `exchange` with `routing_key` (also a server-named
    /// queue from [`Conn::declare_server_named_queue`]: after a recovery the
    /// binding follows its new name).
    pub fn bind(mut self, queue: &str, exchange: &str, routing_key: &str) -> Self {
        self.extra.push(Declaration::Bind {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// Binds exchange `destination` to `source` with `routing_key`.
    pub fn bind_exchange(mut self, destination: &str, source: &str, routing_key: &str) -> Self {
        self.extra.push(Declaration::ExchangeBind {
            destination: destination.into(),
            source: source.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// Every declaration, in the order `declare` makes them, or why the
    /// topology cannot work.
    pub fn declarations(&self) -> Result<Vec<Declaration>, Error> {
        for (queue, exchange) in &self.dead_letter_to {
            if self.dead_letters.contains(queue) {
                return Err(Error::Config(format!(
                    "queue {queue:?} has both dead_letters and dead_letter_to({exchange:?}); choose one"
                )));
            }
        }
        let mut out = Vec::new();
        for (queue, extra) in &self.queues {
            let mut arguments = FieldTable::new();
            arguments.push("x-queue-type", FieldValue::from("quorum"));
            if self.dead_letters.contains(queue) {
                arguments.push("x-dead-letter-exchange", FieldValue::from(DLX));
                arguments.push("x-dead-letter-routing-key", FieldValue::from(format!("{queue}.dlq")));
            } else if let Some((_, exchange)) = self.dead_letter_to.iter().find(|(q, _)| q == queue) {
                arguments.push("x-dead-letter-exchange", FieldValue::from(exchange.as_str()));
            }
            for (key, value) in extra.iter() {
                arguments.push(key.clone(), value.clone());
            }
            out.push(Declaration::Queue {
                name: queue.clone(),
                durable: true,
                arguments,
            });
        }
        for queue in &self.dead_letters {
            for declaration in set_aside_declarations(queue) {
                if !out.contains(&declaration) {
                    out.push(declaration);
                }
            }
        }
        for (queue, policy) in &self.retries {
            for declaration in rung_declarations(queue, policy) {
                if !out.contains(&declaration) {
                    out.push(declaration);
                }
            }
        }
        for declaration in &self.extra {
            if !out.contains(declaration) {
                out.push(declaration.clone());
            }
        }
        Ok(out)
    }

    /// Declares everything on the broker, and records it on `conn` (for
    /// recovery to replay).
    pub async fn declare(&self, conn: &Conn) -> Result<(), Error> {
        let declarations = self.declarations()?;
        apply(conn, &declarations).await?;
        conn.record_declarations(&declarations);
        Ok(())
    }
}
