//! The hops the library publishes for a handler (statements 24 and 25 of
//! `docs/statements.md`): `Ack::then` outputs, [`Pipeline`] stages, and [`RoutingSlip`]
//! steps.
//!
//! Every hop is a library publish (mandatory, confirmed on the library
//! channel even on a connection without confirms), and the input is acked
//! only after the hop's confirm. The hop's message-id is derived from the
//! input's id and the hop ([`crate::envelope::hop_id`]), so a redelivered
//! input yields the same output id; its causation-id is the input's id, its
//! correlation-id the input's, and its attempt 1. A hop that fails (nack,
//! NO_ROUTE, a lost connection) is a failure of the input, retried under
//! its policy like a handler error.
//!
//! Must never: start a stage's consumer before every stage's queue, dead
//! letters and rungs are declared; have an input acked before its hop is
//! confirmed; or have a routing slip followed by a consumer that did not
//! opt in ([`crate::ConsumerBuilder::routing_slips`]).

use std::future::Future;
use std::pin::Pin;

use acemq_codec::{BasicProperties, BasicPublish, FieldArray, FieldTable, FieldValue};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ack::Ack;
use crate::conn::Conn;
use crate::consume::{consume, Consumer, Message};
use crate::envelope::Envelope;
use crate::error::Error;
use crate::hop::{now_secs, Destination};
pub use crate::hop::{SlipDestinations, ROUTING_SLIP_HEADER, ROUTING_SLIP_STEP_HEADER};
use crate::retry::RetryPolicy;
use crate::topology::Topology;

/// An ordered list of destinations a message visits, one step at a time:
/// when a step's handler accepts it (or gives an `Ack::then` output), the
/// consumer forwards it to the next step, then acks. Only consumers built
/// with [`crate::ConsumerBuilder::routing_slips`] forward, and only to the
/// destinations they allow ([`SlipDestinations`]); any other consumer
/// handles a message with a slip as an ordinary one. The completion
/// destination, if any, is the last step. A message dead-lettered mid-slip
/// keeps its slip, so a replay resumes it at the step that failed.
///
/// ```
/// use acemq_core::pipeline::RoutingSlip;
/// let slip = RoutingSlip::new()
///     .to_queue("orders.validate")
///     .step("billing", "invoice")
///     .completion("", "orders.done");
/// assert_eq!(slip.len(), 3);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingSlip {
    steps: Vec<(String, String)>,
}

impl RoutingSlip {
    /// An empty slip.
    pub fn new() -> Self {
        RoutingSlip::default()
    }

    /// A step: the message goes to `exchange` with `routing_key`.
    pub fn step(mut self, exchange: &str, routing_key: &str) -> Self {
        self.steps.push((exchange.into(), routing_key.into()));
        self
    }

    /// A step that is a queue (through the default exchange).
    pub fn to_queue(self, queue: &str) -> Self {
        self.step("", queue)
    }

    /// Where the message goes once every step has run (the last step).
    pub fn completion(self, exchange: &str, routing_key: &str) -> Self {
        self.step(exchange, routing_key)
    }

    /// How many steps (the completion included).
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether it has no step.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    fn header(&self) -> FieldValue {
        FieldValue::Array(FieldArray(
            self.steps
                .iter()
                .map(|(exchange, key)| {
                    let mut step = FieldTable::new();
                    step.push("exchange", FieldValue::from(exchange.as_str()));
                    step.push("routing-key", FieldValue::from(key.as_str()));
                    FieldValue::Table(step)
                })
                .collect(),
        ))
    }

    /// Sends `payload` (JSON) with this slip to its first step, as a library
    /// publish (mandatory, confirmed); returns its message-id.
    pub async fn send<T: Serialize>(&self, conn: &Conn, envelope: Envelope, payload: &T) -> Result<String, Error> {
        let Some((exchange, routing_key)) = self.steps.first() else {
            return Err(Error::Config("a routing slip needs at least one step".into()));
        };
        let body = serde_json::to_vec(payload).map_err(|e| Error::Encode(crate::codec::CodecError::new(e)))?;
        let mut properties = BasicProperties {
            content_type: Some("application/json".into()),
            delivery_mode: Some(2),
            timestamp: Some(now_secs()),
            ..Default::default()
        };
        envelope.write_to(&mut properties);
        let headers = properties.headers.get_or_insert_with(FieldTable::new);
        headers.insert(ROUTING_SLIP_HEADER, self.header());
        headers.insert(ROUTING_SLIP_STEP_HEADER, FieldValue::I32(0));
        let publish = BasicPublish {
            exchange: exchange.as_str().into(),
            routing_key: routing_key.as_str().into(),
            mandatory: true,
            ..Default::default()
        };
        conn.publish_library(publish, properties, Bytes::from(body), &envelope.id)
            .await?;
        Ok(envelope.id)
    }
}

/// The destinations a consumer's routing slips may name, listed: queues
/// (through the default exchange), exchanges with any key, or an exchange
/// with one key. Empty, it allows nothing.
///
/// ```
/// use acemq_core::pipeline::{SlipAllowList, SlipDestinations};
/// let allow = SlipAllowList::new().queue("orders.reserve").destination("billing", "invoice");
/// assert!(allow.allows("", "orders.reserve"));
/// assert!(allow.allows("billing", "invoice"));
/// assert!(!allow.allows("billing", "refund"));
/// assert!(!allow.allows("", "payments"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlipAllowList {
    /// `(exchange, None)` is any key of that exchange.
    destinations: Vec<(String, Option<String>)>,
}

impl SlipAllowList {
    /// Allows nothing yet.
    pub fn new() -> Self {
        SlipAllowList::default()
    }

    /// A queue, through the default exchange.
    pub fn queue(self, queue: &str) -> Self {
        self.destination("", queue)
    }

