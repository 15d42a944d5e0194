//! `IdempotencyLayer` in transactional and leased mode, driven in process through an axum
//! router (`oneshot`, no socket): `POST /acct/{account}/charges[?note=N]` with the tenant in
//! `X-Tenant-Id` (the layer's scope), none, one or two values of `X-Currency` (a header the
//! layer is told to fingerprint) and `{"amount": N}` as the body. The handler's behaviour
//! (succeed, reject, fail, run long, catch a failed statement) comes in headers the fingerprint
//! does not cover, so a retry of one request can fail and then succeed.
//!
//! Transactional mode: the handler writes its effect in the layer's transaction, the key claimed
//! first or (the plan's `optimistic`) the record inserted after the handler. Leased mode: the
//! handler's effect is outside the database, in a log of runs kept here.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, Method, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use idempotency_axum::{IdempotencyLayer, IdempotentTx, StoredResponse, TenantHeader};
use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::{
    IdempotencyKey, IdempotencyService, InFlightPolicy, LeasedClaims, Operation, RecordId, Scope,
    ServiceOptions,
};
use serde::Deserialize;
use tower::ServiceExt;

use super::{Ctx, clients, dropped_or, service_config};
use crate::backend::{Backend, NewEffect, Wire};
use crate::cache_wire::CacheWire;
use crate::faults::{Faults, Injected};
use crate::history::{Answer, CaughtRun, Entry, LeasedRun, TxEnd};
use crate::invariants::{self, Group};
use crate::plan::{Kind, Op, Plan};
use crate::{CheckError, Run};

/// The lease of the leased subject: shorter than its slowest handlers, so takeovers happen.
pub const LEASE: Duration = Duration::from_millis(300);

#[derive(Debug, Deserialize)]
struct Charge {
    amount: i64,
}

/// The request header the layer fingerprints besides the request itself.
const CURRENCY: &str = "x-currency";

/// What the handlers share: the run's clock, the leased runs' log, the operations whose
/// transactional handler started, and the handlers that caught a failed statement.
#[derive(Debug)]
struct Shared {
    start: Instant,
    runs: Mutex<Vec<LeasedRun>>,
    ran: Mutex<HashSet<u64>>,
    caught: Mutex<Vec<CaughtRun>>,
    faults: Arc<Faults>,
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The identity a handler echoes, and a client expects back: tenant, path and query, amount,
/// the `X-Currency` values.
fn identity(tenant: &str, uri: &str, amount: i64, currencies: &str) -> String {
    format!("{tenant} {uri} {amount} [{currencies}]")
}

/// The `X-Currency` values a handler received, in order.
fn currencies(headers: &HeaderMap) -> String {
    headers
        .get_all(CURRENCY)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect::<Vec<_>>()
        .join(",")
}

fn answer(status: StatusCode, effect: i64, identity: &str) -> Response {
    let body = serde_json::json!({ "effect": effect, "identity": identity }).to_string();
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::LOCATION, format!("/effects/{effect}")),
        ],
        body,
    )
        .into_response()
}

fn behaviour(headers: &HeaderMap) -> (String, u64) {
    let slow = header_str(headers, "x-check-slow-ms").parse().unwrap_or(0);
    (header_str(headers, "x-check-behaviour").to_owned(), slow)
}

