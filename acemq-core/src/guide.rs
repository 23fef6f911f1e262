//! The guide: how to write a service with acemq, one chapter per topic.
//!
//! It is written for the author of a service that publishes to and consumes
//! from RabbitMQ, and it explains what acemq does for you and why, with
//! short examples. Every example is compiled with the crate's doc tests, and
//! those marked runnable run against an in-process acemq-memory broker
//! (`memory://` URLs, the `memory` feature): put an
//! `amqp://user:password@host:5672/%2f` URL in their place for RabbitMQ.
//!
//! 1. [`publishing`]: publishers, confirms, messages that reach no queue,
//!    envelopes, and duplicates.
//! 2. [`consuming`]: handlers and their answers, acks, the attempt counter,
//!    prefetch and concurrency.
//! 3. [`retries`]: retry policies, where a wait is spent (in the process or
//!    on a rung queue in the broker), jitter, and errors that will not
//!    improve.
//! 4. [`dead_letters`]: where a message goes when it is given up on,
//!    parked messages, and replaying them (from code or with the `acemq`
//!    CLI).
//! 5. [`recovery`]: what happens when the connection drops, and what is
//!    restored.
//! 6. [`blocked`]: when the broker runs out of memory or disk.
//! 7. [`lifecycle`]: shutdown, and the lifecycle of a service with several
//!    consumers beside an HTTP server under a container's stop timeout.
//! 8. [`request_reply`]: requests and their replies over RabbitMQ's direct
//!    reply-to.
//! 9. [`security`]: credentials that expire (a credentials provider,
//!    `connection.update-secret`), TLS trust (the OS store, a whole
//!    `rustls::ClientConfig`), and secrets kept out of logs.
//! 10. [`topology`]: exchanges and bindings with arguments (headers
//!     bindings, alternate exchanges), and typed queue and consumer options
//!     (single active consumer, priorities).
//! 11. [`operators`]: the `acemq` CLI (the acemq-cli package): dead letters
//!     grouped by failure, filtered replays, deletes, moves, export and
//!     import (and the export format), exit codes.
//! 12. [`conformance`]: for broker authors and conformance suites: raw
//!     frames (the `conformance` feature) and wire transcripts on the
//!     low-level API.
//!
//! The queues, arguments and headers that services in other languages must
//! use to share queues with an acemq service are listed in
//! `docs/wire-contract.md`; the rules the consumer keeps whatever arrives,
//! with the tests that check them, in `docs/consumer-promises.md` (both in
//! the repository).
//!
//! This module holds documentation only.

#[doc = include_str!("guide/publishing.md")]
pub mod publishing {}

#[doc = include_str!("guide/consuming.md")]
pub mod consuming {}

#[doc = include_str!("guide/retries.md")]
pub mod retries {}

#[doc = include_str!("guide/dead_letters.md")]
pub mod dead_letters {}

#[doc = include_str!("guide/recovery.md")]
pub mod recovery {}

#[doc = include_str!("guide/blocked.md")]
pub mod blocked {}

#[doc = include_str!("guide/security.md")]
pub mod security {}

#[doc = include_str!("guide/topology.md")]
pub mod topology {}

#[doc = include_str!("guide/operators.md")]
pub mod operators {}

#[doc = include_str!("guide/lifecycle.md")]
#[doc = "```rust,no_run"]
#[doc = include_str!("../examples/service.rs")]
#[doc = "```"]
pub mod lifecycle {}

#[doc = include_str!("guide/request_reply.md")]
pub mod request_reply {}

// The chapter's example needs the `conformance` feature; without it the
// chapter says so (and compiles no example).
#[cfg_attr(feature = "conformance", doc = include_str!("guide/conformance.md"))]
#[cfg_attr(
    not(feature = "conformance"),
    doc = "Writing a conformance test with raw frames and transcripts: build the docs with the `conformance` feature to read this chapter."
)]
pub mod conformance {}
