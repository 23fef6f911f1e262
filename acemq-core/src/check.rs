//! Is the broker's topology for a queue the wire contract (`docs/wire-contract.md`)?
//! [`check`] compares what is on the broker with what
//! `Topology::new().queue(q).dead_letters(q).retries(q, policy)` declares,
//! and returns every [`Difference`].
//!
//! AMQP 0-9-1 cannot list a queue's arguments or an exchange's bindings, so
//! each is asked the only ways the protocol allows, none of which creates,
//! changes or removes anything:
//!
//! - **existence**: a passive `queue.declare` (`exchange.declare`); 404 means
//!   missing. A missing queue is never created.
//! - **arguments and flags**: only once the passive declare has said the
//!   queue exists, an active declare with the contract's arguments on a
//!   throwaway channel. Declaring an existing queue with equivalent arguments
//!   is a no-op; a 406 PRECONDITION_FAILED names the first inequivalent
//!   argument and the broker's value. The check takes the broker's value and
//!   asks again, so every differing argument of a queue is reported, not only
//!   the first. A queue the contract declares without `x-queue-type` (a
//!   classic one) is asked once more with `x-queue-type` `classic`, since
//!   RabbitMQ takes a redeclare without the argument as equivalent to a
//!   queue of any type. (Between the passive and the active declare, a queue someone
//!   deletes in that instant would be declared anew: AMQP has no
//!   "declare only if it exists with these arguments".)
//! - **bindings** (`acemq.dlx` → `{q}.dlq` under `{q}.dlq`, and `.parked`):
//!   a probe, a mandatory publish on a confirmed channel to `acemq.dlx` with
//!   that key, an empty body and `expiration` `"0"`. A `basic.return`
//!   (312 NO_ROUTE) means no queue is bound under the key. A routed probe
//!   expires at once in an empty queue without consumers and is never
//!   delivered, but note: in a queue that holds messages it waits (invisible,
//!   yet counted in the queue's depth) until it reaches the head, where the
//!   broker drops it without delivering it; and a consumer attached to the
//!   queue at that moment may be handed it. A probe is marked: `message-id`
//!   [`PROBE_MESSAGE_ID`], `type` [`PROBE_TYPE`]. The probe says that the
//!   key reaches *a* queue, not which one.

use std::fmt;

use acemq_codec::{BasicProperties, ExchangeDeclare, FieldTable, FieldValue, QueueDeclare};
use bytes::Bytes;

use crate::amqp::{self, Confirmation};
use crate::conn::Conn;
use crate::error::Error;
use crate::retry::RetryPolicy;
use crate::topology::{Declaration, Topology};

/// The `message-id` of a binding probe.
pub const PROBE_MESSAGE_ID: &str = "acemq-topology-probe";
/// The `type` property of a binding probe.
pub const PROBE_TYPE: &str = "acemq.topology-probe";

/// How many 406s one declaration may answer before the check stops asking
/// (each names one argument).
const MAX_QUESTIONS: usize = 32;

const DLX_ARGUMENT: &str = "x-dead-letter-exchange";
const DLRK_ARGUMENT: &str = "x-dead-letter-routing-key";
const QUEUE_TYPE_ARGUMENT: &str = "x-queue-type";

