//! Outbox scenarios: what enqueueing costs inside the business transaction, and how fast a relay
//! drains the table to NATS JetStream with publish acks (to Kafka: [`crate::kafka`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_core::config::{SchemaConfig, SchemaMode};
use idempotency_outbox::config::{Ordering, OutboxConfig, WakeUp};
use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::store::{Housekeeping, RelayStore};
use idempotency_outbox::{Ack, NewEvent, OutboxMessage, PublishError, Publisher, Relay};
use idempotency_pg::PgOutbox;
use sqlx::{self, AssertSqlSafe};
use uuid::Uuid;

use crate::harness::{Scenario, op};
use crate::idempotency::{PGBENCH_BUSINESS, PGBENCH_KEY, Setup, insert_payment};
use crate::pgbench::{Param, Pgbench, bind};

fn event(order: &str) -> NewEvent {
    NewEvent::new(
        "payment",
        order,
        "PaymentCreated",
        &serde_json::json!({"orderId": order, "amount": "100.00"}),
    )
    .expect("event")
}

/// One enqueue configuration the bench measures.
pub(crate) struct EnqueueCase {
    pub(crate) label: &'static str,
    ordering: Ordering,
    notify: bool,
    /// A NOTIFY at every enqueue (`notify-interval` 0s) rather than the default window.
    every_commit: bool,
}

impl EnqueueCase {
    /// Whether the library issues one fixed statement, so that the very same statement can be
    /// issued directly beside it: without a notification window.
    pub(crate) fn one_statement(&self) -> bool {
        !self.notify || self.every_commit
    }
}

/// The default (ordered, NOTIFY at most once per `notify-interval`), ordered with a NOTIFY at
/// every commit, and the plainest one (unordered, no NOTIFY: a single INSERT).
pub(crate) const ENQUEUE_CASES: [EnqueueCase; 3] = [
    EnqueueCase {
        label: "ordered, NOTIFY at most every 5ms (default)",
        ordering: Ordering::Ordered,
        notify: true,
        every_commit: false,
    },
    EnqueueCase {
        label: "ordered, NOTIFY every commit",
        ordering: Ordering::Ordered,
        notify: true,
        every_commit: true,
    },
    EnqueueCase {
        label: "unordered, no NOTIFY",
        ordering: Ordering::Unordered,
        notify: false,
        every_commit: true,
    },
];

/// The business transaction with one outbox event through the library, for each of
/// [`ENQUEUE_CASES`], and as the very same statement issued directly with sqlx where the
/// library issues one fixed statement.
pub(crate) async fn enqueue(setup: &Setup, clients: u64) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    for case in &ENQUEUE_CASES {
        let label = case.label;
        // A channel per configuration: notifications are database-wide.
        let table = idempotency_testing::unique_name("bench_outbox");
        let notify = case.notify.then(|| table.clone());
        let mut config = OutboxConfig {
            table_name: table,
            schema: SchemaConfig {
                mode: SchemaMode::Create,
            },
            ordering: case.ordering,
            notify_channel: notify.clone(),
            ..Default::default()
        };
        if case.every_commit {
            config.notify_interval = Duration::ZERO;
        }
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

        scenarios.push(Scenario::new(
            format!("outbox ({label}): business transaction + enqueue"),
            clients,
            through_library,
        ));
        if !case.one_statement() {
            continue;
        }
        let (pool, statement) = (setup.pool.clone(), outbox.enqueue_statement().to_owned());
        let channel = notify.clone();
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
            format!("direct SQL ({label}): business transaction + the enqueue statement"),
            clients,
            direct,
        ));
        if let Some(pgbench) = &setup.pgbench {
            scenarios.push(pgbench_enqueue(
                pgbench,
                label,
                outbox.enqueue_statement(),
                channel,
                clients,
            ));
        }
    }
    scenarios
}

/// The name of the pgbench scenario of an enqueue configuration, without its `pgbench: `
/// prefix.
pub(crate) fn pgbench_enqueue_name(label: &str) -> String {
    format!("business transaction + the enqueue statement ({label})")
}

