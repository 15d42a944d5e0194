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

#[tokio::test(flavor = "multi_thread")]
async fn evict_deletes_the_redis_entry_too() {
    let db = Db::postgres().await;
    db.seed().await;
    db.with_redis();
    db.cli()
        .args([
            "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("Redis (L2)"))
        .stderr(predicate::str::contains("key.evict.cache"));
}
