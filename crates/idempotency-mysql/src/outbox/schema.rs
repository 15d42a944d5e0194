//! Schema management for the outbox and the inbox: the canonical DDL, and `validate`, which
//! compares live tables with it through the shared introspection (types, lengths,
//! nullability, key collations) plus the keys and indexes the queries rely on.

use idempotency_outbox::{Error, SchemaProblem};
use sqlx::MySqlPool;

use super::error::from_crate_error;
use crate::introspect::{self, Expected};
use crate::table::TableName;

/// The outbox DDL template: `{table}` and `{sequences}` are replaced by quoted names.
pub const OUTBOX_DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The outbox table and its per-aggregate counters, `<table>_sequences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) table: TableName,
    pub(crate) sequences: TableName,
}

/// The longest outbox table name: `<table>_sequences` must fit MySQL's 64 bytes uncut.
pub(crate) const MAX_TABLE_NAME_LEN: usize = 64 - "_sequences".len();

impl Names {
    /// Fails when the table name leaves no room for `<table>_sequences` (a cut name could be
    /// another table's, and `IF NOT EXISTS` would then skip it).
    pub(crate) fn new(table: TableName) -> Result<Self, Error> {
        let sequences = table
            .sibling("sequences")
            .filter(|_| table.name().len() <= MAX_TABLE_NAME_LEN)
            .ok_or_else(|| Error::InvalidName {
                what: "outbox table name",
                name: table.to_string(),
                reason: "at most 54 bytes: `<table>_sequences` must fit MySQL's 64-byte limit",
            })?;
        Ok(Self { table, sequences })
    }
}

/// The canonical outbox DDL for `table` (and its `<table>_sequences` counters).
///
/// ```
/// let table = idempotency_mysql::TableName::parse("outbox")?;
/// let ddl = idempotency_mysql::outbox_ddl(&table)?;
/// assert!(ddl.contains("CREATE TABLE IF NOT EXISTS `outbox_sequences`"));
/// assert!(ddl.contains("id                BINARY(16)"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn outbox_ddl(table: &TableName) -> Result<String, Error> {
    Ok(ddl_for(&Names::new(table.clone())?))
}

pub(crate) fn ddl_for(names: &Names) -> String {
    OUTBOX_DDL_TEMPLATE
        .replace("{table}", names.table.quoted())
        .replace("{sequences}", names.sequences.quoted())
}

/// Runs `ddl` statement by statement (`CREATE TABLE IF NOT EXISTS`, safe to repeat).
pub(crate) async fn create(pool: &MySqlPool, ddl: &str) -> Result<(), Error> {
    introspect::run_ddl(pool, ddl)
        .await
        .map_err(from_crate_error)
}

const TEXT: &[&str] = &["varchar"];
const TIME: &[&str] = &["datetime"];
const BIGINT: &[&str] = &["bigint"];

/// A column: `key` columns need a collation that tells case apart.
pub(crate) const fn col(
    column: &'static str,
    types: &'static [&'static str],
    label: &'static str,
    nullable: bool,
    min_len: Option<i64>,
    key: bool,
) -> Expected {
    Expected {
        column,
        types,
        label,
        nullable,
        min_len,
        key,
    }
}

pub(crate) const fn name_col(column: &'static str) -> Expected {
    col(column, TEXT, "varchar(255)", false, Some(255), true)
}

pub(crate) const fn time_col(column: &'static str, nullable: bool) -> Expected {
    col(column, TIME, "datetime(6)", nullable, None, false)
}

/// What a table must look like: its columns, its unique key, its other indexes.
#[derive(Debug)]
pub(crate) struct Shape {
    pub(crate) columns: &'static [Expected],
    pub(crate) key: &'static [&'static str],
    pub(crate) key_purpose: &'static str,
    pub(crate) indexes: &'static [Index],
}

/// A secondary index: one whose key columns start with `columns`.
#[derive(Debug)]
pub(crate) struct Index {
    pub(crate) purpose: &'static str,
    pub(crate) columns: &'static [&'static str],
}

