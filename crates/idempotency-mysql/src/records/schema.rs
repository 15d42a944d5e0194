//! Schema management for the records table: `create` runs the canonical DDL, `validate`
//! compares the live table with it (the same checks as on PostgreSQL, plus key collations).

use sqlx::MySqlPool;

use crate::error::{Error, SchemaProblem};
use crate::introspect::{self, Expected};
use crate::table::TableName;

/// The canonical DDL template; `{table}` is replaced by the quoted name.
pub const DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The longest records table name: MySQL names the table's CHECK constraints
/// `<table>_chk_<n>`, which must fit 64 bytes.
pub const MAX_RECORDS_TABLE_LEN: usize = 64 - "_chk_2".len();

/// Refuses a table name that leaves no room for the constraint names derived from it.
pub(crate) fn check_room(table: &TableName) -> Result<(), Error> {
    if table.name().len() > MAX_RECORDS_TABLE_LEN {
        return Err(Error::InvalidTableName {
            name: table.to_string(),
            reason: "at most 58 bytes: MySQL names its CHECK constraints `<table>_chk_<n>`, \
                     which must fit 64 bytes",
        });
    }
    Ok(())
}

/// The canonical DDL for `table`, ready to run or to copy into a migration.
///
/// ```
/// let table = idempotency_mysql::TableName::parse("billing.idempotency_records")?;
/// let ddl = idempotency_mysql::ddl(&table)?;
/// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `billing`.`idempotency_records`"));
/// assert!(ddl.contains("COLLATE utf8mb4_bin"));
/// # Ok::<(), idempotency_mysql::Error>(())
/// ```
pub fn ddl(table: &TableName) -> Result<String, Error> {
    check_room(table)?;
    Ok(DDL_TEMPLATE.replace("{table}", table.quoted()))
}

/// The migration that adds the trace columns to a table of an earlier release, under
/// `migrations/mysql/`.
pub(crate) const TRACE_MIGRATION: &str = "mysql/20261206000001_idempotency_trace.sql";

/// Runs the DDL, then adds the trace columns (`trace_id`, `span_id`) to a table of an earlier
/// release. MySQL has no `ADD COLUMN IF NOT EXISTS`: the columns are looked up first, and an
/// instance that lost the race to add them (error 1060, duplicate column) finds them there.
pub(crate) async fn create(pool: &MySqlPool, table: &TableName) -> Result<(), Error> {
    introspect::run_ddl(pool, &ddl(table)?).await?;
    if missing_trace_columns(pool, table).await? == 0 {
        return Ok(());
    }
    let alter = format!(
        "ALTER TABLE {} \
         ADD COLUMN trace_id VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL, \
         ADD COLUMN span_id VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NULL",
        table.quoted()
    );
    if let Err(error) = sqlx::raw_sql(sqlx::AssertSqlSafe(alter))
        .execute(pool)
        .await
        && missing_trace_columns(pool, table).await? != 0
    {
        return Err(error.into());
    }
    Ok(())
}

/// How many of the trace columns the table lacks.
async fn missing_trace_columns(pool: &MySqlPool, table: &TableName) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT 2 - COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
           AND COLUMN_NAME IN ('trace_id', 'span_id')",
    )
    .bind(table.database())
    .bind(table.name())
    .fetch_one(pool)
    .await
}

const TEXT: &[&str] = &["varchar", "char"];
const DATETIME: &[&str] = &["datetime"];

const fn text(column: &'static str, label: &'static str, min: i64, key: bool) -> Expected {
    Expected {
        column,
        types: TEXT,
        label,
        nullable: false,
        min_len: Some(min),
        key,
    }
}

const fn time(column: &'static str, nullable: bool) -> Expected {
    Expected {
        column,
        types: DATETIME,
        label: "datetime(6)",
        nullable,
        min_len: None,
        key: false,
    }
}

const EXPECTED: &[Expected] = &[
    text("operation", "varchar(128)", 128, true),
    text("scope", "varchar(255)", 255, true),
    text("idempotency_key", "varchar(255)", 255, true),
    text("request_hash", "varchar(128)", 128, false),
    text("status", "varchar(32)", 10, false),
    Expected {
        column: "result_payload",
        types: &["longtext", "mediumtext"],
        label: "longtext (not json, which MySQL normalizes)",
        nullable: true,
        min_len: None,
        key: false,
    },
    Expected {
        column: "error_code",
        types: TEXT,
        label: "varchar(128)",
        nullable: true,
        min_len: Some(128),
        key: false,
    },
    time("created_at", false),
    time("completed_at", true),
    time("expires_at", true),
    Expected {
        column: "trace_id",
        types: TEXT,
        label: "varchar(32)",
        nullable: true,
        min_len: Some(32),
        key: false,
    },
    Expected {
        column: "span_id",
        types: TEXT,
        label: "varchar(16)",
        nullable: true,
        min_len: Some(16),
        key: false,
    },
];

const KEY_COLUMNS: [&str; 3] = ["operation", "scope", "idempotency_key"];

/// Everything that differs between the live table and the canonical schema.
pub(crate) async fn problems(
    pool: &MySqlPool,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, Error> {
    let Some(live) = introspect::inspect(pool, table).await? else {
        return Ok(vec![SchemaProblem::MissingTable]);
    };
    let mut problems = live.column_problems(EXPECTED);
    if !live.has_unique_key(&KEY_COLUMNS) {
        problems.push(SchemaProblem::MissingPrimaryKey);
    }
    if !live.has_index_leading_with(&["expires_at"]) {
        problems.push(SchemaProblem::MissingExpiryIndex);
    }
    Ok(problems)
}

pub(crate) async fn validate(pool: &MySqlPool, table: &TableName) -> Result<(), Error> {
    let problems = problems(pool, table).await?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema {
            table: table.to_string(),
            problems,
        })
    }
}
