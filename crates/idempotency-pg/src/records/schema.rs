//! Schema management: `create` runs the canonical DDL, `validate` compares the live table with it.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::error::{Error, SchemaProblem};
use crate::pooler::{Own, Pooler};
use crate::table::TableName;

/// The canonical DDL template; `{table}`, `{expires_index}` and `{lease_sequence}` are replaced
/// by quoted names.
pub const DDL_TEMPLATE: &str = include_str!("ddl.sql");

/// The canonical DDL for `table`, ready to run or to copy into a migration.
///
/// ```
/// let table = idempotency_pg::TableName::parse("billing.idempotency_records")?;
/// let ddl = idempotency_pg::ddl(&table);
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "billing"."idempotency_records""#));
/// # Ok::<(), idempotency_pg::Error>(())
/// ```
pub fn ddl(table: &TableName) -> String {
    DDL_TEMPLATE
        .replace("{table}", table.quoted())
        .replace("{expires_index}", &table.derived("expires_at_idx"))
        .replace(
            "{lease_sequence}",
            super::lease::lease_sequence(table).quoted(),
        )
}

/// The column list a hash-partitioned records table is partitioned by: the primary key, so the
/// key stays unique across partitions and every statement on one record (they all name the
/// whole key) is planned against one partition.
pub const RECORDS_HASH_PARTITION_KEY: &str = "operation, scope, idempotency_key";

/// The canonical DDL of a records table hash-partitioned into `partitions` partitions
/// (`<table>_h0` ..), partitioned by [`RECORDS_HASH_PARTITION_KEY`]; ready to run or to copy
/// into a migration. The store then runs on it unchanged (`schema.mode: validate` accepts it;
/// `create` runs the plain DDL, which leaves an existing table alone).
///
/// Why hash and not time: a unique constraint on a partitioned table must include the
/// partition key. Range partitions by `created_at` would make the key
/// `(operation, scope, idempotency_key, created_at)`, unique only within a partition, so a
/// retry landing in a later partition would run the action a second time. Hash partitioning
/// by the key columns keeps the key as it is; expired records are still removed by the
/// batched cleanup, not by dropping partitions.
///
/// ```
/// use std::num::NonZeroU16;
///
/// let table = idempotency_pg::TableName::parse("billing.idempotency_records")?;
/// let ddl = idempotency_pg::records_hash_partitioned_ddl(&table, NonZeroU16::new(8).unwrap());
/// assert!(ddl.contains("PARTITION BY HASH (operation, scope, idempotency_key)"));
/// assert!(ddl.contains(
///     r#""billing"."idempotency_records_h7" PARTITION OF "billing"."idempotency_records" FOR VALUES WITH (MODULUS 8, REMAINDER 7)"#
/// ));
/// # Ok::<(), idempotency_pg::Error>(())
/// ```
pub fn records_hash_partitioned_ddl(table: &TableName, partitions: std::num::NonZeroU16) -> String {
    let plain = ddl(table);
    let (create, rest) = plain.split_once("\n);\n").unwrap_or((plain.as_str(), ""));
    let mut out = format!(
        "{create}\n) PARTITION BY HASH ({RECORDS_HASH_PARTITION_KEY});\n\n\
         -- One partition per remainder; a lookup by the whole key touches one of them.\n"
    );
    let modulus = partitions.get();
    for remainder in 0..modulus {
        let partition = table.sibling_with_whole_suffix(&format!("h{remainder}"));
        out.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF {} \
             FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder});\n",
            partition.quoted(),
            table.quoted()
        ));
    }
    out.push_str(rest);
    out
}

/// Sent first in the transaction that runs a `create`: no NOTICE for what already exists.
pub(crate) const QUIET: &str = "SET LOCAL client_min_messages = warning";

