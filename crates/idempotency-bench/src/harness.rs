//! Runs one operation from N concurrent clients for a fixed duration and measures it.

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

/// What one scenario measured.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    pub(crate) name: String,
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

/// Runs `op` from `clients` tasks for `duration` (after a short warm-up) and measures it.
pub(crate) async fn measure(name: &str, clients: u64, duration: Duration, op: Op) -> Measurement {
    let warm_up = Instant::now() + Duration::from_millis(300);
    run_clients(clients, warm_up, Arc::clone(&op), u64::MAX / 2).await;
    let started = Instant::now();
    let deadline = started + duration;
    let histograms = run_clients(clients, deadline, op, 0).await;
    let elapsed = started.elapsed();
    let mut all = Histogram::<u64>::new(3).expect("histogram");
    for h in histograms {
        all.add(h).expect("same bounds");
    }
    Measurement {
        name: name.to_owned(),
        ops: all.len(),
        elapsed,
        p50: Duration::from_micros(all.value_at_quantile(0.5)),
        p99: Duration::from_micros(all.value_at_quantile(0.99)),
    }
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
