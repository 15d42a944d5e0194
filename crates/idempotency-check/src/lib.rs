//! A randomized adversarial checker for the workspace.
//!
//! A seed generates a history's plan ([`plan`]): concurrent clients on a small key space,
//! retries with the same key, the same key with another payload, resource or tenant, handlers
//! that succeed, reject, fail or run long, and faults (a client that drops its request at a
//! random point, a caller that commits after an error, holders that outlive their lease). A
//! subject runs the plan against real servers and records what each client saw ([`history`]);
//! the effects are recorded where they really happen (a side table written in the business
//! transaction; in leased mode a log outside the database). Every history is then held against
//! the named [`invariants`]. The same seed replays the same plan; the timing is the run's own.
//!
//! ```no_run
//! # async fn demo() -> Result<(), idempotency_check::CheckError> {
//! use idempotency_check::{Ctx, Subject, check};
//!
//! let subject: Subject = "layer-pg".parse()?;
//! let report = check(subject, 42, &Ctx::new()).await?;
//! assert!(report.violations.is_empty(), "{report}");
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use idempotency_mysql::MysqlStore;
use idempotency_pg::PgStore;
use idempotency_sqlite::SqliteStore;

pub mod backend;
pub mod cache_wire;
pub mod faults;
pub mod history;
pub mod invariants;
pub mod plan;
pub mod subjects;

pub use invariants::{INVARIANTS, Violation};
pub use subjects::Ctx;

use faults::Faults;
use history::Entry;
use plan::{Plan, Shape};

/// Why a run could not be made (not a violation: the environment failed).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Setting up the store, the caches or a request failed.
    #[error("setup: {0}")]
    Setup(String),
    /// Reading the effects or the pool back failed.
    #[error("database: {0}")]
    Database(String),
    /// A client task panicked or was cancelled.
    #[error("client: {0}")]
    Client(String),
    /// A subject's name is not one of [`SUBJECTS`].
    #[error("unknown subject `{0}`; known: {known}", known = SUBJECTS.join(", "))]
    UnknownSubject(String),
}

/// What runs the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The service: `execute_in` in a caller's transaction (two keys per transaction at
    /// times) and `execute` in its own, or (a seed in three) `execute_optimistic` throughout.
    Service,
    /// `IdempotencyLayer` in transactional mode, claim-first or (a seed in three) optimistic.
    Layer,
    /// `IdempotencyLayer` in leased mode (PostgreSQL and SQLite: MySQL has no leases).
    Leased,
    /// The outbox: enqueue, relay (ordered), inbox.
    Outbox,
}

/// The database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// PostgreSQL (`DATABASE_URL`), a schema of the run's own.
    Postgres,
    /// SQLite, a file of the run's own.
    Sqlite,
    /// MySQL / MariaDB (`MYSQL_URL`), a database of the run's own.
    Mysql,
}

/// A subject: a mode on a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subject {
    /// What runs the history.
    pub mode: Mode,
    /// On which database.
    pub database: Database,
}

/// Every subject, by name.
pub const SUBJECTS: &[&str] = &[
    "service-pg",
    "service-sqlite",
    "service-mysql",
    "layer-pg",
    "layer-sqlite",
    "layer-mysql",
    "leased-pg",
    "leased-sqlite",
    "outbox-pg",
    "outbox-sqlite",
    "outbox-mysql",
];

impl FromStr for Subject {
    type Err = CheckError;