/// Runs the DDL when the table or its index is missing; nothing when both exist.
///
/// The catalog is read first, without a lock on the table: `CREATE INDEX IF NOT EXISTS` takes a
/// SHARE lock on the table even when the index exists, so running the DDL at every start would
/// make an instance restarting under load wait for the longest open write transaction on the
/// table, and every writer arriving meanwhile wait behind it.
pub(crate) async fn create(pool: &PgPool, pooler: Pooler, table: &TableName) -> Result<(), Error> {
    let objects = [
        table.quoted().to_owned(),
        table.sibling("expires_at_idx").quoted().to_owned(),
    ];
    let mut own = Own::open(pool, pooler).await?;
    let exist = crate::table::all_exist(&mut own, &objects).await?;
    // A table of an earlier release gets the trace columns (once: an `ALTER TABLE` waits for
    // every open transaction on the table).
    let lacks_trace = exist && lacks_trace_columns(&mut own, table).await?;
    own.finish().await?;
    if exist && !lacks_trace {
        return Ok(());
    }
    // Concurrent `CREATE TABLE IF NOT EXISTS` can still collide in the catalog; serialize
    // instances starting at once on an advisory lock named after the table.
    let mut tx = crate::begin(pool).await?;
    // Over existing tables every `IF NOT EXISTS` answers a NOTICE ("already exists, skipping"),
    // which sqlx logs; the transaction keeps warnings and errors only.
    sqlx::raw_sql(QUIET).execute(&mut *tx).await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .persistent(false)
        .bind(table.quoted())
        .execute(&mut *tx)
        .await?;
    // An instance starting at the same time may have created both meanwhile.
    if !crate::table::all_exist(&mut tx, &objects).await? {
        sqlx::raw_sql(AssertSqlSafe(ddl(table)))
            .execute(&mut *tx)
            .await?;
    } else if lacks_trace_columns(&mut tx, table).await? {
        sqlx::raw_sql(AssertSqlSafe(trace_ddl(table)))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

struct Expected {
    column: &'static str,
    types: &'static [&'static str],
    type_label: &'static str,
    nullable: bool,
    min_len: Option<i32>,
}

const TEXT: &[&str] = &["varchar", "text"];

const EXPECTED: &[Expected] = &[
    Expected {
        column: "operation",
        types: TEXT,
        type_label: "varchar(128)",
        nullable: false,
        min_len: Some(128),
    },
    Expected {
        column: "scope",
        types: TEXT,
        type_label: "varchar(255)",
        nullable: false,
        min_len: Some(255),
    },
    Expected {
        column: "idempotency_key",
        types: TEXT,
        type_label: "varchar(255)",
        nullable: false,
        min_len: Some(255),
    },
    Expected {
        column: "request_hash",
        types: TEXT,
        type_label: "varchar(128)",
        nullable: false,
        min_len: Some(128),
    },
    Expected {
        column: "status",
        types: TEXT,
        type_label: "varchar(32)",
        nullable: false,
        min_len: Some(10),
    },
    Expected {
        column: "result_payload",
        types: &["json"],
        type_label: "json",
        nullable: true,
        min_len: None,
    },
    Expected {
        column: "error_code",
        types: TEXT,
        type_label: "varchar(128)",
        nullable: true,
        min_len: None,
    },
    Expected {
        column: "created_at",
        types: &["timestamptz"],
        type_label: "timestamptz",
        nullable: false,
        min_len: None,
    },
    Expected {
        column: "completed_at",
        types: &["timestamptz"],
        type_label: "timestamptz",
        nullable: true,
        min_len: None,
    },
    Expected {
        column: "expires_at",
        types: &["timestamptz"],
        type_label: "timestamptz",
        nullable: true,
        min_len: None,
    },
    Expected {
        column: "trace_id",
        types: TEXT,
        type_label: "varchar(32)",
        nullable: true,
        min_len: Some(32),
    },
    Expected {
        column: "span_id",
        types: TEXT,
        type_label: "varchar(16)",
        nullable: true,
        min_len: Some(16),
    },
];

/// The columns that keep the span of the execution that stored a record (a later release than
/// the table's first), and the migration that adds them.
const TRACE_COLUMNS: [&str; 2] = ["trace_id", "span_id"];

/// The migration that adds [`TRACE_COLUMNS`], under `migrations/`.
pub(crate) const TRACE_MIGRATION: &str = "20261206000001_idempotency_trace.sql";

/// Adds the trace columns to a table of an earlier release; idempotent.
pub(crate) fn trace_ddl(table: &TableName) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS trace_id VARCHAR(32), \
                        ADD COLUMN IF NOT EXISTS span_id VARCHAR(16)",
        table.quoted()
    )
}

