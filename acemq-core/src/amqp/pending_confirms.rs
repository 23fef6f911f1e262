//! The confirm tracker: where the publishes of one channel wait for their
//! confirms, kept as one run in the order they were queued instead of an
//! entry each. The driver resolves them (acked, nacked, returned or failed);
//! each [`PublishConfirm`](super::PublishConfirm) polls for its own. It
//! knows nothing of the connection, the driver or the socket, and it must
//! never wake a task under its lock (wakers are collected and woken after).
//!
//! A publish is numbered as it is queued (under the command queue's lock, so
//! the numbers follow the queue's order), and its
//! [`PublishConfirm`](super::PublishConfirm) is that number and the tracker. The
//! driver takes the records in the same order and counts them the same way,
//! so it knows each one's number without being told; the broker's sequence
//! numbers start at the first publish in confirm mode, so a number is the
//! sequence number plus the tracker's offset.
//!
//! What the broker says of most publishes is the same: a run of acks. The
//! tracker keeps it as one watermark: every publish numbered below it is
//! resolved, with a plain outcome (`Ack`, or `NotRequested` below the first
//! publish in confirm mode). A confirm below the watermark is ready with one
//! atomic load. Only what differs is kept one by one, in `odd`: a nack, a
//! return, a confirm that came ahead of the watermark, and a publish whose
//! confirm was dropped before its outcome came (so that the outcome is not
//! kept for nobody).
//!
//! When the channel or the connection is gone, the tracker fails: what is not
//! resolved then fails with its error, and a publish the driver never took
//! (queued after the channel was gone) fails with `ChannelNotOpen`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use super::error::Error;
use super::message::Confirmation;

/// What a confirm resolves to.
pub(crate) type Outcome = Result<Confirmation, Error>;

/// No publish has been in confirm mode yet.
const NONE_CONFIRMED: u64 = u64::MAX;

/// One channel's confirms (see the module docs).
pub(crate) struct PendingConfirms {
    /// The channel's number, for `ChannelNotOpen`.
    channel: u16,
    /// The number the next publish queued gets (raised under the command
    /// queue's lock).
    next: AtomicU64,
    /// Every publish numbered below this is resolved: plainly, unless `odd`
    /// holds its outcome.
    resolved_below: AtomicU64,
    /// The number of the first publish in confirm mode (`NONE_CONFIRMED`
    /// until there is one): those below it were not confirmed.
    first_confirmed: AtomicU64,
    /// Whether `odd` holds anything, or the tracker failed: if not, a confirm
    /// below the watermark needs no lock.
    quiet: AtomicBool,
    locked: Mutex<Locked>,
}

#[derive(Default)]
struct Locked {
    odd: OddOutcomes,
    /// Confirms waiting for their outcome, in ascending order of number:
    /// found by binary search, the resolved taken off the front. (As many as
    /// tasks await their confirm at once: hundreds, with one task a send.)
    waiters: VecDeque<(u64, Waker)>,
    /// The first publish the driver refused or never took, and what it and
    /// every later one fail with.
    refused: Option<(u64, Error)>,
    /// The channel or the connection is gone: what fails everything still
    /// unresolved below `refused`.
    failed: Option<Error>,
}

/// What a tracker keeps one by one, in ascending order of number: found by
/// binary search, resolved off the front. Numbers are kept as their
/// publishes' confirms come and go, mostly at the back and taken from the
/// front, so the one allocation is kept and reused (a map would allocate a
/// node for the first entry and free it with the last, on every publish
/// whose confirm is dropped before its outcome, say).
#[derive(Default)]
struct OddOutcomes(VecDeque<(u64, Odd)>);

impl OddOutcomes {
    fn at(&self, n: u64) -> Result<usize, usize> {
        self.0.binary_search_by_key(&n, |(k, _)| *k)
    }

    fn get(&self, n: &u64) -> Option<&Odd> {
        self.at(*n).ok().map(|at| &self.0[at].1)
    }

    fn contains_key(&self, n: &u64) -> bool {
        self.at(*n).is_ok()
    }

    fn remove(&mut self, n: &u64) -> Option<Odd> {
        let at = self.at(*n).ok()?;
        self.0.remove(at).map(|(_, odd)| odd)
    }

