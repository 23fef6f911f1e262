//! The batch queue: many senders, one receiver that takes everything
//! queued in one swap. It replaces an unbounded mpsc for the driver's
//! commands: a send is a lock, a push and (only when the driver sleeps on
//! an empty queue) a wake; the driver takes a whole batch under one lock.
//! Each consumer's delivery queue is one too, with the driver as its one
//! sender (see `state::DeliveryQueue`).
//!
//! It keeps what the driver relied on from the mpsc:
//! - one order for every command of every sender;
//! - the receiver hears when the last (strong) sender is gone, after it
//!   has taken everything sent before;
//! - a send after the receiver is dropped fails and hands the value back,
//!   and values still queued when it is dropped are dropped with it (their
//!   reply senders then tell their waiters);
//! - weak senders, which do not keep the queue open.
//!
//! Every change of state and the receiver's waker live under one mutex, so
//! a send can never slip between the receiver's check and its sleep.
//!
//! A queue may also carry a side state `S` beside its values, which a sender
//! changes under the same lock as it queues ([`Sender::send_with`]) and the
//! receiver takes from in the same swap ([`Receiver::poll_recv_with`]). The
//! command queue keeps its publishes' frames there: a publish is encoded by
//! its caller, straight into the bytes the driver takes next.
//!
//! It knows nothing of what it carries, and must never run a caller's code
//! that blocks, or wake a task, under its lock.

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct Contents<T, S> {
    items: Vec<T>,
    side: S,
    senders: usize,
    receiver_gone: bool,
    waker: Option<Waker>,
}

struct BatchQueue<T, S> {
    contents: Mutex<Contents<T, S>>,
}

impl<T, S> BatchQueue<T, S> {
    fn lock(&self) -> MutexGuard<'_, Contents<T, S>> {
        // Nothing runs user code under this lock; a poisoned one still
        // holds a consistent state.
        self.contents.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A new queue's sender and receiver.
pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    with_side()
}

/// A new queue whose side state starts as `S::default()`.
pub(crate) fn with_side<T, S: Default>() -> (Sender<T, S>, Receiver<T, S>) {
    let queue = Arc::new(BatchQueue {
        contents: Mutex::new(Contents {
            items: Vec::new(),
            side: S::default(),
            senders: 1,
            receiver_gone: false,
            waker: None,
        }),
    });
    (Sender { queue: queue.clone() }, Receiver { queue })
}

/// Sends into the queue; the queue stays open while one exists.
pub(crate) struct Sender<T, S = ()> {
    queue: Arc<BatchQueue<T, S>>,
}

impl<T, S> std::fmt::Debug for Sender<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("batch_queue::Sender").finish_non_exhaustive()
    }
}

impl<T, S> Sender<T, S> {
    /// Queues `value`, or hands it back once the receiver is gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let waker = {
            let mut state = self.queue.lock();
            if state.receiver_gone {
                return Err(value);
            }
            state.items.push(value);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    /// Runs `queue` under the queue's lock, with its values and its side
    /// state, and wakes the receiver if it waits and values are queued
    /// then; `None` (without running `queue`) once the receiver is gone.
    /// `queue` must not block: the receiver takes the same lock.
    pub(crate) fn send_with<R>(&self, queue: impl FnOnce(&mut Vec<T>, &mut S) -> R) -> Option<R> {
        let (result, waker) = {
            let mut state = self.queue.lock();
            if state.receiver_gone {
                return None;
            }
            let state = &mut *state;
            let result = queue(&mut state.items, &mut state.side);
            let waker = if state.items.is_empty() {
                None
            } else {
                state.waker.take()
            };
            (result, waker)
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Some(result)
    }

    /// Whether the receiver is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.queue.lock().receiver_gone
    }

    /// A sender that does not keep the queue open.
    pub(crate) fn downgrade(&self) -> WeakSender<T, S> {
        WeakSender {
            queue: self.queue.clone(),
        }
    }
}

