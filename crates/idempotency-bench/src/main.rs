//! Load bench against real servers: N concurrent clients, a fixed duration per scenario, ops/s,
//! p50, p99, and the ratios the performance targets are stated in, all from one run.
//!
//! `cargo run --release -p idempotency-bench -- --clients 4 --duration 5s`

#![allow(clippy::print_stdout)] // a command-line tool: the report is its output

mod harness;
mod idempotency;

use std::time::Duration;

use clap::Parser;

use crate::harness::Measurement;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "Load bench of the idempotency workspace against PostgreSQL, Redis and NATS")]
struct Args {
    /// Concurrent clients per scenario.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Measured time per scenario (after a 300 ms warm-up), e.g. `5s`.
    #[arg(long, default_value = "5s", value_parser = humantime_duration)]
    duration: Duration,
}

fn humantime_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number.parse().map_err(|e| format!("{text}: {e}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        other => Err(format!("unknown unit {other:?}; use ms, s or m")),
    }
}

fn find<'a>(results: &'a [Measurement], prefix: &str) -> Option<&'a Measurement> {
    results.iter().find(|m| m.name.starts_with(prefix))
}

fn print_table(results: &[Measurement]) {
    println!("| scenario | ops/s | p50 | p99 |");
    println!("|---|---:|---:|---:|");
    for m in results {
        println!(
            "| {} | {:.0} | {:.2} ms | {:.2} ms |",
            m.name,
            m.ops_per_sec(),
            m.p50.as_secs_f64() * 1e3,
            m.p99.as_secs_f64() * 1e3
        );
    }
}

fn ratio_line(results: &[Measurement], what: &str, a: &str, b: &str, target: &str) {
    if let (Some(a), Some(b)) = (find(results, a), find(results, b)) {
        println!(
            "| {what} | {:.2} | {target} |",
            a.ops_per_sec() / b.ops_per_sec()
        );
    }
}

fn latency_line(results: &[Measurement], what: &str, a: &str, b: &str, target: &str) {
    if let (Some(a), Some(b)) = (find(results, a), find(results, b)) {
        println!(
            "| {what} | {:.2} | {target} |",
            a.p50.as_secs_f64() / b.p50.as_secs_f64()
        );
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    println!(
        "clients: {}, duration per scenario: {:?}, cores: {}",
        args.clients,
        args.duration,
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    );
    let setup = idempotency::Setup::new(args.clients).await;
    let results = idempotency::run(&setup, args.clients, args.duration).await;
    println!();
    print_table(&results);
    println!();
    println!("| ratio | measured | target |");
    println!("|---|---:|---|");
    ratio_line(
        &results,
        "execute / the same SQL issued directly (throughput)",
        "execute:",
        "direct SQL: claim",
        ">= 0.90",
    );
    ratio_line(
        &results,
        "execute / business transaction alone (throughput)",
        "execute:",
        "baseline",
        "report (pgbench ~0.58)",
    );
    ratio_line(
        &results,
        "execute_optimistic / the same SQL issued directly",
        "execute_optimistic",
        "direct SQL: business, insert",
        ">= 0.90",
    );
    ratio_line(
        &results,
        "execute_optimistic / business transaction alone",
        "execute_optimistic",
        "baseline",
        "report (pgbench ~0.78)",
    );
    ratio_line(
        &results,
        "replay moka / replay postgres (throughput)",
        "replay: moka",
        "replay: postgres (lookup",
        ">= 20",
    );
    latency_line(
        &results,
        "replay redis / bare redis GET (p50 latency)",
        "replay: redis",
        "bare: redis GET",
        "<= 1.3",
    );
    latency_line(
        &results,
        "replay postgres / bare primary-key SELECT (p50 latency)",
        "replay: postgres (lookup",
        "bare: primary-key SELECT",
        "<= 1.3",
    );
}
