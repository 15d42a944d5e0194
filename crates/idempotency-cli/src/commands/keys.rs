//! `keys show | evict | stats`.

use idempotency::core::admin::{Eviction, Force};
use idempotency::core::lease::FencingToken;
use idempotency::core::{IdempotencyKey, Operation, RecordId, RecordStatus, Scope};
use idempotency::ops::{AdminDatabase, KeyJson, Operations, rfc3339};
use serde_json::json;

use super::{Out, confirm, or_dash, table};
use crate::cli::{Global, KeyArgs, KeysCommand};
use crate::error::CliError;

fn record_id(args: &KeyArgs) -> Result<RecordId, CliError> {
    let bad = |what: &str, value: &str, e: idempotency::core::KeyError| {
        CliError::Usage(format!("{what} {value:?}: {e}"))
    };
    Ok(RecordId::new(
        Operation::new(&args.operation).map_err(|e| bad("OPERATION", &args.operation, e))?,
        Scope::new(&args.scope).map_err(|e| bad("--scope", &args.scope, e))?,
        IdempotencyKey::new(&args.key).map_err(|e| bad("KEY", &args.key, e))?,
    ))
}

fn name(args: &KeyArgs) -> String {
    format!(
        "key {:?} of operation {:?} in scope {:?}",
        args.key, args.operation, args.scope
    )
}

pub(super) async fn run<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    command: &KeysCommand,
) -> Result<(), CliError> {
    match command {
        KeysCommand::Show(args) => show(ops, out, args).await,
        KeysCommand::Evict { key, force, claim } => {
            let claim = claim.map(FencingToken);
            evict(ops, global, out, key, *force, claim).await
        }
        KeysCommand::Stats => stats(ops, out).await,
    }
}

async fn show<D: AdminDatabase>(
    ops: &Operations<D>,
    out: Out,
    args: &KeyArgs,
) -> Result<(), CliError> {
    let id = record_id(args)?;
    let Some(view) = ops.key_show(&id).await? else {
        return Err(CliError::NotFound(format!("no record for {}", name(args))));
    };
    let cache_key = ops.cache_key(&id);
    out.emit(
        || {
            table(
                ["field", "value"],
                [
                    ["status".to_owned(), view.status.to_string()],
                    ["created".to_owned(), rfc3339(view.created_at)],
                    [
                        "completed".to_owned(),
                        or_dash(view.completed_at.map(rfc3339)),
                    ],
                    ["expires".to_owned(), or_dash(view.expires_at.map(rfc3339))],
                    ["fingerprint".to_owned(), view.fingerprint.clone()],
                    [
                        "rejection code".to_owned(),
                        or_dash(view.rejection_code.clone()),
                    ],
                    [
                        "outcome size".to_owned(),
                        format!("{} bytes", view.outcome_size),
                    ],
                    ["preview".to_owned(), or_dash(view.preview.clone())],
                    [
                        "lease token".to_owned(),
                        or_dash(view.lease_token.map(|token| token.0.to_string())),
                    ],
                    ["redis key".to_owned(), or_dash(cache_key.clone())],
                ],
            )
        },
        || {
            json!(KeyJson::new(
                &args.operation,
                &args.scope,
                &args.key,
                &view,
                cache_key.as_deref()
            ))
        },
    )?;
    Ok(())
}

const L1_NOTE: &str = "other instances' in-process (L1) entries of this key live until their \
     TTL (idempotency.local-cache.ttl): until then they may still replay the old outcome";

async fn evict<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    args: &KeyArgs,
    force: bool,
    claim: Option<FencingToken>,
) -> Result<(), CliError> {
    let id = record_id(args)?;
    let Some(view) = ops.key_show(&id).await? else {
        return evict_entry(ops, global, out, args, &id).await;
    };
    let in_progress = view.status == RecordStatus::Processing;
    // `--force` only for the claim named (`--claim`) or read now (its lease token): one
    // written or taken over since is not the operator's to end, nor an outcome stored since.
    let forced = match (force, claim) {
        (true, Some(claim)) => Force::Claim(Some(claim)),
        (true, None) if in_progress => Force::Claim(view.lease_token),
        _ => Force::No,
    };
    if in_progress && forced == Force::No {
        return Err(CliError::Refused(format!(
            "{} is PROCESSING (its holder may still be running); pass --force to evict it anyway \
             (nothing changed)",
            name(args)
        )));
    }
    // The claim named is not the record read: refused before any question or dry run.
    if matches!(forced, Force::Claim(_)) && !forced.allows(view.status, view.lease_token) {
        return Err(changed(args, view.status));
    }
    let token = view.lease_token.map(|token| token.0);
    let shown = match token {
        Some(token) => format!("{}, lease token {token}", view.status),
        None => view.status.to_string(),
    };
    if global.dry_run {
        out.emit(
            || format!("dry run: would evict {} ({shown})", name(args)),
            || {
                json!({ "dry_run": true, "would_evict": true, "status": view.status.as_str(),
                        "lease_token": token })
            },
        )?;
        return Ok(());
    }
    confirm(global, &format!("Evict {} ({shown})?", name(args)))?;
    let eviction = ops.key_evict(&id, forced).await?;
    match eviction.record {
        Eviction::Evicted(status) => evicted(out, args, status, eviction.cache_entry),
        Eviction::NotFound => {
            entry_evicted(out, args, eviction.cache_entry, " (deleted meanwhile)")
        }
        Eviction::InProgress if force => Err(CliError::Refused(format!(
            "{} became PROCESSING since it was read (a new claim: --force ends only a claim it \
             read); look at the key again (nothing changed)",
            name(args)
        ))),
        Eviction::InProgress => Err(CliError::Refused(format!(
            "{} became PROCESSING meanwhile; pass --force to evict it anyway (nothing changed)",
            name(args)
        ))),
        Eviction::Changed(status) => Err(changed(args, status)),
        other => Err(unknown(args, other)),
    }
}

