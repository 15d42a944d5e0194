//! The JSON endpoints: the command line's reads and actions, its `--json` fields.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idempotency_core::admin::{Eviction, Force};
use idempotency_core::lease::FencingToken;
use idempotency_core::{IdempotencyKey, Operation, RecordId, RecordStatus, Scope};
use idempotency_outbox::admin::DeadLetterFilter;
use idempotency_outbox::uuid::Uuid;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::problem::Problem;
use super::{Allowed, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT, Principal, State};
use crate::ops::{AdminDatabase, DeadLetterJson, KeyJson, Operations, OutboxStatusJson, rfc3339};

type Answer = Result<Response, Problem>;

/// `value` as a 200 JSON answer, never cached.
pub(super) fn ok(value: &Value) -> Answer {
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        value.to_string(),
    )
        .into_response())
}

/// The query string, or 400 naming what is wrong with it.
fn query<T>(
    query: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, Problem> {
    query
        .map(|Query(q)| q)
        .map_err(|e| Problem::bad_request(format!("query string: {}", e.body_text())))
}

/// A JSON body (`Content-Type: application/json`), or 400 / 415.
fn body<T: DeserializeOwned>(headers: &HeaderMap, bytes: &Bytes) -> Result<T, Problem> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "admin-unsupported-media-type",
            "Unsupported media type",
            "send the body as Content-Type: application/json",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| Problem::bad_request(format!("body: {e}")))
}

/// A dead letter's id, or 400 naming it.
pub(super) fn parse_id(text: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(text)
        .map_err(|e| Problem::bad_request(format!("dead letter id {text:?} is not a UUID: {e}")))
}

/// A key's record id, or 400 naming the part that is malformed.
pub(super) fn record_id(operation: &str, scope: &str, key: &str) -> Result<RecordId, Problem> {
    let bad = |what: &str, value: &str, e: idempotency_core::KeyError| {
        Problem::bad_request(format!("{what} {value:?}: {e}"))
    };
    Ok(RecordId::new(
        Operation::new(operation).map_err(|e| bad("operation", operation, e))?,
        Scope::new(scope).map_err(|e| bad("scope", scope, e))?,
        IdempotencyKey::new(key).map_err(|e| bad("key", key, e))?,
    ))
}

/// How a key is named in messages.
pub(super) fn key_name(operation: &str, scope: &str, key: &str) -> String {
    format!("key {key:?} of operation {operation:?} in scope {scope:?}")
}

/// A filter's fields (empty strings, as forms send them, are no condition).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FilterQuery {
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    limit: Option<u32>,
}

fn set(value: Option<&String>) -> Option<&str> {
    value.map(String::as_str).filter(|v| !v.is_empty())
}

fn filter(
    aggregate_type: Option<&String>,
    aggregate_id: Option<&String>,
    event_type: Option<&String>,
) -> DeadLetterFilter {
    let mut filter = DeadLetterFilter::default();
    if let Some(v) = set(aggregate_type) {
        filter = filter.aggregate_type(v);
    }
    if let Some(v) = set(aggregate_id) {
        filter = filter.aggregate_id(v);
    }
    if let Some(v) = set(event_type) {
        filter = filter.event_type(v);
    }
    filter
}

pub(super) async fn status<D: AdminDatabase>(state: State<D>) -> Answer {
    ok(&json!(OutboxStatusJson::from(
        &state.ops.outbox_status().await?
    )))
}

pub(super) async fn dead_list<D: AdminDatabase>(
    state: State<D>,
    q: Result<Query<FilterQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(q)?;
    let limit = q.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if limit == 0 || limit > MAX_LIST_LIMIT {
        return Err(Problem::bad_request(format!(
            "limit {limit}: give 1 to {MAX_LIST_LIMIT}"
        )));
    }
    let filter = filter(
        q.aggregate_type.as_ref(),
        q.aggregate_id.as_ref(),
        q.event_type.as_ref(),
    );
    let letters = state.ops.dead_letters(&filter, limit).await?;
    ok(&json!(
        letters
            .iter()
            .map(DeadLetterJson::summary)
            .collect::<Vec<_>>()
    ))
}

pub(super) async fn dead_show<D: AdminDatabase>(state: State<D>, Path(id): Path<String>) -> Answer {
    let id = parse_id(&id)?;
    match state.ops.dead_letter(id).await? {
        Some(d) => ok(&json!(DeadLetterJson::full(&d))),
        None => Err(Problem::not_found(format!("no dead letter with id {id}"))),
    }
}

/// Which dead letters a requeue or discard applies to: `ids`, or a filter with `all` (the
/// empty filter too: every dead letter).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Selection {
    #[serde(default)]
    ids: Vec<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    #[serde(default)]
    all: bool,
}

