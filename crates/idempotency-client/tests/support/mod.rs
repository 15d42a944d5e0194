//! A real server for the client's tests: an axum payments endpoint behind
//! `idempotency_axum::IdempotencyLayer` on a fresh SQLite file (or an isolated PostgreSQL
//! schema, where a duplicate of a request in flight gets `409`; SQLite's writers queue on its
//! write lock instead), bound to `127.0.0.1:0`, and a proxy that loses the first answer after
//! the server sent it.

#![allow(dead_code)] // each test file uses a part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use idempotency_axum::{
    IdempotencyLayer, IdempotentTx, Problem, ProblemJson, ProblemKind, SharedScope,
};
use idempotency_core::{IdempotencyService, IdempotencyStore, InFlightPolicy, ServiceOptions};
use idempotency_pg::PgStore;
use idempotency_sqlite::{SqliteStore, sqlx};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Debug, serde::Deserialize)]
pub(crate) struct CreatePayment {
    pub(crate) amount: i64,
    #[serde(default)]
    pub(crate) slow: bool,
}

/// What the tests observe and steer on the server.
#[derive(Default)]
pub(crate) struct Hooks {
    /// Signalled when a `slow` payment has inserted its row.
    pub(crate) entered: Notify,
    /// The `Idempotency-Key` of every request to `/unavailable`, in order.
    pub(crate) keys: Mutex<Vec<Option<String>>>,
    /// How often the payment handler rejected a payment.
    pub(crate) rejections: std::sync::atomic::AtomicUsize,
}

/// A store the server runs on, with the one business statement it needs.
pub(crate) trait Backend: IdempotencyStore + Clone {
    /// A fresh store with its records table and a `payments` table, and its SQLite file.
    fn fresh() -> impl Future<Output = (Self, Option<std::path::PathBuf>)> + Send;
    /// Inserts a payment on the handler's connection; returns its id.
    fn insert(conn: &mut Self::Connection, amount: i64) -> impl Future<Output = i64> + Send;
    /// The number of payments, outside any transaction.
    fn payments(&self) -> impl Future<Output = i64> + Send;
}

impl Backend for SqliteStore {
    async fn fresh() -> (Self, Option<std::path::PathBuf>) {
        let path =
            std::env::temp_dir().join(format!("{}.db", idempotency_testing::unique_name("client")));
        let mut persistence = idempotency_core::config::PersistenceConfig::default();
        persistence.schema.mode = idempotency_core::config::SchemaMode::Create;
        let store = SqliteStore::connect(path.to_str().unwrap(), &persistence)
            .await
            .unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        (store, Some(path))
    }
    async fn insert(conn: &mut Self::Connection, amount: i64) -> i64 {
        sqlx::query_scalar("INSERT INTO payments (amount) VALUES (?) RETURNING id")
            .bind(amount)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    async fn payments(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

impl Backend for PgStore {
    async fn fresh() -> (Self, Option<std::path::PathBuf>) {
        let pool = idempotency_testing::pg_pool().await;
        let store = PgStore::new(pool.clone());
        store.create_schema().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id bigserial PRIMARY KEY, amount bigint NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        (store, None)
    }
    async fn insert(conn: &mut Self::Connection, amount: i64) -> i64 {
        sqlx::query_scalar("INSERT INTO payments (amount) VALUES ($1) RETURNING id")
            .bind(amount)
            .fetch_one(conn)
            .await
            .unwrap()
    }
    async fn payments(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(self.pool())
            .await
            .unwrap()
    }
}

pub(crate) struct Server<B: Backend = SqliteStore> {
    pub(crate) addr: SocketAddr,
    pub(crate) store: B,
    pub(crate) hooks: Arc<Hooks>,
    path: Option<std::path::PathBuf>,
}

impl<B: Backend> Drop for Server<B> {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

impl<B: Backend> Server<B> {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) async fn payments(&self) -> i64 {
        self.store.payments().await
    }

    pub(crate) fn rejections(&self) -> usize {
        self.hooks
            .rejections
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn keys(&self) -> Vec<Option<String>> {
        self.hooks.keys.lock().unwrap().clone()
    }
}

/// A payment: `201`, or above 1,000 a business rejection (`422 request-rejected`, stored and
/// replayed like a success).
async fn create_payment<B: Backend>(
    State(hooks): State<Arc<Hooks>>,
    mut tx: IdempotentTx<B>,
    ProblemJson(body): ProblemJson<CreatePayment>,
) -> axum::response::Response {
    if body.amount > 1000 {
        hooks
            .rejections
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        return Problem::new(ProblemKind::Rejected)
            .with_extension("code", "LIMIT_EXCEEDED")
            .into_response();
    }
    let id = B::insert(&mut tx, body.amount).await;
    if body.slow {
        hooks.entered.notify_one();
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "id": id, "amount": body.amount })),
    )
        .into_response()
}

/// Always `503`, recording the key it was sent with.
async fn unavailable(State(hooks): State<Arc<Hooks>>, headers: HeaderMap) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    hooks.keys.lock().unwrap().push(key);
    StatusCode::SERVICE_UNAVAILABLE
}

