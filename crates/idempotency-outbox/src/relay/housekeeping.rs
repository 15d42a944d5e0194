//! The housekeeping task: gauges every `stats-interval`, retention every
//! `retention.interval`.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::Shared;
use crate::error::Error;
use crate::metrics;
use crate::store::Housekeeping;

/// What one retention run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Published rows deleted.
    pub published: u64,
    /// Dead-lettered rows deleted.
    pub dead_lettered: u64,
    /// Delete statements run.
    pub batches: u32,
    /// Whole partitions dropped ([`Housekeeping::drop_expired`]) before the deletes; their
    /// rows are not counted in `published` and `dead_lettered`.
    pub partitions_dropped: u32,
    /// Partitions created ahead of time ([`Housekeeping::prepare_storage`]).
    pub partitions_created: u32,
}

pub(super) async fn refresh_gauges<S: Housekeeping, P>(shared: &Shared<S, P>) -> Result<(), Error> {
    let stats = shared.store.stats().await?;
    metrics::stats(&stats);
    Ok(())
}

/// Prepares storage (partitions ahead), drops whole partitions retention would empty, then
/// deletes in batches of `batch-size`, each one short statement, until a batch comes back
/// short: published rows older than `retention.published`, then dead letters older than
/// `retention.dead-lettered`.
pub(super) async fn purge<S: Housekeeping, P>(shared: &Shared<S, P>) -> Result<PurgeReport, Error> {
    let retention = &shared.retention;
    let limit = retention.batch_size.max(1);
    let mut report = PurgeReport {
        partitions_created: shared.store.prepare_storage().await?,
        partitions_dropped: shared
            .store
            .drop_expired(retention.published, retention.dead_lettered)
            .await?,
        ..PurgeReport::default()
    };
    loop {
        let deleted = shared
            .store
            .delete_published(retention.published, limit)
            .await?;
        report.published += deleted;
        report.batches += 1;
        if deleted < u64::from(limit) {
            break;
        }
    }
    if let Some(older_than) = retention.dead_lettered {
        loop {
            let deleted = shared.store.delete_dead_lettered(older_than, limit).await?;
            report.dead_lettered += deleted;
            report.batches += 1;
            if deleted < u64::from(limit) {
                break;
            }
        }
    }
    Ok(report)
}

pub(super) async fn run<S: Housekeeping, P>(
    shared: Arc<Shared<S, P>>,
    mut stop: watch::Receiver<bool>,
) {
    // `None`: never again (an interval too long for the clock).
    let mut next_purge = Some(Instant::now());
    let due = |next: Option<Instant>| next.is_some_and(|next| Instant::now() >= next);
    let after = |interval| Instant::now().checked_add(interval);
    loop {
        if let Err(error) = refresh_gauges(&shared).await {
            tracing::warn!(
                error = &error as &dyn std::error::Error,
                "outbox stats query failed"
            );
        }
        if !shared.retention.enabled && due(next_purge) {
            // Partitions are still needed ahead of the inserts when nothing is deleted.
            next_purge = after(shared.retention.interval);
            if let Err(error) = shared.store.prepare_storage().await {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "outbox storage preparation failed"
                );
            }
        }
        if shared.retention.enabled && due(next_purge) {
            next_purge = after(shared.retention.interval);
            match purge(&shared).await {
                Ok(report)
                    if report.published + report.dead_lettered > 0
                        || report.partitions_dropped + report.partitions_created > 0 =>
                {
                    tracing::info!(
                        published = report.published,
                        dead_lettered = report.dead_lettered,
                        partitions_dropped = report.partitions_dropped,
                        partitions_created = report.partitions_created,
                        "outbox retention deleted rows"
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "outbox retention failed"
                    );
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(shared.config.stats_interval) => {}
            _ = stop.changed() => return,
        }
    }
}
