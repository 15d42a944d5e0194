//! Schema management: `create` runs the canonical DDL, `validate` compares the live table with it.

use sqlx::SqlitePool;

use crate::error::{Error, SchemaProblem};
use crate::introspect::{self, Affinity, ExpectedColumn};
use crate::table::TableName;

/// The canonical DDL template; `{table}` and `{expires_index}` are replaced by quoted names.
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
}

pub(crate) async fn create(pool: &SqlitePool, table: &TableName) -> Result<(), Error> {
    introspect::run_ddl(pool, ddl(table)).await
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