/// One way the broker's topology differs from the wire contract.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Difference {
    /// A queue of the contract is not on the broker.
    MissingQueue {
        /// The queue.
        queue: String,
    },
    /// An exchange of the contract is not on the broker.
    MissingExchange {
        /// The exchange.
        exchange: String,
    },
    /// A queue's argument (or flag: `durable`) is not the contract's.
    QueueArgument {
        /// The queue.
        queue: String,
        /// The argument, e.g. `x-message-ttl`.
        argument: String,
        /// What the contract says, e.g. `40000 (signedint)`, or `none`.
        expected: String,
        /// What the broker has, or `none`.
        actual: String,
    },
    /// An exchange's type, flag or argument is not the contract's.
    ExchangeArgument {
        /// The exchange.
        exchange: String,
        /// The field, e.g. `type`.
        argument: String,
        /// What the contract says.
        expected: String,
        /// What the broker has.
        actual: String,
    },
    /// No queue is bound to `exchange` under `routing_key` (the probe came
    /// back NO_ROUTE): the contract's binding of `queue` is missing, or it is
    /// under another key.
    MissingBinding {
        /// The exchange.
        exchange: String,
        /// The queue the contract binds.
        queue: String,
        /// The binding key.
        routing_key: String,
    },
    /// The broker refused a question in a way the check cannot read (e.g.
    /// 405 RESOURCE_LOCKED for an exclusive queue of another connection).
    Refused {
        /// What was asked, e.g. `queue orders`.
        what: String,
        /// The reply code.
        code: u16,
        /// The reply text.
        text: String,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Difference::MissingQueue { queue } => write!(f, "missing queue {queue}"),
            Difference::MissingExchange { exchange } => write!(f, "missing exchange {exchange}"),
            Difference::QueueArgument {
                queue,
                argument,
                expected,
                actual,
            } => write!(
                f,
                "queue {queue}: argument {argument} differs: the contract has {expected}, the broker has {actual}"
            ),
            Difference::ExchangeArgument {
                exchange,
                argument,
                expected,
                actual,
            } => write!(
                f,
                "exchange {exchange}: {argument} differs: the contract has {expected}, the broker has {actual}"
            ),
            Difference::MissingBinding {
                exchange,
                queue,
                routing_key,
            } => write!(
                f,
                "binding of {queue} to {exchange} under key {routing_key} is missing (a probe with that key was returned NO_ROUTE)"
            ),
            Difference::Refused { what, code, text } => write!(f, "{what}: the broker refused the check: {code} {text}"),
        }
    }
}

/// Compares the broker's topology for `queue` with the wire contract
/// (`docs/wire-contract.md`): what `Topology::new().queue(queue).dead_letters(queue)`
/// declares, and with `policy` its `.retries(queue, policy)` rungs too.
/// Returns every difference (empty: the topology is the contract's). Nothing
/// is created or changed; see the module docs for how each part is asked and
/// what a binding probe leaves behind.
///
/// An `Err` is a failure to ask (the connection), not a difference.
pub async fn check(conn: &Conn, queue: &str, policy: Option<&RetryPolicy>) -> Result<Vec<Difference>, Error> {
    let mut topology = Topology::new().queue(queue).dead_letters(queue);
    if let Some(policy) = policy {
        topology = topology.retries(queue, policy);
    }
    let declarations = topology.declarations()?;
    let connection = conn.consuming_connection();
    let mut out = Vec::new();
    let mut missing_queues: Vec<String> = Vec::new();
    let mut missing_exchanges: Vec<String> = Vec::new();
    for declaration in &declarations {
        match declaration {
            Declaration::Queue {
                name,
                durable,
                arguments,
            } => {
                let before = out.len();
                check_queue(&connection, name, *durable, arguments, &mut out).await?;
                if out[before..]
                    .iter()
                    .any(|d| matches!(d, Difference::MissingQueue { .. }))
                {
                    missing_queues.push(name.clone());
                }
            }
            Declaration::Exchange {
                name, kind, durable, ..
            } => {
                let before = out.len();
                check_exchange(&connection, name, kind, *durable, &mut out).await?;
                if out[before..]
                    .iter()
                    .any(|d| matches!(d, Difference::MissingExchange { .. }))
                {
                    missing_exchanges.push(name.clone());
                }
            }
            Declaration::Bind {
                queue,
                exchange,
                routing_key,
                ..
            } => {
                let missing = Difference::MissingBinding {
                    exchange: exchange.clone(),
                    queue: queue.clone(),
                    routing_key: routing_key.clone(),
                };
                // Without its exchange or its queue a binding cannot exist
                // (deleting either deletes it): no probe needed.
                if missing_exchanges.contains(exchange) || missing_queues.contains(queue) {
                    out.push(missing);
                    continue;
                }
                if let Some(difference) = probe_binding(&connection, exchange, queue, routing_key).await? {
                    out.push(difference);
                }
            }
            // The contract of one queue has no other kinds of declaration.
            Declaration::ServerNamedQueue { .. } | Declaration::ExchangeBind { .. } => {}
        }
    }
    Ok(out)
}

