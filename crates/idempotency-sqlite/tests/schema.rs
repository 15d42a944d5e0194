//! Schema modes on SQLite: create, validate (and every way it fails), none, table names, and a
//! database file that outlives its pool.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use idempotency_core::config::{PersistenceConfig, SchemaConfig, SchemaMode};
use idempotency_core::{Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use idempotency_sqlite::{Error, SchemaProblem, SqliteStore, TableName, ddl};
use sqlx::{AssertSqlSafe, SqlitePool};
use support::{as_str, create_config, fresh_options, temp_db_path};

async fn empty_pool() -> SqlitePool {
    let (_, options) = fresh_options();
    SqlitePool::connect_with(options).await.unwrap()
}

async fn exec(pool: &SqlitePool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The canonical table with `edits` applied to its DDL (each `from` must occur), without
/// `STRICT` so that any declared type is accepted.
async fn problems_with(edits: &[(&str, &str)]) -> Vec<SchemaProblem> {
    let pool = empty_pool().await;
    let mut sql = ddl(&TableName::parse("idempotency_records").unwrap()).replace(") STRICT;", ");");
    for (from, to) in edits {
        assert!(sql.contains(from), "{from:?} not in the DDL");
        sql = sql.replace(from, to);
    }
    exec(&pool, &sql).await;
    validate_problems(&SqliteStore::new(pool)).await
}

async fn validate_problems(store: &SqliteStore) -> Vec<SchemaProblem> {
    let problems = store.schema_problems().await.unwrap();
    match (store.validate_schema().await, problems.is_empty()) {
        (Ok(()), true) => {}
        (Err(Error::Schema { problems: p, .. }), false) => assert_eq!(p, problems),
        (other, _) => panic!("validate disagrees with {problems:?}: {other:?}"),
    }
    problems
}

#[tokio::test]
async fn create_is_idempotent_and_validates() {
    let store = SqliteStore::new(empty_pool().await);
    store.create_schema().await.unwrap();
    store.create_schema().await.unwrap();
    store.validate_schema().await.unwrap();
    assert!(store.schema_problems().await.unwrap().is_empty());
    let strict: i64 = sqlx::query_scalar(
        "SELECT strict FROM pragma_table_list WHERE name = 'idempotency_records'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(strict, 1);
}

/// Separate pools on one new file, as separate processes starting at once would be: the switch
/// to WAL needs an exclusive lock that the busy handler does not wait for, so opening retries;
/// the DDL runs under the write lock. Repeated because the race is narrow.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_opening_and_creating_at_once_take_turns() {
    for _ in 0..25 {
        let path = temp_db_path();
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(
                    async move { SqliteStore::connect(as_str(&path), &create_config()).await },
                )
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let mut config = PersistenceConfig::default();
        config.schema.mode = SchemaMode::Validate;
        let store = SqliteStore::connect(as_str(&path), &config).await.unwrap();
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(mode, "wal");
    }
}

#[tokio::test]
async fn validate_fails_on_missing_table() {
    let error = SqliteStore::new(empty_pool().await)
        .validate_schema()
        .await
        .unwrap_err();
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
    let store = SqliteStore::new(empty_pool().await);
    store.create_schema().await.unwrap();
    exec(
        store.pool(),
        "ALTER TABLE idempotency_records DROP COLUMN error_code",
    )
    .await;
    assert_eq!(
        validate_problems(&store).await,
        [SchemaProblem::MissingColumn {
            column: "error_code"
        }]
    );
}

#[tokio::test]
async fn validate_fails_on_wrong_affinity() {
    let problems = problems_with(&[
        ("expires_at       INTEGER", "expires_at       TIMESTAMP"),
        ("result_payload   TEXT", "result_payload   JSON"),
        ("idempotency_key  TEXT", "idempotency_key  BLOB"),
    ])
    .await;
    assert_eq!(
        problems,
        [
            SchemaProblem::WrongType {
                column: "idempotency_key",
                expected: "TEXT",
                found: "BLOB".into()
            },
            SchemaProblem::WrongType {
                column: "result_payload",
                expected: "TEXT",
                found: "JSON".into()
            },
            SchemaProblem::WrongType {
                column: "expires_at",
                expected: "INTEGER",
                found: "TIMESTAMP".into()
            },
        ]
    );
    // Other spellings of the right affinity are fine.
    assert!(
        problems_with(&[
            ("operation        TEXT", "operation        VARCHAR(128)"),
            ("created_at       INTEGER", "created_at       BIGINT"),
        ])
        .await
        .is_empty()
    );
}

#[tokio::test]
async fn validate_fails_on_nullability() {
    let problems = problems_with(&[
        ("request_hash     TEXT    NOT NULL", "request_hash     TEXT"),
        ("result_payload   TEXT", "result_payload   TEXT NOT NULL"),
    ])
    .await;
    assert_eq!(
        problems,
        [
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
async fn validate_fails_on_missing_or_wrong_primary_key() {
    let no_key =
        problems_with(&[(",\n    PRIMARY KEY (operation, scope, idempotency_key)", "")]).await;
    assert_eq!(no_key, [SchemaProblem::MissingPrimaryKey]);
    // A key on other columns is not the one ON CONFLICT needs.
    let other_key = problems_with(&[(
        "PRIMARY KEY (operation, scope, idempotency_key)",
        "PRIMARY KEY (operation, idempotency_key)",
    )])
    .await;
    assert_eq!(other_key, [SchemaProblem::MissingPrimaryKey]);
    // Neither is a partial unique index.
    let partial = problems_with(&[(
        "PRIMARY KEY (operation, scope, idempotency_key)\n)",
        "CHECK (1)\n); CREATE UNIQUE INDEX k ON idempotency_records \
         (operation, scope, idempotency_key) WHERE status <> 'PROCESSING'",
    )])
    .await;
    assert_eq!(partial, [SchemaProblem::MissingPrimaryKey]);
}

#[tokio::test]
async fn validate_fails_on_a_case_insensitive_key() {
    let problems = problems_with(&[(
        "idempotency_key  TEXT    NOT NULL",
        "idempotency_key  TEXT    NOT NULL COLLATE NOCASE",
    )])
    .await;
    assert_eq!(
        problems,
        [SchemaProblem::KeyCollation {
            column: "idempotency_key",
            found: "NOCASE".into()
        }]
    );
}

/// The column's own collation governs the store's `WHERE idempotency_key = ?` lookups, whatever
/// the key's index compares with: with `COLLATE NOCASE` on the column and a `BINARY` primary
/// key, `abc` would find (and replay) `ABC`'s record.
#[tokio::test]
async fn validate_fails_on_a_key_column_collation_under_a_binary_key() {
    for (collation, found) in [("NOCASE", "NOCASE"), ("RTRIM", "RTRIM")] {
        let problems = problems_with(&[
            (
                "idempotency_key  TEXT    NOT NULL",
                &*format!("idempotency_key  TEXT    NOT NULL COLLATE {collation}"),
            ),
            (
                "PRIMARY KEY (operation, scope, idempotency_key)",
                "PRIMARY KEY (operation, scope, idempotency_key COLLATE BINARY)",
            ),
        ])
        .await;
        assert_eq!(
            problems,
            [SchemaProblem::KeyCollation {
                column: "idempotency_key",
                found: found.into()
            }],
            "{collation}"
        );
    }
    let scope = problems_with(&[(
        "scope            TEXT    NOT NULL DEFAULT ''",
        "scope            TEXT    NOT NULL DEFAULT '' COLLATE NOCASE",
    )])
    .await;
    assert_eq!(
        scope,
        [SchemaProblem::KeyCollation {
            column: "scope",
            found: "NOCASE".into()
        }]
    );
}

#[tokio::test]
async fn validate_accepts_an_equivalent_unique_index() {
    let problems = problems_with(&[(
        "PRIMARY KEY (operation, scope, idempotency_key)\n)",
        "CHECK (1)\n); CREATE UNIQUE INDEX records_key ON idempotency_records \
         (scope, idempotency_key, operation)",
    )])
    .await;
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn validate_fails_on_missing_expiry_index() {
    let store = SqliteStore::new(empty_pool().await);
    store.create_schema().await.unwrap();
    exec(
        store.pool(),
        "DROP INDEX idempotency_records_expires_at_idx",
    )
    .await;
    assert_eq!(
        validate_problems(&store).await,
        [SchemaProblem::MissingExpiryIndex]
    );
}

#[tokio::test]
async fn none_does_nothing() {
    let (path, _) = fresh_options();
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::None;
    let store = SqliteStore::connect(as_str(&path), &config).await.unwrap();
    assert_eq!(
        store.schema_problems().await.unwrap(),
        [SchemaProblem::MissingTable]
    );
    let tables: i64 = sqlx::query_scalar("SELECT count(*) FROM sqlite_master")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(tables, 0);
}

#[tokio::test]
async fn default_mode_validates_and_fails_on_an_empty_database() {
    let (path, _) = fresh_options();
    let error = SqliteStore::connect(as_str(&path), &PersistenceConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Schema { problems, .. } if problems == &[SchemaProblem::MissingTable]),
        "{error:?}"
    );
}

#[tokio::test]
async fn main_qualified_custom_table_works_end_to_end() {
    let (path, _) = fresh_options();
    let config = PersistenceConfig {
        table_name: "main.Idem_Records".to_owned(),
        schema: SchemaConfig {
            mode: SchemaMode::Create,
        },
        ..Default::default()
    };
    let store = SqliteStore::connect(as_str(&path), &config).await.unwrap();
    assert_eq!(store.table().name(), "idem_records");
    let service = IdempotencyService::new(store.clone());
    let key = IdempotencyKey::new("k-1").unwrap();
    let outcome: Outcome<i32> = service
        .execute(Call::new("OP", key, &1), async |_c| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success(5))
        })
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn injection_through_the_table_name_is_an_error_not_sql() {
    let (path, _) = fresh_options();
    let store = SqliteStore::connect(as_str(&path), &create_config())
        .await
        .unwrap();
    exec(store.pool(), "CREATE TABLE victim (id INTEGER)").await;
    for name in [
        "victim; DROP TABLE victim",
        "idempotency_records\"; DROP TABLE victim; --",
        "x) ; DROP TABLE victim; --",
        "victim]; DROP TABLE victim; --",
        "main.victim.x",
        "temp.victim",
        "sqlite_master",
    ] {
        let config = PersistenceConfig {
            table_name: name.to_owned(),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..Default::default()
        };
        let error = SqliteStore::connect(as_str(&path), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidTableName { .. }),
            "{name}: {error:?}"
        );
    }
    let still_there: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'victim'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(still_there, 1);
}

#[tokio::test]
async fn a_file_database_survives_reopening() {
    let path = temp_db_path();
    let key = || IdempotencyKey::new("reopen-1").unwrap();
    let request = serde_json::json!({"amount": "12.50"});
    let first = SqliteStore::connect(as_str(&path), &create_config())
        .await
        .unwrap();
    let outcome: Outcome<String> = IdempotencyService::new(first.clone())
        .execute(Call::new("PAY", key(), &request), async |_c| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success("p-1".to_owned()))
        })
        .await
        .unwrap();
    assert!(outcome.is_executed());
    first.pool().close().await;
    drop(first);

    // A new pool on the same file, in `validate` mode: the table and the record are there.
    let url = format!("sqlite://{}", as_str(&path));
    let reopened = SqliteStore::connect(&url, &PersistenceConfig::default())
        .await
        .unwrap();
    let replay: Outcome<String> = IdempotencyService::new(reopened)
        .execute(Call::new("PAY", key(), &request), async |_c| {
            Ok::<_, idempotency_core::Error>(ExecutionResult::success("p-2".to_owned()))
        })
        .await
        .unwrap();
    assert!(replay.is_replayed());
    assert_eq!(
        replay.result().value().map(String::as_str),
        Some("p-1"),
        "the action ran again after the reopen"
    );
}

/// Long table names get complete derived names: SQLite has no identifier limit, so the expiry
/// index of a 63-character table is `<table>_expires_at_idx`, not the table's own name cut
/// (which `CREATE INDEX IF NOT EXISTS` would silently skip), and validate passes.
#[tokio::test]
async fn long_table_names_get_their_own_expiry_index() {
    let pool = empty_pool().await;
    let prefix = "r".repeat(50);
    for name in [
        format!("{prefix}_aaaa"),
        format!("{prefix}_cccccccc1"),
        format!("{prefix}_ddddddddddd1"),
        format!("{prefix}_ddddddddddd2"),
    ] {
        let store = SqliteStore::with_table(pool.clone(), TableName::parse(&name).unwrap());
        store.create_schema().await.unwrap();
        let problems = validate_problems(&store).await;
        assert!(problems.is_empty(), "{} chars: {problems:?}", name.len());
    }
}

/// A table of a release before the trace columns: `validate` names both and the migration that
/// adds them; the migration makes it valid; `create` over such a table adds them itself.
#[tokio::test]
async fn validate_names_the_trace_columns_and_their_migration_adds_them() {
    let earlier = ddl(&TableName::parse("idempotency_records").unwrap())
        .lines()
        .filter(|line| !line.contains("trace_id") && !line.contains("span_id"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(earlier.contains("expires_at       INTEGER,"));
    for fix in ["migration", "create"] {
        let pool = empty_pool().await;
        exec(&pool, &earlier).await;
        let store = SqliteStore::new(pool.clone());
        assert_eq!(
            validate_problems(&store).await,
            [
                SchemaProblem::MissingColumn { column: "trace_id" },
                SchemaProblem::MissingColumn { column: "span_id" },
            ]
        );
        let refused = store.validate_schema().await.unwrap_err().to_string();
        assert!(
            refused.contains("migrations/sqlite/20261206000001_idempotency_trace.sql"),
            "{refused}"
        );
        match fix {
            "migration" => {
                exec(
                    &pool,
                    include_str!("../../../migrations/sqlite/20261206000001_idempotency_trace.sql"),
                )
                .await;
            }
            _ => store.create_schema().await.unwrap(),
        }
        assert!(validate_problems(&store).await.is_empty(), "{fix}");
    }
}
