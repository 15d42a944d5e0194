//! The slot map refresh of a cluster client after a timeout.
//!
//! A cluster master that hangs (a frozen process, a cut link) answers neither an IO error nor a
//! redirection, so fred would never reload its slot map: after the replica's promotion it would
//! keep writing that third of the keys to the dead socket for good. A timeout therefore asks
//! fred to reload the map (`CLUSTER SLOTS`), which drops the connections to nodes that no
//! longer serve slots and sends their commands to the new owners; at most once per
//! [`INTERVAL`], since a reload holds fred's routing task while it runs.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use fred::clients::Client;
use fred::interfaces::ClusterInterface;

/// The least time between two refreshes.
pub(crate) const INTERVAL: Duration = Duration::from_secs(2);

/// The refresh of one cluster client.
#[derive(Debug)]
pub(crate) struct Refresh {
    /// The cache's client slot: the client in it now is the one refreshed.
    client: Arc<RwLock<Client>>,
    /// When the last refresh started.
    last: Mutex<Option<Instant>>,
}

impl Refresh {
    pub(crate) fn new(client: Arc<RwLock<Client>>) -> Self {
        Self {
            client,
            last: Mutex::new(None),
        }
    }

    /// Starts a refresh in the background, unless one started less than [`INTERVAL`] ago (or
    /// there is no runtime to run it on).
    pub(crate) fn after_timeout(&self) {
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|last| now.duration_since(last) < INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self
            .client
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        runtime.spawn(async move {
            match client.sync_cluster().await {
                Ok(()) => tracing::debug!("Redis Cluster slot map reloaded after a timeout"),
                Err(error) => {
                    tracing::warn!(%error, "reloading the Redis Cluster slot map after a timeout failed");
                }
            }
        });
    }
}
