//! Schema management: `create` runs the canonical DDL, `validate` compares live tables with it.

use std::collections::HashMap;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::outbox::error::outbox_error;
use crate::pooler::{Own, Pooler};
use crate::table::TableName;
use idempotency_outbox::{Error, SchemaProblem};

/// The outbox DDL template: `{table}`, `{sequences}`, `{pending_index}`, `{aggregate_index}`,
/// `{published_index}` and `{dead_letter_index}` are replaced by quoted names.
pub const OUTBOX_DDL_TEMPLATE: &str =
    concat!(include_str!("ddl.sql"), include_str!("ddl_shared.sql"));

/// The canonical outbox DDL for `table` (and its `<table>_sequences` counters).
///
/// ```
/// let table = idempotency_pg::TableName::parse("billing.outbox")?;
/// let ddl = idempotency_pg::outbox_ddl(&table);
/// assert!(ddl.contains(r#"CREATE TABLE IF NOT EXISTS "billing"."outbox_sequences""#));
/// # Ok::<(), idempotency_pg::Error>(())
/// ```
pub fn outbox_ddl(table: &TableName) -> String {
    OutboxNames::new(table, false).fill(table, OUTBOX_DDL_TEMPLATE)
}

/// The names of the objects an outbox layout derives from its table, distinct from each other
/// and from the table ([`TableName::derived_names`]), in the order they have always been
/// created: the counters, the default partition (partitioned layout), the indexes.
pub(crate) struct OutboxNames {
    sequences: TableName,
    default_partition: Option<TableName>,
    /// Quoted, in the table's schema (an index lives in its table's schema).
    indexes: [String; 4],
}

const INDEX_SUFFIXES: [&str; 4] = [
    "pending_idx",
    "aggregate_idx",
    "published_idx",
    "dead_letter_idx",
];

impl OutboxNames {
    pub(crate) fn new(table: &TableName, partitioned: bool) -> Self {
        let mut suffixes = vec!["sequences"];
        if partitioned {
            suffixes.push("default");
        }
        suffixes.extend(INDEX_SUFFIXES);
        let mut names = table.derived_names(&suffixes).into_iter();
        let mut sibling = || {
            let name = names.next().unwrap_or_default();
            TableName::from_parts(table.schema().map(str::to_owned), name)
        };
        let sequences = sibling();
        let default_partition = partitioned.then(&mut sibling);
        let indexes = [(); 4].map(|()| sibling().name().to_owned());
        Self {
            sequences,
            default_partition,
            indexes: indexes.map(|name| format!("\"{name}\"")),
        }
    }

    /// `template` with `table` and every derived name placed.
    fn fill(&self, table: &TableName, template: &str) -> String {
        let [pending, aggregate, published, dead_letter] = &self.indexes;
        let mut ddl = template
            .replace("{table}", table.quoted())
            .replace("{sequences}", self.sequences.quoted())
            .replace("{pending_index}", pending)
            .replace("{aggregate_index}", aggregate)
            .replace("{published_index}", published)
            .replace("{dead_letter_index}", dead_letter);
        if let Some(default) = &self.default_partition {
            ddl = ddl.replace("{default_partition}", default.quoted());
        }
        ddl
    }

    /// The quoted, schema-qualified names of the tables and indexes the DDL creates, the
    /// outbox table's included.
    pub(crate) fn objects(&self, table: &TableName) -> Vec<String> {
        let mut objects = vec![
            table.quoted().to_owned(),
            self.sequences.quoted().to_owned(),
        ];
        objects.extend(self.default_partition.iter().map(|d| d.quoted().to_owned()));
        for index in &self.indexes {
            objects.push(match table.schema() {
                Some(schema) => format!("\"{schema}\".{index}"),
                None => index.clone(),
            });
        }
        objects
    }
}

/// The partitioned outbox DDL template (`outbox.partitioning.enabled`): as
/// [`OUTBOX_DDL_TEMPLATE`], the table partitioned by `RANGE (created_at)` with the primary key
/// `(id, created_at)`, and `{default_partition}` the `DEFAULT` partition.
pub const OUTBOX_PARTITIONED_DDL_TEMPLATE: &str = concat!(
    include_str!("ddl_partitioned.sql"),
    include_str!("ddl_shared.sql")
);

