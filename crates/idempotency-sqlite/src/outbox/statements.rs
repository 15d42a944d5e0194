//! Every outbox statement, built once per store from the validated names.
//!
//! Lists travel as one JSON array parameter read with `json_each` (SQLite has no array
//! binds), so a batch is one statement whatever its size.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::schema::Names;
use crate::clock::NOW_MS;

pub(crate) fn sql(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

/// Columns a claim and the dead-letter listing return, in `MessageRow` order.
pub(crate) const MESSAGE_COLUMNS: &str = "id, aggregate_type, aggregate_id, sequence, event_type, payload, \
     headers, created_at, attempts";

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

/// The events of one `enqueue_all`, from the JSON array in `?1`, with their position.
const INPUT: &str = "input AS ( \
     SELECT key AS ord, json_extract(value, '$.id') AS id, json_extract(value, '$.t') AS t, \
            json_extract(value, '$.a') AS a, json_extract(value, '$.e') AS e, \
            json_extract(value, '$.p') AS p, json_extract(value, '$.h') AS h \
     FROM json_each(?1))";

/// The failures of one `mark_failed`, from the JSON array in `?1`.
const FAILURES: &str = "(SELECT json_extract(value, '$.id') AS id, \
            json_extract(value, '$.error') AS error, json_extract(value, '$.delay') AS delay, \
            json_extract(value, '$.dead') AS dead, \
            json_extract(value, '$.transient') AS transient FROM json_each(?1))";

#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) bump_sequences: SqlStr,
    pub(crate) insert_ordered: SqlStr,
    pub(crate) insert_unordered: SqlStr,
    pub(crate) any_due: SqlStr,
    pub(crate) claim_window: SqlStr,
    pub(crate) claim_heads: SqlStr,
    pub(crate) claim_listed: SqlStr,
    pub(crate) claim_unordered: SqlStr,
    pub(crate) mark_published: SqlStr,
    pub(crate) mark_failed: SqlStr,
    pub(crate) stats: SqlStr,
    pub(crate) delete_published: SqlStr,
    pub(crate) delete_dead_lettered: SqlStr,
    pub(crate) dead_letters: SqlStr,
    pub(crate) requeue: SqlStr,
    /// Of the dead letters in `?1`, those whose aggregate already published a later event.
    pub(crate) published_after: SqlStr,
}

/// Whether the row aliased `o` is the first pending row of its aggregate (or takes no part in
/// the order: unordered rows have no sequence). While that row is leased (in flight) or
/// backing off after a failure, the aggregate's later rows wait. `IS NOT NULL`: SQLite sorts
/// NULLs first. One probe of the aggregate index.
fn first_of_aggregate(t: &str, o: &str) -> String {
    format!(
        "({o}.sequence IS NULL OR {o}.sequence = ( \
             SELECT p.sequence FROM {t} AS p \
             WHERE p.aggregate_type = {o}.aggregate_type AND p.aggregate_id = {o}.aggregate_id \
               AND p.published_at IS NULL AND p.dead_lettered_at IS NULL \
               AND p.sequence IS NOT NULL \
             ORDER BY p.sequence LIMIT 1))"
    )
}

/// Claims take due rows in the order of the pending index: by `next_attempt_at`, then in the
/// order they were written (the index's row ids). A tie-break on `id` instead would sort
/// every row that shares a due time (one `enqueue_all` of thousands of events) before the
/// `LIMIT` could stop the scan.
///
/// The ordered claim's first look: the first `?2` due rows (the window), and among them, the
/// first `?1` that are their aggregate's first pending row, as a JSON array of ids. Returns
/// the window's size, the ids and their count. When the window is full and holds fewer than
/// `?1` such rows, later due rows may hold more: [`claim_heads`] walks the aggregates instead.
fn claim_window(t: &str) -> String {
    let first = first_of_aggregate(t, "w");
    format!(
        "WITH win AS ( \
             SELECT o.id, o.aggregate_type, o.aggregate_id, o.sequence, o.next_attempt_at \
             FROM {t} AS o \
             WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL \
               AND o.next_attempt_at <= {NOW_MS} \
             ORDER BY o.next_attempt_at LIMIT ?2), \
         heads AS (SELECT w.id FROM win AS w WHERE {first} \
                   ORDER BY w.next_attempt_at, w.id LIMIT ?1) \
         SELECT (SELECT count(*) FROM win), \
                (SELECT json_group_array(id) FROM heads), (SELECT count(*) FROM heads)"
    )
}

