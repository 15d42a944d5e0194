//! The harness of the command line's tests: a database of the test's own (a PostgreSQL
//! schema, a MySQL database, a SQLite file), a configuration file naming its tables, rows
//! seeded with plain SQL, and the `idempotency` binary run against them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

use std::path::PathBuf;

use assert_cmd::Command;
use idempotency::sqlx::{self, AssertSqlSafe};
use tempfile::TempDir;

/// The dead letters the seed writes (two `charge` aggregates, one `refund`).
pub const DEAD: [&str; 3] = [
    "00000000-0000-7000-8000-000000000001",
    "00000000-0000-7000-8000-000000000002",
    "00000000-0000-7000-8000-000000000003",
];
/// A well-formed id no row has.
pub const UNKNOWN_ID: &str = "00000000-0000-7000-8000-0000000000ff";

pub enum Pool {
    Pg(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
    My(sqlx::MySqlPool),
}

/// One test's database, configuration and tables.
pub struct Db {
    pub pool: Pool,
    pub url: String,
    pub records: String,
    pub outbox: String,
    pub config: PathBuf,
    _dir: TempDir,
}

fn config_text(records: &str, outbox: Option<&str>, extra: &str) -> String {
    let mut text = format!(
        "# another section of the service's file: the tool leaves it alone\n\
         server:\n  port: 8080\n\
         idempotency:\n  persistence:\n    table-name: {records}\n"
    );
    if let Some(outbox) = outbox {
        text.push_str(&format!(
            "outbox:\n  table-name: {outbox}\n  retention:\n    published: 1d\n{extra}"
        ));
    }
    text
}

impl Db {
    fn with(pool: Pool, url: String, records: String, outbox: String, extra: &str) -> Self {
        Self::in_dir(
            tempfile::tempdir().unwrap(),
            pool,
            url,
            records,
            outbox,
            extra,
        )
    }

    fn in_dir(
        dir: TempDir,
        pool: Pool,
        url: String,
        records: String,
        outbox: String,
        extra: &str,
    ) -> Self {
        let config = dir.path().join("service.yaml");
        std::fs::write(&config, config_text(&records, Some(&outbox), extra)).unwrap();
        Self {
            pool,
            url,
            records,
            outbox,
            config,
            _dir: dir,
        }
    }

    /// A schema of its own on `DATABASE_URL`; the tables are schema-qualified in the config.
    pub async fn postgres_with(extra: &str) -> Self {
        let pool = idempotency_testing::pg_pool().await;
        let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(&pool)
            .await
            .unwrap();
        let url = idempotency_testing::database_url();
        Self::with(
            Pool::Pg(pool),
            url,
            format!("{schema}.cli_records"),
            format!("{schema}.cli_outbox"),
            extra,
        )
    }

    pub async fn postgres() -> Self {
        Self::postgres_with("").await
    }

    /// A database of its own on `MYSQL_URL`.
    pub async fn mysql() -> Self {
        let pool = idempotency_testing::mysql_pool().await;
        let database: String = sqlx::query_scalar("SELECT DATABASE()")
            .fetch_one(&pool)
            .await
            .unwrap();
        let base = idempotency_testing::mysql_url();
        let (server, _) = base.rsplit_once('/').unwrap();
        let url = format!("{server}/{database}");
        Self::with(
            Pool::My(pool),
            url,
            "cli_records".into(),
            "cli_outbox".into(),
            "",
        )
    }

    /// A file of its own in a temporary directory.
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.db");
        let url = format!("sqlite:{}", path.display());
        let options = idempotency::sqlite::connect_options(&url).unwrap();
        let pool = idempotency::sqlite::open_pool(options).await.unwrap();
        Self::in_dir(
            dir,
            Pool::Sqlite(pool),
            url,
            "cli_records".into(),
            "cli_outbox".into(),
            "",
        )
    }

    /// The binary with this database and configuration.
    pub fn cli(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idempotency"));
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--database-url")
            .arg(&self.url)
            .env_remove("RUST_LOG")
            .env_remove("DATABASE_URL")
            .env("USER", "tester");
        cmd
    }

    /// Rewrites the configuration without an `outbox` section.
    pub fn without_outbox(&self) {
        std::fs::write(&self.config, config_text(&self.records, None, "")).unwrap();
    }

    /// Rewrites the configuration with the L2 cache on `REDIS_URL`.
    pub fn with_redis(&self) {
        let redis =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
        self.with_redis_at(&redis);
    }

    /// Rewrites the configuration with the L2 cache on `redis`.
    pub fn with_redis_at(&self, redis: &str) {
        let mut text = config_text(&self.records, Some(&self.outbox), "");
        text = text.replace(
            "idempotency:\n",
            &format!(
                "idempotency:\n  distributed-cache:\n    enabled: true\n    url: {redis}\n    \
                 secret: cli-test-secret-of-at-least-32-bytes!!\n"
            ),
        );
        std::fs::write(&self.config, text).unwrap();
    }

