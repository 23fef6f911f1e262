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
    let mut out = vec![Declaration::exchange(DLX, "direct")];
    for suffix in suffixes {
        let name = format!("{queue}.{suffix}");
        out.push(Declaration::Queue {
            name: name.clone(),
            durable: true,
            arguments: FieldTable::new(),
        });
        out.push(Declaration::bind(&name, DLX, &name));
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
    queues: Vec<(String, QueueOptions)>,
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
        self.queue_with(name, QueueOptions::quorum())
    }

    /// A durable quorum queue with arguments of the service's own (e.g.
    /// `x-message-ttl`, `x-max-length`), written after acemq's. The typed
    /// [`Topology::queue_with`] says the same for the arguments it knows.
    pub fn queue_with_arguments(self, name: &str, arguments: FieldTable) -> Self {
        let mut options = QueueOptions::quorum();
        options.arguments = arguments;
        self.queue_with(name, options)
    }

    /// A durable queue with typed options: its type, single active
    /// consumer, a priority range, and arguments of the service's own. A
    /// queue named twice keeps its first options.
    ///
    /// ```
    /// use acemq_core::topology::{QueueOptions, Topology};
    /// let topology = Topology::new()
    ///     .queue_with("invoices", QueueOptions::quorum().single_active_consumer())
    ///     .queue_with("emails", QueueOptions::classic().max_priority(9));
    /// assert!(topology.declarations().is_ok());
    /// // RabbitMQ refuses priorities on a quorum queue: refused before asking it.
    /// let refused = Topology::new().queue_with("q", QueueOptions::quorum().max_priority(9));
    /// assert!(matches!(refused.declarations(), Err(acemq_core::Error::Config(_))));
    /// ```
    pub fn queue_with(mut self, name: &str, options: QueueOptions) -> Self {
        if !self.queues.iter().any(|(q, _)| q == name) {
            self.queues.push((name.to_string(), options));
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
    pub fn exchange(self, name: &str, kind: &str) -> Self {
        self.exchange_with(name, kind, ExchangeOptions::new())
    }

    /// A durable exchange with options: an alternate exchange, or arguments
    /// of the service's own. Recorded with them, so a recovery declares it
    /// again exactly so.
    pub fn exchange_with(mut self, name: &str, kind: &str, options: ExchangeOptions) -> Self {
        self.extra.push(Declaration::Exchange {
            name: name.into(),
            kind: kind.into(),
            durable: true,
            arguments: options.into_arguments(),
        });
        self
    }

    /// Binds `queue` to `exchange` with `routing_key` (also a server-named
    /// queue from [`Conn::declare_server_named_queue`]: after a recovery the
    /// binding follows its new name).
    pub fn bind(self, queue: &str, exchange: &str, routing_key: &str) -> Self {
        self.bind_with(queue, exchange, routing_key, FieldTable::new())
    }

    /// Binds `queue` to `exchange` with `routing_key` and the binding's
    /// `arguments`, exactly (a recovery binds it again with them).
    pub fn bind_with(mut self, queue: &str, exchange: &str, routing_key: &str, arguments: FieldTable) -> Self {
        self.extra.push(Declaration::Bind {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments,
        });
        self
    }

    /// Binds `queue` to the headers exchange `exchange`: a message goes to
    /// it when its headers match `headers`, all of them or any one
    /// ([`HeadersMatch`], written as `x-match`). Other `x-` keys in
    /// `headers` are not matched, as RabbitMQ does it.
    ///
    /// ```
    /// use acemq_codec::{FieldTable, FieldValue};
    /// use acemq_core::topology::{HeadersMatch, Topology};
    /// let mut headers = FieldTable::new();
    /// headers.insert("format", FieldValue::from("pdf"));
    /// headers.insert("type", FieldValue::from("report"));
    /// let topology = Topology::new()
    ///     .exchange("documents", "headers")
    ///     .queue("pdf-reports")
    ///     .bind_headers("pdf-reports", "documents", HeadersMatch::All, headers);
    /// assert_eq!(topology.declarations().unwrap().len(), 3);
    /// ```
    pub fn bind_headers(self, queue: &str, exchange: &str, matching: HeadersMatch, headers: FieldTable) -> Self {
        self.bind_with(queue, exchange, "", matching.binding_arguments(headers))
    }

    /// Binds exchange `destination` to `source` with `routing_key`.
    pub fn bind_exchange(self, destination: &str, source: &str, routing_key: &str) -> Self {
        self.bind_exchange_with(destination, source, routing_key, FieldTable::new())
    }

    /// Binds exchange `destination` to `source` with `routing_key` and the
    /// binding's `arguments` (for a headers `source`, see
    /// [`HeadersMatch::binding_arguments`]).
    pub fn bind_exchange_with(
        mut self,
        destination: &str,
        source: &str,
        routing_key: &str,
        arguments: FieldTable,
    ) -> Self {
        self.extra.push(Declaration::ExchangeBind {
            destination: destination.into(),
            source: source.into(),
            routing_key: routing_key.into(),
            arguments,
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
        for (queue, options) in &self.queues {
            let dead_letters = self.dead_letters.contains(queue) || self.dead_letter_to.iter().any(|(q, _)| q == queue);
            options.check(queue, dead_letters)?;
            let mut arguments = FieldTable::new();
            arguments.push("x-queue-type", FieldValue::from(options.kind.as_str()));
            if self.dead_letters.contains(queue) {
                arguments.push("x-dead-letter-exchange", FieldValue::from(DLX));
                arguments.push("x-dead-letter-routing-key", FieldValue::from(format!("{queue}.dlq")));
            } else if let Some((_, exchange)) = self.dead_letter_to.iter().find(|(q, _)| q == queue) {
                arguments.push("x-dead-letter-exchange", FieldValue::from(exchange.as_str()));
            }
            options.write_typed(&mut arguments);
            for (key, value) in options.arguments.iter() {
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

/// The type of a queue [`Topology`] declares (`x-queue-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueType {
    /// A replicated quorum queue (the default): the one acemq's consumer is
    /// made for, with a delivery count it reads as attempts.
    #[default]
    Quorum,
    /// A classic queue: the only type with priorities (`x-max-priority`).
    Classic,
    /// A stream: an append-only log read from an offset; it takes neither
    /// priorities, single active consumer (over AMQP 0-9-1) nor dead-letter
    /// arguments.
    Stream,
}

impl QueueType {
    /// The `x-queue-type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
            QueueType::Stream => "stream",
        }
    }
}

/// Typed options of a queue for [`Topology::queue_with`]: what would
/// otherwise be raw argument strings, checked before anything is declared
/// against what RabbitMQ (3.10 and 4.0 alike) refuses.
///
/// - single active consumer ([`QueueOptions::single_active_consumer`],
///   `x-single-active-consumer`): quorum and classic queues; a stream
///   refuses it over AMQP 0-9-1;
/// - a priority range ([`QueueOptions::max_priority`], `x-max-priority`,
///   0 to 255 by its type): classic queues only, quorum queues and streams
///   refuse it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueOptions {
    kind: QueueType,
    single_active_consumer: bool,
    max_priority: Option<u8>,
    arguments: FieldTable,
}

impl QueueOptions {
    /// A quorum queue, without options (what [`Topology::queue`] declares).
    pub fn quorum() -> Self {
        Self::of_type(QueueType::Quorum)
    }

    /// A classic queue, without options.
    pub fn classic() -> Self {
        Self::of_type(QueueType::Classic)
    }

    /// A stream, without options.
    pub fn stream() -> Self {
        Self::of_type(QueueType::Stream)
    }

    /// A queue of type `kind`, without options.
    pub fn of_type(kind: QueueType) -> Self {
        QueueOptions {
            kind,
            ..Default::default()
        }
    }

    /// The queue's type.
    pub fn queue_type(&self) -> QueueType {
        self.kind
    }

    /// One consumer at a time gets the queue's messages; the others wait
    /// and take over, in the order they subscribed, when it goes
    /// (`x-single-active-consumer`).
    pub fn single_active_consumer(mut self) -> Self {
        self.single_active_consumer = true;
        self
    }

    /// Waiting messages go out highest `priority` property first, up to `max`
    /// (`x-max-priority`; RabbitMQ advises at most 10 levels). Classic
    /// queues only.
    pub fn max_priority(mut self, max: u8) -> Self {
        self.max_priority = Some(max);
        self
    }

    /// An argument of the service's own (e.g. `x-message-ttl`), written
    /// after acemq's and the typed ones, and passed to the broker as it is.
    pub fn argument(mut self, name: &str, value: impl Into<FieldValue>) -> Self {
        self.arguments.insert(name, value.into());
        self
    }

    /// Refuses what RabbitMQ refuses of this type, before asking it.
    fn check(&self, queue: &str, dead_letters: bool) -> Result<(), Error> {
        let refuse = |what: &str| {
            Err(Error::Config(format!(
                "queue {queue:?}: {what} (RabbitMQ refuses it with 406 PRECONDITION_FAILED)"
            )))
        };
        if self.max_priority.is_some() && self.kind != QueueType::Classic {
            return refuse(&format!(
                "a {} queue takes no x-max-priority; priorities need a classic queue",
                self.kind.as_str()
            ));
        }
        if self.kind == QueueType::Stream && self.single_active_consumer {
            return refuse("a stream takes no x-single-active-consumer over AMQP 0-9-1");
        }
        if self.kind == QueueType::Stream && dead_letters {
            return refuse("a stream takes no dead-letter arguments");
        }
        Ok(())
    }

    /// The typed options as arguments.
    fn write_typed(&self, arguments: &mut FieldTable) {
        if self.single_active_consumer {
            arguments.push("x-single-active-consumer", FieldValue::Bool(true));
        }
        if let Some(max) = self.max_priority {
            arguments.push("x-max-priority", FieldValue::I32(i32::from(max)));
        }
    }
}

/// Options of an exchange for [`Topology::exchange_with`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExchangeOptions {
    alternate_exchange: Option<String>,
    arguments: FieldTable,
}

impl ExchangeOptions {
    /// No options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where a message this exchange routes nowhere goes instead
    /// (`alternate-exchange`): it is routed there (and on through that
    /// exchange's own alternate, if any), and a mandatory publish is
    /// returned only if the alternate routes it nowhere either.
    pub fn alternate_exchange(mut self, exchange: &str) -> Self {
        self.alternate_exchange = Some(exchange.to_string());
        self
    }

    /// An argument of the service's own, passed as it is.
    pub fn argument(mut self, name: &str, value: impl Into<FieldValue>) -> Self {
        self.arguments.insert(name, value.into());
        self
    }

    fn into_arguments(self) -> FieldTable {
        let mut arguments = FieldTable::new();
        if let Some(alternate) = self.alternate_exchange {
            arguments.push("alternate-exchange", FieldValue::from(alternate));
        }
        for (key, value) in self.arguments.iter() {
            arguments.push(key.clone(), value.clone());
        }
        arguments
    }
}

/// How a headers exchange's binding matches a message's headers (its
/// `x-match` argument).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeadersMatch {
    /// Every header of the binding, with its value (`all`, RabbitMQ's
    /// default). A header bound to `Void` matches its presence whatever
    /// its value.
    #[default]
    All,
    /// At least one of them (`any`).
    Any,
}

impl HeadersMatch {
    /// The `x-match` value.
    pub fn as_str(self) -> &'static str {
        match self {
            HeadersMatch::All => "all",
            HeadersMatch::Any => "any",
        }
    }

    /// `headers` with `x-match` set to this, as a binding's arguments.
    pub fn binding_arguments(self, headers: FieldTable) -> FieldTable {
        let mut arguments = FieldTable::new();
        arguments.push("x-match", FieldValue::from(self.as_str()));
        for (key, value) in headers.iter() {
            if key.as_bytes() != b"x-match" {
                arguments.push(key.clone(), value.clone());
            }
        }
        arguments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments_of(declarations: &[Declaration], wanted: &str) -> FieldTable {
        declarations
            .iter()
            .find_map(|d| match d {
                Declaration::Queue { name, arguments, .. } if name == wanted => Some(arguments.clone()),
                Declaration::Exchange { name, arguments, .. } if name == wanted => Some(arguments.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{wanted} is not declared"))
    }

    #[test]
    fn typed_options_write_exactly_the_arguments_a_raw_declaration_would() {
        let declarations = Topology::new()
            .queue_with(
                "q",
                QueueOptions::classic()
                    .single_active_consumer()
                    .max_priority(7)
                    .argument("x-message-ttl", FieldValue::I32(60_000)),
            )
            .exchange_with("x", "direct", ExchangeOptions::new().alternate_exchange("ae"))
            .declarations()
            .unwrap();
        let mut queue = FieldTable::new();
        queue.push("x-queue-type", FieldValue::from("classic"));
        queue.push("x-single-active-consumer", FieldValue::Bool(true));
        queue.push("x-max-priority", FieldValue::I32(7));
        queue.push("x-message-ttl", FieldValue::I32(60_000));
        assert_eq!(arguments_of(&declarations, "q"), queue);
        let mut exchange = FieldTable::new();
        exchange.push("alternate-exchange", FieldValue::from("ae"));
        assert_eq!(arguments_of(&declarations, "x"), exchange);
    }

    #[test]
    fn a_headers_binding_says_how_it_matches_once_whatever_the_headers_say() {
        let mut headers = FieldTable::new();
        headers.insert("x-match", FieldValue::from("any"));
        headers.insert("format", FieldValue::from("pdf"));
        let declarations = Topology::new()
            .bind_headers("q", "h", HeadersMatch::All, headers)
            .declarations()
            .unwrap();
        let Declaration::Bind {
            arguments, routing_key, ..
        } = &declarations[0]
        else {
            panic!("{declarations:?}");
        };
        assert_eq!(routing_key, "");
        let mut wanted = FieldTable::new();
        wanted.push("x-match", FieldValue::from("all"));
        wanted.push("format", FieldValue::from("pdf"));
        assert_eq!(*arguments, wanted);
    }

    #[test]
    fn what_rabbitmq_refuses_of_a_queue_type_is_refused_before_anything_is_declared() {
        let refused = [
            Topology::new().queue_with("q", QueueOptions::quorum().max_priority(1)),
            Topology::new().queue_with("q", QueueOptions::stream().max_priority(1)),
            Topology::new().queue_with("q", QueueOptions::stream().single_active_consumer()),
            Topology::new()
                .queue_with("q", QueueOptions::stream())
                .dead_letters("q"),
            Topology::new()
                .queue_with("q", QueueOptions::stream())
                .dead_letter_to("q", "mine"),
        ];
        for topology in refused {
            let err = topology.declarations().unwrap_err();
            assert!(matches!(&err, Error::Config(text) if text.contains("\"q\"")), "{err}");
        }
        let fine = Topology::new()
            .queue_with("a", QueueOptions::quorum().single_active_consumer())
            .queue_with("b", QueueOptions::classic().max_priority(255).single_active_consumer())
            .queue_with("c", QueueOptions::stream())
            .dead_letters("a");
        assert!(fine.declarations().is_ok());
    }
}
