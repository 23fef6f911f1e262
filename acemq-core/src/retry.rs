//! Retry policies and the decision they make, as data: `decide` is a pure
//! function of the attempt, the message's age, the error and the clock, so
//! every rule is testable without a broker or a timer.

use std::time::{Duration, SystemTime};

use crate::ack::is_fatal;

/// How delays grow between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backoff {
    /// `base`, `2·base`, `4·base`, … capped at `max` (0 = uncapped).
    Exponential { base: Duration, max: Duration },
    /// The same delay every time.
    Fixed(Duration),
}

/// When and how often a failed message is tried again, and where the wait
/// is spent.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    max_attempts: u32,
    backoff: Backoff,
    jitter: f64,
    give_up_after: Option<Duration>,
    wait_in_broker_from: Duration,
}

/// The default threshold at and above which a wait is spent in the broker.
pub const DEFAULT_WAIT_IN_BROKER_FROM: Duration = Duration::from_secs(30);
/// The default jitter: ±20%.
pub const DEFAULT_JITTER: f64 = 0.2;

/// What to do with a message whose handler asked for a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Give up: republish to `{queue}.dlq` with the reason, then ack.
    DeadLetter {
        /// Why, for `x-acemq-error`.
        reason: String,
    },
    /// Wait here (holding the delivery), then republish with the attempt advanced.
    WaitInProcess(Duration),
    /// Publish to the rung `{queue}.retry.{delay}` with the attempt advanced, then ack.
    WaitInBroker(Duration),
}

