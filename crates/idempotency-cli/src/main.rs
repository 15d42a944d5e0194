#![doc = include_str!("../README.md")]
// A command line prints: its results on stdout, questions and errors on stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cli;
mod commands;
mod error;
mod setup;

use std::process::ExitCode;

use clap::Parser;
use idempotency::sqlx;

use crate::cli::{Cli, Command, SchemaCommand};
use crate::error::CliError;
use crate::setup::Backend;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return not_parsed(&error),
    };
    logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error::chain(&error));
            error.code()
        }
    }
}

/// clap's answer when it runs no command: help and version on stdout (exit 0), a usage error
/// on stderr (exit 2). A write that fails (a full disk) exits 1, as a lost report does; a
/// reader that went away (`| head`) is no failure.
fn not_parsed(error: &clap::Error) -> ExitCode {
    let written = error
        .print()
        .and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("error: cannot write to standard output: {e}");
            ExitCode::FAILURE
        }
        _ => ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2)),
    }
}

async fn run(cli: &Cli) -> Result<(), CliError> {
    let settings = setup::settings(cli.global.config.as_deref())?;
    let url = cli.global.database_url.as_deref().ok_or_else(|| {
        CliError::Usage("no database: pass --database-url or set DATABASE_URL".to_owned())
    })?;
    let backend = Backend::of(url)?;
    // `schema print` needs no connection: it only renders the configured names.
    if let Command::Schema(SchemaCommand::Print(inbox)) = &cli.command {
        let inbox = inbox.inbox_table.as_deref();
        return match backend {
            Backend::Postgres => {
                commands::schema_print::<sqlx::PgPool>(&settings, inbox, &cli.global)
            }
            Backend::Sqlite => {
                commands::schema_print::<sqlx::SqlitePool>(&settings, inbox, &cli.global)
            }
            Backend::Mysql => {
                commands::schema_print::<sqlx::MySqlPool>(&settings, inbox, &cli.global)
            }
        };
    }
    let (global, command) = (&cli.global, &cli.command);
    match backend {
        Backend::Postgres => {
            let pool = setup::postgres(url).await?;
            commands::run(pool, &settings, global, command).await
        }
        Backend::Sqlite => {
            let create =
                matches!(command, Command::Schema(SchemaCommand::Apply(_))) && !global.dry_run;
            let pool = setup::sqlite(url, create).await?;
            let result = commands::run(pool.clone(), &settings, global, command).await;
            let _ = idempotency::sqlite::close_pool(&pool).await;
            result
        }
        Backend::Mysql => {
            let pool = setup::mysql(url).await?;
            commands::run(pool, &settings, global, command).await
        }
    }
}

/// Warnings on stderr, `RUST_LOG` choosing otherwise; and, through a layer of its own that
/// `RUST_LOG` does not filter, the audit trail (target `idempotency::audit`): no `RUST_LOG`
/// value silences the record of a change.
fn logging() {
    use tracing_subscriber::filter::{EnvFilter, FilterExt, Targets, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, fmt};

    let audit = idempotency::ops::AUDIT_TARGET;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let chosen = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let others = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_filter(chosen.and(filter_fn(move |metadata| metadata.target() != audit)));
    let trail = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_filter(Targets::new().with_target(audit, tracing::Level::INFO));
    tracing_subscriber::registry()
        .with(others)
        .with(trail)
        .init();
}
