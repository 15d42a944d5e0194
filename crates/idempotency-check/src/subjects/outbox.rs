//! The outbox: business changes and their events enqueued in one transaction (committed, rolled
//! back, or dropped mid-way), relayed in ordered mode by workers that are aborted and restarted
//! at random points to a publisher that fails at random, then consumed through the inbox by
//! concurrent consumers that see redeliveries.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_core::config::SchemaMode;
use idempotency_mysql::{MysqlInbox, MysqlOutbox};
use idempotency_outbox::config::{InboxConfig, Ordering};
use idempotency_outbox::testing::{OutboxBackend, suite_config};
use idempotency_outbox::{
    Ack, Enqueue, Housekeeping, Inbox, NewEvent, OutboxMessage, PublishError, PublishErrorKind,
    Publisher, Relay,
};
use idempotency_pg::{PgInbox, PgOutbox};
use idempotency_sqlite::{SqliteInbox, SqliteOutbox};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sqlx::{AssertSqlSafe, MySqlPool, PgPool, Row, SqlitePool};
use uuid::Uuid;

use super::{Ctx, dropped_or};
use crate::backend::{mysql_unclean, pg_unclean, sqlite_unclean};
use crate::faults::{Faults, Injected};
use crate::history::{Answer, Entry, TxEnd};
use crate::invariants::{self, Violation};
use crate::plan::{Kind, Op, Plan};
use crate::{CheckError, Run};

/// The consumer's name in the inbox.
const CONSUMER: &str = "check";

