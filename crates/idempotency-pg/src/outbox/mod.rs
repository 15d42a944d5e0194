//! The PostgreSQL outbox (feature `outbox`, on by default): enqueue in the caller's
//! transaction, the relay store, `LISTEN/NOTIFY` wake-ups.

use std::sync::Arc;

use idempotency_core::config::SchemaMode;
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

use crate::outbox::error::{from_crate_error, outbox_error};
use crate::pooler::Pooler;
use crate::table::TableName;
use idempotency_outbox::NewEvent;
use idempotency_outbox::config::{Ordering, OutboxConfig, PartitioningConfig};
use idempotency_outbox::{Error, SchemaProblem};

pub(crate) mod error;
mod listen;
mod notify;
pub(crate) mod partitions;
pub(crate) mod schema;
pub(crate) mod statements;
pub(crate) mod store;

pub use listen::{Channel, LISTEN_KEEPALIVE, PgNotificationListener};
pub use partitions::OutboxPartition;
pub use schema::{
    OUTBOX_DDL_TEMPLATE, OUTBOX_PARTITIONED_DDL_TEMPLATE, outbox_ddl, outbox_partitioned_ddl,
};

use notify::NotifyGate;
use statements::Statements;

/// The PostgreSQL outbox: enqueue through the caller's connection, and the store the relay
/// claims from. Cheap to clone: the pool and the statements are shared.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency_outbox::NewEvent;
/// use idempotency_pg::PgOutbox;
/// use idempotency_outbox::config::OutboxConfig;
///
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/test").await?;
/// let outbox = PgOutbox::from_config(pool.clone(), &OutboxConfig::default()).await?;
///
/// let mut tx = idempotency_pg::begin(&pool).await?; // pool.begin(), safe to cancel
/// // ... business statements on &mut *tx ...
/// outbox.enqueue(&mut tx, &NewEvent::new("charge", "ch_1", "ChargeCreated", &42)?).await?;
/// tx.commit().await?; // the event becomes visible to relays, and NOTIFY wakes them
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgOutbox {
    pool: PgPool,
    table: Arc<TableName>,
    ordering: Ordering,
    channel: Option<Channel>,
    gate: Arc<NotifyGate>,
    sql: Arc<Statements>,
    partitioning: Option<PartitioningConfig>,
    pooler: Pooler,
    listen_pool: Option<PgPool>,
    walk_start: Arc<store::WalkStart>,
}

impl PgOutbox {
    /// An outbox on the default table `outbox`, `ordered`, notifying channel `outbox` (at most
    /// once per `5ms`, see [`with_notify_interval`](Self::with_notify_interval)); the schema is
    /// not touched.
    pub fn new(pool: PgPool) -> Self {
        let channel = Channel::parse("outbox").ok();
        Self::with_options(pool, default_table(), Ordering::Ordered, channel)
    }

    /// An outbox on `table` with the given ordering and notification channel (`None`: no
    /// `NOTIFY`; with one, at most once per `5ms`, see
    /// [`with_notify_interval`](Self::with_notify_interval)); the schema is not touched.
    pub fn with_options(
        pool: PgPool,
        table: TableName,
        ordering: Ordering,
        channel: Option<Channel>,
    ) -> Self {
        let sql = Statements::new(&table, ordering, channel.is_some());
        Self {
            pool,
            table: Arc::new(table),
            ordering,
            channel,
            gate: Arc::new(NotifyGate::new(OutboxConfig::default().notify_interval)),
            sql: Arc::new(sql),
            partitioning: None,
            pooler: Pooler::None,
            listen_pool: None,
            walk_start: Arc::default(),
        }
    }