    fn insert(&mut self, n: u64, odd: Odd) {
        match self.at(n) {
            Ok(at) => self.0[at].1 = odd,
            Err(at) => self.0.insert(at, (n, odd)),
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    /// Keeps only what `keep` wants.
    fn retain(&mut self, mut keep: impl FnMut(&Odd) -> bool) {
        self.0.retain(|(_, odd)| keep(odd));
    }

    /// Keeps, of what is numbered below `below`, only what `keep` wants.
    fn retain_below(&mut self, below: u64, mut keep: impl FnMut(&Odd) -> bool) {
        // The usual case: the front goes, up to the first kept.
        while let Some((n, odd)) = self.0.front() {
            if *n >= below || keep(odd) {
                break;
            }
            self.0.pop_front();
        }
        if self.0.front().is_some_and(|(n, _)| *n < below) {
            self.0.retain(|(n, odd)| *n >= below || keep(odd));
        }
    }
}

enum Odd {
    /// Resolved with an outcome other than the plain one, or ahead of the
    /// watermark; taken by its confirm.
    Done(Outcome),
    /// Not resolved, and its confirm is gone: the outcome is dropped when it
    /// comes.
    Abandoned,
    /// Resolved ahead of the watermark, its confirm gone: only there for the
    /// watermark to pass.
    Dropped,
}

impl std::fmt::Debug for PendingConfirms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingConfirms")
            .field("channel", &self.channel)
            .field("next", &self.next.load(Ordering::Relaxed))
            .field("resolved_below", &self.resolved_below.load(Ordering::Relaxed))
            .field("odd", &self.lock().odd.len())
            .finish()
    }
}

impl PendingConfirms {
    pub(crate) fn new(channel: u16) -> Self {
        PendingConfirms {
            channel,
            next: AtomicU64::new(0),
            resolved_below: AtomicU64::new(0),
            first_confirmed: AtomicU64::new(NONE_CONFIRMED),
            quiet: AtomicBool::new(true),
            locked: Mutex::new(Locked::default()),
        }
    }

    /// Why the tracker failed (its channel or connection went), if it has.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.lock().failed.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
        // No code panics under this lock; a poisoned one is still whole.
        self.locked.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of a publish being queued. Call it under the command
    /// queue's lock, once the publish is sure to be queued.
    #[inline]
    pub(crate) fn number(&self) -> u64 {
        // A load and a store, not an atomic add: every caller holds the
        // queue's lock, which orders them.
        let n = self.next.load(Ordering::Relaxed);
        self.next.store(n + 1, Ordering::Relaxed);
        n
    }

    /// Whether `n` is resolved and nothing is kept one by one: its outcome
    /// is then the plain one, known without the lock.
    #[inline]
    fn plainly_resolved(&self, n: u64) -> bool {
        n < self.resolved_below.load(Ordering::Acquire) && self.quiet.load(Ordering::Acquire)
    }

    /// The plain outcome of a resolved publish numbered `n`.
    #[inline]
    fn plain(&self, n: u64) -> Confirmation {
        if n < self.first_confirmed.load(Ordering::Acquire) {
            Confirmation::NotRequested
        } else {
            Confirmation::Ack
        }
    }

    // ---- the driver's side ----

    /// Publish `n` is the first in confirm mode (sequence number 1): the
    /// publishes before it were not confirmed.
    pub(crate) fn confirm_mode_from(&self, n: u64) {
        self.first_confirmed.store(n, Ordering::Release);
    }

    /// Publish `n` went out without confirms: resolved at once (publishes
    /// before it did too, in order).
    pub(crate) fn not_requested(&self, n: u64, wake: &mut Vec<Waker>) {
        self.advance_to(n + 1, wake);
    }

    /// The broker confirmed `first..=last` together (none returned): one
    /// move of the watermark when they are the oldest unresolved and acked,
    /// else each on its own.
    pub(crate) fn resolve_run(&self, first: u64, last: u64, confirmation: Confirmation, wake: &mut Vec<Waker>) {
        let plain = matches!(confirmation, Confirmation::Ack);
        if plain && first == self.resolved_below.load(Ordering::Relaxed) {
            self.advance_to(last + 1, wake);
        } else {
            for n in first..=last {
                self.resolve(n, Ok(confirmation.clone()), wake);
            }
        }
    }