/// The direct-SQL scenario of an enqueue configuration run by pgbench: the business insert and
/// the library's enqueue statement of one event in one transaction, so that the enqueue's
/// ratio to the business transaction alone has a floor measured in the same run.
fn pgbench_enqueue(
    pgbench: &Pgbench,
    label: &str,
    statement: &str,
    channel: Option<String>,
    clients: u64,
) -> Scenario {
    let defines = channel
        .map(|channel| vec![("channel", channel)])
        .unwrap_or_default();
    pgbench.scenario(
        &pgbench_enqueue_name(label),
        clients,
        enqueue_script(statement),
        defines,
    )
}

/// pgbench's script of [`pgbench_enqueue`]: one event bound as the library binds it
/// (one-element arrays), with a fresh id and aggregate per transaction as the library
/// scenario's order, and a payload of [`event`]'s shape; the channel is the variable `channel`.
fn enqueue_script(statement: &str) -> String {
    use Param::{Sql, Var};
    let enqueue = bind(
        statement,
        &[
            Sql("ARRAY[gen_random_uuid()]"),
            Sql("ARRAY['payment']"),
            Sql("ARRAY[:key::text]"),
            Sql("ARRAY['PaymentCreated']"),
            Sql(r#"ARRAY['{"orderId":"pgbench","amount":"100.00"}']"#),
            Sql("ARRAY['{}']"),
            Var("channel"),
        ],
    );
    format!("{PGBENCH_KEY}\nBEGIN;\n{PGBENCH_BUSINESS}\n{enqueue};\nCOMMIT;\n")
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

/// `events` events over `aggregates` aggregates (round robin: aggregate `agg<n % aggregates>` of
/// type `drain`, so each aggregate holds `events / aggregates` events in order), in chunks of
/// 500 (one transaction each).
pub(crate) fn drain_events(events: usize, aggregates: usize) -> Vec<Vec<NewEvent>> {
    let aggregates = aggregates.max(1);
    (0..events)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(|chunk| {
            chunk
                .iter()
                .map(|n| {
                    NewEvent::new(
                        "drain",
                        format!("agg{}", n % aggregates),
                        "Drained",
                        &serde_json::json!({"n": n}),
                    )
                    .expect("event")
                })
                .collect()
        })
        .collect()
}

/// A PostgreSQL outbox on `config`'s table holding a backlog of `events` pending events over
/// `aggregates` aggregates ([`drain_events`]), committed 500 to a transaction, then analyzed.
///
/// Autovacuum analyzes a table within a minute of such a burst; the bench measures the relay
/// after that, not during a new table's first minute. Until then the server believes the
/// indexes made on the empty table are empty, and an ordered claim may look for each
/// candidate's first row by reading every pending row (idempotency-pg's README, "Outbox and
/// inbox schema").
pub(crate) async fn backlog(
    setup: &Setup,
    config: &OutboxConfig,
    events: usize,
    aggregates: usize,
) -> PgOutbox {
    let outbox = PgOutbox::from_config(setup.pool.clone(), config)
        .await
        .expect("outbox");
    for chunk in drain_events(events, aggregates) {
        let mut tx = setup.pool.begin().await.expect("begin");
        outbox.enqueue_all(&mut tx, &chunk).await.expect("enqueue");
        tx.commit().await.expect("commit");
    }
    sqlx::raw_sql(AssertSqlSafe(format!(
        "ANALYZE {}",
        outbox.table().quoted()
    )))
    .execute(&setup.pool)
    .await
    .expect("analyze");
    outbox
}

/// Drops an outbox table made by [`backlog`] and its per-aggregate counters.
pub(crate) async fn drop_outbox(setup: &Setup, table: &str) {
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE \"{table}\", \"{table}_sequences\""
    )))
    .execute(&setup.pool)
    .await;
}

