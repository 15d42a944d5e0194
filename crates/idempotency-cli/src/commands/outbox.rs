//! `outbox status | dead … | purge | partitions …` and `cleanup run`.

use std::time::Duration;

use idempotency::ops::{AdminDatabase, DeadLetterJson, Operations, OutboxStatusJson, rfc3339};
use idempotency::outbox::admin::DeadLetterFilter;
use idempotency::outbox::uuid::Uuid;
use serde_json::json;

use super::{Out, confirm, or_dash, progress, table};
use crate::cli::{DeadCommand, Filter, Global, PartitionsCommand, Selection};
use crate::error::CliError;

pub(super) async fn status<D: AdminDatabase>(
    ops: &Operations<D>,
    out: Out,
) -> Result<(), CliError> {
    let s = ops.outbox_status().await?;
    out.emit(
        || {
            table(
                ["", ""],
                [
                    ["pending".to_owned(), s.pending.to_string()],
                    [
                        "oldest pending age".to_owned(),
                        humantime::format_duration(Duration::from_secs(
                            s.oldest_pending_age as u64,
                        ))
                        .to_string(),
                    ],
                    ["leased (in flight)".to_owned(), s.leased.to_string()],
                    ["dead letters".to_owned(), s.dead_lettered.to_string()],
                    [
                        "aggregates with a dead letter".to_owned(),
                        s.dead_letter_aggregates.to_string(),
                    ],
                    [
                        "aggregates blocked behind a failing head".to_owned(),
                        s.blocked_aggregates.to_string(),
                    ],
                ],
            )
        },
        || json!(OutboxStatusJson::from(&s)),
    )?;
    Ok(())
}

fn filter(args: &Filter) -> DeadLetterFilter {
    let mut filter = DeadLetterFilter::default();
    if let Some(v) = &args.aggregate_type {
        filter = filter.aggregate_type(v);
    }
    if let Some(v) = &args.aggregate_id {
        filter = filter.aggregate_id(v);
    }
    if let Some(v) = &args.event_type {
        filter = filter.event_type(v);
    }
    filter
}

fn parse_id(text: &str) -> Result<Uuid, CliError> {
    Uuid::parse_str(text)
        .map_err(|e| CliError::Usage(format!("dead letter id {text:?} is not a UUID: {e}")))
}

