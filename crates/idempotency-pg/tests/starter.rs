//! Coming from the Spring Boot idempotency starter: `validate` recognises its table and names the
//! migration; the migration gives the canonical table, and the records the starter wrote replay
//! through `execute` without running the action.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use idempotency_core::fingerprint::canonicalize;
use idempotency_core::{
    Call, Error as CoreError, ExecutionResult, FingerprintStrategy, IdempotencyKey,
    IdempotencyService, JcsFingerprint, Outcome,
};
use idempotency_pg::{Error, PgStore, SchemaProblem};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, PgPool};

/// The starter's canonical DDL, exactly as its reference document gives it.
const STARTER_DDL: &str = r#"CREATE TABLE IF NOT EXISTS idempotency_records (
    operation        VARCHAR(128)  NOT NULL,
    idempotency_key  VARCHAR(255)  NOT NULL,
    request_hash     VARCHAR(128)  NOT NULL,
    status           VARCHAR(32)   NOT NULL,   -- PROCESSING | COMPLETED | REJECTED
    result_type      VARCHAR(255),
    result_payload   JSONB,
    error_code       VARCHAR(128),
    created_at       TIMESTAMPTZ   NOT NULL,
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ,
    PRIMARY KEY (operation, idempotency_key)
);

CREATE INDEX IF NOT EXISTS idx_idempotency_records_expires_at ON idempotency_records (expires_at);"#;

/// One row as the starter's `JdbcPersistenceStore` writes it. `canonical` is the text its
/// `CanonicalJsonFingerprintStrategy` hashes (keys sorted, no whitespace, numbers through
/// `BigDecimal.stripTrailingZeros().toPlainString()`); `request_hash` is its SHA-256 in lower-case
/// hex (`HexFormat.of()`), computed here by PostgreSQL.
struct StarterRow {
    key: &'static str,
    canonical: &'static str,
    status: &'static str,
    result_type: Option<&'static str>,
    payload: &'static str,
    error_code: Option<&'static str>,
}

