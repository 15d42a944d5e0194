//! The transactional outbox on MySQL / MariaDB: [`MysqlOutbox`], its statements and its schema.

mod error;
pub(crate) mod row;
pub(crate) mod schema;
pub(crate) mod statements;
mod store;

use std::collections::BTreeMap;
use std::sync::Arc;

use idempotency_core::config::SchemaMode;
use idempotency_outbox::config::{Ordering, OutboxConfig};
use idempotency_outbox::{Error, NewEvent, SchemaProblem};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, MySql, MySqlConnection, MySqlPool};
use uuid::Uuid;

pub(crate) use error::{from_crate_error, in_transaction_error, outbox_error};
pub use schema::{OUTBOX_DDL_TEMPLATE, outbox_ddl};

use crate::CHUNK;
use crate::connect::{self, in_transaction};
use crate::error::{InTransaction, TransactionRolledBack};
use crate::table::TableName;
use schema::Names;
use statements::Statements;

/// Wraps an ordered enqueue: a failure undoes the counters it bumped, and the caller's
/// transaction goes on as if the call had not happened (MySQL undoes only the failed statement
/// otherwise). The rollback to it right away fails (1305) when the session is not in a
/// transaction any more (the server rolled it back, e.g. after a deadlock), in the same round
/// trip.
const SAVEPOINT: &str = "SAVEPOINT idempotency_outbox_enqueue; \
     ROLLBACK TO SAVEPOINT idempotency_outbox_enqueue";
const RELEASE: &str = "RELEASE SAVEPOINT idempotency_outbox_enqueue";
const ROLLBACK_TO: &str = "ROLLBACK TO SAVEPOINT idempotency_outbox_enqueue";

/// Refuses a value that ends with a space. The key columns' collation, `utf8mb4_bin`, is
/// PAD SPACE: `m-1` and `m-1 ` compare equal, so an inbox entry or an aggregate's sequence
/// counter would be shared by two values the caller tells apart.
pub(crate) fn refuse_trailing_space(what: &str, value: &str) -> Result<(), Error> {
    if value.ends_with(' ') {
        return Err(Error::InvalidEvent {
            reason: format!(
                "the {what} {value:?} ends with a space, which MySQL's PAD SPACE collation \
                 (utf8mb4_bin) ignores: it would be the same {what} as without the space"
            ),
        });
    }
    Ok(())
}

/// The lock name of the single-relay mode, as in the outbox pattern's MySQL recipe.
pub const DEFAULT_RELAY_LOCK: &str = "outbox-relay";

/// The single-relay mode: the connection holding `GET_LOCK(name, 0)`, when this process
/// holds it.
#[derive(Debug)]
struct SingleRelay {
    name: String,
    holder: tokio::sync::Mutex<Option<PoolConnection<MySql>>>,
}

impl Drop for SingleRelay {
    /// Closes the lock's connection instead of handing it back to the pool, where it would
    /// keep the lock with no relay behind it.
    fn drop(&mut self) {
        if let Some(conn) = self.holder.get_mut().take() {
            drop(conn.detach());
        }
    }
}

/// The MySQL / MariaDB outbox: enqueue through the caller's connection, in the caller's
/// transaction, and the store a [`Relay`](idempotency_outbox::Relay) claims from (`FOR UPDATE
/// SKIP LOCKED`, so several relay workers and processes share the rows). Cheap to clone: the
/// pool and the statements are shared.
///
/// MySQL has no `LISTEN`/`NOTIFY`: relays find new rows by polling (`listen` returns `None`),
/// so an event waits on average half of `relay.poll-interval` before its claim.
///
/// ```no_run
/// # async fn demo(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_core::config::SchemaMode;
/// use idempotency_mysql::MysqlOutbox;
/// use idempotency_outbox::NewEvent;
/// use idempotency_outbox::config::OutboxConfig;
///
/// let mut config = OutboxConfig::default();
/// config.schema.mode = SchemaMode::Create;
/// let outbox = MysqlOutbox::from_config(pool.clone(), &config).await?;
///
/// let mut tx = idempotency_mysql::begin(&pool).await?; // pool.begin(), safe to cancel
/// // ... business statements on &mut *tx ...
/// let event = NewEvent::new("charge", "ch_1", "ChargeCreated", &serde_json::json!({"amountCents": 4900}))?;
/// outbox.enqueue(&mut tx, &event).await?;
/// tx.commit().await?; // the event becomes visible to the relay's next poll
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MysqlOutbox {
    pool: MySqlPool,
    names: Arc<Names>,
    ordering: Ordering,
    sql: Arc<Statements>,
    single_relay: Option<Arc<SingleRelay>>,
}

