//! The listener task: turns notifications into worker wake-ups, debounced.

use std::sync::Arc;

use tokio::sync::watch;

use super::Shared;
use crate::store::{NotificationListener, RelayStore};

/// Listens until stopped. Every notification wakes one worker at once (the leading edge);
/// further notifications within `notify-debounce` are coalesced into one more wake-up at the
/// end of the window. A lost connection is re-established, and a wake-up issued, since
/// notifications may have been missed meanwhile; polling covers the gap.
pub(super) async fn listen<S: RelayStore, P>(
    shared: Arc<Shared<S, P>>,
    mut stop: watch::Receiver<bool>,
) {
    let debounce = shared.config.notify_debounce;
    loop {
        let mut listener = match shared.store.listen().await {
            Ok(Some(listener)) => listener,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "outbox LISTEN failed; polling until it works"
                );
                tokio::select! {
                    () = tokio::time::sleep(shared.config.poll_interval) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        shared.wake.notify_one();
        loop {
            let next = tokio::select! {
                next = listener.next() => next,
                _ = stop.changed() => return,
            };
            if let Err(error) = next {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "outbox notification listener failed; reconnecting"
                );
                break;
            }
            shared.wake.notify_one();
            if debounce.is_zero() {
                continue;
            }
            let window = tokio::time::sleep(debounce);
            tokio::pin!(window);
            let mut more = false;
            loop {
                tokio::select! {
                    () = &mut window => break,
                    next = listener.next() => match next {
                        Ok(_) => more = true,
                        Err(_) => break,
                    },
                    _ = stop.changed() => return,
                }
            }
            if more {
                shared.wake.notify_one();
            }
        }
    }
}