/// The canonical DDL of a time-partitioned outbox `table`: the parent partitioned by
/// `RANGE (created_at)`, its `<table>_default` partition, the indexes (created on every
/// partition) and the `<table>_sequences` counters. The partitions of each interval are not
/// in it: [`PgOutbox::prepare_partitions`](crate::PgOutbox::prepare_partitions) creates them
/// (and `create_schema` calls it).
///
/// ```
/// let table = idempotency_pg::TableName::parse("billing.outbox")?;
/// let ddl = idempotency_pg::outbox_partitioned_ddl(&table);
/// assert!(ddl.contains("PRIMARY KEY (id, created_at)"));
/// assert!(ddl.contains(r#""billing"."outbox_default" PARTITION OF "billing"."outbox" DEFAULT"#));
/// # Ok::<(), idempotency_pg::Error>(())
/// ```
pub fn outbox_partitioned_ddl(table: &TableName) -> String {
    OutboxNames::new(table, true).fill(table, OUTBOX_PARTITIONED_DDL_TEMPLATE)
}

/// `RANGE (created_at)`, as the catalog describes the partitioned layout.
const PARTITIONED: &str = "partitioned by RANGE (created_at)";
const PLAIN: &str = "a plain table";

/// A layout problem: `table` (which exists) is plain where `partitioned` is wanted, or the
/// reverse, or partitioned by another key.
pub(crate) async fn layout_problem(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
    partitioned: bool,
) -> Result<Option<SchemaProblem>, Error> {
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let row: Option<(String, Option<String>)> = sqlx::query_as(
        "SELECT c.relkind::text,                 (SELECT p.partstrat::text || ':' ||                         array_to_string(ARRAY(SELECT a.attname::text                             FROM unnest(p.partattrs::int2[]) AS k(attnum)                             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum), ',')                  FROM pg_partitioned_table p WHERE p.partrelid = c.oid)          FROM pg_class c WHERE c.oid = to_regclass($1)",
    )
    .persistent(false)
    .bind(table.quoted())
    .fetch_optional(&mut *own)
    .await
    .map_err(outbox_error)?;
    own.finish().await.map_err(outbox_error)?;
    let Some((kind, key)) = row else {
        return Ok(None);
    };
    let found = match (kind.as_str(), key.as_deref()) {
        ("p", Some("r:created_at")) if partitioned => return Ok(None),
        ("p", Some(key)) => match key.split_once(':') {
            Some((strategy, columns)) => {
                let strategy = match strategy {
                    "r" => "RANGE",
                    "l" => "LIST",
                    "h" => "HASH",
                    other => other,
                };
                format!("partitioned by {strategy} ({columns})")
            }
            None => "partitioned".to_owned(),
        },
        ("p", None) => "partitioned".to_owned(),
        _ if !partitioned => return Ok(None),
        _ => PLAIN.to_owned(),
    };
    Ok(Some(SchemaProblem::Layout {
        table: table.to_string(),
        expected: if partitioned { PARTITIONED } else { PLAIN },
        found,
    }))
}

/// Creates what `objects` (the quoted names of the tables and indexes `ddl` creates) finds
/// missing by running `ddl`; nothing when all exist.
///
/// The catalog is read first, without a lock on the tables: `CREATE INDEX IF NOT EXISTS` takes
/// a SHARE lock on its table even when the index exists, so running the DDL at every start
/// would make an instance restarting under load wait for the longest open write transaction
/// on the table, and every writer arriving meanwhile wait behind it.
pub(crate) async fn create(
    pool: &PgPool,
    pooler: Pooler,
    lock_name: &TableName,
    objects: &[String],
    ddl: String,
) -> Result<(), Error> {
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let exist = crate::table::all_exist(&mut own, objects)
        .await
        .map_err(outbox_error)?;
    own.finish().await.map_err(outbox_error)?;
    if exist {
        return Ok(());
    }
    // Concurrent `CREATE ... IF NOT EXISTS` can still collide in the catalog; serialize
    // instances starting at once on an advisory lock named after the table.
    let mut tx = crate::begin(pool).await.map_err(outbox_error)?;
    // No NOTICE per existing table and index ("already exists, skipping").
    sqlx::raw_sql(crate::records::QUIET)
        .execute(&mut *tx)
        .await
        .map_err(outbox_error)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .persistent(false)
        .bind(lock_name.quoted())
        .execute(&mut *tx)
        .await
        .map_err(outbox_error)?;
    // An instance starting at the same time may have created everything meanwhile.
    if !crate::table::all_exist(&mut tx, objects)
        .await
        .map_err(outbox_error)?
    {
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&mut *tx)
            .await
            .map_err(outbox_error)?;
    }
    tx.commit().await.map_err(outbox_error)?;
    Ok(())
}

