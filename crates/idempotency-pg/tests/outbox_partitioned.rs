//! The time-partitioned outbox against a real PostgreSQL, each test on its own schema:
//! create and validate of the layout (and the layout mismatches), partitions ahead, retention
//! by partition drop with the batched `DELETE` for what remains, the default partition as the
//! safety net, index lookups by id, and concurrent relays.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{Ordering, OutboxConfig, PartitioningConfig};
use idempotency_outbox::store::{ClaimRequest, Housekeeping, RelayStore};
use idempotency_outbox::testing::{CollectingPublisher, event};
use idempotency_outbox::{Error, Relay, SchemaProblem};
use idempotency_pg::PgOutbox;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

const DAY: i64 = 86_400;

fn config(partitioned: bool, mode: SchemaMode) -> OutboxConfig {
    let mut config = OutboxConfig {
        notify_channel: None,
        ordering: Ordering::Unordered,
        ..OutboxConfig::default()
    };
    config.schema.mode = mode;
    config.partitioning = PartitioningConfig {
        enabled: partitioned,
        interval: Duration::from_secs(86_400),
        ahead: 3,
    };
    config
}

async fn partitioned(pool: &PgPool) -> PgOutbox {
    PgOutbox::from_config(pool.clone(), &config(true, SchemaMode::Create))
        .await
        .unwrap()
}

/// The current partition's name, without its schema.
async fn current_partition(outbox: &PgOutbox) -> String {
    let now = chrono::Utc::now();
    let partitions = outbox.partitions().await.unwrap();
    let current = partitions
        .iter()
        .find(|p| p.from.is_some_and(|f| f <= now) && p.to.is_some_and(|t| now < t))
        .unwrap();
    current.name.rsplit('.').next().unwrap().to_owned()
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A partition `name` of `outbox` over `[now - from_days, now - to_days)`, days aligned on UTC.
async fn old_partition(pool: &PgPool, name: &str, from_days: i64, to_days: i64) {
    exec(
        pool,
        &format!(
            "CREATE TABLE {name} PARTITION OF outbox FOR VALUES \
             FROM (to_timestamp((floor(extract(epoch FROM now()) / {DAY}) - {from_days}) * {DAY})) \
             TO (to_timestamp((floor(extract(epoch FROM now()) / {DAY}) - {to_days}) * {DAY}))"
        ),
    )
    .await;
}

/// `n` rows created `created_days` before the start of the current UTC day (plus 1..=n
/// seconds), published or dead-lettered `done_days` ago (`state`: `published`, `dead` or
/// `pending`).
async fn rows(pool: &PgPool, n: i64, created_days: f64, state: &str, done_days: f64) {
    let (published, dead) = match state {
        "published" => (
            format!("now() - interval '{done_days} days'"),
            "NULL".into(),
        ),
        "dead" => (
            "NULL".into(),
            format!("now() - interval '{done_days} days'"),
        ),
        _ => ("NULL".to_owned(), "NULL".to_owned()),
    };
    exec(
        pool,
        &format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, \
                                 created_at, published_at, dead_lettered_at) \
             SELECT gen_random_uuid(), 'order', 'o-' || g, 'OrderUpdated', '{{}}', \
                    date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' \
                        - interval '{created_days} days' + g * interval '1 second', \
                    {published}, {dead} \
             FROM generate_series(1, {n}) AS g"
        ),
    )
    .await;
}

async fn count_in(pool: &PgPool, table: &str) -> i64 {
    scalar(pool, &format!("SELECT count(*) FROM {table}")).await
}