/// Runs `relay` until it has published `events` messages, then shuts it down. Returns the time
/// from its start to the last publish.
pub(crate) async fn run_until_published<S, P>(relay: &Relay<S, P>, events: usize) -> Duration
where
    S: RelayStore + Housekeeping,
    P: Publisher,
{
    let started = Instant::now();
    let handle = relay.spawn();
    while relay.totals().published < events as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    handle.shutdown().await;
    elapsed
}

/// A JetStream context and a stream named after `table` (upper case) on its subjects `<table>.>`.
async fn table_stream(table: &str) -> (async_nats::jetstream::Context, String) {
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
    (jetstream, stream)
}

/// Publishes `events` pending rows of `outbox` to a JetStream stream of their own with a relay
/// configured by `config`, awaiting each ack. Returns events/s, and the CPU time per event of
/// the three parties when `cpu` is given.
pub(crate) async fn drain_to_jetstream<S: RelayStore + Housekeeping>(
    outbox: S,
    config: &OutboxConfig,
    events: usize,
    cpu: Option<&Cpu>,
) -> (f64, Option<CpuPerEvent>) {
    let table = &config.table_name;
    let (jetstream, stream) = table_stream(table).await;
    let publisher = NatsPublisher::from_context(jetstream.clone())
        .with_subject(&format!("{table}.{{aggregate_type}}.{{event_type}}"))
        .expect("subject");
    let relay = Relay::new(outbox, publisher, config).expect("relay");
    let before = match cpu {
        Some(cpu) => Some(cpu.snapshot(&cpu.backends().await).await),
        None => None,
    };
    let elapsed = run_until_published(&relay, events).await;
    let mut spent = None;
    if let (Some(cpu), Some(before)) = (cpu, before) {
        let after = cpu.snapshot(&cpu.backends().await).await;
        let per = |a: f64, b: f64| (a - b) / events as f64;
        spent = Some(CpuPerEvent {
            postgres: after.postgres_since(&before) / events as f64,
            nats: per(after.nats, before.nats),
            relay: per(after.process, before.process),
        });
    }
    let _ = jetstream.delete_stream(&stream).await;
    (events as f64 / elapsed.as_secs_f64(), spent)
}

/// CPU seconds per drained event: the PostgreSQL backends of this process, the NATS server,
/// and this process (the relay).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuPerEvent {
    pub(crate) postgres: f64,
    pub(crate) nats: f64,
    pub(crate) relay: f64,
}

impl CpuPerEvent {
    /// The events/s at which `cores` would be fully busy with this work: a drain on this
    /// machine cannot go faster, whatever the relay does with its time.
    pub(crate) fn ceiling(&self, cores: usize) -> f64 {
        cores as f64 / (self.postgres + self.nats + self.relay)
    }
}

/// The broker's side of a drain alone, the floor the drain is measured against: the same
/// `events` messages (subjects, headers, payloads) published by the same publisher to a stream
/// of their own, two tasks per worker each keeping a batch of `batch` publishes in flight and
/// awaiting all of its acks before the next (a relay worker has up to two batches in flight),
/// with no database. Returns events/s.
pub(crate) async fn jetstream_alone(
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: usize,
) -> f64 {
    let table = idempotency_testing::unique_name("floor");
    let (jetstream, stream) = table_stream(&table).await;
    let publisher = NatsPublisher::from_context(jetstream.clone())
        .with_subject(&format!("{table}.{{aggregate_type}}.{{event_type}}"))
        .expect("subject");
    let rate = publisher_alone(publisher, events, aggregates, workers, batch).await;
    let _ = jetstream.delete_stream(&stream).await;
    rate
}

/// The messages a drain of [`drain_events`] publishes, without a database: fresh ids,
/// sequences in order.
fn drain_messages(events: usize, aggregates: usize) -> Vec<OutboxMessage> {
    drain_events(events, aggregates)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(n, event)| {
            let headers = event.headers().clone();
            OutboxMessage::new(
                Uuid::now_v7(),
                event.aggregate_type(),
                event.aggregate_id(),
                Some(i64::try_from(n).expect("sequence")),
                event.event_type(),
                event.payload(),
                headers,
                chrono::Utc::now(),
                0,
            )
        })
        .collect()
}

