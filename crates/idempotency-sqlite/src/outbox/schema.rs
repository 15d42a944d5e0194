//! Schema management for the outbox and the inbox: the canonical DDL, and `validate`, which
//! compares live tables with it through the shared introspection (column affinities,
//! nullability, the `BINARY` key) plus the secondary indexes the queries rely on.

use idempotency_outbox::{Error, SchemaProblem};
use sqlx::SqlitePool;

use super::error::{from_crate_error, outbox_error};
use crate::introspect::{self, Affinity, ExpectedColumn};
use crate::table::TableName;

/// The outbox DDL template: `{table}`, `{sequences}`, `{pending_index}`, `{aggregate_index}`,
/// `{published_index}` and `{dead_letter_index}` are replaced by quoted names.
pub const OUTBOX_DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The outbox table and its per-aggregate counters, `<table>_sequences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    pub(crate) table: TableName,
    pub(crate) sequences: TableName,
}

/// The longest outbox or inbox table name: the names derived from it, up to
/// `<table>_dead_letter_idx` and `<table>_received_at_idx`, still fit the 63-byte limit uncut.
pub(crate) const MAX_TABLE_NAME_LEN: usize = 63 - "_dead_letter_idx".len();

/// Refuses a table name that leaves no room for the names derived from it (a cut name could
/// collide with another one, or with the table itself, and `IF NOT EXISTS` would skip it).
pub(crate) fn check_room(table: &TableName, what: &'static str) -> Result<(), Error> {
    if table.name().len() > MAX_TABLE_NAME_LEN {
        return Err(Error::InvalidName {
            what,
            name: table.name().to_owned(),
            reason: "at most 47 bytes: the names derived from it (`<table>_dead_letter_idx`...) \
                     must fit 63 bytes, the limit one configuration shares with PostgreSQL",
        });
    }
    Ok(())
}

impl Names {
    /// Fails when the table name leaves no room for its derived names ([`check_room`]).
    pub(crate) fn new(table: TableName) -> Result<Self, Error> {
        check_room(&table, "outbox table name")?;
        let sequences =
            TableName::parse(&format!("{}_sequences", table.name())).map_err(from_crate_error)?;
        Ok(Self { table, sequences })
    }
}

/// The canonical outbox DDL for `table` (and its `<table>_sequences` counters).
///
/// ```
/// let table = idempotency_sqlite::TableName::parse("outbox")?;
/// let ddl = idempotency_sqlite::outbox_ddl(&table)?;
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "outbox_sequences""#));
/// assert!(ddl.contains(") STRICT;"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn outbox_ddl(table: &TableName) -> Result<String, Error> {
    Ok(ddl_for(&Names::new(table.clone())?))
}

pub(crate) fn ddl_for(names: &Names) -> String {
    let t = &names.table;
    OUTBOX_DDL_TEMPLATE
        .replace("{table}", t.quoted())
        .replace("{sequences}", names.sequences.quoted())
        .replace("{pending_index}", &t.derived("pending_idx"))
        .replace("{aggregate_index}", &t.derived("aggregate_idx"))
        .replace("{published_index}", &t.derived("published_idx"))
        .replace("{dead_letter_index}", &t.derived("dead_letter_idx"))
}

/// Runs `ddl` in one `BEGIN IMMEDIATE` transaction (instances starting at once take turns).
pub(crate) async fn create(pool: &SqlitePool, ddl: String) -> Result<(), Error> {
    introspect::run_ddl(pool, ddl)
        .await
        .map_err(from_crate_error)
}

pub(crate) const fn col(
    column: &'static str,
    affinity: Affinity,
    nullable: bool,
) -> ExpectedColumn {
    ExpectedColumn {
        column,
        affinity,
        nullable,
    }
}

/// What a table must look like: its columns, its unique key, its other indexes.
#[derive(Debug)]
pub(crate) struct Shape {
    pub(crate) columns: &'static [ExpectedColumn],
    pub(crate) key: &'static [&'static str],
    pub(crate) key_purpose: &'static str,
    pub(crate) indexes: &'static [Index],
}

/// A secondary index: one whose key columns start with `columns`, partial or not.
#[derive(Debug)]
pub(crate) struct Index {
    pub(crate) purpose: &'static str,
    pub(crate) columns: &'static [&'static str],
    pub(crate) partial: bool,
}

