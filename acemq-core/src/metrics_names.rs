//! The counter names (listed in `docs/wire-contract.md`), recorded through the `metrics` facade.

/// `acemq_publish_total{outcome=confirmed|unconfirmed|refused|failed|nacked|unroutable}`
pub const PUBLISH_TOTAL: &str = "acemq_publish_total";
/// `acemq_handled_total{outcome=accepted|retried|dead_lettered|parked|undecodable}`
pub const HANDLED_TOTAL: &str = "acemq_handled_total";
/// `acemq_rung_missing_total`
pub const RUNG_MISSING_TOTAL: &str = "acemq_rung_missing_total";
/// `acemq_set_aside_failed_total{reason=no_route|nacked|blocked|connection|too_large|other}`:
/// each failed publish of a delivery the consumer holds (a set-aside to
/// `.dlq` or `.parked`, a retry, a rung hop), every one tried again.
pub const SET_ASIDE_FAILED_TOTAL: &str = "acemq_set_aside_failed_total";
/// `acemq_recovery_total{event=lost|retrying|recovered|gave_up|queue_renamed|blocked|unblocked|consumer_cancelled|consumer_resubscribed|settlement_dropped}`:
/// every [`crate::RecoveryEvent`] by its label, and each settlement of a
/// delivery from a dead connection or a closed channel that was dropped
/// instead of sent.
pub const RECOVERY_TOTAL: &str = "acemq_recovery_total";
/// `acemq_scheduled_total{outcome=delivered|redelivered|rescheduled|dead_lettered|failed|returned}`:
/// what [`crate::Scheduler`]s did with due messages (see [`crate::schedule`]);
/// `redelivered` is a delivery from a copy the broker had handed out before,
/// a possible duplicate (with the same id).
pub const SCHEDULED_TOTAL: &str = "acemq_scheduled_total";

/// The keys of one counter for each of its known outcomes, built at compile
/// time: counting one of them allocates nothing (a key built at the call,
/// as `metrics::counter!` builds one for a label value it is given at run
/// time, costs a vector and its hash on every message).
macro_rules! outcome_keys {
    ($name:ident: $($outcome:literal),+) => {{
        static KEYS: &[metrics::Key] = &[$(
            metrics::Key::from_static_parts($name, {
                static LABEL: [metrics::Label; 1] = [metrics::Label::from_static_parts("outcome", $outcome)];
                &LABEL
            })
        ),+];
        KEYS
    }};
}

/// Counts one publish by its outcome.
pub(crate) fn publish(outcome: &'static str) {
    count(
        PUBLISH_TOTAL,
        outcome,
        outcome_keys!(PUBLISH_TOTAL: "confirmed", "unconfirmed", "refused", "failed", "nacked", "unroutable"),
    );
}

/// Counts one handled delivery by its outcome.
pub(crate) fn handled(outcome: &'static str) {
    count(
        HANDLED_TOTAL,
        outcome,
        outcome_keys!(HANDLED_TOTAL: "accepted", "retried", "dead_lettered", "parked", "undecodable", "returned"),
    );
}

/// Adds one to `name{outcome}`, through the recorder of the moment (a local
/// one, the global one, or none), as `metrics::counter!` does.
fn count(name: &'static str, outcome: &'static str, keys: &'static [metrics::Key]) {
    static METADATA: metrics::Metadata<'static> =
        metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
    let known = keys
        .iter()
        .find(|key| key.labels().next().is_some_and(|label| label.value() == outcome));
    match known {
        Some(key) => metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1),
        None => metrics::counter!(name, "outcome" => outcome).increment(1),
    }
}

#[cfg(test)]
mod tests {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// What a local recorder holds for `name`, by outcome.
    fn counted(during: impl FnOnce()) -> Vec<(String, String, u64)> {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, during);
        let mut counts: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| {
                let key = key.key();
                let outcome = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
                let DebugValue::Counter(n) = value else {
                    panic!("{key:?} is not a counter")
                };
                (key.name().to_string(), outcome, n)
            })
            .collect();
        counts.sort();
        counts
    }

    #[test]
    fn known_and_unknown_outcomes_are_counted_under_their_names_and_labels() {
        let counts = counted(|| {
            super::publish("confirmed");
            super::publish("confirmed");
            super::publish("unroutable");
            super::handled("accepted");
            super::handled("requeued");
        });
        let row = |name: &str, outcome: &str, n| (name.to_string(), format!("outcome={outcome}"), n);
        assert_eq!(
            counts,
            vec![
                row(super::HANDLED_TOTAL, "accepted", 1),
                row(super::HANDLED_TOTAL, "requeued", 1),
                row(super::PUBLISH_TOTAL, "confirmed", 2),
                row(super::PUBLISH_TOTAL, "unroutable", 1),
            ]
        );
    }
}
