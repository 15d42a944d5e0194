//! Operator operations (feature `ops`): what the `idempotency` command line and an admin
//! router do to a running deployment's tables, on PostgreSQL, SQLite and MySQL.
//!
//! [`Operations`] is built from the same [`Settings`] as the service and a pool. Reads return
//! the stores' own types; every change is written to the audit trail first-hand (see
//! [`AUDIT_TARGET`]): who, what, on which target, how many, when.
//!
//! ```no_run
//! use idempotency::ops::{Actor, Operations};
//!
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), idempotency::ops::OpsError> {
//! let settings = idempotency::Settings::default();
//! let ops = Operations::new(pool, &settings, Actor::new("alice")).await?;
//! for table in ops.schema_validate().await? {
//!     for problem in &table.problems {
//!         eprintln!("{}: {problem}", table.table);
//!     }
//! }
//! # Ok(()) }
//! ```

mod audit;
mod backend;
mod error;
mod json;
#[cfg(feature = "redis")]
mod l2;
mod view;

use std::time::Duration;

use idempotency_core::admin::{Eviction, Force, KeyAdmin, KeyStats};
use idempotency_core::config::SchemaMode;
use idempotency_core::{ExpiredCleanup, IdempotencyStore, RecordId, RecordStatus};
use idempotency_outbox::admin::{DeadLetterFilter, ExpiredCounts, OutboxAdmin, OutboxStatus};
use idempotency_outbox::config::InboxConfig;
use idempotency_outbox::uuid::Uuid;
use idempotency_outbox::{DeadLetter, DeadLetters, Housekeeping};

pub use audit::{AUDIT_TARGET, Actor};
pub use backend::AdminDatabase;
pub use error::OpsError;
pub use json::{DeadLetterJson, KeyJson, OutboxStatusJson, rfc3339};
pub use view::{KeyView, PREVIEW_CHARS, Partition, TableDdl, TableKind, TableProblems};

use crate::Settings;

/// Rows per statement of the bulk operations (requeue, discard, purge, cleanup).
pub const BATCH: usize = 500;

/// The L2 client one eviction uses, got once before it deletes anything (none without
/// feature `redis`).
#[cfg(feature = "redis")]
type L2Client = Option<idempotency_cache_redis::RedisCache>;
#[cfg(not(feature = "redis"))]
type L2Client = ();

/// What [`Operations::key_evict`] did to the record and to its L2 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyEviction {
    /// What happened to the record.
    pub record: Eviction,
    /// `Some(deleted)` when the L2 cache (Redis) is configured and the record was evicted or
    /// was not there: whether an entry was there. `None`: no L2 configured, or the record was
    /// kept ([`Eviction::InProgress`], [`Eviction::Changed`]).
    pub cache_entry: Option<bool>,
}

/// What [`Operations::cleanup`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupReport {
    /// Expired idempotency records.
    pub records: u64,
    /// Outbox rows past `outbox.retention` (when an outbox is configured and retention is on).
    pub outbox: ExpiredCounts,
    /// Whole outbox partitions dropped (partitioned outbox).
    pub partitions_dropped: u32,
}

/// The operator operations on one deployment's tables.
///
/// The store and outbox are built with `schema.mode: none`, whatever the configuration says:
/// looking at a deployment never changes its schema; [`schema_apply`](Self::schema_apply)
/// does, when asked.
#[derive(Debug, Clone)]
pub struct Operations<D: AdminDatabase> {
    pool: D,
    settings: Settings,
    store: D::Store,
    outbox: Option<D::Outbox>,
    inbox: Option<InboxConfig>,
    actor: Actor,
    /// The deployment's Redis (L2) client, when the L2 cache is configured.
    #[cfg(feature = "redis")]
    l2: l2::L2,
    /// The L1 cache of the service these operations run in (an admin router's): an eviction
    /// drops its entry too.
    #[cfg(feature = "moka")]
    local: Option<idempotency_cache_moka::MokaCache>,
}