impl RetryPolicy {
    /// `max_attempts` tries in all (the first delivery counts), waiting
    /// `base`, `2·base`, `4·base`, … capped at `max` between them (0 = uncapped).
    pub fn exponential(max_attempts: u32, base: Duration, max: Duration) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::Exponential { base, max },
            jitter: DEFAULT_JITTER,
            give_up_after: None,
            wait_in_broker_from: DEFAULT_WAIT_IN_BROKER_FROM,
        }
    }

    /// `max_attempts` tries in all, waiting `delay` between them.
    pub fn fixed(max_attempts: u32, delay: Duration) -> Self {
        RetryPolicy {
            max_attempts: max_attempts.max(1),
            backoff: Backoff::Fixed(delay),
            jitter: DEFAULT_JITTER,
            give_up_after: None,
            wait_in_broker_from: DEFAULT_WAIT_IN_BROKER_FROM,
        }
    }

    /// What acemq does without a policy: retry at once, without limit.
    pub fn immediate() -> Self {
        RetryPolicy::fixed(u32::MAX, Duration::ZERO)
    }

    /// Spreads in-process waits by ±`fraction` (0.2 by default; 0 = exact).
    /// Waits spent in the broker are never jittered.
    pub fn with_jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_finite() {
            fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// Dead-letters a message first seen longer ago than `age`.
    pub fn give_up_after(mut self, age: Duration) -> Self {
        self.give_up_after = Some(age);
        self
    }

    /// Waits of at least `threshold` are spent in the broker, on rung queues
    /// (30 s by default); `Duration::ZERO` means no rungs at all.
    pub fn wait_in_broker_from(mut self, threshold: Duration) -> Self {
        self.wait_in_broker_from = threshold;
        self
    }

    /// How many tries in all.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The jitter fraction.
    pub fn jitter(&self) -> f64 {
        self.jitter
    }

    /// The un-jittered delay after failed attempt `attempt` (1-based).
    pub fn delay_after(&self, attempt: u32) -> Duration {
        match self.backoff {
            Backoff::Fixed(delay) => delay,
            Backoff::Exponential { base, max } => {
                let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(31));
                let delay = base.saturating_mul(factor);
                if max.is_zero() {
                    delay
                } else {
                    delay.min(max)
                }
            }
        }
    }

    /// The un-jittered delays between the attempts: `max_attempts - 1` of them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use acemq_core::RetryPolicy;
    /// let s = Duration::from_secs;
    /// assert_eq!(RetryPolicy::exponential(4, s(1), s(3)).schedule(), [s(1), s(2), s(3)]);
    /// assert_eq!(RetryPolicy::fixed(3, s(5)).schedule(), [s(5), s(5)]);
    /// ```
    pub fn schedule(&self) -> Vec<Duration> {
        // A policy without limit has no finite schedule; show its first steps.
        let retries = self.max_attempts.saturating_sub(1).min(64);
        (1..=retries).map(|attempt| self.delay_after(attempt)).collect()
    }

    /// Whether a wait of `delay` is spent in the broker.
    pub fn waits_in_broker(&self, delay: Duration) -> bool {
        !self.wait_in_broker_from.is_zero() && delay >= self.wait_in_broker_from
    }

    /// The distinct broker-side delays: one rung queue each.
    pub fn rungs(&self) -> Vec<Duration> {
        let mut rungs: Vec<Duration> = self
            .schedule()
            .into_iter()
            .filter(|d| self.waits_in_broker(*d))
            .collect();
        rungs.dedup();
        rungs
    }

    /// What to do after attempt `attempt` (1-based) failed with `error`, for
    /// a message first seen at `first_seen`, at `now`. The jitter of a wait in
    /// process comes from `uniform`, a draw in `[0, 1)`: 0 shortens the wait
    /// by the whole jitter, 0.5 leaves it exact, values towards 1 lengthen it.
    /// A draw outside `[0, 1]` is clamped, one that is not a number counts as
    /// 0.5. `uniform` is called at most once, and only for such a wait.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use acemq_core::retry::{Decision, RetryPolicy};
    ///
    /// let policy = RetryPolicy::fixed(5, Duration::from_secs(10)).with_jitter(0.2);
    /// let now = SystemTime::now();
    /// let error = std::io::Error::other("database down");
    /// let shortest = policy.decide_with(1, now, &error, now, || 0.0);
    /// assert_eq!(shortest, Decision::WaitInProcess(Duration::from_secs(8)));
    /// ```
    pub fn decide_with(
        &self,
        attempt: u32,
        first_seen: SystemTime,
        error: &(dyn std::error::Error + 'static),
        now: SystemTime,
        mut uniform: impl FnMut() -> f64,
    ) -> Decision {
        if is_fatal(error) {
            return Decision::DeadLetter {
                reason: format!("fatal: {}", error_chain(error)),
            };
        }
        if attempt >= self.max_attempts {
            return Decision::DeadLetter {
                reason: format!(
                    "gave up after {attempt} attempts (max {}): {}",
                    self.max_attempts,
                    error_chain(error)
                ),
            };
        }
        if let Some(age_limit) = self.give_up_after {
            let age = now.duration_since(first_seen).unwrap_or(Duration::ZERO);
            if age > age_limit {
                return Decision::DeadLetter {
                    reason: format!(
                        "gave up: first seen {}s ago, limit {}s: {}",
                        age.as_secs(),
                        age_limit.as_secs(),
                        error_chain(error)
                    ),
                };
            }
        }
        let delay = self.delay_after(attempt);
        if self.waits_in_broker(delay) {
            return Decision::WaitInBroker(delay);
        }
        if self.jitter == 0.0 || delay.is_zero() {
            return Decision::WaitInProcess(delay);
        }
        let draw = uniform();
        let draw = if draw.is_nan() { 0.5 } else { draw.clamp(0.0, 1.0) };
        let factor = 1.0 + self.jitter * (2.0 * draw - 1.0);
        Decision::WaitInProcess(delay.mul_f64(factor.max(0.0)))
    }

    /// [`RetryPolicy::decide_with`] with draws from the thread's random generator.
    pub fn decide(
        &self,
        attempt: u32,
        first_seen: SystemTime,
        error: &(dyn std::error::Error + 'static),
        now: SystemTime,
    ) -> Decision {
        self.decide_with(attempt, first_seen, error, now, rand::random::<f64>)
    }
}

/// The error and its `source()` chain, joined with `: `.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The name of the rung queue for `delay`: `{queue}.retry.40s`, or
/// `{queue}.retry.1500ms` where the delay is not whole seconds.
pub fn rung_name(queue: &str, delay: Duration) -> String {
    if delay.subsec_millis() == 0 {
        format!("{queue}.retry.{}s", delay.as_secs())
    } else {
        format!("{queue}.retry.{}ms", delay.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ack::fatal;
    use rand::{RngExt, SeedableRng};

    /// Uniform draws in `[0, 1)` from a seeded generator, for `decide_with`.
    fn seeded(seed: u64) -> impl FnMut() -> f64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        move || rng.random::<f64>()
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[derive(Debug)]
    struct Plain;
    impl std::fmt::Display for Plain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("database down")
        }
    }
    impl std::error::Error for Plain {}

    #[test]
    fn schedules_are_the_unjittered_delays() {
        assert_eq!(RetryPolicy::exponential(4, s(1), s(3)).schedule(), [s(1), s(2), s(3)]);
        assert_eq!(RetryPolicy::fixed(3, s(5)).schedule(), [s(5), s(5)]);
        assert_eq!(
            RetryPolicy::exponential(6, s(10), Duration::ZERO).schedule(),
            [s(10), s(20), s(40), s(80), s(160)]
        );
        assert!(RetryPolicy::fixed(1, s(5)).schedule().is_empty());
    }

    #[test]
    fn max_attempts_counts_the_first_delivery() {
        let policy = RetryPolicy::fixed(3, s(1)).with_jitter(0.0);
        let now = SystemTime::now();
        assert_eq!(policy.decide(1, now, &Plain, now), Decision::WaitInProcess(s(1)));
        assert_eq!(policy.decide(2, now, &Plain, now), Decision::WaitInProcess(s(1)));
        assert!(matches!(
            policy.decide(3, now, &Plain, now),
            Decision::DeadLetter { .. }
        ));
    }

    #[test]
    fn waits_at_or_above_the_threshold_go_to_the_broker_unjittered() {
        let policy = RetryPolicy::exponential(6, s(10), Duration::ZERO);
        assert_eq!(policy.rungs(), [s(40), s(80), s(160)]);
        let now = SystemTime::now();
        let mut rng = seeded(7);
        for (attempt, expected) in [(3, s(40)), (4, s(80)), (5, s(160))] {
            assert_eq!(
                policy.decide_with(attempt, now, &Plain, now, &mut rng),
                Decision::WaitInBroker(expected)
            );
        }
        let short = policy.clone().wait_in_broker_from(Duration::ZERO);
        assert!(short.rungs().is_empty(), "0 means no rungs at all");
        assert!(matches!(
            short.decide_with(5, now, &Plain, now, &mut rng),
            Decision::WaitInProcess(_)
        ));
    }

    #[test]
    fn jitter_is_twenty_percent_both_ways_by_default_and_settable() {
        let policy = RetryPolicy::fixed(100, s(10));
        let now = SystemTime::now();
        let mut rng = seeded(1);
        let waits: Vec<Duration> = (0..2000)
            .map(|_| match policy.decide_with(1, now, &Plain, now, &mut rng) {
                Decision::WaitInProcess(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(waits.iter().all(|d| *d >= s(8) && *d <= s(12)));
        assert!(waits.iter().any(|d| *d < Duration::from_millis(8500)), "shortens too");
        assert!(waits.iter().any(|d| *d > Duration::from_millis(11500)), "lengthens too");
        let wide = policy.clone().with_jitter(0.5);
        let wide_waits: Vec<Duration> = (0..2000)
            .map(|_| match wide.decide_with(1, now, &Plain, now, &mut rng) {
                Decision::WaitInProcess(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(wide_waits.iter().any(|d| *d < s(6)));
        let exact = policy.with_jitter(0.0);
        assert_eq!(
            exact.decide_with(1, now, &Plain, now, &mut rng),
            Decision::WaitInProcess(s(10))
        );
    }

    #[test]
    fn a_draw_maps_onto_the_jitter_both_ways_and_a_bad_draw_is_tamed() {
        let policy = RetryPolicy::fixed(100, s(10)).with_jitter(0.2);
        let now = SystemTime::now();
        let wait = |draw: f64| policy.decide_with(1, now, &Plain, now, || draw);
        assert_eq!(wait(0.0), Decision::WaitInProcess(s(8)));
        assert_eq!(wait(0.5), Decision::WaitInProcess(s(10)));
        assert_eq!(wait(0.75), Decision::WaitInProcess(s(11)));
        assert_eq!(wait(-3.0), Decision::WaitInProcess(s(8)), "clamped below");
        assert_eq!(wait(7.0), Decision::WaitInProcess(s(12)), "clamped above");
        assert_eq!(wait(f64::INFINITY), Decision::WaitInProcess(s(12)));
        assert_eq!(wait(f64::NAN), Decision::WaitInProcess(s(10)), "no jitter");
        // Fatal errors, broker waits and exact policies never draw.
        let mut draws = 0;
        let mut counting = || {
            draws += 1;
            0.5
        };
        RetryPolicy::fixed(3, s(1))
            .with_jitter(0.0)
            .decide_with(1, now, &Plain, now, &mut counting);
        RetryPolicy::exponential(6, s(40), Duration::ZERO).decide_with(1, now, &Plain, now, &mut counting);
        policy.decide_with(1, now, &fatal(Plain), now, &mut counting);
        assert_eq!(draws, 0);
    }

    #[test]
    fn fatal_errors_and_old_messages_are_dead_lettered_at_once() {
        let policy = RetryPolicy::fixed(10, s(1)).give_up_after(s(60));
        let now = SystemTime::now();
        let fatal_error = fatal(Plain);
        match policy.decide(1, now, &fatal_error, now) {
            Decision::DeadLetter { reason } => assert!(reason.contains("database down"), "{reason}"),
            other => panic!("{other:?}"),
        }
        let old = now - s(61);
        assert!(matches!(
            policy.decide(1, old, &Plain, now),
            Decision::DeadLetter { .. }
        ));
        assert!(matches!(
            policy.decide(1, now - s(59), &Plain, now),
            Decision::WaitInProcess(_)
        ));
    }

    #[test]
    fn rung_names_use_seconds_or_milliseconds() {
        assert_eq!(rung_name("orders", s(40)), "orders.retry.40s");
        assert_eq!(rung_name("orders", Duration::from_millis(1500)), "orders.retry.1500ms");
    }
}
