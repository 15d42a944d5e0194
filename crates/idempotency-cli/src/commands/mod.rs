//! The commands, generic over the database ([`AdminDatabase`]).

mod keys;
mod outbox;
mod schema;

use std::io::{BufRead, IsTerminal, Write};

use idempotency::Settings;
use idempotency::ops::{Actor, AdminDatabase, Operations};
use idempotency::outbox::config::InboxConfig;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{CleanupCommand, Command, Global, OutboxCommand, SchemaCommand};
use crate::error::CliError;

pub(crate) use schema::print as schema_print;

/// Where results go: tables for people, or one JSON document for scripts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Out {
    json: bool,
}

impl Out {
    pub(crate) fn new(global: &Global) -> Self {
        Self { json: global.json }
    }

    /// Prints `json()` with `--json`, else `human()`. A reader that went away (`| head`) ends
    /// the output quietly; any other write failure (a full disk) is an error, so that a
    /// script does not take a missing or cut report for the command's.
    pub(crate) fn emit(
        &self,
        human: impl FnOnce() -> String,
        json: impl FnOnce() -> serde_json::Value,
    ) -> Result<(), CliError> {
        let text = if self.json {
            serde_json::to_string_pretty(&json()).unwrap_or_default()
        } else {
            human()
        };
        let mut stdout = std::io::stdout().lock();
        match writeln!(stdout, "{}", text.trim_end()).and_then(|()| stdout.flush()) {
            Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(CliError::Output(error))
            }
            _ => Ok(()),
        }
    }
}

/// A table with a header row.
pub(crate) fn table<const N: usize>(
    header: [&str; N],
    rows: impl IntoIterator<Item = [String; N]>,
) -> String {
    let mut table = comfy_table::Table::new();
    table
        .load_style(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_header(header);
    for row in rows {
        table.add_row(row.map(printable));
    }
    table.to_string()
}

/// A cell as the terminal gets it: every control character but the line break written as its
/// escape (`\u{1b}`). Error texts, payloads and keys come from outside: an escape sequence in
/// one could retitle the window, move the cursor or hide the rows after it.
fn printable(cell: String) -> String {
    let control = |c: char| c.is_control() && c != '\n';
    if !cell.chars().any(control) {
        return cell;
    }
    cell.chars()
        .map(|c| {
            if control(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `None` as `-`.
pub(crate) fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

/// Asks before a change unless `--yes`; refuses when nobody can answer.
pub(crate) fn confirm(global: &Global, question: &str) -> Result<(), CliError> {
    if global.yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(CliError::Refused(format!(
            "{question} not confirmed: stdin is not a terminal; pass --yes to run without asking \
             (nothing changed)"
        )));
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Refused(format!("{question} not confirmed: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(CliError::Refused(format!(
            "{question} not confirmed (nothing changed)"
        )))
    }
}

/// A progress bar on stderr for `total` rows (hidden when stderr is not a terminal).
pub(crate) fn progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} ({per_sec}, eta {eta})")
    {
        bar.set_style(style);
    }
    bar.set_message(what.to_owned());
    bar
}

/// Who the audit log names.
fn actor(global: &Global) -> Actor {
    let name = global
        .actor
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned());
    Actor::new(format!("cli:{name}"))
}

fn inbox(command: &Command) -> Option<InboxConfig> {
    let Command::Schema(
        SchemaCommand::Print(arg) | SchemaCommand::Apply(arg) | SchemaCommand::Validate(arg),
    ) = command
    else {
        return None;
    };
    arg.inbox_table.as_ref().map(|table| InboxConfig {
        table_name: table.clone(),
        ..InboxConfig::default()
    })
}

/// Runs `command` on `pool`'s tables.
pub(crate) async fn run<D: AdminDatabase>(
    pool: D,
    settings: &Settings,
    global: &Global,
    command: &Command,
) -> Result<(), CliError> {
    let mut ops = Operations::new(pool, settings, actor(global)).await?;
    if let Some(inbox) = inbox(command) {
        ops = ops.with_inbox(inbox);
    }
    let out = Out::new(global);
    match command {
        Command::Schema(SchemaCommand::Print(_)) => schema::print_ops(&ops, out),
        Command::Schema(SchemaCommand::Apply(_)) => schema::apply(&ops, global, out).await,
        Command::Schema(SchemaCommand::Validate(_)) => schema::validate(&ops, out).await,
        Command::Keys(command) => keys::run(&ops, global, out, command).await,
        Command::Outbox(OutboxCommand::Status) => outbox::status(&ops, out).await,
        Command::Outbox(OutboxCommand::Dead(command)) => {
            outbox::dead(&ops, global, out, command).await
        }
        Command::Outbox(OutboxCommand::Purge {
            older_than,
            dead_lettered_older_than,
        }) => outbox::purge(&ops, global, out, *older_than, *dead_lettered_older_than).await,
        Command::Outbox(OutboxCommand::Partitions(command)) => {
            outbox::partitions(&ops, global, out, command).await
        }
        Command::Cleanup(CleanupCommand::Run) => outbox::cleanup(&ops, global, out).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An escape sequence in a cell (a broker's error text, a payload) reaches the terminal as
    /// text, not as a command; line breaks stay.
    #[test]
    fn control_characters_in_a_cell_are_written_as_escapes() {
        let shown = table(
            ["last error"],
            [["refused\u{1b}]0;owned\u{7}\u{9b}2J\r\nnext line".to_owned()]],
        );
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{shown:?}"
        );
        assert!(shown.contains("\\u{1b}]0;owned\\u{7}"), "{shown}");
        assert!(shown.contains("next line"), "{shown}");
    }
}
