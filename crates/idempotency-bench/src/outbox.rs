//! Outbox scenarios: what enqueueing costs inside the business transaction, and how fast a relay
//! drains the table to NATS JetStream with publish acks.

use std::time::{Duration, Instant};

use idempotency_core::config::{SchemaConfig, SchemaMode};
use idempotency_outbox::config::{Ordering, OutboxConfig, WakeUp};
use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::store::{Housekeeping, RelayStore};
use idempotency_outbox::{NewEvent, Relay};
use idempotency_pg::PgOutbox;
use sqlx::{self, AssertSqlSafe};

use crate::harness::{Scenario, op};
use crate::idempotency::{Setup, insert_payment};

fn event(order: &str) -> NewEvent {
    NewEvent::new(
        "payment",
        order,
        "PaymentCreated",
        &serde_json::json!({"orderId": order, "amount": "100.00"}),
    )
    .expect("event")
}

/// The business transaction with one outbox event, through the library and as the very same
/// statement issued directly with sqlx: with the default configuration (ordered, NOTIFY at
/// commit) and with the plainest one (unordered, no NOTIFY: a single INSERT).
pub(crate) async fn enqueue(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    for (label, ordering, notify) in [
        (
            "ordered, NOTIFY",
            Ordering::Ordered,
            Some("outbox".to_owned()),
        ),
        ("unordered, no NOTIFY", Ordering::Unordered, None),
    ] {
        let config = OutboxConfig {
            table_name: idempotency_testing::unique_name("bench_outbox"),
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ordering,
            notify_channel: notify.clone(),
            ..Default::default()
        };
        let outbox = PgOutbox::from_config(setup.pool.clone(), &config)
            .await
            .expect("outbox");

        let (pool, library) = (setup.pool.clone(), outbox.clone());
        let through_library = op(move |c, i| {
            let (pool, outbox) = (pool.clone(), library.clone());
            async move {
                let order = format!("ob-{c}-{i}");
                let mut tx = pool.begin().await.expect("begin");
                insert_payment(&mut tx, &order).await.expect("insert");
                outbox
                    .enqueue(&mut tx, &event(&order))
                    .await
                    .expect("enqueue");
                tx.commit().await.expect("commit");
            }
        });

        let (pool, statement) = (setup.pool.clone(), outbox.enqueue_statement().to_owned());
        let direct = op(move |c, i| {
            let (pool, statement, notify) = (pool.clone(), statement.clone(), notify.clone());
            async move {
                let order = format!("od-{c}-{i}");
                let e = event(&order);
                let mut tx = pool.begin().await.expect("begin");
                insert_payment(&mut tx, &order).await.expect("insert");
                let query = sqlx::query(AssertSqlSafe(statement))
                    .bind(vec![e.id()])
                    .bind(vec![e.aggregate_type()])
                    .bind(vec![e.aggregate_id()])
                    .bind(vec![e.event_type()])
                    .bind(vec![e.payload()])
                    .bind(vec!["{}"]);
                let query = match notify {
                    Some(channel) => query.bind(channel),
                    None => query,
                };
                query.execute(&mut *tx).await.expect("enqueue statement");
                tx.commit().await.expect("commit");
            }
        });
        scenarios.push(Scenario::new(
            format!("outbox ({label}): business transaction + enqueue"),
            clients,
            through_library,
        ));
        scenarios.push(Scenario::new(
            format!("direct SQL ({label}): business transaction + the enqueue statement"),
            clients,
            direct,
        ));
    }
    scenarios
}

/// The drain's configuration: an ordered outbox on `table`, polled every 20 ms (no NOTIFY, so
/// every backend drains the same way), `workers` workers claiming `batch` rows.
pub(crate) fn drain_config(table: &str, workers: usize, batch: u32) -> OutboxConfig {
    let mut config = OutboxConfig {
        table_name: table.to_owned(),
        schema: SchemaConfig {
            mode: SchemaMode::Create,
        },
        ordering: Ordering::Ordered,
        notify_channel: None,
        ..Default::default()
    };
    config.relay.workers = workers;
    config.relay.batch_size = batch;
    config.relay.wake_up = WakeUp::Poll;
    config.relay.poll_interval = Duration::from_millis(20);
    config
}

/// `events` events over 1000 aggregates, in chunks of 500 (one transaction each).
pub(crate) fn drain_events(events: usize) -> Vec<Vec<NewEvent>> {
    (0..events)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(|chunk| {
            chunk
                .iter()
                .map(|n| {
                    NewEvent::new(
                        format!("agg{}", n % 1000),
                        format!("{n}"),
                        "Drained",
                        &serde_json::json!({"n": n}),
                    )
                    .expect("event")
                })
                .collect()
        })
        .collect()
}

/// Publishes `events` pending rows of `outbox` to a JetStream stream of their own with a relay
/// configured by `config`, awaiting each ack. Returns events/s.
pub(crate) async fn drain_to_jetstream<S: RelayStore + Housekeeping>(
    outbox: S,
    config: &OutboxConfig,
    events: usize,
) -> f64 {
    let table = &config.table_name;
    let client = async_nats::connect(idempotency_testing::nats_url())
        .await
        .expect("nats");
    let jetstream = async_nats::jetstream::new(client);
    let stream = table.to_uppercase();
    jetstream
        .create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{table}.>")],
            ..Default::default()
        })
        .await
        .expect("stream");
    let publisher = NatsPublisher::from_context(jetstream.clone())
        .with_subject(&format!("{table}.{{aggregate_type}}.{{event_type}}"))
        .expect("subject");
    let relay = Relay::new(outbox, publisher, config).expect("relay");
    let started = Instant::now();
    let handle = relay.spawn();
    while relay.totals().published < events as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    handle.shutdown().await;
    let _ = jetstream.delete_stream(&stream).await;
    events as f64 / elapsed.as_secs_f64()
}

/// Drains `events` pending events (1000 aggregates, ordered) from the PostgreSQL outbox with a
/// relay of `workers` workers and `batch` rows per claim, publishing to JetStream and awaiting
/// each ack. Returns events/s.
pub(crate) async fn relay_drain(setup: &Setup, events: usize, workers: usize, batch: u32) -> f64 {
    let table = idempotency_testing::unique_name("drain");
    let config = drain_config(&table, workers, batch);
    let outbox = PgOutbox::from_config(setup.pool.clone(), &config)
        .await
        .expect("outbox");
    for chunk in drain_events(events) {
        let mut tx = setup.pool.begin().await.expect("begin");
        outbox.enqueue_all(&mut tx, &chunk).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    let rate = drain_to_jetstream(outbox, &config, events).await;
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE \"{table}\", \"{table}_sequences\""
    )))
    .execute(&setup.pool)
    .await;
    rate
}
