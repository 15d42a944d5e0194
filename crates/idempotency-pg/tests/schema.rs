//! Schema modes against a real PostgreSQL: create, validate (and every way it fails), none, and
//! table-name validation.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use idempotency_core::config::{PersistenceConfig, SchemaConfig, SchemaMode};
use idempotency_pg::{Error, PgStore, SchemaProblem, TableName};
use sqlx::{AssertSqlSafe, PgPool};

async fn store(pool: &PgPool) -> PgStore {
    PgStore::new(pool.clone())
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn problems_after(alter: &str) -> Vec<SchemaProblem> {
    let pool = idempotency_testing::pg_pool().await;
    let store = store(&pool).await;
    store.create_schema().await.unwrap();
    exec(&pool, alter).await;
    match store.validate_schema().await {
        Err(Error::Schema { problems, .. }) => problems,
        other => panic!("validate should fail after `{alter}`: {other:?}"),
    }
}

#[tokio::test]
async fn create_is_idempotent_and_validates() {
    let pool = idempotency_testing::pg_pool().await;
    let store = store(&pool).await;
    store.create_schema().await.unwrap();
    store.create_schema().await.unwrap();
    store.validate_schema().await.unwrap();
    assert!(store.schema_problems().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_succeeds() {
    let pool = idempotency_testing::pg_pool().await;
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { PgStore::new(pool).create_schema().await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    PgStore::new(pool).validate_schema().await.unwrap();
}

#[tokio::test]
async fn validate_fails_on_missing_table() {
    let pool = idempotency_testing::pg_pool().await;
    let error = store(&pool).await.validate_schema().await.unwrap_err();
    let Error::Schema { table, problems } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(table, "idempotency_records");
    assert_eq!(problems, &[SchemaProblem::MissingTable]);
    assert!(
        error.to_string().contains("the table does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn validate_fails_on_missing_column() {
    let problems = problems_after("ALTER TABLE idempotency_records DROP COLUMN error_code").await;
    assert_eq!(
        problems,
        [SchemaProblem::MissingColumn {
            column: "error_code"
        }]
    );
}

#[tokio::test]
async fn validate_fails_on_wrong_type() {
    let problems =
        problems_after("ALTER TABLE idempotency_records ALTER COLUMN result_payload TYPE text")
            .await;
    assert_eq!(
        problems,
        [SchemaProblem::WrongType {
            column: "result_payload",
            expected: "json",
            found: "text".into()
        }]
    );
    let problems = problems_after(
        "ALTER TABLE idempotency_records ALTER COLUMN expires_at TYPE timestamp without time zone",
    )
    .await;
    assert!(
        matches!(
            &problems[..],
            [SchemaProblem::WrongType {
                column: "expires_at",
                ..
            }]
        ),
        "{problems:?}"
    );
}

#[tokio::test]
async fn validate_fails_on_short_column_and_nullability() {
    let problems = problems_after(
        "ALTER TABLE idempotency_records ALTER COLUMN idempotency_key TYPE varchar(36); \
         ALTER TABLE idempotency_records ALTER COLUMN result_payload SET NOT NULL; \
         ALTER TABLE idempotency_records ALTER COLUMN request_hash DROP NOT NULL",
    )
    .await;
    assert_eq!(
        problems,
        [
            SchemaProblem::TooShort {
                column: "idempotency_key",
                min: 255,
                found: 36
            },
            SchemaProblem::Nullability {
                column: "request_hash",
                nullable: false
            },
            SchemaProblem::Nullability {
                column: "result_payload",
                nullable: true
            },
        ]
    );
}

#[tokio::test]
async fn validate_fails_on_missing_primary_key() {
    let problems =
        problems_after("ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey")
            .await;
    assert_eq!(problems, [SchemaProblem::MissingPrimaryKey]);
    // A key on other columns is not the one ON CONFLICT needs.
    let problems = problems_after(
        "ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey; \
         ALTER TABLE idempotency_records ADD PRIMARY KEY (operation, idempotency_key)",
    )
    .await;
    assert_eq!(problems, [SchemaProblem::MissingPrimaryKey]);
}

#[tokio::test]
async fn validate_accepts_an_equivalent_unique_index() {
    let pool = idempotency_testing::pg_pool().await;
    let store = store(&pool).await;
    store.create_schema().await.unwrap();
    exec(
        &pool,
        "ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey; \
         CREATE UNIQUE INDEX records_key ON idempotency_records (scope, idempotency_key, operation)",
    )
    .await;
    store.validate_schema().await.unwrap();
}

#[tokio::test]
async fn validate_fails_on_missing_expiry_index() {
    let problems = problems_after("DROP INDEX idempotency_records_expires_at_idx").await;
    assert_eq!(problems, [SchemaProblem::MissingExpiryIndex]);
}

#[tokio::test]
async fn none_does_nothing() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::None;
    let store = PgStore::from_config(pool.clone(), &config).await.unwrap();
    assert_eq!(
        store.schema_problems().await.unwrap(),
        [SchemaProblem::MissingTable]
    );
}

#[tokio::test]
async fn from_config_create_then_validate() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::Create;
    PgStore::from_config(pool.clone(), &config).await.unwrap();
    config.schema.mode = SchemaMode::Validate;
    PgStore::from_config(pool, &config).await.unwrap();
}

#[tokio::test]
async fn schema_qualified_table_works_end_to_end() {
    let pool = idempotency_testing::pg_pool().await;
    let schema = idempotency_testing::unique_name("billing");
    exec(&pool, &format!("CREATE SCHEMA {schema}")).await;
    let config = PersistenceConfig {
        table_name: format!("{schema}.Idem_Records"),
        schema: SchemaConfig {
            mode: SchemaMode::Create,
        },
        ..Default::default()
    };
    let store = PgStore::from_config(pool.clone(), &config).await.unwrap();
    assert_eq!(store.table().schema(), Some(schema.as_str()));
    let service = idempotency_core::IdempotencyService::new(store);
    let key = idempotency_core::IdempotencyKey::new("k-1").unwrap();
    let outcome: idempotency_core::Outcome<i32> = service
        .execute(idempotency_core::Call::new("OP", key, &1), async |_c| {
            Ok::<_, idempotency_core::Error>(idempotency_core::ExecutionResult::success(5))
        })
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let rows: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.idem_records"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn injection_through_the_table_name_is_an_error_not_sql() {
    let pool = idempotency_testing::pg_pool().await;
    exec(&pool, "CREATE TABLE victim (id int)").await;
    for name in [
        "victim; DROP TABLE victim",
        "idempotency_records\"; DROP TABLE victim; --",
        "x) ; DROP TABLE victim; --",
        "public.victim.x",
    ] {
        let config = PersistenceConfig {
            table_name: name.to_owned(),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..Default::default()
        };
        let error = PgStore::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidTableName { .. }),
            "{name}: {error:?}"
        );
    }
    let still_there: bool = sqlx::query_scalar("SELECT to_regclass('victim') IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(still_there);
}

/// The shipped migrations, applied in order, give a table `validate` accepts; a record written
/// before the payload migration (on `jsonb`) still reads back after it.
#[tokio::test]
async fn the_migrations_give_the_canonical_table_and_keep_old_records() {
    use idempotency_core::store::IdempotencyStore;
    use idempotency_core::{IdempotencyKey, Operation, RecordId, Scope, StoredOutcome};

    let pool = idempotency_testing::pg_pool().await;
    exec(
        &pool,
        include_str!("../../../migrations/20261130000001_idempotency_records.sql"),
    )
    .await;
    exec(
        &pool,
        "INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
                                          result_payload, completed_at) \
         VALUES ('OP', 'old', 'h', 'COMPLETED', '{\"b\": 1, \"a\": 2}'::jsonb, now())",
    )
    .await;
    exec(
        &pool,
        include_str!("../../../migrations/20261201000001_idempotency_payload_json.sql"),
    )
    .await;
    let store = store(&pool).await;
    // Without the trace columns (a table of a release before them), validate names both.
    let problems = store.schema_problems().await.unwrap();
    assert_eq!(
        problems,
        [
            SchemaProblem::MissingColumn { column: "trace_id" },
            SchemaProblem::MissingColumn { column: "span_id" },
        ],
        "{problems:?}"
    );
    let refused = store.validate_schema().await.unwrap_err().to_string();
    assert!(
        refused.contains("trace_id") && refused.contains("span_id"),
        "{refused}"
    );
    exec(
        &pool,
        include_str!("../../../migrations/20261206000001_idempotency_trace.sql"),
    )
    .await;
    store.validate_schema().await.unwrap();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("old").unwrap(),
    );
    let record = store.lookup(&id).await.unwrap().unwrap();
    assert_eq!(
        record.outcome,
        Some(StoredOutcome::Completed {
            payload: r#"{"a": 2, "b": 1}"#.to_owned()
        })
    );
    assert_eq!(record.execution_span, None, "an old record has no span");
}

/// `create` over a table of a release before the trace columns adds them (and leaves its
/// records as they are); `validate` then accepts it.
#[tokio::test]
async fn create_adds_the_trace_columns_to_an_earlier_table() {
    let pool = idempotency_testing::pg_pool().await;
    let store = store(&pool).await;
    store.create_schema().await.unwrap();
    exec(
        &pool,
        "ALTER TABLE idempotency_records DROP COLUMN trace_id, DROP COLUMN span_id",
    )
    .await;
    assert_eq!(
        store.schema_problems().await.unwrap(),
        [
            SchemaProblem::MissingColumn { column: "trace_id" },
            SchemaProblem::MissingColumn { column: "span_id" },
        ]
    );
    store.create_schema().await.unwrap();
    store.validate_schema().await.unwrap();
}

/// A nondeterministic (case-insensitive) collation on a key column would merge `tenant-a` with
/// `TENANT-A`, so one tenant would replay another's response: validate refuses it.
#[tokio::test]
async fn validate_fails_on_a_case_insensitive_key_collation() {
    for column in ["scope", "idempotency_key", "operation"] {
        let problems = problems_after(&format!(
            "CREATE COLLATION case_insensitive (provider = icu, locale = 'und-u-ks-level2', \
                                                deterministic = false); \
             ALTER TABLE idempotency_records ALTER COLUMN {column} \
                 TYPE varchar(255) COLLATE case_insensitive"
        ))
        .await;
        assert_eq!(
            problems,
            [SchemaProblem::NondeterministicCollation {
                column,
                collation: "case_insensitive".into()
            }],
            "{column}"
        );
        assert!(problems[0].to_string().contains("nondeterministic"));
    }
}

/// A payload column still on JSONB (which refuses `\u0000` and rewrites keys and numbers) is
/// refused by validate with the migration to run.
#[tokio::test]
async fn validate_explains_the_jsonb_payload_migration() {
    let problems = problems_after(
        "ALTER TABLE idempotency_records ALTER COLUMN result_payload TYPE jsonb \
         USING result_payload::text::jsonb",
    )
    .await;
    assert_eq!(problems, [SchemaProblem::JsonbPayload]);
    let explained = problems[0].to_string();
    assert!(
        explained.contains("TYPE json USING result_payload::text::json")
            && explained.contains("migrations/20261201000001_idempotency_payload_json.sql"),
        "{explained}"
    );
}

/// Long table names get distinct, complete derived names: the expiry index of a 55-, 60- or
/// 63-character table is created (not skipped as "already exists") and validate passes.
#[tokio::test]
async fn long_table_names_get_their_own_expiry_index() {
    let pool = idempotency_testing::pg_pool().await;
    let prefix = "r".repeat(50);
    for name in [
        format!("{prefix}_aaaa"),
        format!("{prefix}_bbbb"),
        format!("{prefix}_cccccccc1"),
        format!("{prefix}_cccccccc2"),
        format!("{prefix}_ddddddddddd1"),
        format!("{prefix}_ddddddddddd2"),
    ] {
        let store = PgStore::with_table(pool.clone(), TableName::parse(&name).unwrap());
        store.create_schema().await.unwrap();
        store
            .validate_schema()
            .await
            .unwrap_or_else(|e| panic!("{} chars: {e}", name.len()));
    }
}
