//! Every outbox statement, built once per store from the validated names; statements over a
//! list of rows are built per list length (sqlx caches each prepared form).

use sqlx::SqlStr;

use super::schema::Names;
use crate::clock::NOW;
use crate::records::sql;

/// Columns a claim and the dead-letter listing return, in `MessageRow` order.
pub(crate) const MESSAGE_COLUMNS: &str = "o.id, o.aggregate_type, o.aggregate_id, o.sequence, o.event_type, \
     o.payload, o.headers, o.created_at, o.attempts, \
     TIMESTAMPDIFF(MICROSECOND, o.created_at, UTC_TIMESTAMP(6)) / 1e6";

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

#[derive(Debug)]
pub(crate) struct Statements {
    table: String,
    pub(crate) bump_sequence: SqlStr,
    pub(crate) read_sequence: SqlStr,
    pub(crate) claim_ordered: SqlStr,
    pub(crate) claim_unordered: SqlStr,
    pub(crate) mark_failed: SqlStr,
    pub(crate) stats: SqlStr,
    pub(crate) published_before: SqlStr,
    pub(crate) dead_lettered_before: SqlStr,
    pub(crate) dead_letters: SqlStr,
}

fn claim(t: &str, ordered: bool) -> String {
    let head = if ordered {
        // Only the first pending row of its aggregate: while it is leased (in flight) or
        // backing off after a failure, the aggregate's later rows wait. The subquery is a
        // plain read (a locking clause does not reach into subqueries): a row another claim
        // holds still counts as the aggregate's first.
        format!(
            "AND (o.sequence IS NULL OR o.sequence <= ( \
                 SELECT p.sequence FROM {t} AS p \
                 WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
                   AND p.published_at IS NULL AND p.dead_lettered_at IS NULL \
                   AND p.sequence IS NOT NULL \
                 ORDER BY p.sequence LIMIT 1))"
        )
    } else {
        String::new()
    };
    // The last column tells a row a dead relay left unmarked (it still holds a claim token):
    // such a row is leased alone (see `MysqlOutbox::claim_on`).
    format!(
        "SELECT {MESSAGE_COLUMNS}, CAST(o.claim_token IS NOT NULL AS SIGNED) FROM {t} AS o \
         WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL \
           AND o.next_attempt_at <= {NOW} {head} \
         ORDER BY o.next_attempt_at, o.id \
         LIMIT ? \
         FOR UPDATE SKIP LOCKED"
    )
}

