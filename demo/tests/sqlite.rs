//! The demo on its embedded default (a SQLite file): 20 concurrent duplicates run the payment
//! once, a charge commits with its outbox event, the file setting and its opening, and the
//! reconciliation query's cost.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use idempotency_core::config::SchemaMode;
use idempotency_demo::config::DemoConfig;
use idempotency_demo::db::{Database, Sqlite};
use idempotency_demo::{App, assemble_without_relay, router};
use idempotency_pg::sqlx;
use serde_json::Value;
use tower::ServiceExt;

async fn demo() -> (axum::Router, Sqlite, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.notify_channel = None;
    config.outbox.relay.enabled = false;
    config.idempotency.distributed_cache.enabled = false;
    let pool = Sqlite::open(&dir.path().join("data/demo.db"))
        .await
        .unwrap();
    let (db, idempotency) = assemble_without_relay::<Sqlite>(pool, &config)
        .await
        .unwrap();
    let app = App::new(
        db.clone(),
        idempotency.service().clone(),
        config.demo.clone(),
    );
    (router(app, config.server.max_body_bytes), db, dir)
}

async fn post(app: &axum::Router, path: &str, key: &str, body: &str) -> (StatusCode, bool, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, serde_json::from_slice(&bytes).unwrap())
}

async fn count(db: &Sqlite, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(db.store().pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_duplicates_run_once() {
    let (app, db, _dir) = demo().await;
    let body = r#"{"orderId":"o-20","recipient":"dave","amount":20}"#;
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { post(&app, "/api/payments", "twenty", body).await })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert!(
        replies
            .iter()
            .all(|(status, _, _)| *status == StatusCode::CREATED),
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|(_, replayed, _)| !replayed).count(),
        1,
        "one execution"
    );
    let id = &replies[0].2["paymentId"];
    assert!(replies.iter().all(|(_, _, body)| &body["paymentId"] == id));
    assert_eq!(count(&db, "payments").await, 1);
    assert_eq!(count(&db, "idempotency_records").await, 1);
}

#[tokio::test]
async fn a_charge_commits_with_its_event() {
    let (app, db, _dir) = demo().await;
    let key = "2c5ea4c0-4067-11e9-8bad-9b1deb4d3b7d";
    let (status, _, first) = post(&app, "/charges", key, r#"{"amountCents":4900}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, replayed, again) = post(&app, "/charges", key, r#"{"amountCents":4900}"#).await;
    assert!(replayed);
    assert_eq!(first, again);
    assert_eq!(count(&db, "charges").await, 1);
    assert_eq!(count(&db, "outbox").await, 1);
    let failed = post(
        &app,
        "/api/payments",
        "fail",
        r#"{"orderId":"o","recipient":"FAIL_TECH","amount":1}"#,
    )
    .await;
    assert_eq!(failed.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        count(&db, "idempotency_records").await,
        1,
        "a technical failure stores nothing"
    );
}

/// `/v2/charges` (the layer alone): the charge, its event and the record commit together in
/// the layer's SQLite transaction; a failing `/v2/payments` leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_v2_charge_commits_with_its_event() {
    let (app, db, _dir) = demo().await;
    let key = "6f1c2a9e-8d0b-4e7a-9b3c-5d4e3f2a1b0c";
    let (status, replayed, first) = post(&app, "/v2/charges", key, r#"{"amountCents":4900}"#).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false));
    let (_, replayed, again) = post(&app, "/v2/charges", key, r#"{"amountCents":4900}"#).await;
    assert!(replayed);
    assert_eq!(first, again);
    assert_eq!(count(&db, "charges").await, 1);
    assert_eq!(count(&db, "outbox").await, 1);
    assert_eq!(count(&db, "idempotency_records").await, 1);
    let failed = post(
        &app,
        "/v2/payments",
        "fail",
        r#"{"orderId":"o","recipient":"FAIL_TECH","amount":1}"#,
    )
    .await;
    assert_eq!(failed.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(count(&db, "payments").await, 0);
    assert_eq!(count(&db, "idempotency_records").await, 1);
}

/// `demo.sqlite-path` is a file path. A `sqlite:` URL made a stray `./sqlite:/store` directory
/// and failed; a `file:` URI with `mode=memory` gave each pooled connection an empty database
/// of its own (requests failed with `no such table`). Both are refused, naming the setting,
/// before anything is created.
#[tokio::test]
async fn a_sqlite_path_that_is_no_file_path_is_refused_naming_the_setting() {
    for value in [
        "sqlite://store/demo.db",
        "file:mem.db?mode=memory",
        ":memory:",
    ] {
        let error = Sqlite::open(std::path::Path::new(value)).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("demo.sqlite-path") && message.contains(value),
            "{value}: {message}"
        );
    }
    assert!(
        !std::path::Path::new("sqlite:").exists(),
        "a stray ./sqlite: directory"
    );
}

/// Two demos started at once on a fresh file: one switches it to WAL while the others get
/// `database is locked` from that switch unless they retry, as the store's `open_pool` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demos_opening_a_fresh_file_at_once_take_turns() {
    for _ in 0..25 {
        let dir = tempdir::Dir::new();
        let path = dir.path().join("data/demo.db");
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { Sqlite::open(&path).await })
            })
            .collect();
        for open in opens {
            open.await.unwrap().unwrap().close().await;
        }
    }
}

/// `charges` and `ChargeCreated` events, `n` of each, written directly.
async fn reconcile_time(n: i64) -> std::time::Duration {
    let (_, db, _dir) = demo().await;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
         INSERT INTO charges (id, amount_cents) SELECT 'ch_' || i, 100 FROM n",
    )
    .bind(n)
    .execute(db.store().pool())
    .await
    .unwrap();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
         INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at, \
             next_attempt_at, published_at) \
         SELECT printf('00000000-0000-7000-8000-%012d', i), 'charge', 'ch_' || i, \
                'ChargeCreated', '{}', 0, 0, 0 FROM n",
    )
    .bind(n)
    .execute(db.store().pool())
    .await
    .unwrap();
    let mut shortest = std::time::Duration::MAX;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        assert_eq!(db.charges_without_event(3600).await.unwrap(), 0);
        shortest = shortest.min(started.elapsed());
    }
    shortest
}

/// The reconciliation query reads the events once, not once per charge: four times the
/// charges and events take about four times as long, not sixteen.
#[tokio::test]
async fn the_reconcile_query_is_not_quadratic() {
    let small = reconcile_time(1_000).await;
    let large = reconcile_time(4_000).await;
    eprintln!("reconcile 1,000 x 1,000: {small:?}; 4,000 x 4,000: {large:?}");
    assert!(
        large < small * 8 + std::time::Duration::from_millis(5),
        "4,000: {large:?}; 1,000: {small:?}"
    );
}

/// A temporary directory removed on drop (no extra dependency for one helper).
mod tempdir {
    use std::path::{Path, PathBuf};

    pub(super) struct Dir(PathBuf);

    impl Dir {
        pub(super) fn new() -> Self {
            let path = std::env::temp_dir().join(idempotency_testing::unique_name("demo-sqlite"));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }

        pub(super) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
