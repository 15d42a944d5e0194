//! The `idempotency` command line on PostgreSQL: every command, the bad inputs, partitions
//! and the Redis L2 entry of an evicted key.

mod common;

use common::Db;

suite!(Db::postgres);

#[tokio::test(flavor = "multi_thread")]
async fn partitions_of_a_partitioned_outbox() {
    let db =
        Db::postgres_with("  partitioning:\n    enabled: true\n    interval: 1d\n    ahead: 2\n")
            .await;
    db.cli().args(["schema", "apply"]).assert().success();
    let listed = json(
        db.cli()
            .args(["--json", "outbox", "partitions", "list"])
            .assert(),
    );
    let partitions = listed.as_array().unwrap();
    assert!(partitions.iter().any(|p| p["default"] == true), "{listed}");
    assert!(partitions.len() >= 4, "default + today + 2 ahead: {listed}");
    db.cli()
        .args(["outbox", "partitions", "create"])
        .assert()
        .success()
        .stdout(predicate::str::contains("created 0 partition"));
    db.cli()
        .args(["outbox", "partitions", "drop-expired"])
        .assert()
        .code(4);
    db.cli()
        .args(["outbox", "partitions", "drop-expired", "--yes"])
        .assert()
        .success()
        .stdout(predicate::str::contains("dropped 0 partition"))
        .stderr(predicate::str::contains("outbox.partitions.drop-expired"));
    // The dead-letter commands reach every partition.
    db.cli().args(["outbox", "status"]).assert().success();
}

/// With retention off nothing expires: `drop-expired` drops nothing and says why (before: it
/// dropped every partition older than `retention.published`, whose default is 7 days).
#[tokio::test(flavor = "multi_thread")]
async fn drop_expired_is_refused_when_retention_is_off() {
    let db = Db::postgres_with(
        "    enabled: false\n  partitioning:\n    enabled: true\n    interval: 1d\n    ahead: 2\n",
    )
    .await;
    db.cli().args(["schema", "apply"]).assert().success();
    db.cli()
        .args(["outbox", "partitions", "drop-expired", "--yes"])
        .assert()
        .code(2)
        .stdout(predicate::str::contains("dropped").not())
        .stderr(predicate::str::contains(
            "outbox.retention.enabled is false",
        ));
}