    /// This outbox for a pool behind `pooler` (`idempotency.persistence.pooler` in the
    /// facade). With [`Pooler::Transaction`] (PgBouncer's `pool_mode = transaction`) its
    /// statements are unnamed, the relay's statements that run on their own (the unordered
    /// claim, marking published or failed, statistics, retention) run in a transaction of
    /// their own, and [`listen`](idempotency_outbox::RelayStore::listen) does not `LISTEN`
    /// through the pool (a pooler in transaction mode gives the `LISTEN` session away after
    /// the statement, and its notifications with it): it listens through the pool of
    /// [`with_listen_pool`](Self::with_listen_pool), a direct connection to the server, or
    /// answers `None` and the relay polls (`outbox.relay.poll-interval`). `NOTIFY` at commit
    /// still works through the pooler.
    ///
    /// ```
    /// use idempotency_pg::{PgOutbox, Pooler};
    ///
    /// # fn demo(pool: sqlx::PgPool) {
    /// let outbox = PgOutbox::new(pool).with_pooler(Pooler::Transaction);
    /// assert_eq!(outbox.pooler(), Pooler::Transaction);
    /// # }
    /// ```
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// What stands between the pool and the database.
    pub fn pooler(&self) -> Pooler {
        self.pooler
    }

    /// The relay's wake-up `LISTEN`s through `pool` (one connection, opened by
    /// [`listen`](idempotency_outbox::RelayStore::listen)) instead of this outbox's pool:
    /// behind a pooler in transaction mode, a pool of direct connections to the same
    /// database (PgBouncer's server, not its port).
    ///
    /// ```
    /// use idempotency_pg::{PgOutbox, Pooler};
    ///
    /// # fn demo(bouncer: sqlx::PgPool, direct: sqlx::PgPool) {
    /// let outbox = PgOutbox::new(bouncer)
    ///     .with_pooler(Pooler::Transaction)
    ///     .with_listen_pool(direct);
    /// assert!(outbox.listen_pool().is_some());
    /// # }
    /// ```
    pub fn with_listen_pool(mut self, pool: PgPool) -> Self {
        self.listen_pool = Some(pool);
        self
    }

    /// The pool the wake-up listens through, when it is not this outbox's pool.
    pub fn listen_pool(&self) -> Option<&PgPool> {
        self.listen_pool.as_ref()
    }

    fn persistent(&self) -> bool {
        crate::pooler::persistent(self.pooler)
    }

    /// This outbox notifying at most once per `interval` (`outbox.notify-interval`): an enqueue
    /// notifies only when no enqueue through this outbox or its clones notified within the
    /// last `interval`. [`Duration::ZERO`](std::time::Duration::ZERO) notifies on every
    /// enqueue.
    ///
    /// PostgreSQL lets one notifying transaction commit at a time (it holds a database-wide
    /// lock from before its commit record until that record is flushed), so a notification on
    /// every enqueue limits enqueuing transactions to about one disk flush each, whatever the
    /// number of connections. The rows of the enqueues that did not notify are claimed by the
    /// relay's next claim: after the next notification, after its `relay.linger` look-again,
    /// or at the latest after `relay.poll-interval`.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # fn demo(pool: sqlx::PgPool) {
    /// let outbox = idempotency_pg::PgOutbox::new(pool).with_notify_interval(Duration::ZERO);
    /// assert_eq!(outbox.notify_interval(), Duration::ZERO); // every enqueue notifies
    /// # }
    /// ```
    pub fn with_notify_interval(mut self, interval: std::time::Duration) -> Self {
        self.gate = Arc::new(NotifyGate::new(interval));
        self
    }

    /// The window within which only one enqueue notifies.
    pub fn notify_interval(&self) -> std::time::Duration {
        self.gate.interval()
    }