    /// `exchange` with exactly `routing_key`.
    pub fn destination(mut self, exchange: &str, routing_key: &str) -> Self {
        self.destinations
            .push((exchange.to_string(), Some(routing_key.to_string())));
        self
    }

    /// `exchange` with any routing key (not the default exchange: that
    /// would be every queue; list those with [`SlipAllowList::queue`]).
    pub fn exchange(mut self, exchange: &str) -> Self {
        if !exchange.is_empty() {
            self.destinations.push((exchange.to_string(), None));
        }
        self
    }

    /// Each step of `slip` (e.g. the slip the consumers of a service send).
    pub fn slip(self, slip: &RoutingSlip) -> Self {
        slip.steps
            .iter()
            .fold(self, |allow, (exchange, key)| allow.destination(exchange, key))
    }
}

impl SlipDestinations for SlipAllowList {
    fn allows(&self, exchange: &str, routing_key: &str) -> bool {
        self.destinations
            .iter()
            .any(|(x, key)| x == exchange && key.as_deref().is_none_or(|k| k == routing_key))
    }
}

type StageStart = Box<dyn FnOnce(Conn, RetryPolicy, Option<Destination>) -> StartFuture + Send>;
type StartFuture = Pin<Box<dyn Future<Output = Result<Consumer, Error>> + Send>>;

/// A chain of stages (statement 24 of `docs/statements.md`): each stage is a queue named
/// after it, declared with dead letters and rungs like any consumer's
/// (`Topology::queue`, `dead_letters`, `retries`), and one consumer whose
/// `Ack::then` outputs go to the next stage's queue; the last stage's go to
/// the [`Pipeline::to`] publisher's destination.
///
/// ```no_run
/// # async fn demo(conn: acemq_core::Conn) -> Result<(), acemq_core::Error> {
/// use acemq_core::{pipeline::Pipeline, Ack, Message};
/// let running = Pipeline::new(&conn)
///     .stage("orders.parse", |m: Message<String>| async move { Ack::then(&m.payload.len()) })
///     .stage("orders.store", |m: Message<usize>| async move {
///         println!("{} bytes", m.payload);
///         Ack::accept()
///     })
///     .start()
///     .await?;
/// conn.publisher::<String>("", running.input()).send(&"{}".to_string()).await?;
/// running.close().await?;
/// # Ok(()) }
/// ```
pub struct Pipeline {
    conn: Conn,
    policy: RetryPolicy,
    stages: Vec<(String, StageStart)>,
    to: Option<Destination>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("stages", &self.stages.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("to", &self.to)
            .finish()
    }
}

impl Pipeline {
    /// No stages yet; the connection's retry policy (or an immediate retry).
    pub fn new(conn: &Conn) -> Self {
        Pipeline {
            conn: conn.clone(),
            policy: conn.config().retry.clone().unwrap_or_else(RetryPolicy::immediate),
            stages: Vec::new(),
            to: None,
        }
    }

    /// The retry policy of every stage (its rungs are declared per stage).
    pub fn retry_with(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A stage: queue `name`, consumed by `handler`.
    pub fn stage<T, F, Fut>(mut self, name: &str, handler: F) -> Self
    where
        T: DeserializeOwned + Send + 'static,
        F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Ack> + Send + 'static,
    {
        let queue = name.to_string();
        let start: StageStart = Box::new(move |conn: Conn, policy: RetryPolicy, next: Option<Destination>| {
            Box::pin(async move {
                let mut builder = consume(&conn, &queue, handler).retry_with(policy);
                if let Some(next) = next {
                    builder = builder.then_to(next);
                }
                builder.await
            }) as StartFuture
        });
        self.stages.push((name.to_string(), start));
        self
    }

    /// Where the last stage's outputs go.
    pub fn to<O, C>(mut self, publisher: &crate::Publisher<O, C>) -> Self {
        self.to = Some(Destination {
            exchange: publisher.publish.exchange.to_string(),
            routing_key: publisher.publish.routing_key.to_string(),
            persistent: publisher.persistent,
        });
        self
    }

    /// Declares every stage's queue (with dead letters and rungs) and starts
    /// one consumer per stage.
    pub async fn start(self) -> Result<RunningPipeline, Error> {
        let names: Vec<String> = self.stages.iter().map(|(n, _)| n.clone()).collect();
        if names.is_empty() {
            return Err(Error::Config("a pipeline needs at least one stage".into()));
        }
        let mut topology = Topology::new();
        for name in &names {
            topology = topology.queue(name).dead_letters(name).retries(name, &self.policy);
        }
        topology.declare(&self.conn).await?;
        let mut consumers = Vec::with_capacity(names.len());
        for (i, (_, start)) in self.stages.into_iter().enumerate() {
            let next = match names.get(i + 1) {
                Some(next) => Some(Destination {
                    exchange: String::new(),
                    routing_key: next.clone(),
                    persistent: true,
                }),
                None => self.to.clone(),
            };
            consumers.push(start(self.conn.clone(), self.policy.clone(), next).await?);
        }
        Ok(RunningPipeline { names, consumers })
    }
}

/// A started [`Pipeline`].
#[derive(Debug)]
pub struct RunningPipeline {
    names: Vec<String>,
    consumers: Vec<Consumer>,
}

impl RunningPipeline {
    /// The first stage's queue: where the pipeline's input goes.
    pub fn input(&self) -> &str {
        &self.names[0]
    }

    /// The stages' queues, in order.
    pub fn stages(&self) -> &[String] {
        &self.names
    }

    /// Closes every stage's consumer (each drains as `Consumer::close` says).
    pub async fn close(self) -> Result<(), Error> {
        let mut first_error = None;
        for consumer in self.consumers {
            if let Err(err) = consumer.close().await {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