/// `publisher` given the messages of a drain with no database: two tasks per worker each
/// keeping a batch of `batch` publishes in flight and awaiting all of its acks before the next
/// (a relay worker claims its next batch while a full one publishes: up to two in flight).
/// Returns events/s.
pub(crate) async fn publisher_alone<P: Publisher + 'static>(
    publisher: P,
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: usize,
) -> f64 {
    let publisher = Arc::new(publisher);
    let messages: Arc<Vec<OutboxMessage>> = Arc::new(drain_messages(events, aggregates));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..2 * workers)
        .map(|_| {
            let (publisher, messages, next) = (
                Arc::clone(&publisher),
                Arc::clone(&messages),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(batch, AtomicOrdering::Relaxed);
                    if from >= messages.len() {
                        break;
                    }
                    let to = (from + batch).min(messages.len());
                    let acks = futures_util::future::join_all(
                        messages[from..to].iter().map(|m| publisher.publish(m)),
                    )
                    .await;
                    for ack in acks {
                        ack.expect("publish");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("publisher task");
    }
    events as f64 / started.elapsed().as_secs_f64()
}

/// Confirms every message at once: the database's side of a drain alone.
struct Confirm;

impl Publisher for Confirm {
    fn destination(&self) -> &str {
        "confirm"
    }

    async fn publish(&self, _message: &OutboxMessage) -> Result<Ack, PublishError> {
        Ok(Ack::default())
    }
}

/// The database's side of a drain alone: the same backlog as [`relay_drain`] claimed and marked
/// by the same relay with a publisher that confirms at once. Returns events/s.
pub(crate) async fn store_alone(
    setup: &Setup,
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: u32,
) -> f64 {
    let table = idempotency_testing::unique_name("drainstore");
    let config = drain_config(&table, workers, batch);
    let outbox = backlog(setup, &config, events, aggregates).await;
    let relay = Relay::new(outbox, Confirm, &config).expect("relay");
    let elapsed = run_until_published(&relay, events).await;
    drop_outbox(setup, &table).await;
    events as f64 / elapsed.as_secs_f64()
}

/// CPU seconds spent by the relay's side of a drain: this process, the NATS server and the
/// PostgreSQL backends that ran statements on the drained table (read from `/proc`, so the
/// servers must run on this machine). Unlike events/s, it hardly moves when other work shares
/// the machine.
pub(crate) struct Cpu {
    pool: sqlx::PgPool,
}

pub(crate) struct CpuSnapshot {
    /// CPU seconds of each backend serving this process, by pid.
    postgres: HashMap<i32, f64>,
    nats: f64,
    process: f64,
}

impl CpuSnapshot {
    /// PostgreSQL's CPU seconds between `before` and `self`: a backend that was not there
    /// before started since and counts whole; one that ended meanwhile is not counted.
    fn postgres_since(&self, before: &CpuSnapshot) -> f64 {
        self.postgres
            .iter()
            .map(|(pid, now)| now - before.postgres.get(pid).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Local ports of this process's TCP sockets (`/proc/self/fd` and `/proc/net/tcp{,6}`).
fn own_tcp_ports() -> Vec<i32> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|link| {
            let link = link.to_string_lossy().into_owned();
            link.strip_prefix("socket:[")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let (Some(local), Some(inode)) = (fields.get(1), fields.get(9))
                && inodes.contains(*inode)
                && let Some((_, port)) = local.rsplit_once(':')
                && let Ok(port) = i32::from_str_radix(port, 16)
            {
                ports.push(port);
            }
        }
    }
    ports
}

fn proc_cpu(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces): utime is the 14th field.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

impl Cpu {
    pub(crate) fn new(pool: sqlx::PgPool) -> Self {
        Self { pool }
    }

    /// The backends serving this process's connections, found by their client ports (the one
    /// answering included: leaving it out would count a backend in one snapshot and not the
    /// other, with all the CPU it ever spent).
    async fn backends(&self) -> Vec<i32> {
        let ports = own_tcp_ports();
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1)")
            .bind(ports)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default()
    }

    async fn snapshot(&self, backends: &[i32]) -> CpuSnapshot {
        let postgres = backends
            .iter()
            .map(|pid| (*pid, proc_cpu(&pid.to_string())))
            .collect();
        let mut nats = 0.0;
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let pid = entry.file_name().to_string_lossy().into_owned();
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "nats-server" {
                    nats += proc_cpu(&pid);
                }
            }
        }
        CpuSnapshot {
            postgres,
            nats,
            process: proc_cpu("self"),
        }
    }
}

