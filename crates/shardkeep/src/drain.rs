//! A bounded queue drained in batches by one background task, with a shutdown barrier.
//!
//! Producers never block: a full queue hands the item back. The barrier enqueues a sentinel and
//! waits — bounded — for the drainer to dequeue it; because one task drains a FIFO, that proves
//! every earlier item finished its I/O. A cancel (the owner's run context) stops the drainer at
//! once, and a barrier then reports the cancel, never a false success.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout_at};
use tokio_util::sync::CancellationToken;

/// Processes one batch of queued items.
pub trait BatchHandler<T>: Send + 'static {
    /// Handles `batch`, in queue order.
    fn handle(&mut self, batch: Vec<T>) -> impl Future<Output = ()> + Send;
}

enum Entry<T> {
    Work(T),
    Sentinel(oneshot::Sender<()>),
}

/// Why an item was not queued; the item comes back.
#[derive(Debug)]
pub enum EnqueueError<T> {
    /// The queue is full.
    Full(T),
    /// The drainer has stopped.
    Closed(T),
}

/// How a barrier ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierOutcome {
    /// Everything queued before the barrier finished its I/O.
    Drained,
    /// The bound ran out first (a wedged store); the caller goes on without the guarantee.
    TimedOut,
    /// The run context was cancelled; nothing is promised.
    Cancelled,
    /// The drainer had already stopped; nothing is promised.
    Stopped,
}

/// Producer side of a drain queue. Cheap to clone.
pub struct DrainQueue<T> {
    tx: mpsc::Sender<Entry<T>>,
    cancel: CancellationToken,
}

impl<T> Clone for DrainQueue<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            cancel: self.cancel.clone(),
        }
    }
}

impl<T: Send + 'static> DrainQueue<T> {
    /// Spawns the drainer: at most `depth` items wait, at most `max_batch` go to one `handle`.
    /// Cancelling `cancel` stops it.
    pub fn spawn<H: BatchHandler<T>>(
        depth: usize,
        max_batch: usize,
        handler: H,
        cancel: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(depth.max(1));
        let task = tokio::spawn(drain(rx, handler, cancel.clone(), max_batch.max(1)));
        (Self { tx, cancel }, task)
    }

    /// Queues `item` without waiting.
    pub fn try_enqueue(&self, item: T) -> Result<(), EnqueueError<T>> {
        match self.tx.try_reserve() {
            Ok(permit) => {
                permit.send(Entry::Work(item));
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(())) => Err(EnqueueError::Full(item)),
            Err(mpsc::error::TrySendError::Closed(())) => Err(EnqueueError::Closed(item)),
        }
    }

    /// Items waiting.
    pub fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Items the queue holds at most.
    pub fn capacity(&self) -> usize {
        self.tx.max_capacity()
    }

    /// Waits, at most `bound`, until everything queued so far has been handled.
    pub async fn barrier(&self, bound: Duration) -> BarrierOutcome {
        let deadline = Instant::now() + bound;
        let (ack, done) = oneshot::channel();
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => return BarrierOutcome::Cancelled,
            sent = timeout_at(deadline, self.tx.send(Entry::Sentinel(ack))) => match sent {
                Err(_) => return BarrierOutcome::TimedOut,
                Ok(Err(_)) => return BarrierOutcome::Stopped,
                Ok(Ok(())) => {}
            },
        }
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => BarrierOutcome::Cancelled,
            acked = timeout_at(deadline, done) => match acked {
                Err(_) => BarrierOutcome::TimedOut,
                Ok(Err(_)) => BarrierOutcome::Stopped,
                Ok(Ok(())) => BarrierOutcome::Drained,
            },
        }
    }

    /// Stops the drainer at once (a hard cancel); queued items are abandoned.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }
}

async fn drain<T, H: BatchHandler<T>>(
    mut rx: mpsc::Receiver<Entry<T>>,
    mut handler: H,
    cancel: CancellationToken,
    max_batch: usize,
) {
    loop {
        let first = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            next = rx.recv() => match next {
                Some(entry) => entry,
                None => return,
            },
        };
        let mut batch = Vec::new();
        let mut ack = None;
        match first {
            Entry::Work(item) => batch.push(item),
            Entry::Sentinel(s) => ack = Some(s),
        }
        // A sentinel ends the batch: work queued after it must not be acknowledged by it.
        while ack.is_none() && batch.len() < max_batch {
            match rx.try_recv() {
                Ok(Entry::Work(item)) => batch.push(item),
                Ok(Entry::Sentinel(s)) => ack = Some(s),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                () = handler.handle(batch) => {}
            }
        }
        // Re-check: a cancel that landed during the last write must not read as success.
        if cancel.is_cancelled() {
            return;
        }
        if let Some(ack) = ack {
            let _ = ack.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    struct Slow {
        done: Arc<AtomicUsize>,
        delay: Duration,
    }

    impl BatchHandler<u32> for Slow {
        async fn handle(&mut self, batch: Vec<u32>) {
            tokio::time::sleep(self.delay).await;
            self.done.fetch_add(batch.len(), Ordering::SeqCst);
        }
    }

    fn spawn(depth: usize, delay: Duration) -> (DrainQueue<u32>, Arc<AtomicUsize>) {
        let done = Arc::new(AtomicUsize::new(0));
        let handler = Slow {
            done: Arc::clone(&done),
            delay,
        };
        let (queue, _task) = DrainQueue::spawn(depth, 4, handler, CancellationToken::new());
        (queue, done)
    }

    #[tokio::test]
    async fn the_barrier_returns_after_everything_before_it() {
        let (queue, done) = spawn(64, Duration::from_millis(5));
        for i in 0..40 {
            assert!(queue.try_enqueue(i).is_ok());
        }
        assert_eq!(
            queue.barrier(Duration::from_secs(5)).await,
            BarrierOutcome::Drained
        );
        assert_eq!(done.load(Ordering::SeqCst), 40);
    }

    #[tokio::test]
    async fn a_full_queue_hands_the_item_back() {
        let (queue, _) = spawn(2, Duration::from_secs(60));
        let mut full = 0;
        for i in 0..10 {
            if let Err(EnqueueError::Full(item)) = queue.try_enqueue(i) {
                assert_eq!(item, i);
                full += 1;
            }
        }
        assert!(
            full >= 6,
            "at most the depth plus one in-flight batch fit: {full}"
        );
    }

    #[tokio::test]
    async fn a_wedged_drainer_times_the_barrier_out() {
        let (queue, _) = spawn(8, Duration::from_secs(60));
        assert!(queue.try_enqueue(1).is_ok());
        assert_eq!(
            queue.barrier(Duration::from_millis(50)).await,
            BarrierOutcome::TimedOut
        );
    }

    #[tokio::test]
    async fn a_cancel_never_reports_success() {
        let (queue, done) = spawn(8, Duration::from_millis(200));
        assert!(queue.try_enqueue(1).is_ok());
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.barrier(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        queue.cancel();
        assert_eq!(waiter.await.ok(), Some(BarrierOutcome::Cancelled));
        assert_eq!(done.load(Ordering::SeqCst), 0);
        assert_eq!(
            queue.barrier(Duration::from_secs(1)).await,
            BarrierOutcome::Cancelled
        );
        assert!(matches!(
            queue.try_enqueue(2),
            Err(EnqueueError::Closed(2)) | Ok(())
        ));
    }
}