impl MysqlOutbox {
    /// An outbox on `table` (its counters in `<table>_sequences`) with the given ordering; the
    /// schema is not touched. Fails when `table` is longer than 54 bytes (`<table>_sequences`
    /// must fit MySQL's 64).
    pub fn with_options(
        pool: MySqlPool,
        table: TableName,
        ordering: Ordering,
    ) -> Result<Self, Error> {
        let names = Names::new(table)?;
        Ok(Self {
            pool,
            sql: Arc::new(Statements::new(&names)),
            names: Arc::new(names),
            ordering,
            single_relay: None,
        })
    }

    /// An outbox configured by the `outbox` section: validates `table-name` (`name` or
    /// `database.name`), refuses servers older than MySQL 8.0.16 or MariaDB 10.6 (no
    /// `SKIP LOCKED`, or `CHECK` constraints not enforced) with [`Error::InvalidConfig`], takes `ordering`, then applies
    /// `schema.mode`. `notify-channel` has no meaning on MySQL and is ignored; the relay
    /// settings are read by the [`Relay`](idempotency_outbox::Relay).
    pub async fn from_config(pool: MySqlPool, config: &OutboxConfig) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name).map_err(from_crate_error)?;
        let outbox = Self::with_options(pool, table, config.ordering)?;
        connect::check_server(&outbox.pool)
            .await
            .map_err(from_crate_error)?;
        outbox.apply_schema(config.schema.mode).await?;
        Ok(outbox)
    }

    /// The single-relay mode: every claim first needs the named lock `GET_LOCK(name, 0)`,
    /// taken on a connection this outbox then keeps for its claims. The process holding it
    /// claims; the others' claims return nothing at once and they keep polling, so one of
    /// them takes over within a poll interval when the holder's connection ends (the server
    /// releases the lock with its session). Use it to keep one relay process active among
    /// several; `SKIP LOCKED` alone already lets them share the rows. `name` is at most 64
    /// characters ([`DEFAULT_RELAY_LOCK`] is the recipe's `outbox-relay`; name one per
    /// outbox table when several share a server).
    pub fn with_single_relay(mut self, name: &str) -> Result<Self, Error> {
        if name.is_empty() || name.chars().count() > 64 {
            return Err(Error::InvalidName {
                what: "relay lock name",
                name: name.to_owned(),
                reason: "1 to 64 characters (MySQL's limit for GET_LOCK names)",
            });
        }
        self.single_relay = Some(Arc::new(SingleRelay {
            name: name.to_owned(),
            holder: tokio::sync::Mutex::new(None),
        }));
        Ok(self)
    }

    /// `create` runs the canonical DDL, `validate` checks the tables, `none` does nothing.
    pub async fn apply_schema(&self, mode: SchemaMode) -> Result<(), Error> {
        match mode {
            SchemaMode::Create => self.create_schema().await,
            SchemaMode::Validate => self.validate_schema().await,
            SchemaMode::None => Ok(()),
        }
    }

    /// Runs the canonical DDL ([`outbox_ddl`](crate::outbox_ddl)); safe to run again and from
    /// several instances at once.
    pub async fn create_schema(&self) -> Result<(), Error> {
        schema::create(&self.pool, &schema::ddl_for(&self.names)).await
    }

    /// Checks both tables (columns, types, lengths, nullability, key collations, the keys and
    /// the indexes the queries rely on), failing with [`Error::Schema`] naming every
    /// difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        schema::check(&self.names.table, self.schema_problems().await?)
    }

    /// Every difference between the tables and the canonical schema (empty when they match).
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        let mut problems = schema::problems(&self.pool, &self.names.table, &schema::OUTBOX).await?;
        problems
            .extend(schema::problems(&self.pool, &self.names.sequences, &schema::SEQUENCES).await?);
        Ok(problems)
    }

    /// Writes `event` through `conn`, in the caller's transaction; returns its id.
    ///
    /// `conn` is any MySQL connection in a transaction begun through sqlx:
    /// `&mut sqlx::Transaction`, [`MysqlTx`](crate::MysqlTx), the connection an `execute`
    /// action receives. Rolled back with it; visible to relays at commit.
    pub async fn enqueue(
        &self,
        conn: &mut MySqlConnection,
        event: &NewEvent,
    ) -> Result<Uuid, Error> {
        self.enqueue_all(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids.first().copied().unwrap_or(event.id()))
    }

    /// Writes `events` in the caller's transaction; returns their ids, in order.
    ///
    /// Every event is checked first (names, headers, JSON payload; on MySQL also no aggregate
    /// type or id ending with a space, which the PAD SPACE collation of `utf8mb4_bin` would
    /// merge with the value without it): nothing is written when one is invalid. In `ordered` mode each aggregate's events take the next numbers of its
    /// counter row, bumped (and locked until the caller's transaction ends) in a stable order
    /// of aggregates, so two writers of an aggregate are serialized and sequence order is
    /// commit order.
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx: the events would commit on their own (a `BEGIN` sent
    /// as plain SQL is not seen). Fails with a retryable [`Error::Conflict`] whose source is
    /// [`TransactionRolledBack`](crate::TransactionRolledBack), the connection closed, when the
    /// server ended that transaction before or during the enqueue (a deadlock): retry the
    /// whole transaction.
    pub async fn enqueue_all(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        if !conn.is_in_transaction() {
            return Err(Error::NotInTransaction {
                operation: "enqueue",
            });
        }
        for event in events {
            event.validate()?;
            refuse_trailing_space("aggregate type", event.aggregate_type())?;
            refuse_trailing_space("aggregate id", event.aggregate_id())?;
        }
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let saved = sqlx::raw_sql(SAVEPOINT).execute(&mut *conn).await;
        in_transaction(conn, saved)
            .await
            .map_err(in_transaction_error)?;
        match self.insert_events(conn, events).await {
            Ok(()) => {
                sqlx::raw_sql(RELEASE)
                    .execute(&mut *conn)
                    .await
                    .map_err(outbox_error)?;
            }
            Err(error) => {
                // Undo what this call wrote; the caller's transaction stays usable, unless the
                // server ended it (a deadlock): then nothing may run in it any more. The first
                // error is the one reported.
                let undone = sqlx::raw_sql(ROLLBACK_TO).execute(&mut *conn).await;
                if let Err(InTransaction::RolledBack(_)) = in_transaction(conn, undone).await {
                    return Err(Error::Conflict(Box::new(TransactionRolledBack::new(error))));
                }
                return Err(error);
            }
        }
        Ok(events.iter().map(NewEvent::id).collect())
    }

    async fn insert_events(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<(), Error> {
        let sequences = match self.ordering {
            Ordering::Ordered => self.number(conn, events).await?,
            Ordering::Unordered => vec![None; events.len()],
        };
        let headers = events
            .iter()
            .map(|e| serde_json::to_string(&*e.headers_to_store()).map_err(Error::Payload))
            .collect::<Result<Vec<_>, _>>()?;
        for start in (0..events.len()).step_by(CHUNK) {
            let end = (start + CHUNK).min(events.len());
            let mut insert = sqlx::query(self.sql.insert(end - start));
            for i in start..end {
                let event = &events[i];
                insert = insert
                    .bind(event.id())
                    .bind(event.aggregate_type())
                    .bind(event.aggregate_id())
                    .bind(sequences[i])
                    .bind(event.event_type())
                    .bind(event.payload())
                    .bind(&headers[i]);
            }
            insert.execute(&mut *conn).await.map_err(outbox_error)?;
        }
        Ok(())
    }

    /// Bumps each aggregate's counter by its number of events (aggregates in sorted order, so
    /// two multi-aggregate writers lock counters in the same order and do not deadlock), and
    /// numbers the events of each aggregate in the order given.
    async fn number(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Option<i64>>, Error> {
        let mut counts: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for event in events {
            *counts
                .entry((event.aggregate_type(), event.aggregate_id()))
                .or_default() += 1;
        }
        let mut next: BTreeMap<(&str, &str), i64> = BTreeMap::new();
        for ((aggregate_type, aggregate_id), n) in counts {
            sqlx::query(self.sql.bump_sequence.clone())
                .bind(aggregate_type)
                .bind(aggregate_id)
                .bind(n)
                .bind(n)
                .execute(&mut *conn)
                .await
                .map_err(outbox_error)?;
            let last: i64 = sqlx::query_scalar(self.sql.read_sequence.clone())
                .bind(aggregate_type)
                .bind(aggregate_id)
                .fetch_one(&mut *conn)
                .await
                .map_err(outbox_error)?;
            next.insert((aggregate_type, aggregate_id), last - n + 1);
        }
        Ok(events
            .iter()
            .map(|event| {
                next.get_mut(&(event.aggregate_type(), event.aggregate_id()))
                    .map(|n| {
                        let sequence = *n;
                        *n += 1;
                        sequence
                    })
            })
            .collect())
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The outbox table.
    pub fn table(&self) -> &TableName {
        &self.names.table
    }

    /// The per-aggregate counter table, `<table>_sequences`.
    pub fn sequences_table(&self) -> &TableName {
        &self.names.sequences
    }

    /// The ordering enqueue uses.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }
}
