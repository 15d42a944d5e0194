//! What leased claims need (the lease columns and the token sequence) is in the canonical DDL
//! and in `migrations/`: a service on `schema.mode: validate` with the migrations applied
//! claims with leases without `prepare_leases`, and `validate_leases` names what a table
//! without them lacks.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::path::Path;
use std::time::Duration;

use idempotency_core::lease::{LeaseClaim, LeasedClaims};
use idempotency_core::store::{Claim, LockWait};
use idempotency_core::{Fingerprint, IdempotencyKey, Operation, RecordId, Scope};
use idempotency_pg::sqlx::{self, AssertSqlSafe, PgPool};
use idempotency_pg::{Error, PgStore, SchemaProblem};

async fn claim(store: &PgStore, key: &str) -> LeaseClaim {
    let id = RecordId::new(
        Operation::new("LEASED").unwrap(),
        Scope::default(),
        IdempotencyKey::new(key).unwrap(),
    );
    let fingerprint = Fingerprint::new(format!("{:0>64}", "a"));
    let claim = Claim {
        id: &id,
        fingerprint: &fingerprint,
        ttl: Some(Duration::from_secs(3600)),
        wait: LockWait::NoWait,
    };
    store
        .claim_leased(&claim, Duration::from_secs(60))
        .await
        .unwrap()
}

async fn exec(pool: &PgPool, sql: &str) {
    sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .unwrap();
}

/// Every file of `migrations/` in order, as `sqlx migrate run` applies them.
async fn migrate(pool: &PgPool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    for file in files {
        exec(pool, &std::fs::read_to_string(&file).unwrap()).await;
    }
}

#[tokio::test]
async fn a_created_table_has_what_leases_need() {
    let store = PgStore::new(idempotency_testing::pg_pool().await);
    store.create_schema().await.unwrap();
    store.validate_leases().await.unwrap();
    assert!(matches!(
        claim(&store, "k").await,
        LeaseClaim::Acquired { .. }
    ));
}

#[tokio::test]
async fn with_the_migrations_applied_leases_need_no_ddl() {
    let pool = idempotency_testing::pg_pool().await;
    migrate(&pool).await;
    let store = PgStore::new(pool);
    store.validate_schema().await.unwrap();
    store.validate_leases().await.unwrap();
    assert!(matches!(
        claim(&store, "k").await,
        LeaseClaim::Acquired { .. }
    ));
}

#[tokio::test]
async fn validate_leases_names_what_a_table_without_leases_lacks() {
    let pool = idempotency_testing::pg_pool().await;
    exec(
        &pool,
        include_str!("../../../migrations/20261130000001_idempotency_records.sql"),
    )
    .await;
    exec(
        &pool,
        include_str!("../../../migrations/20261201000001_idempotency_payload_json.sql"),
    )
    .await;
    exec(
        &pool,
        include_str!("../../../migrations/20261206000001_idempotency_trace.sql"),
    )
    .await;
    let store = PgStore::new(pool);
    store.validate_schema().await.unwrap();
    let Err(Error::Schema { problems, .. }) = store.validate_leases().await else {
        panic!("a table without leases was accepted for them");
    };
    assert_eq!(
        problems,
        [
            SchemaProblem::MissingColumn {
                column: "lease_token"
            },
            SchemaProblem::MissingColumn {
                column: "lease_expires_at"
            },
            SchemaProblem::MissingLeaseSequence {
                sequence: "idempotency_records_lease_token_seq".into()
            },
        ]
    );
    assert!(problems[2].to_string().contains("lease_token_seq"));
}

/// A table whose leases an earlier release prepared (columns only, tokens counted on the row):
/// the migration's sequence starts above the tokens already there.
#[tokio::test]
async fn the_sequence_starts_above_tokens_an_earlier_release_issued() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    exec(
        &pool,
        "DROP SEQUENCE idempotency_records_lease_token_seq; \
         INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
                                          lease_token, lease_expires_at) \
         VALUES ('LEASED', 'old', 'h', 'PROCESSING', 5, now())",
    )
    .await;
    exec(
        &pool,
        include_str!("../../../migrations/20261205000001_idempotency_leases.sql"),
    )
    .await;
    let LeaseClaim::Acquired { token, .. } = claim(&store, "new").await else {
        panic!("not acquired");
    };
    assert!(token.0 > 5, "{token:?}");
}

/// The canonical DDL created the sequence over a table an earlier release had leased on:
/// `prepare_leases` moves it above the tokens there before it issues any.
#[tokio::test]
async fn prepare_leases_starts_an_unused_sequence_above_the_tokens_there() {
    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    store.create_schema().await.unwrap();
    exec(
        &pool,
        "INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
                                          lease_token, lease_expires_at) \
         VALUES ('LEASED', 'old', 'h', 'PROCESSING', 7, now())",
    )
    .await;
    store.prepare_leases().await.unwrap();
    let LeaseClaim::Acquired { token, .. } = claim(&store, "new").await else {
        panic!("not acquired");
    };
    assert!(token.0 > 7, "{token:?}");
    store.prepare_leases().await.unwrap();
    let LeaseClaim::Acquired { token: next, .. } = claim(&store, "newer").await else {
        panic!("not acquired");
    };
    assert!(next > token, "a used sequence is never moved back");
}