/// The ids a selection names: each given id must be a dead letter (checked before anything
/// changes), or every dead letter matching the filter.
async fn select<D: AdminDatabase>(
    ops: &Operations<D>,
    selection: &Selection,
) -> Result<Vec<Uuid>, Problem> {
    let filter = filter(
        selection.aggregate_type.as_ref(),
        selection.aggregate_id.as_ref(),
        selection.event_type.as_ref(),
    );
    match (selection.ids.is_empty(), selection.all, filter.is_empty()) {
        (false, false, true) => {
            // Each id is read before anything changes: as many as a page lists, each once.
            if selection.ids.len() > MAX_LIST_LIMIT as usize {
                return Err(Problem::bad_request(format!(
                    "{} ids: give at most {MAX_LIST_LIMIT}, or a filter / \"all\": true",
                    selection.ids.len()
                )));
            }
            let mut ids = Vec::with_capacity(selection.ids.len());
            for id in &selection.ids {
                let id = parse_id(id)?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            for id in &ids {
                if ops.dead_letter(*id).await?.is_none() {
                    return Err(Problem::not_found(format!(
                        "no dead letter with id {id} (nothing changed)"
                    )));
                }
            }
            Ok(ids)
        }
        (false, _, _) => Err(Problem::bad_request(
            "give dead letter ids, or a filter / \"all\": true, not both",
        )),
        (true, false, true) => Err(Problem::bad_request(
            "name the dead letters: \"ids\", a filter (aggregate_type, aggregate_id, \
             event_type), or \"all\": true",
        )),
        (true, _, _) => Ok(ops.dead_letter_ids(&filter).await?),
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Change {
    Requeue,
    Discard,
}

impl Change {
    pub(super) fn verb(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::Discard => "discard",
        }
    }

    /// The verb done: `requeued`, `discarded`.
    pub(super) fn done(self) -> &'static str {
        match self {
            Self::Requeue => "requeued",
            Self::Discard => "discarded",
        }
    }

    /// Runs the change on `ids`; returns how many rows changed.
    pub(super) async fn run<D: AdminDatabase>(
        self,
        ops: &Operations<D>,
        ids: &[Uuid],
    ) -> Result<u64, Problem> {
        Ok(match self {
            Self::Requeue => ops.requeue(ids, |_| ()).await?,
            Self::Discard => ops.discard(ids, |_| ()).await?,
        })
    }
}

async fn change<D: AdminDatabase>(
    state: State<D>,
    principal: Principal,
    headers: HeaderMap,
    bytes: Bytes,
    change: Change,
) -> Answer {
    let selection: Selection = body(&headers, &bytes)?;
    let ops = state.ops(principal);
    let ids = select(&ops, &selection).await?;
    let done = change.run(&ops, &ids).await?;
    ok(&json!({ "action": change.verb(), "count": done }))
}

pub(super) async fn requeue<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    change(state, principal, headers, bytes, Change::Requeue).await
}

pub(super) async fn discard<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    change(state, principal, headers, bytes, Change::Discard).await
}

/// A purge's ages, as humantime durations (`7d`, `12h`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PurgeAges {
    published: Option<String>,
    dead_lettered: Option<String>,
}

fn age(name: &str, value: &str) -> Result<Duration, Problem> {
    humantime::parse_duration(value)
        .map_err(|e| Problem::bad_request(format!("{name} {value:?} is not a duration: {e}")))
}

/// The ages of a purge: `published` defaults to `outbox.retention.published`.
fn ages<D: AdminDatabase>(
    ops: &Operations<D>,
    ages: &PurgeAges,
) -> Result<(Duration, Option<Duration>), Problem> {
    let published = match ages.published.as_deref() {
        Some(value) => age("published", value)?,
        None => {
            ops.settings()
                .outbox
                .as_ref()
                .ok_or(crate::ops::OpsError::NoOutbox)?
                .retention
                .published
        }
    };
    let dead = ages
        .dead_lettered
        .as_deref()
        .map(|v| age("dead_lettered", v))
        .transpose()?;
    Ok((published, dead))
}

pub(super) async fn purge_preview<D: AdminDatabase>(
    state: State<D>,
    q: Result<Query<PurgeAges>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let (published, dead) = ages(&state.ops, &query(q)?)?;
    let counts = state.ops.expired_counts(published, dead).await?;
    ok(&json!({ "dry_run": true, "published": counts.published,
                "dead_lettered": counts.dead_lettered }))
}

pub(super) async fn purge<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    let request: PurgeAges = body(&headers, &bytes)?;
    let ops = state.ops(principal);
    let (published, dead) = ages(&ops, &request)?;
    let report = ops.purge(published, dead, |_| ()).await?;
    ok(&json!({ "published": report.published, "dead_lettered": report.dead_lettered }))
}

