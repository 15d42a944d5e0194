//! The time-partitioned outbox layout: partitions created ahead of time, and retention by
//! `DETACH` + `DROP` of a partition whose every row retention would delete.
//!
//! Partitions are managed here, with no extension. They are ordinary `RANGE (created_at)`
//! partitions found through the catalog by their bounds, whatever their names, so partitions
//! created by hand or by pg_partman are used and retired alike; ranges that overlap an
//! existing partition are not created again.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgPool};

use crate::outbox::error::outbox_error;
use crate::pooler::{Own, Pooler};
use crate::table::TableName;
use idempotency_outbox::Error;
use idempotency_outbox::config::PartitioningConfig;

/// How long partition DDL waits for its lock before it gives up until the next pass: the
/// `ACCESS EXCLUSIVE` lock it queues for would otherwise hold back every claim and enqueue
/// behind a long transaction.
const DDL_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '1s'";

/// The drop's transaction: READ COMMITTED whatever `default_transaction_isolation` says, so
/// the re-check after `DETACH` sees every row committed while `DETACH` waited for its lock.
/// Under REPEATABLE READ its snapshot would date from before that wait (`DETACH` takes it),
/// and a row requeued meanwhile would be dropped with its partition.
const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// SQLSTATE of a lock timeout (`lock_not_available`).
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of a relation that does not exist (any more).
const UNDEFINED_TABLE: &str = "42P01";
/// SQLSTATEs of a partition another pass created while this one waited for its lock: the name
/// exists (`duplicate_table`; `unique_violation` when both reached the catalog at once), or
/// another name over the range does ("would overlap", `invalid_object_definition`).
const CREATED_MEANWHILE: [&str; 3] = ["42P07", "23505", "42P17"];
/// SQLSTATE of "updated partition constraint for default partition would be violated":
/// the default partition holds rows of the range.
const CHECK_VIOLATION: &str = "23514";

/// One partition of a partitioned outbox, as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxPartition {
    /// The partition, schema-qualified and quoted.
    pub name: String,
    /// The lower bound (inclusive); `None` for `MINVALUE` and for the default partition.
    pub from: Option<DateTime<Utc>>,
    /// The upper bound (exclusive); `None` for `MAXVALUE` and for the default partition.
    pub to: Option<DateTime<Utc>>,
    /// Whether it is the `DEFAULT` partition.
    pub default: bool,
}

/// A partition's bounds in seconds since the epoch (`None`: unbounded).
#[derive(Debug, Clone)]
struct Bounds {
    name: String,
    default: bool,
    from: Option<i64>,
    to: Option<i64>,
}

impl Bounds {
    fn overlaps(&self, lo: i64, hi: i64) -> bool {
        !self.default && self.from.is_none_or(|from| from < hi) && self.to.is_none_or(|to| to > lo)
    }
}

/// The partitions of `table` with their bounds.
async fn bounds(pool: &PgPool, pooler: Pooler, table: &TableName) -> Result<Vec<Bounds>, Error> {
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    // Bounds are printed by `pg_get_expr` as timestamptz literals in the session's settings
    // and read back with the same settings. A partition dropped by a concurrent retention
    // pass while this waited for its lock has no bound (null) any more: left out.
    let rows: Vec<(String, bool, Option<i64>, Option<i64>)> = sqlx::query_as(
        "WITH parts AS ( \
             SELECT format('%I.%I', n.nspname, c.relname) AS name, \
                    pg_get_expr(c.relpartbound, c.oid) AS bound \
             FROM pg_inherits i \
             JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE i.inhparent = to_regclass($1)), \
         parsed AS ( \
             SELECT name, bound = 'DEFAULT' AS is_default, \
                    regexp_match(bound, '^FOR VALUES FROM \\((.*)\\) TO \\((.*)\\)$') AS m \
             FROM parts WHERE bound IS NOT NULL) \
         SELECT name, is_default, \
                CASE WHEN m[1] LIKE '''%''' \
                     THEN floor(extract(epoch FROM btrim(m[1], '''')::timestamptz))::int8 END, \
                CASE WHEN m[2] LIKE '''%''' \
                     THEN floor(extract(epoch FROM btrim(m[2], '''')::timestamptz))::int8 END \
         FROM parsed ORDER BY 3 NULLS FIRST",
    )
    .persistent(false)
    .bind(table.quoted())
    .fetch_all(&mut *own)
    .await
    .map_err(outbox_error)?;
    own.finish().await.map_err(outbox_error)?;
    Ok(rows
        .into_iter()
        .map(|(name, default, from, to)| Bounds {
            name,
            default,
            from,
            to,
        })
        .collect())
}

