//! [`run`]: N concurrent clients, each sending one request after the other until the duration,
//! the request count or the key list runs out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::Error;
use crate::client::{Endpoint, HttpClient};
use crate::keys::KeySource;
use crate::report::Report;
use crate::tally::Tally;

/// Runs without a duration, a request count or a key list last this long.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// What a run sends, how many at once and for how long.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The demo, e.g. `http://127.0.0.1:8080`; several instances of it in turn, one request
    /// each (see [`instance_of`]).
    pub base_urls: Vec<String>,
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// Concurrent clients, each with one request in flight at a time.
    pub clients: usize,
    /// Stop sending after this long.
    pub duration: Option<Duration>,
    /// Stop after this many requests (over all clients).
    pub requests: Option<u64>,
    /// The `Idempotency-Key` of each request.
    pub keys: KeySource,
    /// `X-Tenant-Id`, when set.
    pub tenant: Option<String>,
    /// Bound on one request; a request still unanswered then counts as `timeout`.
    pub timeout: Duration,
}

/// The instance (index into `instances` base URLs) request `n` goes to: round-robin per
/// request, shifted by one for each full turn of a pool of `pool` keys, so that every key is
/// sent to every instance in turn even when the pool size is a multiple of the instance count
/// (plain `n mod instances` would then pin each key to one instance).
///
/// ```
/// use idempotency_load::load::instance_of;
///
/// // 6 keys over 3 instances: key 0 (requests 0, 6, 12) goes to instances 0, 1, 2.
/// let key0: Vec<_> = [0, 6, 12].into_iter().map(|n| instance_of(n, Some(6), 3)).collect();
/// assert_eq!(key0, [0, 1, 2]);
/// assert_eq!(instance_of(4, None, 3), 1);
/// ```
pub fn instance_of(n: u64, pool: Option<u64>, instances: usize) -> usize {
    let instances = instances.max(1) as u64;
    // Key `i` of turn `r` of the pool (request `r * pool + i`) goes to `(i + r) mod instances`.
    let (index, turn) = match pool.filter(|&p| p > 0) {
        Some(p) => (n % p, n / p),
        None => (n, 0),
    };
    usize::try_from((index % instances + turn % instances) % instances).unwrap_or_default()
}

/// Runs the load described by `config` and reports what it measured.
///
/// Request `n` (a counter shared by all clients) sends key `config.keys.key(n)`. The run stops
/// at the first of: the duration, the request count, the end of a key list; with none of them
/// it lasts [`DEFAULT_DURATION`]. Requests already in flight then finish (within `timeout`).
/// Request `n` goes to instance [`instance_of`]`(n, pool size, instances)`.
pub async fn run(config: &LoadConfig) -> Result<Report, Error> {
    let client = HttpClient::new(
        &config.base_urls,
        config.endpoint,
        config.tenant.clone(),
        config.timeout,
    )?;
    let limit = match (config.requests, config.keys.limit()) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(u64::MAX),
    };
    let duration = match (config.duration, limit) {
        (None, u64::MAX) => Some(DEFAULT_DURATION),
        (duration, _) => duration,
    };
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let issued = Arc::new(AtomicU64::new(0));
    let keys = Arc::new(config.keys.clone());
    let track_keys = config.endpoint.keyed();
    let pool = match &config.keys {
        KeySource::Pool { size, .. } => Some(*size),
        _ => None,
    };
    let instances = client.instances();

    let mut clients = Vec::with_capacity(config.clients);
    for _ in 0..config.clients.max(1) {
        let (mut session, issued, keys) =
            (client.session(), Arc::clone(&issued), Arc::clone(&keys));
        clients.push(tokio::spawn(async move {
            let mut tally = Tally::new(track_keys);
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let n = issued.fetch_add(1, Ordering::Relaxed);
                if n >= limit {
                    break;
                }
                let Some(key) = keys.key(n) else { break };
                let sent = Instant::now();
                let reply = session.send(&key, instance_of(n, pool, instances)).await;
                tally.record(&key, sent - start, sent.elapsed(), reply);
            }
            tally
        }));
    }
    let mut total = Tally::new(track_keys);
    for client in clients {
        total.merge(client.await?);
    }
    Ok(total.finish(
        &config.base_urls,
        config.endpoint,
        config.clients,
        started_unix_ms,
        start.elapsed(),
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn consecutive_requests_go_round_robin_and_every_pool_key_reaches_every_instance() {
        for (pool, instances) in [(3, 3), (6, 3), (20, 3), (5, 3), (2, 2), (7, 1), (1, 3)] {
            let targets: Vec<_> = (0..pool * 9)
                .map(|n| instance_of(n, Some(pool), instances))
                .collect();
            for key in 0..pool {
                let seen: BTreeSet<_> = (0..9)
                    .map(|turn| targets[(turn * pool + key) as usize])
                    .collect();
                assert_eq!(seen.len(), instances, "pool {pool}, key {key}: {seen:?}");
            }
            // Within a turn of the pool, consecutive requests go to the next instance.
            for n in 1..pool {
                assert_eq!(
                    targets[n as usize],
                    (targets[n as usize - 1] + 1) % instances
                );
            }
        }
        let fresh: Vec<_> = (0..6).map(|n| instance_of(n, None, 3)).collect();
        assert_eq!(fresh, [0, 1, 2, 0, 1, 2]);
        assert_eq!(instance_of(5, Some(0), 1), 0);
    }
}