async fn exists(pool: &PgPool, table: &str) -> bool {
    sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn relay_purge(outbox: &PgOutbox) -> idempotency_outbox::relay::PurgeReport {
    let mut config = config(true, SchemaMode::None);
    config.retention.batch_size = 20;
    Relay::new(outbox.clone(), CollectingPublisher::default(), &config)
        .unwrap()
        .purge()
        .await
        .unwrap()
}

#[tokio::test]
async fn create_makes_the_current_and_ahead_partitions_and_validate_accepts_them() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    outbox.create_schema().await.unwrap(); // again: nothing new
    let partitions = outbox.partitions().await.unwrap();
    let defaults: Vec<_> = partitions.iter().filter(|p| p.default).collect();
    assert_eq!(defaults.len(), 1, "{partitions:?}");
    assert!(
        defaults[0].name.ends_with(".outbox_default"),
        "{partitions:?}"
    );
    let ranges: Vec<_> = partitions.iter().filter(|p| !p.default).collect();
    assert_eq!(ranges.len(), 4, "today and 3 days ahead: {partitions:?}");
    let now = chrono::Utc::now();
    assert!(ranges[0].from.unwrap() <= now && now < ranges[0].to.unwrap());
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].to, pair[1].from, "contiguous: {partitions:?}");
        assert_eq!(
            (pair[1].to.unwrap() - pair[1].from.unwrap()).num_seconds(),
            DAY
        );
    }
    assert_eq!(
        ranges[0].name,
        format!(
            "{}.outbox_p{}",
            ranges[0].name.split('.').next().unwrap(),
            ranges[0].from.unwrap().format("%Y%m%dt%H%M%S")
        )
    );
    assert_eq!(outbox.prepare_partitions().await.unwrap(), 0);

    PgOutbox::from_config(pool.clone(), &config(true, SchemaMode::Validate))
        .await
        .unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());

    // The plain layout configured over the partitioned table: a clear problem.
    let error = PgOutbox::from_config(pool.clone(), &config(false, SchemaMode::Validate))
        .await
        .unwrap_err();
    let Error::Schema { problems, .. } = &error else {
        panic!("{error:?}")
    };
    assert!(
        problems.iter().any(
            |p| matches!(p, SchemaProblem::Layout { expected, found, .. }
            if *expected == "a plain table" && found == "partitioned by RANGE (created_at)")
        ),
        "{problems:?}"
    );
    assert!(
        error.to_string().contains("outbox.partitioning.enabled"),
        "{error}"
    );

    // A partitioned table without the (id, created_at) key is named too.
    exec(&pool, "ALTER TABLE outbox DROP CONSTRAINT outbox_pkey").await;
    let problems = outbox.schema_problems().await.unwrap();
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, SchemaProblem::MissingIndex { purpose, .. }
            if purpose.contains("(id, created_at)"))),
        "{problems:?}"
    );
}

#[tokio::test]
async fn a_plain_table_where_partitioning_is_configured_is_refused_by_create_and_validate() {
    let pool = idempotency_testing::pg_pool().await;
    PgOutbox::from_config(pool.clone(), &config(false, SchemaMode::Create))
        .await
        .unwrap();
    for mode in [SchemaMode::Validate, SchemaMode::Create] {
        let error = PgOutbox::from_config(pool.clone(), &config(true, mode))
            .await
            .unwrap_err();
        let Error::Schema { problems, .. } = &error else {
            panic!("{mode:?}: {error:?}")
        };
        assert!(
            problems.iter().any(
                |p| matches!(p, SchemaProblem::Layout { expected, found, .. }
                if *expected == "partitioned by RANGE (created_at)" && found == "a plain table")
            ),
            "{mode:?}: {problems:?}"
        );
    }
}

