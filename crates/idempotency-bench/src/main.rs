//! Load bench against real servers: concurrent clients, a fixed time per scenario, ops/s, p50,
//! p99, and the ratios the performance targets are stated in, all from one run. Scenarios are
//! interleaved over several rounds, so the two sides of a ratio share the machine's load.
//!
//! `cargo run --release -p idempotency-bench -- --clients 4 --duration 10s --rounds 5`
//! (PostgreSQL, Redis, NATS), or `-- --backend mysql` (MySQL / MariaDB on `MYSQL_URL`, NATS),
//! or `-- --only-retention --events 5000000` (outbox retention by DELETE and by partition drop).

#![allow(clippy::print_stdout)] // a command-line tool: the report is its output

mod harness;
mod idempotency;
mod kafka;
mod layer;
mod mysql;
mod outbox;
mod peers;
mod pgbench;
mod pool;
mod retention;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::harness::{Measurement, run_interleaved};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "Load bench of the idempotency workspace against PostgreSQL, Redis and NATS")]
struct Args {
    /// Concurrent clients for the throughput scenarios.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Measured time per scenario, split over the rounds: `500ms`, `10s`, `1m`.
    #[arg(long, default_value = "10s", value_parser = duration)]
    duration: Duration,
    /// Rounds over which the scenarios are interleaved.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Events drained by the relay scenario.
    #[arg(long, default_value_t = 20_000)]
    drain_events: usize,
    /// Aggregates the drained events are spread over (round robin) on PostgreSQL: fewer
    /// aggregates, deeper backlogs behind each aggregate's first row.
    #[arg(long, default_value_t = 1000)]
    drain_aggregates: usize,
    /// Only the middleware scenarios: `IdempotencyLayer` against a handler calling `execute`,
    /// through an axum router in process (first executions, then replays).
    #[arg(long)]
    only_layer: bool,
    /// Only the first executions on PostgreSQL (the library, the same SQL issued directly, and
    /// pgbench), with their ratios.
    #[arg(long)]
    only_first: bool,
    /// Where `scripts/peers.sh` installed the peer libraries: their first executions join the
    /// first-execution scenarios, with the ratios against the fastest of them.
    #[arg(long)]
    peers: Option<PathBuf>,
    /// Only the relay scenarios on PostgreSQL: the drain to JetStream and to Kafka (1 and 2
    /// workers, batch 100) and the commit-to-ack latency under a steady producer.
    #[arg(long)]
    only_relay: bool,
    /// Worker counts of the relay drain (each with batch 100).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2])]
    drain_workers: Vec<usize>,
    /// Events/s the steady producer of the commit-to-ack scenario commits.
    #[arg(long, default_value_t = 2_000)]
    latency_rate: u64,
    /// Seconds the steady producer of the commit-to-ack scenario runs (0: skip it).
    #[arg(long, default_value_t = 10)]
    latency_seconds: u64,
    /// Only outbox retention at scale on PostgreSQL: `--events` published events in a plain
    /// and in a day-partitioned table, the batched DELETE against partition DETACH + DROP.
    #[arg(long)]
    only_retention: bool,
    /// Published events loaded by the retention scenario.
    #[arg(long, default_value_t = 5_000_000)]
    events: i64,
    /// `postgres` (with Redis) or `mysql` (MySQL / MariaDB on `MYSQL_URL`).
    #[arg(long, default_value = "postgres")]
    backend: String,
}

fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|e| format!("{text}: {e}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        other => Err(format!("unknown unit {other:?}; use ms, s or m")),
    }
}

fn find<'a>(results: &'a [Measurement], name: &str) -> &'a Measurement {
    results
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no scenario named {name:?}"))
}

fn print_table(results: &[Measurement]) {
    println!("| scenario | clients | ops/s | p50 | p99 |");
    println!("|---|---:|---:|---:|---:|");
    for m in results {
        println!(
            "| {} | {} | {:.0} | {:.3} ms | {:.3} ms |",
            m.name,
            m.clients,
            m.ops_per_sec(),
            m.p50.as_secs_f64() * 1e3,
            m.p99.as_secs_f64() * 1e3
        );
    }
}

struct Ratios<'a>(&'a [Measurement]);

