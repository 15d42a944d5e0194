//! Schema management: `create` runs the canonical DDL, `validate` compares the live table with it.

use sqlx::SqlitePool;

use crate::error::{Error, SchemaProblem};
use crate::introspect::{self, Affinity, ExpectedColumn};
use crate::table::TableName;

/// The canonical DDL template; `{table}`, `{expires_index}` and `{lease_counter}` are replaced
/// by quoted names.
pub const DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The canonical DDL for `table`, ready to run or to copy into a migration.
///
/// ```
/// let table = idempotency_sqlite::TableName::parse("idempotency_records")?;
/// let ddl = idempotency_sqlite::ddl(&table);
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "idempotency_records""#));
/// assert!(ddl.contains(") STRICT;"));
/// # Ok::<(), idempotency_sqlite::Error>(())
/// ```
pub fn ddl(table: &TableName) -> String {
    DDL_TEMPLATE
        .replace("{table}", table.quoted())
        .replace("{expires_index}", &table.derived("expires_at_idx"))
        .replace("{lease_counter}", &super::lease::lease_counter(table))
}

/// The columns that keep the span of the execution that stored a record (added after the
/// table's first release).
const TRACE_COLUMNS: [&str; 2] = ["trace_id", "span_id"];

/// The migration that adds [`TRACE_COLUMNS`] to a table of an earlier release, under
/// `migrations/sqlite/`.
pub(crate) const TRACE_MIGRATION: &str = "sqlite/20261206000001_idempotency_trace.sql";

/// Runs the DDL, then adds the trace columns to a table of an earlier release (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`: they are looked up first, under the same write lock).
pub(crate) async fn create(pool: &SqlitePool, table: &TableName) -> Result<(), Error> {
    let mut tx = pool.begin_with(crate::connect::BEGIN_IMMEDIATE).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl(table)))
        .execute(&mut *tx)
        .await?;
    for column in TRACE_COLUMNS {
        let present: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2")
                .bind(table.name())
                .bind(column)
                .fetch_one(&mut *tx)
                .await?;
        if present == 0 {
            let sql = format!("ALTER TABLE {} ADD COLUMN {column} TEXT", table.quoted());
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

const fn column(column: &'static str, affinity: Affinity, nullable: bool) -> ExpectedColumn {
    ExpectedColumn {
        column,
        affinity,
        nullable,
    }
}

const EXPECTED: &[ExpectedColumn] = &[
    column("operation", Affinity::Text, false),
    column("scope", Affinity::Text, false),
    column("idempotency_key", Affinity::Text, false),
    column("request_hash", Affinity::Text, false),
    column("status", Affinity::Text, false),
    column("result_payload", Affinity::Text, true),
    column("error_code", Affinity::Text, true),
    column("created_at", Affinity::Integer, false),
    column("completed_at", Affinity::Integer, true),
    column("expires_at", Affinity::Integer, true),
    column("trace_id", Affinity::Text, true),
    column("span_id", Affinity::Text, true),
];

const KEY_COLUMNS: [&str; 3] = ["operation", "scope", "idempotency_key"];

/// Everything that differs between the live table and the canonical schema.
pub(crate) async fn problems(
    pool: &SqlitePool,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, Error> {
    let Some(live) = introspect::inspect(pool, table).await? else {
        return Ok(vec![SchemaProblem::MissingTable]);
    };
    let mut problems = live.column_problems(EXPECTED);
    problems.extend(live.key_problems(&KEY_COLUMNS));
    for problem in live
        .column_collation_problems(pool, table, &KEY_COLUMNS)
        .await?
    {
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    }
    if !live.has_index_leading_with("expires_at") {
        problems.push(SchemaProblem::MissingExpiryIndex);
    }
    Ok(problems)
}

/// The columns leased claims add to the records table.
const LEASE_COLUMNS: &[ExpectedColumn] = &[
    column("lease_token", Affinity::Integer, true),
    column("lease_expires_at", Affinity::Integer, true),
];

/// What leased claims need and the database lacks (the lease columns, the token counter), as
/// a schema error naming each.
pub(crate) async fn validate_leases(pool: &SqlitePool, table: &TableName) -> Result<(), Error> {
    let Some(live) = introspect::inspect(pool, table).await? else {
        return Err(Error::Schema {
            table: table.to_string(),
            problems: vec![SchemaProblem::MissingTable],
        });
    };
    let mut problems = live.column_problems(LEASE_COLUMNS);
    let counter = super::lease::lease_counter(table);
    let rows: Option<i64> = sqlx::query_scalar(
        "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name = ?1",
    )
    .bind(counter.trim_matches('"'))
    .fetch_optional(pool)
    .await?;
    if rows.unwrap_or(0) == 0 {
        problems.push(SchemaProblem::MissingLeaseCounter { table: counter });
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema {
            table: table.to_string(),
            problems,
        })
    }
}

pub(crate) async fn validate(pool: &SqlitePool, table: &TableName) -> Result<(), Error> {
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