/// The broker's refusal in `result`, or the error that is not one.
fn refusal<T>(result: Result<T, amqp::Error>) -> Result<Result<T, amqp::Refusal>, Error> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(amqp::Error::ChannelClosed(refusal)) => Ok(Err(refusal)),
        Err(other) => Err(other.into()),
    }
}

async fn check_queue(
    connection: &amqp::Connection,
    name: &str,
    durable: bool,
    contract: &FieldTable,
    out: &mut Vec<Difference>,
) -> Result<(), Error> {
    let ch = connection.channel().await?;
    let passive = QueueDeclare {
        queue: name.into(),
        passive: true,
        ..Default::default()
    };
    match refusal(ch.queue_declare(passive).await)? {
        Ok(_) => {
            let _ = ch.close().await;
        }
        Err(r) if r.code == 404 => {
            out.push(Difference::MissingQueue { queue: name.into() });
            return Ok(());
        }
        Err(r) => {
            out.push(Difference::Refused {
                what: format!("queue {name}"),
                code: r.code,
                text: r.text,
            });
            return Ok(());
        }
    }
    // It exists: ask with the contract's arguments, taking the broker's
    // value after each 406 until the broker agrees.
    let mut asked = contract.clone();
    let mut asked_durable = durable;
    for _ in 0..MAX_QUESTIONS {
        let ch = connection.channel().await?;
        let active = QueueDeclare {
            queue: name.into(),
            durable: asked_durable,
            arguments: asked.clone(),
            ..Default::default()
        };
        let r = match refusal(ch.queue_declare(active).await)? {
            Ok(_) => {
                let _ = ch.close().await;
                if contract.get(QUEUE_TYPE_ARGUMENT).is_none() && asked.get(QUEUE_TYPE_ARGUMENT).is_none() {
                    check_classic(connection, name, asked_durable, &asked, out).await?;
                }
                return Ok(());
            }
            Err(r) => r,
        };
        let Some(inequivalent) = Inequivalent::parse(&r.text).filter(|_| r.code == 406) else {
            out.push(Difference::Refused {
                what: format!("queue {name}"),
                code: r.code,
                text: r.text,
            });
            return Ok(());
        };
        let key = inequivalent.argument.clone();
        let progressed = match key.as_str() {
            "durable" | "auto_delete" | "exclusive" => {
                let contract_flag = if key == "durable" { durable } else { false };
                out.push(Difference::QueueArgument {
                    queue: name.into(),
                    argument: key.clone(),
                    expected: contract_flag.to_string(),
                    actual: inequivalent.current.text(None),
                });
                match (key.as_str(), inequivalent.current.as_bool()) {
                    ("durable", Some(current)) if current != asked_durable => {
                        asked_durable = current;
                        true
                    }
                    _ => false,
                }
            }
            _ => {
                let expected = contract.get(&key);
                out.push(Difference::QueueArgument {
                    queue: name.into(),
                    argument: key.clone(),
                    expected: describe(expected),
                    actual: inequivalent.current.text(expected),
                });
                match inequivalent.current.value(asked.get(&key)) {
                    Some(current) => {
                        let before = asked.get(&key).cloned();
                        match current {
                            Some(value) => {
                                asked.insert(key.as_str(), value);
                            }
                            None => {
                                asked.remove(&key);
                            }
                        }
                        // A queue cannot have a dead-letter routing key
                        // without a dead-letter exchange (the broker refuses
                        // to declare one): without the exchange, the key is
                        // not there either, and asking would be refused.
                        if key == DLX_ARGUMENT
                            && asked.get(DLX_ARGUMENT).is_none()
                            && asked.remove(DLRK_ARGUMENT).is_some()
                        {
                            out.push(Difference::QueueArgument {
                                queue: name.into(),
                                argument: DLRK_ARGUMENT.into(),
                                expected: describe(contract.get(DLRK_ARGUMENT)),
                                actual: "none".into(),
                            });
                        }
                        asked.get(&key).cloned() != before
                    }
                    None => false,
                }
            }
        };
        if !progressed {
            // The broker's value could not be read back: the differences
            // after this one stay unknown.
            return Ok(());
        }
    }
    Ok(())
}

