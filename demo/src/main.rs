//! `cargo run -p idempotency-demo`: the demo service on http://127.0.0.1:8080.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use idempotency_cache_redis::RedisCache;
use idempotency_core::cleanup::CleanupJob;
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::{Database, Mysql, Postgres, Sqlite};
use idempotency_demo::{App, StartupError, build_service, router};
use idempotency_metrics::FacadeMetrics;
use idempotency_outbox::publisher::nats::NatsPublisher;
use idempotency_outbox::{LoggingPublisher, Publisher, Relay, RelayHandle};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;

/// The JetStream stream that captures the demo's events.
const STREAM: &str = "IDEMPOTENCY_DEMO";
/// Subject template of the demo's events: `demo.charge.ChargeCreated`.
const SUBJECT: &str = "demo.{aggregate_type}.{event_type}";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            tracing::error!("the demo could not start: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `DEMO_CONFIG`, else `config/demo.yaml` or `demo/config/demo.yaml`, whichever exists.
fn config_path() -> PathBuf {
    if let Some(path) = std::env::var_os("DEMO_CONFIG") {
        return PathBuf::from(path);
    }
    ["config/demo.yaml", "demo/config/demo.yaml"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("config/demo.yaml"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

async fn run() -> Result<(), StartupError> {
    let path = config_path();
    let mut config = DemoConfig::load(&path)?;
    tracing::info!(config = %path.display(), exists = path.exists(), "configuration");
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    FacadeMetrics::describe();
    idempotency_outbox::metrics::describe();

    let redis = match env("REDIS_URL") {
        Some(url) if config.idempotency.distributed_cache.enabled => Some(RedisCache::connect(
            &url,
            &config.idempotency.distributed_cache,
        )?),
        _ => None,
    };
    let nats = match env("NATS_URL") {
        Some(url) => Some(
            async_nats::connect(&url)
                .await
                .map_err(|e| StartupError::Nats(e.to_string()))?,
        ),
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
            let db = Mysql::connect(&url, &config).await?;
            serve(db, config, redis, nats, prometheus).await
        }
        (None, Some(url)) => {
            let db = Postgres::connect(&url, &config).await?;
            serve(db, config, redis, nats, prometheus).await
        }
        (None, None) => {
            // No server at all: the embedded default.
            config.outbox.notify_channel = None;
            let db = Sqlite::open(&config.demo.sqlite_path, &config).await?;
            serve(db, config, redis, nats, prometheus).await
        }
    }
}

async fn serve<DB: Database>(
    db: DB,
    config: DemoConfig,
    redis: Option<RedisCache>,
    nats: Option<async_nats::Client>,
    prometheus: PrometheusHandle,
) -> Result<(), StartupError> {
    let service = build_service(db.store().clone(), &config.idempotency, redis.clone());
    let mut app = App::new(db.clone(), service, config.demo.clone());
    app.redis = redis.clone();
    app.nats = nats.clone();
    app.prometheus = Some(prometheus);

    let relay = match &nats {
        Some(client) => {
            let jetstream = async_nats::jetstream::new(client.clone());
            jetstream
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: STREAM.to_owned(),
                    subjects: vec!["demo.>".to_owned()],
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await
                .map_err(|e| StartupError::Nats(e.to_string()))?;
            let publisher = NatsPublisher::from_context(jetstream).with_subject(SUBJECT)?;
            spawn_relay(&db, publisher, &config)?
        }
        None => spawn_relay(&db, LoggingPublisher::new(), &config)?,
    };

    let (stop, stopped) = watch::channel(false);
    let cleanup = if config.idempotency.persistence.cleanup.enabled {
        let job = CleanupJob::from_config(
            db.store().clone(),
            &config.idempotency.persistence.cleanup,
            FacadeMetrics,
        )?;
        let mut stopped = stopped.clone();
        Some(tokio::spawn(job.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })))
    } else {
        None
    };

    let address = SocketAddr::from(([0, 0, 0, 0], config.server.port));
    let listener = tokio::net::TcpListener::bind(address).await?;
    tracing::info!(
        "idempotency demo listening on http://{}",
        listener.local_addr()?
    );
    tracing::info!("data: {}", db.describe());
    tracing::info!(
        "idempotency cache: moka L1 {}, Redis L2 {}",
        if config.idempotency.local_cache.enabled {
            "on"
        } else {
            "off"
        },
        if redis.is_some() {
            "on (REDIS_URL)"
        } else {
            "off (set REDIS_URL)"
        }
    );
    tracing::info!(
        "outbox publisher: {}",
        if nats.is_some() {
            "NATS JetStream (NATS_URL), stream IDEMPOTENCY_DEMO, subjects demo.>"
        } else {
            "logging (set NATS_URL for JetStream)"
        }
    );

    app.relay = Some(relay.monitor());
    let routes = router(app, config.server.max_body_bytes);
    axum::serve(listener, routes)
        .with_graceful_shutdown(shutdown_signal())
        .await?;

    tracing::info!("shutting down: stopping the relay and the cleanup job");
    let _ = stop.send(true);
    let report = relay.shutdown().await;
    tracing::info!(
        graceful = report.graceful,
        aborted = report.aborted,
        worker_panics = report.worker_panics,
        "relay stopped"
    );
    if let Some(cleanup) = cleanup {
        let _ = cleanup.await;
    }
    Ok(())
}

fn spawn_relay<DB: Database, P: Publisher>(
    db: &DB,
    publisher: P,
    config: &DemoConfig,
) -> Result<RelayHandle, StartupError> {
    Ok(Relay::new(db.outbox().clone(), publisher, &config.outbox)?.spawn())
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
