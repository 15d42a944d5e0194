//! The MySQL / MariaDB scenarios (`--backend mysql`): the business transaction alone, the same
//! SQL the store issues (taken from the store itself), `execute`, a replay with
//! lookup-before-acquire next to a bare primary-key SELECT, and the relay's drain to JetStream.

use idempotency_core::{Call, ExecutionResult, IdempotencyKey, IdempotencyService, Outcome};
use idempotency_mysql::sqlx::{self, AssertSqlSafe, MySqlConnection, MySqlPool};
use idempotency_mysql::{MysqlOutbox, MysqlStore};

use crate::harness::{Op, Scenario, op};
use crate::outbox::{drain_config, drain_events, drain_to_jetstream};

const HASH: &str = "5f2b1c0e0a7d4e8b9c3a6f1d2e4b7a8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6";
/// The service's default in-flight budget (10 s), as `innodb_lock_wait_timeout`.
const LOCK_BUDGET_SECONDS: u64 = 10;
/// One year, in microseconds.
const TTL_MICROS: i64 = 365 * 86_400 * 1_000_000;

async fn insert_payment(conn: &mut MySqlConnection, order: &str) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query("INSERT INTO bench_payments (order_id, amount) VALUES (?, 100.00)")
            .bind(order)
            .execute(conn)
            .await?
            .last_insert_id(),
    )
}

fn payment_body(id: u64, order: &str) -> serde_json::Value {
    serde_json::json!({"paymentId": id, "orderId": order, "amount": "100.00", "status": "CONFIRMED"})
}

