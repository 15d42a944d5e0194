//! Deleting expired records: one bounded batch at a time, on a cron schedule.
//!
//! Cron expressions are parsed by the `croner` crate (five fields, or six with seconds, as in
//! `0 0 3 * * SAT,SUN`) and evaluated in UTC.

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::CleanupConfig;
use crate::metrics::IdempotencyMetrics;
use crate::store::{ExpiredCleanup, StoreError};

/// What one cleanup run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Records deleted.
    pub deleted: u64,
    /// Batches (transactions) used.
    pub batches: u32,
}

/// A cron expression could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("invalid cron expression {expression:?}")]
pub struct InvalidCron {
    expression: String,
    #[source]
    source: croner::errors::CronError,
}

/// Deletes expired records in batches of `batch_size`, each its own short transaction, until a
/// batch comes back short.
pub async fn purge_expired<C: ExpiredCleanup + ?Sized>(
    store: &C,
    batch_size: u32,
) -> Result<CleanupReport, StoreError> {
    let batch_size = batch_size.max(1);
    let mut report = CleanupReport::default();
    loop {
        let deleted = store.delete_expired_batch(batch_size).await?;
        report.deleted += deleted;
        report.batches += 1;
        if deleted < u64::from(batch_size) {
            return Ok(report);
        }
    }
}

/// When cleanup runs: a parsed cron expression.
///
/// ```
/// use idempotency_core::cleanup::CleanupSchedule;
/// let schedule = CleanupSchedule::parse("0 0 3 * * SAT,SUN")?;
/// let next = schedule.next_after(chrono::Utc::now()).unwrap();
/// assert!(next > chrono::Utc::now());
/// assert!(CleanupSchedule::parse("every tuesday").is_err());
/// # Ok::<(), idempotency_core::cleanup::InvalidCron>(())
/// ```
#[derive(Debug, Clone)]
pub struct CleanupSchedule {
    cron: croner::Cron,
}

impl CleanupSchedule {
    /// Parses a cron expression with five fields, or six with leading seconds.
    pub fn parse(expression: &str) -> Result<Self, InvalidCron> {
        croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map(|cron| Self { cron })
            .map_err(|source| InvalidCron {
                expression: expression.to_owned(),
                source,
            })
    }

    /// The first run strictly after `time`.
    pub fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&time, false).ok()
    }
}

impl FromStr for CleanupSchedule {
    type Err = InvalidCron;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The cleanup job: sleeps until the next scheduled time, purges, repeats.
///
/// ```no_run
/// # async fn demo<S: idempotency_core::ExpiredCleanup>(store: S) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::cleanup::CleanupJob;
/// use idempotency_core::config::CleanupConfig;
///
/// let job = CleanupJob::from_config(store, &CleanupConfig::default(), idempotency_core::NoopMetrics)?;
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let handle = tokio::spawn(job.run(async { let _ = stopped.await; }));
/// // ... on shutdown:
/// let _ = stop.send(());
/// handle.await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CleanupJob<C, M> {
    store: C,
    schedule: CleanupSchedule,
    batch_size: u32,
    metrics: M,
}

impl<C: ExpiredCleanup, M: IdempotencyMetrics> CleanupJob<C, M> {
    /// A job over `store` with an explicit schedule.
    pub fn new(store: C, schedule: CleanupSchedule, batch_size: u32, metrics: M) -> Self {
        Self {
            store,
            schedule,
            batch_size,
            metrics,
        }
    }

    /// A job from `idempotency.persistence.cleanup` (its `enabled` flag is the caller's to check).
    pub fn from_config(store: C, config: &CleanupConfig, metrics: M) -> Result<Self, InvalidCron> {
        Ok(Self::new(
            store,
            CleanupSchedule::parse(&config.cron)?,
            config.batch_size,
            metrics,
        ))
    }

    /// Runs one purge now.
    pub async fn run_once(&self) -> Result<CleanupReport, StoreError> {
        let report = purge_expired(&self.store, self.batch_size).await?;
        self.metrics.cleanup_deleted(report.deleted);
        tracing::info!(
            deleted = report.deleted,
            batches = report.batches,
            "expired idempotency records deleted"
        );
        Ok(report)
    }

    /// Runs on schedule until `shutdown` completes. A failed run is logged and retried at the
    /// next scheduled time.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let now = Utc::now();
            let Some(next) = self.schedule.next_after(now) else {
                tracing::warn!("cleanup schedule has no future run; stopping");
                return;
            };
            let wait = (next - now).to_std().unwrap_or(Duration::ZERO);
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(wait) => {}
            }
            if let Err(error) = self.run_once().await {
                tracing::warn!(error = %error, "idempotency cleanup failed; retrying at the next run");
            }
        }
    }
}
