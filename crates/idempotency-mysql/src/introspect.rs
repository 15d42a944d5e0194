//! Schema tools shared by the stores: reading a live table from `information_schema` and
//! comparing it with what a store needs (types, lengths, nullability, key collations, indexes).

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, MySqlPool};

use crate::error::{Error, SchemaProblem};
use crate::table::TableName;

/// Runs each statement of `ddl` (separated by `;` at line ends). `CREATE TABLE IF NOT EXISTS`
/// is atomic on InnoDB (MySQL 8 has atomic DDL; MariaDB serializes it on the metadata lock),
/// so instances starting at once are safe without a lock of their own.
pub(crate) async fn run_ddl(pool: &MySqlPool, ddl: &str) -> Result<(), Error> {
    for statement in statements(ddl) {
        sqlx::raw_sql(AssertSqlSafe(statement.to_owned()))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The statements of a DDL template, comment lines dropped.
fn statements(ddl: &str) -> Vec<String> {
    let text: String = ddl
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .map(|line| format!("{line}\n"))
        .collect();
    text.split(";\n")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A column a store needs.
#[derive(Debug)]
pub(crate) struct Expected {
    pub(crate) column: &'static str,
    /// Accepted `DATA_TYPE`s, lower case.
    pub(crate) types: &'static [&'static str],
    /// The canonical type, for messages.
    pub(crate) label: &'static str,
    pub(crate) nullable: bool,
    /// The minimum `CHARACTER_MAXIMUM_LENGTH` of a text column.
    pub(crate) min_len: Option<i64>,
    /// A key column: its collation must tell case apart.
    pub(crate) key: bool,
}

/// `(data_type, max length, nullable, collation)`.
type Column = (String, Option<i64>, bool, Option<String>);

#[derive(Debug)]
struct Index {
    unique: bool,
    /// Key columns in order, `None` for an expression or a prefix (`col(10)`).
    columns: Vec<Option<String>>,
}

/// The live shape of a table.
#[derive(Debug)]
pub(crate) struct LiveTable {
    columns: HashMap<String, Column>,
    indexes: Vec<Index>,
}

type ColumnRow = (String, String, String, Option<i64>, String, Option<String>);
type IndexRow = (String, i64, Option<String>, Option<i64>);

/// Reads `table`; `None` when there is no such table in its database (the connection's, when
/// the name is not qualified).
pub(crate) async fn inspect(
    pool: &MySqlPool,
    table: &TableName,
) -> Result<Option<LiveTable>, Error> {
    let columns: Vec<ColumnRow> = sqlx::query_as(
        "SELECT CAST(COLUMN_NAME AS CHAR), CAST(LOWER(DATA_TYPE) AS CHAR), \
                CAST(LOWER(COLUMN_TYPE) AS CHAR), CAST(CHARACTER_MAXIMUM_LENGTH AS SIGNED), CAST(IS_NULLABLE AS CHAR), \
                CAST(COLLATION_NAME AS CHAR) \
         FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?",
    )
    .bind(table.database())
    .bind(table.name())
    .fetch_all(pool)
    .await?;
    if columns.is_empty() {
        return Ok(None);
    }
    let rows: Vec<IndexRow> = sqlx::query_as(
        "SELECT CAST(INDEX_NAME AS CHAR), CAST(NON_UNIQUE AS SIGNED), CAST(COLUMN_NAME AS CHAR), \
                CAST(SUB_PART AS SIGNED) \
         FROM information_schema.STATISTICS \
         WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
         ORDER BY INDEX_NAME, SEQ_IN_INDEX",
    )
    .bind(table.database())
    .bind(table.name())
    .fetch_all(pool)
    .await?;
    let mut indexes: Vec<(String, Index)> = Vec::new();
    for (name, non_unique, column, sub_part) in rows {
        let column = column
            .filter(|_| sub_part.is_none())
            .map(|c| c.to_ascii_lowercase());
        match indexes.last_mut() {
            Some((last, index)) if *last == name => index.columns.push(column),
            _ => indexes.push((
                name,
                Index {
                    unique: non_unique == 0,
                    columns: vec![column],
                },
            )),
        }
    }
    Ok(Some(LiveTable {
        columns: columns
            .into_iter()
            .map(|(name, ty, column_type, len, nullable, collation)| {
                // An unsigned integer is another type: sqlx decodes it into no signed
                // integer, so every read of the row would fail.
                let ty = if column_type.contains("unsigned") {
                    format!("{ty} unsigned")
                } else {
                    ty
                };
                (
                    name.to_ascii_lowercase(),
                    (ty, len, nullable == "YES", collation),
                )
            })
            .collect(),
        indexes: indexes.into_iter().map(|(_, index)| index).collect(),
    }))
}

/// Whether a collation tells `Key` from `key` and `Zoë` from `Zoe`: binary (`*_bin`, or none
/// for binary types), or case-sensitive (`_cs`) and neither case- nor accent-insensitive
/// (`_ci`, `_ai`; `cs` is also Czech's code, as in `utf8mb4_cs_0900_as_ci`): MySQL 8's
/// `utf8mb4_0900_as_cs`, not MariaDB's `utf8mb4_uca1400_ai_cs`, under which the inbox's
/// message ids `Zoë-1` and `Zoe-1` would be one message.
fn case_sensitive(collation: Option<&str>) -> bool {
    collation.is_none_or(|c| {
        let c = c.to_ascii_lowercase();
        let parts: Vec<&str> = c.split('_').collect();
        c == "binary"
            || parts.last() == Some(&"bin")
            || (parts.contains(&"cs") && !parts.contains(&"ai") && !parts.contains(&"ci"))
    })
}

impl LiveTable {
    /// Missing columns, wrong types, short lengths, nullability and key collations, in
    /// `expected` order.
    pub(crate) fn column_problems(&self, expected: &[Expected]) -> Vec<SchemaProblem> {
        let mut problems = Vec::new();
        for want in expected {
            let Some((ty, len, nullable, collation)) = self.columns.get(want.column) else {
                problems.push(SchemaProblem::MissingColumn {
                    column: want.column,
                });
                continue;
            };
            if !want.types.contains(&ty.as_str()) {
                problems.push(SchemaProblem::WrongType {
                    column: want.column,
                    expected: want.label,
                    found: ty.clone(),
                });
                continue;
            }
            if let (Some(min), Some(found)) = (want.min_len, len)
                && found < &min
            {
                problems.push(SchemaProblem::TooShort {
                    column: want.column,
                    min,
                    found: *found,
                });
            }
            if want.nullable != *nullable {
                problems.push(SchemaProblem::Nullability {
                    column: want.column,
                    nullable: want.nullable,
                });
            }
            if want.key && !case_sensitive(collation.as_deref()) {
                problems.push(SchemaProblem::CaseInsensitiveCollation {
                    column: want.column,
                    collation: collation.clone().unwrap_or_default(),
                });
            }
        }
        problems
    }

    /// Whether a unique index covers exactly `key` (any order, whole columns).
    pub(crate) fn has_unique_key(&self, key: &[&str]) -> bool {
        let mut wanted: Vec<&str> = key.to_vec();
        wanted.sort_unstable();
        self.indexes.iter().any(|index| {
            let mut columns: Vec<Option<&str>> =
                index.columns.iter().map(Option::as_deref).collect();
            columns.sort_unstable();
            index.unique && columns == wanted.iter().map(|c| Some(*c)).collect::<Vec<_>>()
        })
    }

    /// Whether some index starts with `columns`, in order.
    pub(crate) fn has_index_leading_with(&self, columns: &[&str]) -> bool {
        self.indexes.iter().any(|index| {
            index.columns.len() >= columns.len()
                && index
                    .columns
                    .iter()
                    .zip(columns)
                    .all(|(a, b)| a.as_deref() == Some(*b))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collations_that_merge_cases_are_told_apart() {
        for (collation, ok) in [
            (Some("utf8mb4_bin"), true),
            (Some("utf8mb4_nopad_bin"), true),
            (Some("utf8mb4_0900_bin"), true),
            (Some("utf8mb4_0900_as_cs"), true),
            (Some("utf8mb4_ja_0900_as_cs_ks"), true),
            (Some("utf8mb4_uca1400_as_cs"), true),
            (Some("utf8mb4_uca1400_nopad_as_cs"), true),
            (Some("latin1_general_cs"), true),
            (Some("utf8mb4_uca1400_ai_cs"), false),
            (Some("utf8mb4_uca1400_nopad_ai_cs"), false),
            (Some("utf8mb4_uca1400_as_ci"), false),
            (Some("utf8mb4_cs_0900_as_ci"), false),
            (Some("utf8mb4_cs_0900_as_cs"), true),
            (Some("binary"), true),
            (None, true),
            (Some("utf8mb4_general_ci"), false),
            (Some("utf8mb4_0900_ai_ci"), false),
            (Some("utf8mb4_unicode_520_ci"), false),
            (Some("latin1_swedish_ci"), false),
        ] {
            assert_eq!(case_sensitive(collation), ok, "{collation:?}");
        }
    }

    #[test]
    fn ddl_is_split_into_statements_without_comments() {
        let ddl =
            "-- a comment; with a semicolon\nCREATE TABLE a (x INT);\n\nCREATE TABLE b (y INT);\n";
        assert_eq!(
            statements(ddl),
            vec!["CREATE TABLE a (x INT)", "CREATE TABLE b (y INT)"]
        );
    }
}
