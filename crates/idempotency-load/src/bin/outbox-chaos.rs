//! `outbox-chaos`: the steps of the relay-kill experiment (`scripts/chaos/relay-kill.sh`), one
//! subcommand each, so that a script can `SIGKILL` the relay process and start it again.
//!
//! ```sh
//! outbox-chaos stream  --nats-url nats://127.0.0.1:4223 --stream CHAOS --subjects 'chaos.>'
//! outbox-chaos watch   --nats-url ... --subjects 'chaos.>' --out watch.json &   # until SIGTERM
//! outbox-chaos enqueue --database-url postgres://... --table outbox_chaos --count 10000
//! outbox-chaos relay   --database-url ... --nats-url ... --table outbox_chaos \
//!                      --subject 'chaos.{aggregate_type}.{event_type}' --life 1 > life-1.acks  # kill -9 it
//! outbox-chaos republish --database-url ... --nats-url ... --table outbox_chaos \
//!                      --subject 'chaos.{aggregate_type}.{event_type}' --count 100
//! outbox-chaos verify  --database-url ... --nats-url ... --table outbox_chaos --stream CHAOS \
//!                      --acks-dir . --watch watch.json
//! outbox-chaos consume --database-url ... --nats-url ... --table outbox --stream CHAOS \
//!                      --durable reader > verdict.json &                          # until SIGTERM
//! outbox-chaos consume ... --durable applier --inbox-table inbox --effects-table effects
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool: the report is its output

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idempotency_core::config::SchemaMode;
use idempotency_load::Error;
use idempotency_load::chaos::{
    self, acks, consume, enqueue, relay, republish, stream, verify, watch,
};
use idempotency_outbox::config::{InboxConfig, Ordering, OutboxConfig};
use idempotency_pg::{PgInbox, PgOutbox};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::signal::unix::{SignalKind, signal};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "outbox-chaos",
    about = "Outbox relay under repeated SIGKILL: the steps"
)]
struct Cli {
    #[command(subcommand)]
    step: Step,
}

#[derive(Debug, Subcommand)]
enum Step {
    /// Create the JetStream stream.
    Stream {
        #[command(flatten)]
        nats: Nats,
        /// Stream name.
        #[arg(long)]
        stream: String,
        /// Duplicate window: longer than the whole run.
        #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
        duplicate_window: Duration,
        /// Replicas of the stream (3 on a three-node cluster).
        #[arg(long, default_value_t = 1)]
        replicas: usize,
    },
    /// Count every copy published on the subjects until SIGTERM, then write the counts.
    Watch {
        #[command(flatten)]
        nats: Nats,
        /// Where to write the counts (JSON).
        #[arg(long)]
        out: PathBuf,
    },
    /// Enqueue events into a fresh outbox table (created if missing).
    Enqueue {
        #[command(flatten)]
        outbox: Outbox,
        /// Events.
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// Aggregates the events are spread over.
        #[arg(long, default_value_t = 1_000)]
        aggregates: u64,
        /// Events per transaction.
        #[arg(long, default_value_t = 500)]
        per_tx: u64,
        /// Wait this long after each transaction (`100ms`), to spread the events over a run.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        pause: Duration,
    },
    /// Run the relay until SIGTERM, one `<id> <duplicate 0|1>` line per ack on stdout.
    Relay {
        #[command(flatten)]
        outbox: Outbox,
        /// NATS server (or a cluster's comma-separated URL list).
        #[arg(long)]
        nats_url: String,
        /// Subject template.
        #[arg(long)]
        subject: String,
        /// This process's number, sent as the `Chaos-Relay-Life` header of each copy.
        #[arg(long, default_value_t = 1)]
        life: u64,
        /// `relay.max-attempts`: failed publishes (the broker's own failures aside) before a
        /// message is dead-lettered. High by default (the kills are the point there); the
        /// library's default, 10, to see whether a broker's failover dead-letters anything.
        #[arg(long, default_value_t = 1000)]
        max_attempts: u32,
    },
    /// Publish the earliest-published rows once more (a relay's republish after a lost ack);
    /// print how many JetStream acked as duplicates.
    Republish {
        #[command(flatten)]
        outbox: Outbox,
        /// NATS server (or a cluster's comma-separated URL list).
        #[arg(long)]
        nats_url: String,
        /// Subject template (the relay's).
        #[arg(long)]
        subject: String,
        /// Rows to publish again.
        #[arg(long, default_value_t = 100)]
        count: u32,
    },
    /// Check the outbox, the stream, the ack logs and the watch counts against each other.
    Verify {
        #[command(flatten)]
        outbox: Outbox,
        /// NATS server (or a cluster's comma-separated URL list).
        #[arg(long)]
        nats_url: String,
        /// Stream name.
        #[arg(long)]
        stream: String,
        /// Directory of the relays' `*.acks` files.
        #[arg(long)]
        acks_dir: PathBuf,
        /// The counts `watch` wrote.
        #[arg(long)]
        watch: PathBuf,
    },
    /// Consume the stream with a durable pull consumer (explicit acks) until SIGTERM and until
    /// it caught up; print the verdict against the outbox table (exit 1 if a guarantee fails).
    Consume(Consume),
}