/// A retention that would delete every dead letter (`dead-lettered: 0s`) is refused before
/// cleanup deletes anything, records included (before: the expired records were deleted, then
/// the dead-letter purge refused; partitions holding dead letters were dropped).
#[tokio::test(flavor = "multi_thread")]
async fn cleanup_refuses_a_zero_dead_letter_retention_before_deleting_anything() {
    let db = Db::postgres_with("    dead-lettered: 0s\n").await;
    db.seed().await;
    let dead = db.dead_letters().await;
    db.cli()
        .args(["cleanup", "run", "--yes"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("dead-lettered"));
    assert_eq!(
        db.records_where("k-old").await,
        1,
        "the expired record kept"
    );
    assert_eq!(db.dead_letters().await, dead, "no dead letter deleted");
}

/// A schema statement the database refuses is a database error (exit 1), not bad input
/// (before: exit 2, "bad input or configuration"); an invalid table name stays exit 2.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_schema_statement_is_a_database_error() {
    let db = Db::postgres().await;
    std::fs::write(
        &db.config,
        "idempotency:\n  persistence:\n    table-name: pg_catalog.cli_records\n",
    )
    .unwrap();
    db.cli()
        .args(["schema", "apply", "--yes"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cli_records"));
    std::fs::write(
        &db.config,
        "idempotency:\n  persistence:\n    table-name: \"records; DROP TABLE x\"\n",
    )
    .unwrap();
    db.cli()
        .args(["schema", "apply", "--yes"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("records; DROP TABLE x"));
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_of_a_plain_outbox_are_refused() {
    let db = Db::postgres().await;
    db.cli().args(["schema", "apply"]).assert().success();
    db.cli()
        .args(["outbox", "partitions", "list"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("partitioning.enabled"));
}

/// A seeded database with the L2 cache on `REDIS_URL`, the Redis key of `PAY`/`k-done` in
/// scope `tenant-a` (as `keys show` gives it), and a client of that Redis.
#[allow(clippy::unwrap_used)]
async fn seeded_with_redis() -> (Db, String, idempotency::redis::fred::prelude::Client) {
    use idempotency::redis::fred::prelude::{Builder, ClientLike, Config};

    let db = Db::postgres().await;
    db.seed().await;
    db.with_redis();
    let shown = json(
        db.cli()
            .args([
                "--json", "keys", "show", "PAY", "k-done", "--scope", "tenant-a",
            ])
            .assert(),
    );
    let key = shown["redis_key"].as_str().unwrap().to_owned();
    let redis = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = Builder::from_config(Config::from_url(&redis).unwrap())
        .build()
        .unwrap();
    client.init().await.unwrap();
    (db, key, client)
}

#[tokio::test(flavor = "multi_thread")]
async fn evict_deletes_the_redis_entry_too() {
    use idempotency::redis::fred::prelude::{ClientLike, KeysInterface};

    let (db, key, client) = seeded_with_redis().await;
    assert!(key.ends_with("k-done"), "{key}");
    let () = client.set(&key, "entry", None, None, false).await.unwrap();
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("Redis (L2) entry was deleted"))
        .stderr(predicate::str::contains("key.evict.cache"));
    let left: i64 = client.exists(&key).await.unwrap();
    assert_eq!(left, 0, "the L2 entry {key} is gone");
    // Evicting another key with no entry says so.
    db.cli()
        .args(["keys", "evict", "REFUND", "k-old", "--yes"])
        .assert()
        .success()
        .stdout(predicate::str::contains("Redis (L2) had no entry"));
    let _ = client.quit().await;
}

/// Redis does not answer while a key is evicted: the record is deleted, and the error says
/// so and that the key is to be evicted again (before: a bare "the Redis entry could not be
/// deleted"). Evicted again once Redis answers, the key has no record, and its entry left
/// behind is deleted (before: "no record", exit 3, the entry left replaying until its TTL). A
/// configuration the Redis client refuses (no secret) fails before anything is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_whose_redis_entry_cannot_be_deleted_says_the_record_went() {
    use idempotency::redis::fred::prelude::{ClientLike, KeysInterface};

    let (db, key, client) = seeded_with_redis().await;
    let () = client.set(&key, "entry", None, None, false).await.unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    db.with_redis_at(&format!("redis://127.0.0.1:{port}"));
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
        ])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("the record is deleted"))
        .stderr(predicate::str::contains("evicted again"));
    assert_eq!(db.records_where("k-done").await, 0);
    let left: i64 = client.exists(&key).await.unwrap();
    assert_eq!(left, 1, "the entry {key} is left");
    // Redis answers again: the second eviction deletes the entry the first left.
    db.with_redis();
    db.cli()
        .args([
            "--dry-run",
            "keys",
            "evict",
            "PAY",
            "k-done",
            "--scope",
            "tenant-a",
        ])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("would be deleted"));
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("no record"))
        .stdout(predicate::str::contains(
            "stale Redis (L2) entry was deleted",
        ))
        .stderr(predicate::str::contains("key.evict.cache"));
    let left: i64 = client.exists(&key).await.unwrap();
    assert_eq!(left, 0, "the entry {key} is gone");
    // Nothing left: no record, no entry.
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
        ])
        .assert()
        .code(3);
    let _ = client.quit().await;
    db.with_redis_at(&format!("redis://127.0.0.1:{port}"));
    // Without the cache's secret: refused as bad configuration, the record kept.
    let text = std::fs::read_to_string(&db.config).unwrap();
    let without_secret: String = text
        .lines()
        .filter(|line| !line.contains("secret:"))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&db.config, without_secret).unwrap();
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--force", "--yes",
        ])
        .assert()
        .code(2);
    assert_eq!(db.records_where("k-busy").await, 1, "nothing deleted");
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_names_the_migration_from_the_starters_table() {
    let db = Db::postgres().await;
    // The reference starter's table under the configured name.
    db.exec(&format!(
        "CREATE TABLE {} (
            operation VARCHAR(128) NOT NULL, idempotency_key VARCHAR(255) NOT NULL,
            request_hash VARCHAR(128) NOT NULL, status VARCHAR(32) NOT NULL,
            result_type VARCHAR(255), result_payload JSONB, error_code VARCHAR(128),
            created_at TIMESTAMPTZ NOT NULL, completed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ,
            PRIMARY KEY (operation, idempotency_key))",
        db.records
    ))
    .await;
    db.cli()
        .args(["schema", "validate"])
        .assert()
        .code(5)
        .stdout(predicate::str::contains(
            "20261201120000_idempotency_from_starter.sql",
        ));
}