fn time(seconds: Option<i64>) -> Option<DateTime<Utc>> {
    seconds.and_then(|s| DateTime::from_timestamp(s, 0))
}

pub(crate) async fn list(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
) -> Result<Vec<OutboxPartition>, Error> {
    Ok(bounds(pool, pooler, table)
        .await?
        .into_iter()
        .map(|b| OutboxPartition {
            name: b.name,
            from: time(b.from),
            to: time(b.to),
            default: b.default,
        })
        .collect())
}

/// The partition `[lo, lo + interval)` of `table`, named after its lower bound in UTC
/// (`outbox_p20261201t000000`).
fn partition_name(table: &TableName, lo: i64) -> Result<TableName, Error> {
    let stamp = DateTime::from_timestamp(lo, 0).ok_or_else(|| Error::Corrupt {
        reason: format!("partition bound {lo} is out of range"),
    })?;
    Ok(table.sibling_with_whole_suffix(&format!("p{}", stamp.format("%Y%m%dt%H%M%S"))))
}

fn is_code(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|c| c == code)
}

/// Whether the default partition of `existing` holds a row of `[lo, hi)`: then creating that
/// range's partition would fail (23514) after waiting for ACCESS EXCLUSIVE on the outbox and
/// holding every enqueue behind it. Read without a lock (a scan of the default partition,
/// empty unless maintenance fell behind), so nothing waits for it.
async fn default_holds_rows(
    pool: &PgPool,
    pooler: Pooler,
    existing: &[Bounds],
    lo: i64,
    hi: i64,
) -> Result<bool, Error> {
    let Some(default) = existing.iter().find(|b| b.default) else {
        return Ok(false);
    };
    let probe = format!(
        "SELECT EXISTS (SELECT 1 FROM {} \
                        WHERE created_at >= to_timestamp($1) AND created_at < to_timestamp($2))",
        default.name
    );
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let holds = sqlx::query_scalar(AssertSqlSafe(probe))
        .persistent(false)
        .bind(lo)
        .bind(hi)
        .fetch_one(&mut *own)
        .await;
    let holds = gone_if_undefined(holds)?;
    if holds.is_some() {
        own.finish().await.map_err(outbox_error)?;
    }
    Ok(holds.unwrap_or(false))
}

/// Creates the partitions of the current interval and of the `ahead` next ones that do not
/// exist yet; returns how many it created. A range that overlaps an existing partition or
/// that the default partition holds rows of is skipped without taking a lock; one whose lock
/// is not granted within a second, or that the default partition got rows of meanwhile, is
/// skipped (and retried by the next pass); one a concurrent pass created meanwhile is done.
pub(crate) async fn prepare(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
    config: &PartitioningConfig,
) -> Result<u32, Error> {
    let interval = i64::try_from(config.interval.as_secs())
        .unwrap_or(i64::MAX)
        .max(1);
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let now: i64 = sqlx::query_scalar("SELECT floor(extract(epoch FROM clock_timestamp()))::int8")
        .persistent(false)
        .fetch_one(&mut *own)
        .await
        .map_err(outbox_error)?;
    own.finish().await.map_err(outbox_error)?;
    let current = now.div_euclid(interval) * interval;
    let existing = bounds(pool, pooler, table).await?;
    let mut created = 0;
    for k in 0..=i64::from(config.ahead) {
        let lo = current.saturating_add(k.saturating_mul(interval));
        let hi = lo.saturating_add(interval);
        if existing.iter().any(|b| b.overlaps(lo, hi)) {
            continue;
        }
        let name = partition_name(table, lo)?;
        if default_holds_rows(pool, pooler, &existing, lo, hi).await? {
            tracing::warn!(
                partition = %name,
                "outbox partition not created: the default partition holds rows of its range \
                 (maintenance fell behind); they stay there, are claimed and retired as any \
                 other, and the range goes without a partition of its own"
            );
            continue;
        }
        let ddl = format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF {} \
             FOR VALUES FROM (to_timestamp({lo})) TO (to_timestamp({hi}))",
            name.quoted(),
            table.quoted()
        );
        let mut tx = crate::begin(pool).await.map_err(outbox_error)?;
        sqlx::raw_sql(crate::records::QUIET)
            .execute(&mut *tx)
            .await
            .map_err(outbox_error)?;
        sqlx::raw_sql(DDL_LOCK_TIMEOUT)
            .execute(&mut *tx)
            .await
            .map_err(outbox_error)?;
        match sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await {
            Ok(_) => {
                tx.commit().await.map_err(outbox_error)?;
                created += 1;
            }
            Err(error)
                if is_code(&error, LOCK_NOT_AVAILABLE) || is_code(&error, CHECK_VIOLATION) =>
            {
                tracing::warn!(
                    partition = %name,
                    error = &error as &dyn std::error::Error,
                    "outbox partition not created this time (its rows stay in the default \
                     partition meanwhile)"
                );
            }
            // Done by a concurrent pass: not counted here.
            Err(error) if CREATED_MEANWHILE.iter().any(|code| is_code(&error, code)) => {}
            Err(error) => return Err(outbox_error(error)),
        }
    }
    Ok(created)
}