/// The transactional handler: its effect is a row written on the layer's transaction.
async fn transactional<B: Backend>(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    mut tx: IdempotentTx<B>,
    axum::Json(charge): axum::Json<Charge>,
) -> Response {
    let tenant = header_str(&headers, "x-tenant-id").to_owned();
    let identity = identity(
        &tenant,
        &uri.to_string(),
        charge.amount,
        &currencies(&headers),
    );
    let key = header_str(&headers, "idempotency-key")
        .trim_start_matches('k')
        .parse()
        .unwrap_or(usize::MAX);
    let op = header_str(&headers, "x-check-op").parse().unwrap_or(0);
    if let Ok(mut ran) = shared.ran.lock() {
        ran.insert(op);
    }
    let effect = NewEffect {
        tenant: &tenant,
        key,
        identity: &identity,
        op,
    };
    let id = match B::insert_effect(&mut tx, effect).await {
        Ok(id) => id,
        Err(error) => {
            return (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response();
        }
    };
    let (behaviour, slow) = behaviour(&headers);
    match behaviour.as_str() {
        "reject" => answer(StatusCode::UNPROCESSABLE_ENTITY, id, &identity),
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        "kill" => {
            if B::kill(&mut tx).await {
                shared.faults.count(Injected::Kill);
            }
            answer(StatusCode::CREATED, id, &identity)
        }
        // "Insert, catch the unique violation, answer 422": on PostgreSQL the transaction is
        // aborted from here on, and the layer must still store this answer.
        "caught" => match B::violate_unique(&mut tx).await {
            Ok(()) => {
                if let Ok(mut caught) = shared.caught.lock() {
                    caught.push(CaughtRun {
                        op,
                        effect: id,
                        tenant: tenant.clone(),
                        key,
                        identity: identity.clone(),
                    });
                }
                answer(StatusCode::UNPROCESSABLE_ENTITY, id, &identity)
            }
            Err(unexpected) => (StatusCode::SERVICE_UNAVAILABLE, unexpected).into_response(),
        },
        _ => {
            tokio::time::sleep(Duration::from_millis(slow)).await;
            answer(StatusCode::CREATED, id, &identity)
        }
    }
}

/// The leased handler: its effect is a run in the log, outside the database.
async fn leased(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    axum::Json(charge): axum::Json<Charge>,
) -> Response {
    let tenant = header_str(&headers, "x-tenant-id").to_owned();
    let identity = identity(
        &tenant,
        &uri.to_string(),
        charge.amount,
        &currencies(&headers),
    );
    let key = header_str(&headers, "idempotency-key")
        .trim_start_matches('k')
        .parse()
        .unwrap_or(usize::MAX);
    let op = header_str(&headers, "x-check-op").parse().unwrap_or(0);
    let id = {
        let Ok(mut runs) = shared.runs.lock() else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let id = i64::try_from(runs.len()).unwrap_or(i64::MAX) + 1;
        runs.push(LeasedRun {
            id,
            tenant,
            key,
            start: shared.start.elapsed(),
            end: None,
            op,
        });
        id
    };
    let (behaviour, slow) = behaviour(&headers);
    tokio::time::sleep(Duration::from_millis(slow)).await;
    if let Ok(mut runs) = shared.runs.lock()
        && let Some(run) = runs.iter_mut().find(|r| r.id == id)
    {
        let end = shared.start.elapsed();
        run.end = Some(end);
        // A holder that wakes up after its lease ran out: others may have taken the key over.
        if end.saturating_sub(run.start) > LEASE {
            shared.faults.count(Injected::LeaseOutlived);
        }
    }
    match behaviour.as_str() {
        "reject" => answer(StatusCode::UNPROCESSABLE_ENTITY, id, &identity),
        "fail" => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        _ => answer(StatusCode::CREATED, id, &identity),
    }
}

/// The request an operation sends, and the identity it expects echoed.
fn request(op: &Op) -> Result<(Request<Body>, String), CheckError> {
    let tenant = format!("t{}", op.variant.tenant);
    let uri = match op.variant.note {
        Some(note) => format!("/acct/{}/charges?note={note}", op.variant.account),
        None => format!("/acct/{}/charges", op.variant.account),
    };
    let expected = identity(
        &tenant,
        &uri,
        op.variant.amount,
        &op.variant.currencies().join(","),
    );
    let (behaviour, slow) = match op.kind {
        Kind::Ok => ("ok", 0),
        Kind::Reject => ("reject", 0),
        Kind::Fail => ("fail", 0),
        Kind::Slow(ms) => ("slow", ms),
        Kind::Kill => ("kill", 0),
        Kind::Caught => ("caught", 0),
    };
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("idempotency-key", format!("k{}", op.key))
        .header("x-tenant-id", tenant)
        .header("x-check-op", op.id.to_string())
        .header("x-check-behaviour", behaviour)
        .header("x-check-slow-ms", slow.to_string())
        .header(header::CONTENT_TYPE, "application/json");
    for currency in op.variant.currencies() {
        request = request.header(CURRENCY, *currency);
    }
    let request = request
        .body(Body::from(
            serde_json::json!({ "amount": op.variant.amount }).to_string(),
        ))
        .map_err(|e| CheckError::Setup(e.to_string()))?;
    Ok((request, expected))
}

/// What a client makes of a response.
fn classify(status: StatusCode, headers: &HeaderMap, body: &Bytes) -> Answer {
    let replayed = header_str(headers, "idempotent-replayed") == "true";
    let content_type = header_str(headers, "content-type");
    if content_type == "application/problem+json" {
        let slug = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .and_then(|t| t.rsplit('/').next().map(str::to_owned))
            .unwrap_or_default();
        return Answer::Problem {
            status: status.as_u16(),
            slug,
            retry_after: headers.contains_key(header::RETRY_AFTER),
        };
    }
    if status == StatusCode::INTERNAL_SERVER_ERROR && body.as_ref() == b"boom" {
        return Answer::HandlerFailed { replayed };
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && let (Some(effect), Some(identity)) =
            (value["effect"].as_i64(), value["identity"].as_str())
    {
        let mut bytes = format!(
            "{} {content_type} {}\n",
            status.as_u16(),
            header_str(headers, "location")
        )
        .into_bytes();
        bytes.extend_from_slice(body);
        return Answer::Handler {
            status: status.as_u16(),
            replayed,
            effect,
            identity: identity.to_owned(),
            bytes,
        };
    }
    Answer::Unexpected(format!(
        "{status} {content_type} {}",
        String::from_utf8_lossy(body)
    ))
}

/// Sends `op` through `app`, with its fault.
async fn send(app: &Router, op: &Op, start: Instant, faults: &Faults) -> Result<Entry, CheckError> {
    let (request, expected) = request(op)?;
    let sent = start.elapsed();
    let exchange = async {
        let response = app.clone().oneshot(request).await;
        let response = match response {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map(|b| b.to_bytes());
        match body {
            Ok(body) => classify(parts.status, &parts.headers, &body),
            Err(error) => Answer::Unexpected(format!("body: {error}")),
        }
    };
    let answer = dropped_or(op.fault, faults, exchange)
        .await
        .unwrap_or(Answer::Dropped);
    Ok(Entry {
        op: *op,
        identity: expected,
        answers: vec![(op.key, answer)],
        tx: TxEnd::None,
        span: (sent, start.elapsed()),
    })
}

/// The service configuration both modes use: the plan's in-flight policy.
fn config(plan: &Plan) -> ServiceOptions {
    let mut config = service_config(plan);
    if let InFlightPolicy::Wait { timeout } = &mut config.in_flight {
        *timeout = Some(Duration::from_millis(250));
    }
    config
}

fn transactional_app<B, L, D>(
    service: IdempotencyService<B, L, D>,
    shared: Arc<Shared>,
    optimistic: bool,
) -> Result<Router, CheckError>
where
    B: Backend,
    L: LocalCache,
    D: DistributedCache,
{
    let layer = IdempotencyLayer::new(service)
        .scope::<TenantHeader>()
        .fingerprint_header(HeaderName::from_static(CURRENCY))
        .map_err(|e| CheckError::Setup(e.to_string()))?;
    let routes = Router::new().route("/acct/{account}/charges", post(transactional::<B>));
    let routes = if optimistic {
        routes.route_layer(layer.optimistic())
    } else {
        routes.route_layer(layer)
    };
    Ok(routes.with_state(shared))
}

fn leased_app<B, L, D>(
    service: IdempotencyService<B, L, D>,
    shared: Arc<Shared>,
) -> Result<Router, CheckError>
where
    B: Backend + LeasedClaims,
    L: LocalCache,
    D: DistributedCache,
{
    let layer = IdempotencyLayer::new(service)
        .scope::<TenantHeader>()
        .fingerprint_header(HeaderName::from_static(CURRENCY))
        .map_err(|e| CheckError::Setup(e.to_string()))?
        .leased(LEASE);
    Ok(Router::new()
        .route("/acct/{account}/charges", post(leased))
        .route_layer(layer)
        .with_state(shared))
}

/// Sends every client's operations through `app`, then holds the history against the
/// invariants of its mode.
async fn drive<B: Backend>(
    app: Router,
    plan: &Plan,
    store: &B,
    wires: (Option<Wire>, Option<Arc<CacheWire>>),
    shared: Arc<Shared>,
    leased_mode: bool,
) -> Result<Run, CheckError> {
    let start = shared.start;
    let faults = Arc::clone(&shared.faults);
    let entries = clients(plan, wires, &shared.faults, move |op| {
        let (app, faults) = (app.clone(), Arc::clone(&faults));
        async move { send(&app, &op, start, &faults).await }
    })
    .await?;
    // Handlers that outlive their client (leased mode) get time to end.
    tokio::time::sleep(if leased_mode {
        LEASE * 2
    } else {
        Duration::from_millis(50)
    })
    .await;
    let unclean = store.unclean_connections().await?;
    let fail_fast = plan.redis.is_some_and(|r| r.fail_fast);
    let violations = if leased_mode {
        let runs = shared.runs.lock().map(|r| r.clone()).unwrap_or_default();
        invariants::leased(&entries, &runs, LEASE, fail_fast)
    } else {
        let effects = store.effects().await?;
        let ran = shared.ran.lock().map(|r| r.clone()).unwrap_or_default();
        let caught = shared.caught.lock().map(|c| c.clone()).unwrap_or_default();
        let stored = stored(store, &entries).await?;
        invariants::transactional(
            &entries,
            &invariants::Transactional {
                effects: &effects,
                stored: &stored,
                caught: &caught,
                undoes_caught: B::NAME == "pg",
                optimistic: plan.optimistic,
                ran: &ran,
                fail_fast,
            },
        )
    };
    Ok(Run::new(entries, violations, unclean))
}

/// The effect each key's committed record names (the stored response's `effect`), read from
/// the store after the history, for every key the history used.
async fn stored<B: Backend>(
    store: &B,
    entries: &[Entry],
) -> Result<BTreeMap<Group, i64>, CheckError> {
    let setup = |e: &dyn std::fmt::Display| CheckError::Setup(e.to_string());
    let operation = Operation::new("POST:/acct/{account}/charges").map_err(|e| setup(&e))?;
    let groups: BTreeSet<Group> = entries
        .iter()
        .map(|e| (format!("t{}", e.op.variant.tenant), e.op.key))
        .collect();
    let mut stored = BTreeMap::new();
    for (tenant, key) in groups {
        let id = RecordId::new(
            operation.clone(),
            Scope::new(tenant.as_str()).map_err(|e| setup(&e))?,
            IdempotencyKey::new(format!("k{key}")).map_err(|e| setup(&e))?,
        );
        let record = store
            .lookup(&id)
            .await
            .map_err(|e| CheckError::Database(e.to_string()))?;
        let Some(outcome) = record.and_then(|r| r.outcome) else {
            continue;
        };
        let effect = outcome
            .to_columns()
            .0
            .and_then(|text| serde_json::from_str::<StoredResponse>(text).ok())
            .and_then(|response| serde_json::from_slice::<serde_json::Value>(response.body()).ok())
            .and_then(|body| body["effect"].as_i64());
        if let Some(effect) = effect {
            stored.insert((tenant, key), effect);
        }
    }
    Ok(stored)
}

fn shared(faults: &Arc<Faults>) -> Arc<Shared> {
    Arc::new(Shared {
        start: Instant::now(),
        runs: Mutex::new(Vec::new()),
        ran: Mutex::new(HashSet::new()),
        caught: Mutex::new(Vec::new()),
        faults: Arc::clone(faults),
    })
}

/// Runs `plan` through the layer in transactional mode on a fresh `B`.
pub async fn run_transactional<B: Backend>(plan: &Plan, ctx: &Ctx) -> Result<Run, CheckError> {
    let (store, wire) = B::fresh().await?;
    let (redis, cache_wire) = ctx.redis(plan).await?;
    let shared = shared(ctx.faults());
    let app = with_caches!(plan, redis, store.clone(), config(plan), ctx, |service| {
        transactional_app(service, Arc::clone(&shared), plan.optimistic)
    })?;
    drive(app, plan, &store, (wire, cache_wire), shared, false).await
}

/// Runs `plan` through the layer in leased mode on a fresh `B`.
pub async fn run_leased<B: Backend + LeasedClaims>(
    plan: &Plan,
    ctx: &Ctx,
) -> Result<Run, CheckError> {
    let (store, wire) = B::fresh().await?;
    store
        .prepare_leases()
        .await
        .map_err(|e| CheckError::Setup(e.to_string()))?;
    let (redis, cache_wire) = ctx.redis(plan).await?;
    let shared = shared(ctx.faults());
    let app = with_caches!(plan, redis, store.clone(), config(plan), ctx, |service| {
        leased_app(service, Arc::clone(&shared))
    })?;
    drive(app, plan, &store, (wire, cache_wire), shared, true).await
}
