//! Runs operations from N concurrent clients for a fixed time and measures them, interleaving
//! scenarios over several rounds so that a ratio compares runs that shared the same machine load.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// One operation: called with (client index, iteration), returns when done.
pub(crate) type Op =
    Arc<dyn Fn(u64, u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Wraps an async closure as an [`Op`].
pub(crate) fn op<F, Fut>(f: F) -> Op
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |client, iteration| Box::pin(f(client, iteration)))
}

/// A run of another program for about the given time (pgbench).
pub(crate) type External =
    Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ExternalRun> + Send>> + Send + Sync>;

/// What another program measured: the latency of each operation, and the time it ran them in
/// (without its start-up and connection time).
pub(crate) struct ExternalRun {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) elapsed: Duration,
}

/// What a scenario runs: an operation called by each client in a loop, or another program that
/// runs its own clients for the slice and reports the latency of each operation it ran.
#[derive(Clone)]
pub(crate) enum Work {
    Clients(Op),
    External(External),
}

/// A named operation and how many clients run it.
pub(crate) struct Scenario {
    pub(crate) name: String,
    pub(crate) clients: u64,
    pub(crate) work: Work,
}

impl Scenario {
    pub(crate) fn new(name: impl Into<String>, clients: u64, op: Op) -> Self {
        Self {
            name: name.into(),
            clients,
            work: Work::Clients(op),
        }
    }

    /// A scenario run by another program (`clients` is what it was told to use).
    pub(crate) fn external(name: impl Into<String>, clients: u64, run: External) -> Self {
        Self {
            name: name.into(),
            clients,
            work: Work::External(run),
        }
    }
}

/// What one scenario measured over all rounds.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    pub(crate) name: String,
    pub(crate) clients: u64,
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
}

impl Measurement {
    pub(crate) fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs every scenario once per round, each for `duration / rounds`, in order, `rounds` times.
pub(crate) async fn run_interleaved(
    scenarios: &[Scenario],
    duration: Duration,
    rounds: u32,
) -> Vec<Measurement> {
    let slice = duration / rounds.max(1);
    let mut totals: Vec<(u64, Duration, Histogram<u64>)> = scenarios
        .iter()
        .map(|_| (0, Duration::ZERO, Histogram::new(3).expect("histogram")))
        .collect();
    for scenario in scenarios {
        let warm_up = Duration::from_millis(200);
        match &scenario.work {
            Work::Clients(op) => {
                run_clients(
                    scenario.clients,
                    Instant::now() + warm_up,
                    Arc::clone(op),
                    1 << 40,
                )
                .await;
            }
            Work::External(run) => {
                run(warm_up).await;
            }
        }
    }
    for round in 0..rounds.max(1) {
        for (scenario, total) in scenarios.iter().zip(totals.iter_mut()) {
            let started = Instant::now();
            let first = u64::from(round) << 32;
            let histograms = match &scenario.work {
                Work::Clients(op) => {
                    let histograms =
                        run_clients(scenario.clients, started + slice, Arc::clone(op), first).await;
                    total.1 += started.elapsed();
                    histograms
                }
                Work::External(run) => {
                    let run = run(slice).await;
                    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
                    for latency in run.latencies {
                        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                        histogram.record(micros.max(1)).expect("record");
                    }
                    total.1 += run.elapsed;
                    vec![histogram]
                }
            };
            for h in histograms {
                total.0 += h.len();
                total.2.add(h).expect("same bounds");
            }
        }
    }
    scenarios
        .iter()
        .zip(totals)
        .map(|(scenario, (ops, elapsed, histogram))| Measurement {
            name: scenario.name.clone(),
            clients: scenario.clients,
            ops,
            elapsed,
            p50: Duration::from_micros(histogram.value_at_quantile(0.5)),
            p99: Duration::from_micros(histogram.value_at_quantile(0.99)),
        })
        .collect()
}

async fn run_clients(
    clients: u64,
    deadline: Instant,
    op: Op,
    first_iteration: u64,
) -> Vec<Histogram<u64>> {
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut histogram = Histogram::<u64>::new(3).expect("histogram");
                let mut iteration = first_iteration;
                while Instant::now() < deadline {
                    let began = Instant::now();
                    op(client, iteration).await;
                    let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                    histogram.record(micros.max(1)).expect("record");
                    iteration += 1;
                }
                histogram
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("bench client panicked"));
    }
    out
}
