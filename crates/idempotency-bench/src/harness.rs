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

/// A named operation and how many clients run it.
pub(crate) struct Scenario {
    pub(crate) name: String,
    pub(crate) clients: u64,
    pub(crate) op: Op,
}

impl Scenario {
    pub(crate) fn new(name: impl Into<String>, clients: u64, op: Op) -> Self {
        Self {
            name: name.into(),
            clients,
            op,
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
        run_clients(
            scenario.clients,
            Instant::now() + Duration::from_millis(200),
            Arc::clone(&scenario.op),
            1 << 40,
        )
        .await;
    }
    for round in 0..rounds.max(1) {
        for (scenario, total) in scenarios.iter().zip(totals.iter_mut()) {
            let started = Instant::now();
            let first = u64::from(round) << 32;
            let histograms = run_clients(
                scenario.clients,
                started + slice,
                Arc::clone(&scenario.op),
                first,
            )
            .await;
            total.1 += started.elapsed();
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
