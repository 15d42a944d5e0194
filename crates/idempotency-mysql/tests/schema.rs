//! Schema management and names on MySQL / MariaDB: `create` is repeatable, `validate` names
//! every difference (types, lengths, nullability, key, expiry index, case-insensitive key
//! collations), table names are validated, quoted and never leave derived names without room.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::store::{Acquire, Claim, IdempotencyStore, LockWait};
use idempotency_core::{Fingerprint, IdempotencyKey, Operation, RecordId, Scope};
use idempotency_mysql::{Error, MysqlStore, SchemaProblem, TableName};
use sqlx::MySqlPool;

fn config(table: &str, mode: SchemaMode) -> PersistenceConfig {
    let mut config = PersistenceConfig {
        table_name: table.to_owned(),
        ..PersistenceConfig::default()
    };
    config.schema.mode = mode;
    config
}

#[tokio::test]
async fn create_is_repeatable_and_the_result_validates() {
    let pool = idempotency_testing::mysql_pool().await;
    let store = MysqlStore::from_config(pool.clone(), &config("records", SchemaMode::Create))
        .await
        .unwrap();
    store.create_schema().await.unwrap();
    assert_eq!(store.schema_problems().await.unwrap(), vec![]);
    MysqlStore::from_config(pool, &config("records", SchemaMode::Validate))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_missing_table_fails_validation() {
    let pool = idempotency_testing::mysql_pool().await;
    let error = MysqlStore::from_config(pool, &config("records", SchemaMode::Validate))
        .await
        .unwrap_err();
    let Error::Schema { problems, .. } = error else {
        panic!("{error:?}")
    };
    assert_eq!(problems, vec![SchemaProblem::MissingTable]);
}

/// MySQL's default collations are case-insensitive: a table created with them would merge
/// `Key` and `key` into one record, so validation refuses it.
#[tokio::test]
async fn case_insensitive_key_collations_are_refused() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE records (
             operation VARCHAR(128) COLLATE utf8mb4_general_ci NOT NULL,
             scope VARCHAR(255) COLLATE utf8mb4_general_ci NOT NULL DEFAULT '',
             idempotency_key VARCHAR(255) COLLATE utf8mb4_unicode_ci NOT NULL,
             request_hash VARCHAR(128) NOT NULL, status VARCHAR(32) NOT NULL,
             result_payload LONGTEXT NULL, error_code VARCHAR(128) NULL,
             created_at DATETIME(6) NOT NULL, completed_at DATETIME(6) NULL,
             expires_at DATETIME(6) NULL, trace_id VARCHAR(32) NULL, span_id VARCHAR(16) NULL,
             PRIMARY KEY (operation, scope, idempotency_key), INDEX (expires_at)
         ) DEFAULT CHARSET = utf8mb4",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = MysqlStore::with_table(pool, TableName::parse("records").unwrap());
    let problems = store.schema_problems().await.unwrap();
    assert_eq!(
        problems,
        vec![
            SchemaProblem::CaseInsensitiveCollation {
                column: "operation",
                collation: "utf8mb4_general_ci".into()
            },
            SchemaProblem::CaseInsensitiveCollation {
                column: "scope",
                collation: "utf8mb4_general_ci".into()
            },
            SchemaProblem::CaseInsensitiveCollation {
                column: "idempotency_key",
                collation: "utf8mb4_unicode_ci".into()
            },
        ]
    );
}

/// MariaDB's `utf8mb4_uca1400_ai_cs` tells cases apart but not accents: under it the inbox's
/// message ids `Zoë-1` and `Zoe-1` would be one message, the second dropped as a redelivery.
/// Validation refuses it on every key column, the shared check shown here on the records
/// table (before: it passed, as its name ends in `_cs`).
#[tokio::test]
async fn accent_insensitive_key_collations_are_refused() {
    let pool = idempotency_testing::mysql_pool().await;
    let create = |collation: &str| {
        idempotency_mysql::ddl(&TableName::parse("records").unwrap())
            .unwrap()
            .replace(
                "scope            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                &format!("scope            VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation}"),
            )
    };
    let mut collation = "utf8mb4_uca1400_ai_cs";
    let ddl = create(collation);
    assert!(
        ddl.contains(collation),
        "the DDL names scope as the test expects"
    );
    if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(&pool).await {
        // MySQL 8 has no `_ai_cs` (1273, unknown collation): its `_ci` is refused as before.
        assert!(error.to_string().contains("1273"), "{error}");
        collation = "utf8mb4_general_ci";
        sqlx::raw_sql(sqlx::AssertSqlSafe(create(collation)))
            .execute(&pool)
            .await
            .unwrap();
    }
    let store = MysqlStore::with_table(pool, TableName::parse("records").unwrap());
    assert_eq!(
        store.schema_problems().await.unwrap(),
        vec![SchemaProblem::CaseInsensitiveCollation {
            column: "scope",
            collation: collation.into()
        }]
    );
}

#[tokio::test]
async fn keys_that_differ_only_in_case_are_distinct_records() {
    let store = support::fresh_store().await;
    let fingerprint = Fingerprint::new("f".repeat(64));
    let mut tx = store.begin().await.unwrap();
    for key in ["Key-1", "key-1", "KEY-1"] {
        let id = RecordId::new(
            Operation::new("OP").unwrap(),
            Scope::new("Tenant").unwrap(),
            IdempotencyKey::new(key).unwrap(),
        );
        let claim = Claim {
            id: &id,
            fingerprint: &fingerprint,
            ttl: None,
            wait: LockWait::NoWait,
        };
        assert_eq!(
            store.acquire(&mut tx, &claim).await.unwrap(),
            Acquire::Acquired,
            "{key} merged with another key"
        );
    }
    MysqlStore::rollback(tx).await.unwrap();
}