pub(super) async fn partitions<D: AdminDatabase>(state: State<D>) -> Answer {
    let list = state.ops.partitions().await?;
    ok(&json!(
        list.iter()
            .map(|p| json!({
                "name": p.name, "default": p.default,
                "from": p.from.map(rfc3339), "to": p.to.map(rfc3339),
            }))
            .collect::<Vec<_>>()
    ))
}

pub(super) async fn partitions_create<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
) -> Answer {
    let created = state.ops(principal).create_partitions().await?;
    ok(&json!({ "created": created }))
}

pub(super) async fn partitions_drop<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
) -> Answer {
    let dropped = state.ops(principal).drop_expired_partitions().await?;
    ok(&json!({ "dropped": dropped }))
}

/// A key, as the lookup form and `GET /api/keys` name it (`scope` defaults to empty: a
/// service without scopes).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyQuery {
    pub(super) operation: String,
    pub(super) key: String,
    #[serde(default)]
    pub(super) scope: String,
}

/// The Redis (L2) key of `id`, when Redis is configured.
#[cfg(feature = "redis")]
pub(super) fn redis_key<D: AdminDatabase>(ops: &Operations<D>, id: &RecordId) -> Option<String> {
    ops.cache_key(id)
}

/// The Redis (L2) key of `id`: none without the `redis` feature.
#[cfg(not(feature = "redis"))]
pub(super) fn redis_key<D: AdminDatabase>(ops: &Operations<D>, id: &RecordId) -> Option<String> {
    let _ = (ops, id);
    None
}

pub(super) async fn key_show<D: AdminDatabase>(
    state: State<D>,
    q: Result<Query<KeyQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(q)?;
    let id = record_id(&q.operation, &q.scope, &q.key)?;
    match state.ops.key_show(&id).await? {
        Some(view) => {
            let redis_key = redis_key(&state.ops, &id);
            ok(&json!(KeyJson::new(
                &q.operation,
                &q.scope,
                &q.key,
                &view,
                redis_key.as_deref()
            )))
        }
        None => Err(Problem::not_found(format!(
            "no record for {}",
            key_name(&q.operation, &q.scope, &q.key)
        ))),
    }
}

/// `keys evict`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EvictRequest {
    pub(super) operation: String,
    pub(super) key: String,
    #[serde(default)]
    pub(super) scope: String,
    #[serde(default)]
    pub(super) force: bool,
    /// With `force`, the lease token of the `PROCESSING` claim the operator was shown (`keys
    /// show`'s `lease_token`; `null`: a claim without one): only that claim is evicted, not one
    /// taken over since, nor the outcome of one that settled since. Absent, the claim read
    /// when the request arrives is the one forced.
    #[serde(default, deserialize_with = "present")]
    pub(super) claim: Option<Option<i64>>,
}

/// A field that may be `null`: `Some(None)` for `null`, `None` (by `default`) when absent.
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<i64>>, D::Error> {
    Option::<i64>::deserialize(deserializer).map(Some)
}

/// What the command line notes after an eviction.
pub(super) const L1_NOTE: &str = "other instances' in-process (L1) entries of this key live \
     until their TTL (idempotency.local-cache.ttl): until then they may still replay the old \
     outcome";

