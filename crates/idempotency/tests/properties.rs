//! Every property of the assembled service, through `Idempotency::from_config` / `Builder`:
//! each test sets one property and observes its effect (or the start-up error naming it).
//! SQLite files give each test its own database; PostgreSQL, Redis and NATS are the local
//! servers (`DATABASE_URL`, `REDIS_URL`, `NATS_URL`).

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use idempotency::core::{IdempotencyStore, LocalCache, Operation, RecordId};
use idempotency::outbox::{Housekeeping, NewEvent};
use idempotency::{
    Builder, Call, Error, ExecutionResult, Idempotency, IdempotencyKey, Loader, Scope, Settings,
};

fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// Settings from YAML (through the loader, with no environment).
fn settings(yaml: &str) -> Settings {
    try_settings(yaml).unwrap()
}

fn try_settings(yaml: &str) -> Result<Settings, idempotency::LoadError> {
    let file = std::env::temp_dir().join(format!("idempotency-properties-{}.yaml", unique()));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded
}

/// The common base: SQLite creates its table, no Redis unless a test asks.
const BASE: &str = "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    enabled: false\n";

fn with(extra: &str) -> String {
    // `extra` holds more keys of `idempotency` (two-space indented) and other sections.
    format!("{BASE}{extra}")
}

async fn sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!("idempotency-properties-{}.db", unique()));
    sqlx::SqlitePool::connect(&format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap()
}

async fn postgres() -> sqlx::PgPool {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("props_{}", unique());
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
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
        .unwrap()
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).unwrap()
}

fn id(operation: &str, key_text: &str) -> RecordId {
    RecordId::new(
        Operation::new(operation).unwrap(),
        Scope::default(),
        key(key_text),
    )
}

/// Runs `operation` with `key_text` and request `{"n": n}`; counts runs of the action.
async fn run<D: idempotency::Database>(
    idempotency: &Idempotency<D>,
    operation: &str,
    key_text: &str,
    n: u32,
    runs: &AtomicUsize,
) -> Result<u32, idempotency::core::Error> {
    let request = serde_json::json!({ "n": n });
    idempotency
        .service()
        .execute(
            Call::new(operation, key(key_text), &request),
            async |_conn| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, idempotency::core::Error>(ExecutionResult::success(n))
            },
        )
        .await
        .map(|outcome| match outcome.into_result() {
            ExecutionResult::Success(n) => n,
            ExecutionResult::Rejected(_) => unreachable!(),
        })
}

fn expires_in(record: &idempotency::core::IdempotencyRecord) -> Option<Duration> {
    record
        .expires_at
        .map(|at| at.duration_since(SystemTime::now()).unwrap_or_default())
}

fn property_of(error: Error) -> &'static str {
    match error {
        Error::Property { property, .. } => property,
        other => panic!("expected a refused property, got {other:?}"),
    }
}

// ---- idempotency.enabled, fingerprint.* ----

