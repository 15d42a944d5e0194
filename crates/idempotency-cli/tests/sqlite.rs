//! The `idempotency` command line on SQLite: every command, and the bad inputs.

mod common;

use common::Db;

suite!(Db::sqlite);

#[tokio::test(flavor = "multi_thread")]
async fn partitions_are_postgresql_only() {
    let db = Db::sqlite().await;
    db.cli().args(["schema", "apply"]).assert().success();
    for command in ["list", "create", "drop-expired"] {
        db.cli()
            .args(["outbox", "partitions", command, "--yes"])
            .assert()
            .code(2)
            .stderr(predicates::str::contains("SQLite"));
    }
}

/// A requeue of more dead letters than one batch holds, refused in its second batch (an
/// aggregate that already published a later event): the first batch stays requeued, and the
/// command says so and exits 1, not 4 ("refused, nothing changed"; before: exit 4 with no
/// word of the 500 rows already back in the relay's hands).
#[tokio::test(flavor = "multi_thread")]
async fn a_requeue_refused_after_a_committed_batch_says_what_it_changed() {
    let db = Db::sqlite().await;
    db.seed().await;
    let o = db.outbox.as_str();
    // 500 dead letters, older than the seed's (listed first: the whole first batch).
    let rows: Vec<String> = (0..500)
        .map(|i| {
            format!(
                "('00000000-0000-7000-8000-{:012x}', 'bulk', 'b{i}', 1, 'BulkCreated', '{{}}', \
                 '{{}}', 0, 5, 0, 'broker said no', NULL, 1)",
                0x1000 + i
            )
        })
        .collect();
    db.exec(&format!(
        "INSERT INTO {o} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
         headers, created_at, attempts, next_attempt_at, last_error, published_at, \
         dead_lettered_at) VALUES {}",
        rows.join(", ")
    ))
    .await;
    // The seed's `charge` c1 published a later event: its dead letter (second batch) is
    // refused.
    db.exec(&format!(
        "INSERT INTO {o} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
         headers, created_at, attempts, next_attempt_at, last_error, published_at, \
         dead_lettered_at) VALUES ('00000000-0000-7000-8000-0000000000f1', 'charge', 'c1', 2, \
         'ChargeUpdated', '{{}}', '{{}}', 0, 1, 0, NULL, 1, NULL)"
    ))
    .await;
    assert_eq!(db.dead_letters().await, 503);
    db.cli()
        .args(["outbox", "dead", "requeue", "--all", "--yes"])
        .assert()
        .code(1)
        .stderr(predicates::str::contains("500 row(s) were changed"))
        .stderr(predicates::str::contains("out of order"));
    assert_eq!(db.dead_letters().await, 3, "the first batch was requeued");
}

/// A report that cannot be written (standard output on a full disk) is an error, exit 1,
/// saying so (before: exit 0 with nothing printed, which a script took for success); a reader
/// that went away (`| head`) ends the output quietly, exit 0.
#[cfg(target_os = "linux")] // `/dev/full`
#[tokio::test(flavor = "multi_thread")]
async fn a_report_that_cannot_be_written_fails_the_command() {
    let db = Db::sqlite().await;
    let command = |stdout: std::process::Stdio| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency"));
        command
            .arg("--config")
            .arg(&db.config)
            .args(["--database-url", &db.url, "schema", "print"])
            .env_remove("RUST_LOG")
            .env_remove("DATABASE_URL")
            .stdout(stdout)
            .stderr(std::process::Stdio::piped());
        command
    };
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = command(full.into()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot write the report to standard output"),
        "{stderr}"
    );

    // clap's help and version alike (before: exit 0); a usage error still exits 2.
    for flag in ["--help", "--version"] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency"))
            .arg(flag)
            .stdout(full)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{flag}: {stderr}");
        assert!(stderr.contains("cannot write"), "{flag}: {stderr}");
    }
    let usage = std::process::Command::new(env!("CARGO_BIN_EXE_idempotency"))
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));

    let mut child = command(std::process::Stdio::piped()).spawn().unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("error"), "{stderr}");
}