async fn insert(pool: &PgPool, row: &StarterRow) -> String {
    sqlx::query_scalar(
        "INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
             result_type, result_payload, error_code, created_at, completed_at, expires_at) \
         VALUES ('CREATE_PAYMENT', $1, encode(sha256(convert_to($2, 'UTF8')), 'hex'), $3, $4, \
                 $5::jsonb, $6, now(), now(), now() + interval '365 days') \
         RETURNING request_hash",
    )
    .bind(row.key)
    .bind(row.canonical)
    .bind(row.status)
    .bind(row.result_type)
    .bind(row.payload)
    .bind(row.error_code)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn stored_payload(pool: &PgPool, key: &str) -> String {
    sqlx::query_scalar(
        "SELECT result_payload::text FROM idempotency_records WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The fingerprint `execute` computes for `request` (the default strategy).
fn fingerprint(request: &Value) -> String {
    JcsFingerprint::default()
        .fingerprint(request)
        .unwrap()
        .as_str()
        .to_owned()
}

#[tokio::test]
async fn a_starter_table_is_recognised_migrated_and_replays() {
    let pool = idempotency_testing::pg_pool().await;
    sqlx::raw_sql(STARTER_DDL).execute(&pool).await.unwrap();

    // The starter demo's payment of 100.00, and its rejection for 5000.00.
    // The request bodies of the starter demo (its `CreatePaymentRequest`), as this library
    // serializes them: the amount is a JSON number.
    let paid = json!({"orderId": "o-1", "recipient": "alice", "amount": 100.00});
    let refused = json!({"orderId": "o-2", "recipient": "alice", "amount": 5000.00});
    // A request whose canonical forms differ: the starter writes 0.0000001, RFC 8785 1e-7.
    let tiny = json!({"orderId": "o-3", "recipient": "alice", "amount": 0.0000001});
    let rows = [
        StarterRow {
            key: "demo-1",
            canonical: r#"{"amount":100,"orderId":"o-1","recipient":"alice"}"#,
            status: "COMPLETED",
            result_type: Some("com.kholodilin.idempotency.demo.model.PaymentResult"),
            payload: r#"{"paymentId":"7b1f0c9e-3c52-4c1e-9d7e-2f5a1b6c8d90","orderId":"o-1","amount":100.00,"status":"CONFIRMED"}"#,
            error_code: None,
        },
        StarterRow {
            key: "demo-2",
            canonical: r#"{"amount":5000,"orderId":"o-2","recipient":"alice"}"#,
            status: "REJECTED",
            result_type: None,
            payload: r#"{"requestedAmount":5000.00,"availableBalance":1000.00}"#,
            error_code: Some("INSUFFICIENT_FUNDS"),
        },
        StarterRow {
            key: "demo-3",
            canonical: r#"{"amount":0.0000001,"orderId":"o-3","recipient":"alice"}"#,
            status: "COMPLETED",
            result_type: Some("com.kholodilin.idempotency.demo.model.PaymentResult"),
            payload: r#"{"paymentId":"5d0c1a2b-0000-4000-8000-000000000003","orderId":"o-3","amount":0.0000001,"status":"CONFIRMED"}"#,
            error_code: None,
        },
    ];
    let mut hashes = Vec::new();
    for row in &rows {
        hashes.push(insert(&pool, row).await);
    }
    // The same function for the usual request: sorted keys, no whitespace, 100.00 as 100,
    // SHA-256 in lower-case hex.
    assert_eq!(fingerprint(&paid), hashes[0]);
    assert_eq!(fingerprint(&refused), hashes[1]);
    // Not for every number: RFC 8785 writes 1e-7 where the starter writes 0.0000001.
    assert_eq!(
        canonicalize(&tiny),
        r#"{"amount":1e-7,"orderId":"o-3","recipient":"alice"}"#
    );
    assert_ne!(fingerprint(&tiny), hashes[2]);
    let paid_text = stored_payload(&pool, "demo-1").await;
    let refused_text = stored_payload(&pool, "demo-2").await;

    // validate recognises the starter's table and names the migration.
    let store = PgStore::new(pool.clone());
    let error = store.validate_schema().await.unwrap_err();
    let Error::Schema { problems, .. } = &error else {
        panic!("{error:?}")
    };
    let [SchemaProblem::StarterTable { migration }] = problems.as_slice() else {
        panic!("{problems:?}")
    };
    assert!(
        error
            .to_string()
            .contains(&format!("apply migrations/{migration}")),
        "{error}"
    );

    // The migration, read from the workspace's migrations/, converts it; run twice, the second
    // run does nothing.
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../migrations")
        .join(migration);
    let sql = std::fs::read_to_string(&path).unwrap();
    for _ in 0..2 {
        sqlx::raw_sql(AssertSqlSafe(sql.clone()))
            .execute(&pool)
            .await
            .unwrap();
        // The later migrations of the sequence (the trace columns) follow it.
        sqlx::raw_sql(include_str!(
            "../../../migrations/20261206000001_idempotency_trace.sql"
        ))
        .execute(&pool)
        .await
        .unwrap();
        store.validate_schema().await.unwrap();
    }
    let scopes: Vec<String> = sqlx::query_scalar("SELECT DISTINCT scope FROM idempotency_records")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(scopes, [""], "every row is in the default scope");

    // Both records replay through execute; the action never runs.
    let service = IdempotencyService::new(store);
    let ran = AtomicUsize::new(0);
    let key = |k: &str| IdempotencyKey::new(k).unwrap();

    let outcome: Outcome<Value> = service
        .execute(
            Call::new("CREATE_PAYMENT", key("demo-1"), &paid),
            async |_conn| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoreError>(ExecutionResult::success(json!(null)))
            },
        )
        .await
        .unwrap();
    assert!(outcome.is_replayed());
    let value = outcome.into_result().into_result().unwrap();
    assert_eq!(value, serde_json::from_str::<Value>(&paid_text).unwrap());
    assert_eq!(value["paymentId"], "7b1f0c9e-3c52-4c1e-9d7e-2f5a1b6c8d90");

    let outcome: Outcome<Value> = service
        .execute(
            Call::new("CREATE_PAYMENT", key("demo-2"), &refused),
            async |_conn| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoreError>(ExecutionResult::success(json!(null)))
            },
        )
        .await
        .unwrap();
    assert!(outcome.is_replayed());
    let rejection = outcome.into_result().into_result().unwrap_err();
    assert_eq!(rejection.code(), "INSUFFICIENT_FUNDS");
    assert_eq!(
        rejection.details(),
        Some(&serde_json::from_str::<Value>(&refused_text).unwrap())
    );

    // The starter's record of the tiny amount does not match this library's fingerprint of the
    // same request: the retry is refused as a key reused with another payload, not replayed.
    let result: Result<Outcome<Value>, CoreError> = service
        .execute(
            Call::new("CREATE_PAYMENT", key("demo-3"), &tiny),
            async |_conn| {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(ExecutionResult::success(json!(null)))
            },
        )
        .await;
    assert!(
        matches!(result, Err(CoreError::PayloadConflict)),
        "{result:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "an action ran");
}

/// A table that only looks partly like the starter's (a scope column already there) is not
/// reported as the starter's: its differences are listed one by one.
#[tokio::test]
async fn a_canonical_table_with_an_extra_result_type_is_not_the_starters() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    sqlx::raw_sql("ALTER TABLE idempotency_records ADD COLUMN result_type varchar(255)")
        .execute(&pool)
        .await
        .unwrap();
    store.validate_schema().await.unwrap();
}

/// Every file of `migrations/` in order (as `sqlx migrate run` applies them), over a fresh
/// database and over the starter's table with a record: both end canonical, and the record
/// still reads back.
#[tokio::test]
async fn the_whole_migration_sequence_works_fresh_and_over_a_starter_table() {
    use idempotency_core::store::IdempotencyStore;
    use idempotency_core::{Operation, RecordId, Scope, StoredOutcome};

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("20261201120000_idempotency_from_starter.sql"))
    );

    for starter in [false, true] {
        let pool = idempotency_testing::pg_pool().await;
        if starter {
            sqlx::raw_sql(STARTER_DDL).execute(&pool).await.unwrap();
            sqlx::raw_sql(
                "INSERT INTO idempotency_records (operation, idempotency_key, request_hash, \
                     status, result_type, result_payload, created_at, completed_at) \
                 VALUES ('OP', 'k', 'h', 'COMPLETED', 'java.lang.Integer', '7', now(), now())",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
        for file in &files {
            let sql = std::fs::read_to_string(file).unwrap();
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&pool)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        }
        let store = PgStore::new(pool.clone());
        store.validate_schema().await.unwrap();
        if starter {
            let id = RecordId::new(
                Operation::new("OP").unwrap(),
                Scope::default(),
                IdempotencyKey::new("k").unwrap(),
            );
            let record = store.lookup(&id).await.unwrap().unwrap();
            assert_eq!(
                record.outcome,
                Some(StoredOutcome::Completed {
                    payload: "7".to_owned()
                })
            );
        }
    }
}
