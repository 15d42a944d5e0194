//! The subjects: what a history is run against.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_cache_moka::{LocalCacheConfig, MokaCache};
use idempotency_cache_redis::{CacheSecret, DistributedCacheConfig, RedisCache};
use idempotency_core::{FailurePolicy, InFlightPolicy, ServiceOptions};
use tokio::task::JoinSet;

use crate::CheckError;
use crate::backend::{Wire, stall};
use crate::cache_wire::{CacheWire, disturb};
use crate::faults::{Faults, Injected};
use crate::history::Entry;
use crate::plan::{Fault, Op, Plan};

/// Builds the service over `$store` with the plan's caches (`$redis`: the Redis L2 when the
/// plan has one) and runs `$body` with it bound to `$service` (each cache choice is another
/// type).
macro_rules! with_caches {
    ($plan:expr, $redis:expr, $store:expr, $config:expr, $ctx:expr, |$service:ident| $body:expr) => {{
        let builder = idempotency_core::IdempotencyService::builder($store).config($config);
        match $plan.caches {
            $crate::plan::Caches::None => {
                let $service = builder.build();
                $body
            }
            $crate::plan::Caches::Moka => {
                let $service = builder.local_cache($ctx.moka($plan)).build();
                $body
            }
            $crate::plan::Caches::MokaRedis => {
                let Some(redis) = $redis else {
                    return Err($crate::CheckError::Setup(
                        "moka + Redis without a Redis cache".to_owned(),
                    ));
                };
                let $service = builder
                    .local_cache($ctx.moka($plan))
                    .distributed_cache(redis)
                    .build();
                $body
            }
        }
    }};
}

pub mod layer;
pub mod outbox;
pub mod service;

/// What every run shares: where Redis is, and the counters of the faults injected.
#[derive(Debug, Clone)]
pub struct Ctx {
    redis_url: String,
    faults: Arc<Faults>,
}

impl Ctx {
    /// A context on `REDIS_URL` (or the local Redis).
    pub fn new() -> Self {
        Self {
            redis_url: idempotency_testing::redis_url(),
            faults: Arc::default(),
        }
    }

    /// The same context, counting the faults it injects in `faults`.
    pub fn with_faults(&self, faults: Arc<Faults>) -> Self {
        Self {
            redis_url: self.redis_url.clone(),
            faults,
        }
    }

    /// The counters of the faults injected.
    pub(crate) fn faults(&self) -> &Arc<Faults> {
        &self.faults
    }

    /// The L1. While Redis fails in the plan, its entries live 30 ms, so that replays read
    /// Redis rather than the L1, which every replay of a key would read after the first.
    fn moka(&self, plan: &Plan) -> MokaCache {
        let mut config = LocalCacheConfig::default();
        if plan.redis.is_some_and(|redis| redis.faults) {
            config.ttl = Duration::from_millis(30);
        }
        MokaCache::new(&config)
    }

    /// The plan's Redis L2 (`None` without one), with a key prefix no other run uses (runs
    /// never see each other's entries) and the plan's failure policy; when the plan makes
    /// Redis fail, the cache reaches it through a [`CacheWire`], returned beside it.
    async fn redis(
        &self,
        plan: &Plan,
    ) -> Result<(Option<RedisCache>, Option<Arc<CacheWire>>), CheckError> {
        let Some(redis) = plan.redis else {
            return Ok((None, None));
        };
        let secret = CacheSecret::new(format!("check-secret-{}", "x".repeat(32)))
            .map_err(|e| CheckError::Setup(e.to_string()))?;
        let mut config = DistributedCacheConfig {
            key_prefix: format!("{}:", idempotency_testing::unique_name("check")),
            secret: Some(secret),
            failure_policy: if redis.fail_fast {
                FailurePolicy::FailFast
            } else {
                FailurePolicy::FailOpen
            },
            // Generous: the checker shares two cores with the servers.
            timeout: Duration::from_millis(500),
            ..DistributedCacheConfig::default()
        };
        let (url, wire) = if redis.faults {
            let wire = CacheWire::start(crate::backend::host_port(&self.redis_url, 6379)).await?;
            // Calls give up sooner than the stretches Redis hangs, and the breaker tries again
            // within the history: the breaker opens, half-opens and closes while it runs.
            config.timeout = Duration::from_millis(150);
            config.circuit_breaker.cool_down = Duration::from_millis(100);
            (
                crate::cache_wire::through(&self.redis_url, wire.port()),
                Some(Arc::new(wire)),
            )
        } else {
            (self.redis_url.clone(), None)
        };
        let cache =
            RedisCache::connect(&url, &config).map_err(|e| CheckError::Setup(e.to_string()))?;
        Ok((Some(cache), wire))
    }
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}