/// A queue the contract declares without `x-queue-type` is a classic one.
/// RabbitMQ takes a redeclare without `x-queue-type` as equivalent to any
/// type, so the question is asked once more with `x-queue-type` `classic`
/// (equivalent, on RabbitMQ, to a classic queue declared without it):
/// a 406 naming the broker's type says it is another.
async fn check_classic(
    connection: &amqp::Connection,
    name: &str,
    durable: bool,
    asked: &FieldTable,
    out: &mut Vec<Difference>,
) -> Result<(), Error> {
    let mut arguments = asked.clone();
    arguments.push(QUEUE_TYPE_ARGUMENT, FieldValue::from("classic"));
    let ch = connection.channel().await?;
    let active = QueueDeclare {
        queue: name.into(),
        durable,
        arguments,
        ..Default::default()
    };
    match refusal(ch.queue_declare(active).await)? {
        Ok(_) => {
            let _ = ch.close().await;
        }
        Err(r) => {
            let like = FieldValue::from("classic");
            let current = Inequivalent::parse(&r.text)
                .filter(|i| r.code == 406 && i.argument == QUEUE_TYPE_ARGUMENT)
                .and_then(|i| i.current.value(Some(&like)))
                .flatten();
            // `current is none`: a classic queue declared without the
            // argument, on a broker that compares it strictly.
            if let Some(current) = current.filter(|c| c.as_str() != Some("classic")) {
                out.push(Difference::QueueArgument {
                    queue: name.into(),
                    argument: QUEUE_TYPE_ARGUMENT.into(),
                    expected: "none (a classic queue)".into(),
                    actual: describe(Some(&current)),
                });
            }
        }
    }
    Ok(())
}

async fn check_exchange(
    connection: &amqp::Connection,
    name: &str,
    kind: &str,
    durable: bool,
    out: &mut Vec<Difference>,
) -> Result<(), Error> {
    let ch = connection.channel().await?;
    let passive = ExchangeDeclare {
        exchange: name.into(),
        kind: kind.into(),
        passive: true,
        ..Default::default()
    };
    match refusal(ch.exchange_declare(passive).await)? {
        Ok(_) => {
            let _ = ch.close().await;
        }
        Err(r) if r.code == 404 => {
            out.push(Difference::MissingExchange { exchange: name.into() });
            return Ok(());
        }
        Err(r) => {
            out.push(Difference::Refused {
                what: format!("exchange {name}"),
                code: r.code,
                text: r.text,
            });
            return Ok(());
        }
    }
    let mut asked_kind = kind.to_string();
    let mut asked_durable = durable;
    for _ in 0..MAX_QUESTIONS {
        let ch = connection.channel().await?;
        let active = ExchangeDeclare {
            exchange: name.into(),
            kind: asked_kind.as_str().into(),
            durable: asked_durable,
            ..Default::default()
        };
        let r = match refusal(ch.exchange_declare(active).await)? {
            Ok(_) => {
                let _ = ch.close().await;
                return Ok(());
            }
            Err(r) => r,
        };
        let Some(inequivalent) = Inequivalent::parse(&r.text).filter(|_| r.code == 406) else {
            out.push(Difference::Refused {
                what: format!("exchange {name}"),
                code: r.code,
                text: r.text,
            });
            return Ok(());
        };
        let expected = match inequivalent.argument.as_str() {
            "type" => kind.to_string(),
            "durable" => durable.to_string(),
            "auto_delete" | "internal" => "false".to_string(),
            _ => "none".to_string(),
        };
        out.push(Difference::ExchangeArgument {
            exchange: name.into(),
            argument: inequivalent.argument.clone(),
            expected,
            actual: inequivalent.current.text(None),
        });
        let current = inequivalent.current.raw().map(str::to_string);
        match (inequivalent.argument.as_str(), current) {
            ("type", Some(current)) if current != asked_kind => asked_kind = current,
            ("durable", Some(current)) if current.parse::<bool>().is_ok_and(|c| c != asked_durable) => {
                asked_durable = !asked_durable
            }
            // auto_delete, internal, alternate-exchange: the active declare
            // cannot ask past them.
            _ => return Ok(()),
        }
    }
    Ok(())
}