#[tokio::test]
async fn a_fully_published_old_partition_is_dropped_and_the_rest_deleted_in_batches() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    old_partition(&pool, "outbox_old_a", 20, 19).await;
    old_partition(&pool, "outbox_old_b", 18, 17).await;
    // A: every row published 19 days ago; B: published 17 days ago but for 5 rows published
    // yesterday (kept, so B is kept and its old rows are deleted row by row); the default
    // partition: 3 rows from 40 days ago, published 39 days ago.
    rows(&pool, 100, 19.9, "published", 19.0).await;
    rows(&pool, 30, 17.9, "published", 17.0).await;
    rows(&pool, 5, 17.8, "published", 1.0).await;
    rows(&pool, 3, 40.0, "published", 39.0).await;
    assert_eq!(count_in(&pool, "outbox_old_a").await, 100);
    assert_eq!(count_in(&pool, "outbox_default").await, 3);
    exec(&pool, "ANALYZE outbox").await;
    let wal_before = scalar(&pool, "SELECT count(*) FROM outbox").await;
    assert_eq!(wal_before, 138);

    let report = relay_purge(&outbox).await;
    assert_eq!(report.partitions_dropped, 1, "{report:?}");
    assert_eq!(
        report.published, 33,
        "B's 30 and the default's 3: {report:?}"
    );
    assert!(!exists(&pool, "outbox_old_a").await, "A was dropped");
    assert!(exists(&pool, "outbox_old_b").await);
    assert_eq!(count_in(&pool, "outbox_old_b").await, 5);
    assert_eq!(count_in(&pool, "outbox_default").await, 0);
    assert_eq!(count_in(&pool, "outbox").await, 5);
    let again = relay_purge(&outbox).await;
    assert_eq!((again.partitions_dropped, again.published), (0, 0));
}

#[tokio::test]
async fn an_old_partition_with_a_pending_row_or_a_young_dead_letter_is_kept() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    old_partition(&pool, "outbox_pending", 20, 19).await;
    old_partition(&pool, "outbox_dead", 18, 17).await;
    old_partition(&pool, "outbox_old_dead", 16, 15).await;
    rows(&pool, 50, 19.9, "published", 19.0).await;
    rows(&pool, 1, 19.5, "pending", 0.0).await;
    rows(&pool, 50, 17.9, "published", 17.0).await;
    rows(&pool, 1, 17.5, "dead", 2.0).await; // younger than dead-lettered: 30d
    rows(&pool, 20, 15.9, "published", 15.0).await;
    rows(&pool, 1, 15.5, "dead", 14.0).await;

    // With dead letters kept 30 days, only the partitions without a pending row or a young
    // dead letter could go: none here.
    assert_eq!(
        outbox
            .drop_expired(
                Duration::from_secs(7 * 86_400),
                Some(Duration::from_secs(30 * 86_400))
            )
            .await
            .unwrap(),
        0
    );
    // Dead letters kept 10 days: the partition whose dead letter is 14 days old goes.
    assert_eq!(
        outbox
            .drop_expired(
                Duration::from_secs(7 * 86_400),
                Some(Duration::from_secs(10 * 86_400))
            )
            .await
            .unwrap(),
        1
    );
    assert!(!exists(&pool, "outbox_old_dead").await);
    // Dead letters kept forever: a partition holding one is never dropped.
    assert_eq!(
        outbox
            .drop_expired(Duration::from_secs(7 * 86_400), None)
            .await
            .unwrap(),
        0
    );
    assert!(exists(&pool, "outbox_pending").await && exists(&pool, "outbox_dead").await);
    // The rows retention would delete are deleted in batches: the published ones.
    let report = relay_purge(&outbox).await;
    assert_eq!(report.partitions_dropped, 0);
    assert_eq!(report.published, 100);
    assert_eq!(count_in(&pool, "outbox_pending").await, 1);
    assert_eq!(count_in(&pool, "outbox_dead").await, 1);
    // Once the pending row is published (long enough ago), its partition goes.
    exec(
        &pool,
        "UPDATE outbox SET published_at = now() - interval '8 days' \
         WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .await;
    let report = relay_purge(&outbox).await;
    assert_eq!(report.partitions_dropped, 1, "{report:?}");
    assert!(!exists(&pool, "outbox_pending").await);
}

