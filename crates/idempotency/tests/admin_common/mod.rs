//! The harness of the admin router's tests: a database of the test's own (a PostgreSQL
//! schema, a MySQL database, a SQLite file), the service assembled on it with its tables, rows
//! seeded with plain SQL, and the router answering `oneshot` requests.
#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;
use idempotency::sqlx::{self, AssertSqlSafe};
use idempotency::{Idempotency, Loader, Settings};
use serde_json::Value;
use tower::ServiceExt;

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

/// One test's database and tables.
pub struct Db {
    pub pool: Pool,
    pub records: String,
    pub outbox: String,
    _dir: Option<tempfile_dir::Dir>,
}

/// A temporary directory removed on drop (the SQLite file's).
mod tempfile_dir {
    pub struct Dir(pub std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The test's settings: its tables, no Redis, L1 on (the default), an outbox when asked.
pub fn settings(outbox: bool) -> Settings {
    let mut yaml = String::from(
        "idempotency:\n  persistence:\n    table-name: admin_records\n    schema:\n      mode: create\n    \
         cleanup:\n      enabled: false\n  distributed-cache:\n    enabled: false\n",
    );
    if outbox {
        yaml.push_str(
            "outbox:\n  table-name: admin_outbox\n  schema:\n    mode: create\n  notify-channel: null\n  \
             relay:\n    enabled: false\n  retention:\n    published: 1d\n",
        );
    }
    let file = std::env::temp_dir().join(format!(
        "idempotency-admin-{}.yaml",
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::write(&file, yaml).unwrap();
    let loaded = Loader::new()
        .file(&file)
        .environment(Vec::<(String, String)>::new())
        .load();
    std::fs::remove_file(&file).unwrap();
    loaded.unwrap()
}

impl Db {
    /// A schema of its own on `DATABASE_URL`.
    pub async fn postgres() -> Self {
        Self {
            pool: Pool::Pg(idempotency_testing::pg_pool().await),
            records: "admin_records".into(),
            outbox: "admin_outbox".into(),
            _dir: None,
        }
    }

    /// A database of its own on `MYSQL_URL`.
    pub async fn mysql() -> Self {
        Self {
            pool: Pool::My(idempotency_testing::mysql_pool().await),
            records: "admin_records".into(),
            outbox: "admin_outbox".into(),
            _dir: None,
        }
    }

    /// A file of its own in a temporary directory.
    pub async fn sqlite() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idempotency-admin-{}",
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite:{}", dir.join("app.db").display());
        let options = idempotency::sqlite::connect_options(&url).unwrap();
        let pool = idempotency::sqlite::open_pool(options).await.unwrap();
        Self {
            pool: Pool::Sqlite(pool),
            records: "admin_records".into(),
            outbox: "admin_outbox".into(),
            _dir: Some(tempfile_dir::Dir(dir)),
        }
    }

    async fn router_with(&self, outbox: bool, mutations: bool) -> Router {
        let settings = settings(outbox);
        macro_rules! build {
            ($pool:expr) => {{
                let idempotency = Idempotency::from_config(&settings, $pool.clone())
                    .await
                    .unwrap();
                let router = idempotency
                    .admin_router()
                    .allow_mutations(mutations)
                    .mutations_setting("admin.allow-mutations")
                    .into_router();
                idempotency.shutdown().await;
                router
            }};
        }
        match &self.pool {
            Pool::Pg(p) => build!(p),
            Pool::Sqlite(p) => build!(p),
            Pool::My(p) => build!(p),
        }
    }

    /// The admin router of the service on this database (creating its tables), changes on or
    /// off.
    pub async fn router(&self, mutations: bool) -> Router {
        self.router_with(true, mutations).await
    }

    /// The admin router of a service configured without an outbox.
    pub async fn router_without_outbox(&self) -> Router {
        self.router_with(false, true).await
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

    pub fn id(&self, id: &str) -> String {
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
        .unwrap_or_else(|e| panic!("{e}"));
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        let sql = AssertSqlSafe(sql.to_owned());
        match &self.pool {
            Pool::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Pool::My(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn count(&self, table: &str, condition: &str) -> i64 {
        self.scalar(&format!("SELECT count(*) FROM {table} WHERE {condition}"))
            .await
    }

    /// Assembles the service once (its tables), then writes three records (one completed,
    /// one in progress, one expired and rejected) and five outbox rows (three dead letters,
    /// one published two days ago, one pending).
    pub async fn seed(&self) {
        let _tables = self.router(false).await;
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
        let past3 = self.time(-3);
        let rows = [
            (
                DEAD[0],
                "'charge', 'c1', 1, 'ChargeCreated', '{\"n\":1}'",
                "5",
                "'broker said no'",
                "NULL",
                now.as_str(),
            ),
            (
                DEAD[1],
                "'charge', 'c2', 1, 'ChargeCreated', '{\"n\":2}'",
                "5",
                "'broker said no'",
                "NULL",
                now.as_str(),
            ),
            (
                DEAD[2],
                "'refund', 'r1', 1, 'RefundCreated', '{\"n\":3}'",
                "5",
                "'no such subject'",
                "NULL",
                now.as_str(),
            ),
            (
                "00000000-0000-7000-8000-000000000004",
                "'charge', 'c3', 1, 'ChargeCreated', '{\"n\":4}'",
                "1",
                "NULL",
                past2.as_str(),
                "NULL",
            ),
            (
                "00000000-0000-7000-8000-000000000005",
                "'charge', 'c4', 1, 'ChargeCreated', '{\"n\":5}'",
                "0",
                "NULL",
                "NULL",
                "NULL",
            ),
        ];
        for (id, event, attempts, error, published, dead) in rows {
            let created = if published == "NULL" { &now } else { &past3 };
            self.insert(&format!(
                "{}, {event}, '{{}}', {created}, {attempts}, {created}, {error}, {published}, {dead}",
                self.id(id)
            ))
            .await;
        }
    }

    async fn insert(&self, values: &str) {
        self.exec(&format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
             headers, created_at, attempts, next_attempt_at, last_error, published_at, \
             dead_lettered_at) VALUES ({values})",
            self.outbox
        ))
        .await;
    }

    /// An outbox with every case of the blocked count: `charge/b1` (failing head, later rows:
    /// blocked), `charge/b2` (the same, its earlier rows published or dead: blocked),
    /// `charge/b3` (the same with a sequence-less row: blocked), `charge/alone` (failing head
    /// without a later row), `charge/leased` (failing head held by a relay), `charge/fine`
    /// (head not failing), `charge/nulls` (failing rows without a sequence).
    pub async fn seed_blocked(&self) {
        let _tables = self.router(false).await;
        let (now, past) = (self.time(0), self.time(-1));
        let token = match self.pool {
            Pool::My(_) => "UNHEX('0000000000007000800000000000abcd')".to_owned(),
            _ => "'00000000-0000-7000-8000-00000000abcd'".to_owned(),
        };
        // (aggregate, sequence, error, claim, published, dead)
        let rows: &[(&str, &str, &str, &str, &str, &str)] = &[
            ("b1", "1", "'timeout'", "NULL", "NULL", "NULL"),
            ("b1", "2", "NULL", "NULL", "NULL", "NULL"),
            ("b1", "3", "'timeout'", "NULL", "NULL", "NULL"),
            ("b2", "1", "NULL", "NULL", &past, "NULL"),
            ("b2", "2", "'x'", "NULL", "NULL", &past),
            ("b2", "3", "'timeout'", "NULL", "NULL", "NULL"),
            ("b2", "4", "NULL", "NULL", "NULL", "NULL"),
            ("b3", "NULL", "NULL", "NULL", "NULL", "NULL"),
            ("b3", "5", "'timeout'", "NULL", "NULL", "NULL"),
            ("b3", "6", "NULL", "NULL", "NULL", "NULL"),
            ("alone", "1", "'timeout'", "NULL", "NULL", "NULL"),
            ("leased", "1", "'timeout'", &token, "NULL", "NULL"),
            ("leased", "2", "NULL", "NULL", "NULL", "NULL"),
            ("fine", "1", "NULL", "NULL", "NULL", "NULL"),
            ("fine", "2", "'timeout'", "NULL", "NULL", "NULL"),
            ("nulls", "NULL", "'timeout'", "NULL", "NULL", "NULL"),
            ("nulls", "NULL", "'timeout'", "NULL", "NULL", "NULL"),
        ];
        for (n, (aggregate, sequence, error, claim, published, dead)) in rows.iter().enumerate() {
            let id = self.id(&format!("00000000-0000-7000-8000-{:012x}", 0x100 + n));
            self.exec(&format!(
                "INSERT INTO {} (id, aggregate_type, aggregate_id, sequence, event_type, payload, \
                 headers, created_at, attempts, next_attempt_at, claim_token, last_error, \
                 published_at, dead_lettered_at) VALUES ({id}, 'charge', '{aggregate}', \
                 {sequence}, 'ChargeCreated', '{{}}', '{{}}', {now}, 1, {now}, {claim}, {error}, \
                 {published}, {dead})",
                self.outbox
            ))
            .await;
        }
    }

    /// The count of blocked aggregates as `outbox status` computed it before: a pair of
    /// correlated subqueries per failing pending row (kept here as the reference).
    pub fn reference_blocked_sql(&self) -> String {
        let t = &self.outbox;
        let pending =
            |a: &str| format!("{a}.published_at IS NULL AND {a}.dead_lettered_at IS NULL");
        format!(
            "SELECT count(*) FROM {t} h \
             WHERE {} AND h.sequence IS NOT NULL AND h.last_error IS NOT NULL \
               AND h.claim_token IS NULL \
               AND NOT EXISTS (SELECT 1 FROM {t} p WHERE p.aggregate_type = h.aggregate_type \
                   AND p.aggregate_id = h.aggregate_id AND {} AND p.sequence < h.sequence) \
               AND EXISTS (SELECT 1 FROM {t} p WHERE p.aggregate_type = h.aggregate_type \
                   AND p.aggregate_id = h.aggregate_id AND {} AND p.sequence > h.sequence)",
            pending("h"),
            pending("p"),
            pending("p"),
        )
    }

    /// `PostgreSQL`, `SQLite` or `MySQL`.
    pub fn backend(&self) -> &'static str {
        match self.pool {
            Pool::Pg(_) => "PostgreSQL",
            Pool::Sqlite(_) => "SQLite",
            Pool::My(_) => "MySQL",
        }
    }

    /// `rows` pending rows over `aggregates` aggregates (sequences 1, 2, … in each), every one
    /// failed once and backing off, then the planner's statistics.
    pub async fn bulk_failing(&self, rows: u32, aggregates: u32) {
        let t = &self.outbox;
        let columns = "id, aggregate_type, aggregate_id, sequence, event_type, payload, headers, \
                       created_at, attempts, next_attempt_at, last_error";
        match self.pool {
            Pool::Pg(_) => {
                self.exec(&format!(
                    "INSERT INTO {t} ({columns}) SELECT \
                     ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid, 'charge', \
                     'a' || (n % {aggregates}), n / {aggregates} + 1, 'ChargeCreated', '{{}}', \
                     '{{}}', now(), 1, now() + interval '1 minute', 'timeout' \
                     FROM generate_series(0, {rows} - 1) AS n"
                ))
                .await;
                self.exec(&format!("ANALYZE {t}")).await;
            }
            Pool::Sqlite(_) => {
                let now = self.time(0);
                self.exec(&format!(
                    "WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s \
                         WHERE n < {rows} - 1) \
                     INSERT INTO {t} ({columns}) SELECT \
                     printf('00000000-0000-7000-8000-%012x', n), 'charge', \
                     'a' || (n % {aggregates}), n / {aggregates} + 1, 'ChargeCreated', '{{}}', \
                     '{{}}', {now}, 1, {now} + 60000, 'timeout' FROM s"
                ))
                .await;
                self.exec("ANALYZE").await;
            }
            Pool::My(_) => {
                let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL \
                    SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL \
                    SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)";
                self.exec(&format!(
                    "INSERT INTO {t} ({columns}) SELECT \
                     UNHEX(CONCAT('00000000000070008000', LPAD(HEX(n), 12, '0'))), 'charge', \
                     CONCAT('a', n % {aggregates}), n DIV {aggregates} + 1, 'ChargeCreated', \
                     '{{}}', '{{}}', UTC_TIMESTAMP(6), 1, UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, \
                     'timeout' FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d \
                         + 10000 * f.d AS n \
                         FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f) AS s \
                     WHERE n < {rows}"
                ))
                .await;
                self.exec(&format!("ANALYZE TABLE {t}")).await;
            }
        }
    }

    pub async fn dead_letters(&self) -> i64 {
        self.count(&self.outbox, "dead_lettered_at IS NOT NULL")
            .await
    }

    /// 1 when the row `id` is pending (neither published nor dead-lettered).
    pub async fn pending_with_id(&self, id: &str) -> i64 {
        self.count(
            &self.outbox,
            &format!(
                "id = {} AND published_at IS NULL AND dead_lettered_at IS NULL",
                self.id(id)
            ),
        )
        .await
    }

    pub async fn records_where(&self, key: &str) -> i64 {
        self.count(&self.records, &format!("idempotency_key = '{key}'"))
            .await
    }
}

pub async fn call(app: &Router, request: Request<Body>) -> Response {
    app.clone().oneshot(request).await.unwrap()
}

pub async fn body_text(response: Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    let text = body_text(response).await;
    if status.is_success() {
        assert_eq!(content_type, "application/json", "{text}");
    } else {
        assert_eq!(content_type, "application/problem+json", "{status}: {text}");
    }
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, value)
}

pub async fn get_json(app: &Router, uri: &str) -> (StatusCode, Value) {
    json_of(call(app, Request::get(uri).body(Body::empty()).unwrap()).await).await
}

pub async fn post_json(app: &Router, uri: &str, body: &Value) -> (StatusCode, Value) {
    json_of(
        call(
            app,
            Request::post(uri)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await,
    )
    .await
}
