//! Deleting expired records: one bounded batch at a time, on a cron schedule.
//!
//! Cron expressions are parsed by the `croner` crate (five fields, or six with seconds, as in
//! `0 0 3 * * SAT,SUN`; day-of-month and day-of-week must both match, as in Spring) and
//! evaluated in a configured time zone (`cleanup.zone`, default UTC;
//! IANA names from the `chrono-tz` crate's copy of the tz database).

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

/// A cleanup schedule could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidCron {
    /// `cleanup.cron` is not a cron expression.
    #[error("idempotency.persistence.cleanup.cron: invalid cron expression {expression:?}")]
    Expression {
        /// The expression as configured.
        expression: String,
        /// What the parser said.
        #[source]
        source: croner::errors::CronError,
    },
    /// `cleanup.zone` names no time zone.
    #[error(
        "idempotency.persistence.cleanup.zone: unknown time zone {zone:?}; expected an IANA \
         name such as Europe/Berlin, or UTC"
    )]
    Zone {
        /// The zone as configured.
        zone: String,
    },
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

/// When cleanup runs: a parsed cron expression, evaluated in a time zone (UTC unless set).
///
/// ```
/// use idempotency_core::cleanup::CleanupSchedule;
/// let schedule = CleanupSchedule::parse("0 0 3 * * SAT,SUN")?;
/// let next = schedule.next_after(chrono::Utc::now()).unwrap();
/// assert!(next > chrono::Utc::now());
/// assert!(CleanupSchedule::parse("every tuesday").is_err());
///
/// // 03:00 in Berlin is 01:00 or 02:00 UTC, depending on the season.
/// let berlin = CleanupSchedule::parse("0 0 3 * * *")?.in_zone("Europe/Berlin")?;
/// assert_ne!(berlin.next_after(chrono::Utc::now()), schedule.next_after(chrono::Utc::now()));
/// assert!(CleanupSchedule::parse("0 0 3 * * *")?.in_zone("Mars/Olympus").is_err());
/// # Ok::<(), idempotency_core::cleanup::InvalidCron>(())
/// ```
#[derive(Debug, Clone)]
pub struct CleanupSchedule {
    cron: croner::Cron,
    zone: chrono_tz::Tz,
}

impl CleanupSchedule {
    /// Parses a cron expression with five fields, or six with leading seconds, evaluated in UTC.
    /// A day must match both the day-of-month and the day-of-week fields, as in Spring
    /// (`0 0 3 1-7 * MON`: the first Monday of the month), not either (Vixie cron).
    pub fn parse(expression: &str) -> Result<Self, InvalidCron> {
        croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            // Day-of-month and day-of-week must both match, as in Spring and Quartz (croner's
            // default ORs them, as Vixie cron does).
            .dom_and_dow(true)
            .build()
            .parse(expression)
            .map(|cron| Self {
                cron,
                zone: chrono_tz::UTC,
            })
            .map_err(|source| InvalidCron::Expression {
                expression: expression.to_owned(),
                source,
            })
    }

    /// The same schedule evaluated in `zone`, an IANA time zone name (`Europe/Berlin`) or
    /// `UTC`.
    pub fn in_zone(self, zone: &str) -> Result<Self, InvalidCron> {
        let zone = zone
            .parse::<chrono_tz::Tz>()
            .map_err(|_| InvalidCron::Zone {
                zone: zone.to_owned(),
            })?;
        Ok(Self { zone, ..self })
    }

    /// The next run from now; `None` for an expression that never fires (`0 0 0 30 2 *`).
    pub fn next_run(&self) -> Option<DateTime<Utc>> {
        self.next_after(Utc::now())
    }

    /// The first run strictly after `time`.
    pub fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&time.with_timezone(&self.zone), false)
            .ok()
            .map(|next| next.with_timezone(&Utc))
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
            CleanupSchedule::parse(&config.cron)?.in_zone(&config.zone)?,
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

    /// Runs on schedule until `shutdown` completes, which also cuts a purge under way: no
    /// batch after the current one is sent. The current batch is one autocommit `DELETE`
    /// already sent, which the database finishes, and may commit, after this returned (it
    /// deletes only expired records; earlier batches stay deleted). A failed run is logged and
    /// retried at the next scheduled time.
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
            // A stop during a purge cuts it: no further batch is sent. The batch being
            // deleted is one autocommit statement on a pooled connection, which the database
            // may still finish and commit; the batches before it stay deleted.
            tokio::select! {
                () = &mut shutdown => return,
                result = self.run_once() => {
                    if let Err(error) = result {
                        tracing::warn!(error = %error, "idempotency cleanup failed; retrying at the next run");
                    }
                }
            }
        }
    }
}