#[tokio::test]
async fn the_current_partition_is_never_dropped_even_with_zero_retention() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    rows(&pool, 10, 0.0, "published", 0.0).await;
    let before = outbox.partitions().await.unwrap();
    assert_eq!(outbox.drop_expired(Duration::ZERO, None).await.unwrap(), 0);
    assert_eq!(outbox.partitions().await.unwrap(), before);
    assert_eq!(
        outbox.delete_published(Duration::ZERO, 100).await.unwrap(),
        10
    );
}

#[tokio::test]
async fn rows_caught_by_the_default_partition_are_kept_and_their_range_is_not_created() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = config(true, SchemaMode::Create);
    config.partitioning.ahead = 1;
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    // Maintenance fell behind: a row 3 days ahead has no partition and lands in the default.
    rows(&pool, 1, -3.0, "pending", 0.0).await;
    assert_eq!(count_in(&pool, "outbox_default").await, 1);
    config.partitioning.ahead = 5;
    let outbox = outbox.with_partitioning(&config.partitioning).unwrap();
    // Days +2, +4 and +5 are created; day +3, which the default holds a row of, is not.
    assert_eq!(outbox.prepare_partitions().await.unwrap(), 3);
    let ranges = outbox
        .partitions()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| !p.default)
        .count();
    assert_eq!(ranges, 5);
    assert_eq!(count_in(&pool, "outbox_default").await, 1);
    // The row is still claimed, published and (by the batched delete) retired.
    let claim = ClaimRequest {
        limit: 10,
        lease: Duration::from_secs(30),
        token: Uuid::new_v4(),
        ordering: Ordering::Unordered,
        max_attempts: 5,
    };
    exec(&pool, "UPDATE outbox SET next_attempt_at = now()").await;
    let claimed = outbox.claim(&claim).await.unwrap();
    assert_eq!(claimed.messages.len(), 1);
    let ids: Vec<_> = claimed.messages.iter().map(|m| m.id).collect();
    assert_eq!(outbox.mark_published(claim.token, &ids).await.unwrap(), 1);
    assert_eq!(
        outbox.delete_published(Duration::ZERO, 10).await.unwrap(),
        1
    );
}

