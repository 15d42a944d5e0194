//! The tests every database runs: `suite!(Db::postgres)` expands them in a test file.

/// Expands the command line's tests for the database `$db` opens.
#[macro_export]
macro_rules! suite {
    ($db:path) => {
        use predicates::prelude::*;
        use $crate::common::{DEAD, UNKNOWN_ID, json};

        #[tokio::test(flavor = "multi_thread")]
        async fn schema_print_apply_validate() {
            let db = $db().await;
            // Before apply: every table missing, exit 5, each named.
            db.cli()
                .args(["schema", "validate"])
                .assert()
                .code(5)
                .stdout(predicate::str::contains(db.records.as_str()))
                .stdout(predicate::str::contains(db.outbox.as_str()))
                .stderr(predicate::str::contains("schema problem(s) found"));
            // print: the DDL for the configured names, no connection needed.
            let printed = db.cli().args(["schema", "print"]).assert().success();
            let out = String::from_utf8_lossy(&printed.get_output().stdout).into_owned();
            assert!(out.contains("CREATE TABLE"), "{out}");
            let bare = |name: &str| name.rsplit('.').next().unwrap().to_owned();
            assert!(
                out.contains(&bare(&db.records)) && out.contains(&bare(&db.outbox)),
                "{out}"
            );
            // With an inbox.
            db.cli()
                .args(["schema", "print", "--inbox-table", "cli_inbox"])
                .assert()
                .success()
                .stdout(predicate::str::contains("cli_inbox"));
            // A dry run creates nothing.
            db.cli()
                .args(["schema", "apply", "--dry-run"])
                .assert()
                .success();
            db.cli().args(["schema", "validate"]).assert().code(5);
            db.cli()
                .args(["schema", "apply", "--inbox-table", "cli_inbox"])
                .assert()
                .success();
            let report = json(
                db.cli()
                    .args(["--json", "schema", "validate", "--inbox-table", "cli_inbox"])
                    .assert(),
            );
            assert_eq!(report["ok"], true, "{report}");
            assert!(report["tables"].as_array().unwrap().len() >= 3, "{report}");
            // An invalid table name in the configuration: exit 2, naming it.
            std::fs::write(
                &db.config,
                "idempotency:\n  persistence:\n    table-name: \"records; DROP TABLE x\"\n",
            )
            .unwrap();
            db.cli()
                .args(["schema", "print"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("records; DROP TABLE x"));
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn keys_show_stats_and_evict() {
            let db = $db().await;
            db.seed().await;
            let shown = json(
                db.cli()
                    .args([
                        "--json", "keys", "show", "PAY", "k-done", "--scope", "tenant-a",
                    ])
                    .assert(),
            );
            assert_eq!(shown["status"], "COMPLETED", "{shown}");
            assert_eq!(shown["fingerprint"], "h1");
            assert_eq!(shown["outcome_size"], 8);
            assert_eq!(shown["preview"], "{\"id\":1}");
            db.cli()
                .args(["keys", "show", "REFUND", "k-old"])
                .assert()
                .success()
                .stdout(predicate::str::contains("REJECTED"))
                .stdout(predicate::str::contains("NO_FUNDS"));
            // Unknown key (wrong scope): exit 3 naming it.
            db.cli()
                .args(["keys", "show", "PAY", "k-done", "--scope", "tenant-b"])
                .assert()
                .code(3)
                .stderr(
                    predicate::str::contains("k-done").and(predicate::str::contains("tenant-b")),
                );
            // Malformed key: exit 2 naming it.
            db.cli()
                .args(["keys", "show", "PAY", "bad key"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("bad key"));

            let stats = json(db.cli().args(["--json", "keys", "stats"]).assert());
            assert_eq!(stats["total"], 3, "{stats}");
            assert_eq!(stats["expired"], 1, "{stats}");
            let groups = stats["groups"].as_array().unwrap();
            assert!(
                groups.iter().any(|g| g["operation"] == "PAY"
                    && g["status"] == "PROCESSING"
                    && g["count"] == 1),
                "{stats}"
            );

            // In progress: refused without --force, nothing changed.
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--yes",
                ])
                .assert()
                .code(4)
                .stderr(predicate::str::contains("--force"));
            assert_eq!(db.records_where("k-busy").await, 1);
            // Forced for another claim than the one there: refused, nothing changed; a claim
            // without --force is bad usage.
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--force", "--claim",
                    "999", "--yes",
                ])
                .assert()
                .code(4)
                .stderr(predicate::str::contains("no longer the claim"));
            assert_eq!(db.records_where("k-busy").await, 1);
            // A dry run says the same, not "would evict".
            db.cli()
                .args([
                    "keys",
                    "evict",
                    "PAY",
                    "k-busy",
                    "--scope",
                    "tenant-a",
                    "--force",
                    "--claim",
                    "999",
                    "--dry-run",
                ])
                .assert()
                .code(4)
                .stderr(predicate::str::contains("no longer the claim"));
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--claim", "999",
                    "--yes",
                ])
                .assert()
                .code(2);
            assert_eq!(db.records_where("k-busy").await, 1);
            // Not confirmed (stdin is no terminal): refused, nothing changed.
            db.cli()
                .args(["keys", "evict", "PAY", "k-done", "--scope", "tenant-a"])
                .assert()
                .code(4)
                .stderr(predicate::str::contains("--yes"));
            // Dry run: nothing changed.
            db.cli()
                .args([
                    "keys",
                    "evict",
                    "PAY",
                    "k-done",
                    "--scope",
                    "tenant-a",
                    "--dry-run",
                ])
                .assert()
                .success()
                .stdout(predicate::str::contains("would evict"));
            assert_eq!(db.records_where("k-done").await, 1);
            // Evicted, audited, and the L1 caveat said.
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
                ])
                .assert()
                .success()
                .stdout(predicate::str::contains("runs again"))
                .stdout(predicate::str::contains("until their TTL"))
                .stderr(predicate::str::contains("idempotency::audit"))
                .stderr(predicate::str::contains("key.evict"))
                .stderr(predicate::str::contains("cli:tester"));
            assert_eq!(db.records_where("k-done").await, 0);
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-busy", "--scope", "tenant-a", "--force", "--yes",
                ])
                .assert()
                .success();
            assert_eq!(db.records_where("k-busy").await, 0);
            db.cli()
                .args([
                    "keys", "evict", "PAY", "k-done", "--scope", "tenant-a", "--yes",
                ])
                .assert()
                .code(3);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn outbox_status_and_dead_letters() {
            let db = $db().await;
            db.seed().await;
            let status = json(db.cli().args(["--json", "outbox", "status"]).assert());
            assert_eq!(status["pending"], 1, "{status}");
            assert_eq!(status["dead_lettered"], 3, "{status}");
            assert_eq!(status["dead_letter_aggregates"], 3, "{status}");
            db.cli()
                .args(["outbox", "status"])
                .assert()
                .success()
                .stdout(predicate::str::contains("dead letters"));

            let listed = json(db.cli().args(["--json", "outbox", "dead", "list"]).assert());
            let ids: Vec<&str> = listed
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids.len(), 3, "{listed}");
            let refunds = json(
                db.cli()
                    .args([
                        "--json",
                        "outbox",
                        "dead",
                        "list",
                        "--aggregate-type",
                        "refund",
                    ])
                    .assert(),
            );
            assert_eq!(refunds.as_array().unwrap().len(), 1, "{refunds}");
            assert_eq!(refunds[0]["id"], DEAD[2]);
            assert_eq!(refunds[0]["last_error"], "no such subject");
            let shown = json(
                db.cli()
                    .args(["--json", "outbox", "dead", "show", DEAD[0]])
                    .assert(),
            );
            assert_eq!(shown["payload"], "{\"n\":1}", "{shown}");
            // Bad input: unknown id (3), malformed id (2), no selection (2); nothing changed.
            db.cli()
                .args(["outbox", "dead", "show", UNKNOWN_ID])
                .assert()
                .code(3)
                .stderr(predicate::str::contains(UNKNOWN_ID));
            db.cli()
                .args(["outbox", "dead", "requeue", "not-a-uuid", "--yes"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("not-a-uuid"));
            db.cli()
                .args(["outbox", "dead", "requeue", DEAD[0], UNKNOWN_ID, "--yes"])
                .assert()
                .code(3)
                .stderr(predicate::str::contains(UNKNOWN_ID));
            db.cli()
                .args(["outbox", "dead", "discard", "--yes"])
                .assert()
                .code(2);
            assert_eq!(db.dead_letters().await, 3);

            // Requeue one by id.
            db.cli()
                .args(["outbox", "dead", "requeue", DEAD[0], "--yes"])
                .assert()
                .success()
                .stdout(predicate::str::contains("requeued 1"))
                .stderr(predicate::str::contains("outbox.dead.requeue"));
            assert_eq!(db.dead_letters().await, 2);
            // Discard by filter, dry run first.
            db.cli()
                .args([
                    "outbox",
                    "dead",
                    "discard",
                    "--aggregate-type",
                    "charge",
                    "--dry-run",
                ])
                .assert()
                .success()
                .stdout(predicate::str::contains("would discard 1"));
            assert_eq!(db.dead_letters().await, 2);
            db.cli()
                .args([
                    "outbox",
                    "dead",
                    "discard",
                    "--aggregate-type",
                    "charge",
                    "--yes",
                ])
                .assert()
                .success()
                .stdout(predicate::str::contains("discarded 1"));
            // Requeue all the rest.
            db.cli()
                .args(["outbox", "dead", "requeue", "--all", "--yes"])
                .assert()
                .success()
                .stdout(predicate::str::contains("requeued 1"));
            assert_eq!(db.dead_letters().await, 0);
            let status = json(db.cli().args(["--json", "outbox", "status"]).assert());
            assert_eq!(status["pending"], 3, "{status}");
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn purge_and_cleanup() {
            let db = $db().await;
            db.seed().await;
            let published = format!("published_at IS NOT NULL");
            db.cli()
                .args(["outbox", "purge", "--older-than", "1d", "--dry-run"])
                .assert()
                .success()
                .stdout(predicate::str::contains("would delete 1 row"));
            assert_eq!(db.count(&db.outbox, &published).await, 1);
            db.cli()
                .args(["outbox", "purge", "--older-than", "3d", "--yes"])
                .assert()
                .success()
                .stdout(predicate::str::contains("deleted 0 published"));
            db.cli()
                .args(["outbox", "purge", "--yes"])
                .assert()
                .success()
                .stdout(predicate::str::contains("deleted 1 published"))
                .stderr(predicate::str::contains("outbox.purge.published"));
            assert_eq!(db.count(&db.outbox, &published).await, 0);
            assert_eq!(db.dead_letters().await, 3, "dead letters only when asked");
            db.cli()
                .args(["outbox", "purge", "--older-than", "soon", "--yes"])
                .assert()
                .code(2);
            // The dead letters' age is shown as parsed (`6m` is six minutes), and zero, which
            // would delete every dead letter, is refused.
            db.cli()
                .args([
                    "outbox",
                    "purge",
                    "--dead-lettered-older-than",
                    "6m",
                    "--dry-run",
                ])
                .assert()
                .success()
                .stdout(predicate::str::contains("dead-lettered more than 6m ago"));
            db.cli()
                .args([
                    "outbox",
                    "purge",
                    "--dead-lettered-older-than",
                    "0s",
                    "--yes",
                ])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("--dead-lettered-older-than 0s"));
            assert_eq!(db.dead_letters().await, 3, "none deleted");

            db.cli()
                .args(["cleanup", "run", "--dry-run"])
                .assert()
                .success()
                .stdout(predicate::str::contains("would delete 1 expired record"));
            assert_eq!(db.records_where("k-old").await, 1);
            db.cli().args(["cleanup", "run"]).assert().code(4);
            assert_eq!(db.records_where("k-old").await, 1);
            let report = json(
                db.cli()
                    .args(["--json", "cleanup", "run", "--yes"])
                    .assert(),
            );
            assert_eq!(report["records"], 1, "{report}");
            assert_eq!(db.records_where("k-old").await, 0);
            assert_eq!(db.records_where("k-done").await, 1);
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn bad_configuration_and_unreachable_database() {
            let db = $db().await;
            db.cli().args(["schema", "apply"]).assert().success();
            // No database at all.
            let mut cli = db.cli();
            cli.env_remove("DATABASE_URL");
            let args: Vec<String> = vec!["--config".into(), db.config.display().to_string()];
            assert_cmd::Command::new(env!("CARGO_BIN_EXE_idempotency"))
                .args(&args)
                .env_remove("DATABASE_URL")
                .args(["keys", "stats"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("--database-url"));
            // A scheme the tool does not know.
            assert_cmd::Command::new(env!("CARGO_BIN_EXE_idempotency"))
                .args(["--database-url", "oracle://db/x", "keys", "stats"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("oracle"));
            // A missing config file.
            assert_cmd::Command::new(env!("CARGO_BIN_EXE_idempotency"))
                .args([
                    "--config",
                    "/nonexistent/app.yaml",
                    "--database-url",
                    &db.url,
                ])
                .args(["keys", "stats"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("/nonexistent/app.yaml"));
            // A misspelled key in the configuration.
            db.cli()
                .env("IDEMPOTENCY__PERSISTANCE__TTL", "1d")
                .args(["keys", "stats"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("persistance"));
            // No outbox section: outbox commands say so.
            db.without_outbox();
            db.cli()
                .args(["outbox", "status"])
                .assert()
                .code(2)
                .stderr(predicate::str::contains("no outbox is configured"));
            // Unreachable.
            let unreachable = db.unreachable_url();
            assert_cmd::Command::new(env!("CARGO_BIN_EXE_idempotency"))
                .args(["--config", &db.config.display().to_string()])
                .args(["--database-url", &unreachable, "keys", "stats"])
                .assert()
                .code(6)
                .stderr(predicate::str::contains("cannot connect"));
        }
    };
}