    pub fn time(&self, days: i32) -> String {
        match self.pool {
            Pool::Pg(_) => format!("(now() + interval '{days} days')"),
            Pool::Sqlite(_) => format!(
                "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) \
                 + {days} * 86400000)"
            ),
            Pool::My(_) => format!("(UTC_TIMESTAMP(6) + INTERVAL {days} DAY)"),
        }
    }

    fn id(&self, id: &str) -> String {
        match self.pool {
            Pool::My(_) => format!("UNHEX(REPLACE('{id}', '-', ''))"),
            _ => format!("'{id}'"),
        }
    }

    pub async fn exec(&self, sql: &str) {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.pool {
            Pool::Pg(p) => sqlx::query(sql).execute(p).await.map(drop),
            Pool::Sqlite(p) => sqlx::query(sql).execute(p).await.map(drop),
            Pool::My(p) => sqlx::query(sql).execute(p).await.map(drop),
        }
        .unwrap();
    }

    pub async fn count(&self, table: &str, condition: &str) -> i64 {
        let sql = AssertSqlSafe(format!("SELECT count(*) FROM {table} WHERE {condition}"));
        match &self.pool {
            Pool::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::My(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .unwrap()
    }

    /// Creates the tables with the tool, then writes three records (one completed, one
    /// in progress, one expired and rejected) and five outbox rows (three dead letters, one
    /// published two days ago, one pending).
    pub async fn seed(&self) {
        self.cli().args(["schema", "apply"]).assert().success();
        let r = self.records.as_str();
        let (now, day, past2, past1) = (self.time(0), self.time(1), self.time(-2), self.time(-1));
        let records = [
            format!(
                "'PAY', 'tenant-a', 'k-done', 'h1', 'COMPLETED', '{{\"id\":1}}', NULL, {now}, {now}, {day}"
            ),
            format!(
                "'PAY', 'tenant-a', 'k-busy', 'h2', 'PROCESSING', NULL, NULL, {now}, NULL, {day}"
            ),
            format!(
                "'REFUND', '', 'k-old', 'h3', 'REJECTED', '{{\"why\":\"no\"}}', 'NO_FUNDS', {past2}, {past2}, {past1}"
            ),
        ];
        for row in records {
            self.exec(&format!(
                "INSERT INTO {r} (operation, scope, idempotency_key, request_hash, status, \
                 result_payload, error_code, created_at, completed_at, expires_at) VALUES ({row})"
            ))
            .await;
        }
        let o = self.outbox.as_str();
        let (past3, d1, d2, d3) = (
            self.time(-3),
            self.id(DEAD[0]),
            self.id(DEAD[1]),
            self.id(DEAD[2]),
        );
        let (published, pending) = (
            self.id("00000000-0000-7000-8000-000000000004"),
            self.id("00000000-0000-7000-8000-000000000005"),
        );
        let rows = [
            format!(
                "{d1}, 'charge', 'c1', 1, 'ChargeCreated', '{{\"n\":1}}', '{{}}', {now}, 5, {now}, 'broker said no', NULL, {now}"
            ),
            format!(
                "{d2}, 'charge', 'c2', 1, 'ChargeCreated', '{{\"n\":2}}', '{{}}', {now}, 5, {now}, 'broker said no', NULL, {now}"
            ),
            format!(
                "{d3}, 'refund', 'r1', 1, 'RefundCreated', '{{\"n\":3}}', '{{}}', {now}, 5, {now}, 'no such subject', NULL, {now}"
            ),
            format!(
                "{published}, 'charge', 'c3', 1, 'ChargeCreated', '{{\"n\":4}}', '{{}}', {past3}, 1, {past3}, NULL, {past2}, NULL"
            ),
            format!(
                "{pending}, 'charge', 'c4', 1, 'ChargeCreated', '{{\"n\":5}}', '{{}}', {now}, 0, {now}, NULL, NULL, NULL"
            ),
        ];
        for row in rows {
            self.exec(&format!(
                "INSERT INTO {o} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
                 headers, created_at, attempts, next_attempt_at, last_error, published_at, \
                 dead_lettered_at) VALUES ({row})"
            ))
            .await;
        }
    }

    pub async fn dead_letters(&self) -> i64 {
        self.count(&self.outbox, "dead_lettered_at IS NOT NULL")
            .await
    }

    pub async fn records_where(&self, key: &str) -> i64 {
        self.count(&self.records, &format!("idempotency_key = '{key}'"))
            .await
    }
}

/// stdout of a successful run, as JSON.
pub fn json(assert: assert_cmd::assert::Assert) -> serde_json::Value {
    let output = assert.success().get_output().stdout.clone();
    serde_json::from_slice(&output)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&output)))
}

impl Db {
    /// A URL of this database's kind that nothing answers.
    pub fn unreachable_url(&self) -> String {
        match self.pool {
            Pool::Pg(_) => "postgres://postgres@127.0.0.1:1/test".to_owned(),
            Pool::My(_) => "mysql://root@127.0.0.1:1/test".to_owned(),
            Pool::Sqlite(_) => "sqlite:/nonexistent-dir/app.db".to_owned(),
        }
    }
}

pub mod suite;