pub(crate) struct Column {
    pub(crate) name: &'static str,
    pub(crate) types: &'static [&'static str],
    pub(crate) label: &'static str,
    pub(crate) nullable: bool,
}

pub(crate) const fn col(
    name: &'static str,
    types: &'static [&'static str],
    label: &'static str,
    nullable: bool,
) -> Column {
    Column {
        name,
        types,
        label,
        nullable,
    }
}

pub(crate) const TEXT: &[&str] = &["varchar", "text"];
pub(crate) const TIME: &[&str] = &["timestamptz"];
const UUID: &[&str] = &["uuid"];
const JSON: &[&str] = &["json"];

/// A column type an older version of the schema used, and the migration that converts it.
struct Outdated {
    column: &'static str,
    found: &'static str,
    reason: &'static str,
    migration: &'static str,
}

const OUTDATED: &[Outdated] = &[
    Outdated {
        column: "payload",
        found: "jsonb",
        reason: JSONB_REASON,
        migration: JSON_MIGRATION,
    },
    Outdated {
        column: "headers",
        found: "jsonb",
        reason: JSONB_REASON,
        migration: JSON_MIGRATION,
    },
];

const JSONB_REASON: &str = "jsonb reorders keys, rewrites numbers and refuses \\u0000, so \
     the relay would not publish the bytes that were enqueued";
const JSON_MIGRATION: &str = "20261201083000_outbox_json.sql";

fn wrong_type(table: &str, expected: &Column, found: &str) -> SchemaProblem {
    match OUTDATED
        .iter()
        .find(|old| old.column == expected.name && old.found == found)
    {
        Some(old) => SchemaProblem::OutdatedType {
            table: table.to_owned(),
            column: expected.name,
            expected: expected.label,
            found: found.to_owned(),
            reason: old.reason,
            migration: old.migration,
        },
        None => SchemaProblem::WrongType {
            table: table.to_owned(),
            column: expected.name,
            expected: expected.label,
            found: found.to_owned(),
        },
    }
}

pub(crate) const OUTBOX_COLUMNS: &[Column] = &[
    col("id", UUID, "uuid", false),
    col("aggregate_type", TEXT, "varchar(255)", false),
    col("aggregate_id", TEXT, "varchar(255)", false),
    col("sequence", &["int8"], "bigint", true),
    col("event_type", TEXT, "varchar(255)", false),
    col("payload", JSON, "json", false),
    col("headers", JSON, "json", false),
    col("created_at", TIME, "timestamptz", false),
    col("attempts", &["int4"], "integer", false),
    col("next_attempt_at", TIME, "timestamptz", false),
    col("claim_token", UUID, "uuid", true),
    col("last_error", TEXT, "varchar(1000)", true),
    col("published_at", TIME, "timestamptz", true),
    col("dead_lettered_at", TIME, "timestamptz", true),
];

pub(crate) const SEQUENCE_COLUMNS: &[Column] = &[
    col("aggregate_type", TEXT, "varchar(255)", false),
    col("aggregate_id", TEXT, "varchar(255)", false),
    col("last_sequence", &["int8"], "bigint", false),
];

/// An index the store needs: `unique` on exactly `columns` (any order), or a plain or partial
/// index leading with `columns[0]` (partial when `partial`).
#[derive(Clone, Copy)]
pub(crate) struct Index {
    pub(crate) purpose: &'static str,
    pub(crate) columns: &'static [&'static str],
    pub(crate) unique: bool,
    pub(crate) partial: bool,
}

/// One row of `pg_index`: unique, partial, the columns in order.
type IndexRow = (bool, bool, Vec<String>);

fn satisfies(index: &Index, (unique, partial, columns): &IndexRow) -> bool {
    if index.unique {
        let mut have: Vec<&str> = columns.iter().map(String::as_str).collect();
        let mut want = index.columns.to_vec();
        have.sort_unstable();
        want.sort_unstable();
        *unique && !*partial && have == want
    } else {
        let leading = columns.iter().map(String::as_str);
        *partial == index.partial
            && index.columns.len() <= columns.len()
            && leading.zip(index.columns).all(|(a, b)| a == *b)
    }
}