    /// Resolves publish `n` with `outcome`.
    pub(crate) fn resolve(&self, n: u64, outcome: Outcome, wake: &mut Vec<Waker>) {
        let below = self.resolved_below.load(Ordering::Relaxed);
        let plain = matches!(outcome, Ok(Confirmation::Ack));
        if plain && n == below {
            self.advance_to(n + 1, wake);
            return;
        }
        let mut inner = self.lock();
        if n < below {
            // Resolved already (the tracker resolves a sequence number once,
            // so this would be a broker saying it twice): the first stands.
            tracing::debug!(channel = self.channel, n, "a publish confirmed twice");
            return;
        }
        match inner.odd.remove(&n) {
            // Nobody wants it; ahead of the watermark it is still a mark
            // for the watermark to pass.
            Some(Odd::Abandoned) if n == below => {}
            Some(Odd::Abandoned) => {
                inner.odd.insert(n, Odd::Dropped);
            }
            _ => {
                inner.odd.insert(n, Odd::Done(outcome));
                self.quiet.store(false, Ordering::Release);
            }
        }
        if n == below {
            self.advance_locked(&mut inner, n + 1, wake);
        } else {
            wake_resolved(&mut inner, below, n, wake);
        }
        self.requiet(&inner);
    }

    /// Every publish below `to` is resolved (those in `odd` with theirs).
    fn advance_to(&self, to: u64, wake: &mut Vec<Waker>) {
        let mut inner = self.lock();
        self.advance_locked(&mut inner, to, wake);
        self.requiet(&inner);
    }

    fn advance_locked(&self, inner: &mut Locked, to: u64, wake: &mut Vec<Waker>) {
        let from = self.resolved_below.load(Ordering::Relaxed);
        let mut below = from.max(to);
        if !inner.odd.is_empty() {
            // What the watermark now passes: the marks of confirms that are
            // gone go, and so do acks that came ahead of it (the watermark
            // says as much); other outcomes stay for their confirms.
            inner
                .odd
                .retain_below(below, |odd| matches!(odd, Odd::Done(outcome) if !is_ack(outcome)));
            // Then on past what was resolved ahead of it.
            loop {
                match inner.odd.get(&below) {
                    Some(Odd::Done(outcome)) if is_ack(outcome) => {
                        inner.odd.remove(&below);
                    }
                    Some(Odd::Dropped) => {
                        inner.odd.remove(&below);
                    }
                    Some(Odd::Done(_)) => {}
                    Some(Odd::Abandoned) | None => break,
                }
                below += 1;
            }
        }
        self.resolved_below.store(below, Ordering::Release);
        take_waiters_below(inner, below, wake);
    }

    /// Marks the tracker quiet again when nothing is kept one by one.
    fn requiet(&self, inner: &Locked) {
        if inner.odd.is_empty() && inner.failed.is_none() && inner.refused.is_none() {
            self.quiet.store(true, Ordering::Release);
        }
    }

    /// Publish `n` was refused (the channel is closing, the connection is
    /// not open): it and every later one fail with `error`.
    pub(crate) fn refuse(&self, n: u64, error: Error, wake: &mut Vec<Waker>) {
        let mut inner = self.lock();
        if inner.refused.is_none() {
            inner.refused = Some((n, error));
            self.quiet.store(false, Ordering::Release);
        }
        take_failed_waiters(&mut inner, self.resolved_below.load(Ordering::Relaxed), wake);
    }

    /// The channel (or the connection) is gone after the driver took
    /// `taken` publishes: what is not resolved fails with `error`, and what
    /// the driver never took with `ChannelNotOpen` (or what it was refused
    /// with).
    pub(crate) fn fail(&self, error: Error, taken: u64, wake: &mut Vec<Waker>) {
        let mut inner = self.lock();
        if inner.failed.is_none() {
            inner.failed = Some(error);
        }
        if inner.refused.is_none() {
            inner.refused = Some((taken, Error::ChannelNotOpen(self.channel)));
        }
        self.quiet.store(false, Ordering::Release);
        // Only outcomes a confirm may still take are kept.
        inner.odd.retain(|odd| matches!(odd, Odd::Done(_)));
        take_failed_waiters(&mut inner, self.resolved_below.load(Ordering::Relaxed), wake);
    }

    // ---- the confirm's side ----

