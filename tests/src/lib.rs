//! The acemq behaviour suite: every scenario runs against acemq-memory and a
//! real RabbitMQ.
//!
//! Empty until the client engine lands; the codec's own tests live in
//! `amqp-codec/tests/`.
#![forbid(unsafe_code)]