/// The refusal of a forced eviction whose claim is gone: taken over, or settled since.
fn changed(args: &KeyArgs, status: RecordStatus) -> CliError {
    CliError::Refused(format!(
        "{} is no longer the claim --force named (read as {status}: another holder took the \
         key over, or the claim settled and its outcome is kept); look at the key again \
         (nothing changed)",
        name(args)
    ))
}

/// An eviction result this version of the command line does not know.
fn unknown(args: &KeyArgs, eviction: Eviction) -> CliError {
    CliError::Refused(format!(
        "{}: an eviction result this version does not know ({eviction:?}); look at the key \
         again",
        name(args)
    ))
}

/// `keys evict` of a key without a record: its Redis (L2) entry, if one was left (by an
/// eviction whose Redis deletion failed, or past the record's retention), is deleted.
async fn evict_entry<D: AdminDatabase>(
    ops: &Operations<D>,
    global: &Global,
    out: Out,
    args: &KeyArgs,
    id: &RecordId,
) -> Result<(), CliError> {
    if ops.cache_key(id).is_none() {
        return Err(CliError::NotFound(format!("no record for {}", name(args))));
    }
    if global.dry_run {
        return Err(CliError::NotFound(format!(
            "no record for {}; without --dry-run its Redis (L2) entry, if one is left, would be \
             deleted",
            name(args)
        )));
    }
    // Asked as every change is: a record written since the lookup is evicted too.
    confirm(
        global,
        &format!(
            "No record for {}: delete its Redis (L2) entry, if one is left?",
            name(args)
        ),
    )?;
    let eviction = ops.key_evict(id, Force::No).await?;
    match eviction.record {
        Eviction::NotFound => entry_evicted(out, args, eviction.cache_entry, ""),
        // Written since the lookup, and evicted as a record is.
        Eviction::Evicted(status) => evicted(out, args, status, eviction.cache_entry),
        Eviction::InProgress => Err(CliError::Refused(format!(
            "{} became PROCESSING meanwhile; pass --force to evict it anyway (nothing changed)",
            name(args)
        ))),
        other => Err(unknown(args, other)),
    }
}

/// What an eviction of a record prints.
fn evicted(
    out: Out,
    args: &KeyArgs,
    status: RecordStatus,
    cache_entry: Option<bool>,
) -> Result<(), CliError> {
    out.emit(
        || {
            let cache = match cache_entry {
                Some(true) => "its Redis (L2) entry was deleted",
                Some(false) => "Redis (L2) had no entry for it",
                None => "no Redis (L2) cache is configured",
            };
            format!(
                "evicted {} ({status}): its next request runs again; {cache}.\nnote: {L1_NOTE}",
                name(args)
            )
        },
        || {
            json!({
                "evicted": true, "status": status.as_str(),
                "cache_entry_deleted": cache_entry,
                "note": L1_NOTE,
            })
        },
    )
}

/// What an eviction that found no record did: deleted a stale Redis entry (success), or
/// nothing (not found).
fn entry_evicted(
    out: Out,
    args: &KeyArgs,
    cache_entry: Option<bool>,
    meanwhile: &str,
) -> Result<(), CliError> {
    if cache_entry != Some(true) {
        return Err(CliError::NotFound(format!(
            "no record for {}{meanwhile}",
            name(args)
        )));
    }
    out.emit(
        || {
            format!(
                "no record for {}{meanwhile}; its stale Redis (L2) entry was deleted: its next \
                 request runs again.\nnote: {L1_NOTE}",
                name(args)
            )
        },
        || {
            json!({
                "evicted": false, "status": null, "cache_entry_deleted": true, "note": L1_NOTE,
            })
        },
    )?;
    Ok(())
}

async fn stats<D: AdminDatabase>(ops: &Operations<D>, out: Out) -> Result<(), CliError> {
    let stats = ops.key_stats().await?;
    out.emit(
        || {
            let rows = stats.groups.iter().map(|g| {
                [
                    g.operation.clone(),
                    g.status.to_string(),
                    g.count.to_string(),
                    rfc3339(g.oldest),
                ]
            });
            format!(
                "{}\ntotal: {}  oldest: {}  expired, not cleaned yet: {}",
                table(["operation", "status", "count", "oldest"], rows),
                stats.total(),
                or_dash(stats.oldest().map(rfc3339)),
                stats.expired
            )
        },
        || {
            json!({
                "groups": stats.groups.iter().map(|g| json!({
                    "operation": g.operation, "status": g.status.as_str(),
                    "count": g.count, "oldest": rfc3339(g.oldest),
                })).collect::<Vec<_>>(),
                "total": stats.total(),
                "oldest": stats.oldest().map(rfc3339),
                "expired": stats.expired,
            })
        },
    )?;
    Ok(())
}
