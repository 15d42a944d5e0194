//! Outbox and inbox schema modes on SQLite: create (idempotent, concurrent), validate (and what
//! it names when it fails), none, configured names, names too long for their derived names, and
//! names that try to carry SQL.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod outbox_common;

use idempotency_core::config::{SchemaConfig, SchemaMode};
use idempotency_outbox::config::{InboxConfig, Ordering, OutboxConfig};
use idempotency_outbox::{Error, SchemaProblem};
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
}

#[tokio::test]
async fn table_names_without_room_for_their_derived_names_are_refused() {
    let pool = pool().await;
    for len in [55, 60, 63] {
        let name = "o".repeat(len);
        let table = TableName::parse(&name).unwrap();
        let refused = |error: &Error| matches!(error, Error::InvalidName { reason, .. } if reason.contains("47"));
        let error = outbox_ddl(&table).unwrap_err();
        assert!(refused(&error), "{len}: {error:?}");
        let error =
            SqliteOutbox::with_options(pool.clone(), table.clone(), Ordering::Ordered).unwrap_err();
        assert!(refused(&error), "{len}: {error:?}");
        let error = SqliteInbox::with_table(pool.clone(), table).unwrap_err();
        assert!(refused(&error), "{len}: {error:?}");
        let mut config = config(Ordering::Ordered);
        config.table_name = name.clone();
        let error = SqliteOutbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(refused(&error), "{len}: {error:?}");
        let config = InboxConfig {
            table_name: name,
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..InboxConfig::default()
        };
        let error = SqliteInbox::from_config(pool.clone(), &config)
            .await
            .unwrap_err();
        assert!(refused(&error), "{len}: {error:?}");
    }
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM sqlite_schema").await,
        0,
        "nothing was created"
    );

    // The longest name accepted gets its counters table and every index under its own name.
    let (o, i) = ("o".repeat(47), "i".repeat(47));
    let mut config = config(Ordering::Ordered);
    config.table_name = o.clone();
    let outbox = SqliteOutbox::from_config(pool.clone(), &config)
        .await
        .unwrap();
    assert!(outbox.schema_problems().await.unwrap().is_empty());
    let inbox = SqliteInbox::from_config(
        pool.clone(),
        &InboxConfig {
            table_name: i.clone(),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ..InboxConfig::default()
        },
    )
    .await
    .unwrap();
    assert!(inbox.schema_problems().await.unwrap().is_empty());
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_autoindex%' ORDER BY name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = vec![
        i.clone(),
        format!("{i}_received_at_idx"),
        o.clone(),
        format!("{o}_aggregate_idx"),
        format!("{o}_dead_letter_idx"),
        format!("{o}_pending_idx"),
        format!("{o}_published_idx"),
        format!("{o}_sequences"),
    ];
    expected.sort();
    assert_eq!(names, expected);
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
