//! Schema tools shared by the stores: running DDL under the write lock, and reading a live table
//! through SQLite's table-valued pragmas to compare it with what a store needs.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, SqlitePool};

use crate::connect::BEGIN_IMMEDIATE;
use crate::error::{Error, SchemaProblem};
use crate::table::TableName;

/// Runs `ddl` (several statements) in one write transaction: instances starting at once take
/// turns, and `IF NOT EXISTS` makes the later ones no-ops.
#[cfg_attr(not(feature = "outbox"), allow(dead_code))] // the outbox's schema
pub(crate) async fn run_ddl(pool: &SqlitePool, ddl: String) -> Result<(), Error> {
    let mut tx = pool.begin_with(BEGIN_IMMEDIATE).await?;
    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

/// A column's type affinity, derived from its declared type by SQLite's rules
/// (<https://www.sqlite.org/datatype3.html#determination_of_column_affinity>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Affinity {
    Integer,
    Text,
    Blob,
    Real,
    Numeric,
}

impl Affinity {
    pub(crate) fn of(declared: &str) -> Self {
        let t = declared.to_ascii_uppercase();
        if t.contains("INT") {
            Self::Integer
        } else if ["CHAR", "CLOB", "TEXT"].iter().any(|s| t.contains(s)) {
            Self::Text
        } else if t.is_empty() || t.contains("BLOB") {
            Self::Blob
        } else if ["REAL", "FLOA", "DOUB"].iter().any(|s| t.contains(s)) {
            Self::Real
        } else {
            Self::Numeric
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Integer => "INTEGER",
            Self::Text => "TEXT",
            Self::Blob => "BLOB",
            Self::Real => "REAL",
            Self::Numeric => "NUMERIC",
        }
    }
}

/// A column a store needs.
#[derive(Debug)]
pub(crate) struct ExpectedColumn {
    pub(crate) column: &'static str,
    pub(crate) affinity: Affinity,
    pub(crate) nullable: bool,
}

#[derive(Debug)]
struct Index {
    unique: bool,
    partial: bool,
    /// Key columns in order: name (`None` for an expression) and collation.
    columns: Vec<(Option<String>, String)>,
}

/// The live shape of a table.
#[derive(Debug)]
pub(crate) struct LiveTable {
    /// Lower-case column name to (declared type, NOT NULL).
    columns: HashMap<String, (String, bool)>,
    indexes: Vec<Index>,
}

/// `(index seq, unique, partial, column name or NULL for an expression, collation)`.
type IndexColumnRow = (i64, i64, i64, Option<String>, Option<String>);

/// Reads `table` from the `main` database; `None` when there is no such table.
pub(crate) async fn inspect(
    pool: &SqlitePool,
    table: &TableName,
) -> Result<Option<LiveTable>, Error> {
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM main.sqlite_master WHERE type = 'table' AND name = ?1 COLLATE NOCASE",
    )
    .bind(table.name())
    .fetch_one(pool)
    .await?;
    if exists == 0 {
        return Ok(None);
    }
    let columns: Vec<(String, String, i64)> =
        sqlx::query_as(r#"SELECT name, type, "notnull" FROM pragma_table_info(?1, 'main')"#)
            .bind(table.name())
            .fetch_all(pool)
            .await?;
    let rows: Vec<IndexColumnRow> = sqlx::query_as(
        r#"SELECT il.seq, il."unique", il.partial, ix.name, ix.coll
           FROM pragma_index_list(?1, 'main') AS il
           JOIN pragma_index_xinfo(il.name, 'main') AS ix
           WHERE ix."key" = 1
           ORDER BY il.seq, ix.seqno"#,
    )
    .bind(table.name())
    .fetch_all(pool)
    .await?;
    let mut indexes: Vec<(i64, Index)> = Vec::new();
    for (seq, unique, partial, column, collation) in rows {
        let column = (
            column.map(|c| c.to_ascii_lowercase()),
            collation.unwrap_or_default(),
        );
        match indexes.last_mut() {
            Some((last, index)) if *last == seq => index.columns.push(column),
            _ => indexes.push((
                seq,
                Index {
                    unique: unique != 0,
                    partial: partial != 0,
                    columns: vec![column],
                },
            )),
        }
    }
    Ok(Some(LiveTable {
        columns: columns
            .into_iter()
            .map(|(name, ty, not_null)| (name.to_ascii_lowercase(), (ty, not_null != 0)))
            .collect(),
        indexes: indexes.into_iter().map(|(_, index)| index).collect(),
    }))
}

