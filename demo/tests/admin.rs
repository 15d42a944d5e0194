//! `/admin` on the demo (SQLite): mounted only with `admin.token`, refused without the bearer
//! token, reads only unless `admin.allow-mutations`, and the configuration's keys.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use idempotency_core::config::SchemaMode;
use idempotency_demo::config::{AdminConfig, DemoConfig};
use idempotency_demo::db::Sqlite;
use idempotency_demo::{App, assemble_without_relay, router};
use serde_json::Value;
use tower::ServiceExt;

const TOKEN: &str = "test-token-of-the-admin-page";

struct Demo {
    app: axum::Router,
    _dir: Dir,
}

async fn demo(admin: AdminConfig) -> Result<Demo, idempotency_demo::admin::AdminTokenError> {
    let dir = Dir::new();
    let mut config = DemoConfig::default();
    config.idempotency.persistence.schema.mode = SchemaMode::Create;
    config.outbox.schema.mode = SchemaMode::Create;
    config.outbox.notify_channel = None;
    config.outbox.relay.enabled = false;
    config.idempotency.distributed_cache.enabled = false;
    config.admin = admin;
    let pool = Sqlite::open(&dir.0.join("data/demo.db")).await.unwrap();
    let (db, idempotency) = assemble_without_relay::<Sqlite>(pool, &config)
        .await
        .unwrap();
    let app = App::new(db, idempotency.service().clone(), config.demo.clone());
    let mut routes = router(app, config.server.max_body_bytes);
    if let Some(admin) = idempotency_demo::admin::router(&idempotency, &config.admin)? {
        routes = routes.nest("/admin", admin);
    }
    Ok(Demo {
        app: routes,
        _dir: dir,
    })
}

async fn request(app: &axum::Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn get(uri: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::get(uri);
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    builder.body(Body::empty()).unwrap()
}

fn with_token(allow_mutations: bool) -> AdminConfig {
    AdminConfig {
        token: Some(TOKEN.to_owned()),
        allow_mutations,
    }
}

#[tokio::test]
async fn admin_is_behind_the_bearer_token() {
    let demo = demo(with_token(false)).await.unwrap();
    let (status, _) = request(&demo.app, get("/admin/api/outbox/status", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = request(
        &demo.app,
        get(
            "/admin/api/outbox/status",
            Some("test-token-of-the-admin-pagf"),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = request(&demo.app, get("/admin", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the page too");

    let (status, body) = request(&demo.app, get("/admin/api/outbox/status", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let status_body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status_body["pending"], 0, "{body}");
    let (status, html) = request(&demo.app, get("/admin", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Idempotency admin"), "{html}");
    assert!(
        html.contains("ADMIN__ALLOW_MUTATIONS"),
        "read only, says how: {html}"
    );

    // Reads only: a change is 403 naming the demo's setting.
    let (status, body) = request(
        &demo.app,
        Request::post("/admin/api/cleanup")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("admin.allow-mutations"), "{body}");
}

#[tokio::test]
async fn changes_when_allowed() {
    let demo = demo(with_token(true)).await.unwrap();
    let (status, body) = request(
        &demo.app,
        Request::post("/admin/api/cleanup")
            .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn not_mounted_without_a_token_and_a_short_token_is_refused() {
    let unmounted = demo(AdminConfig::default()).await.unwrap();
    let (status, _) = request(&unmounted.app, get("/admin/api/outbox/status", Some(TOKEN))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let short = AdminConfig {
        token: Some("short".to_owned()),
        ..AdminConfig::default()
    };
    let error = demo(short).await.err().unwrap();
    assert!(error.to_string().contains("admin.token"), "{error}");
}

#[test]
fn the_admin_keys_load_from_the_environment() {
    let file = std::env::temp_dir().join(format!(
        "{}.yaml",
        idempotency_testing::unique_name("demo-admin")
    ));
    std::fs::write(&file, "admin:\n  allow-mutations: true\n").unwrap();
    let config: DemoConfig = idempotency::Loader::new()
        .file(&file)
        .section("server")
        .section("database")
        .section("demo")
        .section("admin")
        .environment([("ADMIN__TOKEN".to_owned(), TOKEN.to_owned())])
        .load()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(config.admin.token.as_deref(), Some(TOKEN));
    assert!(config.admin.allow_mutations);
    assert!(
        !format!("{:?}", config.admin).contains(TOKEN),
        "the token is not logged"
    );
}

struct Dir(std::path::PathBuf);

impl Dir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(idempotency_testing::unique_name("demo-admin"));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
