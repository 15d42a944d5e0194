//! What leased claims need is in the canonical DDL (a store created with `schema.mode: create`
//! claims with leases without `prepare_leases`), and `validate_leases` names what a table
//! created by an earlier release lacks.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use std::time::Duration;

use idempotency_core::config::{PersistenceConfig, SchemaMode};
use idempotency_core::lease::{FencingToken, LeaseClaim, LeasedClaims};
use idempotency_core::{Fingerprint, RecordId, Scope};
use idempotency_sqlite::{Error, SchemaProblem, SqliteStore};

async fn claim(store: &SqliteStore) -> LeaseClaim {
    let id = RecordId::new(
        idempotency_core::Operation::new("LEASED").unwrap(),
        Scope::default(),
        support::key("k"),
    );
    let fingerprint = Fingerprint::new(format!("{:0>64}", "a"));
    store
        .claim_leased(&support::claim(&id, &fingerprint), Duration::from_secs(60))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_created_table_has_what_leases_need() {
    let store = support::fresh_store().await;
    store.validate_leases().await.unwrap();
    assert_eq!(
        claim(&store).await,
        LeaseClaim::Acquired {
            token: FencingToken(1),
            takeover: false
        }
    );
}

/// The records table as releases before leases in the DDL created it.
const EARLIER_DDL: &str = r#"CREATE TABLE "idempotency_records" (
    operation        TEXT    NOT NULL CHECK (length(operation) <= 128),
    scope            TEXT    NOT NULL DEFAULT '' CHECK (length(scope) <= 255),
    idempotency_key  TEXT    NOT NULL CHECK (length(idempotency_key) <= 255),
    request_hash     TEXT    NOT NULL CHECK (length(request_hash) <= 128),
    status           TEXT    NOT NULL CHECK (status IN ('PROCESSING', 'COMPLETED', 'REJECTED')),
    result_payload   TEXT    CHECK (json_valid(result_payload)),
    error_code       TEXT    CHECK (length(error_code) <= 128),
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    expires_at       INTEGER,
    PRIMARY KEY (operation, scope, idempotency_key)
) STRICT;
CREATE INDEX "idempotency_records_expires_at_idx" ON "idempotency_records" (expires_at) WHERE expires_at IS NOT NULL;"#;

/// [`EARLIER_DDL`] brought up to the trace columns by their migration (which an upgrade applies
/// whatever the leases).
fn earlier_with_trace_columns() -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(format!(
        "{EARLIER_DDL}\n{}",
        include_str!("../../../migrations/sqlite/20261206000001_idempotency_trace.sql")
    ))
}

#[tokio::test]
async fn validate_leases_names_what_an_earlier_table_lacks_and_prepare_leases_adds_it() {
    let path = support::temp_db_path();
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::None;
    let store = SqliteStore::connect(support::as_str(&path), &config)
        .await
        .unwrap();
    sqlx::raw_sql(earlier_with_trace_columns())
        .execute(store.pool())
        .await
        .unwrap();
    store.validate_schema().await.unwrap();
    let Err(Error::Schema { problems, .. }) = store.validate_leases().await else {
        panic!("an earlier table was accepted for leases");
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
            SchemaProblem::MissingLeaseCounter {
                table: "\"idempotency_records_lease_tokens\"".into()
            },
        ]
    );
    assert!(problems[2].to_string().contains("lease_tokens"));
    store.prepare_leases().await.unwrap();
    store.validate_leases().await.unwrap();
    assert!(matches!(claim(&store).await, LeaseClaim::Acquired { .. }));
}

/// An earlier release had leased on the table (columns added, tokens counted on the row); the
/// canonical DDL then created the counter at 0: `prepare_leases` moves it above the tokens.
#[tokio::test]
async fn prepare_leases_moves_the_counter_above_the_tokens_there() {
    let path = support::temp_db_path();
    let mut config = PersistenceConfig::default();
    config.schema.mode = SchemaMode::None;
    let earlier = SqliteStore::connect(support::as_str(&path), &config)
        .await
        .unwrap();
    sqlx::raw_sql(EARLIER_DDL)
        .execute(earlier.pool())
        .await
        .unwrap();
    sqlx::raw_sql(
        "ALTER TABLE idempotency_records ADD COLUMN lease_token INTEGER; \
         ALTER TABLE idempotency_records ADD COLUMN lease_expires_at INTEGER; \
         INSERT INTO idempotency_records (operation, idempotency_key, request_hash, status, \
                                          created_at, lease_token, lease_expires_at) \
         VALUES ('LEASED', 'old', 'h', 'PROCESSING', 0, 7, 0)",
    )
    .execute(earlier.pool())
    .await
    .unwrap();
    config.schema.mode = SchemaMode::Create;
    let store = SqliteStore::connect(support::as_str(&path), &config)
        .await
        .unwrap();
    store.prepare_leases().await.unwrap();
    let LeaseClaim::Acquired { token, .. } = claim(&store).await else {
        panic!("not acquired");
    };
    assert!(token.0 > 7, "{token:?}");
}