/// The statements that address rows by id use each partition's primary key: no sequential
/// scan of a partition that holds rows.
#[tokio::test]
async fn statements_by_id_are_index_lookups_on_every_partition() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    old_partition(&pool, "outbox_old", 3, 2).await;
    let current = current_partition(&outbox).await;
    rows(&pool, 20_000, 2.9, "published", 2.5).await;
    rows(&pool, 20_000, 0.0, "published", 0.0).await;
    exec(&pool, "ANALYZE outbox").await;
    let ids = "ARRAY['00000000-0000-0000-0000-000000000001'::uuid, \
                     '00000000-0000-0000-0000-000000000002'::uuid]";
    let token = "'00000000-0000-0000-0000-000000000003'::uuid";
    for statement in [
        format!(
            "UPDATE outbox SET published_at = clock_timestamp(), claim_token = NULL \
             WHERE id = ANY({ids}) AND claim_token = {token}"
        ),
        format!(
            "UPDATE outbox AS o SET last_error = f.error, claim_token = NULL \
             FROM unnest({ids}, ARRAY['a', 'b']) AS f(id, error) \
             WHERE o.id = f.id AND o.claim_token = {token}"
        ),
        format!(
            "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0 \
             WHERE id = ANY({ids}) AND dead_lettered_at IS NOT NULL"
        ),
    ] {
        let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!("EXPLAIN {statement}")))
            .fetch_all(&pool)
            .await
            .unwrap();
        let plan = plan.join("\n");
        for partition in ["outbox_old", current.as_str()] {
            assert!(
                !plan
                    .lines()
                    .any(|l| l.contains("Seq Scan") && l.contains(&format!("on {partition} "))),
                "{statement}\n{plan}"
            );
            assert!(
                plan.lines()
                    .any(|l| l.contains("Index") && l.contains(&format!(" {partition}_"))),
                "{statement}\n{plan}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_relays_publish_every_event_once_while_retention_drops_partitions() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = config(true, SchemaMode::Create);
    config.ordering = Ordering::Ordered;
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    config.schema.mode = SchemaMode::None;
    for (n, (from, to)) in [(20_i32, 19_i32), (18, 17), (16, 15)]
        .into_iter()
        .enumerate()
    {
        old_partition(
            &pool,
            &format!("outbox_old_{n}"),
            i64::from(from),
            i64::from(to),
        )
        .await;
        rows(
            &pool,
            500,
            f64::from(from) - 0.5,
            "published",
            f64::from(to),
        )
        .await;
    }
    let mut ids = Vec::new();
    for chunk in 0..10 {
        let events: Vec<_> = (0..30).map(|n| event(&format!("a{chunk}"), n)).collect();
        let mut tx = pool.begin().await.unwrap();
        ids.extend(outbox.enqueue_all(&mut tx, &events).await.unwrap());
        tx.commit().await.unwrap();
    }
    let publisher = CollectingPublisher::default();
    config.relay.batch_size = 7;
    let relays: Vec<_> = (0..3)
        .map(|_| Relay::new(outbox.clone(), publisher.clone(), &config).unwrap())
        .collect();
    let retention = {
        let relay = Relay::new(outbox.clone(), publisher.clone(), &config).unwrap();
        tokio::spawn(async move { relay.purge().await.unwrap() })
    };
    let workers: Vec<_> = relays
        .into_iter()
        .map(|relay| {
            tokio::spawn(async move {
                for _ in 0..200 {
                    relay.run_batch().await.unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let report = retention.await.unwrap();
    assert_eq!(report.partitions_dropped, 3, "{report:?}");
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for message in publisher.published() {
        *seen.entry(message.id).or_default() += 1;
    }
    assert_eq!(seen.len(), ids.len());
    assert!(seen.values().all(|&n| n == 1), "published once each");
    let per_aggregate = publisher.published();
    for chunk in 0..10 {
        let aggregate = format!("a{chunk}");
        let sequences: Vec<_> = per_aggregate
            .iter()
            .filter(|m| m.aggregate_id == aggregate)
            .map(|m| m.sequence)
            .collect();
        assert_eq!(sequences.len(), 30);
        let mut sorted = sequences.clone();
        sorted.sort();
        assert_eq!(sequences, sorted, "{aggregate} in order");
    }
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        )
        .await,
        0
    );
}

/// Waits until `waiters` sessions wait for a lock on a relation of `pool`'s schema.
async fn until_waiting_on_lock(pool: &PgPool, waiters: i64) {
    for _ in 0..500 {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l \
             JOIN pg_class c ON c.oid = l.relation \
             WHERE NOT l.granted AND c.relnamespace = current_schema()::regnamespace",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if n >= waiters {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("fewer than {waiters} sessions waited on a lock");
}

/// A pool whose sessions default to `REPEATABLE READ` (as `ALTER DATABASE ... SET
/// default_transaction_isolation` would make them), on a schema of its own.
async fn repeatable_read_pool() -> PgPool {
    idempotency_testing::pg_pool_with_options(10, |options| {
        options.after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql("SET default_transaction_isolation = 'repeatable read'")
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
    })
    .await
}

/// The drop's re-check runs in READ COMMITTED whatever the session default: a row requeued by
/// a transaction that commits while `DETACH` waits for its lock keeps its partition. Under a
/// `repeatable read` default the re-check's snapshot was taken before the requeue committed,
/// and the partition was dropped with the pending row in it.
#[tokio::test]
async fn a_row_requeued_while_the_drop_waits_keeps_its_partition_under_a_repeatable_read_default() {
    let pool = repeatable_read_pool().await;
    let isolation: String = sqlx::query_scalar("SHOW default_transaction_isolation")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(isolation, "repeatable read");
    let outbox = partitioned(&pool).await;
    old_partition(&pool, "outbox_requeued", 20, 19).await;
    rows(&pool, 1, 19.5, "dead", 15.0).await;
    let id: Uuid = sqlx::query_scalar("SELECT id FROM outbox_requeued")
        .fetch_one(&pool)
        .await
        .unwrap();

    // The requeue holds its row (and a lock on the partition) while the drop starts.
    let mut requeue = pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE outbox SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now() \
         WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *requeue)
    .await
    .unwrap();
    let drop = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            outbox
                .drop_expired_partitions(
                    Duration::from_secs(7 * 86_400),
                    Some(Duration::from_secs(10 * 86_400)),
                )
                .await
        }
    });
    until_waiting_on_lock(&pool, 1).await;
    requeue.commit().await.unwrap();

    assert_eq!(drop.await.unwrap().unwrap(), 0, "the partition is kept");
    assert!(exists(&pool, "outbox_requeued").await);
    let pending = scalar(
        &pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
    )
    .await;
    assert_eq!(pending, 1, "the requeued row is still there, pending");
}

/// Two retention passes that race for one partition: the one that finds it already detached
/// or dropped by the other counts it as done and goes on with its pass (the next partition,
/// the deletes), instead of failing with "relation does not exist".
#[tokio::test]
async fn concurrent_retention_passes_treat_a_partition_the_other_dropped_as_done() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = partitioned(&pool).await;
    old_partition(&pool, "outbox_raced", 20, 19).await;
    old_partition(&pool, "outbox_next", 18, 17).await;
    rows(&pool, 10, 19.5, "published", 19.0).await;
    rows(&pool, 10, 17.5, "published", 17.0).await;
    rows(&pool, 3, 40.0, "published", 39.0).await; // in the default: deleted row by row

    // A reader holds the first partition: one pass queues its DETACH, the other queues
    // behind it (its check or its own DETACH).
    let mut reader = pool.begin().await.unwrap();
    exec_in(&mut reader, "SELECT count(*) FROM outbox_raced").await;
    let passes: Vec<_> = (0..2)
        .map(|_| {
            let outbox = outbox.clone();
            tokio::spawn(async move { relay_purge_result(&outbox).await })
        })
        .collect();
    until_waiting_on_lock(&pool, 2).await;
    reader.commit().await.unwrap();

    let mut dropped = 0;
    let mut deleted = 0;
    for pass in passes {
        let report = pass.await.unwrap().unwrap();
        dropped += report.partitions_dropped;
        deleted += report.published;
    }
    assert_eq!(
        dropped, 2,
        "each partition dropped once, by one of the passes"
    );
    assert_eq!(deleted, 3, "the default's rows deleted");
    assert!(!exists(&pool, "outbox_raced").await && !exists(&pool, "outbox_next").await);
}

