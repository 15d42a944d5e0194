//! The service's entry points. `execute_in` in a caller's transaction: one or two calls (two
//! keys) in one transaction, the action writing its effect on the transaction's connection; on
//! an error the caller rolls back, or (the fault `CommitAfterError`) commits anyway. `execute`
//! and `execute_optimistic`: one call in a transaction the service begins, commits or rolls
//! back itself; the same action.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_core::cache::{DistributedCache, LocalCache};
use idempotency_core::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, Scope, Tx,
};
use serde_json::{Value, json};

use super::{Ctx, clients, dropped_or, service_config};
use crate::backend::{Backend, NewEffect, Wire};
use crate::cache_wire::CacheWire;
use crate::faults::{Faults, Injected};
use crate::history::{Answer, Entry, TxEnd};
use crate::invariants;
use crate::plan::{Fault, Kind, Op, Plan, Via};
use crate::{CheckError, Run};

/// The action's error.
#[derive(Debug, thiserror::Error)]
enum ActionError {
    #[error(transparent)]
    Core(#[from] Error),
    #[error("the action failed")]
    Failed,
    #[error("the action's statement failed: {0}")]
    Statement(String),
}

/// The kind of a service error, as the history names it.
fn error_kind(error: &ActionError) -> Answer {
    match error {
        ActionError::Failed => Answer::Error("action-failed".to_owned()),
        ActionError::Statement(e) => Answer::Error(format!("statement: {e}")),
        ActionError::Core(Error::PayloadConflict) => Answer::Error("payload-conflict".to_owned()),
        ActionError::Core(Error::InFlight) => Answer::Error("in-flight".to_owned()),
        ActionError::Core(Error::AcquireExhausted { .. }) => {
            Answer::Error("acquire-exhausted".to_owned())
        }
        ActionError::Core(Error::Store(e)) => Answer::Error(format!("store: {e}")),
        ActionError::Core(Error::Cache(e)) => Answer::Error(format!("cache: {e}")),
        ActionError::Core(other) => Answer::Unexpected(other.to_string()),
    }
}

/// The transaction a call runs in.
enum In<'a, B: Backend> {
    /// `execute_in`: the caller's.
    Caller(&'a mut Tx<B>),
    /// `execute` or `execute_optimistic`: the service's own.
    Own(Via),
}

/// The calls whose action started, by operation and key.
type Ran = Mutex<HashSet<(u64, usize)>>;

/// What one operation sends.
struct Sent<'a> {
    op: &'a Op,
    tenant: &'a str,
    request: &'a Value,
    identity: &'a str,
    /// Where the action notes that it started.
    ran: &'a Ran,
    /// Where the faults injected are counted.
    faults: &'a Faults,
}

/// One call of `op` for `key`: `execute_in` on the caller's transaction, or `execute` /
/// `execute_optimistic` in the service's own.
async fn call<B, L, D>(
    service: &IdempotencyService<B, L, D>,
    tx: In<'_, B>,
    sent: &Sent<'_>,
    key: usize,
) -> Result<Answer, CheckError>
where
    B: Backend,
    L: LocalCache,
    D: DistributedCache,
{
    let Sent {
        op,
        tenant,
        request,
        identity,
        ran,
        faults,
    } = *sent;
    let idempotency_key =
        IdempotencyKey::new(format!("k{key}")).map_err(|e| CheckError::Setup(e.to_string()))?;
    let scope = Scope::new(tenant).map_err(|e| CheckError::Setup(e.to_string()))?;
    let call = Call::new("CHARGE", idempotency_key, request).scoped(scope);
    let kind = op.kind;
    let action = async |conn: &mut B::Connection| {
        if let Ok(mut ran) = ran.lock() {
            ran.insert((op.id, key));
        }
        let effect = NewEffect {
            tenant,
            key,
            identity,
            op: op.id,
        };
        let id = B::insert_effect(conn, effect)
            .await
            .map_err(|e| ActionError::Statement(e.to_string()))?;
        let value = json!({ "effect": id, "identity": identity });
        match kind {
            Kind::Reject => ExecutionResult::rejected_with("REJECTED", &value)
                .map_err(|e| ActionError::Statement(e.to_string())),
            Kind::Fail => Err(ActionError::Failed),
            Kind::Slow(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ExecutionResult::success(value))
            }
            Kind::Kill => {
                if B::kill(conn).await {
                    faults.count(Injected::Kill);
                }
                Ok(ExecutionResult::success(value))
            }
            Kind::Ok | Kind::Caught => Ok(ExecutionResult::success(value)),
        }
    };
    let result = match tx {
        In::Caller(tx) => service.execute_in(tx, call, action).await,
        In::Own(Via::Optimistic) => service.execute_optimistic(call, action).await,
        In::Own(_) => service.execute(call, action).await,
    };
    Ok(match result {
        Ok(outcome) => {
            let replayed = outcome.is_replayed();
            let (value, rejected) = match outcome.result() {
                ExecutionResult::Success(value) => (Some(value.clone()), false),
                ExecutionResult::Rejected(rejection) => (rejection.details().cloned(), true),
            };
            let value = value.unwrap_or(Value::Null);
            match (value["effect"].as_i64(), value["identity"].as_str()) {
                (Some(effect), Some(echoed)) if echoed == identity => {
                    if rejected {
                        Answer::Rejected { replayed, effect }
                    } else {
                        Answer::Value { replayed, effect }
                    }
                }
                _ => Answer::Unexpected(format!("another request's outcome: {value}")),
            }
        }
        Err(error) => error_kind(&error),
    })
}