impl<T, S> Clone for Sender<T, S> {
    fn clone(&self) -> Self {
        self.queue.lock().senders += 1;
        Sender {
            queue: self.queue.clone(),
        }
    }
}

impl<T, S> Drop for Sender<T, S> {
    fn drop(&mut self) {
        let waker = {
            let mut state = self.queue.lock();
            state.senders -= 1;
            if state.senders == 0 {
                state.waker.take()
            } else {
                None
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A sender that does not keep the queue open (see [`Sender::downgrade`]).
pub(crate) struct WeakSender<T, S = ()> {
    queue: Arc<BatchQueue<T, S>>,
}

impl<T, S> std::fmt::Debug for WeakSender<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("batch_queue::WeakSender").finish_non_exhaustive()
    }
}

impl<T, S> WeakSender<T, S> {
    /// Runs `f` on the side state under the queue's lock; `None` once the
    /// receiver is gone.
    pub(crate) fn side<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        let mut state = self.queue.lock();
        (!state.receiver_gone).then(|| f(&mut state.side))
    }

    /// A sender, while some other sender still keeps the queue open.
    pub(crate) fn upgrade(&self) -> Option<Sender<T, S>> {
        let mut state = self.queue.lock();
        if state.senders == 0 {
            return None;
        }
        state.senders += 1;
        drop(state);
        Some(Sender {
            queue: self.queue.clone(),
        })
    }
}

/// Takes what the queue holds, in batches.
pub(crate) struct Receiver<T, S = ()> {
    queue: Arc<BatchQueue<T, S>>,
}

impl<T, S> std::fmt::Debug for Receiver<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("batch_queue::Receiver").finish_non_exhaustive()
    }
}

impl<T, S> Receiver<T, S> {
    /// Swaps everything queued into `batch`, which must be empty: `Ready(true)`
    /// when that is something, `Ready(false)` once the queue is empty and
    /// every sender is gone, else `Pending` (woken by the next send, or by
    /// the last sender's drop).
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>, batch: &mut Vec<T>) -> Poll<bool> {
        self.poll_recv_with(cx, batch, |_| {})
    }

    /// [`Receiver::poll_recv`] that also lets `take` take from the side
    /// state, under the same lock, when it takes a batch.
    pub(crate) fn poll_recv_with(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut Vec<T>,
        take: impl FnOnce(&mut S),
    ) -> Poll<bool> {
        debug_assert!(batch.is_empty(), "the last batch is not used up");
        let mut state = self.queue.lock();
        if !state.items.is_empty() {
            std::mem::swap(&mut state.items, batch);
            take(&mut state.side);
            return Poll::Ready(true);
        }
        if state.senders == 0 {
            return Poll::Ready(false);
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Swaps everything queued into `batch` (which must be empty) without
    /// waiting; whether that was something.
    pub(crate) fn try_recv(&mut self, batch: &mut Vec<T>) -> bool {
        debug_assert!(batch.is_empty(), "the last batch is not used up");
        let mut state = self.queue.lock();
        std::mem::swap(&mut state.items, batch);
        !batch.is_empty()
    }

    /// How many values are queued.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().items.len()
    }

    /// [`Receiver::poll_recv`] as a future.
    #[cfg(test)]
    pub(crate) async fn recv(&mut self, batch: &mut Vec<T>) -> bool {
        std::future::poll_fn(|cx| self.poll_recv(cx, batch)).await
    }
}

impl<T, S> Receiver<T, S> {
    /// Closes the queue as dropping the receiver does: later sends fail,
    /// and what is queued is dropped (outside the lock).
    #[cfg_attr(not(feature = "conformance"), allow(dead_code))]
    pub(crate) fn close(&mut self) {
        let left = {
            let mut state = self.queue.lock();
            state.receiver_gone = true;
            state.waker = None;
            std::mem::take(&mut state.items)
        };
        drop(left);
    }
}

