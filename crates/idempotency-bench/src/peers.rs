//! Peer libraries, run from the load bench as other programs: first executions through
//! `@node-idempotency/core` (Node.js) and Powertools for AWS Lambda (Python), both with Redis
//! as their store and the same business insert autocommitted in PostgreSQL, on the bench's own
//! table and schema, interleaved with the library's scenarios. Neither peer is transactional:
//! its record and the business row commit apart, in two systems.
//!
//! The harnesses are in `crates/idempotency-bench/peers/`; `scripts/peers.sh` installs the
//! peers they drive outside the repository, at pinned versions, into the directory that
//! `--peers` names. A peer that is not installed there is left out of the run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::harness::{ExternalRun, Scenario};

/// The scenario name of the Node.js peer's first executions.
const NODE: &str = "peer: @node-idempotency/core + Redis (not transactional): first execution";
/// The scenario name of the Python peer's first executions.
const POWERTOOLS: &str =
    "peer: Powertools for AWS Lambda (Python) + Redis (not transactional): first execution";

/// The peer's short name when `scenario` is one of the peer scenarios.
pub(crate) fn label(scenario: &str) -> Option<&'static str> {
    match scenario {
        NODE => Some("@node-idempotency/core"),
        POWERTOOLS => Some("Powertools for AWS Lambda"),
        _ => None,
    }
}

/// One peer: the interpreter, its harness, and what the harness needs to find its modules.
#[derive(Clone)]
struct Peer {
    program: PathBuf,
    script: PathBuf,
    env: Vec<(&'static str, PathBuf)>,
}

/// The peer scenarios installed under `dir` (`scripts/peers.sh`), each with `clients` clients
/// against `schema` (which holds `bench_payments`); keys start with `run`.
pub(crate) fn scenarios(dir: &Path, schema: &str, clients: u64, run: u64) -> Vec<Scenario> {
    let harnesses = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers");
    let mut peers = Vec::new();
    let node_modules = dir.join("node/node_modules");
    if node_modules.join("@node-idempotency/core").is_dir() {
        peers.push((
            NODE,
            Peer {
                program: PathBuf::from("node"),
                script: harnesses.join("node-idempotency.cjs"),
                env: vec![("NODE_PATH", node_modules)],
            },
        ));
    }
    let python = dir.join("python/bin/python");
    if python.is_file() {
        peers.push((
            POWERTOOLS,
            Peer {
                program: python,
                script: harnesses.join("powertools.py"),
                env: Vec::new(),
            },
        ));
    }
    let slices = Arc::new(AtomicU64::new(0));
    peers
        .into_iter()
        .map(|(name, peer)| {
            let (schema, slices) = (schema.to_owned(), Arc::clone(&slices));
            Scenario::external(
                name,
                clients,
                Arc::new(move |slice| {
                    let (peer, schema) = (peer.clone(), schema.clone());
                    // A fresh key prefix per slice: every operation is a first execution.
                    let prefix = format!("peer-{run}-{}", slices.fetch_add(1, Ordering::Relaxed));
                    Box::pin(async move {
                        tokio::task::spawn_blocking(move || {
                            peer.run(&schema, &prefix, clients, slice)
                        })
                        .await
                        .expect("peer thread")
                    })
                }),
            )
        })
        .collect()
}

impl Peer {
    /// One slice: the harness runs its clients for `slice` and reports each operation's
    /// latency and the time it measured them in (without its start-up and connections).
    fn run(&self, schema: &str, prefix: &str, clients: u64, slice: Duration) -> ExternalRun {
        let out = Command::new(&self.program)
            .arg(&self.script)
            .args(["--clients", &clients.to_string()])
            .args(["--seconds", &slice.as_secs_f64().to_string()])
            .args(["--schema", schema, "--prefix", prefix])
            .env("DATABASE_URL", idempotency_testing::database_url())
            .envs(crate::pgbench::UNENCRYPTED)
            .env("REDIS_URL", idempotency_testing::redis_url())
            .envs(self.env.iter().map(|(k, v)| (k, v.as_os_str())))
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", self.program.display()));
        assert!(
            out.status.success(),
            "{} failed: {}",
            self.script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        parse(&out.stdout)
    }
}

/// The harness's report: `{"elapsed_s": f64, "latencies_us": [u64, ...]}`.
fn parse(stdout: &[u8]) -> ExternalRun {
    let report: serde_json::Value = serde_json::from_slice(stdout).expect("peer report is JSON");
    let elapsed = report["elapsed_s"].as_f64().expect("elapsed_s");
    let latencies = report["latencies_us"]
        .as_array()
        .expect("latencies_us")
        .iter()
        .map(|v| Duration::from_micros(v.as_u64().expect("a latency in microseconds")))
        .collect();
    ExternalRun {
        latencies,
        elapsed: Duration::from_secs_f64(elapsed),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{NODE, POWERTOOLS, label, parse};

    #[test]
    fn only_the_peer_scenarios_have_a_label() {
        assert_eq!(label(NODE), Some("@node-idempotency/core"));
        assert_eq!(label(POWERTOOLS), Some("Powertools for AWS Lambda"));
        assert_eq!(label("execute: first execution"), None);
    }

    #[test]
    fn a_report_gives_latencies_and_the_measured_window() {
        let run = parse(br#"{"elapsed_s": 2.5, "latencies_us": [900, 1200]}"#);
        assert_eq!(run.elapsed, Duration::from_millis(2500));
        assert_eq!(
            run.latencies,
            [Duration::from_micros(900), Duration::from_micros(1200)]
        );
    }
}