/// The service settings of a plan: its in-flight policy and lookup.
pub(crate) fn service_config(plan: &Plan) -> ServiceOptions {
    ServiceOptions {
        in_flight: if plan.wait {
            InFlightPolicy::Wait {
                timeout: Some(Duration::from_millis(250)),
            }
        } else {
            InFlightPolicy::Reject
        },
        lookup_before_acquire: plan.lookup,
        ..ServiceOptions::default()
    }
}

/// Runs each client of `plan` in a task of its own, its operations one after the other (each
/// after its pause), through `send`, while `wire` (if any) stalls and `cache_wire` (if any)
/// makes Redis hang or unreachable at random; returns every entry in operation order.
pub(crate) async fn clients<F, Fut>(
    plan: &Plan,
    wires: (Option<Wire>, Option<Arc<CacheWire>>),
    faults: &Arc<Faults>,
    send: F,
) -> Result<Vec<Entry>, CheckError>
where
    F: Fn(Op) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Entry, CheckError>> + Send + 'static,
{
    let done = Arc::new(AtomicBool::new(false));
    let (wire, cache_wire) = wires;
    let stalls = wire.map(|wire| {
        tokio::spawn(stall(
            wire,
            plan.seed,
            Arc::clone(&done),
            Arc::clone(faults),
        ))
    });
    let outages = cache_wire.map(|wire| {
        tokio::spawn(disturb(
            wire,
            plan.seed,
            Arc::clone(&done),
            Arc::clone(faults),
        ))
    });
    let entries = run_clients(plan, send).await;
    done.store(true, Ordering::Relaxed);
    for task in [stalls, outages].into_iter().flatten() {
        task.await.map_err(|e| CheckError::Client(e.to_string()))?;
    }
    entries
}

/// How long a client refused for a cache failure waits before its next request.
const CACHE_REFUSAL_BACK_OFF: Duration = Duration::from_millis(120);

/// Runs `future`, dropped after `ms` when `fault` is `Drop(ms)`: `None` when it was dropped
/// before it finished, which is counted in `faults` (a drop that fires after the end is none).
pub(crate) async fn dropped_or<T>(
    fault: Fault,
    faults: &Faults,
    future: impl Future<Output = T>,
) -> Option<T> {
    match fault {
        Fault::Drop(ms) => match tokio::time::timeout(Duration::from_millis(ms), future).await {
            Ok(done) => Some(done),
            Err(_) => {
                faults.count(Injected::Drop);
                None
            }
        },
        _ => Some(future.await),
    }
}

async fn run_clients<F, Fut>(plan: &Plan, send: F) -> Result<Vec<Entry>, CheckError>
where
    F: Fn(Op) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Entry, CheckError>> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for ops in &plan.clients {
        let ops = ops.clone();
        let send = send.clone();
        tasks.spawn(async move {
            let mut entries = Vec::with_capacity(ops.len());
            for op in ops {
                tokio::time::sleep(Duration::from_millis(op.pause_ms)).await;
                let entry = send(op).await?;
                // A client refused with Retry-After while Redis fails waits before its next
                // request (scaled down), as clients do: it does not spend its requests in one
                // outage.
                if entry.answers.iter().any(|(_, a)| a.is_cache_refusal()) {
                    tokio::time::sleep(CACHE_REFUSAL_BACK_OFF).await;
                }
                entries.push(entry);
            }
            Ok::<_, CheckError>(entries)
        });
    }
    let mut entries = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let client = joined.map_err(|e| CheckError::Client(e.to_string()))?;
        entries.extend(client?);
    }
    entries.sort_by_key(|e| e.op.id);
    Ok(entries)
}