pub(crate) const OUTBOX: Shape = Shape {
    columns: &[
        col("id", &["binary"], "binary(16)", false, Some(16), false),
        name_col("aggregate_type"),
        name_col("aggregate_id"),
        col("sequence", BIGINT, "bigint", true, None, false),
        col("event_type", TEXT, "varchar(255)", false, Some(255), false),
        col(
            "payload",
            &["longtext"],
            "longtext (not json, which MySQL normalizes)",
            false,
            None,
            false,
        ),
        col(
            "headers",
            &["mediumtext", "longtext"],
            "mediumtext (not json, which MySQL normalizes)",
            false,
            None,
            false,
        ),
        time_col("created_at", false),
        col("attempts", &["int", "bigint"], "int", false, None, false),
        time_col("next_attempt_at", false),
        col(
            "claim_token",
            &["binary"],
            "binary(16)",
            true,
            Some(16),
            false,
        ),
        col("last_error", TEXT, "varchar(1000)", true, Some(1000), false),
        time_col("published_at", true),
        time_col("dead_lettered_at", true),
    ],
    key: &["id"],
    key_purpose: "primary key on (id)",
    indexes: &[
        Index {
            purpose: "on (published_at, dead_lettered_at, next_attempt_at), used to claim",
            columns: &["published_at", "dead_lettered_at", "next_attempt_at"],
        },
        Index {
            purpose: "on (aggregate_type, aggregate_id, ...), used for per-aggregate order",
            columns: &["aggregate_type", "aggregate_id"],
        },
        Index {
            purpose: "on (dead_lettered_at), used for dead letters",
            columns: &["dead_lettered_at"],
        },
    ],
};

pub(crate) const SEQUENCES: Shape = Shape {
    columns: &[
        name_col("aggregate_type"),
        name_col("aggregate_id"),
        col("last_sequence", BIGINT, "bigint", false, None, false),
    ],
    key: &["aggregate_type", "aggregate_id"],
    key_purpose: "primary key on (aggregate_type, aggregate_id)",
    indexes: &[],
};

/// Every difference between `table` and `shape`.
pub(crate) async fn problems(
    pool: &MySqlPool,
    table: &TableName,
    shape: &Shape,
) -> Result<Vec<SchemaProblem>, Error> {
    let name = table.to_string();
    let Some(live) = introspect::inspect(pool, table)
        .await
        .map_err(from_crate_error)?
    else {
        return Ok(vec![SchemaProblem::MissingTable { table: name }]);
    };
    let mut problems: Vec<SchemaProblem> = live
        .column_problems(shape.columns)
        .into_iter()
        .map(|problem| translate(&name, shape, problem))
        .collect();
    if !live.has_unique_key(shape.key) {
        problems.push(SchemaProblem::MissingIndex {
            table: name.clone(),
            purpose: shape.key_purpose,
        });
    }
    for index in shape.indexes {
        if !live.has_index_leading_with(index.columns) {
            problems.push(SchemaProblem::MissingIndex {
                table: name.clone(),
                purpose: index.purpose,
            });
        }
    }
    Ok(problems)
}

fn translate(table: &str, shape: &Shape, problem: crate::SchemaProblem) -> SchemaProblem {
    use crate::SchemaProblem as P;
    let table = table.to_owned();
    let label = |column: &str| {
        shape
            .columns
            .iter()
            .find(|c| c.column == column)
            .map_or("", |c| c.label)
    };
    match problem {
        P::MissingColumn { column } => SchemaProblem::MissingColumn { table, column },
        P::WrongType {
            column,
            expected,
            found,
        } => SchemaProblem::WrongType {
            table,
            column,
            expected,
            found,
        },
        P::TooShort { column, found, .. } => SchemaProblem::WrongType {
            table,
            column,
            expected: label(column),
            found: format!("length {found}"),
        },
        P::Nullability { column, nullable } => SchemaProblem::Nullability {
            table,
            column,
            nullable,
        },
        P::CaseInsensitiveCollation { column, collation } => SchemaProblem::WrongType {
            table,
            column,
            expected: "a binary collation (utf8mb4_bin): keys that differ in case or accents are distinct",
            found: collation,
        },
        // Not produced by `column_problems`; the crate's enum is non-exhaustive.
        _ => SchemaProblem::MissingIndex {
            table,
            purpose: shape.key_purpose,
        },
    }
}

/// `Ok` when `problems` is empty, else [`Error::Schema`] on `table`.
pub(crate) fn check(table: &TableName, problems: Vec<SchemaProblem>) -> Result<(), Error> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema {
            table: table.to_string(),
            problems,
        })
    }
}
