//! Tools for authors of AMQP 0-9-1 brokers and proxies, run as `acemq
//! conformance ...`: [`diff`] compares two brokers on random operation
//! sequences.

pub mod diff;