/// Drains `events` pending events (over `aggregates` aggregates, ordered) from the PostgreSQL outbox with a
/// relay of `workers` workers and `batch` rows per claim, publishing to JetStream and awaiting
/// each ack. Returns events/s.
///
/// `BENCH_ANALYZE=1` analyzes the table once the backlog is in (as autovacuum would; a server
/// with autovacuum off otherwise plans the claim on a table it believes empty).
/// With the rate comes the CPU time per event of PostgreSQL (this process's backends), the NATS
/// server and this process during the drain: a figure that moves much less than events/s when
/// other work shares the machine, and that bounds the rate by the cores there are.
pub(crate) async fn relay_drain(
    setup: &Setup,
    events: usize,
    aggregates: usize,
    workers: usize,
    batch: u32,
) -> (f64, Option<CpuPerEvent>) {
    let table = idempotency_testing::unique_name("drain");
    let config = drain_config(&table, workers, batch);
    let outbox = backlog(setup, &config, events, aggregates).await;
    if std::env::var_os("BENCH_ANALYZE").is_some() {
        sqlx::raw_sql(AssertSqlSafe(format!("ANALYZE \"{table}\"")))
            .execute(&setup.pool)
            .await
            .expect("analyze");
    }
    let cpu = Cpu::new(setup.pool.clone());
    let drained = drain_to_jetstream(outbox, &config, events, Some(&cpu)).await;
    drop_outbox(setup, &table).await;
    drained
}

/// Records when the broker confirmed each message: the publish ack's arrival.
struct AckTimes<P> {
    inner: P,
    /// Per message: when its publish started (right after the claim that handed it out
    /// returned: the relay publishes a batch's messages at once) and when it was acked.
    acks: Arc<Mutex<HashMap<Uuid, (Instant, Instant)>>>,
}

impl<P: Publisher> Publisher for AckTimes<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let started = Instant::now();
        let ack = self.inner.publish(message).await?;
        self.acks
            .lock()
            .expect("ack times")
            .insert(message.id, (started, Instant::now()));
        Ok(ack)
    }
}

/// Commit-to-ack latency under a steady producer.
pub(crate) struct Latency {
    /// Events committed.
    pub(crate) events: usize,
    /// Committed events the relay had not published when the wait ended (60 s after the
    /// producer stopped); their latency is not in the percentiles.
    pub(crate) unacked: usize,
    /// Rate the producer reached, events/s.
    pub(crate) rate: f64,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    /// p99 of the first part of each sample: from the commit to the start of its publish
    /// (waiting for a worker's claim, and the claim itself).
    pub(crate) claimed_p99: Duration,
    /// p99 of the second part: from the start of its publish to the broker's ack.
    pub(crate) acked_p99: Duration,
}

/// Events produced before the sampled ones, at the same rate.
const WARMUP: Duration = Duration::from_secs(2);

/// Producers committing concurrently: one commit with NOTIFY takes longer than the gap between
/// two events at thousands of events/s.
const PRODUCERS: usize = 24;

