//! The counter names of DESIGN.md §5, recorded through the `metrics` facade.

/// `acemq_publish_total{outcome=confirmed|unconfirmed|refused|failed|nacked|unroutable}`
pub const PUBLISH_TOTAL: &str = "acemq_publish_total";
/// `acemq_handled_total{outcome=accepted|retried|dead_lettered|parked|undecodable}`
pub const HANDLED_TOTAL: &str = "acemq_handled_total";
/// `acemq_rung_missing_total`
pub const RUNG_MISSING_TOTAL: &str = "acemq_rung_missing_total";
/// `acemq_recovery_total{event=lost|retrying|recovered|gave_up|queue_renamed|blocked|unblocked|settlement_dropped}`:
/// every [`crate::RecoveryEvent`] by its label, and each settlement of a
/// delivery from a dead connection that was dropped instead of sent.
pub const RECOVERY_TOTAL: &str = "acemq_recovery_total";
/// `acemq_scheduled_total{outcome=delivered|redelivered|rescheduled|dead_lettered|failed|returned}`:
/// what [`crate::Scheduler`]s did with due messages (see [`crate::schedule`]);
/// `redelivered` is a delivery from a copy the broker had handed out before,
/// a possible duplicate (with the same id).
pub const SCHEDULED_TOTAL: &str = "acemq_scheduled_total";

pub(crate) fn publish(outcome: &'static str) {
    metrics::counter!(PUBLISH_TOTAL, "outcome" => outcome).increment(1);
}
