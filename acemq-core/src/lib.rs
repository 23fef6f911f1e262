//! acemq-core: the acemq client engine and its reliability semantics.
//!
//! This crate is empty for now: the sans-IO connection machine, the tokio
//! driver and the acemq API arrive with their own issues. It exists so the
//! workspace has its final shape; nothing here claims to work yet.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