/// Whether the table lacks one of the trace columns.
async fn lacks_trace_columns(conn: &mut PgConnection, table: &TableName) -> Result<bool, Error> {
    let present: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
           AND a.attname = ANY($2)",
    )
    .bind(table.quoted())
    .bind(&TRACE_COLUMNS[..])
    .persistent(false)
    .fetch_one(&mut *conn)
    .await?;
    Ok(present < TRACE_COLUMNS.len() as i64)
}

const KEY_COLUMNS: [&str; 3] = ["idempotency_key", "operation", "scope"];

/// The key of the Spring Boot idempotency starter's table, sorted.
const STARTER_KEY_COLUMNS: [&str; 2] = ["idempotency_key", "operation"];

/// The migration from the starter's table to the canonical one, under `migrations/`.
const STARTER_MIGRATION: &str = "20261201120000_idempotency_from_starter.sql";

/// The starter's columns: no `scope`, a `result_type`, the payload as `jsonb` (or already `json`,
/// after the payload migration), and every other canonical column.
fn is_starter_table(columns: &HashMap<String, (String, bool, Option<i32>)>) -> bool {
    !columns.contains_key("scope")
        && columns.contains_key("result_type")
        && columns
            .get("result_payload")
            .is_some_and(|(ty, _, _)| ty == "jsonb" || ty == "json")
        && EXPECTED.iter().all(|e| {
            e.column == "scope"
                || TRACE_COLUMNS.contains(&e.column)
                || columns.contains_key(e.column)
        })
}

