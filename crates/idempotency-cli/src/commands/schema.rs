//! `schema print | apply | validate`.

use idempotency::Settings;
use idempotency::ops::{AdminDatabase, Operations, TableDdl};
use idempotency::outbox::config::InboxConfig;
use serde_json::json;

use super::Out;
use crate::cli::Global;
use crate::error::CliError;

fn render(tables: &[TableDdl]) -> String {
    tables
        .iter()
        .map(|t| {
            format!(
                "-- {} table {}\n{}\n",
                t.kind.as_str(),
                t.table,
                t.sql.trim_end()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn as_json(tables: &[TableDdl]) -> serde_json::Value {
    json!(
        tables
            .iter()
            .map(|t| json!({ "kind": t.kind.as_str(), "table": t.table, "sql": t.sql }))
            .collect::<Vec<_>>()
    )
}

/// `schema print` without a connection.
pub(crate) fn print<D: AdminDatabase>(
    settings: &Settings,
    inbox: Option<&str>,
    global: &Global,
) -> Result<(), CliError> {
    let inbox = inbox.map(|table| InboxConfig {
        table_name: table.to_owned(),
        ..InboxConfig::default()
    });
    let tables = D::ddl(settings, inbox.as_ref())?;
    Out::new(global).emit(|| render(&tables), || as_json(&tables))?;
    Ok(())
}

pub(super) fn print_ops<D: AdminDatabase>(ops: &Operations<D>, out: Out) -> Result<(), CliError> {
    let tables = ops.schema_ddl()?;
    out.emit(|| render(&tables), || as_json(&tables))?;
    Ok(())
}

pub(super) async fn apply<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
) -> Result<(), CliError> {
    if global.dry_run {
        let tables = ops.schema_ddl()?;
        out.emit(
            || format!("dry run: would run\n\n{}", render(&tables)),
            || json!({ "dry_run": true, "tables": as_json(&tables) }),
        )?;
        return Ok(());
    }
    let tables = ops.schema_apply().await?;
    out.emit(
        || {
            tables
                .iter()
                .map(|t| {
                    format!(
                        "{} table {}: created or already there",
                        t.kind.as_str(),
                        t.table
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        },
        || json!({ "applied": as_json(&tables) }),
    )?;
    Ok(())
}

pub(super) async fn validate<D: AdminDatabase>(
    ops: &Operations<D>,
    out: Out,
) -> Result<(), CliError> {
    let tables = ops.schema_validate().await?;
    let count: usize = tables.iter().map(|t| t.problems.len()).sum();
    out.emit(
        || {
            let mut text = String::new();
            for t in &tables {
                if t.problems.is_empty() {
                    text.push_str(&format!("{} table {}: ok\n", t.kind.as_str(), t.table));
                } else {
                    text.push_str(&format!(
                        "{} table {}: {} problem(s)\n",
                        t.kind.as_str(),
                        t.table,
                        t.problems.len()
                    ));
                    for problem in &t.problems {
                        text.push_str(&format!("  - {problem}\n"));
                    }
                }
            }
            text
        },
        || {
            json!({
                "ok": count == 0,
                "tables": tables.iter().map(|t| json!({
                    "kind": t.kind.as_str(), "table": t.table, "problems": t.problems,
                })).collect::<Vec<_>>(),
            })
        },
    )?;
    if count > 0 {
        return Err(CliError::SchemaProblems(count));
    }
    Ok(())
}