async fn exec_in(conn: &mut sqlx::PgConnection, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn relay_purge_result(
    outbox: &PgOutbox,
) -> Result<idempotency_outbox::relay::PurgeReport, Error> {
    let mut config = config(true, SchemaMode::None);
    config.retention.batch_size = 20;
    Relay::new(outbox.clone(), CollectingPublisher::default(), &config)
        .unwrap()
        .purge()
        .await
}

/// A 60-byte table name: `<name>_default` and `<name>_dead_letter_idx` cut to 63 bytes are one
/// name (`<name>_de`), so `CREATE INDEX IF NOT EXISTS` skipped the dead-letter index without a
/// word. Every name the layout derives is distinct: create makes every object, validate
/// accepts the result.
#[tokio::test]
async fn a_sixty_byte_table_name_gets_every_object_of_the_partitioned_layout() {
    let pool = idempotency_testing::pg_pool().await;
    let name = format!("outbox_{}", "x".repeat(53));
    assert_eq!(name.len(), 60);
    let mut config = config(true, SchemaMode::Create);
    config.table_name = name.clone();
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    assert_eq!(
        outbox.schema_problems().await.unwrap(),
        Vec::<SchemaProblem>::new()
    );
    let indexes = scalar(
        &pool,
        &format!(
            "SELECT count(*) FROM pg_index WHERE indrelid = '{name}'::regclass \
             AND indpred IS NOT NULL"
        ),
    )
    .await;
    assert_eq!(indexes, 4, "pending, aggregate, published, dead letters");
    config.schema.mode = SchemaMode::Validate;
    PgOutbox::from_config(pool.clone(), &config).await.unwrap();
}

/// A range the default partition holds rows of cannot be created while they are there. A pass
/// that tried anyway queued for ACCESS EXCLUSIVE on the outbox behind its open transactions,
/// held every enqueue behind it for up to its 1 s lock timeout, then failed (or scanned the
/// default and failed with 23514), and every retention pass of every relay did it again until
/// the interval ended. The default is now looked at first, without a lock, and the range
/// skipped: neither the pass nor an enqueue waits.
#[tokio::test]
async fn a_range_the_default_holds_rows_of_is_skipped_without_blocking_enqueues() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = config(true, SchemaMode::Create);
    config.partitioning.ahead = 1;
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    rows(&pool, 1, -3.0, "pending", 0.0).await; // day +3: in the default
    config.partitioning.ahead = 5;
    let outbox = outbox.with_partitioning(&config.partitioning).unwrap();
    assert_eq!(outbox.prepare_partitions().await.unwrap(), 3, "+2, +4, +5");

    // An enqueue in an open transaction holds its lock on the outbox.
    let mut open = pool.begin().await.unwrap();
    outbox.enqueue(&mut open, &event("open", 1)).await.unwrap();
    let started = std::time::Instant::now();
    let pass = tokio::spawn({
        let outbox = outbox.clone();
        async move { outbox.prepare_partitions().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let enqueue_started = std::time::Instant::now();
    let mut tx = pool.begin().await.unwrap();
    outbox.enqueue(&mut tx, &event("other", 1)).await.unwrap();
    tx.commit().await.unwrap();
    let enqueue = enqueue_started.elapsed();
    assert_eq!(pass.await.unwrap().unwrap(), 0);
    let pass = started.elapsed();
    open.commit().await.unwrap();
    assert!(
        enqueue < Duration::from_millis(300) && pass < Duration::from_millis(300),
        "enqueue blocked {enqueue:?}, pass took {pass:?}"
    );
    assert_eq!(count_in(&pool, "outbox_default").await, 1, "the row stays");
}

/// Two passes that create the same partition at once: the one that finds it created by the
/// other meanwhile counts it as done (the pass goes on, its retention included), instead of
/// failing on "relation already exists".
#[tokio::test]
async fn concurrent_passes_treat_a_partition_the_other_created_as_done() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = config(true, SchemaMode::Create);
    config.partitioning.ahead = 1;
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    config.partitioning.ahead = 2;
    let outbox = outbox.with_partitioning(&config.partitioning).unwrap();
    // A reader holds the outbox: both passes find day +2 missing and queue their CREATE.
    let mut reader = pool.begin().await.unwrap();
    exec_in(&mut reader, "SELECT count(*) FROM outbox").await;
    let passes: Vec<_> = (0..2)
        .map(|_| {
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.prepare_partitions().await })
        })
        .collect();
    until_waiting_on_lock(&pool, 2).await;
    reader.commit().await.unwrap();
    let mut created = 0;
    for pass in passes {
        created += pass.await.unwrap().unwrap();
    }
    assert_eq!(created, 1, "created once, by one of the passes");
    assert_eq!(outbox.partitions().await.unwrap().len(), 1 + 3);
}
