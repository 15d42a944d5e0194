//! The command line, as clap parses it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// Operate an idempotency / outbox deployment: schema, keys, dead letters, partitions, cleanup.
///
/// Reads the service's configuration (`--config`, then the `IDEMPOTENCY__*` / `OUTBOX__*`
/// environment) and connects to `--database-url` (PostgreSQL, SQLite or MySQL/MariaDB).
///
/// Exit codes: 0 done; 1 the operation failed, or its report could not be written to stdout
/// (the command itself ran); 2 bad input or configuration (a malformed key
/// or id, an invalid table name, a command this database or configuration does not have);
/// 3 not found (key, dead letter); 4 refused (an in-progress key without --force, a key
/// that is no longer the claim --force named, not confirmed, a requeue out of order); 5 `schema validate` found problems; 6 the database
/// cannot be reached.
#[derive(Debug, Parser)]
#[command(name = "idempotency", version, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options of every command.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// The service's YAML configuration file (`idempotency.*`, `outbox.*`; other sections are
    /// ignored). The environment overrides it.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// postgres://…, sqlite:…, mysql://… or mariadb://…
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub(crate) database_url: Option<String>,
    /// Machine-readable JSON on stdout instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Do not ask before a change.
    #[arg(long, short = 'y', global = true)]
    pub(crate) yes: bool,
    /// Show what would change, change nothing.
    #[arg(long, global = true)]
    pub(crate) dry_run: bool,
    /// Who makes the changes, for the audit log (default: $USER).
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) actor: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The tables' DDL for the configured names; create them; check them.
    #[command(subcommand)]
    Schema(SchemaCommand),
    /// One key's record; evict it; count the records.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// The outbox: status, dead letters, purge, partitions.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Delete expired records and the outbox rows past retention.
    #[command(subcommand)]
    Cleanup(CleanupCommand),
}

/// The inbox table, which the consumer configures (not part of the service's settings).
#[derive(Debug, Args)]
pub(crate) struct InboxArg {
    /// Include this inbox table.
    #[arg(long, value_name = "TABLE")]
    pub(crate) inbox_table: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SchemaCommand {
    /// Print the DDL of every configured table.
    Print(InboxArg),
    /// Create the configured tables (`CREATE … IF NOT EXISTS`; safe to run again).
    Apply(InboxArg),
    /// Compare the live tables with the canonical schema; exit 5 listing every problem.
    Validate(InboxArg),
}

/// One key.
#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    /// The operation, as the service names it: `POST:/charges` (a route behind
    /// `IdempotencyLayer`) or `CREATE_PAYMENT`.
    pub(crate) operation: String,
    /// The client's Idempotency-Key.
    pub(crate) key: String,
    /// The scope (tenant or principal) the key belongs to; empty when the service has none.
    #[arg(long, default_value = "")]
    pub(crate) scope: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Status, times, fingerprint, outcome size and a preview of one key.
    Show(KeyArgs),
    /// Delete one key's record (and its Redis entry) so that its next request runs again.
    Evict {
        #[command(flatten)]
        key: KeyArgs,
        /// Evict a PROCESSING record (its holder may still be running): only the claim read
        /// now (its lease token, shown in the question), or the one --claim names; not one
        /// taken over since, nor the outcome of one that settled since.
        #[arg(long)]
        force: bool,
        /// With --force, the lease token of the claim to end, as `keys show` printed it: the
        /// eviction is refused (exit 4) when another claim holds the key by then.
        #[arg(long, value_name = "TOKEN", requires = "force")]
        claim: Option<i64>,
    },
    /// Records by operation and status, the oldest, the expired not cleaned yet.
    Stats,
}

#[derive(Debug, Subcommand)]
pub(crate) enum OutboxCommand {
    /// Pending, oldest pending age, leased, dead letters, aggregates held up.
    Status,
    /// Dead letters: list, show, requeue, discard.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Delete published rows (and, when asked, dead letters) older than an age.
    Purge {
        /// Published rows older than this (default: outbox.retention.published).
        #[arg(long, value_parser = duration, value_name = "AGE")]
        older_than: Option<Duration>,
        /// Also dead letters older than this (default: none are deleted).
        #[arg(long, value_parser = duration, value_name = "AGE")]
        dead_lettered_older_than: Option<Duration>,
    },
    /// The partitions of a time-partitioned outbox (PostgreSQL).
    #[command(subcommand)]
    Partitions(PartitionsCommand),
}

/// Which dead letters.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct Filter {
    /// Only this aggregate type.
    #[arg(long)]
    pub(crate) aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    pub(crate) aggregate_id: Option<String>,
    /// Only this event type.
    #[arg(long)]
    pub(crate) event_type: Option<String>,
}

/// Dead letters by id, by filter or all.
#[derive(Debug, Args)]
pub(crate) struct Selection {
    /// Dead letter ids (UUIDs).
    pub(crate) ids: Vec<String>,
    #[command(flatten)]
    pub(crate) filter: Filter,
    /// Every dead letter (with a filter: every one matching it).
    #[arg(long)]
    pub(crate) all: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// The oldest dead letters with their last error.
    List {
        #[command(flatten)]
        filter: Filter,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One dead letter, payload and headers included.
    Show {
        /// The dead letter's id.
        id: String,
    },
    /// Put dead letters back to pending (due now, attempts reset).
    Requeue(Selection),
    /// Delete dead letters.
    Discard(Selection),
}

#[derive(Debug, Subcommand)]
pub(crate) enum PartitionsCommand {
    /// The partitions and their bounds.
    List,
    /// Create the partitions of the current and the next `partitioning.ahead` intervals.
    Create,
    /// Drop the partitions every row of which retention would delete.
    DropExpired,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CleanupCommand {
    /// Run cleanup once now.
    Run,
}

fn duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}