/// The ordered claim when the window was not enough: one walk over the aggregates that have
/// pending rows (two probes of the aggregate index per aggregate, a skip scan: an aggregate's
/// backlog is never read row by row), taking each one's first pending row when it is due, and
/// its unordered rows (no sequence) that are due. Returns the first `?1` of them by due time
/// as a JSON array of ids. `CROSS JOIN` keeps the aggregates the outer loop and `+` keeps the
/// due-time test off the pending index: otherwise the planner may scan every due row (the
/// backlog this walk exists to skip) to find the few unordered ones.
fn claim_heads(t: &str) -> String {
    let pending = "p.published_at IS NULL AND p.dead_lettered_at IS NULL";
    format!(
        "WITH RECURSIVE agg(t, a) AS ( \
             SELECT * FROM (SELECT p.aggregate_type, p.aggregate_id FROM {t} AS p \
                            WHERE {pending} ORDER BY p.aggregate_type, p.aggregate_id LIMIT 1) \
             UNION ALL \
             SELECT n.aggregate_type, n.aggregate_id FROM agg CROSS JOIN {t} AS n ON n.id = coalesce( \
                 (SELECT p.id FROM {t} AS p \
                  WHERE {pending} AND p.aggregate_type = agg.t AND p.aggregate_id > agg.a \
                  ORDER BY p.aggregate_id LIMIT 1), \
                 (SELECT p.id FROM {t} AS p \
                  WHERE {pending} AND p.aggregate_type > agg.t \
                  ORDER BY p.aggregate_type, p.aggregate_id LIMIT 1))), \
         heads AS ( \
             SELECT h.id, h.next_attempt_at FROM agg CROSS JOIN {t} AS h ON h.id = ( \
                 SELECT p.id FROM {t} AS p \
                 WHERE p.aggregate_type = agg.t AND p.aggregate_id = agg.a AND {pending} \
                   AND p.sequence IS NOT NULL \
                 ORDER BY p.sequence LIMIT 1) \
             WHERE h.next_attempt_at <= {NOW_MS} \
             UNION ALL \
             SELECT p.id, p.next_attempt_at FROM agg CROSS JOIN {t} AS p \
                 ON p.aggregate_type = agg.t AND p.aggregate_id = agg.a AND {pending} \
                    AND p.sequence IS NULL \
             WHERE +p.next_attempt_at <= {NOW_MS}), \
         firsts AS (SELECT id FROM heads ORDER BY next_attempt_at, id LIMIT ?1) \
         SELECT json_group_array(id) FROM firsts"
    )
}

