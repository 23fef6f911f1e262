//! Tools for authors of AMQP 0-9-1 brokers and proxies, run as `acemq
//! conformance ...`: [`check`] runs a catalogue of RabbitMQ's behaviours
//! against a broker, and [`diff`] compares two brokers on random operation
//! sequences.

pub mod check;
pub mod diff;