#[tokio::test]
async fn every_difference_is_named() {
    let pool = idempotency_testing::mysql_pool().await;
    sqlx::raw_sql(
        "CREATE TABLE records (
             operation VARCHAR(128) COLLATE utf8mb4_bin NOT NULL,
             scope VARCHAR(255) COLLATE utf8mb4_bin NULL,
             idempotency_key VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
             request_hash VARCHAR(128) NOT NULL,
             result_payload LONGTEXT NULL, error_code VARCHAR(128) NULL,
             created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
             completed_at DATETIME(6) NULL, expires_at DATETIME(6) NULL,
             trace_id VARCHAR(32) NULL, span_id VARCHAR(16) NULL,
             INDEX (operation, idempotency_key(10))
         ) DEFAULT CHARSET = utf8mb4",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = MysqlStore::with_table(pool, TableName::parse("records").unwrap());
    let problems = store.schema_problems().await.unwrap();
    assert_eq!(
        problems,
        vec![
            SchemaProblem::Nullability {
                column: "scope",
                nullable: false
            },
            SchemaProblem::TooShort {
                column: "idempotency_key",
                min: 255,
                found: 64
            },
            SchemaProblem::MissingColumn { column: "status" },
            SchemaProblem::WrongType {
                column: "created_at",
                expected: "datetime(6)",
                found: "timestamp".into()
            },
            SchemaProblem::MissingPrimaryKey,
            SchemaProblem::MissingExpiryIndex,
        ]
    );
    let message = store.validate_schema().await.unwrap_err().to_string();
    assert!(message.contains("column status is missing"), "{message}");
}

#[tokio::test]
async fn table_names_are_validated_quoted_and_qualified() {
    let pool = idempotency_testing::mysql_pool().await;
    for bad in ["records; DROP TABLE users", "r`x", "a.b.c", "1r"] {
        let error = MysqlStore::from_config(pool.clone(), &config(bad, SchemaMode::Create))
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidTableName { .. }),
            "{bad}: {error:?}"
        );
    }
    let database: String = sqlx::query_scalar("SELECT DATABASE()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let qualified = format!("{database}.Qualified_Records");
    let store = MysqlStore::from_config(pool.clone(), &config(&qualified, SchemaMode::Create))
        .await
        .unwrap();
    assert_eq!(store.schema_problems().await.unwrap(), vec![]);
    assert_eq!(count_tables(&pool, "qualified_records").await, 1);
}

/// MySQL names a table's CHECK constraints `<table>_chk_<n>` within 64 bytes: a longer name
/// is refused before any DDL runs, and the longest accepted one creates its table.
#[tokio::test]
async fn names_that_leave_no_room_for_derived_names_are_refused() {
    let pool = idempotency_testing::mysql_pool().await;
    let longest = "r".repeat(idempotency_mysql::MAX_RECORDS_TABLE_LEN);
    MysqlStore::from_config(pool.clone(), &config(&longest, SchemaMode::Create))
        .await
        .unwrap();
    assert_eq!(count_tables(&pool, &longest).await, 1);
    let too_long = "r".repeat(idempotency_mysql::MAX_RECORDS_TABLE_LEN + 1);
    let error = MysqlStore::from_config(pool.clone(), &config(&too_long, SchemaMode::Create))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidTableName { .. }), "{error:?}");
    assert_eq!(count_tables(&pool, &too_long).await, 0);
}

async fn count_tables(pool: &MySqlPool, name: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(name)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A table of a release before the trace columns: `validate` names both and the migration that
/// adds them; the migration makes it valid; `create` over such a table adds them itself.
#[tokio::test]
async fn validate_names_the_trace_columns_and_their_migration_adds_them() {
    let earlier = idempotency_mysql::ddl(&TableName::parse("idempotency_records").unwrap())
        .unwrap()
        .lines()
        .filter(|line| !line.contains("trace_id") && !line.contains("span_id"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(earlier.contains("expires_at       DATETIME(6)  NULL,"));
    for fix in ["migration", "create"] {
        let pool = idempotency_testing::mysql_pool().await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(earlier.clone()))
            .execute(&pool)
            .await
            .unwrap();
        let store = MysqlStore::from_config(
            pool.clone(),
            &config("idempotency_records", SchemaMode::None),
        )
        .await
        .unwrap();
        assert_eq!(
            store.schema_problems().await.unwrap(),
            [
                SchemaProblem::MissingColumn { column: "trace_id" },
                SchemaProblem::MissingColumn { column: "span_id" },
            ]
        );
        let refused = store.validate_schema().await.unwrap_err().to_string();
        assert!(
            refused.contains("migrations/mysql/20261206000001_idempotency_trace.sql"),
            "{refused}"
        );
        match fix {
            "migration" => {
                sqlx::raw_sql(include_str!(
                    "../../../migrations/mysql/20261206000001_idempotency_trace.sql"
                ))
                .execute(&pool)
                .await
                .unwrap();
            }
            _ => store.create_schema().await.unwrap(),
        }
        assert_eq!(store.schema_problems().await.unwrap(), vec![], "{fix}");
    }
}