/// Runs one operation: a transaction with its calls, then commit or rollback; or one call in
/// the service's own transaction.
async fn one<B, L, D>(
    service: IdempotencyService<B, L, D>,
    op: Op,
    start: Instant,
    ran: Arc<Ran>,
    faults: Arc<Faults>,
) -> Result<Entry, CheckError>
where
    B: Backend,
    L: LocalCache,
    D: DistributedCache,
{
    let tenant = format!("t{}", op.variant.tenant);
    let request = json!({
        "account": op.variant.account,
        "note": op.variant.note,
        "amount": op.variant.amount,
    });
    let identity = format!("{tenant} {request}");
    let mut answers = Vec::new();
    let sent = start.elapsed();
    let keys: Vec<usize> = [Some(op.key), op.second_key.filter(|k| *k != op.key)]
        .into_iter()
        .flatten()
        .collect();
    let sending = Sent {
        op: &op,
        tenant: &tenant,
        request: &request,
        identity: &identity,
        ran: &ran,
        faults: &faults,
    };
    if let Some(via @ (Via::Execute | Via::Optimistic)) = op.via {
        let own = async {
            let answer = call(&service, In::Own(via), &sending, op.key).await?;
            // What the service did with its own transaction: an outcome it executed was
            // committed; an error rolled everything back; a replay committed nothing of its own.
            let tx = match &answer {
                Answer::Value {
                    replayed: false, ..
                }
                | Answer::Rejected {
                    replayed: false, ..
                } => TxEnd::Committed,
                Answer::Value { .. } | Answer::Rejected { .. } => TxEnd::None,
                _ => TxEnd::RolledBack,
            };
            Ok::<_, CheckError>((answer, tx))
        };
        let (answer, tx) = dropped_or(op.fault, &faults, own)
            .await
            .unwrap_or(Ok((Answer::Dropped, TxEnd::Dropped)))?;
        return Ok(Entry {
            op,
            identity,
            answers: vec![(op.key, answer)],
            tx,
            span: (sent, start.elapsed()),
        });
    }
    let transaction = async {
        let mut tx = match service.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                answers.push((op.key, Answer::Error(format!("store: {e}"))));
                return Ok(TxEnd::None);
            }
        };
        let mut failed = false;
        for key in keys {
            let answer = call(&service, In::Caller(&mut tx), &sending, key).await?;
            failed = matches!(answer, Answer::Error(_) | Answer::Unexpected(_));
            answers.push((key, answer));
            if failed {
                break;
            }
        }
        Ok::<_, CheckError>(if failed && op.fault != Fault::CommitAfterError {
            match tx.rollback().await {
                Ok(()) => TxEnd::RolledBack,
                Err(e) => TxEnd::CommitFailed(format!("rollback: {e}")),
            }
        } else {
            if failed {
                faults.count(Injected::CommitAfterError);
            }
            match tx.commit().await {
                Ok(()) => TxEnd::Committed,
                Err(e) => TxEnd::CommitFailed(e.to_string()),
            }
        })
    };
    let tx = dropped_or(op.fault, &faults, transaction)
        .await
        .unwrap_or(Ok(TxEnd::Dropped))?;
    if tx == TxEnd::Dropped {
        answers.push((op.key, Answer::Dropped));
    }
    Ok(Entry {
        op,
        identity,
        answers,
        tx,
        span: (sent, start.elapsed()),
    })
}

async fn drive<B, L, D>(
    service: IdempotencyService<B, L, D>,
    plan: &Plan,
    store: &B,
    wires: (Option<Wire>, Option<Arc<CacheWire>>),
    faults: &Arc<Faults>,
) -> Result<Run, CheckError>
where
    B: Backend,
    L: LocalCache,
    D: DistributedCache,
{
    let start = Instant::now();
    let ran = Arc::new(Ran::default());
    let entries = {
        let (ran, counts) = (Arc::clone(&ran), Arc::clone(faults));
        clients(plan, wires, faults, move |op| {
            one(
                service.clone(),
                op,
                start,
                Arc::clone(&ran),
                Arc::clone(&counts),
            )
        })
        .await?
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let unclean = store.unclean_connections().await?;
    let effects = store.effects().await?;
    let ran = ran.lock().map(|r| r.clone()).unwrap_or_default();
    let fail_fast = plan.redis.is_some_and(|r| r.fail_fast);
    let violations = invariants::service(&entries, &effects, &ran, fail_fast);
    Ok(Run::new(entries, violations, unclean))
}

/// Runs `plan` through the service's entry points on a fresh `B`.
pub async fn run<B: Backend>(plan: &Plan, ctx: &Ctx) -> Result<Run, CheckError> {
    let (store, wire) = B::fresh().await?;
    let (redis, cache_wire) = ctx.redis(plan).await?;
    with_caches!(
        plan,
        redis,
        store.clone(),
        service_config(plan),
        ctx,
        |service| drive(service, plan, &store, (wire, cache_wire), ctx.faults()).await
    )
}
