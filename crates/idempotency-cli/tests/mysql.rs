//! The `idempotency` command line on MySQL and MariaDB: every command, and the bad inputs.

mod common;

use common::Db;

suite!(Db::mysql);

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_postgresql_only() {
    let db = Db::mysql().await;
    db.cli().args(["schema", "apply"]).assert().success();
    for command in ["list", "create", "drop-expired"] {
        db.cli()
            .args(["outbox", "partitions", command, "--yes"])
            .assert()
            .code(2)
            .stderr(predicates::str::contains("MySQL"));
    }
}