impl Ratios<'_> {
    fn throughput(&self, what: &str, a: &str, b: &str, target: &str) {
        let ratio = find(self.0, a).ops_per_sec() / find(self.0, b).ops_per_sec();
        println!("| {what} | throughput | {ratio:.2} | {target} |");
    }

    /// A throughput ratio whose target is another ratio of the same run (pgbench's for the
    /// same statements), reported without a target when pgbench did not run.
    fn throughput_against(&self, what: &str, a: &str, b: &str, floor: (&str, &str)) {
        println!("{}", self.against_row(what, a, b, floor));
    }

    /// The row of [`throughput_against`](Self::throughput_against).
    fn against_row(&self, what: &str, a: &str, b: &str, floor: (&str, &str)) -> String {
        let ratio = find(self.0, a).ops_per_sec() / find(self.0, b).ops_per_sec();
        let measured = |name: &str| self.0.iter().find(|m| m.name == name);
        match (measured(floor.0), measured(floor.1)) {
            (Some(fa), Some(fb)) => {
                let target = fa.ops_per_sec() / fb.ops_per_sec();
                let verdict = if ratio >= target { "met" } else { "missed" };
                format!(
                    "| {what} | throughput | {ratio:.2} | >= {target:.2}, pgbench's for the same statements in this run: {verdict} |"
                )
            }
            _ => format!("| {what} | throughput | {ratio:.2} | report (pgbench not installed) |"),
        }
    }

    /// A throughput ratio with a fixed target and the floor this run measured for it: the
    /// same ratio of `floor.0` to `floor.1`, the best that `a` can reach over `b` without
    /// changing what bounds it (the client, the round trips).
    fn throughput_with_floor(
        &self,
        what: &str,
        a: &str,
        b: &str,
        target: f64,
        floor: (&str, &str),
    ) {
        let ratio = find(self.0, a).ops_per_sec() / find(self.0, b).ops_per_sec();
        let floor = find(self.0, floor.0).ops_per_sec() / find(self.0, floor.1).ops_per_sec();
        let above = if floor < target { ", above it" } else { "" };
        println!(
            "| {what} | throughput | {ratio:.2} | >= {target:.2}; this run's floor {floor:.2}{above} |"
        );
    }

    fn latency(&self, what: &str, a: &str, b: &str, target: &str) {
        let ratio = find(self.0, a).p50.as_secs_f64() / find(self.0, b).p50.as_secs_f64();
        println!("| {what} | p50 latency | {ratio:.2} | {target} |");
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let n = args.clients;
    println!(
        "clients: {n}, {:?} per scenario over {} interleaved rounds, cores: {}",
        args.duration,
        args.rounds,
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    );
    if args.only_retention {
        return retention::run(args.events).await;
    }
    if args.backend == "mysql" {
        return run_mysql(&args).await;
    }
    let setup = idempotency::Setup::new(n).await;
    if args.only_layer {
        layer_bench(&setup, &args).await;
        return;
    }
    if args.only_relay {
        relay_bench(&setup, &args).await;
        return;
    }

    let mut scenarios = idempotency::first_executions(&setup, n);
    if let Some(dir) = &args.peers {
        scenarios.extend(peers::scenarios(dir, &setup.schema, n, setup.run));
    }
    if !args.only_first {
        scenarios.extend(outbox::enqueue(&setup, n).await);
    }
    let mut results = run_interleaved(&scenarios, args.duration, args.rounds).await;
    if args.only_first {
        println!();
        print_table(&results);
        println!();
        first_execution_ratios(&Ratios(&results), setup.pgbench.is_some());
        return;
    }
    let replays = idempotency::replays(&setup, n).await;
    results.extend(run_interleaved(&replays, args.duration, args.rounds).await);
    results.push(idempotency::duplicates(&setup, n * 8, args.duration).await);

    println!();
    print_table(&results);
    println!();
    let r = Ratios(&results);
    first_execution_ratios(&r, setup.pgbench.is_some());
    let library = |label: &str| format!("outbox ({label}): business transaction + enqueue");
    for case in &outbox::ENQUEUE_CASES {
        let label = case.label;
        let library = library(label);
        let alone = format!("outbox enqueue ({label}) / the business transaction alone");
        if case.one_statement() {
            r.throughput(
                &format!("outbox enqueue ({label}) / the same SQL issued directly"),
                &library,
                &format!("direct SQL ({label}): business transaction + the enqueue statement"),
                ">= 0.90",
            );
            // The very same statement run by pgbench sets the floor of the ratio to the
            // business transaction alone.
            r.throughput_against(
                &alone,
                &library,
                "baseline: business transaction",
                (
                    &format!("pgbench: {}", outbox::pgbench_enqueue_name(label)),
                    "pgbench: business transaction",
                ),
            );
        } else {
            r.throughput(&alone, &library, "baseline: business transaction", "report");
        }
    }
    r.throughput(
        "outbox enqueue, NOTIFY at most every 5ms / NOTIFY every commit",
        &library(outbox::ENQUEUE_CASES[0].label),
        &library(outbox::ENQUEUE_CASES[1].label),
        "report",
    );
    r.latency(
        "replay from Redis / a bare Redis GET",
        "replay: redis",
        "bare: redis GET",
        "<= 1.3",
    );
    r.latency(
        "replay from PostgreSQL / a bare primary-key SELECT",
        "replay: postgres (lookup-before-acquire)",
        "bare: primary-key SELECT",
        "<= 1.3",
    );
    let moka = format!("replay: moka, {n} clients");
    let pg = format!("replay: postgres (lookup-before-acquire), {n} clients");
    r.throughput(
        "replay from moka / replay from PostgreSQL",
        &moka,
        &pg,
        ">= 20",
    );
    relay_bench(&setup, &args).await;
}