pub(super) async fn dead<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    command: &DeadCommand,
) -> Result<(), CliError> {
    match command {
        DeadCommand::List { filter: f, limit } => {
            let letters = ops.dead_letters(&filter(f), *limit).await?;
            out.emit(
                || {
                    table(
                        [
                            "id",
                            "aggregate",
                            "event",
                            "attempts",
                            "dead since",
                            "last error",
                        ],
                        letters.iter().map(|d| {
                            let m = &d.message;
                            [
                                m.id.to_string(),
                                format!("{}/{}", m.aggregate_type, m.aggregate_id),
                                m.event_type.clone(),
                                m.attempts.to_string(),
                                d.dead_lettered_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
                                or_dash(d.last_error.clone()),
                            ]
                        }),
                    )
                },
                || {
                    json!(
                        letters
                            .iter()
                            .map(DeadLetterJson::summary)
                            .collect::<Vec<_>>()
                    )
                },
            )?;
            Ok(())
        }
        DeadCommand::Show { id } => {
            let id = parse_id(id)?;
            let Some(d) = ops.dead_letter(id).await? else {
                return Err(CliError::NotFound(format!("no dead letter with id {id}")));
            };
            out.emit(
                || {
                    let m = &d.message;
                    table(
                        ["field", "value"],
                        [
                            ["id".to_owned(), m.id.to_string()],
                            [
                                "aggregate".to_owned(),
                                format!("{}/{}", m.aggregate_type, m.aggregate_id),
                            ],
                            [
                                "sequence".to_owned(),
                                or_dash(m.sequence.map(|s| s.to_string())),
                            ],
                            ["event".to_owned(), m.event_type.clone()],
                            ["attempts".to_owned(), m.attempts.to_string()],
                            ["created".to_owned(), m.created_at.to_rfc3339()],
                            ["dead since".to_owned(), d.dead_lettered_at.to_rfc3339()],
                            ["last error".to_owned(), or_dash(d.last_error.clone())],
                            [
                                "headers".to_owned(),
                                serde_json::to_string(&m.headers).unwrap_or_default(),
                            ],
                            ["payload".to_owned(), m.payload.clone()],
                        ],
                    )
                },
                || json!(DeadLetterJson::full(&d)),
            )?;
            Ok(())
        }
        DeadCommand::Requeue(selection) => {
            change(ops, global, out, selection, Change::Requeue).await
        }
        DeadCommand::Discard(selection) => {
            change(ops, global, out, selection, Change::Discard).await
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Change {
    Requeue,
    Discard,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::Discard => "discard",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Self::Requeue => "requeued",
            Self::Discard => "discarded",
        }
    }
}

/// The ids a selection names: each given id must be a dead letter (checked before anything
/// changes), or every dead letter matching the filter.
async fn select<D: AdminDatabase>(
    ops: &Operations<D>,
    selection: &Selection,
) -> Result<Vec<Uuid>, CliError> {
    let filter = filter(&selection.filter);
    match (selection.ids.is_empty(), selection.all, filter.is_empty()) {
        (false, false, true) => {
            let ids = selection
                .ids
                .iter()
                .map(|id| parse_id(id))
                .collect::<Result<Vec<_>, _>>()?;
            for id in &ids {
                if ops.dead_letter(*id).await?.is_none() {
                    return Err(CliError::NotFound(format!(
                        "no dead letter with id {id} (nothing changed)"
                    )));
                }
            }
            Ok(ids)
        }
        (false, _, _) => Err(CliError::Usage(
            "give dead letter ids, or a filter / --all, not both".to_owned(),
        )),
        (true, false, true) => Err(CliError::Usage(
            "name the dead letters: their ids, a filter (--aggregate-type, --aggregate-id, \
             --event-type), or --all"
                .to_owned(),
        )),
        (true, _, _) => Ok(ops.dead_letter_ids(&filter).await?),
    }
}

async fn change<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    selection: &Selection,
    change: Change,
) -> Result<(), CliError> {
    let ids = select(ops, selection).await?;
    let verb = change.verb();
    if global.dry_run || ids.is_empty() {
        out.emit(
            || {
                let mut text = format!(
                    "{}would {verb} {} dead letter(s)",
                    if global.dry_run { "dry run: " } else { "" },
                    ids.len()
                );
                for id in ids.iter().take(20) {
                    text.push_str(&format!("\n  {id}"));
                }
                if ids.len() > 20 {
                    text.push_str(&format!("\n  … and {} more", ids.len() - 20));
                }
                text
            },
            || {
                json!({
                    "dry_run": global.dry_run, "action": verb, "count": ids.len(),
                    "ids": ids.iter().map(Uuid::to_string).collect::<Vec<_>>(),
                })
            },
        )?;
        return Ok(());
    }
    confirm(global, &format!("{verb} {} dead letter(s)?", ids.len()))?;
    let bar = progress(ids.len() as u64, verb);
    let done = match change {
        Change::Requeue => ops.requeue(&ids, |n| bar.inc(n)).await,
        Change::Discard => ops.discard(&ids, |n| bar.inc(n)).await,
    };
    bar.finish_and_clear();
    let done = done.map_err(|e| match e {
        idempotency::ops::OpsError::Outbox(idempotency::outbox::Error::RequeueOutOfOrder {
            ids,
        }) => CliError::Refused(format!(
            "requeue refused: the aggregates of {} already published a later event, so these \
             would be published out of order: {}",
            ids.len(),
            ids.iter()
                .map(Uuid::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        other => other.into(),
    })?;
    out.emit(
        || format!("{} {done} dead letter(s)", change.done()),
        || json!({ "action": verb, "count": done }),
    )?;
    Ok(())
}

pub(super) async fn purge<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    older_than: Option<Duration>,
    dead_lettered: Option<Duration>,
) -> Result<(), CliError> {
    if dead_lettered.is_some_and(|age| age.is_zero()) {
        return Err(CliError::Usage(
            "--dead-lettered-older-than 0s would delete every dead letter (committed events \
             never delivered) whatever its age; give an age, as retention.dead-lettered must be"
                .to_owned(),
        ));
    }
    let published = match older_than {
        Some(age) => age,
        None => {
            ops.settings()
                .outbox
                .as_ref()
                .ok_or(idempotency::ops::OpsError::NoOutbox)?
                .retention
                .published
        }
    };
    let counts = ops.expired_counts(published, dead_lettered).await?;
    let age = humantime::format_duration(published).to_string();
    // Both ages, as parsed (`6m` is six minutes): what the question and the dry run are about.
    let dead_age = dead_lettered.map(|age| humantime::format_duration(age).to_string());
    let dead_text = match &dead_age {
        Some(dead_age) => format!(
            "{} dead letter(s) dead-lettered more than {dead_age} ago",
            counts.dead_lettered
        ),
        None => "no dead letter".to_owned(),
    };
    if global.dry_run {
        out.emit(
            || {
                format!(
                    "dry run: would delete {} row(s) published more than {age} ago and \
                     {dead_text}",
                    counts.published
                )
            },
            || {
                json!({ "dry_run": true, "published": counts.published,
                        "dead_lettered": counts.dead_lettered,
                        "published_older_than": age,
                        "dead_lettered_older_than": dead_age })
            },
        )?;
        return Ok(());
    }
    confirm(
        global,
        &format!(
            "Delete {} row(s) published more than {age} ago and {dead_text}?",
            counts.published
        ),
    )?;
    let bar = progress(counts.published + counts.dead_lettered, "purge");
    let report = ops.purge(published, dead_lettered, |n| bar.inc(n)).await;
    bar.finish_and_clear();
    let report = report?;
    out.emit(
        || {
            format!(
                "deleted {} published row(s) and {} dead letter(s)",
                report.published, report.dead_lettered
            )
        },
        || json!({ "published": report.published, "dead_lettered": report.dead_lettered }),
    )?;
    Ok(())
}

pub(super) async fn partitions<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    command: &PartitionsCommand,
) -> Result<(), CliError> {
    let list = ops.partitions().await?;
    let show = |list: &[idempotency::ops::Partition]| {
        table(
            ["partition", "from", "to"],
            list.iter().map(|p| {
                [
                    p.name.clone(),
                    if p.default {
                        "DEFAULT".to_owned()
                    } else {
                        or_dash(p.from.map(rfc3339))
                    },
                    or_dash(p.to.map(rfc3339)),
                ]
            }),
        )
    };
    let as_json = |list: &[idempotency::ops::Partition]| {
        json!(
            list.iter()
                .map(|p| json!({
                    "name": p.name, "default": p.default,
                    "from": p.from.map(rfc3339), "to": p.to.map(rfc3339),
                }))
                .collect::<Vec<_>>()
        )
    };
    match command {
        PartitionsCommand::List => {
            out.emit(|| show(&list), || as_json(&list))?;
            Ok(())
        }
        PartitionsCommand::Create | PartitionsCommand::DropExpired if global.dry_run => {
            out.emit(
                || {
                    format!(
                        "dry run: nothing created or dropped; the partitions now:\n{}",
                        show(&list)
                    )
                },
                || json!({ "dry_run": true, "partitions": as_json(&list) }),
            )?;
            Ok(())
        }
        PartitionsCommand::Create => {
            let created = ops.create_partitions().await?;
            out.emit(
                || format!("created {created} partition(s)"),
                || json!({ "created": created }),
            )?;
            Ok(())
        }
        PartitionsCommand::DropExpired => {
            confirm(global, "Drop the partitions retention would empty?")?;
            let dropped = ops.drop_expired_partitions().await?;
            out.emit(
                || format!("dropped {dropped} partition(s)"),
                || json!({ "dropped": dropped }),
            )?;
            Ok(())
        }
    }
}

pub(super) async fn cleanup<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
) -> Result<(), CliError> {
    let preview = ops.cleanup_preview().await?;
    let total = preview.records + preview.outbox.published + preview.outbox.dead_lettered;
    if global.dry_run {
        out.emit(
            || {
                format!(
                    "dry run: would delete {} expired record(s), {} published outbox row(s), \
                     {} dead letter(s) past retention",
                    preview.records, preview.outbox.published, preview.outbox.dead_lettered
                )
            },
            || {
                json!({ "dry_run": true, "records": preview.records,
                        "outbox_published": preview.outbox.published,
                        "outbox_dead_lettered": preview.outbox.dead_lettered })
            },
        )?;
        return Ok(());
    }
    confirm(global, &format!("Delete {total} expired row(s)?"))?;
    let bar = progress(total, "cleanup");
    let report = ops.cleanup(|n| bar.inc(n)).await;
    bar.finish_and_clear();
    let report = report?;
    out.emit(
        || {
            format!(
                "deleted {} expired record(s), {} published outbox row(s), {} dead letter(s), \
                 {} partition(s)",
                report.records,
                report.outbox.published,
                report.outbox.dead_lettered,
                report.partitions_dropped
            )
        },
        || {
            json!({ "records": report.records, "outbox_published": report.outbox.published,
                    "outbox_dead_lettered": report.outbox.dead_lettered,
                    "partitions_dropped": report.partitions_dropped })
        },
    )?;
    Ok(())
}