    fn from_str(name: &str) -> Result<Self, CheckError> {
        let unknown = || CheckError::UnknownSubject(name.to_owned());
        let (mode, database) = name.split_once('-').ok_or_else(unknown)?;
        let mode = match mode {
            "service" => Mode::Service,
            "layer" => Mode::Layer,
            "leased" => Mode::Leased,
            "outbox" => Mode::Outbox,
            _ => return Err(unknown()),
        };
        let database = match database {
            "pg" => Database::Postgres,
            "sqlite" => Database::Sqlite,
            "mysql" if mode != Mode::Leased => Database::Mysql,
            _ => return Err(unknown()),
        };
        Ok(Self { mode, database })
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            Mode::Service => "service",
            Mode::Layer => "layer",
            Mode::Leased => "leased",
            Mode::Outbox => "outbox",
        };
        let database = match self.database {
            Database::Postgres => "pg",
            Database::Sqlite => "sqlite",
            Database::Mysql => "mysql",
        };
        write!(f, "{mode}-{database}")
    }
}

impl Subject {
    /// The plan's sizes for this subject.
    pub fn shape(self) -> Shape {
        match self.mode {
            Mode::Service => Shape {
                clients: 6,
                ops_per_client: 12,
                keys: 4,
                slow_ms: 80,
                commit_after_error: true,
                second_keys: true,
                entry_points: true,
                opt_in_header: false,
                caught: false,
                takeovers: false,
                optimistic_layer: false,
            },
            Mode::Layer => Shape {
                clients: 6,
                ops_per_client: 12,
                keys: 4,
                slow_ms: 80,
                commit_after_error: false,
                second_keys: false,
                entry_points: false,
                opt_in_header: true,
                caught: true,
                takeovers: false,
                optimistic_layer: true,
            },
            Mode::Outbox => Shape {
                clients: 6,
                ops_per_client: 15,
                keys: 4,
                slow_ms: 40,
                commit_after_error: false,
                second_keys: false,
                entry_points: false,
                opt_in_header: false,
                caught: false,
                takeovers: false,
                optimistic_layer: false,
            },
            // Slow handlers run up to twice the lease: takeovers, late completions; failing
            // handlers release keys that a stale holder then races a new claim for.
            Mode::Leased => Shape {
                clients: 5,
                ops_per_client: 8,
                keys: 3,
                slow_ms: 600,
                commit_after_error: false,
                second_keys: false,
                entry_points: false,
                opt_in_header: true,
                caught: false,
                takeovers: true,
                optimistic_layer: false,
            },
        }
    }
}

/// A history and what broke in it.
#[derive(Debug)]
pub struct Run {
    /// Every operation and what its client saw, in operation order.
    pub entries: Vec<Entry>,
    /// The broken invariants (empty: the history holds).
    pub violations: Vec<Violation>,
}

impl Run {
    pub(crate) fn new(
        entries: Vec<Entry>,
        mut violations: Vec<Violation>,
        unclean: Vec<String>,
    ) -> Self {
        violations.extend(invariants::pool(unclean));
        Self {
            entries,
            violations,
        }
    }
}