#[tokio::test]
async fn enabled_false_runs_every_call_and_stores_nothing() {
    let idempotency =
        Idempotency::from_config(&settings(&with("  enabled: false\n")), sqlite().await)
            .await
            .unwrap();
    let runs = AtomicUsize::new(0);
    run(&idempotency, "OP", "k", 1, &runs).await.unwrap();
    run(&idempotency, "OP", "k", 1, &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(
        idempotency
            .store()
            .lookup(&id("OP", "k"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn fingerprint_algorithm_is_the_stored_digest() {
    let idempotency = Idempotency::from_config(
        &settings(&with("  fingerprint:\n    algorithm: SHA-512\n")),
        sqlite().await,
    )
    .await
    .unwrap();
    run(&idempotency, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap();
    let record = idempotency
        .store()
        .lookup(&id("OP", "k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.fingerprint.as_str().len(), 128, "SHA-512 in hex");
}

#[tokio::test]
async fn previous_algorithm_keeps_retries_of_existing_keys_replaying() {
    let pool = sqlite().await;
    let local_off = "  local-cache:\n    enabled: false\n";
    let before = Idempotency::from_config(&settings(&with(local_off)), pool.clone())
        .await
        .unwrap();
    let runs = AtomicUsize::new(0);
    run(&before, "OP", "k", 7, &runs).await.unwrap();

    let switched = Idempotency::from_config(
        &settings(&with(&format!(
            "{local_off}  fingerprint:\n    algorithm: SHA-512\n"
        ))),
        pool.clone(),
    )
    .await
    .unwrap();
    let error = run(&switched, "OP", "k", 7, &runs).await.unwrap_err();
    assert!(
        matches!(error, idempotency::core::Error::PayloadConflict),
        "{error:?}"
    );

    let transition = Idempotency::from_config(
        &settings(&with(&format!(
            "{local_off}  fingerprint:\n    algorithm: SHA-512\n    previous-algorithm: SHA-256\n"
        ))),
        pool,
    )
    .await
    .unwrap();
    assert_eq!(run(&transition, "OP", "k", 7, &runs).await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "replayed, not run again");
    // A new key gets the new algorithm; another payload under the old key is still a conflict.
    run(&transition, "OP", "k2", 1, &runs).await.unwrap();
    let record = transition
        .store()
        .lookup(&id("OP", "k2"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.fingerprint.as_str().len(), 128);
    assert!(matches!(
        run(&transition, "OP", "k", 8, &runs).await.unwrap_err(),
        idempotency::core::Error::PayloadConflict
    ));
}

// ---- idempotency.local-cache.* ----

#[tokio::test]
async fn local_cache_enabled_decides_whether_there_is_an_l1() {
    let on = Idempotency::from_config(&settings(BASE), sqlite().await)
        .await
        .unwrap();
    run(&on, "OP", "k", 1, &AtomicUsize::new(0)).await.unwrap();
    let cache = on.service().local_cache().as_ref().unwrap();
    assert!(
        cache.get(&id("OP", "k")).is_some(),
        "the committed outcome is in L1"
    );

    let off = Idempotency::from_config(
        &settings(&with("  local-cache:\n    enabled: false\n")),
        sqlite().await,
    )
    .await
    .unwrap();
    assert!(off.service().local_cache().is_none());
}

#[tokio::test]
async fn local_cache_ttl_expires_entries() {
    let idempotency = Idempotency::from_config(
        &settings(&with("  local-cache:\n    ttl: 200ms\n")),
        sqlite().await,
    )
    .await
    .unwrap();
    run(&idempotency, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap();
    let cache = idempotency.service().local_cache().as_ref().unwrap();
    assert!(cache.get(&id("OP", "k")).is_some());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        cache.get(&id("OP", "k")).is_none(),
        "expired after local-cache.ttl"
    );
}

#[tokio::test]
async fn local_cache_max_size_bounds_the_entries() {
    let idempotency = Idempotency::from_config(
        &settings(&with(
            "  local-cache:\n    max-size: 2\n    statistics: true\n",
        )),
        sqlite().await,
    )
    .await
    .unwrap();
    for n in 0..20 {
        run(
            &idempotency,
            "OP",
            &format!("k{n}"),
            n,
            &AtomicUsize::new(0),
        )
        .await
        .unwrap();
    }
    let cache = idempotency.service().local_cache().as_ref().unwrap();
    cache.sync();
    assert!(cache.entry_count() <= 2, "{} entries", cache.entry_count());
    assert!(cache.stats().unwrap().evictions >= 18 - 2);
}

#[tokio::test]
async fn local_cache_statistics_count_hits_and_misses_only_when_on() {
    let on = Idempotency::from_config(
        &settings(&with("  local-cache:\n    statistics: true\n")),
        sqlite().await,
    )
    .await
    .unwrap();
    let runs = AtomicUsize::new(0);
    run(&on, "OP", "k", 1, &runs).await.unwrap(); // a miss
    run(&on, "OP", "k", 1, &runs).await.unwrap(); // a hit
    let stats = on
        .service()
        .local_cache()
        .as_ref()
        .unwrap()
        .stats()
        .unwrap();
    assert_eq!((stats.hits, stats.misses), (1, 1));

    let off = Idempotency::from_config(&settings(BASE), sqlite().await)
        .await
        .unwrap();
    assert!(
        off.service()
            .local_cache()
            .as_ref()
            .unwrap()
            .stats()
            .is_none()
    );

    let error = Idempotency::from_config(
        &settings(&with(
            "  local-cache:\n    enabled: false\n    statistics: true\n",
        )),
        sqlite().await,
    )
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "idempotency.local-cache.statistics");
}

// ---- idempotency.distributed-cache.* (Redis) ----

fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn redis_section(extra: &str) -> String {
    format!(
        "idempotency:\n  persistence:\n    schema:\n      mode: create\n  local-cache:\n    enabled: false\n  distributed-cache:\n    url: {}\n    secret: tests-only-secret-0123456789abcdef\n{extra}",
        redis_url()
    )
}

#[tokio::test]
async fn distributed_cache_url_key_prefix_and_ttl_take_effect() {
    use idempotency::core::DistributedCache;
    let prefix = format!("props-{}:", unique());
    let idempotency = Idempotency::from_config(
        &settings(&redis_section(&format!(
            "    key-prefix: \"{prefix}\"\n    ttl: 90s\n"
        ))),
        sqlite().await,
    )
    .await
    .unwrap();
    run(&idempotency, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap();
    let redis = idempotency.service().distributed_cache().as_ref().unwrap();
    // The cache write happens after the commit, off the answer's path: wait for it.
    let mut found = None;
    for _ in 0..50 {
        found = redis.get(&id("OP", "k")).await.unwrap();
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(found.is_some(), "the outcome is in Redis");

    use idempotency::redis::fred::interfaces::KeysInterface;
    use idempotency::redis::fred::prelude::ClientLike;
    let client = idempotency::redis::fred::prelude::Client::new(
        idempotency::redis::fred::prelude::Config::from_url(&redis_url()).unwrap(),
        None,
        None,
        None,
    );
    client.init().await.unwrap();
    // Under the configured prefix, then the deployment's digest (16 hex digits and `:`).
    let stored = redis.key_for(&id("OP", "k"));
    let deployment = stored
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{stored}"));
    assert_eq!(
        deployment,
        idempotency::redis::redis_key(&deployment[..17], &id("OP", "k")),
        "{stored}"
    );
    assert!(
        deployment[..16].bytes().all(|b| b.is_ascii_hexdigit()),
        "{stored}"
    );
    let ttl: i64 = client.ttl(&stored).await.unwrap();
    assert!(
        (60..=90).contains(&ttl),
        "the key under distributed-cache.key-prefix lives distributed-cache.ttl: {ttl}"
    );
    let _: i64 = client.del(&stored).await.unwrap();
}

#[tokio::test]
async fn distributed_cache_needs_a_url_when_enabled_and_is_absent_when_disabled() {
    let error = Idempotency::from_config(
        &settings("idempotency:\n  persistence:\n    schema:\n      mode: create\n"),
        sqlite().await,
    )
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "idempotency.distributed-cache.url");
    let off = Idempotency::from_config(&settings(BASE), sqlite().await)
        .await
        .unwrap();
    assert!(off.service().distributed_cache().is_none());
}

/// Entries that are not authenticated could be forged by whoever can write to the Redis: an
/// enabled cache without `secret` is refused by name, and a short secret too.
#[tokio::test]
async fn distributed_cache_needs_a_secret_when_enabled() {
    let section = |secret: &str| {
        format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  distributed-cache:\n    url: {}\n{secret}",
            redis_url()
        )
    };
    let error = Idempotency::from_config(&settings(&section("")), sqlite().await)
        .await
        .unwrap_err();
    assert_eq!(property_of(error), "idempotency.distributed-cache.secret");
    let short = try_settings(&section("    secret: too-short\n"));
    assert!(short.is_err(), "a secret under 32 bytes is refused");
}

#[tokio::test]
async fn distributed_cache_failure_policy_decides_what_an_unreachable_redis_does() {
    let section = |policy: &str| {
        format!(
            "idempotency:\n  persistence:\n    schema:\n      mode: create\n  local-cache:\n    enabled: false\n  distributed-cache:\n    url: redis://127.0.0.1:1\n    secret: tests-only-secret-0123456789abcdef\n    timeout: 50ms\n    failure-policy: {policy}\n"
        )
    };
    let open = Idempotency::from_config(&settings(&section("fail-open")), sqlite().await)
        .await
        .unwrap();
    assert_eq!(
        run(&open, "OP", "k", 1, &AtomicUsize::new(0))
            .await
            .unwrap(),
        1
    );
    let fast = Idempotency::from_config(&settings(&section("fail-fast")), sqlite().await)
        .await
        .unwrap();
    let error = run(&fast, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap_err();
    assert!(
        matches!(error, idempotency::core::Error::Cache(_)),
        "{error:?}"
    );
}

// ---- idempotency.persistence.* ----

#[tokio::test]
async fn persistence_enabled_false_is_refused() {
    let error = Idempotency::from_config(
        &settings("idempotency:\n  persistence:\n    enabled: false\n  distributed-cache:\n    enabled: false\n"),
        sqlite().await,
    )
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "idempotency.persistence.enabled");
}

fn persistence(extra: &str) -> String {
    format!(
        "idempotency:\n  distributed-cache:\n    enabled: false\n  persistence:\n    schema:\n      mode: create\n{extra}"
    )
}

#[tokio::test]
async fn persistence_table_name_is_where_records_go() {
    let pool = sqlite().await;
    let idempotency = Idempotency::from_config(
        &settings(&persistence("    table-name: billing_keys\n")),
        pool.clone(),
    )
    .await
    .unwrap();
    run(&idempotency, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap();
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn persistence_ttl_and_operation_ttls_set_expiry_null_keeps_forever() {
    let idempotency = Idempotency::from_config(
        &settings(&format!(
            "{}  operations:\n    WEEKLY:\n      ttl: 7d\n    FOREVER:\n      ttl: null\n    DEFAULT: {{}}\n",
            persistence("    ttl: 2h\n")
        )),
        sqlite().await,
    )
    .await
    .unwrap();
    let runs = AtomicUsize::new(0);
    for op in ["WEEKLY", "FOREVER", "DEFAULT"] {
        run(&idempotency, op, "k", 1, &runs).await.unwrap();
    }
    let lookup = async |op: &str| {
        idempotency
            .store()
            .lookup(&id(op, "k"))
            .await
            .unwrap()
            .unwrap()
    };
    let weekly = expires_in(&lookup("WEEKLY").await).unwrap();
    assert!(weekly > Duration::from_secs(6 * 86_400) && weekly <= Duration::from_secs(7 * 86_400));
    assert_eq!(expires_in(&lookup("FOREVER").await), None);
    let default = expires_in(&lookup("DEFAULT").await).unwrap();
    assert!(default > Duration::from_secs(7_000) && default <= Duration::from_secs(7_200));

    let forever =
        Idempotency::from_config(&settings(&persistence("    ttl: null\n")), sqlite().await)
            .await
            .unwrap();
    run(&forever, "OP", "k", 1, &runs).await.unwrap();
    let record = forever
        .store()
        .lookup(&id("OP", "k"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.expires_at, None);
}

#[tokio::test]
async fn persistence_schema_mode_creates_validates_or_leaves_alone() {
    let pool = sqlite().await;
    let none = "idempotency:\n  distributed-cache:\n    enabled: false\n  persistence:\n    schema:\n      mode: none\n";
    Idempotency::from_config(&settings(none), pool.clone())
        .await
        .unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idempotency_records'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tables, 0, "mode none creates nothing");
    let validate = "idempotency:\n  distributed-cache:\n    enabled: false\n";
    let error = Idempotency::from_config(&settings(validate), pool.clone())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Store(_)), "{error:?}");
    Idempotency::from_config(&settings(BASE), pool.clone())
        .await
        .unwrap();
    Idempotency::from_config(&settings(validate), pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn persistence_cleanup_runs_on_its_schedule_only_when_enabled() {
    let pool = sqlite().await;
    let yaml = |enabled: bool| {
        persistence(&format!(
            "    ttl: 1s\n    cleanup:\n      enabled: {enabled}\n      cron: \"* * * * * *\"\n      zone: Europe/Berlin\n      batch-size: 1\n"
        ))
    };
    let idle = Idempotency::from_config(&settings(&yaml(false)), pool.clone())
        .await
        .unwrap();
    assert!(!idle.cleanup_running());
    for n in 0..3 {
        run(&idle, "OP", &format!("k{n}"), n, &AtomicUsize::new(0))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(count().await, 3, "no cleanup while disabled");
    assert!(!idle.shutdown().await.cleanup);

    let running = Idempotency::from_config(&settings(&yaml(true)), pool.clone())
        .await
        .unwrap();
    assert!(running.cleanup_running());
    let mut left = count().await;
    for _ in 0..40 {
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = count().await;
    }
    assert_eq!(left, 0, "expired records deleted, one per batch");
    assert!(running.shutdown().await.cleanup);
}

#[tokio::test]
async fn by_default_records_live_a_day_and_cleanup_runs() {
    // A table that only grows is a denial of service waiting for a client that makes keys:
    // the defaults bound it by the TTL times the rate of new keys.
    let idempotency = Idempotency::from_config(&settings(&persistence("")), sqlite().await)
        .await
        .unwrap();
    assert!(idempotency.cleanup_running(), "cleanup is on by default");
    run(&idempotency, "OP", "k", 1, &AtomicUsize::new(0))
        .await
        .unwrap();
    let record = idempotency
        .store()
        .lookup(&id("OP", "k"))
        .await
        .unwrap()
        .unwrap();
    let left = expires_in(&record).unwrap();
    assert!(
        left > Duration::from_secs(86_000) && left <= Duration::from_secs(86_400),
        "{left:?}"
    );
    assert!(idempotency.shutdown().await.cleanup);
}

#[tokio::test]
async fn persistence_cleanup_cron_and_zone_are_checked_at_start_up() {
    for (cleanup, named) in [
        (
            "      cron: every day\n",
            "idempotency.persistence.cleanup.cron",
        ),
        (
            "      zone: Europe/Atlantis\n",
            "idempotency.persistence.cleanup.zone",
        ),
    ] {
        let error = Idempotency::from_config(
            &settings(&persistence(&format!("    cleanup:\n{cleanup}"))),
            sqlite().await,
        )
        .await
        .unwrap_err();
        assert!(error.to_string().contains(named), "{error}");
    }
}

// ---- idempotency.in-flight.*, acquire.* (PostgreSQL: a held key blocks) ----

/// Holds `key` in an open transaction until the returned sender is dropped.
async fn hold(
    idempotency: &Idempotency<sqlx::PgPool>,
    key_text: &str,
) -> tokio::sync::oneshot::Sender<()> {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (held, is_held) = tokio::sync::oneshot::channel::<()>();
    let service = idempotency.service().clone();
    let key_text = key_text.to_owned();
    tokio::spawn(async move {
        let mut tx = service.begin().await.unwrap();
        let request = serde_json::json!({ "n": 1 });
        let _ = service
            .execute_in(
                &mut tx,
                Call::new("OP", key(&key_text), &request),
                async |_conn| {
                    let _ = held.send(());
                    let _ = released.await;
                    Ok::<_, idempotency::core::Error>(ExecutionResult::success(1u32))
                },
            )
            .await;
        let _ = tx.rollback().await;
    });
    is_held.await.unwrap();
    release
}

#[tokio::test]
async fn in_flight_policy_reject_answers_at_once_and_wait_waits_for_the_timeout() {
    let pool = postgres().await;
    let reject = Idempotency::from_config(
        &settings(&with("  in-flight:\n    policy: reject\n")),
        pool.clone(),
    )
    .await
    .unwrap();
    // Both services are assembled before the key is held: `schema.mode: create` takes a
    // table lock that waits for open writers.
    let wait = Idempotency::from_config(
        &settings(&with(
            "  in-flight:\n    policy: wait\n    timeout: 600ms\n",
        )),
        pool,
    )
    .await
    .unwrap();
    let release = hold(&reject, "held").await;
    let started = std::time::Instant::now();
    let error = run(&reject, "OP", "held", 1, &AtomicUsize::new(0))
        .await
        .unwrap_err();
    assert!(
        matches!(error, idempotency::core::Error::InFlight),
        "{error:?}"
    );
    // Far below the default wait (10 s): the reject policy did not wait for the holder.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let started = std::time::Instant::now();
    let error = run(&wait, "OP", "held", 1, &AtomicUsize::new(0))
        .await
        .unwrap_err();
    assert!(
        matches!(error, idempotency::core::Error::InFlight),
        "{error:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );
    drop(release);
}

#[tokio::test]
async fn acquire_max_attempts_and_lookup_before_acquire_reach_the_service() {
    let idempotency = Idempotency::from_config(
        &settings(&format!(
            "{}  acquire:\n    max-attempts: 5\n",
            persistence("    lookup-before-acquire: true\n")
        )),
        sqlite().await,
    )
    .await
    .unwrap();
    let config = idempotency.service().config();
    assert_eq!(config.max_acquire_attempts, 5);
    assert!(config.lookup_before_acquire);
}

// ---- outbox.* ----

fn outbox_yaml(extra: &str) -> String {
    format!("{BASE}outbox:\n  schema:\n    mode: create\n{extra}")
}

#[tokio::test]
async fn no_outbox_section_no_outbox() {
    let idempotency = Idempotency::from_config(&settings(BASE), sqlite().await)
        .await
        .unwrap();
    assert!(idempotency.outbox().is_err());
    let error = Builder::new(&settings(BASE))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(sqlite().await)
        .await
        .unwrap_err();
    assert_eq!(property_of(error), "outbox");
}

#[tokio::test]
async fn outbox_relay_enabled_needs_a_publisher_and_notify_channel_needs_notifications() {
    let error = Idempotency::from_config(
        &settings(&outbox_yaml("  notify-channel: null\n")),
        sqlite().await,
    )
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "outbox.relay.enabled");
    let error = Builder::new(&settings(&outbox_yaml("")))
        .publisher(idempotency::outbox::LoggingPublisher::new())
        .build(sqlite().await)
        .await
        .unwrap_err();
    assert_eq!(property_of(error), "outbox.notify-channel");
}

#[tokio::test]
async fn outbox_partitioning_is_postgres_only_and_partitions_the_table() {
    let partitioned = "  notify-channel: null\n  relay:\n    enabled: false\n  partitioning:\n    \
                       enabled: true\n    interval: 1h\n    ahead: 2\n";
    let error = Idempotency::from_config(&settings(&outbox_yaml(partitioned)), sqlite().await)
        .await
        .unwrap_err();
    assert_eq!(property_of(error), "outbox.partitioning.enabled");

    let zero = partitioned.replace("interval: 1h", "interval: 0s");
    let error = Idempotency::from_config(&settings(&outbox_yaml(&zero)), postgres().await)
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("partitioning.interval"), "{error}");

    let idempotency =
        Idempotency::from_config(&settings(&outbox_yaml(partitioned)), postgres().await)
            .await
            .unwrap();
    let partitions = idempotency.outbox().unwrap().partitions().await.unwrap();
    assert_eq!(partitions.iter().filter(|p| p.default).count(), 1);
    let ranges: Vec<_> = partitions.iter().filter(|p| !p.default).collect();
    assert_eq!(
        ranges.len(),
        3,
        "the current hour and 2 ahead: {partitions:?}"
    );
    for range in ranges {
        let (from, to) = (range.from.unwrap(), range.to.unwrap());
        assert_eq!((to - from).num_seconds(), 3600);
    }
}

#[tokio::test]
async fn outbox_table_name_and_relay_enabled_take_effect() {
    let pool = sqlite().await;
    let idempotency = Idempotency::from_config(
        &settings(&outbox_yaml(
            "  table-name: billing_events\n  notify-channel: null\n  relay:\n    enabled: false\n",
        )),
        pool.clone(),
    )
    .await
    .unwrap();
    assert!(
        idempotency.relay().is_none(),
        "relay.enabled false: no relay"
    );
    let outbox = idempotency.outbox().unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_all(
            &mut tx,
            &[NewEvent::new("charge", "c-1", "ChargeCreated", &serde_json::json!({})).unwrap()],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        outbox.stats().await.unwrap().pending,
        1,
        "nothing relays it"
    );
    idempotency.shutdown().await;
}

#[tokio::test]
async fn outbox_relay_publishes_to_jetstream_and_shuts_down_with_the_service() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await.unwrap();
    let unique = unique();
    let publisher = idempotency::outbox::publisher::nats::NatsPublisher::new(client.clone())
        .with_subject(&format!("props{unique}.{{aggregate_type}}.{{event_type}}"))
        .unwrap();
    let stream = format!("PROPS_{unique}");
    publisher
        .ensure_stream(&stream, Duration::from_secs(60))
        .await
        .unwrap();

    let pool = postgres().await;
    let settings = settings(&format!(
        "{BASE}outbox:\n  schema:\n    mode: create\n  relay:\n    workers: 1\n    poll-interval: 100ms\n"
    ));
    // A stream that forgets message ids before the relay may publish one again (its lease
    // plus `relay.backoff.max`, 5 min 10 s by default) stops start-up, naming the keys.
    let error = Builder::new(&settings)
        .publisher(publisher.clone())
        .build(pool.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("duplicate window") && error.contains("relay.backoff.max"),
        "{error}"
    );
    let relay = settings.outbox.as_ref().unwrap().relay.republish_window();
    publisher.ensure_stream(&stream, relay).await.unwrap();
    let idempotency = Builder::new(&settings)
        .publisher(publisher)
        .build(pool.clone())
        .await
        .unwrap();
    assert_eq!(idempotency.relay().unwrap().health().workers, 1);
    let outbox = idempotency.outbox().unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox
        .enqueue_all(
            &mut tx,
            &[NewEvent::new(
                "charge",
                "c-1",
                "ChargeCreated",
                &serde_json::json!({"a": 1}),
            )
            .unwrap()],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let jetstream = async_nats::jetstream::new(client);
    let mut published = 0;
    for _ in 0..50 {
        published = jetstream
            .get_stream(&stream)
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages;
        if published == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(published, 1);
    let report = idempotency.shutdown().await;
    assert!(report.relay.unwrap().graceful);
    jetstream.delete_stream(&stream).await.unwrap();
}

// ---- unknown keys ----

#[tokio::test]
async fn unknown_keys_are_refused_at_every_level_naming_them() {
    for (yaml, named) in [
        ("idempotency:\n  persistance: {}\n", "persistance"),
        ("idempotency:\n  persistence:\n    tll: 1d\n", "tll"),
        (
            "idempotency:\n  local-cache:\n    max-entries: 1\n",
            "max-entries",
        ),
        ("outbox:\n  relay:\n    worker: 2\n", "worker"),
        ("idempotancy: {}\n", "idempotancy"),
    ] {
        let error = try_settings(yaml).unwrap_err().to_string();
        assert!(error.contains(named), "{yaml}: {error}");
    }
}

#[tokio::test]
async fn the_environment_reaches_every_key_with_operation_case_and_null() {
    let settings: Settings = Loader::new()
        .environment([
            ("IDEMPOTENCY__PERSISTENCE__LOOKUP_BEFORE_ACQUIRE", "true"),
            ("IDEMPOTENCY__PERSISTENCE__TTL", "null"),
            ("IDEMPOTENCY__OPERATIONS__CREATE_PAYMENT__TTL", "7d"),
            ("IDEMPOTENCY__OPERATIONS__AUDIT__TTL", "null"),
            (
                "IDEMPOTENCY__DISTRIBUTED_CACHE__FAILURE_POLICY",
                "fail-fast",
            ),
            (
                "IDEMPOTENCY__DISTRIBUTED_CACHE__CIRCUIT_BREAKER__COOL_DOWN",
                "2s",
            ),
            (
                "IDEMPOTENCY__PERSISTENCE__CLEANUP__ZONE",
                "America/New_York",
            ),
            ("OUTBOX__RELAY__BATCH_SIZE", "250"),
            ("DATABASE_URL", "postgres://ignored"),
        ])
        .load()
        .unwrap();
    let p = &settings.idempotency;
    assert!(p.persistence.lookup_before_acquire);
    assert_eq!(p.persistence.ttl, None);
    assert_eq!(
        p.operations["CREATE_PAYMENT"].ttl,
        Some(Some(Duration::from_secs(7 * 86_400)))
    );
    assert_eq!(p.operations["AUDIT"].ttl, Some(None));
    assert_eq!(
        p.distributed_cache.failure_policy,
        idempotency::core::FailurePolicy::FailFast
    );
    assert_eq!(
        p.distributed_cache.circuit_breaker.cool_down,
        Duration::from_secs(2)
    );
    assert_eq!(p.persistence.cleanup.zone, "America/New_York");
    assert_eq!(settings.outbox.unwrap().relay.batch_size, 250);

    let error = Loader::new()
        .environment([("IDEMPOTENCY__PERSISTENCE__TLL", "1d")])
        .load::<Settings>()
        .unwrap_err()
        .to_string();
    assert!(error.contains("tll"), "{error}");
}

#[tokio::test]
async fn the_environment_overrides_the_file() {
    let file = std::env::temp_dir().join(format!("idempotency-env-{}.yaml", unique()));
    std::fs::write(&file, "idempotency:\n  persistence:\n    ttl: 30d\n").unwrap();
    let settings: Settings = Loader::new()
        .file(&file)
        .environment([("IDEMPOTENCY__PERSISTENCE__TTL", "1d")])
        .load()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        settings.idempotency.persistence.ttl,
        Some(Duration::from_secs(86_400))
    );
}

#[tokio::test]
async fn values_that_cannot_take_effect_are_refused_naming_their_key() {
    for (yaml, named) in [
        (
            persistence("    cleanup:\n      cron: \"0 0 0 30 2 *\"\n"),
            "idempotency.persistence.cleanup.cron",
        ),
        (
            persistence("    cleanup:\n      batch-size: 0\n"),
            "idempotency.persistence.cleanup.batch-size",
        ),
        (
            persistence("    ttl: 1001years\n"),
            "idempotency.persistence.ttl",
        ),
        (
            format!(
                "{}  operations:\n    LONG:\n      ttl: 2000years\n",
                persistence("")
            ),
            "idempotency.operations.<NAME>.ttl",
        ),
        (
            format!("{}  acquire:\n    max-attempts: 0\n", persistence("")),
            "idempotency.acquire.max-attempts",
        ),
        (
            outbox_yaml("  notify-channel: null\n  relay:\n    stats-interval: 0s\n"),
            "relay.stats-interval",
        ),
        (
            outbox_yaml("  notify-channel: null\n  retention:\n    interval: 0s\n"),
            "retention.interval",
        ),
    ] {
        let settings = settings(&yaml);
        let built = if yaml.contains("outbox:") {
            Builder::new(&settings)
                .publisher(idempotency::outbox::LoggingPublisher::new())
                .build(sqlite().await)
                .await
        } else {
            Idempotency::from_config(&settings, sqlite().await).await
        };
        let message = match built {
            Ok(_) => panic!("{yaml}: accepted"),
            Err(error) => error.to_string(),
        };
        assert!(message.contains(named), "{yaml}: {message}");
    }
    // A publisher while the relay is off is refused too.
    let error = Builder::new(&settings(&outbox_yaml(
        "  notify-channel: null\n  relay:\n    enabled: false\n",
    )))
    .publisher(idempotency::outbox::LoggingPublisher::new())
    .build(sqlite().await)
    .await
    .unwrap_err();
    assert_eq!(property_of(error), "outbox.relay.enabled");
}