    /// The outcome of publish `n` once it is known. Spent once `Ready`.
    #[inline]
    pub(crate) fn poll(&self, n: u64, cx: &mut Context<'_>) -> Poll<Outcome> {
        if self.plainly_resolved(n) {
            return Poll::Ready(Ok(self.plain(n)));
        }
        self.poll_locked(n, cx)
    }

    /// [`PendingConfirms::poll`] for a publish not resolved with the plain outcome.
    #[inline(never)]
    fn poll_locked(&self, n: u64, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut inner = self.lock();
        if let Some(outcome) = self.outcome_locked(&mut inner, n) {
            remove_waiter(&mut inner, n);
            return Poll::Ready(outcome);
        }
        match waiter_at(&inner, n) {
            Ok(at) => {
                let waker = &mut inner.waiters[at].1;
                if !waker.will_wake(cx.waker()) {
                    *waker = cx.waker().clone();
                }
            }
            // Usually at the back: a confirm is awaited soon after its publish.
            Err(at) => inner.waiters.insert(at, (n, cx.waker().clone())),
        }
        Poll::Pending
    }

    /// The outcome of `n` if it has one, taken out of `odd`.
    fn outcome_locked(&self, inner: &mut Locked, n: u64) -> Option<Outcome> {
        let below = self.resolved_below.load(Ordering::Acquire);
        if let Some(Odd::Done(_)) = inner.odd.get(&n) {
            let Some(Odd::Done(outcome)) = inner.odd.remove(&n) else {
                unreachable!("matched above")
            };
            if n >= below {
                // Resolved ahead of the watermark: it must still pass it.
                inner.odd.insert(n, Odd::Dropped);
            }
            self.requiet(inner);
            return Some(outcome);
        }
        if n < below {
            return Some(Ok(self.plain(n)));
        }
        failure(inner, n).map(Err)
    }

    /// The confirm of `n` is dropped without its outcome taken.
    #[inline]
    pub(crate) fn abandon(&self, n: u64) {
        if self.plainly_resolved(n) {
            return;
        }
        self.abandon_locked(n);
    }

    /// [`PendingConfirms::abandon`] of a publish that may have something kept.
    #[inline(never)]
    fn abandon_locked(&self, n: u64) {
        let mut inner = self.lock();
        remove_waiter(&mut inner, n);
        let below = self.resolved_below.load(Ordering::Acquire);
        match inner.odd.remove(&n) {
            Some(Odd::Done(_)) if n >= below => {
                inner.odd.insert(n, Odd::Dropped);
            }
            Some(_) => {}
            None if n < below || failure(&inner, n).is_some() => {}
            None => {
                inner.odd.insert(n, Odd::Abandoned);
                self.quiet.store(false, Ordering::Release);
            }
        }
        self.requiet(&inner);
    }

    /// How many outcomes the tracker keeps one by one (for tests).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lock().odd.len()
    }

    /// The numbers of the confirms waiting, as kept (for tests).
    #[cfg(test)]
    fn waiting(&self) -> Vec<u64> {
        self.lock().waiters.iter().map(|(n, _)| *n).collect()
    }
}

fn is_ack(outcome: &Outcome) -> bool {
    matches!(outcome, Ok(Confirmation::Ack))
}

/// The error an unresolved publish `n` fails with, if the tracker failed.
fn failure(inner: &Locked, n: u64) -> Option<Error> {
    match &inner.refused {
        Some((from, error)) if n >= *from => Some(error.clone()),
        _ => inner.failed.clone(),
    }
}

/// Where the waiter of `n` is (`Ok`), or where it would go (`Err`).
fn waiter_at(inner: &Locked, n: u64) -> Result<usize, usize> {
    inner.waiters.binary_search_by_key(&n, |(w, _)| *w)
}

/// Forgets the waiter of `n`, if there is one.
fn remove_waiter(inner: &mut Locked, n: u64) {
    if let Ok(at) = waiter_at(inner, n) {
        inner.waiters.remove(at);
    }
}

/// Wakes the waiters of everything below the watermark `below`: a run off
/// the front.
fn take_waiters_below(inner: &mut Locked, below: u64, wake: &mut Vec<Waker>) {
    while inner.waiters.front().is_some_and(|(n, _)| *n < below) {
        wake.extend(inner.waiters.pop_front().map(|(_, waker)| waker));
    }
}