/// The claim itself: `cand` (a CTE of `id` and `unmarked`, in claim order) is what it may
/// hand out.
fn claim(t: &str, cand: &str) -> String {
    // No `FOR UPDATE SKIP LOCKED`: the claim runs under SQLite's single write lock, so no
    // other claim can pick the same rows; the lease (`next_attempt_at`) hides them afterwards.
    // A row already claimed `max-attempts` (?4) times was never marked: its publishes
    // crashed their relay (or outlived the lease). It is dead-lettered instead of handed out
    // again, and comes back with `attempts` past `max-attempts` so the caller can tell.
    let spent = "attempts >= ?4";
    // A due row that still holds a claim token was never marked: the relay that claimed it
    // died (or outlived its lease) with it in its batch, and it may be the message that kills
    // relays. Such a row is handed out alone, so a crasher costs only its own attempts and the
    // healthy rows of its batch are not dead-lettered with it.
    format!(
        "WITH cand AS ({cand}) \
         UPDATE {t} SET attempts = attempts + 1, \
                next_attempt_at = CASE WHEN {spent} THEN next_attempt_at \
                                       ELSE {NOW_MS} + ?2 END, \
                claim_token = CASE WHEN {spent} THEN NULL ELSE ?3 END, \
                dead_lettered_at = CASE WHEN {spent} THEN {NOW_MS} END, \
                last_error = CASE WHEN {spent} \
                    THEN substr('claimed ' || attempts || ' times without completing' \
                         || coalesce('; last error: ' || last_error, ''), 1, 1000) \
                    ELSE last_error END \
         WHERE id IN ( \
             SELECT id FROM cand WHERE NOT EXISTS (SELECT 1 FROM cand WHERE unmarked) \
             UNION ALL \
             SELECT id FROM (SELECT id FROM cand WHERE unmarked LIMIT 1)) \
         RETURNING {MESSAGE_COLUMNS}, \
                   max(CAST({NOW_MS} - created_at AS REAL) / 1000.0, 0.0)"
    )
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let t = names.table.quoted();
        let s = names.sequences.quoted();
        let columns = "id, aggregate_type, aggregate_id, sequence, event_type, payload, headers, \
                       created_at, next_attempt_at";
        Self {
            // `WHERE true`: SQLite's documented way to keep `ON CONFLICT` from parsing as a
            // join constraint of the `SELECT`.
            bump_sequences: sql(format!(
                "WITH {INPUT} \
                 INSERT INTO {s} (aggregate_type, aggregate_id, last_sequence) \
                 SELECT t, a, count(*) FROM input WHERE true GROUP BY t, a \
                 ON CONFLICT (aggregate_type, aggregate_id) \
                 DO UPDATE SET last_sequence = last_sequence + excluded.last_sequence"
            )),
            // Reads the counters just bumped in the same transaction: this batch's events of
            // an aggregate take the last `n` numbers, in the order given.
            insert_ordered: sql(format!(
                "WITH {INPUT}, \
                 counts AS (SELECT t, a, count(*) AS n FROM input GROUP BY t, a) \
                 INSERT INTO {t} ({columns}) \
                 SELECT i.id, i.t, i.a, \
                        q.last_sequence - c.n \
                            + row_number() OVER (PARTITION BY i.t, i.a ORDER BY i.ord), \
                        i.e, i.p, i.h, {NOW_MS}, {NOW_MS} \
                 FROM input AS i \
                 JOIN counts AS c ON c.t = i.t AND c.a = i.a \
                 JOIN {s} AS q ON q.aggregate_type = i.t AND q.aggregate_id = i.a \
                 ORDER BY i.ord"
            )),
            insert_unordered: sql(format!(
                "WITH {INPUT} \
                 INSERT INTO {t} ({columns}) \
                 SELECT id, t, a, NULL, e, p, h, {NOW_MS}, {NOW_MS} FROM input ORDER BY ord"
            )),
            // A read on the pool: an idle poll neither takes nor waits for the write lock.
            any_due: sql(format!(
                "SELECT EXISTS (SELECT 1 FROM {t} \
                     WHERE {PENDING} AND next_attempt_at <= {NOW_MS})"
            )),
            claim_window: sql(claim_window(t)),
            claim_heads: sql(claim_heads(t)),
            // The ids the ordered claim chose (a JSON array in `?1`), in that order.
            claim_listed: sql(claim(
                t,
                &format!(
                    "SELECT o.id, o.claim_token IS NOT NULL AS unmarked \
                     FROM json_each(?1) AS j JOIN {t} AS o ON o.id = j.value ORDER BY j.key"
                ),
            )),
            // Any due row: the scan stops after `?1` rows.
            claim_unordered: sql(claim(
                t,
                &format!(
                    "SELECT o.id, o.claim_token IS NOT NULL AS unmarked FROM {t} AS o \
                     WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL \
               AND o.next_attempt_at <= {NOW_MS} \
                     ORDER BY o.next_attempt_at LIMIT ?1"
                ),
            )),
            mark_published: sql(format!(
                "UPDATE {t} SET published_at = {NOW_MS}, claim_token = NULL \
                 WHERE claim_token = ?2 AND id IN (SELECT value FROM json_each(?1))"
            )),
            mark_failed: sql(format!(
                "UPDATE {t} AS o \
                 SET last_error = substr(f.error, 1, 1000), \
                     next_attempt_at = {NOW_MS} + f.delay, \
                     dead_lettered_at = CASE WHEN f.dead THEN {NOW_MS} END, \
                     attempts = CASE WHEN f.transient THEN max(o.attempts - 1, 0) \
                                     ELSE o.attempts END, \
                     claim_token = NULL \
                 FROM {FAILURES} AS f \
                 WHERE o.id = f.id AND o.claim_token = ?2"
            )),
            stats: sql(format!(
                "SELECT (SELECT count(*) FROM {t} WHERE {PENDING}), \
                        (SELECT coalesce(max(CAST({NOW_MS} - min(created_at) AS REAL) / 1000.0, \
                                             0.0), 0.0) \
                         FROM {t} WHERE {PENDING}), \
                        (SELECT count(*) FROM {t} WHERE dead_lettered_at IS NOT NULL)"
            )),
            // No row locks to skip: each batch is one short write statement that picks the
            // oldest rows through the retention index.
            delete_published: sql(format!(
                "DELETE FROM {t} WHERE id IN ( \
                     SELECT id FROM {t} WHERE published_at < {NOW_MS} - ?1 \
                     ORDER BY published_at LIMIT ?2)"
            )),
            delete_dead_lettered: sql(format!(
                "DELETE FROM {t} WHERE id IN ( \
                     SELECT id FROM {t} WHERE dead_lettered_at < {NOW_MS} - ?1 \
                     ORDER BY dead_lettered_at LIMIT ?2)"
            )),
            dead_letters: sql(format!(
                "SELECT {MESSAGE_COLUMNS}, \
                        max(CAST({NOW_MS} - created_at AS REAL) / 1000.0, 0.0), \
                        last_error, dead_lettered_at \
                 FROM {t} WHERE dead_lettered_at IS NOT NULL \
                 ORDER BY dead_lettered_at, id LIMIT ?1"
            )),
            requeue: sql(format!(
                "UPDATE {t} SET dead_lettered_at = NULL, attempts = 0, \
                        next_attempt_at = {NOW_MS}, claim_token = NULL \
                 WHERE dead_lettered_at IS NOT NULL AND id IN (SELECT value FROM json_each(?1))"
            )),
            published_after: sql(format!(
                "SELECT o.id FROM {t} AS o \
                 WHERE o.id IN (SELECT value FROM json_each(?1)) \
                   AND o.dead_lettered_at IS NOT NULL AND o.sequence IS NOT NULL \
                   AND EXISTS (SELECT 1 FROM {t} AS p \
                       WHERE p.aggregate_type = o.aggregate_type \
                         AND p.aggregate_id = o.aggregate_id \
                         AND p.sequence > o.sequence AND p.published_at IS NOT NULL)"
            )),
        }
    }
}
