//! Broker conformance: `acemq conformance check` runs RabbitMQ's
//! behaviours against a broker ([`check`]).

pub mod check;