#[derive(Debug, Args)]
struct Consume {
    /// PostgreSQL (the outbox's database; the inbox tables go there too).
    #[arg(long)]
    database_url: String,
    /// The outbox table (a plain identifier).
    #[arg(long, default_value = "outbox")]
    table: String,
    /// NATS server (or a cluster's comma-separated URL list).
    #[arg(long)]
    nats_url: String,
    /// Stream name.
    #[arg(long)]
    stream: String,
    /// Durable consumer name (also the inbox's consumer name).
    #[arg(long)]
    durable: String,
    /// Ack wait: JetStream redelivers an unacked message after this long.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    ack_wait: Duration,
    /// After SIGTERM, stop waiting for the consumer to catch up after this long.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    drain_timeout: Duration,
    /// This process takes over a durable consumer mid-stream (after a kill): the first event
    /// of an aggregate may be any, and arrival is checked on the effects, not on what this
    /// process received.
    #[arg(long)]
    resumed: bool,
    /// The bound on ids stored twice in the stream.
    #[arg(long, default_value_t = 0)]
    duplicate_bound: u64,
    /// Inbox mode: apply each event through a PgInbox on this table (created if missing).
    #[arg(long, requires = "effects_table")]
    inbox_table: Option<String>,
    /// Inbox mode: the effects table (created if missing), `<name>_counters` next to it.
    #[arg(long, requires = "inbox_table")]
    effects_table: Option<String>,
    /// Inbox mode: skip the ack of every Nth first delivery after its commit (0: never), so
    /// that JetStream redelivers an applied event.
    #[arg(long, default_value_t = 0)]
    skip_ack_every: u64,
}

async fn run_consume(args: Consume) -> Result<bool, Error> {
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.database_url)
        .await?;
    let inbox = match (&args.inbox_table, &args.effects_table) {
        (Some(inbox_table), Some(effects)) => {
            let mut config = InboxConfig {
                table_name: inbox_table.clone(),
                ..InboxConfig::default()
            };
            config.schema.mode = SchemaMode::Create;
            let inbox = PgInbox::from_config(pool.clone(), &config).await?;
            consume::create_effects(&pool, effects).await?;
            Some(consume::InboxMode {
                inbox,
                effects: effects.clone(),
                skip_ack_every: args.skip_ack_every,
            })
        }
        _ => None,
    };
    let client = stream::connect(&args.nats_url, "outbox-chaos consume").await?;
    let config = consume::ConsumerConfig {
        stream: args.stream.clone(),
        durable: args.durable.clone(),
        ack_wait: args.ack_wait,
        drain_timeout: args.drain_timeout,
        strict_start: !args.resumed,
    };
    let ready = || eprintln!("consuming {} as {}", args.stream, args.durable);
    let verdict = consume::run(
        &client,
        &pool,
        &args.table,
        &config,
        inbox.as_ref(),
        args.duplicate_bound,
        ready,
        terminated(),
    )
    .await?;
    println!("{}", serde_json::to_string(&verdict)?);
    Ok(verdict.violations.is_empty())
}

#[derive(Debug, Args)]
struct Nats {
    /// NATS server (or a cluster's comma-separated URL list).
    #[arg(long)]
    nats_url: String,
    /// Subjects (`chaos.>`).
    #[arg(long)]
    subjects: String,
}

#[derive(Debug, Args)]
struct Outbox {
    /// PostgreSQL.
    #[arg(long)]
    database_url: String,
    /// Outbox table (a plain identifier); also the notify channel.
    #[arg(long, default_value = "outbox_chaos")]
    table: String,
    /// Per-aggregate order (`ordered`) or not (`unordered`).
    #[arg(long, default_value = "ordered", value_parser = ordering)]
    ordering: Ordering,
    /// Relay workers per process.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Rows per claimed batch.
    #[arg(long, default_value_t = 100)]
    batch_size: u32,
}

