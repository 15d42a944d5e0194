//! Start-up refusals of issue 54 (items 7, 8, 10, 12): every property takes effect or stops
//! start-up naming itself, and two deployments sharing one Redis never see each other's
//! outcomes. Through the public API: `Loader`, `Settings`, `Idempotency::from_config`.
//! SQLite files (and, for the shared-Redis cases, PostgreSQL schemas and MySQL databases) give
//! each test its own database; Redis is the local server (`REDIS_URL`).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};

use idempotency::{Call, ExecutionResult, Idempotency, IdempotencyKey, Loader, Settings};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// Settings from YAML (through the loader, with no environment).
fn try_settings(yaml: &str) -> Result<Settings, idempotency::LoadError> {
    let file = std::env::temp_dir().join(format!("idempotency-start-up-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-start-up-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

/// `idempotency:` with the table created and no Redis, then `extra` (two-space indented keys
/// of `idempotency`).
fn idempotency_yaml(extra: &str) -> String {
    persistence_yaml("", extra)
}

/// As [`idempotency_yaml`], with `persistence` (four-space indented keys of `persistence`).
fn persistence_yaml(persistence: &str, extra: &str) -> String {
    format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n{persistence}  distributed-cache:\n    enabled: false\n{extra}"
    )
}

/// Builds on a fresh SQLite database and returns the refusal's message.
async fn refusal(yaml: &str) -> String {
    let settings = try_settings(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
    match Idempotency::from_config(&settings, sqlite().await).await {
        Ok(_) => panic!("{yaml}: accepted"),
        Err(error) => error.to_string(),
    }
}

// ---- item 7: a variable under the IDEMPOTENCY / OUTBOX prefixes names a key, or is refused ----

#[test]
fn a_variable_under_the_prefixes_that_names_no_key_is_refused_naming_it() {
    for variable in [
        "IDEMPOTENCY_PERSISTENCE_TTL",
        "IDEMPOTENCY_PERSISTENCE__TTL",
        "idempotency_persistence_ttl",
        "OUTBOX_RELAY_WORKERS",
        "OUTBOX_RELAY__WORKERS",
    ] {
        let error = match Loader::new()
            .environment([(variable, "1d")])
            .load::<Settings>()
        {
            Ok(_) => panic!("{variable}: accepted"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(variable), "{variable}: {error}");
    }
    // Variables of other prefixes are not the library's, and the documented spelling works.
    let settings: Settings = Loader::new()
        .environment([
            ("IDEMPOTENCYX_TTL", "1d"),
            ("DATABASE_URL", "postgres://ignored"),
            ("IDEMPOTENCY__PERSISTENCE__TTL", "1d"),
        ])
        .load()
        .unwrap();
    assert_eq!(
        settings.idempotency.persistence.ttl,
        Some(std::time::Duration::from_secs(86_400))
    );
}

// ---- item 10: degenerate values are refused naming their key ----

#[test]
fn an_integer_key_takes_only_a_whole_number() {
    for (yaml, named) in [
        (
            "idempotency:\n  acquire:\n    max-attempts: yes\n",
            "idempotency.acquire.max-attempts",
        ),
        (
            "idempotency:\n  acquire:\n    max-attempts: on\n",
            "idempotency.acquire.max-attempts",
        ),
        (
            "idempotency:\n  acquire:\n    max-attempts: 2.6\n",
            "idempotency.acquire.max-attempts",
        ),
        (
            "idempotency:\n  acquire:\n    max-attempts: true\n",
            "idempotency.acquire.max-attempts",
        ),
        (
            "idempotency:\n  local-cache:\n    max-size: 10.5\n",
            "idempotency.local-cache.max-size",
        ),
        (
            "outbox:\n  relay:\n    max-attempts: 2.6\n",
            "outbox.relay.max-attempts",
        ),
    ] {
        let error = match try_settings(yaml) {
            Ok(settings) => panic!("{yaml}: accepted as {settings:?}"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(named), "{yaml}: {error}");
    }
    for (variable, value) in [
        ("IDEMPOTENCY__ACQUIRE__MAX_ATTEMPTS", "yes"),
        ("IDEMPOTENCY__ACQUIRE__MAX_ATTEMPTS", "on"),
        ("IDEMPOTENCY__ACQUIRE__MAX_ATTEMPTS", "2.6"),
        ("OUTBOX__RELAY__WORKERS", "true"),
    ] {
        let error = match Loader::new()
            .environment([(variable, value)])
            .load::<Settings>()
        {
            Ok(_) => panic!("{variable}={value}: accepted"),
            Err(error) => error.to_string(),
        };
        let key = if variable.starts_with("OUTBOX") {
            "outbox.relay.workers"
        } else {
            "idempotency.acquire.max-attempts"
        };
        assert!(error.contains(key), "{variable}={value}: {error}");
    }
    // Whole numbers stay accepted, from the file and from the environment.
    let settings = try_settings("idempotency:\n  acquire:\n    max-attempts: 4\n").unwrap();
    assert_eq!(settings.idempotency.acquire.max_attempts, 4);
    let settings: Settings = Loader::new()
        .environment([("IDEMPOTENCY__ACQUIRE__MAX_ATTEMPTS", "5")])
        .load()
        .unwrap();
    assert_eq!(settings.idempotency.acquire.max_attempts, 5);
}

#[tokio::test]
async fn degenerate_values_are_refused_naming_their_key() {
    for ttl in ["0s", "0"] {
        let message = refusal(&persistence_yaml(&format!("    ttl: {ttl}\n"), "")).await;
        assert!(
            message.contains("idempotency.persistence.ttl"),
            "{ttl}: {message}"
        );
    }
    for (extra, named) in [
        (
            "  operations:\n    CREATE_PAYMENT:\n      ttl: 0s\n",
            "idempotency.operations.<NAME>.ttl",
        ),
        (
            "  local-cache:\n    ttl: 0s\n",
            "idempotency.local-cache.ttl",
        ),
        (
            "  in-flight:\n    policy: reject\n    timeout: 200ms\n",
            "idempotency.in-flight.timeout",
        ),
        (
            "  in-flight:\n    policy: reject\n    timeout: null\n",
            "idempotency.in-flight.timeout",
        ),
        (
            "  operations:\n    \"CREATE PAYMENT\":\n      ttl: 7d\n",
            "idempotency.operations.<NAME>",
        ),
        (
            "  operations:\n    \"\": {}\n",
            "idempotency.operations.<NAME>",
        ),
    ] {
        let message = refusal(&idempotency_yaml(extra)).await;
        assert!(message.contains(named), "{extra}: {message}");
    }
    // The operation's name is in the message too.
    let message = refusal(&idempotency_yaml(
        "  operations:\n    \"CREATE PAYMENT\": {}\n",
    ))
    .await;
    assert!(message.contains("CREATE PAYMENT"), "{message}");
    // The distributed cache's keys, with the cache enabled (checked before any connection).
    for (extra, named) in [
        ("    ttl: 0s\n", "idempotency.distributed-cache.ttl"),
        ("    timeout: 0s\n", "idempotency.distributed-cache.timeout"),
        (
            "    circuit-breaker:\n      failure-threshold: 0\n",
            "idempotency.distributed-cache.circuit-breaker.failure-threshold",
        ),
        // "Unbounded": before, accepted, and every put after a commit panicked in tokio's
        // channel; a batch of a billion was allocated up front.
        (
            "    write-behind:\n      enabled: true\n      capacity: 18446744073709551615\n",
            "idempotency.distributed-cache.write-behind.capacity",
        ),
        (
            "    write-behind:\n      enabled: true\n      max-batch: 1000000000\n",
            "idempotency.distributed-cache.write-behind.max-batch",
        ),
    ] {
        let yaml = format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    url: redis://127.0.0.1:1\n{extra}"
        );
        let message = refusal(&yaml).await;
        assert!(message.contains(named), "{extra}: {message}");
    }
    // An L1 that keeps nothing (before: accepted, a cache enabled in name only).
    for (extra, named) in [
        ("    max-size: 0\n", "idempotency.local-cache.max-size"),
        ("    max-bytes: 0\n", "idempotency.local-cache.max-bytes"),
    ] {
        let yaml = format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    enabled: false\n  local-cache:\n{extra}"
        );
        let message = refusal(&yaml).await;
        assert!(message.contains(named), "{extra}: {message}");
    }
}

/// A Redis URL the client cannot use is refused naming it without its password or token, in
/// every form (before: `redis-cluster://hunter2@…`, a user name alone, was shown as written,
/// beside the cache crate's redacted copy), and the settings' `Debug` hides it too.
#[tokio::test]
async fn a_redis_url_that_cannot_work_is_refused_without_its_secret() {
    for url in [
        "redis-cluster://hunter2@127.0.0.1:notaport",
        "redis://:hunter2@127.0.0.1:notaport",
    ] {
        let yaml = format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    url: {url}\n    secret: tests-only-secret-0123456789abcdef\n"
        );
        let message = refusal(&yaml).await;
        assert!(!message.contains("hunter2"), "{url}: {message}");
        assert!(message.contains("***@127.0.0.1"), "{url}: {message}");
        let settings = try_settings(&yaml).unwrap();
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("tests-only-secret"), "{shown}");
    }
}

// ---- item 8: SQLite has no per-key in-flight wait ----

#[tokio::test]
async fn in_flight_policy_and_timeout_are_refused_on_sqlite() {
    for (extra, named) in [
        (
            "  in-flight:\n    policy: reject\n",
            "idempotency.in-flight.policy",
        ),
        (
            "  in-flight:\n    timeout: 200ms\n",
            "idempotency.in-flight.timeout",
        ),
        (
            "  in-flight:\n    timeout: null\n",
            "idempotency.in-flight.timeout",
        ),
    ] {
        let message = refusal(&idempotency_yaml(extra)).await;
        assert!(message.contains(named), "{extra}: {message}");
    }
    // The defaults stay accepted.
    let settings = try_settings(&idempotency_yaml("")).unwrap();
    Idempotency::from_config(&settings, sqlite().await)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_minimal_orders_examples_configuration_starts_on_sqlite() {
    let settings = Settings::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/orders_minimal.yaml"
    ))
    .unwrap();
    let settings = Settings {
        idempotency: idempotency::IdempotencyConfig {
            distributed_cache: idempotency::redis::DistributedCacheConfig {
                enabled: false,
                ..Default::default()
            },
            ..settings.idempotency
        },
        ..settings
    };
    Idempotency::from_config(&settings, sqlite().await)
        .await
        .unwrap()
        .shutdown()
        .await;
}