pub(crate) const OUTBOX: Shape = Shape {
    columns: &[
        col("id", Affinity::Text, false),
        col("aggregate_type", Affinity::Text, false),
        col("aggregate_id", Affinity::Text, false),
        col("sequence", Affinity::Integer, true),
        col("event_type", Affinity::Text, false),
        col("payload", Affinity::Text, false),
        col("headers", Affinity::Text, false),
        col("created_at", Affinity::Integer, false),
        col("attempts", Affinity::Integer, false),
        col("next_attempt_at", Affinity::Integer, false),
        col("claim_token", Affinity::Text, true),
        col("last_error", Affinity::Text, true),
        col("published_at", Affinity::Integer, true),
        col("dead_lettered_at", Affinity::Integer, true),
    ],
    key: &["id"],
    key_purpose: "primary key on (id), BINARY collation",
    indexes: &[
        Index {
            purpose: "on pending rows by (next_attempt_at), used to claim",
            columns: &["next_attempt_at"],
            partial: true,
        },
        Index {
            purpose: "on pending rows by (aggregate_type, aggregate_id, sequence), used for order",
            columns: &["aggregate_type", "aggregate_id", "sequence"],
            partial: true,
        },
        Index {
            purpose: "on published rows by (published_at), used by retention",
            columns: &["published_at"],
            partial: true,
        },
        Index {
            purpose: "on dead letters by (dead_lettered_at)",
            columns: &["dead_lettered_at"],
            partial: true,
        },
    ],
};

pub(crate) const SEQUENCES: Shape = Shape {
    columns: &[
        col("aggregate_type", Affinity::Text, false),
        col("aggregate_id", Affinity::Text, false),
        col("last_sequence", Affinity::Integer, false),
    ],
    key: &["aggregate_type", "aggregate_id"],
    key_purpose: "primary key on (aggregate_type, aggregate_id), BINARY collation",
    indexes: &[],
};

/// `(index seq, partial, column name or NULL for an expression)`, key columns in order.
type IndexColumnRow = (i64, i64, Option<String>);

/// Every difference between `table` and `shape`.
pub(crate) async fn problems(
    pool: &SqlitePool,
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
    let collations = live
        .column_collation_problems(pool, table, shape.key)
        .await
        .map_err(from_crate_error)?;
    let mut problems: Vec<SchemaProblem> = live
        .column_problems(shape.columns)
        .into_iter()
        .chain(live.key_problems(shape.key))
        .chain(collations)
        .map(|problem| translate(&name, shape, problem))
        .collect();
    // The key problems of one key are all the same to the outbox: the key is not usable.
    problems.dedup();
    if shape.indexes.is_empty() {
        return Ok(problems);
    }
    let rows: Vec<IndexColumnRow> = sqlx::query_as(
        r#"SELECT il.seq, il.partial, ix.name
           FROM pragma_index_list(?1, 'main') AS il
           JOIN pragma_index_xinfo(il.name, 'main') AS ix
           WHERE ix."key" = 1
           ORDER BY il.seq, ix.seqno"#,
    )
    .bind(table.name())
    .fetch_all(pool)
    .await
    .map_err(outbox_error)?;
    let mut live_indexes: Vec<(i64, bool, Vec<String>)> = Vec::new();
    for (seq, partial, column) in rows {
        let column = column.unwrap_or_default().to_ascii_lowercase();
        match live_indexes.last_mut() {
            Some((last, _, columns)) if *last == seq => columns.push(column),
            _ => live_indexes.push((seq, partial != 0, vec![column])),
        }
    }
    for index in shape.indexes {
        let present = live_indexes.iter().any(|(_, partial, columns)| {
            *partial == index.partial
                && columns.len() >= index.columns.len()
                && columns.iter().zip(index.columns).all(|(a, b)| a == b)
        });
        if !present {
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
    match problem {
        P::MissingTable => SchemaProblem::MissingTable { table },
        P::MissingColumn { column } => SchemaProblem::MissingColumn { table, column },
        P::WrongType {
            column,
            expected,
            found,
        } => SchemaProblem::WrongType {
            table,
            column,
            expected,
            found: if found.is_empty() {
                "untyped".to_owned()
            } else {
                found
            },
        },
        P::Nullability { column, nullable } => SchemaProblem::Nullability {
            table,
            column,
            nullable,
        },
        P::MissingPrimaryKey | P::KeyCollation { .. } | P::MissingExpiryIndex => {
            SchemaProblem::MissingIndex {
                table,
                purpose: shape.key_purpose,
            }
        }
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
