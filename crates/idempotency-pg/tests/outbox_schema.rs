//! Schema modes against a real PostgreSQL: create, validate (and how it fails), none, the
//! migration files, long names and their derived names, and names that try to carry SQL.

#![allow(clippy::unwrap_used)]

use idempotency_core::config::{SchemaConfig, SchemaMode};
use idempotency_outbox::config::{InboxConfig, OutboxConfig};
use idempotency_outbox::{Error, SchemaProblem};
use idempotency_pg::{PgInbox, PgOutbox, TableName, inbox_ddl, outbox_ddl};
use sqlx::{AssertSqlSafe, PgPool};

fn with_mode(mode: SchemaMode) -> OutboxConfig {
    OutboxConfig {
        schema: SchemaConfig { mode },
        ..OutboxConfig::default()
    }
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn problems_after(alter: &str) -> Vec<SchemaProblem> {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Create))
        .await
        .unwrap();
    exec(&pool, alter).await;
    match outbox.validate_schema().await {
        Err(Error::Schema { problems, .. }) => problems,
        other => panic!("validate should fail after `{alter}`: {other:?}"),
    }
}

#[tokio::test]
async fn create_is_idempotent_then_validate_passes() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Create))
        .await
        .unwrap();
    outbox.create_schema().await.unwrap();
    PgOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Validate))
        .await
        .unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_succeeds() {
    let pool = idempotency_testing::pg_pool().await;
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                PgOutbox::from_config(pool, &with_mode(SchemaMode::Create)).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn validate_names_what_is_missing() {
    let pool = idempotency_testing::pg_pool().await;
    let error = PgOutbox::from_config(pool, &with_mode(SchemaMode::Validate))
        .await
        .unwrap_err();
    let Error::Schema { problems, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(
        problems,
        &[
            SchemaProblem::MissingTable {
                table: "outbox".into()
            },
            SchemaProblem::MissingTable {
                table: "outbox_sequences".into()
            }
        ]
    );
    assert!(
        error.to_string().contains("table outbox does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn validate_fails_on_columns_types_and_nullability() {
    let problems = problems_after(
        "ALTER TABLE outbox DROP COLUMN claim_token; \
         ALTER TABLE outbox ALTER COLUMN payload TYPE text; \
         ALTER TABLE outbox ALTER COLUMN last_error SET NOT NULL",
    )
    .await;
    assert_eq!(
        problems,
        [
            SchemaProblem::WrongType {
                table: "outbox".into(),
                column: "payload",
                expected: "json",
                found: "text".into()
            },
            SchemaProblem::MissingColumn {
                table: "outbox".into(),
                column: "claim_token"
            },
            SchemaProblem::Nullability {
                table: "outbox".into(),
                column: "last_error",
                nullable: true
            },
        ]
    );
}

#[tokio::test]
async fn validate_fails_without_the_partial_pending_index() {
    let problems = problems_after("DROP INDEX outbox_pending_idx").await;
    assert!(
        matches!(&problems[..], [SchemaProblem::MissingIndex { purpose, .. }] if purpose.contains("claim")),
        "{problems:?}"
    );
    // A full (non-partial) index is not the one that keeps the claim on pending rows.
    let problems = problems_after(
        "DROP INDEX outbox_pending_idx; CREATE INDEX full_idx ON outbox (next_attempt_at)",
    )
    .await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    let problems =
        problems_after("ALTER TABLE outbox_sequences DROP CONSTRAINT outbox_sequences_pkey").await;
    assert!(
        matches!(&problems[..], [SchemaProblem::MissingIndex { table, .. }] if table == "outbox_sequences"),
        "{problems:?}"
    );
}

#[tokio::test]
async fn none_does_nothing() {
    let pool = idempotency_testing::pg_pool().await;
    let outbox = PgOutbox::from_config(pool, &with_mode(SchemaMode::None))
        .await
        .unwrap();
    assert_eq!(outbox.schema_problems().await.unwrap().len(), 2);
}

#[tokio::test]
async fn inbox_schema_modes() {
    let pool = idempotency_testing::pg_pool().await;
    let mut config = InboxConfig::default();
    assert!(matches!(
        PgInbox::from_config(pool.clone(), &config).await,
        Err(Error::Schema { .. })
    ));
    config.schema.mode = SchemaMode::Create;
    PgInbox::from_config(pool.clone(), &config).await.unwrap();
    config.schema.mode = SchemaMode::Validate;
    let inbox = PgInbox::from_config(pool.clone(), &config).await.unwrap();
    exec(&pool, "DROP INDEX inbox_received_at_idx").await;
    assert_eq!(inbox.schema_problems().await.unwrap().len(), 1);
}

#[tokio::test]
async fn schema_qualified_tables_and_injection_attempts() {
    let pool = idempotency_testing::pg_pool().await;
    let schema = idempotency_testing::unique_name("events");
    exec(&pool, &format!("CREATE SCHEMA {schema}")).await;
    let config = OutboxConfig {
        table_name: format!("{schema}.Outbox"),
        ..with_mode(SchemaMode::Create)
    };
    let outbox = PgOutbox::from_config(pool.clone(), &config).await.unwrap();
    assert_eq!(outbox.table().schema(), Some(schema.as_str()));
    let exists: bool = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT to_regclass('{schema}.outbox_sequences') IS NOT NULL"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(exists);

    exec(&pool, "CREATE TABLE victim (id int)").await;
    for name in [
        "victim; DROP TABLE victim",
        "outbox\"; DROP TABLE victim; --",
        "a.b.c",
    ] {
        let config = OutboxConfig {
            table_name: name.to_owned(),
            ..with_mode(SchemaMode::Create)
        };
        let error = PgOutbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidName { .. }),
            "{name}: {error:?}"
        );
    }
    let config = OutboxConfig {
        notify_channel: Some("x'); DROP TABLE victim; --".to_owned()),
        ..with_mode(SchemaMode::Create)
    };
    let error = PgOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        Error::InvalidName {
            what: "notify channel",
            ..
        }
    ));
    let still_there: bool = sqlx::query_scalar("SELECT to_regclass('victim') IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(still_there);
}

const FIRST_MIGRATION: &str = include_str!("../../../migrations/20261130000002_outbox.sql");
const JSON_MIGRATION: &str = include_str!("../../../migrations/20261201083000_outbox_json.sql");

/// Columns (type, nullability, default) and index definitions of the tables in the pool's
/// schema, with the schema name taken out.
async fn catalog(pool: &PgPool) -> Vec<String> {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) \
                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END \
                || COALESCE(' default ' || pg_get_expr(d.adbin, d.adrelid), '') \
         FROM pg_class c \
         JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
         LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum \
         WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' \
         UNION ALL \
         SELECT replace(indexdef, schemaname || '.', '') FROM pg_indexes \
         WHERE schemaname = current_schema() \
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows
}