/// A database for the outbox subject: the suite's backend, plus the business and consumer
/// tables.
pub trait OutboxDb: OutboxBackend + Clone {
    /// A fresh database (schema, database or file) with the business and applied tables.
    fn fresh() -> impl Future<Output = Result<Self, CheckError>> + Send;
    /// Writes the business change that `event` announces, on the transaction's connection.
    fn change(
        conn: &mut Self::Connection,
        aggregate: &str,
        event: Uuid,
        op: u64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Applies `message` on the consumer's transaction.
    fn apply(
        conn: &mut Self::Connection,
        message: Uuid,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
    /// Every committed change: its event id.
    fn changes(&self) -> impl Future<Output = Result<Vec<Uuid>, CheckError>> + Send;
    /// Every applied message id, once per application.
    fn applied(&self) -> impl Future<Output = Result<Vec<Uuid>, CheckError>> + Send;
    /// One line per pooled connection (of the pool enqueue, the relay and the inbox share)
    /// that is unclean after the history or does not come back (`pool-is-clean`).
    fn unclean(&self) -> impl Future<Output = Result<Vec<String>, CheckError>> + Send;
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(db)`
fn db(error: sqlx::Error) -> CheckError {
    CheckError::Database(error.to_string())
}

fn setup(error: impl std::fmt::Display) -> CheckError {
    CheckError::Setup(error.to_string())
}

fn uuids(rows: &[String]) -> Result<Vec<Uuid>, CheckError> {
    rows.iter()
        .map(|s| Uuid::parse_str(s).map_err(setup))
        .collect()
}

fn inbox_config() -> InboxConfig {
    let mut config = InboxConfig::default();
    config.schema.mode = SchemaMode::Create;
    config
}

/// Implements the suite's backend and [`OutboxDb`] for one database; `$p(n)` is its `n`th
/// placeholder.
macro_rules! outbox_db {
    ($ty:ident, $pool:ty, $db:ty, $tx:ty, $outbox:ty, $inbox:ty, $begin:expr, $fresh:expr, $ph:expr, $unclean:path) => {
        /// The outbox subject's database.
        #[derive(Debug, Clone)]
        pub struct $ty($pool);

        impl OutboxBackend for $ty {
            type Connection = <$db as sqlx::Database>::Connection;
            type Transaction = $tx;
            type Pooled = sqlx::pool::PoolConnection<$db>;
            type Outbox = $outbox;
            type Inbox = $inbox;

            async fn outbox(&self, config: &idempotency_outbox::config::OutboxConfig) -> $outbox {
                match <$outbox>::from_config(self.0.clone(), config).await {
                    Ok(outbox) => outbox,
                    Err(error) => panic!("the outbox could not be set up: {error}"),
                }
            }

            async fn inbox(&self) -> $inbox {
                match <$inbox>::from_config(self.0.clone(), &inbox_config()).await {
                    Ok(inbox) => inbox,
                    Err(error) => panic!("the inbox could not be set up: {error}"),
                }
            }

            async fn begin(&self) -> Self::Transaction {
                match $begin(&self.0).await {
                    Ok(tx) => tx,
                    Err(error) => panic!("begin: {error}"),
                }
            }

            async fn acquire(&self) -> Self::Pooled {
                match self.0.acquire().await {
                    Ok(conn) => conn,
                    Err(error) => panic!("acquire: {error}"),
                }
            }

            async fn commit(tx: Self::Transaction) {
                let _ = tx.commit().await;
            }

            async fn rollback(tx: Self::Transaction) {
                let _ = tx.rollback().await;
            }
        }

        impl OutboxDb for $ty {
            async fn fresh() -> Result<Self, CheckError> {
                let pool: $pool = $fresh.await?;
                for table in [
                    "CREATE TABLE check_changes (aggregate VARCHAR(64) NOT NULL, event_id VARCHAR(64) NOT NULL, op BIGINT NOT NULL)",
                    "CREATE TABLE check_applied (message_id VARCHAR(64) NOT NULL)",
                ] {
                    sqlx::raw_sql(table).execute(&pool).await.map_err(db)?;
                }
                Ok(Self(pool))
            }

            async fn change(
                conn: &mut Self::Connection,
                aggregate: &str,
                event: Uuid,
                op: u64,
            ) -> Result<(), sqlx::Error> {
                let sql = format!(
                    "INSERT INTO check_changes (aggregate, event_id, op) VALUES ({}, {}, {})",
                    $ph(1),
                    $ph(2),
                    $ph(3)
                );
                sqlx::query(AssertSqlSafe(sql))
                    .bind(aggregate)
                    .bind(event.to_string())
                    .bind(i64::try_from(op).unwrap_or(i64::MAX))
                    .execute(conn)
                    .await
                    .map(|_| ())
            }

            async fn apply(conn: &mut Self::Connection, message: Uuid) -> Result<(), sqlx::Error> {
                let sql = format!("INSERT INTO check_applied (message_id) VALUES ({})", $ph(1));
                sqlx::query(AssertSqlSafe(sql))
                    .bind(message.to_string())
                    .execute(conn)
                    .await
                    .map(|_| ())
            }

            async fn changes(&self) -> Result<Vec<Uuid>, CheckError> {
                let rows = sqlx::query("SELECT event_id FROM check_changes")
                    .fetch_all(&self.0)
                    .await
                    .map_err(db)?;
                uuids(&rows.iter().map(|r| r.get::<String, _>(0)).collect::<Vec<_>>())
            }

            async fn applied(&self) -> Result<Vec<Uuid>, CheckError> {
                let rows = sqlx::query("SELECT message_id FROM check_applied")
                    .fetch_all(&self.0)
                    .await
                    .map_err(db)?;
                uuids(&rows.iter().map(|r| r.get::<String, _>(0)).collect::<Vec<_>>())
            }

            async fn unclean(&self) -> Result<Vec<String>, CheckError> {
                $unclean(&self.0).await
            }
        }
    };
}

fn dollar(n: usize) -> String {
    format!("${n}")
}

fn question(_: usize) -> String {
    "?".to_owned()
}

async fn pg_fresh() -> Result<PgPool, CheckError> {
    Ok(idempotency_testing::pg_pool_with(8).await)
}

async fn mysql_fresh() -> Result<MySqlPool, CheckError> {
    Ok(idempotency_testing::mysql_pool_with(8).await)
}

async fn sqlite_fresh() -> Result<SqlitePool, CheckError> {
    let path = std::env::temp_dir().join(format!(
        "{}.db",
        idempotency_testing::unique_name("check_outbox")
    ));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(4)
        .after_release(|conn, _| Box::pin(idempotency_sqlite::reusable(conn)))
        .connect_with(options)
        .await
        .map_err(db)
}

async fn sqlite_begin(
    pool: &SqlitePool,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    pool.begin_with("BEGIN IMMEDIATE").await
}

outbox_db!(
    PgDb,
    PgPool,
    sqlx::Postgres,
    sqlx::Transaction<'static, sqlx::Postgres>,
    PgOutbox,
    PgInbox,
    idempotency_pg::begin,
    pg_fresh(),
    dollar,
    pg_unclean
);
outbox_db!(
    MysqlDb,
    MySqlPool,
    sqlx::MySql,
    idempotency_mysql::MysqlTransaction,
    MysqlOutbox,
    MysqlInbox,
    idempotency_mysql::begin,
    mysql_fresh(),
    question,
    mysql_unclean
);
outbox_db!(
    SqliteDb,
    SqlitePool,
    sqlx::Sqlite,
    sqlx::Transaction<'static, sqlx::Sqlite>,
    SqliteOutbox,
    SqliteInbox,
    sqlite_begin,
    sqlite_fresh(),
    question,
    sqlite_unclean
);

/// A broker that refuses at random (as unavailable), and keeps what it confirmed in order.
#[derive(Debug, Clone)]
struct FlakyBroker {
    rng: Arc<Mutex<StdRng>>,
    failure: f64,
    published: Arc<Mutex<Vec<OutboxMessage>>>,
    faults: Arc<Faults>,
}

impl Publisher for FlakyBroker {
    fn destination(&self) -> &str {
        "check"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let fail = self
            .rng
            .lock()
            .map(|mut rng| rng.random_bool(self.failure))
            .unwrap_or(false);
        if fail {
            self.faults.count(Injected::PublishRefused);
            return Err(PublishError::kind_only(PublishErrorKind::Unavailable));
        }
        if let Ok(mut published) = self.published.lock() {
            published.push(message.clone());
        }
        Ok(Ack::default())
    }
}

/// One operation: a business change and its events in one transaction.
async fn one<B: OutboxDb>(
    backend: B,
    outbox: B::Outbox,
    op: Op,
    start: Instant,
    faults: Arc<Faults>,
) -> Entry {
    let aggregate = format!("a{}", op.key);
    let sent = start.elapsed();
    let events = if op.kind == Kind::Reject { 2 } else { 1 };
    let transaction = async {
        let mut tx = backend.begin().await;
        for n in 0..events {
            let event = NewEvent::from_json_text(
                "check",
                &aggregate,
                "Changed",
                format!(r#"{{"op":{},"n":{n}}}"#, op.id),
            );
            let ids = match outbox.enqueue_all(&mut tx, &[event]).await {
                Ok(ids) => ids,
                Err(error) => {
                    B::rollback(tx).await;
                    return (
                        Answer::Error(format!("enqueue: {error}")),
                        TxEnd::RolledBack,
                    );
                }
            };
            for id in ids {
                if let Err(error) = B::change(&mut tx, &aggregate, id, op.id).await {
                    B::rollback(tx).await;
                    return (Answer::Error(format!("change: {error}")), TxEnd::RolledBack);
                }
            }
        }
        match op.kind {
            Kind::Fail => {
                B::rollback(tx).await;
                (Answer::Error("rolled back".to_owned()), TxEnd::RolledBack)
            }
            Kind::Slow(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                B::commit(tx).await;
                (Answer::Done, TxEnd::Committed)
            }
            _ => {
                B::commit(tx).await;
                (Answer::Done, TxEnd::Committed)
            }
        }
    };
    let (answer, tx) = dropped_or(op.fault, &faults, transaction)
        .await
        .unwrap_or((Answer::Dropped, TxEnd::Dropped));
    Entry {
        op,
        identity: aggregate,
        answers: vec![(op.key, answer)],
        tx,
        span: (sent, start.elapsed()),
    }
}

/// Consumes `messages` through the inbox with three concurrent consumers (redeliveries race).
async fn consume<B: OutboxDb>(backend: &B, messages: Vec<Uuid>) -> Result<(), CheckError> {
    let inbox = Arc::new(backend.inbox().await);
    let mut tasks = tokio::task::JoinSet::new();
    for part in 0..3 {
        let messages: Vec<Uuid> = messages.iter().skip(part).step_by(3).copied().collect();
        let backend = backend.clone();
        let inbox = Arc::clone(&inbox);
        tasks.spawn(async move {
            for message in messages {
                let mut tx = backend.begin().await;
                let id = message.to_string();
                let fresh = inbox.record(&mut tx, CONSUMER, &id).await.map_err(setup)?;
                if fresh {
                    B::apply(&mut tx, message).await.map_err(db)?;
                }
                B::commit(tx).await;
            }
            Ok::<_, CheckError>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| CheckError::Client(e.to_string()))??;
    }
    Ok(())
}

/// Runs `plan` through the outbox on a fresh `B`.
pub async fn run<B: OutboxDb>(plan: &Plan, ctx: &Ctx) -> Result<Run, CheckError> {
    let faults = ctx.faults();
    let backend = B::fresh().await?;
    let mut config = suite_config(Ordering::Ordered);
    config.relay.workers = 2;
    config.relay.batch_size = 8;
    let outbox = backend.outbox(&config).await;
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x0b0c);
    let broker = FlakyBroker {
        rng: Arc::new(Mutex::new(StdRng::seed_from_u64(plan.seed ^ 0xb40c))),
        failure: rng.random_range(0.0..0.3),
        published: Arc::new(Mutex::new(Vec::new())),
        faults: Arc::clone(faults),
    };
    let relay = Relay::new(outbox.clone(), broker.clone(), &config).map_err(setup)?;
    let start = Instant::now();
    let clients = {
        let backend = backend.clone();
        let outbox = outbox.clone();
        let counts = Arc::clone(faults);
        super::clients(plan, (None, None), faults, move |op| {
            let backend = backend.clone();
            let outbox = outbox.clone();
            let counts = Arc::clone(&counts);
            async move { Ok(one(backend, outbox, op, start, counts).await) }
        })
    };
    // The relay's workers are aborted at random points (no graceful shutdown) and restarted.
    let aborts: Vec<u64> = (0..rng.random_range(1..4))
        .map(|_| rng.random_range(10..400))
        .collect();
    let chaos = async {
        let mut handle = relay.spawn();
        for ms in &aborts {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            handle.abort();
            faults.count(Injected::RelayAbort);
            handle = relay.spawn();
        }
        handle
    };
    let (entries, handle) = tokio::join!(clients, chaos);
    let entries = entries?;
    // Drain: every committed event must reach the broker.
    let deadline = Instant::now() + Duration::from_secs(30);
    while outbox.stats().await.map_err(setup)?.pending > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = handle.shutdown().await;
    let published = broker
        .published
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    // Redeliveries: every message once more at random.
    let mut delivered: Vec<Uuid> = published.iter().map(|m| m.id).collect();
    for message in &published {
        if rng.random_bool(0.3) {
            delivered.push(message.id);
            faults.count(Injected::Redelivery);
        }
    }
    consume(&backend, delivered).await?;
    // Every connection enqueue, the aborted and the stopped relay workers and the inbox used is
    // back in the pool, outside a transaction, its session settings restored.
    let unclean = backend.unclean().await?;
    let changes = backend.changes().await?;
    let applied = backend.applied().await?;
    let violations = check(&changes, &published, &applied);
    Ok(Run::new(entries, violations, unclean))
}

/// The outbox invariants.
fn check(changes: &[Uuid], published: &[OutboxMessage], applied: &[Uuid]) -> Vec<Violation> {
    let mut out = Vec::new();
    let committed: HashSet<Uuid> = changes.iter().copied().collect();
    let sent: HashSet<Uuid> = published.iter().map(|m| m.id).collect();
    for id in committed.difference(&sent) {
        out.push(Violation {
            invariant: invariants::EVERY_EVENT_PUBLISHED,
            group: None,
            detail: format!("the event {id} of a committed change was never published"),
        });
    }
    for message in published {
        if !committed.contains(&message.id) {
            out.push(Violation {
                invariant: invariants::NO_LONE_EVENT,
                group: None,
                detail: format!(
                    "{} of {} was published without a committed change",
                    message.id, message.aggregate_id
                ),
            });
        }
    }
    let mut seen = HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for message in published {
        if !seen.insert(message.id) {
            continue;
        }
        let sequence = message.sequence.unwrap_or_default();
        if let Some(previous) = last.insert(&message.aggregate_id, sequence)
            && previous >= sequence
        {
            out.push(Violation {
                invariant: invariants::AGGREGATE_ORDER,
                group: None,
                detail: format!(
                    "{} published #{sequence} first after #{previous}",
                    message.aggregate_id
                ),
            });
        }
    }
    let mut counts: BTreeMap<Uuid, usize> = BTreeMap::new();
    for id in applied {
        *counts.entry(*id).or_default() += 1;
    }
    for id in &sent {
        match counts.get(id) {
            Some(1) => {}
            count => out.push(Violation {
                invariant: invariants::INBOX_ONCE,
                group: None,
                detail: format!("{id} applied {} times", count.copied().unwrap_or(0)),
            }),
        }
    }
    out
}