impl<T, S> Drop for Receiver<T, S> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn next_batch(rx: &mut Receiver<u32>) -> Option<Vec<u32>> {
        let mut batch = Vec::new();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv(&mut batch))
            .await
            .expect("the queue answers within 5 s");
        got.then_some(batch)
    }

    #[tokio::test]
    async fn every_sender_s_values_come_out_in_one_order_in_batches() {
        let (tx, mut rx) = channel();
        let other = tx.clone();
        for i in 0..5 {
            tx.send(i).unwrap();
            other.send(100 + i).unwrap();
        }
        assert_eq!(
            next_batch(&mut rx).await.unwrap(),
            [0, 100, 1, 101, 2, 102, 3, 103, 4, 104]
        );
        tx.send(7).unwrap();
        assert_eq!(next_batch(&mut rx).await.unwrap(), [7]);
    }

    #[test]
    fn try_recv_takes_what_is_queued_without_waiting_and_len_counts_it() {
        let (tx, mut rx) = channel();
        let mut batch = Vec::new();
        assert!(!rx.try_recv(&mut batch), "nothing queued yet");
        assert_eq!(rx.len(), 0);
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        assert_eq!(rx.len(), 2);
        assert!(rx.try_recv(&mut batch));
        assert_eq!(batch, [1, 2]);
        assert_eq!(rx.len(), 0);
        batch.clear();
        // After the last sender: what it sent is still there to take.
        tx.send(3).unwrap();
        drop(tx);
        assert!(rx.try_recv(&mut batch));
        assert_eq!(batch, [3]);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send_from_another_task() {
        let (tx, mut rx) = channel();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send(1).unwrap();
            tx
        });
        assert_eq!(next_batch(&mut rx).await.unwrap(), [1]);
        drop(sender.await.unwrap());
        assert_eq!(next_batch(&mut rx).await, None);
    }

    #[tokio::test]
    async fn the_queue_ends_after_the_last_strong_sender_and_what_it_sent() {
        let (tx, mut rx) = channel();
        let weak = tx.downgrade();
        let upgraded = weak.upgrade().expect("a strong sender exists");
        tx.send(1).unwrap();
        drop(tx);
        upgraded.send(2).unwrap();
        drop(upgraded);
        assert!(weak.upgrade().is_none(), "no strong sender is left");
        assert_eq!(next_batch(&mut rx).await.unwrap(), [1, 2]);
        assert_eq!(next_batch(&mut rx).await, None);
        // The last sender dropped while the receiver waits wakes it.
        let (tx, mut rx) = channel::<u32>();
        let dropper = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(tx);
        });
        assert_eq!(next_batch(&mut rx).await, None);
        dropper.await.unwrap();
    }

    #[test]
    fn sends_after_the_receiver_is_gone_fail_and_what_was_queued_is_dropped() {
        let (tx, rx) = channel();
        let queued = Arc::new(());
        tx.send(queued.clone()).unwrap();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(
            Arc::strong_count(&queued),
            1,
            "the queued value was dropped with the receiver"
        );
        let refused = tx.send(queued.clone()).unwrap_err();
        assert!(Arc::ptr_eq(&refused, &queued));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_senders_on_other_threads_lose_nothing() {
        let (tx, mut rx) = channel();
        let mut senders = Vec::new();
        for s in 0..4u32 {
            let tx = tx.clone();
            senders.push(tokio::spawn(async move {
                for i in 0..10_000u32 {
                    tx.send(s * 100_000 + i).unwrap();
                    if i % 100 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        drop(tx);
        let mut seen: Vec<Vec<u32>> = vec![Vec::new(); 4];
        while let Some(batch) = next_batch(&mut rx).await {
            for v in batch {
                seen[(v / 100_000) as usize].push(v % 100_000);
            }
        }
        for sender in senders {
            sender.await.unwrap();
        }
        for (s, values) in seen.iter().enumerate() {
            assert_eq!(
                *values,
                (0..10_000).collect::<Vec<_>>(),
                "sender {s}'s values, in its order"
            );
        }
    }
}