/// Whether `partition` holds a row retention would keep: a pending row, a row published less
/// than `$1` ago, or a dead letter younger than `$2` (any dead letter when `$2` is null). The
/// cut-offs are scalar subqueries, evaluated once, so each probe is an index condition.
fn keeps_rows(partition: &str) -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM {partition} \
                        WHERE published_at IS NULL AND dead_lettered_at IS NULL) \
             OR EXISTS (SELECT 1 FROM {partition} \
                        WHERE published_at >= (SELECT clock_timestamp() - $1::interval)) \
             OR EXISTS (SELECT 1 FROM {partition} \
                        WHERE dead_lettered_at IS NOT NULL AND $2::interval IS NULL) \
             OR EXISTS (SELECT 1 FROM {partition} \
                        WHERE dead_lettered_at >= (SELECT clock_timestamp() - $2::interval))"
    )
}

/// The column a retention delete ages rows by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expiry {
    /// `published_at`.
    Published,
    /// `dead_lettered_at`.
    DeadLettered,
}

/// Deletes at most `limit` rows whose `expiry` column is more than `older_than` ago, partition
/// by partition, oldest first; returns how many. Each statement addresses one partition, so it
/// is planned as on a plain table: one joined against the parent, with the batch size a
/// parameter, may be planned as a hash join over a sequential scan of every partition.
pub(crate) async fn delete_expired_rows(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
    expiry: Expiry,
    older_than: Duration,
    limit: u32,
) -> Result<u64, Error> {
    let column = match expiry {
        Expiry::Published => "published_at",
        Expiry::DeadLettered => "dead_lettered_at",
    };
    let mut deleted = 0;
    for partition in bounds(pool, pooler, table).await? {
        let left = u64::from(limit).saturating_sub(deleted);
        if left == 0 {
            break;
        }
        let p = &partition.name;
        let statement = format!(
            "WITH doomed AS ( \
                 SELECT id, created_at FROM {p} \
                 WHERE {column} < (SELECT clock_timestamp() - $1::interval) \
                 ORDER BY {column} LIMIT $2 FOR UPDATE SKIP LOCKED) \
             DELETE FROM {p} AS o USING doomed \
             WHERE o.id = doomed.id AND o.created_at = doomed.created_at"
        );
        let mut own = Own::read_committed(pool).await.map_err(outbox_error)?;
        let done = sqlx::query(AssertSqlSafe(statement))
            .persistent(false)
            .bind(older_than)
            .bind(i64::try_from(left).unwrap_or(i64::MAX))
            .execute(&mut *own)
            .await;
        if let Some(done) = gone_if_undefined(done)? {
            own.finish().await.map_err(outbox_error)?;
            deleted += done.rows_affected();
        }
    }
    Ok(deleted)
}

