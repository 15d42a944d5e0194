//! A core NATS subscription that counts every copy of every message reaching the server.
//!
//! JetStream drops a copy whose `Nats-Msg-Id` it has seen within the duplicate window from the
//! *stream*, but a core subscriber on the subject still receives it: this count is the number
//! of deliveries before JetStream's deduplication, and the [`LIFE_HEADER`] of each copy says
//! which relay process sent it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use idempotency_outbox::publisher::nats::async_nats;
use serde::{Deserialize, Serialize};

use super::relay::LIFE_HEADER;
use crate::Error;

/// What the subscription saw.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    /// Messages received, copies included.
    pub deliveries: u64,
    /// Messages without a `Nats-Msg-Id` header (none are expected).
    pub without_id: u64,
    /// Per `Nats-Msg-Id`, the relay process of each copy received, in arrival order (`0` when
    /// a copy has no [`LIFE_HEADER`]).
    pub copies: BTreeMap<String, Vec<u64>>,
}

impl Watched {
    /// Distinct message ids.
    pub fn unique(&self) -> u64 {
        self.copies.len() as u64
    }

    /// Per relay process, the messages it sent that a later process sent again: the copies
    /// its death cost (the messages it had in flight, sent but not marked published).
    pub fn resent_after(&self) -> BTreeMap<u64, u64> {
        let mut resent = BTreeMap::new();
        for lives in self.copies.values() {
            let last = lives.iter().copied().max().unwrap_or(0);
            let mut senders: Vec<u64> = lives.iter().copied().filter(|&l| l < last).collect();
            senders.sort_unstable();
            senders.dedup();
            for life in senders {
                *resent.entry(life).or_default() += 1;
            }
        }
        resent
    }

    fn count(&mut self, message: &async_nats::Message) {
        self.deliveries += 1;
        let header = |name| message.headers.as_ref()?.get(name).map(|v| v.as_str());
        let life = header(LIFE_HEADER)
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        match header("Nats-Msg-Id") {
            Some(id) => self.copies.entry(id.to_owned()).or_default().push(life),
            None => self.without_id += 1,
        }
    }
}

/// After `stop`, messages keep being counted until none arrived for this long.
const DRAIN: Duration = Duration::from_millis(500);

/// Subscribes to `subject` (`chaos.>`), calls `ready` once the server registered the
/// subscription, and counts until `stop` completes and the subscription is quiet for 500 ms.
pub async fn run(
    client: &async_nats::Client,
    subject: &str,
    ready: impl FnOnce(),
    stop: impl Future<Output = ()>,
) -> Result<Watched, Error> {
    let mut subscriber = client
        .subscribe(subject.to_owned())
        .await
        .map_err(|e| Error::nats("subscribe", e))?;
    client.flush().await.map_err(|e| Error::nats("flush", e))?;
    ready();
    let mut watched = Watched::default();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            message = subscriber.next() => match message {
                Some(message) => watched.count(&message),
                None => break,
            },
        }
    }
    while let Ok(Some(message)) = tokio::time::timeout(DRAIN, subscriber.next()).await {
        watched.count(&message);
    }
    Ok(watched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_copy_sent_again_later_is_charged_to_the_process_that_sent_it_first() {
        let watched = Watched {
            deliveries: 7,
            without_id: 0,
            copies: BTreeMap::from([
                ("a".to_owned(), vec![1]),
                ("b".to_owned(), vec![1, 3]),
                ("c".to_owned(), vec![2, 1, 3]),
                ("d".to_owned(), vec![2, 2]),
            ]),
        };
        assert_eq!(watched.unique(), 4);
        assert_eq!(watched.resent_after(), BTreeMap::from([(1, 2), (2, 1)]));
    }
}
