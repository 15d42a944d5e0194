//! `cargo run -p idempotency-demo`: the demo service on http://127.0.0.1:8080.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use idempotency::Idempotency;
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::{Database, Mysql, Postgres, Sqlite};
use idempotency_demo::{App, StartupError, assemble, router};
use idempotency_outbox::publisher::nats::{NatsPublisher, server_addrs};
use idempotency_outbox::{LoggingPublisher, Publisher};

/// The JetStream stream that captures the demo's events.
const STREAM: &str = "IDEMPOTENCY_DEMO";
/// Subject template of the demo's events: `demo.charge.ChargeCreated`.
const SUBJECT: &str = "demo.{aggregate_type}.{event_type}";

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = match idempotency_demo::telemetry::init() {
        Ok(telemetry) => telemetry,
        Err(error) => {
            tracing::error!(
                "the demo could not start: {}",
                idempotency_core::error_chain(&error)
            );
            return ExitCode::FAILURE;
        }
    };
    if telemetry.exporting() {
        tracing::info!("traces: exported over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)");
    }
    let ran = run().await;
    // The batch exporter's last spans, before the process ends (blocking: off the runtime).
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(
                "the demo could not start: {}",
                idempotency_core::error_chain(&error)
            );
            ExitCode::FAILURE
        }
    }
}

/// `DEMO_CONFIG` (which must exist), else `config/demo.yaml` or `demo/config/demo.yaml`,
/// whichever exists (neither: the defaults and the environment); whether it is required.
fn config_path() -> (PathBuf, bool) {
    if let Some(path) = std::env::var_os("DEMO_CONFIG") {
        return (PathBuf::from(path), true);
    }
    let path = ["config/demo.yaml", "demo/config/demo.yaml"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("config/demo.yaml"));
    (path, false)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

async fn run() -> Result<(), StartupError> {
    let (path, required) = config_path();
    let mut config = if required {
        DemoConfig::load_required(&path)?
    } else {
        DemoConfig::load(&path)?
    };
    tracing::info!(config = %path.display(), exists = path.exists(), "configuration");
    // The demo's own policy: Redis is L2 when `REDIS_URL` (or `distributed-cache.url`) names it.
    let redis = &mut config.idempotency.distributed_cache;
    redis.url = redis.url.take().or_else(|| env("REDIS_URL"));
    redis.enabled &= redis.url.is_some();
    // One URL or a cluster's comma-separated list: the client reconnects to another node of
    // the list when its own dies.
    let nats = match env("NATS_URL") {
        Some(urls) => {
            let servers = server_addrs(&urls).map_err(|e| StartupError::Nats(e.to_string()))?;
            Some(
                async_nats::connect(servers.as_slice())
                    .await
                    .map_err(|e| StartupError::Nats(e.to_string()))?,
            )
        }
        None => None,
    };
    let database_url = env("DATABASE_URL");
    let mysql_url = match &database_url {
        Some(url) if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
            Some(url.clone())
        }
        Some(_) => None,
        None => env("MYSQL_URL"),
    };
    match (mysql_url, database_url) {
        (Some(url), _) => {
            // No LISTEN/NOTIFY on MySQL: the relay polls.
            config.outbox.notify_channel = None;
            config.outbox.relay.wake_up = idempotency::outbox::config::WakeUp::Poll;
            let pool = Mysql::connect(&url, &config).await?;
            serve::<Mysql>(pool, config, nats).await
        }
        (None, Some(url)) => {
            let pool = Postgres::connect(&url, &config).await?;
            serve::<Postgres>(pool, config, nats).await
        }
        (None, None) => {
            // No server at all: the embedded default, which has no notifications either, nor a
            // per-key in-flight wait (a duplicate waits for the write lock, up to the busy
            // timeout): the facade refuses those keys on SQLite.
            config.outbox.notify_channel = None;
            config.outbox.relay.wake_up = idempotency::outbox::config::WakeUp::Poll;
            config.idempotency.in_flight = Default::default();
            let pool = Sqlite::open(&config.demo.sqlite_path).await?;
            serve::<Sqlite>(pool, config, nats).await
        }
    }
}