/// Detaches and drops every partition (never the default one) whose range ended more than
/// `published` ago and every row of which retention would delete; returns how many. The check
/// runs once without locks, then again on the detached partition, in the READ COMMITTED
/// transaction that drops it, so a row requeued meanwhile keeps its partition. A partition a
/// concurrent pass detached or dropped first is done, not an error.
pub(crate) async fn drop_expired(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
    published: Duration,
    dead_lettered: Option<Duration>,
) -> Result<u32, Error> {
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let cutoff: i64 = sqlx::query_scalar(
        "SELECT floor(extract(epoch FROM clock_timestamp() - $1::interval))::int8",
    )
    .persistent(false)
    .bind(published)
    .fetch_one(&mut *own)
    .await
    .map_err(outbox_error)?;
    own.finish().await.map_err(outbox_error)?;
    let mut dropped = 0;
    for partition in bounds(pool, pooler, table).await? {
        let Some(to) = partition.to else { continue };
        if partition.default || to > cutoff {
            continue;
        }
        let check = keeps_rows(&partition.name);
        let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
        let keeps = sqlx::query_scalar(AssertSqlSafe(check.clone()))
            .persistent(false)
            .bind(published)
            .bind(dead_lettered)
            .fetch_one(&mut *own)
            .await;
        let keeps = gone_if_undefined(keeps)?;
        if keeps.is_some() {
            // Ended before the detach below: a transaction of its own holds no lock past here.
            own.finish().await.map_err(outbox_error)?;
        }
        match keeps {
            Some(false) => {}
            // Kept, or dropped by a concurrent pass since it was listed.
            Some(true) | None => continue,
        }
        let mut tx = crate::begin(pool).await.map_err(outbox_error)?;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "{READ_COMMITTED}; {DDL_LOCK_TIMEOUT}"
        )))
        .execute(&mut *tx)
        .await
        .map_err(outbox_error)?;
        let detach = format!(
            "ALTER TABLE {} DETACH PARTITION {}",
            table.quoted(),
            partition.name
        );
        match sqlx::raw_sql(AssertSqlSafe(detach)).execute(&mut *tx).await {
            Ok(_) => {}
            Err(error) if is_code(&error, LOCK_NOT_AVAILABLE) => {
                tracing::warn!(
                    partition = %partition.name,
                    "outbox partition not dropped this time: its lock was not granted within 1s"
                );
                continue;
            }
            // Detached (or dropped) by a concurrent pass while this one waited: done.
            Err(error) if is_code(&error, UNDEFINED_TABLE) => continue,
            Err(error) => return Err(outbox_error(error)),
        }
        let keeps: bool = sqlx::query_scalar(AssertSqlSafe(check))
            .persistent(false)
            .bind(published)
            .bind(dead_lettered)
            .fetch_one(&mut *tx)
            .await
            .map_err(outbox_error)?;
        if keeps {
            // Rolled back: the partition stays attached.
            continue;
        }
        sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {}", partition.name)))
            .execute(&mut *tx)
            .await
            .map_err(outbox_error)?;
        tx.commit().await.map_err(outbox_error)?;
        dropped += 1;
    }
    Ok(dropped)
}

/// `Ok(None)` for a statement that failed because its partition is gone (42P01: dropped or
/// detached by a concurrent retention pass since it was listed).
fn gone_if_undefined<T>(result: Result<T, sqlx::Error>) -> Result<Option<T>, Error> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if is_code(&error, UNDEFINED_TABLE) => Ok(None),
        Err(error) => Err(outbox_error(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_names_keep_their_whole_bound() {
        let table = TableName::parse("billing.outbox").unwrap();
        let name = partition_name(&table, 1_764_547_200).unwrap();
        assert_eq!(name.quoted(), r#""billing"."outbox_p20251201t000000""#);
        let long = TableName::parse(&"o".repeat(60)).unwrap();
        let a = partition_name(&long, 0).unwrap();
        let b = partition_name(&long, 86_400).unwrap();
        assert_ne!(a, b);
        assert!(a.name().len() <= 63 && a.name().ends_with("_p19700101t000000"));
    }

    #[test]
    fn overlap_treats_missing_bounds_as_unbounded_and_ignores_the_default() {
        let b = |from, to, default| Bounds {
            name: String::new(),
            default,
            from,
            to,
        };
        assert!(b(Some(0), Some(10), false).overlaps(5, 15));
        assert!(!b(Some(0), Some(10), false).overlaps(10, 20));
        assert!(b(None, Some(10), false).overlaps(-100, -90));
        assert!(b(Some(0), None, false).overlaps(100, 110));
        assert!(!b(None, None, true).overlaps(0, 10));
    }
}