/// A steady producer commits `rate` events/s for `seconds` into the PostgreSQL outbox (the
/// default configuration: ordered, NOTIFY at most every 5 ms, LISTEN wake-up, the relay's
/// 20 ms look-again; 200 aggregates), each in
/// a transaction of its own, while a relay of 2 workers (batch 100) publishes them to
/// JetStream. Each sample runs from the producer's commit returning to the relay receiving
/// that message's JetStream publish ack; it is also split at the start of the message's
/// publish (the relay publishes a claimed batch at once), so that the p99 of each part shows
/// whether a slow message waited to be claimed or waited for the broker.
///
/// The first [`WARMUP`] of events are produced at the same rate but not sampled: the pool
/// opens its connections and prepares its statements then, and the fresh table and stream
/// fill (their commit-to-ack was 5 to 10 times the steady state's on the development
/// machine).
///
/// With `every_commit`, each enqueue notifies and the workers do not look again after a claim
/// that found rows (`notify-interval` and `relay.linger` 0s: the behaviour before either
/// existed), for the comparison in the same run.
pub(crate) async fn commit_to_ack(rate: u64, seconds: u64, every_commit: bool) -> Latency {
    let pool = crate::pool::postgres(PRODUCERS as u32 + 8).await;
    let table = idempotency_testing::unique_name("latency");
    let mut config = OutboxConfig {
        table_name: table.clone(),
        schema: SchemaConfig {
            mode: SchemaMode::Create,
        },
        notify_channel: Some(table.clone()),
        ..Default::default()
    };
    config.relay.workers = 2;
    config.relay.batch_size = 100;
    config.relay.stats_interval = Duration::from_secs(3600);
    config.retention.enabled = false;
    if every_commit {
        config.notify_interval = Duration::ZERO;
        config.relay.linger = Duration::ZERO;
    }
    let outbox = PgOutbox::from_config(pool.clone(), &config)
        .await
        .expect("outbox");
    let (jetstream, stream) = table_stream(&table).await;
    let acks = Arc::new(Mutex::new(HashMap::new()));
    let publisher = AckTimes {
        inner: NatsPublisher::from_context(jetstream.clone())
            .with_subject(&format!("{table}.{{aggregate_type}}.{{event_type}}"))
            .expect("subject"),
        acks: Arc::clone(&acks),
    };
    let relay = Relay::new(outbox.clone(), publisher, &config).expect("relay");
    let handle = relay.spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let warmup = usize::try_from(rate * WARMUP.as_secs()).expect("events");
    let total = warmup + usize::try_from(rate * seconds).expect("events");
    let gap = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let next = Arc::new(AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let (pool, outbox, next) = (pool.clone(), outbox.clone(), Arc::clone(&next));
            tokio::spawn(async move {
                let mut commits = Vec::new();
                loop {
                    let n = next.fetch_add(1, AtomicOrdering::Relaxed);
                    if n >= total {
                        return commits;
                    }
                    // Event n is due at start + n * gap, whatever the previous commits took.
                    tokio::time::sleep_until(started + gap * u32::try_from(n).expect("n")).await;
                    let event = NewEvent::new(
                        "order",
                        format!("o-{}", n % 200),
                        "OrderPlaced",
                        &serde_json::json!({"n": n, "amountCents": 4900}),
                    )
                    .expect("event");
                    let mut tx = pool.begin().await.expect("begin");
                    outbox.enqueue(&mut tx, &event).await.expect("enqueue");
                    tx.commit().await.expect("commit");
                    if n >= warmup {
                        commits.push((event.id(), Instant::now()));
                    }
                }
            })
        })
        .collect();
    let mut commits = Vec::with_capacity(total - warmup);
    for producer in producers {
        commits.extend(producer.await.expect("producer"));
    }
    let produced = started.elapsed();
    // The rate of the sampled events: from the first sampled event's due time to the end.
    let sampled = produced.saturating_sub(gap * u32::try_from(warmup).expect("warmup"));
    // Until every sampled event was acked (the relay's published count would also count a
    // message published twice).
    let deadline = Instant::now() + Duration::from_secs(60);
    let all_acked = || {
        let acks = acks.lock().expect("ack times");
        commits.iter().all(|(id, _)| acks.contains_key(id))
    };
    while !all_acked() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown().await;
    let _ = jetstream.delete_stream(&stream).await;
    let _ = sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE \"{table}\", \"{table}_sequences\""
    )))
    .execute(&pool)
    .await;
    let acks = acks.lock().expect("ack times");
    // Per acked sample: (commit to ack, commit to publish start, publish start to ack).
    let parts: Vec<(Duration, Duration, Duration)> = commits
        .iter()
        .filter_map(|(id, committed)| {
            acks.get(id).map(|(started, acked)| {
                (
                    acked.saturating_duration_since(*committed),
                    started.saturating_duration_since(*committed),
                    acked.saturating_duration_since(*started),
                )
            })
        })
        .collect();
    let unacked = commits.len() - parts.len();
    let totals = sorted(parts.iter().map(|p| p.0));
    Latency {
        events: commits.len(),
        unacked,
        rate: (total - warmup) as f64 / sampled.as_secs_f64(),
        p50: quantile(&totals, 0.5),
        p99: quantile(&totals, 0.99),
        max: quantile(&totals, 1.0),
        claimed_p99: quantile(&sorted(parts.iter().map(|p| p.1)), 0.99),
        acked_p99: quantile(&sorted(parts.iter().map(|p| p.2)), 0.99),
    }
}