impl<D: AdminDatabase> Operations<D> {
    /// The operations on `pool`'s tables as `settings` names them; changes are audited as
    /// made by `actor`. Fails on an invalid table name, never on the schema.
    pub async fn new(pool: D, settings: &Settings, actor: Actor) -> Result<Self, OpsError> {
        let mut persistence = settings.idempotency.persistence.clone();
        persistence.schema.mode = SchemaMode::None;
        let store = pool.clone().store(&persistence).await?;
        let outbox = match &settings.outbox {
            Some(config) => {
                let mut config = config.clone();
                config.schema.mode = SchemaMode::None;
                Some(pool.clone().outbox(&config, persistence.pooler).await?)
            }
            None => None,
        };
        #[cfg(feature = "redis")]
        let cache_prefix = crate::assemble::cache_key_prefix(
            &pool,
            &settings.idempotency.distributed_cache,
            &persistence.table_name,
        )
        .await?;
        Ok(Self {
            pool,
            settings: settings.clone(),
            store,
            outbox,
            inbox: None,
            actor,
            #[cfg(feature = "redis")]
            l2: l2::L2::own(cache_prefix),
            #[cfg(feature = "moka")]
            local: None,
        })
    }

    /// The operations over an assembled service's own store and outbox (an admin router's).
    #[cfg(feature = "admin")]
    pub(crate) fn from_parts(
        pool: D,
        settings: &Settings,
        store: D::Store,
        outbox: Option<D::Outbox>,
        actor: Actor,
        #[cfg(feature = "redis")] cache: (
            Option<String>,
            crate::assemble::DistributedTier,
            std::sync::Arc<std::sync::atomic::AtomicBool>,
        ),
        #[cfg(feature = "moka")] local: Option<idempotency_cache_moka::MokaCache>,
    ) -> Self {
        Self {
            pool,
            settings: settings.clone(),
            store,
            outbox,
            inbox: None,
            actor,
            #[cfg(feature = "redis")]
            l2: l2::L2::shared(cache.0, cache.1, cache.2),
            #[cfg(feature = "moka")]
            local,
        }
    }

    /// The operations of the process that serves requests with `local` as its L1 cache (an
    /// admin router mounted beside the service): [`key_evict`](Self::key_evict) drops the
    /// key's entry from it too. [`Idempotency::admin_router`](crate::Idempotency::admin_router)
    /// does this itself.
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     pool: sqlx::PgPool,
    /// #     idempotency: idempotency::Idempotency<sqlx::PgPool>,
    /// # ) -> Result<(), idempotency::ops::OpsError> {
    /// use idempotency::ops::{Actor, Operations};
    ///
    /// let mut ops = Operations::new(pool, idempotency.settings(), Actor::new("alice")).await?;
    /// if let Some(local) = idempotency.service().local_cache() {
    ///     ops = ops.with_local_cache(local.clone());
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "moka")]
    #[cfg_attr(docsrs, doc(cfg(feature = "moka")))]
    pub fn with_local_cache(mut self, local: idempotency_cache_moka::MokaCache) -> Self {
        self.local = Some(local);
        self
    }

    /// The same operations, their changes audited as made by `actor` (an admin router's
    /// authenticated principal, request by request).
    pub fn with_actor(mut self, actor: Actor) -> Self {
        self.actor = actor;
        self
    }

    /// Who the changes are audited as made by.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// The operations with the inbox table too (schema commands): the inbox is configured by
    /// the consumer, not by [`Settings`].
    pub fn with_inbox(mut self, inbox: InboxConfig) -> Self {
        self.inbox = Some(inbox);
        self
    }

    /// The settings the operations were built from.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The records store.
    pub fn store(&self) -> &D::Store {
        &self.store
    }

    /// The outbox, or [`OpsError::NoOutbox`] when none is configured.
    pub fn outbox(&self) -> Result<&D::Outbox, OpsError> {
        self.outbox.as_ref().ok_or(OpsError::NoOutbox)
    }

    fn audit(&self, action: &'static str, target: &str, count: u64) {
        audit::record(&self.actor, action, target, count);
    }

    fn audit_key(&self, action: &'static str, id: &RecordId, count: u64) {
        audit::record_key(&self.actor, action, id, count, None);
    }

    // ---- schema ----

    /// The DDL of every configured table.
    pub fn schema_ddl(&self) -> Result<Vec<TableDdl>, OpsError> {
        D::ddl(&self.settings, self.inbox.as_ref())
    }

    /// Runs the canonical DDL of every configured table (`CREATE ... IF NOT EXISTS`, safe to
    /// run again); returns the tables. Audited, a failure too (`schema.apply.failed`: some tables
    /// may exist).
    pub async fn schema_apply(&self) -> Result<Vec<TableDdl>, OpsError> {
        let tables = self.schema_ddl()?;
        let names: Vec<&str> = tables.iter().map(|t| t.table.as_str()).collect();
        match self.apply().await {
            Ok(()) => {
                self.audit("schema.apply", &names.join(","), tables.len() as u64);
                Ok(tables)
            }
            Err(error) => {
                // Some of the tables may have been created before the failure.
                self.audit("schema.apply.failed", &names.join(","), 0);
                Err(error)
            }
        }
    }

    /// Runs the DDL of [`schema_apply`](Self::schema_apply). A statement the database
    /// refuses is [`OpsError::Schema`] naming the table (a database error, not a
    /// configuration one).
    async fn apply(&self) -> Result<(), OpsError> {
        let mut persistence = self.settings.idempotency.persistence.clone();
        persistence.schema.mode = SchemaMode::Create;
        self.pool
            .clone()
            .store(&persistence)
            .await
            .map_err(|e| schema_failed(&persistence.table_name, e))?;
        if let Some(config) = &self.settings.outbox {
            let mut config = config.clone();
            config.schema.mode = SchemaMode::Create;
            self.pool
                .clone()
                .outbox(&config, persistence.pooler)
                .await
                .map_err(|e| schema_failed(&config.table_name, e))?;
        }
        if let Some(inbox) = &self.inbox {
            self.pool.create_inbox(inbox).await?;
        }
        Ok(())
    }

    /// Every difference between the live tables and the canonical schema.
    pub async fn schema_validate(&self) -> Result<Vec<TableProblems>, OpsError> {
        self.pool
            .problems(&self.store, self.outbox.as_ref(), self.inbox.as_ref())
            .await
    }

    // ---- keys ----

    /// One key's committed record, `None` when there is none; a `PROCESSING` one with its
    /// lease token ([`KeyView::lease_token`]).
    ///
    /// A settled record is one read. For a `PROCESSING` one the token is read before and
    /// after the record, and taken only when both reads agree (a token is never issued twice,
    /// so the record read between them is that claim's). A key whose claim changes on every
    /// try shows no token, which a forced eviction then names as no claim at all: it deletes
    /// nothing ([`Eviction::Changed`]).
    pub async fn key_show(&self, id: &RecordId) -> Result<Option<KeyView>, OpsError> {
        const TRIES: usize = 3;
        let Some(record) = self.store.lookup(id).await? else {
            return Ok(None);
        };
        let mut view = KeyView::of(&record);
        for _ in 0..TRIES {
            if view.status != RecordStatus::Processing {
                return Ok(Some(view));
            }
            let before = self.store.lease_token(id).await?;
            let Some(record) = self.store.lookup(id).await? else {
                return Ok(None);
            };
            view = KeyView::of(&record);
            let after = self.store.lease_token(id).await?;
            if view.status == RecordStatus::Processing && before == after {
                view.lease_token = after;
                return Ok(Some(view));
            }
        }
        Ok(Some(view))
    }

    /// Deletes one key's record so that its next request runs again (a `PROCESSING` one only
    /// when `force` names it: [`Force::Claim`] with the [`KeyView::lease_token`] the operator
    /// was shown, so that a claim taken over since is left alone), then its L2 entry when
    /// Redis is configured, whether or not there was a record: an entry whose record is gone
    /// (an earlier eviction whose Redis deletion failed, a record past its retention) is
    /// stale, and a second eviction is how it is deleted. The L1 entry of the process these
    /// operations serve goes too (an admin router's, or
    /// [`with_local_cache`](Self::with_local_cache)); other instances' L1 entries live until
    /// their TTL (`idempotency.local-cache.ttl`). A replay that read the record before the
    /// deletion may still fill the caches after it (its write comes after its commit): evict
    /// again if the key replays. Audited when something was deleted.
    ///
    /// Nothing is deleted from the caches of a record that is `PROCESSING` and left alone
    /// ([`Eviction::InProgress`]): none of them holds it.
    ///
    /// The eviction runs in a task of its own: a caller that stops waiting (an admin request
    /// cancelled by its client) does not stop it between the record's deletion and its audit
    /// line and cache deletions.
    pub async fn key_evict(&self, id: &RecordId, force: Force) -> Result<KeyEviction, OpsError> {
        use tracing::Instrument;
        let (ops, id) = (self.clone(), id.clone());
        let eviction = tokio::spawn(async move { ops.evict(&id, force).await }.in_current_span());
        match eviction.await {
            Ok(eviction) => eviction,
            Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
            // Cancelled by its runtime's shutdown, at any point of the eviction: the record
            // may already be deleted and its cache entries left.
            Err(_) => Err(OpsError::Unconfirmed {
                source: Box::new(OpsError::ShuttingDown {
                    operation: "keys evict",
                    reason: "the runtime shut down during the eviction; evict the key again \
                             on a running instance"
                        .to_owned(),
                }),
            }),
        }
    }

    /// [`key_evict`](Self::key_evict), in the caller's task.
    async fn evict(&self, id: &RecordId, force: Force) -> Result<KeyEviction, OpsError> {
        // The Redis client first, and once: a configuration it refuses (no secret, a bad URL),
        // or a service that shut down and quit it, fails the eviction before anything is
        // deleted; a shutdown after this point fails the entry's deletion (`OpsError::Cache`:
        // the entry left, or unknown for a key without a record), not the eviction.
        #[cfg(feature = "redis")]
        let l2 = self.l2.cache(&self.settings).await?;
        #[cfg(not(feature = "redis"))]
        let l2 = ();
        let record = match self.store.evict(id, force).await {
            Ok(record) => record,
            Err(e) => {
                let error = OpsError::from(e).of_change();
                if matches!(error, OpsError::Unconfirmed { .. }) {
                    // The record may be gone: its cache entries go too (never wrong), so
                    // that evicting again, or nothing, is right either way.
                    self.audit_key("key.evict.unconfirmed", id, 1);
                    let _ = self.evict_cache_entries(&l2, id, false).await;
                }
                return Err(error);
            }
        };
        if matches!(record, Eviction::InProgress | Eviction::Changed(_)) {
            return Ok(KeyEviction {
                record,
                cache_entry: None,
            });
        }
        if let Eviction::Evicted(status) = record {
            match force {
                Force::Claim(token) if status == RecordStatus::Processing => {
                    let token = token.map(|token| token.0);
                    audit::record_key(&self.actor, "key.evict.forced", id, 1, token);
                }
                _ => self.audit_key("key.evict", id, 1),
            }
        }
        let cache_entry = self
            .evict_cache_entries(&l2, id, record != Eviction::NotFound)
            .await?;
        Ok(KeyEviction {
            record,
            cache_entry,
        })
    }

    /// Drops `id`'s L1 entry, deletes its L2 entry (`Some(whether one was there)` when Redis
    /// is configured), and drops the L1 entry again: a replay may have copied the L2 entry to
    /// L1 meanwhile. L1 and L2 hold only committed, terminal records, so dropping an entry is
    /// never wrong: the next request reads again. The L2 deletion is audited when it deleted
    /// something or followed a record's eviction (`evicted`, which the error also tells).
    async fn evict_cache_entries(
        &self,
        l2: &L2Client,
        id: &RecordId,
        evicted: bool,
    ) -> Result<Option<bool>, OpsError> {
        self.evict_local_entry(id);
        #[cfg(feature = "redis")]
        let cache_entry = match l2 {
            Some(cache) => {
                let deleted = if self.l2.closed() {
                    // Quit since this eviction got it: the entry is left, at once.
                    Err(l2::quit(cache, id))
                } else {
                    l2::delete(cache, id).await
                };
                self.evict_local_entry(id);
                let deleted = deleted.map_err(|e| e.evicted(evicted))?;
                if deleted || evicted {
                    self.audit_key("key.evict.cache", id, u64::from(deleted));
                }
                Some(deleted)
            }
            None => None,
        };
        #[cfg(not(feature = "redis"))]
        let cache_entry = {
            let _ = (l2, evicted);
            None
        };
        Ok(cache_entry)
    }

    /// Whether the L2 (Redis) cache is configured: an eviction of a key without a record then
    /// still has an entry to delete.
    #[cfg(feature = "admin")]
    pub(crate) fn has_l2(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.l2.prefix().is_some();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Whether evictions are refused before anything is deleted
    /// ([`OpsError::ShuttingDown`]): the L2 cache is configured, and the service these
    /// operations serve has shut down and quit the Redis client they share.
    #[cfg(feature = "admin")]
    pub(crate) fn evictions_refused(&self) -> bool {
        #[cfg(feature = "redis")]
        return self.l2.prefix().is_some() && self.l2.closed();
        #[cfg(not(feature = "redis"))]
        false
    }

    /// Whether an eviction of a key without a record has a cache entry to drop: the L2 cache
    /// is configured, or the L1 cache of the process these operations serve.
    #[cfg(feature = "admin")]
    pub(crate) fn has_cache(&self) -> bool {
        #[cfg(feature = "moka")]
        if self.local.is_some() {
            return true;
        }
        self.has_l2()
    }

    /// The Redis (L2) key of `id` in this deployment, when the L2 cache is enabled and has a
    /// URL: the key every instance reads and writes (`distributed-cache.key-prefix`, then a
    /// digest of where the records table is: database, schema, server).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn cache_key(&self, id: &RecordId) -> Option<String> {
        self.l2
            .prefix()
            .map(|prefix| idempotency_cache_redis::redis_key(prefix, id))
    }

    #[cfg(feature = "moka")]
    fn evict_local_entry(&self, id: &RecordId) {
        if let Some(local) = &self.local {
            local.invalidate(id);
        }
    }

    #[cfg(not(feature = "moka"))]
    fn evict_local_entry(&self, _id: &RecordId) {}

    /// The records counted by operation and status.
    pub async fn key_stats(&self) -> Result<KeyStats, OpsError> {
        Ok(self.store.key_stats().await?)
    }

    // ---- outbox ----

    /// Pending, leased, dead-lettered, and the aggregates held up.
    pub async fn outbox_status(&self) -> Result<OutboxStatus, OpsError> {
        Ok(self.outbox()?.status().await?)
    }

    /// The oldest dead letters matching `filter`, at most `limit`.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, OpsError> {
        Ok(self.outbox()?.find_dead_letters(filter, limit).await?)
    }

    /// One dead letter.
    pub async fn dead_letter(&self, id: Uuid) -> Result<Option<DeadLetter>, OpsError> {
        Ok(self.outbox()?.dead_letter(id).await?)
    }

    /// The ids of every dead letter matching `filter`.
    pub async fn dead_letter_ids(&self, filter: &DeadLetterFilter) -> Result<Vec<Uuid>, OpsError> {
        Ok(self.outbox()?.dead_letter_ids(filter).await?)
    }

    /// Puts dead letters back to pending, [`BATCH`] per statement, calling `progress` with
    /// the rows done after each. A batch refused for order
    /// ([`Error::RequeueOutOfOrder`](idempotency_outbox::Error::RequeueOutOfOrder)) stops the
    /// run; the batches before it stay requeued (and audited). Audited.
    pub async fn requeue(
        &self,
        ids: &[Uuid],
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<u64, OpsError> {
        let outbox = self.outbox()?;
        let mut done = 0;
        for chunk in ids.chunks(BATCH) {
            match outbox.requeue(chunk).await {
                Ok(n) => done += n,
                Err(e) => {
                    self.audit("outbox.dead.requeue", &self.outbox_target(ids), done);
                    return Err(OpsError::from(e).of_change().after(done));
                }
            }
            progress(chunk.len() as u64);
        }
        self.audit("outbox.dead.requeue", &self.outbox_target(ids), done);
        Ok(done)
    }

    /// Deletes dead letters, [`BATCH`] per statement. Audited.
    pub async fn discard(
        &self,
        ids: &[Uuid],
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<u64, OpsError> {
        let outbox = self.outbox()?;
        let mut done = 0;
        for chunk in ids.chunks(BATCH) {
            match outbox.discard(chunk).await {
                Ok(n) => done += n,
                Err(e) => {
                    self.audit("outbox.dead.discard", &self.outbox_target(ids), done);
                    return Err(OpsError::from(e).of_change().after(done));
                }
            }
            progress(chunk.len() as u64);
        }
        self.audit("outbox.dead.discard", &self.outbox_target(ids), done);
        Ok(done)
    }

    /// How many rows a purge with these ages would delete.
    pub async fn expired_counts(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
    ) -> Result<ExpiredCounts, OpsError> {
        Ok(self
            .outbox()?
            .expired_counts(published, dead_lettered)
            .await?)
    }

    /// Deletes rows published more than `published` ago and, with `dead_lettered`, dead
    /// letters older than that, [`BATCH`] per statement. Audited. A `dead_lettered` of zero
    /// (every dead letter, committed events never delivered, whatever its age) is
    /// [`OpsError::Unsupported`], as `outbox.retention.dead-lettered: 0` is refused.
    pub async fn purge(
        &self,
        published: Duration,
        dead_lettered: Option<Duration>,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<ExpiredCounts, OpsError> {
        if dead_lettered.is_some_and(|age| age.is_zero()) {
            return Err(OpsError::Unsupported {
                operation: "outbox.purge",
                reason: "a dead-lettered age of zero would delete every dead letter \
                         (committed events never delivered); give an age above zero"
                    .to_owned(),
            });
        }
        let outbox = self.outbox()?;
        let limit = BATCH as u32;
        let mut report = ExpiredCounts::default();
        let result = async {
            loop {
                let n = outbox.delete_published(published, limit).await?;
                report.published += n;
                progress(n);
                if n < u64::from(limit) {
                    break;
                }
            }
            if let Some(older_than) = dead_lettered {
                loop {
                    let n = outbox.delete_dead_lettered(older_than, limit).await?;
                    report.dead_lettered += n;
                    progress(n);
                    if n < u64::from(limit) {
                        break;
                    }
                }
            }
            Ok::<_, idempotency_outbox::Error>(())
        }
        .await;
        let target = self.outbox_target(&[]);
        self.audit("outbox.purge.published", &target, report.published);
        if dead_lettered.is_some() {
            self.audit("outbox.purge.dead-lettered", &target, report.dead_lettered);
        }
        result.map_err(|e| {
            OpsError::from(e)
                .of_change()
                .after(report.published + report.dead_lettered)
        })?;
        Ok(report)
    }

    /// The partitions of a partitioned outbox.
    pub async fn partitions(&self) -> Result<Vec<Partition>, OpsError> {
        D::partitions(self.outbox()?).await
    }

    /// Creates the partitions of the current and the `partitioning.ahead` next intervals that
    /// do not exist yet; returns how many. Audited.
    pub async fn create_partitions(&self) -> Result<u32, OpsError> {
        let outbox = self.outbox()?;
        D::partitions(outbox).await?;
        let created = outbox
            .prepare_storage()
            .await
            .map_err(|e| self.unconfirmed("outbox.partitions.create.unconfirmed", e))?;
        self.audit(
            "outbox.partitions.create",
            &self.outbox_target(&[]),
            created.into(),
        );
        Ok(created)
    }

    /// Drops the partitions every row of which `outbox.retention` would delete; returns how
    /// many. Audited. With `outbox.retention.enabled: false` nothing expires:
    /// [`OpsError::Unsupported`], nothing dropped (as `cleanup` deletes no outbox row then).
    pub async fn drop_expired_partitions(&self) -> Result<u32, OpsError> {
        let outbox = self.outbox()?;
        D::partitions(outbox).await?;
        let retention = &self.retention()?;
        if !retention.enabled {
            return Err(OpsError::Unsupported {
                operation: "outbox.partitions.drop-expired",
                reason: "outbox.retention.enabled is false, so no outbox row expires and no \
                         partition is dropped; enable retention, or detach and drop a \
                         partition by hand"
                    .to_owned(),
            });
        }
        let dropped = outbox
            .drop_expired(retention.published, retention.dead_lettered)
            .await
            .map_err(|e| self.unconfirmed("outbox.partitions.drop-expired.unconfirmed", e))?;
        self.audit(
            "outbox.partitions.drop-expired",
            &self.outbox_target(&[]),
            dropped.into(),
        );
        Ok(dropped)
    }

    /// `error` as the failure of an outbox change, audited as `action` (the change's own,
    /// `.unconfirmed`) when it may have been applied.
    fn unconfirmed(&self, action: &'static str, error: idempotency_outbox::Error) -> OpsError {
        let error = OpsError::from(error).of_change();
        if matches!(error, OpsError::Unconfirmed { .. }) {
            self.audit(action, &self.outbox_target(&[]), 0);
        }
        error
    }

    fn outbox_target(&self, ids: &[Uuid]) -> String {
        let table = self
            .settings
            .outbox
            .as_ref()
            .map_or("outbox", |o| o.table_name.as_str());
        outbox_target(table, ids)
    }

    /// `outbox.retention`, checked as the relay checks it (a `dead-lettered` of zero is
    /// refused): the CLI and the admin load settings without starting a relay.
    fn retention(&self) -> Result<idempotency_outbox::config::RetentionConfig, OpsError> {
        let retention = self
            .settings
            .outbox
            .as_ref()
            .ok_or(OpsError::NoOutbox)?
            .retention
            .clone();
        retention.validate().map_err(|e| OpsError::Unsupported {
            operation: "outbox.retention",
            reason: e.to_string(),
        })?;
        Ok(retention)
    }

    /// What cleanup would delete now: expired records, and the outbox rows past
    /// `outbox.retention` when it is enabled.
    pub async fn cleanup_preview(&self) -> Result<CleanupReport, OpsError> {
        let mut report = CleanupReport {
            records: self.store.key_stats().await?.expired,
            ..CleanupReport::default()
        };
        if let Some(outbox) = &self.outbox {
            let retention = self.retention()?;
            if retention.enabled {
                report.outbox = outbox
                    .expired_counts(retention.published, retention.dead_lettered)
                    .await?;
            }
        }
        Ok(report)
    }

    /// One cleanup run now: expired records in batches of
    /// `persistence.cleanup.batch-size`, then the outbox's retention as the relay runs it
    /// (partitions ahead, whole partitions dropped, then batched deletes). Audited.
    pub async fn cleanup(
        &self,
        mut progress: impl FnMut(u64) + Send,
    ) -> Result<CleanupReport, OpsError> {
        // The outbox's retention is checked before anything is deleted.
        if self.outbox.is_some() {
            self.retention()?;
        }
        let batch = self
            .settings
            .idempotency
            .persistence
            .cleanup
            .batch_size
            .max(1);
        let mut report = CleanupReport::default();
        let records = async {
            loop {
                let n = self.store.delete_expired_batch(batch).await?;
                report.records += n;
                progress(n);
                if n < u64::from(batch) {
                    break;
                }
            }
            Ok::<_, OpsError>(())
        }
        .await;
        self.audit(
            "cleanup.records",
            &self.settings.idempotency.persistence.table_name,
            report.records,
        );
        records.map_err(|e| e.of_change().after(report.records))?;
        let Some(outbox) = &self.outbox else {
            return Ok(report);
        };
        let retention = self.retention()?;
        if !retention.enabled {
            return Ok(report);
        }
        // The records deleted above stay deleted whatever fails below.
        let deleted = report.records;
        let created = outbox.prepare_storage().await.map_err(|e| {
            self.unconfirmed("cleanup.partitions.create.unconfirmed", e)
                .after(deleted)
        })?;
        self.audit(
            "cleanup.partitions.create",
            &self.outbox_target(&[]),
            created.into(),
        );
        report.partitions_dropped = outbox
            .drop_expired(retention.published, retention.dead_lettered)
            .await
            .map_err(|e| {
                self.unconfirmed("cleanup.partitions.drop-expired.unconfirmed", e)
                    .after(deleted)
            })?;
        self.audit(
            "cleanup.partitions.drop-expired",
            &self.outbox_target(&[]),
            report.partitions_dropped.into(),
        );
        // A dropped partition counts as one change below.
        let deleted = deleted + u64::from(report.partitions_dropped);
        report.outbox = match self
            .purge(retention.published, retention.dead_lettered, progress)
            .await
        {
            Ok(purged) => purged,
            Err(OpsError::Partial { done, source }) => {
                return Err(OpsError::Partial {
                    done: done + deleted,
                    source,
                });
            }
            Err(e) => return Err(e.after(deleted)),
        };
        Ok(report)
    }
}

/// The audit target of an outbox change: the outbox table, with the first ids.
fn outbox_target(table: &str, ids: &[Uuid]) -> String {
    const SHOWN: usize = 3;
    let mut target = table.to_owned();
    if !ids.is_empty() {
        let shown: Vec<String> = ids.iter().take(SHOWN).map(Uuid::to_string).collect();
        target.push(':');
        target.push_str(&shown.join(","));
        if ids.len() > SHOWN {
            target.push_str(&format!(",+{}", ids.len() - SHOWN));
        }
    }
    target
}

/// A failure of the schema's setup as [`OpsError::Schema`] on `table` when a statement or the
/// store failed; any other (a property) stays [`OpsError::Setup`].
fn schema_failed(table: &str, error: crate::Error) -> OpsError {
    match error {
        crate::Error::Store(source) | crate::Error::Outbox(source) => OpsError::Schema {
            table: table.to_owned(),
            source,
        },
        other => OpsError::Setup(other),
    }
}