fn ordering(text: &str) -> Result<Ordering, String> {
    match text {
        "ordered" => Ok(Ordering::Ordered),
        "unordered" => Ok(Ordering::Unordered),
        other => Err(format!("{other}: ordered or unordered")),
    }
}

impl Outbox {
    fn config(&self, schema: SchemaMode) -> OutboxConfig {
        chaos::outbox_config(
            &self.table,
            self.ordering,
            self.workers,
            self.batch_size,
            schema,
        )
    }

    async fn open(&self, schema: SchemaMode) -> Result<(PgPool, PgOutbox), Error> {
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(self.workers).unwrap_or(8).saturating_add(3))
            .acquire_timeout(Duration::from_secs(10))
            .connect(&self.database_url)
            .await?;
        let outbox = PgOutbox::from_config(pool.clone(), &self.config(schema)).await?;
        Ok((pool, outbox))
    }
}

async fn terminated() {
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

fn write_json(path: &PathBuf, value: &impl serde::Serialize) -> Result<(), Error> {
    std::fs::write(path, serde_json::to_vec(value)?).map_err(|source| Error::File {
        path: path.clone(),
        source,
    })
}

async fn main_inner(step: Step) -> Result<bool, Error> {
    match step {
        Step::Stream {
            nats,
            stream,
            duplicate_window,
            replicas,
        } => {
            let client = stream::connect(&nats.nats_url, "outbox-chaos stream").await?;
            stream::create(&client, &stream, &nats.subjects, duplicate_window, replicas).await?;
        }
        Step::Watch { nats, out } => {
            let client = stream::connect(&nats.nats_url, "outbox-chaos watch").await?;
            let ready = || eprintln!("watching {}", nats.subjects);
            let watched = watch::run(&client, &nats.subjects, ready, terminated()).await?;
            write_json(&out, &watched)?;
        }
        Step::Enqueue {
            outbox,
            count,
            aggregates,
            per_tx,
            pause,
        } => {
            let (pool, store) = outbox.open(SchemaMode::Create).await?;
            let enqueued = enqueue::run(&pool, &store, count, aggregates, per_tx, pause).await?;
            println!("{}", serde_json::to_string(&enqueued)?);
        }
        Step::Relay {
            outbox,
            nats_url,
            subject,
            life,
            max_attempts,
        } => {
            let (_, store) = outbox.open(SchemaMode::Validate).await?;
            let client = stream::connect(&nats_url, &format!("outbox-chaos relay {life}")).await?;
            let mut config = outbox.config(SchemaMode::Validate);
            config.relay.max_attempts = max_attempts;
            relay::run(store, client, &subject, &config, life).await?;
        }
        Step::Republish {
            outbox,
            nats_url,
            subject,
            count,
        } => {
            let (pool, _) = outbox.open(SchemaMode::Validate).await?;
            let client = stream::connect(&nats_url, "outbox-chaos republish").await?;
            let republished = republish::run(&pool, &outbox.table, client, &subject, count).await?;
            println!("{}", serde_json::to_string(&republished)?);
        }
        Step::Verify {
            outbox,
            nats_url,
            stream,
            acks_dir,
            watch,
        } => {
            let (pool, _) = outbox.open(SchemaMode::Validate).await?;
            let client = stream::connect(&nats_url, "outbox-chaos verify").await?;
            let acks = acks::AckLogs::read(&acks_dir)?;
            let text = std::fs::read_to_string(&watch).map_err(|source| Error::File {
                path: watch.clone(),
                source,
            })?;
            let watched: watch::Watched = serde_json::from_str(&text)?;
            // Each worker may hold two leased batches at a kill: a full one publishing or
            // being marked, and the next one, claimed meanwhile.
            let bound = 2 * outbox.workers as u64 * u64::from(outbox.batch_size);
            let verdict = verify::run(
                &pool,
                &outbox.table,
                &client,
                &stream,
                &acks,
                &watched,
                bound,
            )
            .await?;
            println!("{}", serde_json::to_string(&verdict)?);
            return Ok(verdict.violations.is_empty());
        }
        Step::Consume(args) => return run_consume(args).await,
    }
    Ok(true)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    match main_inner(Cli::parse().step).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            eprintln!("outbox-chaos: {message}");
            ExitCode::from(2)
        }
    }
}
