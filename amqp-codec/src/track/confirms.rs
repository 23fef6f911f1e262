//! Publisher-confirm sequencing: numbers from 1 after `confirm.select`,
//! `basic.ack`/`basic.nack` with `multiple`, each publish resolved exactly once.
//!
//! A confirm for a number never published, or resolved already, is a protocol
//! violation by the peer and is reported as such, never ignored.

use std::collections::VecDeque;

/// How the broker resolved a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `basic.ack`: the broker has taken responsibility for the message.
    Ack,
    /// `basic.nack`: the broker could not take it (e.g. `x-overflow=reject-publish`).
    Nack,
}

/// A confirm the peer should not have sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfirmError {
    /// A confirm on a channel that is not in confirm mode.
    #[error("{0:?} for tag {1} on a channel not in confirm mode")]
    NotInConfirmMode(Outcome, u64),
    /// A confirm for a sequence number that was never published.
    #[error("{outcome:?} for tag {tag}, but only {published} messages were published")]
    UnknownTag {
        /// Ack or nack.
        outcome: Outcome,
        /// The tag confirmed.
        tag: u64,
        /// How many publishes there have been.
        published: u64,
    },
    /// A confirm for a sequence number (or, with `multiple`, a range) that is
    /// already resolved.
    #[error("{outcome:?} for tag {tag} (multiple: {multiple}), which is already resolved")]
    AlreadyResolved {
        /// Ack or nack.
        outcome: Outcome,
        /// The tag confirmed.
        tag: u64,
        /// Whether the confirm covered a range.
        multiple: bool,
    },
}

/// The publish sequence of one channel.
///
/// ```
/// use acemq_codec::track::{Confirms, Outcome};
/// let mut confirms = Confirms::new();
/// confirms.select();
/// let seqs: Vec<u64> = (0..3).map(|_| confirms.on_publish().unwrap()).collect();
/// assert_eq!(seqs, [1, 2, 3]);
/// let mut resolved = Vec::new();
/// confirms.on_confirm(Outcome::Ack, 2, true, &mut resolved).unwrap();
/// assert_eq!(resolved, [1, 2]);
/// assert!(confirms.on_confirm(Outcome::Ack, 2, false, &mut resolved).is_err()); // twice
/// ```
#[derive(Debug, Clone, Default)]
pub struct Confirms {
    /// The last sequence number handed out; `None` before `select`.
    last: Option<u64>,
    /// Unresolved sequence numbers, ascending, as inclusive runs of
    /// consecutive ones (usually one: a publish extends the last run, a
    /// multiple confirm of the oldest shortens the first).
    outstanding: VecDeque<(u64, u64)>,
    /// How many numbers the runs hold.
    count: usize,
}

impl Confirms {
    /// A channel not yet in confirm mode.
    pub fn new() -> Self {
        Confirms::default()
    }

    /// Puts the channel in confirm mode (when `confirm.select` is sent; the
    /// broker numbers every publish it processes after it). Selecting again
    /// changes nothing, as in RabbitMQ.
    pub fn select(&mut self) {
        self.last.get_or_insert(0);
    }

    /// Whether the channel is in confirm mode.
    pub fn is_selected(&self) -> bool {
        self.last.is_some()
    }

    /// Records a publish; returns its sequence number in confirm mode.
    #[inline]
    pub fn on_publish(&mut self) -> Option<u64> {
        self.on_publishes(1)
    }

    /// Records `n` publishes at once, as `n` calls of
    /// [`Confirms::on_publish`] would; returns the first one's sequence
    /// number in confirm mode (the others follow it). With `n` 0 nothing
    /// is recorded and the answer is `None`.
    ///
    /// ```
    /// use acemq_codec::track::Confirms;
    /// let mut confirms = Confirms::new();
    /// confirms.select();
    /// assert_eq!(confirms.on_publishes(3), Some(1));
    /// assert_eq!(confirms.on_publish(), Some(4));
    /// assert_eq!(confirms.outstanding(), 4);
    /// ```
    #[inline]
    pub fn on_publishes(&mut self, n: u64) -> Option<u64> {
        let last = self.last.as_mut().filter(|_| n > 0)?;
        let first = *last + 1;
        *last += n;
        let end = *last;
        match self.outstanding.back_mut() {
            Some((_, run_end)) if *run_end + 1 == first => *run_end = end,
            _ => self.outstanding.push_back((first, end)),
        }
        self.count += n as usize;
        Some(first)
    }

    /// The number the next publish will get, in confirm mode.
    pub fn next_sequence(&self) -> Option<u64> {
        self.last.map(|last| last + 1)
    }

