//! A hash-partitioned records table (`records_hash_partitioned_ddl`) against a real
//! PostgreSQL: `validate` accepts it, execute / replay / conflict run on it unchanged, and a
//! lookup by key is planned against one partition.

#![allow(clippy::unwrap_used)]

use std::num::NonZeroU16;

use idempotency_core::config::{PersistenceConfig, SchemaConfig, SchemaMode};
use idempotency_core::{Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use idempotency_pg::{PgStore, SchemaProblem, TableName, records_hash_partitioned_ddl};
use sqlx::AssertSqlSafe;

#[tokio::test]
async fn a_hash_partitioned_table_is_validated_and_keeps_one_record_per_key_in_one_partition() {
    let pool = idempotency_testing::pg_pool().await;
    let table = TableName::parse("idempotency_records").unwrap();
    let ddl = records_hash_partitioned_ddl(&table, NonZeroU16::new(4).unwrap());
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(&pool)
        .await
        .unwrap();
    let config = PersistenceConfig {
        schema: SchemaConfig {
            mode: SchemaMode::Validate,
        },
        ..PersistenceConfig::default()
    };
    let store = PgStore::from_config(pool.clone(), &config).await.unwrap();
    assert!(store.schema_problems().await.unwrap().is_empty());
    // `create` leaves the partitioned table as it is.
    store.create_schema().await.unwrap();
    let kind: String = sqlx::query_scalar(
        "SELECT relkind::text FROM pg_class WHERE oid = 'idempotency_records'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(kind, "p");

    let service = IdempotencyService::new(store.clone());
    let run = |key: &'static str, request: i32| {
        let service = service.clone();
        async move {
            let outcome: Result<Outcome<i32>, Error> = service
                .execute(
                    Call::new("OP", IdempotencyKey::new(key).unwrap(), &request),
                    async move |_c| Ok::<_, Error>(ExecutionResult::success(request * 10)),
                )
                .await;
            outcome
        }
    };
    for n in 0..40 {
        let key: &'static str = Box::leak(format!("k-{n}").into_boxed_str());
        assert!(run(key, 1).await.unwrap().is_executed());
    }
    let replay = run("k-0", 1).await.unwrap();
    assert!(replay.is_replayed());
    assert_eq!(replay.result().value(), Some(&10));
    assert!(matches!(run("k-0", 2).await, Err(Error::PayloadConflict)));

    // Every key once in the whole table, spread over the partitions.
    let per_partition: Vec<(String, i64)> = sqlx::query_as(
        "SELECT tableoid::regclass::text, count(*) FROM idempotency_records GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(per_partition.iter().map(|(_, n)| n).sum::<i64>(), 40);
    assert!(per_partition.len() > 1, "{per_partition:?}");

    // The lookup by key is planned against one partition.
    let find = store.statement("find").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "PREPARE find_one(text, text, text) AS {find}"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let plan: Vec<String> =
        sqlx::query_scalar("EXPLAIN (COSTS OFF) EXECUTE find_one('OP', '', 'k-7')")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let scanned: Vec<_> = plan
        .iter()
        .filter(|line| line.contains(" on idempotency_records_h"))
        .collect();
    assert_eq!(scanned.len(), 1, "{plan:#?}");
}

#[tokio::test]
async fn a_range_partitioned_records_table_is_refused_for_its_key() {
    let pool = idempotency_testing::pg_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE idempotency_records ( \
             operation VARCHAR(128) NOT NULL, scope VARCHAR(255) NOT NULL DEFAULT '', \
             idempotency_key VARCHAR(255) NOT NULL, request_hash VARCHAR(128) NOT NULL, \
             status VARCHAR(32) NOT NULL, result_payload JSON, error_code VARCHAR(128), \
             created_at TIMESTAMPTZ NOT NULL DEFAULT now(), completed_at TIMESTAMPTZ, \
             expires_at TIMESTAMPTZ, trace_id VARCHAR(32), span_id VARCHAR(16), \
             PRIMARY KEY (operation, scope, idempotency_key, created_at)) \
         PARTITION BY RANGE (created_at); \
         CREATE INDEX ON idempotency_records (expires_at)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let problems = PgStore::new(pool).schema_problems().await.unwrap();
    assert_eq!(problems, [SchemaProblem::MissingPrimaryKey]);
}
