//! `idempotency-check`: runs seeded histories against the subjects and checks them.
//!
//! ```text
//! idempotency-check                          # the fixed seeds and 4 fresh ones, every subject
//! idempotency-check --seed 42 --subject layer-pg   # replays one history
//! idempotency-check --budget 1800            # a soak: fresh seeds until the budget is spent
//! ```
//!
//! Exits 1 when any history breaks an invariant (each failing one is printed with its seed,
//! subject and the history of the keys concerned), 2 when a run could not be made.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a command-line tool

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use idempotency_check::{Ctx, SUBJECTS, Subject, check};

/// The seeds every run checks, besides fresh ones.
const FIXED_SEEDS: &[u64] = &[1, 2, 3];

#[derive(Debug, Parser)]
#[command(about = "Randomized histories under faults, checked against the invariants")]
struct Args {
    /// Seeds to run (repeatable); none: the fixed seeds plus `--fresh` new ones.
    #[arg(long)]
    seed: Vec<u64>,
    /// Subjects to run (repeatable); none: every subject.
    #[arg(long)]
    subject: Vec<String>,
    /// How many fresh seeds to add to the fixed ones when no `--seed` is given.
    #[arg(long, default_value_t = 4)]
    fresh: u64,
    /// Keep drawing fresh seeds until this many seconds have passed (a soak).
    #[arg(long)]
    budget: Option<u64>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let subjects: Vec<Subject> = if args.subject.is_empty() {
        SUBJECTS.iter().filter_map(|s| s.parse().ok()).collect()
    } else {
        match args.subject.iter().map(|s| s.parse()).collect() {
            Ok(subjects) => subjects,
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::from(2);
            }
        }
    };
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    // splitmix64 of the clock and the seed's number: fresh seeds differ from run to run.
    let fresh = |n: u64| {
        let mut z = base.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) >> 16
    };
    let mut seeds: Vec<u64> = if args.seed.is_empty() {
        FIXED_SEEDS
            .iter()
            .copied()
            .chain((0..args.fresh).map(fresh))
            .collect()
    } else {
        args.seed.clone()
    };
    println!(
        "seeds: {}",
        seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let ctx = Ctx::new();
    let started = Instant::now();
    let budget = args.budget.map(Duration::from_secs);
    let (mut histories, mut operations, mut faults, mut failed) = (0usize, 0usize, 0usize, 0usize);
    let mut by_kind = idempotency_check::faults::KINDS.map(|kind| (kind.name(), 0usize));
    let mut next_fresh = args.fresh;
    let mut i = 0;
    loop {
        let Some(&seed) = seeds.get(i) else {
            match budget {
                Some(budget) if started.elapsed() < budget => {
                    seeds.push(fresh(next_fresh));
                    next_fresh += 1;
                    continue;
                }
                _ => break,
            }
        };
        i += 1;
        for subject in &subjects {
            match check(*subject, seed, &ctx).await {
                Ok(report) => {
                    histories += 1;
                    operations += report.operations();
                    faults += report.faults_injected();
                    for ((_, total), (_, n)) in by_kind.iter_mut().zip(report.faults_by_kind()) {
                        *total += n;
                    }
                    if report.violations.is_empty() {
                        println!(
                            "ok   seed {seed} {subject} ({} operations, {} faults, caches {}{})",
                            report.operations(),
                            report.faults_injected(),
                            report.plan.caches.name(),
                            report.settings()
                        );
                    } else {
                        failed += 1;
                        println!("FAIL {report}");
                    }
                }
                Err(error) => {
                    eprintln!("seed {seed} {subject}: the run could not be made: {error}");
                    return ExitCode::from(2);
                }
            }
        }
    }
    println!(
        "{histories} histories, {operations} operations, {faults} faults injected, {} invariants \
         checked on each, {failed} failed, in {:.0} s",
        idempotency_check::INVARIANTS.len(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "faults by kind: {}; seeds: {}",
        by_kind
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        seeds.len()
    );
    println!("check: {} passed, {failed} failed", histories - failed);
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