// ---- item 12: the L2 key prefix depends on the deployment ----

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Runs `operation`/`key` with request `{"n": 1}` and the action answering `answer`.
async fn run<D: idempotency::Database>(
    idempotency: &Idempotency<D>,
    operation: &str,
    key: &str,
    answer: u32,
    runs: &AtomicUsize,
) -> u32 {
    let request = serde_json::json!({ "n": 1 });
    let outcome = idempotency
        .service()
        .execute(
            Call::new(operation, IdempotencyKey::new(key).unwrap(), &request),
            async |_conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, idempotency::core::Error>(ExecutionResult::success(answer))
            },
        )
        .await
        .unwrap();
    match outcome.into_result() {
        ExecutionResult::Success(n) => n,
        ExecutionResult::Rejected(_) => unreachable!(),
    }
}

/// Settings with one Redis, the default key prefix and no L1 (so that every replay of another
/// process's outcome comes from Redis), the default table created.
fn shared_redis_settings() -> Settings {
    try_settings(&format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n  local-cache:\n    enabled: false\n  distributed-cache:\n    url: {}\n    secret: tests-only-secret-0123456789abcdef\n",
        redis_url()
    ))
    .unwrap()
}

/// Two deployments, `billing` and `shipping`, on their own pools and one Redis with the
/// default key prefix: the same operation and key in `shipping` runs there instead of
/// replaying `billing`'s outcome, their Redis keys differ, and a restart of `billing` on the
/// same pool keeps its keys.
async fn deployments_keep_their_own_outcomes<D: idempotency::Database>(
    settings: &Settings,
    billing_pool: D,
    shipping_pool: D,
) {
    use idempotency::core::{Operation, RecordId, Scope};
    let billing = Idempotency::from_config(settings, billing_pool.clone())
        .await
        .unwrap();
    let shipping = Idempotency::from_config(settings, shipping_pool)
        .await
        .unwrap();
    let operation = format!("OP_{}", unique());
    let id = RecordId::new(
        Operation::new(operation.as_str()).unwrap(),
        Scope::default(),
        IdempotencyKey::new("k").unwrap(),
    );
    let (billing_runs, shipping_runs) = (AtomicUsize::new(0), AtomicUsize::new(0));
    assert_eq!(run(&billing, &operation, "k", 1, &billing_runs).await, 1);
    // The cache write follows the commit off the answer's path: wait until it is in Redis.
    use idempotency::core::DistributedCache;
    let redis = billing.service().distributed_cache().as_ref().unwrap();
    for _ in 0..100 {
        if redis.get(&id).await.unwrap().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        redis.get(&id).await.unwrap().is_some(),
        "billing's outcome is in Redis"
    );
    // The same operation and key in the other deployment is a new request there.
    assert_eq!(
        run(&shipping, &operation, "k", 2, &shipping_runs).await,
        2,
        "shipping replayed billing's outcome"
    );
    assert_eq!(shipping_runs.load(Ordering::SeqCst), 1);
    let shipping_redis = shipping.service().distributed_cache().as_ref().unwrap();
    assert_ne!(
        redis.key_for(&id),
        shipping_redis.key_for(&id),
        "the deployments share Redis keys"
    );
    // Restarting a deployment keeps its own keys: the prefix is stable.
    let billing_again = Idempotency::from_config(settings, billing_pool)
        .await
        .unwrap();
    assert_eq!(
        billing_again
            .service()
            .distributed_cache()
            .as_ref()
            .unwrap()
            .key_for(&id),
        redis.key_for(&id)
    );
    billing.shutdown().await;
    shipping.shutdown().await;
    billing_again.shutdown().await;
}