fn request(order: &str) -> serde_json::Value {
    serde_json::json!({"orderId": order, "recipient": "alice", "amount": "100.00"})
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Idempotency(#[from] idempotency_core::Error),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// A fresh database with the records table and the business table.
pub(crate) struct Setup {
    pool: MySqlPool,
    store: MysqlStore,
    run: u64,
}

impl Setup {
    pub(crate) async fn new(clients: u64) -> Self {
        let pool = crate::pool::mysql(u32::try_from(clients).unwrap_or(64) + 8).await;
        let store = MysqlStore::new(pool.clone());
        store.create_schema().await.expect("schema");
        sqlx::raw_sql(
            "CREATE TABLE bench_payments (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             order_id VARCHAR(255) NOT NULL, amount DECIMAL(12,2) NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("business table");
        Self {
            pool,
            store,
            run: u64::from(std::process::id()),
        }
    }

    fn statement(&self, name: &str) -> String {
        self.store
            .statement(name)
            .expect("known statement")
            .to_owned()
    }
}

/// The business transaction alone, the store's statements issued directly, and `execute`.
pub(crate) fn first_executions(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let run = setup.run;
    let pool = setup.pool.clone();
    let baseline = op(move |c, i| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.expect("begin");
            insert_payment(&mut tx, &format!("o-{c}-{i}"))
                .await
                .expect("insert");
            tx.commit().await.expect("commit");
        }
    });

    let pool = setup.pool.clone();
    let [set_wait, acquire, restore, complete, completed_row] = [
        "set_lock_wait",
        "acquire",
        "restore_lock_wait",
        "complete",
        "completed_row",
    ]
    .map(|name| setup.statement(name));
    let direct = op(move |c, i| {
        let pool = pool.clone();
        let (set_wait, acquire, restore, complete, completed_row) = (
            set_wait.clone(),
            acquire.clone(),
            restore.clone(),
            complete.clone(),
            completed_row.clone(),
        );
        async move {
            let key = format!("direct-{run}-{c}-{i}");
            let mut tx = pool.begin().await.expect("begin");
            sqlx::query(AssertSqlSafe(set_wait))
                .bind(LOCK_BUDGET_SECONDS)
                .execute(&mut *tx)
                .await
                .expect("set wait");
            sqlx::query(AssertSqlSafe(acquire))
                .bind("PAY")
                .bind("")
                .bind(&key)
                .bind(HASH)
                .bind(TTL_MICROS)
                .execute(&mut *tx)
                .await
                .expect("acquire");
            sqlx::query(AssertSqlSafe(restore))
                .execute(&mut *tx)
                .await
                .expect("restore wait");
            let id = insert_payment(&mut tx, &key).await.expect("insert");
            sqlx::query(AssertSqlSafe(complete))
                .bind("COMPLETED")
                .bind(payment_body(id, &key).to_string())
                .bind(None::<&str>) // error code
                .bind(None::<&str>) // trace id
                .bind(None::<&str>) // span id
                .bind("PAY")
                .bind("")
                .bind(&key)
                .execute(&mut *tx)
                .await
                .expect("complete");
            sqlx::query(AssertSqlSafe(completed_row))
                .bind("PAY")
                .bind("")
                .bind(&key)
                .fetch_one(&mut *tx)
                .await
                .expect("completed row");
            tx.commit().await.expect("commit");
        }
    });

    let service = IdempotencyService::new(setup.store.clone());
    let execute = op(move |c, i| {
        let service = service.clone();
        let key = IdempotencyKey::new(format!("exec-{run}-{c}-{i}")).expect("key");
        async move {
            let body = request(key.as_str());
            let outcome: Outcome<serde_json::Value> = service
                .execute(
                    Call::new("PAY", key.clone(), &body),
                    async |conn: &mut MySqlConnection| {
                        let id = insert_payment(conn, key.as_str()).await?;
                        Ok::<_, BenchError>(ExecutionResult::success(payment_body(
                            id,
                            key.as_str(),
                        )))
                    },
                )
                .await
                .expect("execute");
            assert!(outcome.is_executed());
        }
    });
    vec![
        Scenario::new("mysql baseline: business transaction", clients, baseline),
        Scenario::new(
            "mysql direct SQL: wait budget, claim, business, complete",
            clients,
            direct,
        ),
        Scenario::new("mysql execute: first execution", clients, execute),
    ]
}

/// A replay through the store with lookup-before-acquire, next to the bare primary-key SELECT
/// it issues; one client each.
pub(crate) async fn replays(setup: &Setup) -> Vec<Scenario> {
    let key = IdempotencyKey::new(format!("replay-{}", setup.run)).expect("key");
    let seeded: Outcome<serde_json::Value> = IdempotencyService::new(setup.store.clone())
        .execute(
            Call::new("PAY", key.clone(), &request("replay")),
            async |conn| {
                let id = insert_payment(conn, "replay").await?;
                Ok::<_, BenchError>(ExecutionResult::success(payment_body(id, "replay")))
            },
        )
        .await
        .expect("seed");
    assert!(seeded.is_executed());
    let service = IdempotencyService::builder(setup.store.clone())
        .config(idempotency_core::ServiceOptions {
            lookup_before_acquire: true,
            ..Default::default()
        })
        .build();
    let replay_key = key.clone();
    let replay: Op = op(move |_, _| {
        let (service, key) = (service.clone(), replay_key.clone());
        async move {
            let outcome: Outcome<serde_json::Value> = service
                .execute(
                    Call::new("PAY", key, &request("replay")),
                    async |_conn: &mut MySqlConnection| {
                        Ok::<_, BenchError>(ExecutionResult::success(serde_json::json!(null)))
                    },
                )
                .await
                .expect("replay");
            assert!(outcome.is_replayed());
        }
    });
    let (pool, find, k) = (
        setup.pool.clone(),
        setup.statement("find"),
        key.as_str().to_owned(),
    );
    let bare: Op = op(move |_, _| {
        let (pool, find, k) = (pool.clone(), find.clone(), k.clone());
        async move {
            let row = sqlx::query(AssertSqlSafe(find))
                .bind("PAY")
                .bind("")
                .bind(k)
                .fetch_optional(&pool)
                .await
                .expect("select");
            assert!(row.is_some());
        }
    });
    vec![
        Scenario::new("mysql replay (lookup-before-acquire)", 1, replay),
        Scenario::new("mysql bare: primary-key SELECT", 1, bare),
    ]
}

/// Drains `events` pending events (1000 aggregates, ordered) from the MySQL outbox with a relay
/// of `workers` workers and `batch` rows per claim, publishing to JetStream and awaiting each
/// ack. Returns events/s.
pub(crate) async fn relay_drain(setup: &Setup, events: usize, workers: usize, batch: u32) -> f64 {
    let table = idempotency_testing::unique_name("drain");
    let config = drain_config(&table, workers, batch);
    let outbox = MysqlOutbox::from_config(setup.pool.clone(), &config)
        .await
        .expect("outbox");
    for chunk in drain_events(events, 1000) {
        let mut tx = setup.pool.begin().await.expect("begin");
        outbox.enqueue_all(&mut tx, &chunk).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    drain_to_jetstream(outbox, &config, events, None).await.0
}
