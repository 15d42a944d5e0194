//! Outbox and inbox schema modes on SQLite: create (idempotent, concurrent), validate (and what
//! it names when it fails), none, configured names, and names that try to carry SQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use idempotency_sqlite::core::config::{SchemaConfig, SchemaMode};
use idempotency_sqlite::idempotency_outbox::config::{InboxConfig, Ordering, OutboxConfig};
use idempotency_sqlite::idempotency_outbox::{Error, SchemaProblem};
use idempotency_sqlite::{SqliteInbox, SqliteOutbox, TableName, outbox_ddl};
use outbox_common::*;
use sqlx::{AssertSqlSafe, SqlitePool};

fn with_mode(mode: SchemaMode) -> OutboxConfig {
    OutboxConfig {
        schema: SchemaConfig { mode },
        ..OutboxConfig::default()
    }
}

async fn pool() -> SqlitePool {
    let options = idempotency_sqlite::connect_options(as_str(&temp_db_path())).unwrap();
    SqlitePool::connect_with(options).await.unwrap()
}

async fn exec(pool: &SqlitePool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Creates the outbox, runs `alter`, and returns what validate then reports.
async fn problems_after(alter: &str) -> Vec<SchemaProblem> {
    let pool = pool().await;
    let outbox = SqliteOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Create))
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
    let pool = pool().await;
    let outbox = SqliteOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Create))
        .await
        .unwrap();
    outbox.create_schema().await.unwrap();
    SqliteOutbox::from_config(pool.clone(), &with_mode(SchemaMode::Validate))
        .await
        .unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
    assert_eq!(outbox.sequences_table().name(), "outbox_sequences");
    let strict: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pragma_table_list WHERE strict = 1 AND name LIKE 'outbox%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(strict, 2, "both tables are STRICT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_create_succeeds() {
    let pool = pool().await;
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                SqliteOutbox::from_config(pool, &with_mode(SchemaMode::Create)).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn validate_names_what_is_missing_and_none_touches_nothing() {
    let pool = pool().await;
    SqliteOutbox::from_config(pool.clone(), &with_mode(SchemaMode::None))
        .await
        .unwrap();
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM sqlite_master").await,
        0,
        "`none` creates nothing"
    );
    let error = SqliteOutbox::from_config(pool, &with_mode(SchemaMode::Validate))
        .await
        .unwrap_err();
    let Error::Schema { table, problems } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(table, "outbox");
    assert_eq!(
        problems,
        &[
            SchemaProblem::MissingTable {
                table: "outbox".into()
            },
            SchemaProblem::MissingTable {
                table: "outbox_sequences".into()
            },
        ]
    );
    assert!(
        error.to_string().contains("table outbox does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn validate_names_columns_types_and_indexes() {
    let problems = problems_after(
        "DROP INDEX outbox_pending_idx; \
         ALTER TABLE outbox DROP COLUMN last_error; \
         ALTER TABLE outbox ADD COLUMN last_error BLOB;",
    )
    .await;
    assert_eq!(
        problems,
        [
            SchemaProblem::WrongType {
                table: "outbox".into(),
                column: "last_error",
                expected: "TEXT",
                found: "BLOB".into(),
            },
            SchemaProblem::MissingIndex {
                table: "outbox".into(),
                purpose: "on pending rows by (next_attempt_at), used to claim",
            },
        ]
    );
    let problems = problems_after(
        "DROP TABLE outbox_sequences; \
         CREATE TABLE outbox_sequences (aggregate_type TEXT NOT NULL, aggregate_id TEXT, \
                                        last_sequence INTEGER NOT NULL);",
    )
    .await;
    assert_eq!(
        problems,
        [
            SchemaProblem::Nullability {
                table: "outbox_sequences".into(),
                column: "aggregate_id",
                nullable: false,
            },
            SchemaProblem::MissingIndex {
                table: "outbox_sequences".into(),
                purpose: "primary key on (aggregate_type, aggregate_id), BINARY collation",
            },
        ]
    );
    // A full index where the claim needs a partial one over pending rows.
    let problems = problems_after(
        "DROP INDEX outbox_aggregate_idx; \
         CREATE INDEX agg_full ON outbox (aggregate_type, aggregate_id, sequence);",
    )
    .await;
    assert!(
        matches!(&problems[..], [SchemaProblem::MissingIndex { purpose, .. }] if purpose.contains("used for order")),
        "{problems:?}"
    );
}

#[tokio::test]
async fn configured_names_are_validated_and_used() {
    let pool = pool().await;
    let mut config = config(Ordering::Ordered);
    config.table_name = "main.Billing_Outbox".into();
    config.notify_channel = Some("not a channel; ignored on SQLite".into());
    let outbox = SqliteOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    assert_eq!(outbox.table().name(), "billing_outbox");
    commit(&outbox, &[event("a", 1)]).await;
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM billing_outbox").await,
        1
    );
    assert_eq!(
        scalar(&pool, "SELECT last_sequence FROM billing_outbox_sequences").await,
        1
    );

    for bad in [
        "outbox; DROP TABLE users",
        "billing.outbox",
        "sqlite_outbox",
        "o\"x",
    ] {
        config.table_name = bad.into();
        let error = SqliteOutbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(error, Error::InvalidName { .. }),
            "{bad}: {error:?}"
        );
    }
    // The counters' table is named after the outbox table and must fit 63 bytes too.
    let long = TableName::parse(&"o".repeat(54)).unwrap();
    assert!(matches!(outbox_ddl(&long), Err(Error::InvalidName { .. })));
    assert!(SqliteOutbox::with_options(pool.clone(), long, Ordering::Ordered).is_err());
    let fits = TableName::parse(&"o".repeat(53)).unwrap();
    assert!(outbox_ddl(&fits).is_ok());
}

#[tokio::test]
async fn inbox_schema_modes() {
    let pool = pool().await;
    let mut config = InboxConfig::default();
    let error = SqliteInbox::from_config(pool.clone(), &config)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Schema { problems, .. } if problems == &[SchemaProblem::MissingTable { table: "inbox".into() }]),
        "{error:?}"
    );
    config.schema.mode = SchemaMode::Create;
    let inbox = SqliteInbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    inbox.create_schema().await.unwrap();
    config.schema.mode = SchemaMode::Validate;
    SqliteInbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    exec(&pool, "DROP INDEX inbox_received_at_idx").await;
    assert_eq!(
        inbox.schema_problems().await.unwrap(),
        [SchemaProblem::MissingIndex {
            table: "inbox".into(),
            purpose: "by (received_at), used by purge",
        }]
    );
    config.table_name = "inbox; --".into();
    assert!(matches!(
        SqliteInbox::from_config(pool, &config).await,
        Err(Error::InvalidName { .. })
    ));
}