/// A business rejection whose problem document is 2 MiB long (a long `errors` list).
async fn long_rejection() -> impl IntoResponse {
    let errors = "x".repeat(2 * 1024 * 1024);
    let body = serde_json::json!({
        "type": "https://idempotency-rs.github.io/problems/request-rejected",
        "status": 422,
        "errors": errors,
    });
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        [("content-type", "application/problem+json")],
        body.to_string(),
    )
}

/// Always `400 body-unreadable`, recording the key it was sent with (as `/unavailable`): the
/// server could not read the body.
async fn unreadable(State(hooks): State<Arc<Hooks>>, headers: HeaderMap) -> impl IntoResponse {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned());
    hooks.keys.lock().unwrap().push(key);
    Problem::new(ProblemKind::BodyUnreadable).into_response()
}

/// Always `409` with a `Retry-After` of a minute.
async fn busy() -> impl IntoResponse {
    (StatusCode::CONFLICT, [("retry-after", "60")], "busy")
}

/// Starts the server on SQLite.
pub(crate) async fn start(in_flight: InFlightPolicy) -> Server {
    start_on(in_flight).await
}

/// Starts the server on `B`; `in_flight` says what a second request with a held key gets.
pub(crate) async fn start_on<B: Backend>(in_flight: InFlightPolicy) -> Server<B> {
    let (store, path) = B::fresh().await;
    let config = ServiceOptions {
        in_flight,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(store.clone())
        .config(config)
        .build();
    let hooks = Arc::new(Hooks::default());
    let app = Router::new()
        .route("/payments", post(create_payment::<B>))
        .route_layer(IdempotencyLayer::new(service).scope::<SharedScope>())
        .route(
            "/unavailable",
            post(unavailable).put(unavailable).delete(unavailable),
        )
        .route("/busy", post(busy))
        .route("/unreadable", post(unreadable))
        .route("/long-rejection", post(long_rejection))
        .with_state(Arc::clone(&hooks));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server {
        addr,
        store,
        hooks,
        path,
    }
}

/// A proxy to `upstream` that, on its first connection, lets the request through, waits for
/// the server's answer to start, then closes both sides without passing it on: the server
/// committed, the client saw a connection closed. Later connections pass through.
pub(crate) async fn lose_first_answer(upstream: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                continue;
            };
            if std::mem::take(&mut first) {
                tokio::spawn(async move {
                    let (mut client_read, _client_write) = inbound.split();
                    let (mut server_read, mut server_write) = outbound.split();
                    let forward = tokio::io::copy(&mut client_read, &mut server_write);
                    let mut answer = [0u8; 1024];
                    tokio::select! {
                        _ = forward => {}
                        _ = server_read.read(&mut answer) => {}
                    }
                    // both sockets dropped here: the answer never reaches the client
                });
            } else {
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        }
    });
    addr
}

/// A local port nothing listens on.
pub(crate) async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
