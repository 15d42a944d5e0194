//! Every outbox statement, built once per store from the validated names.

use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::table::TableName;
use idempotency_outbox::config::Ordering;

pub(crate) fn sql(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

/// Columns a claim and the dead-letter listing return, in `MessageRow` order.
pub(crate) const MESSAGE_COLUMNS: &str = "o.id, o.aggregate_type::text, o.aggregate_id::text, \
     o.sequence, o.event_type::text, o.payload::text, o.headers::text, o.created_at, o.attempts, \
     GREATEST(EXTRACT(EPOCH FROM clock_timestamp() - o.created_at), 0)::float8";

const PENDING: &str = "published_at IS NULL AND dead_lettered_at IS NULL";

#[derive(Debug)]
pub(crate) struct Statements {
    /// The enqueue, notifying when the outbox has a channel.
    pub(crate) enqueue: SqlStr,
    /// The enqueue without a notification (the same as `enqueue` without a channel).
    pub(crate) enqueue_quiet: SqlStr,
    pub(crate) claim_ordered: SqlStr,
    pub(crate) claim_unordered: SqlStr,
    pub(crate) mark_published: SqlStr,
    pub(crate) mark_failed: SqlStr,
    pub(crate) stats: SqlStr,
    pub(crate) delete_published: SqlStr,
    pub(crate) delete_dead_lettered: SqlStr,
    pub(crate) dead_letters: SqlStr,
    pub(crate) requeue: SqlStr,
    /// Of the dead letters `$1`, those whose aggregate already published a later event.
    pub(crate) published_after: SqlStr,
}

fn enqueue(table: &TableName, ordering: Ordering, notify: bool) -> String {
    let t = table.quoted();
    let input = "input AS ( \
            SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], \
                                 $6::text[]) \
            WITH ORDINALITY AS i(id, aggregate_type, aggregate_id, event_type, payload, headers, ord))";
    let columns = "id, aggregate_type, aggregate_id, sequence, event_type, payload, headers, \
                   created_at, next_attempt_at";
    let insert = match ordering {
        // The upsert locks each aggregate's counter row until the caller's transaction ends
        // (in a stable order, so two multi-aggregate writers do not deadlock on it): a second
        // writer of the aggregate waits, then numbers its events after the first one's.
        Ordering::Ordered => {
            let s = table.sibling("sequences");
            let s = s.quoted();
            format!(
                "{input}, \
                 counts AS ( \
                     SELECT aggregate_type, aggregate_id, count(*) AS n FROM input \
                     GROUP BY aggregate_type, aggregate_id), \
                 seq AS ( \
                     INSERT INTO {s} AS s (aggregate_type, aggregate_id, last_sequence) \
                     SELECT aggregate_type, aggregate_id, n FROM counts \
                     ORDER BY aggregate_type, aggregate_id \
                     ON CONFLICT (aggregate_type, aggregate_id) \
                     DO UPDATE SET last_sequence = s.last_sequence + EXCLUDED.last_sequence \
                     RETURNING s.aggregate_type::text, s.aggregate_id::text, s.last_sequence), \
                 ins AS ( \
                     INSERT INTO {t} ({columns}) \
                     SELECT i.id, i.aggregate_type, i.aggregate_id, \
                            q.last_sequence - c.n + row_number() OVER ( \
                                PARTITION BY i.aggregate_type, i.aggregate_id ORDER BY i.ord), \
                            i.event_type, i.payload::json, i.headers::json, \
                            clock_timestamp(), clock_timestamp() \
                     FROM input i \
                     JOIN counts c ON c.aggregate_type = i.aggregate_type \
                                  AND c.aggregate_id = i.aggregate_id \
                     JOIN seq q ON q.aggregate_type = i.aggregate_type \
                               AND q.aggregate_id = i.aggregate_id \
                     RETURNING 1)"
            )
        }
        Ordering::Unordered => format!(
            "{input}, \
             ins AS ( \
                 INSERT INTO {t} ({columns}) \
                 SELECT id, aggregate_type, aggregate_id, NULL, event_type, payload::json, \
                        headers::json, clock_timestamp(), clock_timestamp() \
                 FROM input ORDER BY ord \
                 RETURNING 1)"
        ),
    };
    if notify {
        // Delivered at commit, never on rollback; one per transaction and channel.
        format!("WITH {insert} SELECT pg_notify($7, '') FROM (SELECT 1 FROM ins LIMIT 1) AS x")
    } else {
        format!("WITH {insert} SELECT count(*) FROM ins")
    }
}

/// How many due rows the ordered claim looks at, oldest first, on top of its batch size,
/// before it walks the aggregates instead: enough to fill a batch when most due rows are the
/// first of their aggregate, few enough that a claim behind leased first rows stays short.
const CLAIM_WINDOW: i64 = 256;

/// Pending rows of the table aliased `p`.
const PENDING_P: &str = "p.published_at IS NULL AND p.dead_lettered_at IS NULL";

/// The unordered claim: the first `$1` due rows in `next_attempt_at` order, as the pending
/// index holds them, skipping those another claim has locked.
fn claim_unordered(t: &str) -> String {
    let cand = format!(
        "SELECT o.id, o.created_at, o.claim_token IS NOT NULL AS unmarked, \
                NULL::int4 AS lap, NULL::int8 AS n FROM {t} o \
         WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL \
           AND o.next_attempt_at <= now() \
         ORDER BY o.next_attempt_at \
         LIMIT $1 \
         FOR UPDATE OF o SKIP LOCKED"
    );
    claim(t, &format!("cand AS ({cand})"))
}

/// The ordered claim: only the first pending row of its aggregate (by `sequence`) is handed
/// out; while it is leased (in flight) or backing off after a failure, the aggregate's later
/// rows wait. Rows without a sequence (enqueued by an unordered outbox) wait for nothing.
///
/// Every step is an index probe or a bounded index range, so the rows it reads do not grow
/// with the backlog behind leased first rows:
///
/// - `win`: the oldest `$1 + CLAIM_WINDOW` due rows (the pending index), and `firsts`, those
///   of them that are the first pending row of their aggregate (one probe of the aggregate
///   index each). When the window is not full it held every due row, and `firsts` is all
///   there is to claim.
/// - Otherwise (a full window of rows waiting behind their aggregate's first) a walk over the
///   aggregates with pending rows, a loose index scan of the aggregate index (`after`, then
///   `upto`: one probe per aggregate to find the next one, however many rows it holds), and
///   each aggregate's first pending row (one more probe), taken when it is due (rows without
///   a sequence come after those with one there: the window hands them out). The walk starts
///   after the aggregate `($5, $6)` (the last one the previous walk handed a row out of;
///   `''`, `''` for the first) and wraps around, so every aggregate gets its turn however
///   many others sort before it. It runs only as far as the claim reads it: it stops once `$1`
///   rows are locked, having read the aggregates whose first row is leased or failing on the
///   way, and the due first rows it hands out.
/// - `cand` locks the candidates in that order (`SKIP LOCKED`: a row another claim holds is
///   left to it), until `$1` are locked. Each is fetched by the `ctid` the statement's
///   snapshot found it at (a TID scan, in the partition its `created_at` names). A row
///   another claim updated since is either followed to its latest version, whose pending and
///   due columns are tested again, or skipped (servers whose TID scans test the `ctid` again
///   on a concurrent update); either is safe: nothing is handed out twice or out of order, and
///   a skipped row is claimed by a later claim. The pending test there is spelt with
///   `coalesce` so that no partial index can serve it, whatever the statistics say.
///
/// Rows that came from the walk return where they were in it (`lap`, `n`); the relay starts
/// its next walk after the last of them.
fn claim_ordered(t: &str) -> String {
    let window = format!("$1 + {CLAIM_WINDOW}");
    // The next aggregate with pending rows after `(w.t, w.a)` (the walk's last), within `bound`.
    let next = |bound: &str| {
        format!(
            "SELECT p.aggregate_type, p.aggregate_id FROM {t} p \
             WHERE {PENDING_P} AND (p.aggregate_type, p.aggregate_id) > (w.t, w.a) {bound} \
             ORDER BY p.aggregate_type, p.aggregate_id LIMIT 1"
        )
    };
    // The first aggregate with pending rows within `bound`.
    let first = |bound: &str| {
        format!(
            "SELECT p.aggregate_type, p.aggregate_id FROM {t} p \
             WHERE {PENDING_P} AND {bound} \
             ORDER BY p.aggregate_type, p.aggregate_id LIMIT 1"
        )
    };
    let up_to_start = "(p.aggregate_type, p.aggregate_id) <= ($5::text, $6::text)";
    let first_after = first("(p.aggregate_type, p.aggregate_id) > ($5::text, $6::text)");
    let next_after = next("");
    let first_upto = first(up_to_start);
    let next_upto = next(&format!("AND {up_to_start}"));
    let cand = format!(
        "win AS MATERIALIZED ( \
             SELECT o.ctid, o.id, o.created_at, o.aggregate_type, o.aggregate_id, o.sequence \
             FROM {t} o \
             WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL \
               AND o.next_attempt_at <= now() \
             ORDER BY o.next_attempt_at \
             LIMIT {window}), \
         firsts AS MATERIALIZED ( \
             SELECT w.ctid, w.id, w.created_at FROM win w \
             WHERE w.sequence IS NULL OR w.sequence <= ( \
                 SELECT p.sequence FROM {t} p \
                 WHERE p.aggregate_type = w.aggregate_type AND p.aggregate_id = w.aggregate_id \
                   AND {PENDING_P} \
                 ORDER BY p.sequence LIMIT 1)), \
         after(t, a, n) AS ( \
             SELECT s.aggregate_type, s.aggregate_id, 1::int8 FROM ({first_after}) s \
             UNION ALL \
             SELECT s.aggregate_type, s.aggregate_id, w.n + 1 \
             FROM after w CROSS JOIN LATERAL ({next_after}) s), \
         upto(t, a, n) AS ( \
             SELECT s.aggregate_type, s.aggregate_id, 1::int8 FROM ({first_upto}) s \
             UNION ALL \
             SELECT s.aggregate_type, s.aggregate_id, w.n + 1 \
             FROM upto w CROSS JOIN LATERAL ({next_upto}) s), \
         walked AS ( \
             SELECT h.ctid, h.id, h.created_at, w.lap, w.n FROM ( \
                 SELECT t, a, 0 AS lap, n FROM after \
                 UNION ALL \
                 SELECT t, a, 1 AS lap, n FROM upto) w \
             CROSS JOIN LATERAL ( \
                 SELECT p.ctid, p.id, p.created_at, p.next_attempt_at FROM {t} p \
                 WHERE p.aggregate_type = w.t AND p.aggregate_id = w.a AND {PENDING_P} \
                 ORDER BY p.sequence LIMIT 1) h \
             WHERE h.next_attempt_at <= now() \
               AND NOT EXISTS (SELECT 1 FROM firsts f WHERE f.id = h.id)), \
         picked AS ( \
             SELECT ctid, id, created_at, NULL::int4 AS lap, NULL::int8 AS n FROM firsts \
             UNION ALL \
             SELECT ctid, id, created_at, lap, n FROM walked \
             WHERE (SELECT count(*) FROM win) = {window}), \
         cand AS ( \
             SELECT l.id, l.created_at, l.unmarked, c.lap, c.n \
             FROM picked c CROSS JOIN LATERAL ( \
                 SELECT o.id, o.created_at, o.claim_token IS NOT NULL AS unmarked FROM {t} o \
                 WHERE o.ctid = c.ctid AND o.id = c.id AND o.created_at = c.created_at \
                   AND coalesce(o.published_at, o.dead_lettered_at) IS NULL \
                   AND o.next_attempt_at <= now() \
                 FOR UPDATE OF o SKIP LOCKED) l \
             LIMIT $1)"
    );
    claim(t, &format!("RECURSIVE {cand}"))
}

/// The claim itself, after the CTEs `ctes` (what follows `WITH`), whose last, `cand` (`id`,
/// `created_at`, `unmarked`, `lap`, `n`), holds the locked rows it may hand out in their
/// order. Both claims return the message columns, then `lap` and `n`.
fn claim(t: &str, ctes: &str) -> String {
    // A row already claimed `max-attempts` ($4) times was never marked: its publishes
    // crashed their relay (or outlived the lease). It is dead-lettered instead of handed out
    // again, and comes back with `attempts` past `max-attempts` so the caller can tell.
    let spent = "o.attempts >= $4";
    // A due row that still holds a claim token was never marked: the relay that claimed it
    // died (or outlived its lease) with it in its batch, and it may be the message that kills
    // relays. Such a row is handed out alone, so a crasher costs only its own attempts and the
    // healthy rows of its batch are not dead-lettered with it. The candidates are taken in
    // their order as before; only the rows handed out change.
    format!(
        "WITH {ctes}, \
         due AS ( \
             SELECT id, created_at, lap, n FROM cand \
             WHERE NOT EXISTS (SELECT 1 FROM cand WHERE unmarked) \
             UNION ALL \
             (SELECT id, created_at, lap, n FROM cand WHERE unmarked LIMIT 1)) \
         UPDATE {t} AS o \
         SET attempts = o.attempts + 1, \
             next_attempt_at = CASE WHEN {spent} THEN o.next_attempt_at ELSE now() + $2 END, \
             claim_token = CASE WHEN {spent} THEN NULL ELSE $3::uuid END, \
             dead_lettered_at = CASE WHEN {spent} THEN clock_timestamp() END, \
             last_error = CASE WHEN {spent} \
                 THEN left('claimed ' || o.attempts || ' times without completing' \
                      || coalesce('; last error: ' || o.last_error, ''), 1000) \
                 ELSE o.last_error END \
         FROM due WHERE o.id = due.id AND o.created_at = due.created_at \
         RETURNING {MESSAGE_COLUMNS}, due.lap, due.n"
    )
}

impl Statements {
    pub(crate) fn new(table: &TableName, ordering: Ordering, notify: bool) -> Self {
        let t = table.quoted();
        Self {
            enqueue: sql(enqueue(table, ordering, notify)),
            enqueue_quiet: sql(enqueue(table, ordering, false)),
            claim_ordered: sql(claim_ordered(t)),
            claim_unordered: sql(claim_unordered(t)),
            mark_published: sql(format!(
                "UPDATE {t} SET published_at = clock_timestamp(), claim_token = NULL \
                 WHERE id = ANY($1) AND claim_token = $2"
            )),
            mark_failed: sql(format!(
                "UPDATE {t} AS o \
                 SET last_error = f.error, \
                     next_attempt_at = clock_timestamp() + f.delay_us * interval '1 microsecond', \
                     dead_lettered_at = CASE WHEN f.dead THEN clock_timestamp() END, \
                     attempts = CASE WHEN f.transient THEN greatest(o.attempts - 1, 0) \
                                     ELSE o.attempts END, \
                     claim_token = NULL \
                 FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::bool[], $6::bool[]) \
                      AS f(id, error, delay_us, dead, transient) \
                 WHERE o.id = f.id AND o.claim_token = $5"
            )),
            stats: sql(format!(
                "SELECT p.n, p.age, d.n FROM \
                 (SELECT count(*) AS n, \
                         COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)), 0) \
                             ::float8 AS age \
                  FROM {t} WHERE {PENDING}) AS p, \
                 (SELECT count(*) AS n FROM {t} WHERE dead_lettered_at IS NOT NULL) AS d"
            )),
            delete_published: sql(format!(
                "WITH doomed AS ( \
                     SELECT id, created_at FROM {t} WHERE published_at < clock_timestamp() - $1 \
                     ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS o USING doomed \
                 WHERE o.id = doomed.id AND o.created_at = doomed.created_at"
            )),
            delete_dead_lettered: sql(format!(
                "WITH doomed AS ( \
                     SELECT id, created_at FROM {t} WHERE dead_lettered_at < clock_timestamp() - $1 \
                     ORDER BY dead_lettered_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS o USING doomed \
                 WHERE o.id = doomed.id AND o.created_at = doomed.created_at"
            )),
            dead_letters: sql(format!(
                "SELECT {MESSAGE_COLUMNS}, o.last_error::text, o.dead_lettered_at FROM {t} o \
                 WHERE o.dead_lettered_at IS NOT NULL ORDER BY o.dead_lettered_at LIMIT $1"
            )),
            requeue: sql(format!(
                "UPDATE {t} SET dead_lettered_at = NULL, attempts = 0, \
                        next_attempt_at = clock_timestamp(), claim_token = NULL \
                 WHERE id = ANY($1) AND dead_lettered_at IS NOT NULL"
            )),
            published_after: sql(format!(
                "SELECT o.id FROM {t} o \
                 WHERE o.id = ANY($1) AND o.dead_lettered_at IS NOT NULL \
                   AND o.sequence IS NOT NULL AND EXISTS ( \
                     SELECT 1 FROM {t} p \
                     WHERE p.aggregate_type = o.aggregate_type \
                       AND p.aggregate_id = o.aggregate_id \
                       AND p.sequence > o.sequence AND p.published_at IS NOT NULL)"
            )),
        }
    }
}