impl LiveTable {
    /// Missing columns, wrong affinities and wrong nullability, in `expected` order.
    pub(crate) fn column_problems(&self, expected: &[ExpectedColumn]) -> Vec<SchemaProblem> {
        let mut problems = Vec::new();
        for want in expected {
            let Some((declared, not_null)) = self.columns.get(want.column) else {
                problems.push(SchemaProblem::MissingColumn {
                    column: want.column,
                });
                continue;
            };
            if Affinity::of(declared) != want.affinity {
                problems.push(SchemaProblem::WrongType {
                    column: want.column,
                    expected: want.affinity.as_str(),
                    found: declared.clone(),
                });
                continue;
            }
            if want.nullable == *not_null {
                problems.push(SchemaProblem::Nullability {
                    column: want.column,
                    nullable: want.nullable,
                });
            }
        }
        problems
    }

    /// Checks for a plain unique index on exactly `key` (any order) comparing with `BINARY`:
    /// `MissingPrimaryKey` when there is none, `KeyCollation` when the only ones use another
    /// collation.
    pub(crate) fn key_problems(&self, key: &[&'static str]) -> Vec<SchemaProblem> {
        let mut wanted: Vec<&str> = key.to_vec();
        wanted.sort_unstable();
        let candidates: Vec<&Index> = self
            .indexes
            .iter()
            .filter(|index| {
                let mut columns: Vec<Option<&str>> =
                    index.columns.iter().map(|(c, _)| c.as_deref()).collect();
                columns.sort_unstable();
                index.unique
                    && !index.partial
                    && columns == wanted.iter().map(|c| Some(*c)).collect::<Vec<_>>()
            })
            .collect();
        let non_binary = |index: &Index| -> Vec<SchemaProblem> {
            key.iter()
                .filter_map(|column| {
                    let (_, collation) = index
                        .columns
                        .iter()
                        .find(|(c, _)| c.as_deref() == Some(*column))?;
                    (!collation.eq_ignore_ascii_case("BINARY")).then(|| {
                        SchemaProblem::KeyCollation {
                            column,
                            found: collation.clone(),
                        }
                    })
                })
                .collect()
        };
        match candidates.first() {
            None => vec![SchemaProblem::MissingPrimaryKey],
            Some(_) if candidates.iter().any(|i| non_binary(i).is_empty()) => Vec::new(),
            Some(first) => non_binary(first),
        }
    }

    /// The columns of `key` whose own collation, declared on the column, compares otherwise
    /// than `BINARY`: the store's lookups (`WHERE idempotency_key = ?`) compare with it,
    /// whatever collation the key's index uses, so `COLLATE NOCASE` on the column would make
    /// `abc` find `ABC`'s record. SQLite exposes a column's collation to no pragma; a compound
    /// `SELECT` takes it from its left-most column (<https://www.sqlite.org/datatype3.html#collation>),
    /// so comparing `'a'` through it with `'A'` tells `NOCASE` and with `'a '` tells `RTRIM`.
    /// Missing columns are left to [`column_problems`](Self::column_problems).
    pub(crate) async fn column_collation_problems(
        &self,
        pool: &SqlitePool,
        table: &TableName,
        key: &[&'static str],
    ) -> Result<Vec<SchemaProblem>, Error> {
        let mut problems = Vec::new();
        for &column in key.iter().filter(|c| self.columns.contains_key(**c)) {
            let probe = format!(
                "SELECT x.c = 'A', x.c = 'a ' FROM ( \
                     SELECT \"{column}\" AS c FROM {} WHERE false UNION ALL SELECT 'a') AS x",
                table.quoted()
            );
            let (nocase, rtrim): (bool, bool) =
                sqlx::query_as(AssertSqlSafe(probe)).fetch_one(pool).await?;
            let found = match (nocase, rtrim) {
                (true, _) => "NOCASE",
                (false, true) => "RTRIM",
                (false, false) => continue,
            };
            problems.push(SchemaProblem::KeyCollation {
                column,
                found: found.to_owned(),
            });
        }
        Ok(problems)
    }

    /// Whether some index has `column` as its first key column.
    pub(crate) fn has_index_leading_with(&self, column: &str) -> bool {
        self.indexes
            .iter()
            .any(|index| index.columns.first().and_then(|(c, _)| c.as_deref()) == Some(column))
    }
}

#[cfg(test)]
mod tests {
    use super::Affinity;

    #[test]
    fn affinity_follows_sqlite_rules() {
        for (declared, affinity) in [
            ("INTEGER", Affinity::Integer),
            ("bigint", Affinity::Integer),
            ("TEXT", Affinity::Text),
            ("VARCHAR(255)", Affinity::Text),
            ("CLOB", Affinity::Text),
            ("", Affinity::Blob),
            ("BLOB", Affinity::Blob),
            ("DOUBLE PRECISION", Affinity::Real),
            ("TIMESTAMP", Affinity::Numeric),
            ("JSON", Affinity::Numeric),
            ("ANY", Affinity::Numeric),
            // SQLite's own quirk: "POINT" contains "INT".
            ("FLOATING POINT", Affinity::Integer),
        ] {
            assert_eq!(Affinity::of(declared), affinity, "{declared}");
        }
    }
}