async fn probe_binding(
    connection: &amqp::Connection,
    exchange: &str,
    queue: &str,
    routing_key: &str,
) -> Result<Option<Difference>, Error> {
    let ch = connection.channel().await?;
    ch.confirm_select().await?;
    let properties = BasicProperties {
        expiration: Some("0".into()),
        message_id: Some(PROBE_MESSAGE_ID.into()),
        kind: Some(PROBE_TYPE.into()),
        delivery_mode: Some(1),
        ..Default::default()
    };
    let confirm = refusal(ch.publish(exchange, routing_key, true, properties, Bytes::new()).await)?;
    let confirmation = match confirm {
        Ok(confirm) => refusal(confirm.await)?,
        Err(r) => Err(r),
    };
    let difference = match confirmation {
        Ok(Confirmation::Returned(_)) => Some(Difference::MissingBinding {
            exchange: exchange.into(),
            queue: queue.into(),
            routing_key: routing_key.into(),
        }),
        Ok(Confirmation::Ack) | Ok(Confirmation::NotRequested) => None,
        Ok(Confirmation::Nack) => Some(Difference::Refused {
            what: format!("binding probe {exchange} -> {routing_key}"),
            code: 0,
            text: "basic.nack".into(),
        }),
        Err(r) if r.code == 404 => Some(Difference::MissingExchange {
            exchange: exchange.into(),
        }),
        Err(r) => Some(Difference::Refused {
            what: format!("binding probe {exchange} -> {routing_key}"),
            code: r.code,
            text: r.text,
        }),
    };
    if ch.is_open() {
        let _ = ch.close().await;
    }
    Ok(difference)
}

/// A value as the check prints it: `40000 (signedint)`, `"acemq.dlx" (longstr)`, `none`.
fn describe(value: Option<&FieldValue>) -> String {
    match value {
        None => "none".into(),
        Some(v) => format!("{} ({})", show(v), type_name(v)),
    }
}