impl<C, M> CleanupJob<C, M>
where
    C: ExpiredCleanup + Send + Sync + 'static,
    M: IdempotencyMetrics,
{
    /// Runs the job on the Tokio runtime until [`CleanupHandle::shutdown`].
    ///
    /// ```no_run
    /// # async fn demo<S: idempotency_core::ExpiredCleanup + Send + Sync + 'static>(store: S) -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency_core::cleanup::CleanupJob;
    /// use idempotency_core::config::CleanupConfig;
    ///
    /// let cleanup = CleanupJob::from_config(store, &CleanupConfig::default(), idempotency_core::NoopMetrics)?
    ///     .spawn();
    /// // ... on shutdown (a purge under way stops; its current batch, one statement
    /// // already sent, may still commit after this returned):
    /// cleanup.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn spawn(self) -> CleanupHandle {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.run(async move {
            let _ = stopped.await;
        }));
        CleanupHandle { stop, task }
    }
}

/// A running [`CleanupJob`]; [`shutdown`](Self::shutdown) stops it.
#[derive(Debug)]
pub struct CleanupHandle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl CleanupHandle {
    /// Whether the job has stopped (after [`shutdown`](Self::shutdown), or because the schedule
    /// has no future run).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the job: cancels the wait for the next run, or cuts a purge under way. Earlier
    /// batches stay deleted; a batch whose delete statement was already sent may still be
    /// finished and committed by the database after `shutdown` returned (a store's batch is
    /// one statement, which dropping its future does not cancel on the server).
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        if let Err(error) = self.task.await {
            tracing::warn!(error = %error, "the idempotency cleanup task failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::TimeZone;

    use super::*;

    fn at(y: i32, mo: u32, d: u32, h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, 0, 0).unwrap()
    }

    #[test]
    fn the_schedule_is_evaluated_in_utc_by_default() {
        let schedule = CleanupSchedule::parse("0 0 3 * * *").unwrap();
        assert_eq!(
            schedule.next_after(at(2026, 1, 15, 0)),
            Some(at(2026, 1, 15, 3))
        );
    }

    #[test]
    fn the_configured_zone_moves_the_run_with_daylight_saving_time() {
        let config = CleanupConfig {
            cron: "0 0 3 * * *".to_owned(),
            zone: "Europe/Berlin".to_owned(),
            ..CleanupConfig::default()
        };
        let schedule = CleanupSchedule::parse(&config.cron)
            .unwrap()
            .in_zone(&config.zone)
            .unwrap();
        // 03:00 CET is 02:00 UTC in winter, 03:00 CEST is 01:00 UTC in summer.
        assert_eq!(
            schedule.next_after(at(2026, 1, 15, 0)),
            Some(at(2026, 1, 15, 2))
        );
        assert_eq!(
            schedule.next_after(at(2026, 7, 15, 0)),
            Some(at(2026, 7, 15, 1))
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_must_both_match_as_in_spring() {
        // Spring: the first Monday of the month only. Vixie cron (croner's default) ORs the
        // fields: every Monday and every day from the 1st to the 7th.
        let schedule = CleanupSchedule::parse("0 0 3 1-7 * MON").unwrap();
        // Thursday 2026-01-01 is not a Monday: the first run is Monday 2026-01-05.
        assert_eq!(
            schedule.next_after(at(2026, 1, 1, 0)),
            Some(at(2026, 1, 5, 3))
        );
        // After it, Monday 2026-01-12 is not in 1-7: the next is Monday 2026-02-02.
        assert_eq!(
            schedule.next_after(at(2026, 1, 5, 4)),
            Some(at(2026, 2, 2, 3))
        );
        // A `*` in one of the fields leaves the other alone, as before.
        let weekends = CleanupSchedule::parse("0 0 3 * * SAT,SUN").unwrap();
        assert_eq!(
            weekends.next_after(at(2026, 1, 1, 0)),
            Some(at(2026, 1, 3, 3))
        );
        let fifteenth = CleanupSchedule::parse("0 0 3 15 * *").unwrap();
        assert_eq!(
            fifteenth.next_after(at(2026, 1, 1, 0)),
            Some(at(2026, 1, 15, 3))
        );
    }

    #[test]
    fn an_unknown_zone_is_refused_naming_the_property() {
        let error = CleanupSchedule::parse("0 0 3 * * *")
            .unwrap()
            .in_zone("Europe/Atlantis")
            .unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("idempotency.persistence.cleanup.zone"),
            "{message}"
        );
        assert!(message.contains("Europe/Atlantis"), "{message}");
        let error = CleanupSchedule::parse("every day").unwrap_err().to_string();
        assert!(
            error.contains("idempotency.persistence.cleanup.cron"),
            "{error}"
        );
    }
}