    /// This outbox on the time-partitioned layout configured by `partitioning` (plain again
    /// when it is not `enabled`); the schema is not touched. Fails with
    /// [`Error::InvalidConfig`] for an interval of zero, of less than a minute or of a
    /// fraction of a second, and for `ahead` outside `1..=1000`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_outbox::config::PartitioningConfig;
    ///
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), idempotency_outbox::Error> {
    /// let daily = PartitioningConfig { enabled: true, interval: Duration::from_secs(86_400), ahead: 3 };
    /// let outbox = idempotency_pg::PgOutbox::new(pool).with_partitioning(&daily)?;
    /// outbox.create_schema().await?; // the parent, its default partition, today + 3 days
    /// assert!(outbox.partitioning().is_some());
    /// # Ok(()) }
    /// ```
    pub fn with_partitioning(mut self, partitioning: &PartitioningConfig) -> Result<Self, Error> {
        partitioning.validate()?;
        self.partitioning = partitioning.enabled.then(|| partitioning.clone());
        Ok(self)
    }

    /// The partitioning, when the table is time-partitioned.
    pub fn partitioning(&self) -> Option<&PartitioningConfig> {
        self.partitioning.as_ref()
    }

    /// An outbox configured by the `outbox` section: validates `table-name`,
    /// `notify-channel`, `notify-interval` and `partitioning`, then applies `schema.mode`.
    pub async fn from_config(pool: PgPool, config: &OutboxConfig) -> Result<Self, Error> {
        Self::from_config_with_pooler(pool, config, Pooler::None).await
    }

    /// [`from_config`](Self::from_config) for a pool behind `pooler`
    /// ([`with_pooler`](Self::with_pooler)), which the schema's statements need already.
    pub async fn from_config_with_pooler(
        pool: PgPool,
        config: &OutboxConfig,
        pooler: Pooler,
    ) -> Result<Self, Error> {
        let table = TableName::parse(&config.table_name).map_err(from_crate_error)?;
        let channel = config
            .notify_channel
            .as_deref()
            .map(Channel::parse)
            .transpose()?;
        let outbox = Self::with_options(pool, table, config.ordering, channel)
            .with_notify_interval(config.notify_interval)
            .with_partitioning(&config.partitioning)?
            .with_pooler(pooler);
        outbox.apply_schema(config.schema.mode).await?;
        Ok(outbox)
    }

    /// `create` runs the canonical DDL, `validate` checks the tables, `none` does nothing.
    pub async fn apply_schema(&self, mode: SchemaMode) -> Result<(), Error> {
        match mode {
            SchemaMode::Create => self.create_schema().await,
            SchemaMode::Validate => self.validate_schema().await,
            SchemaMode::None => Ok(()),
        }
    }

    /// Runs the canonical DDL ([`outbox_ddl`], or [`outbox_partitioned_ddl`] and then
    /// [`prepare_partitions`](Self::prepare_partitions) when partitioned); safe to run again
    /// and concurrently. An existing table of the other layout is not converted: that fails
    /// with [`Error::Schema`] and a [`SchemaProblem::Layout`].
    pub async fn create_schema(&self) -> Result<(), Error> {
        let ddl = match self.partitioning {
            Some(_) => outbox_partitioned_ddl(&self.table),
            None => outbox_ddl(&self.table),
        };
        // Before the DDL: over a table of the other layout its `IF NOT EXISTS` statements
        // would be skipped or fail on the first partition.
        if let Some(problem) = schema::layout_problem(
            &self.pool,
            self.pooler,
            &self.table,
            self.partitioning.is_some(),
        )
        .await?
        {
            return Err(Error::Schema {
                table: self.table.to_string(),
                problems: vec![problem],
            });
        }
        let objects =
            schema::OutboxNames::new(&self.table, self.partitioning.is_some()).objects(&self.table);
        // Over a complete schema only the catalog is read: no lock on the tables, so
        // enqueuing writers do not wait for it, nor it for them.
        schema::create(&self.pool, self.pooler, &self.table, &objects, ddl).await?;
        self.prepare_partitions().await?;
        Ok(())
    }

    /// Creates the partitions of the current interval and of the `ahead` next ones that do
    /// not exist yet, and returns how many it created (0 on a plain table). The relay's
    /// retention pass calls it ([`Housekeeping::prepare_storage`]); call it from a scheduler
    /// when no relay runs against this table. A range the default partition already holds
    /// rows of is not created (that would fail): it is skipped after a look at the default
    /// partition that takes no lock, so no enqueue waits for it, and its rows stay in the
    /// default partition. A range whose lock is not granted within a second is left for the
    /// next call.
    ///
    /// [`Housekeeping::prepare_storage`]: idempotency_outbox::Housekeeping::prepare_storage
    pub async fn prepare_partitions(&self) -> Result<u32, Error> {
        match &self.partitioning {
            Some(config) => partitions::prepare(&self.pool, self.pooler, &self.table, config).await,
            None => Ok(0),
        }
    }

    /// Detaches and drops every partition (never the default one) whose range ended more than
    /// `published` ago and that holds no row retention would keep: no pending row, no row
    /// published less than `published` ago, no dead letter younger than `dead_lettered`
    /// (none at all when `None`). Returns how many it dropped (0 on a plain table). The
    /// relay's retention pass calls it ([`Housekeeping::drop_expired`]) before its batched
    /// deletes.
    ///
    /// [`Housekeeping::drop_expired`]: idempotency_outbox::Housekeeping::drop_expired
    pub async fn drop_expired_partitions(
        &self,
        published: std::time::Duration,
        dead_lettered: Option<std::time::Duration>,
    ) -> Result<u32, Error> {
        match self.partitioning {
            Some(_) => {
                partitions::drop_expired(
                    &self.pool,
                    self.pooler,
                    &self.table,
                    published,
                    dead_lettered,
                )
                .await
            }
            None => Ok(0),
        }
    }

    /// The partitions of the table with their bounds, ordered by lower bound (the default
    /// partition first); empty on a plain table.
    pub async fn partitions(&self) -> Result<Vec<OutboxPartition>, Error> {
        partitions::list(&self.pool, self.pooler, &self.table).await
    }

    /// Checks both tables (columns, types, nullability, the indexes the queries rely on),
    /// failing with [`Error::Schema`] naming every difference.
    pub async fn validate_schema(&self) -> Result<(), Error> {
        let problems = self.schema_problems().await?;
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Schema {
                table: self.table.to_string(),
                problems,
            })
        }
    }

    /// Every difference between the tables and the canonical schema (empty when they match),
    /// the layout included: a plain table where partitioning is configured, or the reverse,
    /// is a [`SchemaProblem::Layout`].
    pub async fn schema_problems(&self) -> Result<Vec<SchemaProblem>, Error> {
        let partitioned = self.partitioning.is_some();
        let indexes = if partitioned {
            schema::PARTITIONED_OUTBOX_INDEXES
        } else {
            schema::OUTBOX_INDEXES
        };
        let mut problems = Vec::new();
        if let Some(problem) =
            schema::layout_problem(&self.pool, self.pooler, &self.table, partitioned).await?
        {
            problems.push(problem);
        }
        problems.extend(
            schema::problems(
                &self.pool,
                self.pooler,
                &self.table,
                schema::OUTBOX_COLUMNS,
                indexes,
            )
            .await?,
        );
        problems.extend(
            schema::problems(
                &self.pool,
                self.pooler,
                &self.table.sibling("sequences"),
                schema::SEQUENCE_COLUMNS,
                schema::SEQUENCE_INDEXES,
            )
            .await?,
        );
        Ok(problems)
    }

    /// Writes `event` through `conn`, in the caller's transaction; returns its id.
    ///
    /// `conn` is any PostgreSQL connection in a transaction: `&mut sqlx::Transaction`,
    /// `idempotency_pg::PgTx` (both dereference to `PgConnection`). Rolled back with it;
    /// visible to relays, and notified, at commit. A connection outside a transaction is
    /// refused with [`Error::NotInTransaction`] (the event would commit on its own).
    ///
    /// With a channel, the enqueue notifies at commit unless another enqueue through this
    /// outbox (or a clone) notified within [`notify_interval`](Self::notify_interval).
    pub async fn enqueue(&self, conn: &mut PgConnection, event: &NewEvent) -> Result<Uuid, Error> {
        self.enqueue_all(conn, std::slice::from_ref(event))
            .await
            .map(|ids| ids.first().copied().unwrap_or(event.id()))
    }

    /// Writes `events` in one statement, in the caller's transaction; returns their ids.
    ///
    /// In `ordered` mode events of one aggregate are numbered in the order given, and a
    /// concurrent transaction writing the same aggregate waits at this statement until this
    /// transaction ends. Keep such transactions short, as for any row lock.
    ///
    /// Fails with [`Error::NotInTransaction`], before writing, when `conn` is not in a
    /// transaction begun through sqlx (`begin`, `begin_with`, or an `execute` action's
    /// connection): a `BEGIN` sent as plain SQL is not seen.
    pub async fn enqueue_all(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<Uuid>, Error> {
        require_transaction(conn, "enqueue")?;
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids = Vec::with_capacity(events.len());
        let mut aggregate_types = Vec::with_capacity(events.len());
        let mut aggregate_ids = Vec::with_capacity(events.len());
        let mut event_types = Vec::with_capacity(events.len());
        let mut payloads = Vec::with_capacity(events.len());
        let mut headers = Vec::with_capacity(events.len());
        for event in events {
            event.validate()?;
            ids.push(event.id());
            aggregate_types.push(event.aggregate_type());
            aggregate_ids.push(event.aggregate_id());
            event_types.push(event.event_type());
            payloads.push(event.payload());
            headers
                .push(serde_json::to_string(&*event.headers_to_store()).map_err(Error::Payload)?);
        }
        let channel = self.channel.as_ref().filter(|_| self.gate.admit());
        let sql = match channel {
            Some(_) => &self.sql.enqueue,
            None => &self.sql.enqueue_quiet,
        };
        let query = sqlx::query(sql.clone())
            .persistent(self.persistent())
            .bind(&ids)
            .bind(&aggregate_types)
            .bind(&aggregate_ids)
            .bind(&event_types)
            .bind(&payloads)
            .bind(&headers);
        let query = match channel {
            Some(channel) => query.bind(channel.as_str()),
            None => query,
        };
        if let Err(error) = query.execute(&mut *conn).await {
            if channel.is_some() {
                self.gate.reopen();
            }
            return Err(outbox_error(error));
        }
        Ok(ids)
    }

    /// The SQL text [`enqueue_all`](Self::enqueue_all) issues when it notifies (one statement
    /// per call), for inspection (`EXPLAIN`) and benchmarks. Its parameters are six parallel
    /// arrays (ids, aggregate types, aggregate ids, event types, payloads, headers), then the
    /// notify channel when notifications are on. An enqueue that does not notify issues the
    /// same statement without the `pg_notify` and its parameter.
    pub fn enqueue_statement(&self) -> &str {
        self.sql.enqueue.as_str()
    }

    /// The SQL text of the relay's claim for `ordering` (one statement per claim), for
    /// inspection (`EXPLAIN`) and benchmarks. Its parameters: the batch size (`int8`), the lease
    /// (`interval`), the claim token (`uuid`) and `max-attempts` (`int4`); the ordered claim's
    /// also the aggregate type and id (`text`, `text`) its walk over the aggregates starts
    /// after (`''`, `''`: from the first). It returns the message's columns, then two that
    /// say where the ordered claim's walk found the row (`NULL` otherwise). The relay runs the
    /// ordered claim in a transaction with `enable_sort` and `enable_seqscan` off, which an
    /// `EXPLAIN` should set as well to see its plan.
    ///
    /// ```
    /// use idempotency_outbox::config::Ordering;
    ///
    /// # async fn demo(pool: sqlx::PgPool) {
    /// let outbox = idempotency_pg::PgOutbox::new(pool);
    /// assert!(outbox.claim_statement(Ordering::Ordered).contains("FOR UPDATE OF o SKIP LOCKED"));
    /// # }
    /// ```
    pub fn claim_statement(&self, ordering: Ordering) -> &str {
        match ordering {
            Ordering::Ordered => self.sql.claim_ordered.as_str(),
            Ordering::Unordered => self.sql.claim_unordered.as_str(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The outbox table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// The ordering enqueue uses.
    pub fn ordering(&self) -> Ordering {
        self.ordering
    }

    /// The notification channel, if enqueue notifies.
    pub fn channel(&self) -> Option<&Channel> {
        self.channel.as_ref()
    }
}

/// Refuses a connection outside a transaction: a write meant to join the caller's transaction
/// would otherwise commit on its own (an event for a change that is rolled back, an inbox entry
/// without the consumer's effects).
pub(crate) fn require_transaction(
    conn: &PgConnection,
    operation: &'static str,
) -> Result<(), Error> {
    if conn.is_in_transaction() {
        Ok(())
    } else {
        Err(Error::NotInTransaction { operation })
    }
}

fn default_table() -> TableName {
    TableName::from_parts(None, "outbox".to_owned())
}