fn list(n: usize) -> String {
    vec!["?"; n].join(", ")
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let t = names.table.quoted();
        let s = names.sequences.quoted();
        Self {
            table: t.to_owned(),
            // Locks the counter row until the caller's transaction ends: a second writer of
            // the aggregate waits here, then numbers its events after the first one's.
            bump_sequence: sql(format!(
                "INSERT INTO {s} (aggregate_type, aggregate_id, last_sequence) VALUES (?, ?, ?) \
                 ON DUPLICATE KEY UPDATE last_sequence = last_sequence + ?"
            )),
            // The transaction's own write: visible to it whatever its snapshot.
            read_sequence: sql(format!(
                "SELECT last_sequence FROM {s} WHERE aggregate_type = ? AND aggregate_id = ?"
            )),
            claim_ordered: sql(claim(t, true)),
            claim_unordered: sql(claim(t, false)),
            mark_failed: sql(format!(
                "UPDATE {t} SET last_error = LEFT(?, 1000), \
                        next_attempt_at = {NOW} + INTERVAL ? MICROSECOND, \
                        dead_lettered_at = IF(?, {NOW}, NULL), \
                        attempts = IF(?, GREATEST(attempts - 1, 0), attempts), claim_token = NULL \
                 WHERE id = ? AND claim_token = ?"
            )),
            stats: sql(format!(
                "SELECT (SELECT COUNT(*) FROM {t} WHERE {PENDING}), \
                        (SELECT COALESCE(GREATEST( \
                             TIMESTAMPDIFF(MICROSECOND, MIN(created_at), {NOW}) / 1e6, 0e0), 0e0) \
                         FROM {t} WHERE {PENDING}), \
                        (SELECT COUNT(*) FROM {t} WHERE dead_lettered_at IS NOT NULL)"
            )),
            published_before: sql(format!(
                "SELECT id FROM {t} WHERE published_at < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY published_at LIMIT ? FOR UPDATE SKIP LOCKED"
            )),
            dead_lettered_before: sql(format!(
                "SELECT id FROM {t} WHERE dead_lettered_at < {NOW} - INTERVAL ? MICROSECOND \
                 ORDER BY dead_lettered_at LIMIT ? FOR UPDATE SKIP LOCKED"
            )),
            dead_letters: sql(format!(
                "SELECT {MESSAGE_COLUMNS}, o.last_error, o.dead_lettered_at FROM {t} AS o \
                 WHERE o.dead_lettered_at IS NOT NULL ORDER BY o.dead_lettered_at, o.id LIMIT ?"
            )),
        }
    }

    /// Inserts `n` events; each row binds id, aggregate type and id, sequence, event type,
    /// payload, headers.
    pub(crate) fn insert(&self, n: usize) -> SqlStr {
        let rows = vec![format!("(?, ?, ?, ?, ?, ?, ?, {NOW}, {NOW})"); n].join(", ");
        sql(format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
                             headers, created_at, next_attempt_at) VALUES {rows}",
            self.table
        ))
    }

    /// Leases `n` claimed rows (binds: max attempts, token, max attempts, lease, max attempts
    /// twice, then the ids).
    /// MySQL applies a single-table `UPDATE`'s assignments left to right, each seeing the
    /// ones before it: `attempts` is bumped last, so every test reads the value the claim
    /// found. A row already claimed `max-attempts` times was never marked (its publishes
    /// crashed their relay or outlived the lease): it is dead-lettered instead of leased.
    pub(crate) fn lease(&self, n: usize) -> SqlStr {
        let spent = "attempts >= ?";
        sql(format!(
            "UPDATE {} SET \
                 claim_token = IF({spent}, NULL, ?), \
                 next_attempt_at = IF({spent}, next_attempt_at, {NOW} + INTERVAL ? MICROSECOND), \
                 dead_lettered_at = IF({spent}, {NOW}, NULL), \
                 last_error = IF({spent}, \
                     LEFT(CONCAT('claimed ', attempts, ' times without completing', \
                                 COALESCE(CONCAT('; last error: ', last_error), '')), 1000), \
                     last_error), \
                 attempts = attempts + 1 \
             WHERE id IN ({})",
            self.table,
            list(n)
        ))
    }

    pub(crate) fn mark_published(&self, n: usize) -> SqlStr {
        sql(format!(
            "UPDATE {} SET published_at = {NOW}, claim_token = NULL \
             WHERE claim_token = ? AND id IN ({})",
            self.table,
            list(n)
        ))
    }

    pub(crate) fn delete(&self, n: usize) -> SqlStr {
        sql(format!(
            "DELETE FROM {} WHERE id IN ({})",
            self.table,
            list(n)
        ))
    }

    /// Of `n` dead letters, those whose aggregate already published a later event.
    pub(crate) fn published_after(&self, n: usize) -> SqlStr {
        let t = &self.table;
        sql(format!(
            "SELECT o.id FROM {t} AS o \
             WHERE o.id IN ({}) AND o.dead_lettered_at IS NOT NULL AND o.sequence IS NOT NULL \
               AND EXISTS (SELECT 1 FROM {t} AS p \
                   WHERE p.aggregate_type = o.aggregate_type \
                     AND p.aggregate_id = o.aggregate_id \
                     AND p.sequence > o.sequence AND p.published_at IS NOT NULL)",
            list(n)
        ))
    }

    pub(crate) fn requeue(&self, n: usize) -> SqlStr {
        sql(format!(
            "UPDATE {} SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = {NOW}, \
                    claim_token = NULL \
             WHERE dead_lettered_at IS NOT NULL AND id IN ({})",
            self.table,
            list(n)
        ))
    }
}
