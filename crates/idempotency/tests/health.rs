//! `Idempotency::health()` and `health_router()` against real servers: liveness and readiness
//! on their own routes, a database that stops answering (through a TCP proxy this test owns
//! and cuts: the shared server keeps running), a backlog older than
//! `outbox.health.max-pending-age`, an open Redis breaker, the broker as the publisher sees it.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idempotency::health::{Breaker, Status};
use idempotency::outbox::NewEvent;
use idempotency::{Builder, Call, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings};
use serde_json::{Value, json};
use tower::ServiceExt;

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn settings(yaml: &str) -> Settings {
    try_settings(yaml).unwrap()
}

fn try_settings(yaml: &str) -> Result<Settings, idempotency::LoadError> {
    let file = std::env::temp_dir().join(format!("idempotency-health-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded
}

const BASE: &str = "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    enabled: false\n";

/// `BASE` with an outbox section (`outbox` holds its two-space indented keys).
fn with_outbox(outbox: &str) -> String {
    format!("{BASE}outbox:\n  schema:\n    mode: create\n  notify-channel: null\n{outbox}")
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-health-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

/// A TCP proxy to `target` that the test can cut: every connection through it is closed and
/// new ones are refused, while the server behind it keeps running for everyone else.
struct Proxy {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            // Dropped with the task: aborts every connection.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                connections.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self { addr, task }
    }

    fn cut(&self) {
        self.task.abort();
    }
}

fn server(url_var: &str, default: &str) -> SocketAddr {
    let url = std::env::var(url_var).unwrap_or_else(|_| default.to_owned());
    let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let host_port = rest.split(['/', '?']).next().unwrap();
    use std::net::ToSocketAddrs;
    host_port.to_socket_addrs().unwrap().next().unwrap()
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    let response = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    assert_eq!(response.headers()["content-type"], "application/json");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

async fn enqueue_one(idempotency: &Idempotency<sqlx::SqlitePool>, pool: &sqlx::SqlitePool) {
    let mut tx = pool.begin().await.unwrap();
    idempotency
        .outbox()
        .unwrap()
        .enqueue_all(
            &mut tx,
            &[NewEvent::new("charge", "c-1", "ChargeCreated", &json!({})).unwrap()],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn liveness_and_readiness_answer_on_their_own_routes() {
    let yaml = with_outbox("  relay:\n    enabled: false\n").replace(
        "  persistence:\n",
        "  persistence:\n    cleanup:\n      enabled: true\n",
    );
    let idempotency = Idempotency::from_config(&settings(&yaml), sqlite().await)
        .await
        .unwrap();
    let app: Router = idempotency.health_router();

    let (status, live) = get(&app, "/health/live").await;
    assert_eq!((status, live), (StatusCode::OK, json!({"status": "UP"})));

    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(
        ready,
        json!({
            "status": "UP",
            "database": {"status": "UP"},
            "cache": {"status": "DISABLED"},
            "relay": {"status": "DISABLED"},
            "outbox": {
                "status": "UP", "pending": 0, "oldest_pending_age_seconds": 0.0,
                "max_pending_age_seconds": 300.0, "dead_lettered": 0
            },
            "broker": {"status": "DISABLED"},
            "cleanup": {"status": "UP"}
        })
    );
    assert_eq!(get(&app, "/health").await, (StatusCode::OK, ready));
    let report = idempotency.health().await;
    assert!(report.is_ready());
    assert_eq!(report.cleanup.status, Status::Up);

    // The router outlives the service; after shutdown the cleanup job no longer runs.
    idempotency.shutdown().await;
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the database still answers: {ready}"
    );
    assert_eq!(ready["cleanup"]["status"], "DOWN");
}

/// The source of truth stops answering: 503 with the database `DOWN` (within the probe
/// timeout, though the pool would wait 30 s for a connection), while liveness stays 200; it
/// answers again: 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_does_not_answer_makes_the_service_unready() {
    let proxy = Proxy::start(server("DATABASE_URL", "postgres://127.0.0.1:5432/test")).await;
    let url = format!("postgres://postgres@{}/test", proxy.addr);
    let schema = format!("health_{}", unique());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .after_connect(move |conn, _| {
            let schema = schema.clone();
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path TO {schema}")))
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect(&url)
        .await
        .unwrap();
    let idempotency = Idempotency::from_config(&settings(BASE), pool)
        .await
        .unwrap();
    let app: Router = idempotency
        .health_check()
        .with_timeout(Duration::from_millis(500))
        .router();
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(ready["database"], json!({"status": "UP"}));

    proxy.cut();
    let started = std::time::Instant::now();
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert_eq!(ready["status"], "DOWN");
    assert_eq!(ready["database"]["status"], "DOWN");
    assert!(ready["database"]["error"].is_string(), "{ready}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the probe timeout: {:?}",
        started.elapsed()
    );
    let (status, live) = get(&app, "/health/live").await;
    assert_eq!((status, live), (StatusCode::OK, json!({"status": "UP"})));
    let report = idempotency.health().await;
    assert!(!report.is_ready());
    assert_eq!(report.database.status, Status::Down);
}

/// An event waits longer than `outbox.health.max-pending-age`: 503 naming the backlog; with
/// the threshold `null`, the same backlog is reported and the service stays ready.
#[tokio::test]
async fn a_backlog_older_than_max_pending_age_makes_the_service_unready() {
    let pool = sqlite().await;
    let idempotency = Idempotency::from_config(
        &settings(&with_outbox(
            "  relay:\n    enabled: false\n  health:\n    max-pending-age: 1s\n",
        )),
        pool.clone(),
    )
    .await
    .unwrap();
    let app: Router = idempotency.health_router();
    enqueue_one(&idempotency, &pool).await;
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a fresh event is no backlog: {ready}"
    );
    assert_eq!(ready["outbox"]["pending"], 1);
    assert_eq!(ready["outbox"]["max_pending_age_seconds"], 1.0);

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{ready}");
    assert_eq!(ready["status"], "DOWN");
    assert_eq!(ready["database"]["status"], "UP");
    assert_eq!(ready["outbox"]["status"], "DOWN");
    assert!(
        ready["outbox"]["oldest_pending_age_seconds"]
            .as_f64()
            .unwrap()
            > 1.0
    );

    // The same database and backlog, with no threshold: reported, ready.
    let unbounded = Idempotency::from_config(
        &settings(&with_outbox(
            "  relay:\n    enabled: false\n  health:\n    max-pending-age: null\n",
        )),
        pool.clone(),
    )
    .await
    .unwrap();
    let report = unbounded.health().await;
    assert!(report.is_ready(), "{report:?}");
    assert_eq!(report.outbox.status, Status::Up);
    assert_eq!(report.outbox.pending, Some(1));
    assert_eq!(report.outbox.max_pending_age_seconds, None);
}

#[tokio::test]
async fn a_zero_max_pending_age_is_refused_naming_the_key() {
    let error = Idempotency::from_config(
        &settings(&with_outbox(
            "  relay:\n    enabled: false\n  health:\n    max-pending-age: 0s\n",
        )),
        sqlite().await,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(error.contains("health.max-pending-age"), "{error}");
    let error = try_settings(&with_outbox("  health:\n    max-pending-age: soon\n"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("max-pending-age"), "{error}");
}

/// One execution of a new key through the service, its result.
async fn execute_once(
    idempotency: &Idempotency<sqlx::SqlitePool>,
) -> Result<idempotency::Outcome<i64>, idempotency::core::Error> {
    let request = json!({"n": 1});
    idempotency
        .service()
        .execute(
            Call::new("HEALTH", IdempotencyKey::new(unique()).unwrap(), &request),
            async |_conn| Ok::<_, idempotency::core::Error>(ExecutionResult::success(1)),
        )
        .await
}

fn redis_yaml(url: &str) -> String {
    format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    \
         enabled: true\n    url: {url}\n    secret: tests-only-secret-0123456789abcdef\n    \
         timeout: 200ms\n    circuit-breaker:\n      failure-threshold: 1\n      cool-down: 60s\n"
    )
}

/// Redis stops answering: a request opens the breaker (threshold 1), the report shows the
/// cache `DOWN` with the breaker `OPEN`, and the service stays ready (the cache only speeds up
/// replays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_redis_breaker_is_reported_and_the_service_stays_ready() {
    let proxy = Proxy::start(server("REDIS_URL", "redis://127.0.0.1:6379")).await;
    let idempotency = Idempotency::from_config(
        &settings(&redis_yaml(&format!("redis://{}", proxy.addr))),
        sqlite().await,
    )
    .await
    .unwrap();
    let report = idempotency.health().await;
    assert_eq!(report.cache.status, Status::Up, "{report:?}");
    assert_eq!(report.cache.breaker, Some(Breaker::Closed));
    assert_eq!(report.cache.consecutive_failures, Some(0));
    assert_eq!(report.cache.write_breaker, Some(Breaker::Closed));

    proxy.cut();
    let outcome = execute_once(&idempotency).await;
    assert!(outcome.is_ok(), "fail-open: served from the database");
    let report = idempotency.health().await;
    assert_eq!(report.cache.breaker, Some(Breaker::Open), "{report:?}");
    assert_eq!(report.cache.status, Status::Down);
    assert!(report.is_ready(), "{report:?}");
    let app: Router = idempotency.health_router();
    let (status, ready) = get(&app, "/health/ready").await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(
        ready["cache"],
        json!({"status": "DOWN", "breaker": "OPEN", "write_breaker": "OPEN"})
    );
}

/// A `redis-server` of this test's own on a free port, with `extra` arguments; killed when
/// dropped.
struct OwnRedis(std::process::Child, u16);

impl OwnRedis {
    async fn start(extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server is not installed (scripts/services.sh installs it)");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server does not answer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self(child, port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Redis refuses writes (`maxmemory` reached, `noeviction`: `OOM` to every `SET`) and answers
/// reads: the report shows the breaker of writes `OPEN` beside a cache `UP` with its breaker of
/// reads `CLOSED`, and the service stays ready (before: no breaker of writes in the report, so
/// a cache that stored nothing looked healthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_refuses_writes_shows_its_open_breaker_of_writes() {
    let redis = OwnRedis::start(&["--maxmemory", "1", "--maxmemory-policy", "noeviction"]).await;
    let idempotency = Idempotency::from_config(
        &settings(&redis_yaml(&format!("redis://127.0.0.1:{}", redis.1))),
        sqlite().await,
    )
    .await
    .unwrap();
    let outcome = execute_once(&idempotency).await;
    assert!(
        outcome.is_ok(),
        "a failed write after the commit fails nothing"
    );
    let report = idempotency.health().await;
    assert_eq!(report.cache.status, Status::Up, "{report:?}");
    assert_eq!(report.cache.breaker, Some(Breaker::Closed));
    assert_eq!(report.cache.write_breaker, Some(Breaker::Open));
    assert!(report.is_ready(), "{report:?}");
}

/// The relay's publisher answers for the broker: NATS `UP` while connected, `DOWN` once the
/// connection is cut (the service stays ready); a publisher that cannot tell is `UNKNOWN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_is_reported_from_the_relays_publisher() {
    let proxy = Proxy::start(server("NATS_URL", "nats://127.0.0.1:4222")).await;
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(format!("nats://{}", proxy.addr))
        .await
        .unwrap();
    let unique_subject = unique();
    let publisher = idempotency::outbox::publisher::nats::NatsPublisher::new(client)
        .with_subject(&format!("health{unique_subject}.{{aggregate_type}}"))
        .unwrap();
    // The relay refuses to start without a stream that keeps ids long enough.
    publisher
        .ensure_stream(
            &format!("HEALTH_{unique_subject}"),
            idempotency::outbox::config::RelayConfig::default().republish_window(),
        )
        .await
        .unwrap();
    let outbox = "  relay:\n    enabled: true\n    workers: 1\n    wake-up: poll\n";
    let idempotency = Builder::new(&settings(&with_outbox(outbox)))
        .publisher(publisher)
        .build(sqlite().await)
        .await
        .unwrap();
    let report = idempotency.health().await;
    assert_eq!(report.broker.status, Status::Up, "{report:?}");
    assert_eq!(report.broker.destination.as_deref(), Some("nats"));
    assert_eq!(report.relay.status, Status::Up);
    assert_eq!(report.relay.configured, Some(1));

    proxy.cut();
    let started = std::time::Instant::now();
    let mut report = idempotency.health().await;
    while report.broker.status != Status::Down && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = idempotency.health().await;
    }
    assert_eq!(report.broker.status, Status::Down, "{report:?}");
    assert!(report.broker.error.is_some());
    assert!(report.is_ready(), "events wait in the outbox: {report:?}");
    idempotency.shutdown().await;

    /// A publisher of the application's own, without `health`.
    struct Custom;
    impl idempotency::outbox::Publisher for Custom {
        fn destination(&self) -> &str {
            "custom"
        }
        async fn publish(
            &self,
            _message: &idempotency::outbox::OutboxMessage,
        ) -> Result<idempotency::outbox::Ack, idempotency::outbox::PublishError> {
            Ok(idempotency::outbox::Ack::default())
        }
    }
    let idempotency = Builder::new(&settings(&with_outbox(outbox)))
        .publisher(Custom)
        .build(sqlite().await)
        .await
        .unwrap();
    let report = idempotency.health().await;
    assert_eq!(report.broker.status, Status::Unknown, "{report:?}");
    assert!(report.is_ready());
    idempotency.shutdown().await;
}
