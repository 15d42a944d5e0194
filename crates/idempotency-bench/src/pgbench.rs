//! pgbench, run from the load bench with the statements the store itself issues, so that a
//! library ratio (say `execute` / the business transaction alone) can be set against the ratio
//! PostgreSQL's own C client gets for the same statements, measured in the same run, with the
//! same clients, on the same tables.
//!
//! Each slice of a pgbench scenario is one `pgbench -M prepared -T <seconds>` run (prepared
//! statements, as sqlx uses them; unencrypted, as the bench's sqlx client connects); the
//! latencies come from its per-transaction log.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{ExternalRun, Scenario};

/// The environment of every libpq client the bench starts (pgbench, the Python peer): no TLS,
/// as the bench's own sqlx client, built without a TLS feature, connects. libpq's default
/// (`sslmode=prefer`) would encrypt on a server with `ssl = on`, and those clients' figures would
/// carry a cost the library's do not. An `sslmode` in the URL still wins.
pub(crate) const UNENCRYPTED: [(&str, &str); 1] = [("PGSSLMODE", "disable")];

/// Where and how pgbench connects: the bench's database and schema.
#[derive(Clone)]
pub(crate) struct Pgbench {
    url: String,
    schema: String,
    dir: Arc<ScriptDir>,
}

/// The directory of the scripts and logs, removed when the last clone is dropped.
struct ScriptDir(PathBuf);

impl Drop for ScriptDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One parameter of a statement, as pgbench passes it.
pub(crate) enum Param {
    /// A pgbench variable (`-D name=value` or `\set name ...`).
    Var(&'static str),
    /// A literal written into the text, for what pgbench cannot pass as a parameter: `NULL`
    /// and the empty string.
    Sql(&'static str),
}

impl Pgbench {
    /// pgbench on `url` with `search_path` set to `schema`; `None` when pgbench is not
    /// installed (the pgbench scenarios are then left out of the run).
    pub(crate) fn find(url: &str, schema: &str) -> Option<Self> {
        let found = Command::new("pgbench")
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("idempotency-pgbench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Self {
            url: url.to_owned(),
            schema: schema.to_owned(),
            dir: Arc::new(ScriptDir(dir)),
        })
    }

    /// A scenario running `script` (pgbench's script language) with `clients` clients and the
    /// `-D` variables `defines`.
    pub(crate) fn scenario(
        &self,
        name: &str,
        clients: u64,
        script: String,
        defines: Vec<(&'static str, String)>,
    ) -> Scenario {
        let file = self.dir.0.join(format!(
            "{}.sql",
            name.replace(|c: char| !c.is_alphanumeric(), "_")
        ));
        std::fs::write(&file, script).expect("pgbench script");
        let this = self.clone();
        let defines = Arc::new(defines);
        Scenario::external(
            format!("pgbench: {name}"),
            clients,
            Arc::new(move |slice| {
                let (this, file, defines) = (this.clone(), file.clone(), Arc::clone(&defines));
                Box::pin(async move {
                    tokio::task::spawn_blocking(move || this.run(&file, clients, slice, &defines))
                        .await
                        .expect("pgbench thread")
                })
            }),
        )
    }

    fn run(
        &self,
        script: &Path,
        clients: u64,
        slice: Duration,
        defines: &[(&'static str, String)],
    ) -> ExternalRun {
        // pgbench runs for whole seconds.
        let seconds = slice.as_secs_f64().round().max(1.0) as u64;
        let prefix = self.dir.0.join("log");
        let mut command = Command::new("pgbench");
        command
            .env("PGOPTIONS", format!("-c search_path={}", self.schema))
            .envs(UNENCRYPTED)
            .args(["-n", "-M", "prepared", "-l", "--log-prefix"])
            .arg(&prefix)
            .args([
                "-c",
                &clients.to_string(),
                "-j",
                &clients.min(2).to_string(),
            ])
            .args(["-T", &seconds.to_string(), "-f"])
            .arg(script);
        for (name, value) in defines {
            command.arg("-D").arg(format!("{name}={value}"));
        }
        let out = command.arg(&self.url).output().expect("pgbench runs");
        assert!(
            out.status.success(),
            "pgbench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut latencies = Vec::new();
        for entry in std::fs::read_dir(&self.dir.0).expect("pgbench logs") {
            let path = entry.expect("pgbench log").path();
            let is_log = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("log."));
            if !is_log {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("pgbench log");
            // client_id transaction_no time(µs) script_no time_epoch time_us
            latencies.extend(text.lines().filter_map(|line| {
                let micros: u64 = line.split_whitespace().nth(2)?.parse().ok()?;
                Some(Duration::from_micros(micros))
            }));
            std::fs::remove_file(&path).expect("pgbench log removed");
        }
        ExternalRun {
            latencies,
            elapsed: Duration::from_secs(seconds),
        }
    }
}

/// A statement of the store with its `$n` parameters replaced by pgbench variables (`:name`) or
/// literals, in order: `params[0]` is `$1`.
pub(crate) fn bind(sql: &str, params: &[Param]) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some((_, d)) = chars.peek().copied().filter(|(_, d)| d.is_ascii_digit()) {
            digits.push(d);
            chars.next();
        }
        let n: usize = digits.parse().expect("a $n parameter");
        match &params[n - 1] {
            Param::Var(name) => {
                out.push(':');
                out.push_str(name);
            }
            Param::Sql(literal) => out.push_str(literal),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Param, Pgbench, bind};

    #[test]
    fn parameters_become_variables_or_null() {
        let sql = "UPDATE t SET a = $2, b = $10::json, c = $1 WHERE d = $3";
        let mut params: Vec<Param> = (0..10).map(|_| Param::Var("x")).collect();
        params[0] = Param::Var("one");
        params[1] = Param::Sql("NULL");
        params[9] = Param::Var("ten");
        assert_eq!(
            bind(sql, &params),
            "UPDATE t SET a = NULL, b = :ten::json, c = :one WHERE d = :x"
        );
    }

    /// pgbench, run the bench's way, connects without TLS (`UNENCRYPTED`): the script divides
    /// by zero when its own connection is encrypted, which fails the run (on a server with
    /// `ssl = off` nothing can be encrypted, and it passes either way).
    #[test]
    fn pgbench_connects_without_tls_like_the_bench_client() {
        let pgbench = Pgbench::find(&idempotency_testing::database_url(), "public")
            .expect("pgbench is installed with the PostgreSQL server");
        let script = pgbench.dir.0.join("tls.sql");
        std::fs::write(
            &script,
            "SELECT 1 / (SELECT CASE WHEN ssl THEN 0 ELSE 1 END FROM pg_stat_ssl \
             WHERE pid = pg_backend_pid());\n",
        )
        .expect("script written");
        let run = pgbench.run(&script, 1, Duration::from_secs(1), &[]);
        assert!(!run.latencies.is_empty(), "pgbench ran the script");
    }
}