/// The ratios of the first executions: against the same SQL, the business transaction alone,
/// and pgbench's ratios for the same statements.
fn first_execution_ratios(r: &Ratios<'_>, pgbench: bool) {
    println!("| ratio | measure | measured | target |");
    println!("|---|---|---:|---|");
    let pipelined = format!("pgbench: {}", idempotency::PIPELINED);
    r.throughput(
        "execute / the same SQL issued directly",
        "execute: first execution",
        "direct SQL: claim, business, complete",
        ">= 0.97",
    );
    r.throughput_against(
        "execute / the business transaction alone",
        "execute: first execution",
        "baseline: business transaction",
        (
            "pgbench: claim, business, complete",
            "pgbench: business transaction",
        ),
    );
    r.throughput(
        "execute_optimistic / the same SQL issued directly",
        "execute_optimistic: first execution",
        "direct SQL: business, insert completed",
        ">= 0.97",
    );
    r.throughput(
        "execute_optimistic / the business transaction alone",
        "execute_optimistic: first execution",
        "baseline: business transaction",
        ">= 0.75",
    );
    r.throughput_against(
        "execute_optimistic / the business transaction alone, against pgbench",
        "execute_optimistic: first execution",
        "baseline: business transaction",
        (
            "pgbench: business, insert completed",
            "pgbench: business transaction",
        ),
    );
    peer_ratios(r, pgbench.then_some(pipelined.as_str()));
    if pgbench {
        r.throughput(
            "the business transaction: the bench's client (sqlx) / pgbench",
            "baseline: business transaction",
            "pgbench: business transaction",
            "report",
        );
        r.throughput(
            "pgbench: claim-first in 3 round trips (pipelined) / in 5",
            &pipelined,
            "pgbench: claim, business, complete",
            "report",
        );
        r.throughput(
            "pgbench: claim-first in 3 round trips (pipelined) / the business transaction alone",
            &pipelined,
            "pgbench: business transaction",
            "report",
        );
    }
}

/// Both first-execution modes against the fastest peer of the run (`--peers`), when any ran;
/// with pgbench, its pipelined scenario (named `pipelined`) too.
fn peer_ratios(r: &Ratios<'_>, pipelined: Option<&str>) {
    let fastest =
        r.0.iter()
            .filter_map(|m| Some((m, peers::label(&m.name)?)))
            .max_by(|(a, _), (b, _)| a.ops_per_sec().total_cmp(&b.ops_per_sec()));
    let Some((peer, label)) = fastest else { return };
    // The floor of each: the same statements through the same client (sqlx), without the
    // library, against the same peer.
    r.throughput_with_floor(
        &format!("execute_optimistic / the fastest peer ({label}), first execution"),
        "execute_optimistic: first execution",
        &peer.name,
        1.05,
        ("direct SQL: business, insert completed", &peer.name),
    );
    r.throughput_with_floor(
        &format!("execute / the fastest peer ({label}), first execution"),
        "execute: first execution",
        &peer.name,
        0.85,
        ("direct SQL: claim, business, complete", &peer.name),
    );
    // The same transactional claim-first statements from a client that pipelines: what the
    // design gets against the peer when the client is not the limit.
    if let Some(pipelined) = pipelined {
        r.throughput(
            &format!(
                "pgbench: claim-first in 3 round trips (pipelined) / the fastest peer ({label})"
            ),
            pipelined,
            &peer.name,
            "report",
        );
    }
}

