//! Outages log once per change of state, not once per request: Redis and the broker are taken
//! away under load through TCP proxies this test owns (the shared servers keep running), the
//! log is captured, and its `WARN` lines are counted; the changes are counted in the meters.
//!
//! One test function: the subscriber and the metrics recorder are global, and the two outages
//! run one after the other so that their lines do not mix.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency::outbox::NewEvent;
use idempotency::{Builder, Call, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn settings(yaml: &str) -> Settings {
    let file = std::env::temp_dir().join(format!("idempotency-quiet-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    loaded
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-quiet-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

/// The log, as the application's subscriber would write it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The lines written since the last call.
    fn take(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn at(lines: &[String], level: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|line| line.contains(&format!(" {level} ")))
        .cloned()
        .collect()
}

/// A TCP proxy to `target` that forwards while enabled; disabled, it cuts its connections
/// and refuses new ones.
struct Proxy {
    addr: SocketAddr,
    enabled: Arc<AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let enabled = Arc::new(AtomicBool::new(true));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (on, cuts) = (Arc::clone(&enabled), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                // Subscribed before the check: a cut sent between the two still closes it.
                let mut cut = cuts.subscribe();
                if !on.load(Ordering::SeqCst) {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self { addr, enabled, cut }
    }

    fn set(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::SeqCst);
        if !enabled {
            self.cut.send_modify(|n| *n += 1);
        }
    }
}

fn server(url_var: &str, default: &str) -> SocketAddr {
    use std::net::ToSocketAddrs;
    let url = std::env::var(url_var).unwrap_or_else(|_| default.to_owned());
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let host_port = rest.split(['/', '?']).next().unwrap();
    host_port.to_socket_addrs().unwrap().next().unwrap()
}

/// The value of the counter `name` with `labels` in the Prometheus text, 0 when absent.
fn counter(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests through the service from `clients` tasks until `until`; returns how many ran.
async fn load(
    idempotency: &Idempotency<sqlx::SqlitePool>,
    clients: usize,
    until: Instant,
) -> usize {
    let served = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let service = idempotency.service().clone();
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                while Instant::now() < until {
                    let request = serde_json::json!({"n": 1});
                    let key = IdempotencyKey::new(unique()).unwrap();
                    let outcome = service
                        .execute(Call::new("QUIET", key, &request), async |_conn| {
                            Ok::<_, idempotency::core::Error>(ExecutionResult::success(1))
                        })
                        .await;
                    assert!(outcome.is_ok(), "fail-open: served from the database");
                    served.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    served.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_log_once_per_change_of_state_not_per_request() {
    let log = Captured::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .try_init()
        .unwrap();
    let prometheus = idempotency::metrics::install().unwrap();

    // ---- Redis: away for 3 s under load, with a cool-down of 300 ms (ten trial cycles).
    let redis = Proxy::start(server("REDIS_URL", "redis://127.0.0.1:6379")).await;
    let yaml = format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    \
         enabled: true\n    url: redis://{}\n    secret: tests-only-secret-0123456789abcdef\n    \
         timeout: 100ms\n    circuit-breaker:\n      failure-threshold: 3\n      cool-down: 300ms\n",
        redis.addr
    );
    let idempotency = Builder::new(&settings(&yaml))
        .prometheus(prometheus.clone())
        .build(sqlite().await)
        .await
        .unwrap();
    let warm = load(&idempotency, 2, Instant::now() + Duration::from_millis(300)).await;
    assert!(warm > 0);
    log.take();

    redis.set(false);
    let during = load(&idempotency, 8, Instant::now() + Duration::from_secs(3)).await;
    redis.set(true);
    let started = Instant::now();
    let mut after = 0;
    while !idempotency
        .health()
        .await
        .cache
        .status
        .eq(&idempotency::health::Status::Up)
        && started.elapsed() < Duration::from_secs(10)
    {
        after += load(&idempotency, 2, Instant::now() + Duration::from_millis(200)).await;
    }
    after += load(&idempotency, 2, Instant::now() + Duration::from_millis(200)).await;
    let lines = log.take();
    let warnings = at(&lines, "WARN");
    let infos = at(&lines, "INFO");
    eprintln!(
        "Redis outage: {during} requests during, {after} after; {} WARN and {} INFO lines:\n{}",
        warnings.len(),
        infos.len(),
        lines.join("\n")
    );
    assert!(during >= 100, "under load: {during} requests");
    // Each breaker (reads, writes) logs its changes of state once; the outage is logged once.
    assert!(
        (1..=5).contains(&warnings.len()),
        "a handful of WARN lines, not one per request: {warnings:#?}"
    );
    assert!(
        lines.len() <= 12,
        "a handful of lines in all (WARN and INFO): {lines:#?}"
    );
    let one = |needle: &str| {
        assert_eq!(
            lines.iter().filter(|line| line.contains(needle)).count(),
            1,
            "{needle:?} once: {lines:#?}"
        );
    };
    for breaker in ["requests", "writes"] {
        let tagged = format!("breaker=\"{breaker}\"");
        for change in ["circuit breaker opened", "circuit breaker closed"] {
            assert_eq!(
                lines
                    .iter()
                    .filter(|line| line.contains(change) && line.contains(&tagged))
                    .count(),
                1,
                "{change:?} once for {tagged}: {lines:#?}"
            );
        }
    }
    one("Redis is treated as down");
    one("call succeeded: Redis answers again");
    let text = idempotency.render_metrics().unwrap();
    let breaker = "idempotency_cache_breaker_transitions_total";
    let open = counter(
        &text,
        breaker,
        &[("breaker", "requests"), ("state", "open")],
    );
    let half_open = counter(&text, breaker, &[("state", "half_open")]);
    let closed = counter(
        &text,
        breaker,
        &[("breaker", "requests"), ("state", "closed")],
    );
    assert!(
        open >= 2.0,
        "each failed trial reopens, counted: {open}\n{text}"
    );
    assert!(half_open >= 2.0, "{half_open}");
    assert_eq!(closed, 1.0);
    let changes = "idempotency_cache_connection_changes_total";
    assert_eq!(counter(&text, changes, &[("state", "lost")]), 1.0);
    assert_eq!(counter(&text, changes, &[("state", "back")]), 1.0);
    idempotency.shutdown().await;

    // ---- The broker: NATS away for 2 s while 40 events wait.
    let nats = Proxy::start(server("NATS_URL", "nats://127.0.0.1:4222")).await;
    let client = async_nats::ConnectOptions::new()
        .connect(format!("nats://{}", nats.addr))
        .await
        .unwrap();
    let unique = unique();
    let publisher = idempotency::outbox::publisher::nats::NatsPublisher::new(client.clone())
        .with_subject(&format!("quiet{unique}.{{aggregate_type}}.{{event_type}}"))
        .unwrap();
    publisher
        .ensure_stream(&format!("QUIET_{unique}"), Duration::from_secs(60))
        .await
        .unwrap();
    let pool = sqlite().await;
    let idempotency = Builder::new(&settings(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    \
         enabled: false\noutbox:\n  schema:\n    mode: create\n  notify-channel: null\n  relay:\n    \
         wake-up: poll\n    workers: 2\n    poll-interval: 50ms\n    publish-timeout: 200ms\n    backoff:\n      \
         base: 50ms\n      max: 300ms\n",
    ))
    .publisher(publisher)
    .prometheus(prometheus.clone())
    .build(pool.clone())
    .await
    .unwrap();
    log.take();
    nats.set(false);
    let outbox = idempotency.outbox().unwrap();
    for n in 0..40 {
        let mut tx = pool.begin().await.unwrap();
        let event = NewEvent::new(
            "order",
            format!("o-{n}"),
            "OrderPlaced",
            &serde_json::json!({}),
        );
        outbox
            .enqueue_all(&mut tx, &[event.unwrap()])
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed_during = idempotency.health().await.outbox.pending;
    nats.set(true);
    let started = Instant::now();
    while idempotency.health().await.outbox.pending != Some(0)
        && started.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = idempotency.render_metrics().unwrap();
    let failures = counter(&text, "outbox_publish_failures_total", &[]);
    let lines = log.take();
    let warnings = at(&lines, "WARN");
    eprintln!(
        "broker outage: {failures} failed publishes, {failed_during:?} pending during; {} WARN lines:\n{}",
        warnings.len(),
        lines.join("\n")
    );
    assert_eq!(
        idempotency.health().await.outbox.pending,
        Some(0),
        "delivered"
    );
    assert!(
        failures >= 40.0,
        "every event failed at least once: {failures}"
    );
    // The relay's own lines; the NATS client logs each of its reconnect attempts itself
    // (`async_nats::connector`, at ERROR, with its own growing delay), which the report shows.
    let ours: Vec<_> = warnings
        .iter()
        .chain(&at(&lines, "ERROR"))
        .filter(|line| line.contains(" idempotency"))
        .cloned()
        .collect();
    assert_eq!(ours.len(), 1, "one WARN: broker lost: {ours:#?}");
    assert!(ours[0].contains("outbox broker lost"), "{ours:#?}");
    assert_eq!(
        lines
            .iter()
            .filter(|line| line.contains("outbox broker back"))
            .count(),
        1,
        "{lines:#?}"
    );
    assert!(
        warnings.len() <= 4,
        "a handful of WARN lines in all: {warnings:#?}"
    );
    let changes = "outbox_broker_state_changes_total";
    assert_eq!(counter(&text, changes, &[("state", "lost")]), 1.0);
    assert_eq!(counter(&text, changes, &[("state", "back")]), 1.0);
    idempotency.shutdown().await;
}
