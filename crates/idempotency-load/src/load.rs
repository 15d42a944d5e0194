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
    /// The demo, e.g. `http://127.0.0.1:8080`.
    pub base_url: String,
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

/// Runs the load described by `config` and reports what it measured.
///
/// Request `n` (a counter shared by all clients) sends key `config.keys.key(n)`. The run stops
/// at the first of: the duration, the request count, the end of a key list; with none of them
/// it lasts [`DEFAULT_DURATION`]. Requests already in flight then finish (within `timeout`).
pub async fn run(config: &LoadConfig) -> Result<Report, Error> {
    let client = HttpClient::new(
        &config.base_url,
        config.endpoint,
        config.tenant.clone(),
        config.timeout,
        config.clients,
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
    let track_keys = config.endpoint == Endpoint::Payments;

    let mut clients = Vec::with_capacity(config.clients);
    for _ in 0..config.clients.max(1) {
        let (client, issued, keys) = (client.clone(), Arc::clone(&issued), Arc::clone(&keys));
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
                let reply = client.send(&key).await;
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
        config.endpoint,
        config.clients,
        started_unix_ms,
        start.elapsed(),
    ))
}