/// Wakes the waiter of `n`, just resolved ahead of the watermark `below`.
fn wake_resolved(inner: &mut Locked, below: u64, n: u64, wake: &mut Vec<Waker>) {
    debug_assert!(n >= below);
    if let Ok(at) = waiter_at(inner, n) {
        wake.extend(inner.waiters.remove(at).map(|(_, waker)| waker));
    }
}

fn take_failed_waiters(inner: &mut Locked, below: u64, wake: &mut Vec<Waker>) {
    let waiters = std::mem::take(&mut inner.waiters);
    for (n, waker) in waiters {
        if n < below || inner.odd.contains_key(&n) || failure(inner, n).is_some() {
            wake.push(waker);
        } else {
            // In order still: taken from the front, kept at the back.
            inner.waiters.push_back((n, waker));
        }
    }
}

/// Wakes what was collected, once no lock is held.
pub(crate) fn wake_all(wake: &mut Vec<Waker>) {
    for waker in wake.drain(..) {
        waker.wake();
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::Duration;

    use std::sync::Arc;

    use super::*;

    fn tracker() -> Arc<PendingConfirms> {
        Arc::new(PendingConfirms::new(7))
    }

    fn numbers(confirms: &PendingConfirms, count: u64) -> Vec<u64> {
        (0..count).map(|_| confirms.number()).collect()
    }

    /// A tracker in confirm mode from its first publish, `count` published.
    fn confirming(count: u64) -> Arc<PendingConfirms> {
        let confirms = tracker();
        numbers(&confirms, count);
        confirms.confirm_mode_from(0);
        confirms
    }

    fn now(confirms: &PendingConfirms, n: u64) -> Poll<Outcome> {
        confirms.poll(n, &mut Context::from_waker(Waker::noop()))
    }

    fn ready(confirms: &PendingConfirms, n: u64) -> Confirmation {
        match now(confirms, n) {
            Poll::Ready(Ok(confirmation)) => confirmation,
            other => panic!("publish {n}: {other:?}"),
        }
    }

    #[test]
    fn acks_in_order_move_the_watermark_and_publishes_before_confirm_mode_were_not_requested() {
        let confirms = tracker();
        let mut wake = Vec::new();
        assert_eq!(numbers(&confirms, 6), [0, 1, 2, 3, 4, 5]);
        confirms.not_requested(0, &mut wake);
        confirms.not_requested(1, &mut wake);
        confirms.confirm_mode_from(2);
        confirms.resolve_run(2, 4, Confirmation::Ack, &mut wake);
        assert_eq!(ready(&confirms, 0), Confirmation::NotRequested);
        assert_eq!(ready(&confirms, 1), Confirmation::NotRequested);
        assert_eq!(ready(&confirms, 3), Confirmation::Ack);
        assert!(now(&confirms, 5).is_pending(), "not confirmed yet");
        assert_eq!(confirms.kept(), 0, "nothing kept one by one");
        assert!(wake.is_empty(), "nobody was waiting");
    }

    #[test]
    fn nacks_returns_and_acks_out_of_order_are_kept_until_taken_and_the_watermark_passes_them() {
        let confirms = confirming(6);
        let mut wake = Vec::new();
        confirms.resolve(3, Ok(Confirmation::Ack), &mut wake);
        confirms.resolve(1, Ok(Confirmation::Nack), &mut wake);
        confirms.resolve_run(0, 0, Confirmation::Ack, &mut wake);
        assert_eq!(ready(&confirms, 3), Confirmation::Ack, "ahead of the watermark");
        assert!(now(&confirms, 2).is_pending());
        confirms.resolve(2, Ok(Confirmation::Ack), &mut wake);
        assert_eq!(ready(&confirms, 0), Confirmation::Ack);
        assert_eq!(ready(&confirms, 2), Confirmation::Ack);
        assert_eq!(ready(&confirms, 1), Confirmation::Nack, "kept below the watermark");
        assert_eq!(confirms.kept(), 0, "every outcome taken, every mark passed");
        // The watermark went past 3, resolved before it.
        confirms.resolve_run(4, 5, Confirmation::Ack, &mut wake);
        assert_eq!(ready(&confirms, 5), Confirmation::Ack);
        assert_eq!(confirms.kept(), 0);
    }

    #[test]
    fn a_confirm_dropped_before_or_after_its_outcome_leaves_nothing_behind() {
        let confirms = confirming(5);
        let mut wake = Vec::new();
        confirms.abandon(1);
        confirms.resolve(1, Ok(Confirmation::Nack), &mut wake);
        confirms.resolve(3, Ok(Confirmation::Nack), &mut wake);
        confirms.abandon(3);
        assert!(confirms.kept() > 0, "marks ahead of the watermark");
        confirms.resolve_run(0, 0, Confirmation::Ack, &mut wake);
        confirms.resolve(2, Ok(Confirmation::Ack), &mut wake);
        confirms.resolve(4, Ok(Confirmation::Ack), &mut wake);
        assert_eq!(ready(&confirms, 4), Confirmation::Ack, "the watermark passed 1 and 3");
        assert_eq!(confirms.kept(), 0);
    }

    #[test]
    fn a_failed_tracker_fails_the_unresolved_with_its_error_and_the_never_taken_with_channel_not_open() {
        let confirms = confirming(6);
        let mut wake = Vec::new();
        confirms.resolve_run(0, 0, Confirmation::Ack, &mut wake);
        confirms.resolve(2, Ok(Confirmation::Nack), &mut wake);
        let gone = Error::ConnectionClosed(crate::proto::CloseReason::ConnectionLost);
        // The driver had taken 4 of the 6 when the channel went.
        confirms.fail(gone, 4, &mut wake);
        assert_eq!(ready(&confirms, 0), Confirmation::Ack);
        assert!(matches!(
            now(&confirms, 1),
            Poll::Ready(Err(Error::ConnectionClosed(_)))
        ));
        assert_eq!(ready(&confirms, 2), Confirmation::Nack, "resolved before, kept");
        assert!(matches!(
            now(&confirms, 3),
            Poll::Ready(Err(Error::ConnectionClosed(_)))
        ));
        assert!(matches!(now(&confirms, 4), Poll::Ready(Err(Error::ChannelNotOpen(7)))));
        assert!(matches!(now(&confirms, 9), Poll::Ready(Err(Error::ChannelNotOpen(7)))));
    }

    #[test]
    fn a_refused_publish_and_every_later_one_fail_with_the_refusal() {
        let confirms = confirming(4);
        let mut wake = Vec::new();
        confirms.refuse(2, Error::ChannelNotOpen(7), &mut wake);
        assert!(
            now(&confirms, 1).is_pending(),
            "written before: its confirm may still come"
        );
        assert!(matches!(now(&confirms, 2), Poll::Ready(Err(Error::ChannelNotOpen(7)))));
        assert!(matches!(now(&confirms, 3), Poll::Ready(Err(Error::ChannelNotOpen(7)))));
        confirms.resolve_run(0, 1, Confirmation::Ack, &mut wake);
        assert_eq!(ready(&confirms, 1), Confirmation::Ack);
    }

    #[tokio::test]
    async fn a_waiting_confirm_is_woken_when_another_task_resolves_it() {
        let confirms = confirming(3);
        let resolver = confirms.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut wake = Vec::new();
            resolver.resolve(1, Ok(Confirmation::Nack), &mut wake);
            wake_all(&mut wake);
            tokio::time::sleep(Duration::from_millis(20)).await;
            resolver.resolve_run(0, 0, Confirmation::Ack, &mut wake);
            wake_all(&mut wake);
        });
        let wait = |n| {
            let confirms = confirms.clone();
            std::future::poll_fn(move |cx| confirms.poll(n, cx))
        };
        let (nack, ack) = tokio::time::timeout(Duration::from_secs(5), async { (wait(1).await, wait(0).await) })
            .await
            .expect("woken within 5 s");
        assert!(matches!(nack, Ok(Confirmation::Nack)));
        assert!(matches!(ack, Ok(Confirmation::Ack)));
        task.await.unwrap();
    }

    /// Counts how many times it was woken.
    struct Counter(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn hundreds_of_confirms_awaited_in_any_order_are_each_woken_once_when_their_outcome_is_known() {
        const COUNT: u64 = 300;
        let confirms = confirming(COUNT);
        let counters: Vec<Arc<Counter>> = (0..COUNT)
            .map(|_| Arc::new(Counter(std::sync::atomic::AtomicUsize::new(0))))
            .collect();
        let wakers: Vec<Waker> = counters.iter().map(|c| Waker::from(c.clone())).collect();
        let poll = |n: u64| confirms.poll(n, &mut Context::from_waker(&wakers[n as usize]));
        // Awaited in a scrambled order (7 and 300 share no factor), each
        // twice: the second poll must not add a second waiter.
        for i in 0..COUNT {
            let n = i * 7 % COUNT;
            assert!(poll(n).is_pending());
            assert!(poll(n).is_pending());
        }
        let waiting = confirms.waiting();
        assert_eq!(waiting, (0..COUNT).collect::<Vec<_>>(), "one waiter each, in order");
        // Which were woken so far, and how often.
        let woken = || -> Vec<u64> {
            counters
                .iter()
                .enumerate()
                .filter_map(|(n, c)| match c.0.load(Ordering::SeqCst) {
                    0 => None,
                    1 => Some(n as u64),
                    more => panic!("publish {n} woken {more} times"),
                })
                .collect()
        };
        let mut wake = Vec::new();
        let mut step = |resolve: &dyn Fn(&mut Vec<Waker>)| {
            resolve(&mut wake);
            wake_all(&mut wake);
            woken()
        };
        // A nack ahead of the watermark wakes its waiter alone.
        assert_eq!(step(&|w| confirms.resolve(150, Ok(Confirmation::Nack), w)), [150]);
        // A run of acks wakes the front, and no one twice.
        let expected: Vec<u64> = (0..100).chain([150]).collect();
        assert_eq!(step(&|w| confirms.resolve_run(0, 99, Confirmation::Ack, w)), expected);
        // A confirm dropped while waiting is never woken.
        confirms.abandon(200);
        // The channel goes: everyone still waiting is woken, once.
        let gone = Error::ConnectionClosed(crate::proto::CloseReason::ConnectionLost);
        let expected: Vec<u64> = (0..COUNT).filter(|&n| n != 200).collect();
        assert_eq!(step(&|w| confirms.fail(gone.clone(), 250, w)), expected);
        assert!(confirms.waiting().is_empty(), "no waiter left behind");
        // And each finds the outcome it was woken for.
        for n in (0..COUNT).filter(|&n| n != 200) {
            match poll(n) {
                Poll::Ready(Ok(Confirmation::Ack)) => assert!(n < 100, "publish {n}"),
                Poll::Ready(Ok(Confirmation::Nack)) => assert_eq!(n, 150),
                Poll::Ready(Err(Error::ConnectionClosed(_))) => assert!((100..250).contains(&n), "publish {n}"),
                Poll::Ready(Err(Error::ChannelNotOpen(7))) => assert!(n >= 250, "publish {n}"),
                other => panic!("publish {n}: {other:?}"),
            }
        }
    }

    #[test]
    fn what_the_tracker_keeps_stays_bounded_by_the_confirms_outstanding() {
        let confirms = tracker();
        let mut wake = Vec::new();
        confirms.confirm_mode_from(0);
        let mut most = 0;
        let mut outstanding = std::collections::VecDeque::new();
        for i in 0..100_000u64 {
            outstanding.push_back(confirms.number());
            if outstanding.len() == 1000 {
                // The broker acks the oldest 500 at once, now and then out of
                // order (one alone first) or with a nack among them.
                let first = *outstanding.front().unwrap();
                if i % 7_000 == 999 {
                    confirms.resolve(first + 10, Ok(Confirmation::Ack), &mut wake);
                    confirms.resolve(first + 20, Ok(Confirmation::Nack), &mut wake);
                    confirms.resolve_run(first, first + 9, Confirmation::Ack, &mut wake);
                    confirms.resolve_run(first + 11, first + 19, Confirmation::Ack, &mut wake);
                    confirms.resolve_run(first + 21, first + 499, Confirmation::Ack, &mut wake);
                } else {
                    confirms.resolve_run(first, first + 499, Confirmation::Ack, &mut wake);
                }
                for n in outstanding.drain(..500) {
                    // A tenth of the confirms are dropped unread.
                    if n % 10 == 3 {
                        confirms.abandon(n);
                    } else {
                        assert!(now(&confirms, n).is_ready());
                    }
                }
                most = most.max(confirms.kept());
            }
        }
        assert!(most <= 2, "kept at most {most}");
        assert!(wake.is_empty());
    }
}
