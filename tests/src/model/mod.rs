//! The model-based test of the consumer (`tests/tests/model.rs`): random
//! sequences of publishes (with hostile properties among them), handler
//! answers, broker redeliveries and faults run against a real
//! `acemq_core::consume` on a real broker, and a model that says, for every
//! message, which attempts the handler must see and where it must end.
//!
//! [`ops`] is what is generated, [`run`](mod@run) runs it and records, [`check`] is
//! the model. The runner never judges and the model never touches a broker.

pub mod check;
pub mod ops;
pub mod run;

pub use ops::{Op, Setup};
pub use run::{run, Target};

use crate::RabbitVersion;

/// The names of the brokers the model runs against.
pub const MEMORY: &str = "acemq-memory";
/// RabbitMQ 3.10: the private node (`ACEMQ_RABBITMQ_URL`).
pub const RABBITMQ_3_10: &str = "RabbitMQ 3.10";
/// RabbitMQ 4.0: `ACEMQ_RABBITMQ4_URL`.
pub const RABBITMQ_4_0: &str = "RabbitMQ 4.0";

/// The broker called `name` ([`MEMORY`], [`RABBITMQ_3_10`],
/// [`RABBITMQ_4_0`]), or `None` to skip it (said loudly). Under `CI=true`
/// a RabbitMQ the harness requires (see [`crate::brokers`]) that does not
/// answer is a failure.
pub async fn target(name: &str) -> Option<Target> {
    let version = match name {
        MEMORY => {
            return Some(Target {
                name: name.into(),
                url: None,
            })
        }
        RABBITMQ_3_10 => RabbitVersion::V3_10,
        RABBITMQ_4_0 => RabbitVersion::V4_0,
        other => panic!("no broker called {other}"),
    };
    match crate::rabbit_env(version) {
        Some(env) if crate::reachable(&env.url).await => Some(Target {
            name: name.into(),
            url: Some(env.url),
        }),
        _ if crate::required(version) => {
            panic!("{version} is not running under CI=true: scripts/test.sh must start it")
        }
        _ => {
            eprintln!("\n!!!! the model test SKIPS {version}: no broker found !!!!\n");
            None
        }
    }
}