/// An eviction's audit line names the key's operation, scope and key in fields of their own:
/// its `target` (`operation/scope/key`) reads the same for `POST:/a` + `b/c` and `POST:/a/b`
/// + `c` (before: only the `target`).
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_audit_line_names_operation_scope_and_key_apart() {
    let db = Db::postgres().await;
    db.cli().args(["schema", "apply"]).assert().success();
    let (now, day) = (db.time(0), db.time(1));
    for (operation, scope) in [("POST:/a", "b/c"), ("POST:/a/b", "c")] {
        db.exec(&format!(
            "INSERT INTO {} (operation, scope, idempotency_key, request_hash, status, \
             result_payload, error_code, created_at, completed_at, expires_at) VALUES \
             ('{operation}', '{scope}', 'k', 'h', 'COMPLETED', '{{}}', NULL, {now}, {now}, {day})",
            db.records
        ))
        .await;
    }
    let evicted = db
        .cli()
        .args(["keys", "evict", "POST:/a", "k", "--scope", "b/c", "--yes"])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&evicted.get_output().stderr).into_owned();
    let line = stderr
        .lines()
        .find(|line| line.contains("idempotency::audit") && line.contains("key.evict"))
        .unwrap_or_else(|| panic!("no audit line: {stderr}"));
    for field in [
        r#"target="POST:/a/b/c/k""#,
        r#"operation="POST:/a""#,
        r#"scope="b/c""#,
        r#"key="k""#,
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    // The other record, whose target reads the same, is still there.
    db.cli()
        .args(["keys", "show", "POST:/a/b", "k", "--scope", "c"])
        .assert()
        .success();
}

/// A forced eviction's audit line names the lease token of the claim it ended, the one its
/// question showed (before: nothing told which claim was ended).
#[tokio::test(flavor = "multi_thread")]
async fn a_forced_eviction_audit_line_names_the_claim_it_ended() {
    let db = Db::postgres().await;
    db.seed().await;
    db.exec(&format!(
        "UPDATE {} SET lease_token = 77 WHERE idempotency_key = 'k-busy'",
        db.records
    ))
    .await;
    db.cli()
        .args(["keys", "show", "PAY", "k-busy", "--scope", "tenant-a"])
        .assert()
        .success()
        .stdout(predicate::str::contains("77"));
    let evicted = db
        .cli()
        .args([
            "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--force", "--claim", "77",
            "--yes",
        ])
        .assert()
        .success();
    let stderr = String::from_utf8_lossy(&evicted.get_output().stderr).into_owned();
    let line = stderr
        .lines()
        .find(|line| line.contains("key.evict.forced"))
        .unwrap_or_else(|| panic!("no audit line: {stderr}"));
    assert!(line.contains("lease_token=77"), "{line}");
    assert_eq!(db.records_where("k-busy").await, 0);
}

/// The audit trail is written whatever `RUST_LOG` says (before: `RUST_LOG=off`, or
/// `idempotency::audit=off`, silenced the record of an eviction), and a schema apply that
/// fails midway is audited too (before: no line, though some tables may have been created).
#[tokio::test(flavor = "multi_thread")]
async fn the_audit_trail_is_written_whatever_rust_log_says() {
    let db = Db::postgres().await;
    db.seed().await;
    for (filter, operation, key, scope) in [
        ("off", "PAY", "k-done", "tenant-a"),
        ("warn,idempotency::audit=off", "REFUND", "k-old", ""),
        (
            "idempotency::audit[{actor}]=off",
            "PAY",
            "k-busy",
            "tenant-a",
        ),
    ] {
        db.cli()
            .env("RUST_LOG", filter)
            .args([
                "keys", "evict", operation, key, "--scope", scope, "--force", "--yes",
            ])
            .assert()
            .success()
            .stderr(predicate::str::contains("idempotency::audit"))
            .stderr(predicate::str::contains("key.evict"));
    }
    let text = std::fs::read_to_string(&db.config).unwrap();
    std::fs::write(
        &db.config,
        text.replace(&db.records, "no_such_schema_here.cli_records"),
    )
    .unwrap();
    db.cli()
        .env("RUST_LOG", "off")
        .args(["schema", "apply", "--yes"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("schema.apply.failed"));
}
