//! The subjects: what a history is run against.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_cache_moka::{LocalCacheConfig, MokaCache};
use idempotency_cache_redis::{CacheSecret, DistributedCacheConfig, RedisCache};
use idempotency_core::{InFlightPolicy, ServiceOptions};
use tokio::task::JoinSet;

use crate::CheckError;
use crate::backend::{Wire, stall};
use crate::history::Entry;
use crate::plan::{Op, Plan};

/// Builds the service over `$store` with the plan's caches and runs `$body` with it bound to
/// `$service` (each cache choice is another type).
macro_rules! with_caches {
    ($caches:expr, $store:expr, $config:expr, $ctx:expr, |$service:ident| $body:expr) => {{
        let builder = idempotency_core::IdempotencyService::builder($store).config($config);
        match $caches {
            $crate::plan::Caches::None => {
                let $service = builder.build();
                $body
            }
            $crate::plan::Caches::Moka => {
                let $service = builder.local_cache($ctx.moka()).build();
                $body
            }
            $crate::plan::Caches::MokaRedis => {
                let $service = builder
                    .local_cache($ctx.moka())
                    .distributed_cache($ctx.redis()?)
                    .build();
                $body
            }
        }
    }};
}

pub mod layer;
pub mod outbox;
pub mod service;

/// What every run shares: where Redis is.
#[derive(Debug, Clone)]
pub struct Ctx {
    redis_url: String,
}

impl Ctx {
    /// A context on `REDIS_URL` (or the local Redis).
    pub fn new() -> Self {
        Self {
            redis_url: idempotency_testing::redis_url(),
        }
    }

    fn moka(&self) -> MokaCache {
        MokaCache::new(&LocalCacheConfig::default())
    }

    /// A Redis L2 with a key prefix no other run uses: runs never see each other's entries.
    fn redis(&self) -> Result<RedisCache, CheckError> {
        let secret = CacheSecret::new(format!("check-secret-{}", "x".repeat(32)))
            .map_err(|e| CheckError::Setup(e.to_string()))?;
        let config = DistributedCacheConfig {
            key_prefix: format!("{}:", idempotency_testing::unique_name("check")),
            secret: Some(secret),
            // Generous: the checker shares two cores with the servers.
            timeout: Duration::from_millis(500),
            ..DistributedCacheConfig::default()
        };
        RedisCache::connect(&self.redis_url, &config).map_err(|e| CheckError::Setup(e.to_string()))
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
/// after its pause), through `send`, while `wire` (if any) stalls at random; returns every
/// entry in operation order.
pub(crate) async fn clients<F, Fut>(
    plan: &Plan,
    wire: Option<Wire>,
    send: F,
) -> Result<Vec<Entry>, CheckError>
where
    F: Fn(Op) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Entry, CheckError>> + Send + 'static,
{
    let done = Arc::new(AtomicBool::new(false));
    let stalls = wire.map(|wire| tokio::spawn(stall(wire, plan.seed, Arc::clone(&done))));
    let entries = run_clients(plan, send).await;
    done.store(true, Ordering::Relaxed);
    if let Some(stalls) = stalls {
        stalls
            .await
            .map_err(|e| CheckError::Client(e.to_string()))?;
    }
    entries
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
                entries.push(send(op).await?);
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