/// One checked history: the seed, the subject, the plan's settings and the outcome.
#[derive(Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The subject.
    pub subject: Subject,
    /// The plan it ran.
    pub plan: Plan,
    /// The history.
    pub entries: Vec<Entry>,
    /// The broken invariants.
    pub violations: Vec<Violation>,
    /// The faults injected, by kind.
    pub faults: [(&'static str, usize); faults::KINDS.len()],
}

impl Report {
    /// How many operations ran.
    pub fn operations(&self) -> usize {
        self.entries.len()
    }

    /// The plan's settings beyond caches, in-flight policy and lookup, as the report prints
    /// them after those (empty when there are none).
    pub fn settings(&self) -> String {
        let mut settings = String::new();
        // The outbox subjects have no caches.
        if let Some(redis) = self
            .plan
            .redis
            .filter(|_| self.subject.mode != Mode::Outbox)
        {
            settings.push_str(" redis ");
            settings.push_str(redis.name());
        }
        if self.subject.mode == Mode::Layer && self.plan.optimistic {
            settings.push_str(" optimistic");
        }
        if self.subject.mode == Mode::Service {
            settings.push_str(if self.plan.optimistic {
                " entry execute_optimistic"
            } else {
                " entry execute_in+execute"
            });
        }
        settings
    }

    /// The faults this history really had, by kind, counted where they were injected (see
    /// [`faults`]).
    pub fn faults_by_kind(&self) -> [(&'static str, usize); faults::KINDS.len()] {
        self.faults
    }

    /// How many faults this history really had.
    pub fn faults_injected(&self) -> usize {
        self.faults.iter().map(|(_, n)| n).sum()
    }
}

impl fmt::Display for Report {
    /// The seed and subject, the violations, and the history of the keys they concern.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} subject {} caches {} in-flight {} lookup {}{}: {} operations, {} faults, {} violations",
            self.seed,
            self.subject,
            self.plan.caches.name(),
            if self.plan.wait { "wait" } else { "reject" },
            self.plan.lookup,
            self.settings(),
            self.operations(),
            self.faults_injected(),
            self.violations.len()
        )?;
        for violation in &self.violations {
            writeln!(f, "  VIOLATION {violation}")?;
        }
        let groups: Vec<_> = self
            .violations
            .iter()
            .filter_map(|v| v.group.clone())
            .collect();
        if !self.violations.is_empty() {
            writeln!(f, "  history of the keys concerned:")?;
            for entry in &self.entries {
                let concerned = groups.is_empty()
                    || entry.answers.iter().any(|(key, _)| {
                        groups.contains(&(format!("t{}", entry.op.variant.tenant), *key))
                    });
                if concerned {
                    writeln!(f, "    {entry}")?;
                }
            }
            writeln!(
                f,
                "  replay: scripts/check.sh --seed {} --subject {}",
                self.seed, self.subject
            )?;
        }
        Ok(())
    }
}

/// Generates the plan of `seed` for `subject`, runs it, and checks the history.
pub async fn check(subject: Subject, seed: u64, ctx: &Ctx) -> Result<Report, CheckError> {
    let plan = Plan::generate(seed, subject.shape());
    let faults = Arc::new(Faults::default());
    let ctx = &ctx.with_faults(Arc::clone(&faults));
    let run = match (subject.mode, subject.database) {
        (Mode::Service, Database::Postgres) => subjects::service::run::<PgStore>(&plan, ctx).await,
        (Mode::Service, Database::Sqlite) => {
            subjects::service::run::<SqliteStore>(&plan, ctx).await
        }
        (Mode::Service, Database::Mysql) => subjects::service::run::<MysqlStore>(&plan, ctx).await,
        (Mode::Layer, Database::Postgres) => {
            subjects::layer::run_transactional::<PgStore>(&plan, ctx).await
        }
        (Mode::Layer, Database::Sqlite) => {
            subjects::layer::run_transactional::<SqliteStore>(&plan, ctx).await
        }
        (Mode::Layer, Database::Mysql) => {
            subjects::layer::run_transactional::<MysqlStore>(&plan, ctx).await
        }
        (Mode::Leased, Database::Postgres) => {
            subjects::layer::run_leased::<PgStore>(&plan, ctx).await
        }
        (Mode::Leased, Database::Sqlite) => {
            subjects::layer::run_leased::<SqliteStore>(&plan, ctx).await
        }
        (Mode::Outbox, Database::Postgres) => {
            subjects::outbox::run::<subjects::outbox::PgDb>(&plan, ctx).await
        }
        (Mode::Outbox, Database::Sqlite) => {
            subjects::outbox::run::<subjects::outbox::SqliteDb>(&plan, ctx).await
        }
        (Mode::Outbox, Database::Mysql) => {
            subjects::outbox::run::<subjects::outbox::MysqlDb>(&plan, ctx).await
        }
        (Mode::Leased, Database::Mysql) => {
            return Err(CheckError::UnknownSubject(subject.to_string()));
        }
    }?;
    Ok(Report {
        seed,
        subject,
        plan,
        entries: run.entries,
        violations: run.violations,
        faults: faults.by_kind(),
    })
}