fn show(value: &FieldValue) -> String {
    if let Some(n) = value.as_i64() {
        return n.to_string();
    }
    match value {
        FieldValue::LongString(s) => format!("{:?}", s.to_string_lossy()),
        FieldValue::Bool(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

/// RabbitMQ's name for a field type, as in its reply texts.
fn type_name(value: &FieldValue) -> &'static str {
    match value {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) | FieldValue::I64L(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal(_) => "decimal",
        FieldValue::LongString(_) => "longstr",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
        FieldValue::ByteArray(_) => "binary",
    }
}

/// `inequivalent arg 'K' for queue 'q' in vhost '/': received R but current is C`,
/// as RabbitMQ (and acemq-memory) write a 406 of a redeclare.
#[derive(Debug, PartialEq)]
struct Inequivalent {
    argument: String,
    current: Shown,
}

/// One side of an inequivalence as the broker wrote it.
#[derive(Debug, PartialEq)]
enum Shown {
    /// `none`: not set.
    None,
    /// `the value 'V' of type 'T'`.
    Typed { value: String, kind: String },
    /// `'V'`: same type class as the other side.
    Bare(String),
}

impl Inequivalent {
    fn parse(text: &str) -> Option<Inequivalent> {
        let rest = &text[text.find("inequivalent arg '")? + "inequivalent arg '".len()..];
        let (argument, rest) = rest.split_once('\'')?;
        let current = &rest[rest.rfind(" but current is ")? + " but current is ".len()..];
        Some(Inequivalent {
            argument: argument.to_string(),
            current: Shown::parse(current.trim())?,
        })
    }
}

impl Shown {
    fn parse(text: &str) -> Option<Shown> {
        if text == "none" {
            return Some(Shown::None);
        }
        if let Some(rest) = text.strip_prefix("the value '") {
            let (value, kind) = rest.rsplit_once("' of type '")?;
            let kind = kind.strip_suffix('\'')?;
            return Some(Shown::Typed {
                value: value.to_string(),
                kind: kind.to_string(),
            });
        }
        let bare = text.strip_prefix('\'')?.strip_suffix('\'')?;
        Some(Shown::Bare(bare.to_string()))
    }

    fn raw(&self) -> Option<&str> {
        match self {
            Shown::None => None,
            Shown::Typed { value, .. } | Shown::Bare(value) => Some(value),
        }
    }

    fn as_bool(&self) -> Option<bool> {
        self.raw()?.parse().ok()
    }

    /// As the check prints it; a bare value takes the type of `like`.
    fn text(&self, like: Option<&FieldValue>) -> String {
        match self {
            Shown::None => "none".into(),
            Shown::Typed { .. } | Shown::Bare(_) => match self.value(like) {
                Some(Some(value)) => describe(Some(&value)),
                _ => self.raw().unwrap_or_default().to_string(),
            },
        }
    }

    /// The broker's value as a field value (`Some(None)`: not set), or
    /// `None` if it cannot be read back. A bare value takes the type of `like`.
    fn value(&self, like: Option<&FieldValue>) -> Option<Option<FieldValue>> {
        let (value, kind) = match self {
            Shown::None => return Some(None),
            Shown::Typed { value, kind } => (value.as_str(), kind.as_str()),
            Shown::Bare(value) => (value.as_str(), like.map(type_name)?),
        };
        let parsed = match kind {
            "longstr" => FieldValue::from(value),
            "bool" => FieldValue::Bool(value.parse().ok()?),
            "byte" => FieldValue::I8(value.parse().ok()?),
            "unsignedbyte" => FieldValue::U8(value.parse().ok()?),
            "short" => FieldValue::I16(value.parse().ok()?),
            "unsignedshort" => FieldValue::U16(value.parse().ok()?),
            "signedint" => FieldValue::I32(value.parse().ok()?),
            "unsignedint" => FieldValue::U32(value.parse().ok()?),
            "long" => FieldValue::I64(value.parse().ok()?),
            _ => return None,
        };
        Some(Some(parsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rabbitmq_texts_parse() {
        let text = "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q.retry.40s' in vhost '/': \
                    received the value '40000' of type 'signedint' but current is the value '20000' of type 'signedint'";
        let i = Inequivalent::parse(text).unwrap();
        assert_eq!(i.argument, "x-message-ttl");
        assert_eq!(i.current.value(None), Some(Some(FieldValue::I32(20000))));
        assert_eq!(i.current.text(None), "20000 (signedint)");

        let text = "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost '/': \
                    received the value 'acemq.dlx' of type 'longstr' but current is none";
        let i = Inequivalent::parse(text).unwrap();
        assert_eq!(i.argument, "x-dead-letter-exchange");
        assert_eq!(i.current, Shown::None);
        assert_eq!(i.current.value(None), Some(None));

        let text = "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received '999' but current is '1000'";
        let i = Inequivalent::parse(text).unwrap();
        let like = FieldValue::I32(999);
        assert_eq!(i.current.value(Some(&like)), Some(Some(FieldValue::I32(1000))));
        assert_eq!(i.current.text(Some(&like)), "1000 (signedint)");

        let text = "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'";
        let i = Inequivalent::parse(text).unwrap();
        assert_eq!((i.argument.as_str(), i.current.as_bool()), ("durable", Some(false)));

        assert!(Inequivalent::parse("NOT_FOUND - no queue 'q' in vhost '/'").is_none());
    }

    #[test]
    fn differences_read_as_sentences() {
        let d = Difference::QueueArgument {
            queue: "orders.retry.40s".into(),
            argument: "x-message-ttl".into(),
            expected: describe(Some(&FieldValue::I32(40000))),
            actual: "20000 (signedint)".into(),
        };
        assert_eq!(
            d.to_string(),
            "queue orders.retry.40s: argument x-message-ttl differs: the contract has 40000 (signedint), the broker has 20000 (signedint)"
        );
        let d = Difference::MissingBinding {
            exchange: "acemq.dlx".into(),
            queue: "orders.parked".into(),
            routing_key: "orders.parked".into(),
        };
        assert!(d
            .to_string()
            .starts_with("binding of orders.parked to acemq.dlx under key orders.parked is missing"));
    }
}