/// Every difference between `table` and `columns` / `indexes`.
pub(crate) async fn problems(
    pool: &PgPool,
    pooler: Pooler,
    table: &TableName,
    columns: &[Column],
    indexes: &[Index],
) -> Result<Vec<SchemaProblem>, Error> {
    let mut own = Own::open(pool, pooler).await.map_err(outbox_error)?;
    let problems = problems_on(&mut own, table, columns, indexes).await?;
    own.finish().await.map_err(outbox_error)?;
    Ok(problems)
}

async fn problems_on(
    conn: &mut PgConnection,
    table: &TableName,
    columns: &[Column],
    indexes: &[Index],
) -> Result<Vec<SchemaProblem>, Error> {
    let name = table.to_string();
    let exists: Option<bool> = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table.quoted())
        .persistent(false)
        .fetch_one(&mut *conn)
        .await
        .map_err(outbox_error)?;
    if exists != Some(true) {
        return Ok(vec![SchemaProblem::MissingTable { table: name }]);
    }
    let live: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT a.attname::text, t.typname::text, a.attnotnull \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(table.quoted())
    .persistent(false)
    .fetch_all(&mut *conn)
    .await
    .map_err(outbox_error)?;
    let live: HashMap<String, (String, bool)> = live
        .into_iter()
        .map(|(column, ty, not_null)| (column, (ty, not_null)))
        .collect();
    let mut problems = Vec::new();
    for expected in columns {
        let Some((ty, not_null)) = live.get(expected.name) else {
            problems.push(SchemaProblem::MissingColumn {
                table: name.clone(),
                column: expected.name,
            });
            continue;
        };
        if !expected.types.contains(&ty.as_str()) {
            problems.push(wrong_type(&name, expected, ty));
        } else if expected.nullable == *not_null {
            problems.push(SchemaProblem::Nullability {
                table: name.clone(),
                column: expected.name,
                nullable: expected.nullable,
            });
        }
    }
    let live: Vec<IndexRow> = sqlx::query_as(
        "SELECT i.indisunique, i.indpred IS NOT NULL, \
                ARRAY(SELECT a.attname::text \
                      FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                      ORDER BY k.ord) \
         FROM pg_index i WHERE i.indrelid = to_regclass($1)",
    )
    .bind(table.quoted())
    .persistent(false)
    .fetch_all(&mut *conn)
    .await
    .map_err(outbox_error)?;
    for index in indexes {
        if !live.iter().any(|row| satisfies(index, row)) {
            problems.push(SchemaProblem::MissingIndex {
                table: name.clone(),
                purpose: index.purpose,
            });
        }
    }
    Ok(problems)
}

pub(crate) const OUTBOX_INDEXES: &[Index] = &[
    Index {
        purpose: "primary key on (id)",
        columns: &["id"],
        unique: true,
        partial: false,
    },
    Index {
        purpose: "on pending rows by (next_attempt_at), used to claim",
        columns: &["next_attempt_at"],
        unique: false,
        partial: true,
    },
    Index {
        purpose: "on pending rows by (aggregate_type, aggregate_id, sequence), used for order",
        columns: &["aggregate_type", "aggregate_id", "sequence"],
        unique: false,
        partial: true,
    },
    Index {
        purpose: "on published rows by (published_at), used by retention",
        columns: &["published_at"],
        unique: false,
        partial: true,
    },
    Index {
        purpose: "on dead letters by (dead_lettered_at)",
        columns: &["dead_lettered_at"],
        unique: false,
        partial: true,
    },
];

/// The indexes of the partitioned layout: the primary key includes the partition key.
pub(crate) const PARTITIONED_OUTBOX_INDEXES: &[Index] = &[
    Index {
        purpose: "primary key on (id, created_at)",
        columns: &["id", "created_at"],
        unique: true,
        partial: false,
    },
    OUTBOX_INDEXES[1],
    OUTBOX_INDEXES[2],
    OUTBOX_INDEXES[3],
    OUTBOX_INDEXES[4],
];

pub(crate) const SEQUENCE_INDEXES: &[Index] = &[Index {
    purpose: "primary key on (aggregate_type, aggregate_id)",
    columns: &["aggregate_type", "aggregate_id"],
    unique: true,
    partial: false,
}];