#[tokio::test]
async fn two_deployments_sharing_redis_with_the_default_prefix_do_not_replay_each_other() {
    // Each its own SQLite database with the default table.
    deployments_keep_their_own_outcomes(&shared_redis_settings(), sqlite().await, sqlite().await)
        .await;
}

#[tokio::test]
async fn two_deployments_in_two_schemas_of_one_postgres_database_do_not_replay_each_other() {
    // Schema per deployment: one PostgreSQL server and database, the same connection URL, each
    // deployment's connections with a `search_path` of their own, the default (unqualified)
    // table name. The connect options alone cannot tell them apart.
    let billing = idempotency_testing::pg_pool().await;
    let shipping = idempotency_testing::pg_pool().await;
    assert_eq!(
        billing.connect_options().get_database(),
        shipping.connect_options().get_database()
    );
    deployments_keep_their_own_outcomes(&shared_redis_settings(), billing, shipping).await;
}

#[tokio::test]
async fn two_deployments_in_two_databases_of_one_mysql_server_do_not_replay_each_other() {
    // The database an unqualified table is in comes from the server (`DATABASE()`).
    deployments_keep_their_own_outcomes(
        &shared_redis_settings(),
        idempotency_testing::mysql_pool().await,
        idempotency_testing::mysql_pool().await,
    )
    .await;
}