/// The relay on PostgreSQL: the drain to JetStream and to Kafka, then commit-to-ack under a
/// steady producer.
async fn relay_bench(setup: &idempotency::Setup, args: &Args) {
    println!();
    println!(
        "| relay drain to JetStream and to Kafka (acks awaited, {} aggregates, ordered) | events/s |",
        args.drain_aggregates
    );
    println!("|---|---:|");
    let (events, aggregates, batch) = (args.drain_events, args.drain_aggregates, 100);
    for workers in args.drain_workers.iter().copied() {
        let (rate, cpu) = outbox::relay_drain(setup, events, aggregates, workers, batch).await;
        println!("| {workers} worker(s), batch {batch}, {events} events | {rate:.0} |");
        if let Some(cpu) = cpu {
            // What the drain cost each party: with every core busy, the drain could not go
            // faster than this on this machine.
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            println!(
                "| {workers} worker(s): CPU ceiling on {cores} cores (CPU per event: postgres {:.1} us, nats-server {:.1} us, relay {:.1} us) | {:.0} |",
                cpu.postgres * 1e6,
                cpu.nats * 1e6,
                cpu.relay * 1e6,
                cpu.ceiling(cores),
            );
        }
        // The two halves of the same drain alone, right after it: what the broker and what
        // the database can do with this pattern on this machine now.
        let broker = outbox::jetstream_alone(events, aggregates, workers, batch as usize).await;
        println!(
            "| {workers} worker(s): JetStream alone (the same publishes, two batches of {batch} in flight per worker, no database) | {broker:.0} |"
        );
        let store = outbox::store_alone(setup, events, aggregates, workers, batch).await;
        println!(
            "| {workers} worker(s): the store alone (the same claims and marks, a publisher that confirms at once) | {store:.0} |"
        );
        println!(
            "| {workers} worker(s): drain / JetStream alone | {:.2} |",
            rate / broker
        );
        // The same drain to Kafka, right after: the JetStream drain above is its baseline.
        let to_kafka = kafka::relay_drain(setup, events, aggregates, workers, batch).await;
        println!(
            "| {workers} worker(s), batch {batch}, {events} events, to Kafka | {to_kafka:.0} |"
        );
        let kafka_broker = kafka::kafka_alone(events, aggregates, workers, batch as usize).await;
        println!(
            "| {workers} worker(s): Kafka alone (the same publishes, two batches of {batch} in flight per worker, no database) | {kafka_broker:.0} |"
        );
        println!(
            "| {workers} worker(s): Kafka drain / JetStream drain | {:.2} |",
            to_kafka / rate
        );
        println!(
            "| {workers} worker(s): Kafka drain / Kafka alone | {:.2} |",
            to_kafka / kafka_broker
        );
    }
    if args.latency_seconds == 0 {
        return;
    }
    println!();
    println!(
        "| relay commit-to-ack (steady producer, ordered, NOTIFY, 2 workers, batch 100) | events | events/s | p50 | p99 | max | not acked after 60 s | p99 commit to claimed | p99 claimed to acked |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (every_commit, label) in [
        (false, ""),
        (true, ", NOTIFY every commit and no look-again (0s, 0s)"),
    ] {
        let latency =
            outbox::commit_to_ack(args.latency_rate, args.latency_seconds, every_commit).await;
        println!(
            "| commit-to-ack at {} events/s{label} | {} | {:.0} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.2} ms | {:.2} ms |",
            args.latency_rate,
            latency.events,
            latency.rate,
            latency.p50.as_secs_f64() * 1e3,
            latency.p99.as_secs_f64() * 1e3,
            latency.max.as_secs_f64() * 1e3,
            latency.unacked,
            latency.claimed_p99.as_secs_f64() * 1e3,
            latency.acked_p99.as_secs_f64() * 1e3,
        );
    }
}

