//! Identifiers shared by the broker's parts, kept in a leaf module so that
//! queues and connections can name each other without importing each other.

/// Identifies one connection inside a broker machine.
pub type ConnId = u64;