#[tokio::test]
async fn one_sqlite_file_spelled_two_ways_is_one_deployment() {
    use idempotency::core::{Operation, RecordId, Scope};
    // Instances of one deployment started with two spellings of the same file (here a path
    // through `..`; a relative path from another working directory, a symbolic link) share
    // their Redis keys: the prefix names the file, not the spelling.
    let dir = std::env::temp_dir().join(format!("idempotency-start-up-{}", unique()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let plain = dir.join("records.db");
    let roundabout = dir.join("sub").join("..").join("records.db");
    let settings = shared_redis_settings();
    let open = |path: std::path::PathBuf| async move {
        sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap()
    };
    let first = Idempotency::from_config(&settings, open(plain).await)
        .await
        .unwrap();
    let second = Idempotency::from_config(&settings, open(roundabout).await)
        .await
        .unwrap();
    let id = RecordId::new(
        Operation::new("OP").unwrap(),
        Scope::default(),
        IdempotencyKey::new("k").unwrap(),
    );
    let key = |idempotency: &Idempotency<sqlx::SqlitePool>| {
        idempotency
            .service()
            .distributed_cache()
            .as_ref()
            .unwrap()
            .key_for(&id)
    };
    assert_eq!(key(&first), key(&second));
    first.shutdown().await;
    second.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}