#[tokio::test]
async fn the_migrations_build_the_schema_create_builds() {
    let migrated = idempotency_testing::pg_pool().await;
    exec(&migrated, FIRST_MIGRATION).await;
    exec(&migrated, JSON_MIGRATION).await;
    PgOutbox::from_config(migrated.clone(), &with_mode(SchemaMode::Validate))
        .await
        .unwrap();
    PgInbox::from_config(migrated.clone(), &InboxConfig::default())
        .await
        .unwrap();

    let created = idempotency_testing::pg_pool().await;
    exec(&created, &outbox_ddl(&TableName::parse("outbox").unwrap())).await;
    exec(&created, &inbox_ddl(&TableName::parse("inbox").unwrap())).await;
    assert_eq!(catalog(&migrated).await, catalog(&created).await);
}

#[tokio::test]
async fn a_jsonb_outbox_fails_validation_naming_the_migration_that_converts_it() {
    let pool = idempotency_testing::pg_pool().await;
    exec(&pool, FIRST_MIGRATION).await;
    exec(
        &pool,
        r#"INSERT INTO outbox (id, aggregate_type, aggregate_id, sequence, event_type, payload, headers)
           VALUES ('0190b6c4-4a8c-7000-8000-000000000001', 'order', 'o-1', 1, 'Placed',
                   '{"n": 1}', '{"trace": "t"}')"#,
    )
    .await;
    let error = PgOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Validate))
        .await
        .unwrap_err();
    let Error::Schema { problems, .. } = &error else {
        panic!("{error:?}")
    };
    let outdated: Vec<&str> = problems
        .iter()
        .map(|problem| match problem {
            SchemaProblem::OutdatedType {
                column,
                found,
                expected,
                migration,
                ..
            } if found == "jsonb" && *expected == "json" => {
                assert!(migration.ends_with("_outbox_json.sql"), "{migration}");
                *column
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outdated, ["payload", "headers"]);
    let message = error.to_string();
    for needle in ["jsonb", "20261201083000_outbox_json.sql", "\\u0000"] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }

    // The migration converts the table in place; the row is kept.
    exec(&pool, JSON_MIGRATION).await;
    let outbox = PgOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Validate))
        .await
        .unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
    let kept: (String, String) = sqlx::query_as("SELECT payload::text, headers::text FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        kept,
        (r#"{"n": 1}"#.to_owned(), r#"{"trace": "t"}"#.to_owned())
    );
}

/// Long table names (up to PostgreSQL's 63 bytes) get complete, distinct derived names (a
/// short hash of the table name where `<table>_<suffix>` would pass the limit), so the counters
/// table is never the outbox table itself and no index is silently skipped.
#[tokio::test]
async fn long_table_names_get_complete_distinct_derived_names() {
    let pool = idempotency_testing::pg_pool().await;
    for len in [47, 55, 60, 63] {
        let name = format!("{}{len}", "o".repeat(len - 2));
        let outbox_config = OutboxConfig {
            table_name: name.clone(),
            ..with_mode(SchemaMode::Create)
        };
        let outbox = PgOutbox::from_config(pool.clone(), &outbox_config)
            .await
            .unwrap();
        assert!(
            outbox.schema_problems().await.unwrap().is_empty(),
            "{len}: every index of the outbox exists"
        );
        let inbox_config = InboxConfig {
            table_name: format!("{}{len}", "i".repeat(len - 2)),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..Default::default()
        };
        let inbox = PgInbox::from_config(pool.clone(), &inbox_config)
            .await
            .unwrap();
        assert!(inbox.schema_problems().await.unwrap().is_empty(), "{len}");
        let table = TableName::parse(&name).unwrap();
        assert_ne!(table.sibling("sequences"), table, "{len}");
    }
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_class \
         WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'i')",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // Per length: outbox, counters, inbox; 5 outbox indexes, 1 counters key, 2 inbox indexes.
    assert_eq!(names.len(), 4 * (3 + 5 + 1 + 2), "{names:?}");
}

#[tokio::test]
async fn injection_through_the_inbox_table_name_is_an_error_not_sql() {
    let pool = idempotency_testing::pg_pool().await;
    exec(&pool, "CREATE TABLE victim (id int)").await;
    for name in [
        "inbox; DROP TABLE victim",
        "inbox\"; DROP TABLE victim; --",
        "a.b.c",
        "",
    ] {
        let config = InboxConfig {
            table_name: name.to_owned(),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..Default::default()
        };
        let error = PgInbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidName { .. }),
            "{name}: {error:?}"
        );
    }
    let still_there: bool = sqlx::query_scalar("SELECT to_regclass('victim') IS NOT NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(still_there);
}