/// `IdempotencyLayer` against the explicit path, first executions and replays, as ratios.
async fn layer_bench(setup: &idempotency::Setup, args: &Args) {
    let n = args.clients;
    let first = layer::first_executions(setup, n);
    let mut results = run_interleaved(&first, args.duration, args.rounds).await;
    let replays = layer::replays(setup, n).await;
    results.extend(run_interleaved(&replays, args.duration, args.rounds).await);
    println!();
    print_table(&results);
    println!();
    println!("| ratio | measure | measured | target |");
    println!("|---|---|---:|---|");
    let r = Ratios(&results);
    r.throughput(
        "IdempotencyLayer / explicit execute, first execution",
        "HTTP IdempotencyLayer: first execution",
        "HTTP explicit execute: first execution",
        ">= 0.90",
    );
    r.throughput(
        "IdempotencyLayer optimistic / IdempotencyLayer claim-first, first execution",
        "HTTP IdempotencyLayer optimistic: first execution",
        "HTTP IdempotencyLayer: first execution",
        "report",
    );
    r.throughput(
        "IdempotencyLayer, claim-first / the plain transaction, first execution",
        "HTTP IdempotencyLayer: first execution",
        "HTTP plain transaction, no idempotency",
        "report",
    );
    r.throughput(
        "IdempotencyLayer, optimistic / the plain transaction, first execution",
        "HTTP IdempotencyLayer optimistic: first execution",
        "HTTP plain transaction, no idempotency",
        "report",
    );
    r.throughput(
        "IdempotencyLayer / explicit execute, replay",
        "HTTP IdempotencyLayer: replay",
        "HTTP explicit execute: replay",
        ">= 0.90",
    );
}

/// The MySQL / MariaDB grid: first executions and replays against their direct SQL, and the
/// relay's drain, ratios from one run.
async fn run_mysql(args: &Args) {
    let n = args.clients;
    let setup = mysql::Setup::new(n).await;
    let scenarios = mysql::first_executions(&setup, n);
    let mut results = run_interleaved(&scenarios, args.duration, args.rounds).await;
    let replays = mysql::replays(&setup).await;
    results.extend(run_interleaved(&replays, args.duration, args.rounds).await);
    println!();
    print_table(&results);
    println!();
    println!("| ratio | measure | measured | target |");
    println!("|---|---|---:|---|");
    let r = Ratios(&results);
    r.throughput(
        "mysql execute / the same SQL issued directly",
        "mysql execute: first execution",
        "mysql direct SQL: wait budget, claim, business, complete",
        ">= 0.90",
    );
    r.throughput(
        "mysql execute / the business transaction alone",
        "mysql execute: first execution",
        "mysql baseline: business transaction",
        "report",
    );
    r.latency(
        "mysql replay / a bare primary-key SELECT",
        "mysql replay (lookup-before-acquire)",
        "mysql bare: primary-key SELECT",
        "<= 1.3",
    );
    println!();
    println!(
        "| relay drain from MySQL to JetStream (acks awaited, 1000 aggregates, ordered, polling) | events/s |"
    );
    println!("|---|---:|");
    for (workers, batch) in [(1, 100), (2, 100)] {
        let rate = mysql::relay_drain(&setup, args.drain_events, workers, batch).await;
        println!(
            "| {workers} worker(s), batch {batch}, {} events | {rate:.0} |",
            args.drain_events
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Measurement, Ratios};

    fn measured(name: &str, ops: u64) -> Measurement {
        Measurement {
            name: name.to_owned(),
            clients: 4,
            ops,
            elapsed: Duration::from_secs(1),
            p50: Duration::from_millis(1),
            p99: Duration::from_millis(2),
        }
    }

    #[test]
    fn a_ratio_against_pgbench_takes_its_target_from_the_same_run_or_reports_none() {
        let with = [
            measured("lib", 500),
            measured("base", 1000),
            measured("pg lib", 600),
            measured("pg base", 1000),
        ];
        assert_eq!(
            Ratios(&with).against_row("x", "lib", "base", ("pg lib", "pg base")),
            "| x | throughput | 0.50 | >= 0.60, pgbench's for the same statements in this run: missed |"
        );
        let met = [
            measured("lib", 700),
            measured("base", 1000),
            measured("pg lib", 600),
            measured("pg base", 1000),
        ];
        assert!(
            Ratios(&met)
                .against_row("x", "lib", "base", ("pg lib", "pg base"))
                .ends_with(
                    "| 0.70 | >= 0.60, pgbench's for the same statements in this run: met |"
                )
        );
        let row = Ratios(&with[2..]).against_row("y", "pg lib", "pg base", ("missing", "pg base"));
        assert_eq!(
            row,
            "| y | throughput | 0.60 | report (pgbench not installed) |"
        );
        assert!(
            !row.contains('~'),
            "no constant stands in for pgbench: {row}"
        );
    }
}
