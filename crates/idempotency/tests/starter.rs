//! Issue 48, "the starter, complete": the publisher from configuration, the app's own section
//! next to the settings, an outbox event in the idempotent transaction in one call, the
//! properties that cannot take effect refused naming themselves. Through the public API, on
//! SQLite files, the local Redis and NATS (`NATS_URL`, default `nats://127.0.0.1:4222`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures_util::StreamExt;
use idempotency::outbox::NewEvent;
use idempotency::{
    Call, EnqueueInTx, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings,
};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// `yaml` written to a file of its own, loaded with no environment.
fn from_file<T>(yaml: &str, load: impl FnOnce(Loader) -> T) -> T {
    let file = std::env::temp_dir().join(format!("idempotency-starter-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = load(
        Loader::new()
            .file(&file)
            .environment(Vec::<(String, String)>::new()),
    );
    std::fs::remove_file(&file).unwrap();
    loaded
}

fn settings(yaml: &str) -> Settings {
    from_file(yaml, |loader| loader.load())
        .unwrap_or_else(|e: idempotency::LoadError| panic!("{yaml}: {e}"))
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-starter-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

const BASE: &str = "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    enabled: false\n";

/// An outbox on SQLite that can start: created, polled, no notifications.
fn outbox_yaml(relay: &str, publisher: &str) -> String {
    format!(
        "{BASE}outbox:\n  schema:\n    mode: create\n  notify-channel: null\n  relay:\n    wake-up: poll\n    poll-interval: 50ms\n{relay}{publisher}"
    )
}

async fn refusal(yaml: &str) -> String {
    match Idempotency::from_config(&settings(yaml), sqlite().await).await {
        Ok(_) => panic!("{yaml}: accepted"),
        Err(error) => error.to_string(),
    }
}

// ---- item 2: the app's own section and the settings from one file ----

#[derive(Debug, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct App {
    listen: String,
    #[serde(default)]
    max_connections: u32,
}

#[test]
fn the_apps_section_and_the_settings_load_from_one_file_each_refusing_its_unknown_keys() {
    let yaml = format!("app:\n  listen: 127.0.0.1:3000\n{BASE}");
    let (app, settings): (App, Settings) =
        from_file(&yaml, |loader| loader.load_with("app")).unwrap();
    assert_eq!(app.listen, "127.0.0.1:3000");
    assert!(
        settings.idempotency.persistence.schema.mode
            == idempotency::core::config::SchemaMode::Create
    );

    // The environment reaches the app's section too.
    let (app, _): (App, Settings) = from_file(&yaml, |loader| {
        loader
            .environment([("APP__MAX_CONNECTIONS", "7")])
            .load_with("app")
    })
    .unwrap();
    assert_eq!(app.max_connections, 7);

    // The app refuses its unknown keys, naming the section and the key.
    let typo = format!("app:\n  listen: x\n  max-conections: 3\n{BASE}");
    let error = from_file(&typo, |loader| loader.load_with::<App>("app"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("app") && error.contains("max-conections"),
        "{error}"
    );

    // The settings refuse theirs, and any other top-level section.
    let typo = format!("app:\n  listen: x\n{BASE}  persistance: {{}}\n");
    let error = from_file(&typo, |loader| loader.load_with::<App>("app"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("persistance"), "{error}");
    let stray = format!("app:\n  listen: x\nserver:\n  port: 1\n{BASE}");
    let error = from_file(&stray, |loader| loader.load_with::<App>("app"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("server"), "{error}");

    // The library's own sections cannot be taken for the app's.
    assert!(
        Loader::new()
            .environment(Vec::<(String, String)>::new())
            .load_with::<App>("outbox")
            .is_err()
    );
}

#[test]
fn the_production_example_configuration_loads_with_its_app_section() {
    let (app, settings): (serde::de::IgnoredAny, Settings) = Loader::new()
        .file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders.yaml"))
        .environment(Vec::<(String, String)>::new())
        .load_with("app")
        .unwrap();
    let _ = app;
    let outbox = settings.outbox.expect("the example relays an outbox");
    assert!(
        outbox.publisher.is_some(),
        "the example configures its publisher"
    );
    assert!(settings.idempotency.distributed_cache.enabled);
    assert!(settings.idempotency.local_cache.enabled);
}

// ---- item 4: inbox keys and the wake-up settings that cannot take effect ----

#[test]
fn an_inbox_section_is_refused_naming_it() {
    let error = from_file(&format!("{BASE}inbox:\n  batch-size: 10\n"), |loader| {
        loader.load::<Settings>()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("inbox"), "{error}");
}

#[tokio::test]
async fn wake_up_settings_that_cannot_work_are_refused_naming_themselves() {
    // SQLite has no notifications: listening (the default) cannot take effect.
    let listen = format!(
        "{BASE}outbox:\n  schema:\n    mode: create\n  notify-channel: null\n  publisher: logging\n"
    );
    let error = refusal(&listen).await;
    assert!(
        error.contains("outbox.relay.wake-up") && error.contains("poll"),
        "{error}"
    );
    // A debounce of notifications nobody listens to.
    let debounce = outbox_yaml("    notify-debounce: 50ms\n", "  publisher: logging\n");
    let error = refusal(&debounce).await;
    assert!(error.contains("outbox.relay.notify-debounce"), "{error}");
    // A notification interval with no notification channel.
    let interval = outbox_yaml("", "  publisher: logging\n  notify-interval: 1s\n");
    let error = refusal(&interval).await;
    assert!(error.contains("outbox.notify-interval"), "{error}");
    // Polling with the defaults starts.
    Idempotency::from_config(
        &settings(&outbox_yaml("", "  publisher: logging\n")),
        sqlite().await,
    )
    .await
    .unwrap()
    .shutdown()
    .await;
}

// ---- item 5: every refusal names its property in its Display ----

#[tokio::test]
async fn an_empty_redis_url_is_refused_naming_the_property() {
    for url in ["\"\"", "\"  \""] {
        let yaml = format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    url: {url}\n    secret: 0123456789abcdef0123456789abcdef\n"
        );
        let error = refusal(&yaml).await;
        assert!(
            error.starts_with("idempotency.distributed-cache.url:"),
            "{error}"
        );
    }
    // The same through the environment, as the issue met it.
    let settings: Settings = Loader::new()
        .environment([
            ("IDEMPOTENCY__DISTRIBUTED_CACHE__URL", ""),
            ("IDEMPOTENCY__PERSISTENCE__SCHEMA__MODE", "create"),
        ])
        .load()
        .unwrap();
    let error = Idempotency::from_config(&settings, sqlite().await)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("idempotency.distributed-cache.url:"),
        "{error}"
    );
    // `main` returning a Report prints that message, not a Debug dump.
    let report = idempotency::Report::from(error);
    assert!(format!("{report:?}").starts_with("idempotency.distributed-cache.url:"));
}

// ---- items 1 and 3: the publisher from configuration; an event in the transaction ----

#[tokio::test]
async fn a_configured_publisher_and_a_given_one_are_refused_together() {
    let yaml = outbox_yaml("", "  publisher: logging\n");
    let error = match idempotency::Builder::new(&settings(&yaml))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(sqlite().await)
        .await
    {
        Ok(_) => panic!("accepted"),
        Err(error) => error.to_string(),
    };
    assert!(error.starts_with("outbox.publisher:"), "{error}");
}

#[tokio::test]
async fn the_outbox_accessor_errs_naming_the_section_when_there_is_none() {
    let idempotency = Idempotency::from_config(&settings(BASE), sqlite().await)
        .await
        .unwrap();
    let error = idempotency.outbox().unwrap_err().to_string();
    assert!(error.starts_with("outbox:"), "{error}");
    idempotency.shutdown().await;
}

#[tokio::test]
async fn nats_publisher_settings_that_cannot_work_stop_start_up_naming_themselves() {
    let nats = |body: &str| outbox_yaml("", &format!("  publisher:\n    nats:\n{body}"));
    let stream = format!("S{}", unique());
    for (body, property) in [
        (
            format!("      stream:\n        name: {stream}\n"),
            "outbox.publisher.nats.url",
        ),
        (
            format!("      url: {}\n", nats_url()),
            "outbox.publisher.nats.stream.name",
        ),
        (
            format!("      url: nats://127.0.0.1:1\n      stream:\n        name: {stream}\n"),
            "outbox.publisher.nats.url",
        ),
        (
            // The stream does not exist and is not to be created.
            format!(
                "      url: {}\n      stream:\n        name: {stream}\n",
                nats_url()
            ),
            "outbox.publisher.nats.stream.name",
        ),
        (
            format!(
                "      url: {}\n      stream:\n        name: {stream}\n        duplicate-window: 1h\n",
                nats_url()
            ),
            "outbox.publisher.nats.stream.duplicate-window",
        ),
    ] {
        let error = refusal(&nats(&body)).await;
        assert!(error.starts_with(property), "{body}: {error}");
    }
}

#[tokio::test]
async fn a_stream_whose_duplicate_window_is_shorter_than_the_republish_window_stops_start_up() {
    let stream = format!("S{}", unique());
    let yaml = outbox_yaml(
        "",
        &format!(
            "  publisher:\n    nats:\n      url: {}\n      subject: \"t{stream}.{{aggregate_type}}.{{event_type}}\"\n      stream:\n        name: {stream}\n        create: true\n        duplicate-window: 1m\n",
            nats_url()
        ),
    );
    let error = refusal(&yaml).await;
    assert!(
        error.starts_with("outbox.publisher.nats.stream.name")
            && error.contains("relay.backoff.max"),
        "{error}"
    );
    let client = async_nats::connect(nats_url()).await.unwrap();
    let _ = async_nats::jetstream::new(client)
        .delete_stream(&stream)
        .await;
}

#[tokio::test]
async fn an_event_enqueued_in_the_transaction_reaches_nats_through_the_configured_publisher() {
    let stream = format!("S{}", unique());
    let prefix = format!("t{stream}");
    let yaml = outbox_yaml(
        "",
        &format!(
            "  publisher:\n    nats:\n      url: {}\n      subject: \"{prefix}.{{aggregate_type}}.{{event_type}}\"\n      stream:\n        name: {stream}\n        create: true\n",
            nats_url()
        ),
    );
    let client = async_nats::connect(nats_url()).await.unwrap();
    let mut arrived = client.subscribe(format!("{prefix}.>")).await.unwrap();
    let idempotency = Idempotency::from_config(&settings(&yaml), sqlite().await)
        .await
        .unwrap();
    let outbox = idempotency.outbox().unwrap().clone();
    let service = idempotency.service();

    // One committed with its idempotency record, one rolled back with its failed action.
    for (key, fail) in [("k-commit", false), ("k-rollback", true)] {
        let mut tx = service.begin().await.unwrap();
        let call = Call::new("ORDER", IdempotencyKey::new(key).unwrap(), &key);
        let outcome = service
            .execute_in(&mut tx, call, async |_conn| {
                Ok::<_, idempotency::core::Error>(ExecutionResult::success(()))
            })
            .await;
        outcome.unwrap();
        let event = NewEvent::new(
            "order",
            key,
            "OrderCreated",
            &serde_json::json!({ "key": key }),
        )
        .unwrap();
        tx.enqueue(&outbox, event).await.unwrap();
        if fail {
            tx.rollback().await.unwrap();
        } else {
            tx.commit().await.unwrap();
        }
    }

    let message = tokio::time::timeout(Duration::from_secs(10), arrived.next())
        .await
        .expect("the event reached NATS")
        .unwrap();
    assert_eq!(
        message.subject.as_str(),
        format!("{prefix}.order.OrderCreated")
    );
    let body: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(body["key"], "k-commit");
    // The rolled-back event never comes.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), arrived.next())
            .await
            .is_err()
    );
    let report = idempotency.shutdown().await;
    assert_eq!(report.relay.unwrap().totals.published, 1);
    let _ = async_nats::jetstream::new(client)
        .delete_stream(&stream)
        .await;
}
