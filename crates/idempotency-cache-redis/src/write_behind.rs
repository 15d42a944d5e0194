//! Write-behind: the queue of committed records waiting to be written to Redis, and how the
//! writer takes them in batches. The writer itself is in `cache.rs` (it writes through the
//! cache's breaker and timeout).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{Receiver, Sender, channel};

use crate::config::WriteBehindConfig;

/// One record's entry, waiting for the writer.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) value: String,
    /// When the record expires: the entry's lifetime is computed when it is written.
    pub(crate) expires_at: Option<SystemTime>,
}

/// The queue of one cache, shared by its clones. Its writer starts with the first entry (inside
/// the runtime that made the call) and ends when every clone of the cache is gone, after writing
/// what is left.
#[derive(Debug)]
pub(crate) struct Queue {
    config: WriteBehindConfig,
    sender: OnceLock<Sender<Entry>>,
    /// Whether the writer was found gone (so that it is logged once).
    gone: AtomicBool,
}

impl Queue {
    pub(crate) fn new(config: WriteBehindConfig) -> Self {
        Self {
            config,
            sender: OnceLock::new(),
            gone: AtomicBool::new(false),
        }
    }

    pub(crate) fn config(&self) -> &WriteBehindConfig {
        &self.config
    }

    /// Queues `entry`; the first call starts the writer with `start`. Gives the entry back when
    /// the queue is full or its writer is gone (logged the first time it is found gone).
    pub(crate) fn offer(
        &self,
        entry: Entry,
        start: impl FnOnce(Receiver<Entry>),
    ) -> Result<(), Entry> {
        let sender = self.sender.get_or_init(|| {
            let (sender, receiver) = channel(self.config.capacity.get());
            start(receiver);
            sender
        });
        sender.try_send(entry).map_err(|error| match error {
            TrySendError::Full(entry) => entry,
            TrySendError::Closed(entry) => {
                if !self.gone.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "distributed cache write-behind writer stopped with its runtime; \
                         every put now writes itself"
                    );
                }
                entry
            }
        })
    }
}

/// Fills `batch` with the next entries: waits for one, then takes more until `max-batch`, or
/// until `linger` has passed with the queue empty. `false` when the queue is closed and empty.
pub(crate) async fn next_batch(
    receiver: &mut Receiver<Entry>,
    config: &WriteBehindConfig,
    batch: &mut Vec<Entry>,
) -> bool {
    let Some(first) = receiver.recv().await else {
        return false;
    };
    batch.push(first);
    // A linger too long for the clock has no end: the batch waits until it is full.
    let deadline = tokio::time::Instant::now().checked_add(config.linger);
    while batch.len() < config.max_batch.get() {
        let next = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, receiver.recv()).await,
            None => Ok(receiver.recv().await),
        };
        match next {
            Ok(Some(entry)) => batch.push(entry),
            Ok(None) | Err(_) => break,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::num::NonZeroUsize;
    use std::time::Duration;

    use super::*;

    fn entry(n: usize) -> Entry {
        Entry {
            key: format!("k{n}"),
            value: String::new(),
            expires_at: None,
        }
    }

    fn config(capacity: usize, max_batch: usize, linger: Duration) -> WriteBehindConfig {
        WriteBehindConfig {
            enabled: true,
            capacity: NonZeroUsize::new(capacity).unwrap(),
            max_batch: NonZeroUsize::new(max_batch).unwrap(),
            linger,
        }
    }

    #[tokio::test]
    async fn batches_hold_at_most_max_batch_and_the_rest_follows_after_the_close() {
        let (sender, mut receiver) = channel(16);
        for n in 0..5 {
            sender.send(entry(n)).await.unwrap();
        }
        drop(sender);
        let config = config(16, 3, Duration::from_secs(60));
        let mut batch = Vec::new();
        assert!(next_batch(&mut receiver, &config, &mut batch).await);
        assert_eq!(
            batch.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
            ["k0", "k1", "k2"]
        );
        batch.clear();
        // The queue is closed: the last two come at once, without waiting for the linger.
        assert!(next_batch(&mut receiver, &config, &mut batch).await);
        assert_eq!(
            batch.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
            ["k3", "k4"]
        );
        batch.clear();
        assert!(!next_batch(&mut receiver, &config, &mut batch).await);
        assert!(batch.is_empty());
    }

    /// A linger too long for the clock is no deadline (not a panic of the writer): the batch
    /// is taken when it is full, or when the queue closes.
    #[tokio::test]
    async fn a_linger_too_long_for_the_clock_waits_for_a_full_batch() {
        let (sender, mut receiver) = channel(16);
        let config = config(16, 2, Duration::MAX);
        let mut batch = Vec::new();
        sender.send(entry(0)).await.unwrap();
        let taking = next_batch(&mut receiver, &config, &mut batch);
        let late = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            sender.send(entry(1)).await.unwrap();
        };
        let (taken, ()) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(taking, late)
        })
        .await
        .unwrap();
        assert!(taken);
        assert_eq!(
            batch.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
            ["k0", "k1"]
        );
        batch.clear();
        sender.send(entry(2)).await.unwrap();
        drop(sender);
        let closed = tokio::time::timeout(
            Duration::from_secs(30),
            next_batch(&mut receiver, &config, &mut batch),
        );
        assert!(closed.await.unwrap());
        assert_eq!(batch.len(), 1, "the close ends the wait");
    }

    #[tokio::test]
    async fn a_full_queue_gives_the_entry_back_and_the_writer_starts_once() {
        let queue = Queue::new(config(2, 1, Duration::ZERO));
        let mut starts = 0;
        let mut kept = None;
        for n in 0..3 {
            let offered = queue.offer(entry(n), |receiver| {
                starts += 1;
                kept = Some(receiver);
            });
            match (n, offered) {
                (0 | 1, Ok(())) => {}
                (2, Err(entry)) => assert_eq!(entry.key, "k2"),
                (n, other) => panic!("entry {n}: {other:?}"),
            }
        }
        assert_eq!(starts, 1);
        assert!(
            !queue.gone.load(Ordering::Relaxed),
            "a full queue is not a gone writer"
        );
        // A writer that is gone: every entry comes back, and the queue remembers it (so that it
        // is logged once).
        drop(kept);
        let refused = queue.offer(entry(3), |_| unreachable!()).unwrap_err();
        assert_eq!(refused.key, "k3");
        assert!(queue.gone.load(Ordering::Relaxed));
        let refused = queue.offer(entry(4), |_| unreachable!()).unwrap_err();
        assert_eq!(refused.key, "k4");
    }
}
