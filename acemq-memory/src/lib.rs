//! acemq-memory: an in-process AMQP 0-9-1 broker that behaves like RabbitMQ.
//!
//! This crate is empty for now: the broker arrives with its own issue. It
//! exists so the workspace has its final shape; nothing here claims to work yet.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