async fn serve<DB: Database>(
    pool: DB::Pool,
    config: DemoConfig,
    nats: Option<async_nats::Client>,
) -> Result<(), StartupError>
where
    DB::Pool: idempotency::ops::AdminDatabase,
{
    let prometheus = idempotency::metrics::install()?;
    let (db, idempotency) = match &nats {
        Some(client) => {
            let publisher = NatsPublisher::new(client.clone()).with_subject(SUBJECT)?;
            publisher
                .ensure_stream(STREAM, config.outbox.relay.republish_window())
                .await?;
            wire::<DB, _>(pool, &config, publisher, prometheus.clone()).await?
        }
        None => wire::<DB, _>(pool, &config, LoggingPublisher::new(), prometheus.clone()).await?,
    };
    let mut app = App::new(
        db.clone(),
        idempotency.service().clone(),
        config.demo.clone(),
    );
    app.prometheus = Some(prometheus);
    app.health = Some(idempotency.health_check());

    let address = SocketAddr::new(config.server.host, config.server.port);
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(
        "idempotency demo listening on http://{}",
        listener.local_addr()?
    );
    tracing::info!("data: {}", db.describe());
    banner(&idempotency, nats.is_some());

    idempotency_demo::reconcile::describe();
    let reconcile = tokio::spawn(idempotency_demo::reconcile::run(
        db.clone(),
        config.demo.reconcile_interval,
        idempotency_demo::reconcile::window(config.outbox.retention.published),
    ));

    let mut routes = router(app, config.server.max_body_bytes);
    match idempotency_demo::admin::router(&idempotency, &config.admin)? {
        Some(admin) => {
            tracing::info!(
                changes = config.admin.allow_mutations,
                "admin page on /admin (Authorization: Bearer <admin.token>)"
            );
            routes = routes
                .nest("/admin", admin)
                .layer(axum::middleware::map_response(
                    idempotency_demo::app::bare_errors,
                ));
        }
        None => tracing::info!("admin page not mounted: admin.token (ADMIN__TOKEN) is not set"),
    }
    axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown_signal())
        .await?;

    tracing::info!("shutting down: stopping the relay and the cleanup job");
    reconcile.abort();
    let report = idempotency.shutdown().await;
    if let Some(relay) = report.relay {
        tracing::info!(
            graceful = relay.graceful,
            aborted = relay.aborted,
            worker_panics = relay.worker_panics,
            "relay stopped"
        );
    }
    db.close().await;
    Ok(())
}

/// [`assemble`] with a publisher, when `outbox.relay.enabled`.
async fn wire<DB: Database, P: Publisher>(
    pool: DB::Pool,
    config: &DemoConfig,
    publisher: P,
    prometheus: idempotency::metrics::PrometheusHandle,
) -> Result<(DB, Idempotency<DB::Pool>), StartupError> {
    let publisher = config.outbox.relay.enabled.then_some(publisher);
    assemble::<DB, P>(pool, config, publisher, Some(prometheus)).await
}

fn banner<P: idempotency::Database>(idempotency: &Idempotency<P>, nats: bool) {
    let on = |on: bool| if on { "on" } else { "off" };
    let service = idempotency.service();
    tracing::info!(
        "idempotency cache: moka L1 {}, Redis L2 {}, cleanup {}",
        on(service.local_cache().is_some()),
        if service.distributed_cache().is_some() {
            "on"
        } else {
            "off (set REDIS_URL)"
        },
        on(idempotency.cleanup_running()),
    );
    tracing::info!(
        "outbox publisher: {}",
        match (idempotency.relay().is_some(), nats) {
            (false, _) => "none (outbox.relay.enabled is false)",
            (true, true) => "NATS JetStream (NATS_URL), stream IDEMPOTENCY_DEMO, subjects demo.>",
            (true, false) => "logging (set NATS_URL for JetStream)",
        }
    );
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