/// Everything that differs between the live table and the canonical schema.
pub(crate) async fn problems(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, Error> {
    let mut own = Own::open(pool, pooler).await?;
    let problems = problems_on(&mut own, table).await?;
    own.finish().await?;
    Ok(problems)
}

async fn problems_on(
    conn: &mut PgConnection,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, Error> {
    let exists: Option<bool> = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table.quoted())
        .persistent(false)
        .fetch_one(&mut *conn)
        .await?;
    if exists != Some(true) {
        return Ok(vec![SchemaProblem::MissingTable]);
    }
    let columns: Vec<(String, String, bool, Option<i32>)> = sqlx::query_as(
        "SELECT a.attname::text, t.typname::text, a.attnotnull, \
                CASE WHEN t.typname = 'varchar' AND a.atttypmod > 4 THEN a.atttypmod - 4 END \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(table.quoted())
    .persistent(false)
    .fetch_all(&mut *conn)
    .await?;
    let columns: HashMap<String, (String, bool, Option<i32>)> = columns
        .into_iter()
        .map(|(name, ty, not_null, len)| (name, (ty, not_null, len)))
        .collect();

    let indexes: Vec<(bool, bool, Vec<String>)> = sqlx::query_as(
        "SELECT i.indisunique, (i.indpred IS NULL AND i.indexprs IS NULL), \
                ARRAY(SELECT a.attname::text \
                      FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                      ORDER BY k.ord) \
         FROM pg_index i WHERE i.indrelid = to_regclass($1)",
    )
    .bind(table.quoted())
    .persistent(false)
    .fetch_all(&mut *conn)
    .await?;
    let unique_on = |key: &[&str]| {
        indexes.iter().any(|(unique, plain, columns)| {
            let mut sorted: Vec<&str> = columns.iter().map(String::as_str).collect();
            sorted.sort_unstable();
            *unique && *plain && sorted == key
        })
    };

    if is_starter_table(&columns) && unique_on(&STARTER_KEY_COLUMNS) {
        return Ok(vec![SchemaProblem::StarterTable {
            migration: STARTER_MIGRATION,
        }]);
    }

    let mut problems = Vec::new();
    for expected in EXPECTED {
        let Some((ty, not_null, len)) = columns.get(expected.column) else {
            problems.push(SchemaProblem::MissingColumn {
                column: expected.column,
            });
            continue;
        };
        if expected.column == "result_payload" && ty == "jsonb" {
            problems.push(SchemaProblem::JsonbPayload);
            continue;
        }
        if !expected.types.contains(&ty.as_str()) {
            problems.push(SchemaProblem::WrongType {
                column: expected.column,
                expected: expected.type_label,
                found: ty.clone(),
            });
            continue;
        }
        if let (Some(min), Some(found)) = (expected.min_len, len)
            && *found < min
        {
            problems.push(SchemaProblem::TooShort {
                column: expected.column,
                min,
                found: *found,
            });
        }
        if expected.nullable == *not_null {
            problems.push(SchemaProblem::Nullability {
                column: expected.column,
                nullable: expected.nullable,
            });
        }
    }

    // A nondeterministic collation (case- or accent-insensitive) would make the primary key
    // merge keys that differ only in case: one tenant would replay another's response.
    let collations: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.attname::text, c.collname::text \
         FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
           AND a.attname = ANY($2) AND NOT c.collisdeterministic",
    )
    .bind(table.quoted())
    .bind(&KEY_COLUMNS[..])
    .persistent(false)
    .fetch_all(&mut *conn)
    .await?;
    for (column, collation) in collations {
        if let Some(column) = KEY_COLUMNS.iter().find(|c| **c == column) {
            problems.push(SchemaProblem::NondeterministicCollation { column, collation });
        }
    }

    if !unique_on(&KEY_COLUMNS) {
        problems.push(SchemaProblem::MissingPrimaryKey);
    }
    if !indexes
        .iter()
        .any(|(_, _, columns)| columns.first().map(String::as_str) == Some("expires_at"))
    {
        problems.push(SchemaProblem::MissingExpiryIndex);
    }
    Ok(problems)
}

/// The columns leased claims add to the records table.
const LEASE_COLUMNS: [&str; 2] = ["lease_token", "lease_expires_at"];

/// What leased claims need and the table lacks: the lease columns and the token sequence.
pub(crate) async fn lease_problems(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, sqlx::Error> {
    let mut own = Own::open(pool, pooler).await?;
    let problems = lease_problems_on(&mut own, table).await?;
    own.finish().await?;
    Ok(problems)
}

async fn lease_problems_on(
    conn: &mut PgConnection,
    table: &TableName,
) -> Result<Vec<SchemaProblem>, sqlx::Error> {
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
           AND a.attname = ANY($2)",
    )
    .bind(table.quoted())
    .bind(&LEASE_COLUMNS[..])
    .persistent(false)
    .fetch_all(&mut *conn)
    .await?;
    let mut problems: Vec<SchemaProblem> = LEASE_COLUMNS
        .iter()
        .filter(|column| !present.iter().any(|p| p == *column))
        .map(|column| SchemaProblem::MissingColumn { column })
        .collect();
    let sequence = super::lease::lease_sequence(table);
    if !crate::table::all_exist(&mut *conn, &[sequence.quoted().to_owned()]).await? {
        problems.push(SchemaProblem::MissingLeaseSequence {
            sequence: sequence.to_string(),
        });
    }
    Ok(problems)
}

/// What leased claims need and the table lacks, as a schema error naming each.
pub(crate) async fn validate_leases(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
) -> Result<(), Error> {
    let problems = lease_problems(pool, pooler, table).await?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema {
            table: table.to_string(),
            problems,
        })
    }
}

pub(crate) async fn validate(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
) -> Result<(), Error> {
    let problems = problems(pool, pooler, table).await?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Schema {
            table: table.to_string(),
            problems,
        })
    }
}