/// Evicts a key as `keys evict` does: 409 for a `PROCESSING` one unless `force`, and 409
/// `admin-key-changed` when the record is no longer the claim forced (`claim`, else the one
/// read here); for no
/// record, its stale Redis entry is deleted when one is left (an earlier eviction whose Redis
/// deletion failed), 404 when none is. Returns the evicted record's status (`None`: there was
/// none, a stale entry was deleted) and whether its Redis entry was deleted.
pub(super) async fn evict_key<D: AdminDatabase>(
    ops: &Operations<D>,
    request: &EvictRequest,
) -> Result<(Option<RecordStatus>, Option<bool>), Problem> {
    let (operation, scope, key) = (&request.operation, &request.scope, &request.key);
    let id = record_id(operation, scope, key)?;
    let name = key_name(operation, scope, key);
    let in_progress = || {
        Problem::new(
            StatusCode::CONFLICT,
            "admin-key-in-progress",
            "Key in progress",
            format!(
                "{name} is PROCESSING (its holder may still be running); evict with force to \
                 evict it anyway (nothing changed)"
            ),
        )
    };
    let changed = |status: RecordStatus| {
        Problem::new(
            StatusCode::CONFLICT,
            "admin-key-changed",
            "Key changed",
            format!(
                "{name} is no longer the claim forced (read as {status}: another holder took \
                 the key over, or the claim settled and its outcome is kept); look at the key \
                 again (nothing changed)"
            ),
        )
    };
    if request.claim.is_some() && !request.force {
        return Err(Problem::bad_request(
            "claim names the claim a forced eviction ends; set force too (nothing changed)",
        ));
    }
    let view = ops.key_show(&id).await?;
    let read_in_progress = view
        .as_ref()
        .filter(|view| view.status == RecordStatus::Processing);
    // `force` only for the claim the operator was shown (`claim`, else the one read here):
    // one written or taken over since is not theirs to end, nor an outcome stored since.
    let force = match (request.force, request.claim) {
        (true, Some(claim)) => Force::Claim(claim.map(FencingToken)),
        (true, None) => read_in_progress.map_or(Force::No, |view| Force::Claim(view.lease_token)),
        (false, _) => Force::No,
    };
    if read_in_progress.is_some() && force == Force::No {
        return Err(in_progress());
    }
    if view.is_none() && !ops.has_cache() {
        return Err(Problem::not_found(format!("no record for {name}")));
    }
    let eviction = ops.key_evict(&id, force).await?;
    match eviction.record {
        Eviction::Evicted(status) => Ok((Some(status), eviction.cache_entry)),
        Eviction::NotFound if eviction.cache_entry == Some(true) => Ok((None, Some(true))),
        Eviction::NotFound => Err(Problem::not_found(format!(
            "no record for {name}{}",
            match (view.is_some(), eviction.cache_entry) {
                (true, _) => " (deleted meanwhile)",
                (false, Some(false)) => ", and Redis (L2) had no entry for it (nothing changed)",
                (false, _) => "",
            }
        ))),
        Eviction::InProgress if request.force => Err(Problem::new(
            StatusCode::CONFLICT,
            "admin-key-changed",
            "Key changed",
            format!(
                "{name} became PROCESSING since it was read (a new claim: force ends only a \
                 claim it read or names); look at the key again (nothing changed)"
            ),
        )),
        Eviction::InProgress => Err(in_progress()),
        Eviction::Changed(status) => Err(changed(status)),
        other => Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "admin-operation-failed",
            "Operation failed",
            format!("{name}: an eviction this version does not know ({other:?})"),
        )),
    }
}

pub(super) async fn key_evict<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    let request: EvictRequest = body(&headers, &bytes)?;
    let (status, cache_entry) = evict_key(&state.ops(principal), &request).await?;
    ok(&json!({
        "evicted": status.is_some(), "status": status.map(RecordStatus::as_str),
        "cache_entry_deleted": cache_entry,
        "note": L1_NOTE,
    }))
}

pub(super) async fn key_stats<D: AdminDatabase>(state: State<D>) -> Answer {
    let stats = state.ops.key_stats().await?;
    ok(&json!({
        "groups": stats.groups.iter().map(|g| json!({
            "operation": g.operation, "status": g.status.as_str(),
            "count": g.count, "oldest": rfc3339(g.oldest),
        })).collect::<Vec<_>>(),
        "total": stats.total(),
        "oldest": stats.oldest().map(rfc3339),
        "expired": stats.expired,
    }))
}

fn cleanup_json(report: &crate::ops::CleanupReport, dry_run: bool) -> Value {
    json!({
        "dry_run": dry_run,
        "records": report.records,
        "outbox_published": report.outbox.published,
        "outbox_dead_lettered": report.outbox.dead_lettered,
        "partitions_dropped": report.partitions_dropped,
    })
}

pub(super) async fn cleanup_preview<D: AdminDatabase>(state: State<D>) -> Answer {
    ok(&cleanup_json(&state.ops.cleanup_preview().await?, true))
}

pub(super) async fn cleanup<D: AdminDatabase>(
    _: Allowed,
    state: State<D>,
    principal: Principal,
) -> Answer {
    let report = state.ops(principal).cleanup(|_| ()).await?;
    ok(&cleanup_json(&report, false))
}

pub(super) async fn schema<D: AdminDatabase>(state: State<D>) -> Answer {
    let tables = state.ops.schema_ddl()?;
    ok(&json!(
        tables
            .iter()
            .map(|t| json!({ "kind": t.kind.as_str(), "table": t.table, "sql": t.sql }))
            .collect::<Vec<_>>()
    ))
}

pub(super) async fn schema_problems<D: AdminDatabase>(state: State<D>) -> Answer {
    let tables = state.ops.schema_validate().await?;
    ok(&json!(
        tables
            .iter()
            .map(|t| json!({ "kind": t.kind.as_str(), "table": t.table, "problems": t.problems }))
            .collect::<Vec<_>>()
    ))
}