    /// How many publishes wait for a confirm.
    pub fn outstanding(&self) -> usize {
        self.count
    }

    /// The oldest unconfirmed sequence number.
    pub fn oldest_outstanding(&self) -> Option<u64> {
        self.outstanding.front().map(|&(start, _)| start)
    }

    /// Applies a `basic.ack` or `basic.nack` from the broker and appends the
    /// sequence numbers it resolves, ascending, to `resolved`. On error
    /// nothing is resolved.
    pub fn on_confirm(
        &mut self,
        outcome: Outcome,
        tag: u64,
        multiple: bool,
        resolved: &mut Vec<u64>,
    ) -> Result<(), ConfirmError> {
        self.resolve(outcome, tag, multiple, |start, end| resolved.extend(start..=end))
    }

    /// [`Confirms::on_confirm`] with the numbers resolved appended to `runs`
    /// as runs of consecutive ones, `(first, last)` inclusive, ascending;
    /// no two runs appended by one call are adjacent. A multiple ack of the
    /// oldest outstanding is one run however many it resolves.
    ///
    /// ```
    /// use acemq_codec::track::{Confirms, Outcome};
    /// let mut confirms = Confirms::new();
    /// confirms.select();
    /// for _ in 0..10 {
    ///     confirms.on_publish();
    /// }
    /// let mut runs = Vec::new();
    /// confirms.on_confirm_runs(Outcome::Nack, 4, false, &mut runs).unwrap();
    /// confirms.on_confirm_runs(Outcome::Ack, 9, true, &mut runs).unwrap();
    /// assert_eq!(runs, [(4, 4), (1, 3), (5, 9)]);
    /// ```
    pub fn on_confirm_runs(
        &mut self,
        outcome: Outcome,
        tag: u64,
        multiple: bool,
        runs: &mut Vec<(u64, u64)>,
    ) -> Result<(), ConfirmError> {
        self.resolve(outcome, tag, multiple, |start, end| runs.push((start, end)))
    }

    /// Resolves what the confirm covers, calling `each(first, last)` for
    /// every run of consecutive numbers it resolves, ascending.
    #[inline]
    fn resolve(
        &mut self,
        outcome: Outcome,
        tag: u64,
        multiple: bool,
        mut each: impl FnMut(u64, u64),
    ) -> Result<(), ConfirmError> {
        let Some(published) = self.last else {
            return Err(ConfirmError::NotInConfirmMode(outcome, tag));
        };
        if tag == 0 || tag > published {
            return Err(ConfirmError::UnknownTag {
                outcome,
                tag,
                published,
            });
        }
        let already = ConfirmError::AlreadyResolved { outcome, tag, multiple };
        if multiple {
            // Every run that starts at or below `tag`, the last of them
            // perhaps only in part.
            let runs = self.outstanding.partition_point(|&(start, _)| start <= tag);
            if runs == 0 {
                return Err(already);
            }
            let partial = self.outstanding[runs - 1].1 > tag;
            let whole = if partial { runs - 1 } else { runs };
            for (start, end) in self.outstanding.drain(..whole) {
                each(start, end);
                self.count -= (end - start + 1) as usize;
            }
            if partial {
                let start = self.outstanding[0].0;
                each(start, tag);
                self.count -= (tag - start + 1) as usize;
                self.outstanding[0].0 = tag + 1;
            }
        } else {
            // The run that holds `tag`: the first, usually.
            let at = match self.outstanding.front() {
                Some(&(start, end)) if start <= tag && tag <= end => 0,
                _ => {
                    let at = self.outstanding.partition_point(|&(_, end)| end < tag);
                    match self.outstanding.get(at) {
                        Some(&(start, _)) if start <= tag => at,
                        _ => return Err(already),
                    }
                }
            };
            let (start, end) = self.outstanding[at];
            match (start == tag, end == tag) {
                (true, true) => {
                    self.outstanding.remove(at);
                }
                (true, false) => self.outstanding[at].0 = tag + 1,
                (false, true) => self.outstanding[at].1 = tag - 1,
                (false, false) => {
                    self.outstanding[at].1 = tag - 1;
                    self.outstanding.insert(at + 1, (tag + 1, end));
                }
            }
            self.count -= 1;
            each(tag, tag);
        }
        Ok(())
    }

    /// Resolves everything outstanding (the channel closed); returns how many
    /// publishes are left without an answer, appended to `unresolved`.
    pub fn fail_all(&mut self, unresolved: &mut Vec<u64>) {
        for (start, end) in self.outstanding.drain(..) {
            unresolved.extend(start..=end);
        }
        self.count = 0;
    }
}