/// The samples, in ascending order.
fn sorted(samples: impl Iterator<Item = Duration>) -> Vec<Duration> {
    let mut samples: Vec<Duration> = samples.collect();
    samples.sort();
    samples
}

/// The `p` quantile (nearest rank) of sorted `samples`; 0 when there is none (nothing acked:
/// the percentiles read 0 beside `unacked`, instead of a panic).
fn quantile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::{drain_events, enqueue_script, quantile, sorted};

    #[test]
    fn quantiles_are_nearest_rank_and_zero_without_samples() {
        let ms = Duration::from_millis;
        assert_eq!(quantile(&[], 0.99), Duration::ZERO);
        let samples = sorted((1..=100).rev().map(ms));
        assert_eq!(quantile(&samples, 0.5), ms(51));
        assert_eq!(quantile(&samples, 0.99), ms(99));
        assert_eq!(quantile(&samples, 1.0), ms(100));
    }

    #[test]
    fn the_pgbench_enqueue_script_binds_every_parameter_as_the_library_does() {
        let script =
            enqueue_script("WITH x AS (SELECT $1, $2, $3, $4, $5, $6) SELECT pg_notify($7, '')");
        assert_eq!(
            script,
            "\\set key random(1, 1000000000000000)\nBEGIN;\n\
             INSERT INTO bench_payments (order_id, amount) VALUES (:key, 100.00) RETURNING id;\n\
             WITH x AS (SELECT ARRAY[gen_random_uuid()], ARRAY['payment'], ARRAY[:key::text], \
             ARRAY['PaymentCreated'], ARRAY['{\"orderId\":\"pgbench\",\"amount\":\"100.00\"}'], \
             ARRAY['{}']) SELECT pg_notify(:channel, '');\nCOMMIT;\n"
        );
    }

    #[test]
    fn drained_events_spread_over_the_asked_number_of_aggregates() {
        let mut per_aggregate: HashMap<(String, String), usize> = HashMap::new();
        let chunks = drain_events(1200, 10);
        assert_eq!(chunks.len(), 3, "chunks of 500");
        for event in chunks.iter().flatten() {
            *per_aggregate
                .entry((
                    event.aggregate_type().to_owned(),
                    event.aggregate_id().to_owned(),
                ))
                .or_default() += 1;
        }
        assert_eq!(per_aggregate.len(), 10);
        assert!(per_aggregate.values().all(|&n| n == 120));
    }
}
