//! Conformance cases for `execute_optimistic`, for stores that implement `InsertCompleted`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Barrier;

use super::Capabilities;
use super::concurrency::{BUDGET_BOUND, HOLD};
use super::service_cases::service_with;
use super::support::{CountingAction, SuiteError, key};
use crate::store::InsertCompleted;
use crate::{
    Call, Error, ExecutionResult, IdempotencyKey, IdempotencyService, InFlightPolicy, Level,
    Origin, Outcome, ServiceOptions,
};

async fn run<S: InsertCompleted>(
    service: &IdempotencyService<S>,
    key: &IdempotencyKey,
    request: &Value,
    counter: &CountingAction,
    value: Value,
) -> Result<Outcome<Value>, SuiteError> {
    service
        .execute_optimistic(Call::new("OP", key.clone(), request), async |_conn| {
            counter.hit();
            Ok(ExecutionResult::success(value))
        })
        .await
}

/// First run executes; a repeat replays the first value. Without a lookup first, the repeat
/// runs the action and rolls it back; with `lookup_before_acquire` it does not run at all.
pub async fn optimistic_first_run_then_replay<S: InsertCompleted + Clone>(
    store: S,
    _caps: Capabilities,
) {
    for lookup_before_acquire in [false, true] {
        let config = ServiceOptions {
            lookup_before_acquire,
            ..ServiceOptions::default()
        };
        let service = service_with(store.clone(), config);
        let (k, counter, request) = (
            key("optimistic"),
            CountingAction::default(),
            json!({"a": 1}),
        );
        let first = run(&service, &k, &request, &counter, json!(1))
            .await
            .expect("first");
        assert!(first.is_executed());
        let replay = run(&service, &k, &request, &counter, json!(2))
            .await
            .expect("replay");
        assert_eq!(
            replay.origin(),
            Origin::Replayed {
                from: Level::Persistence
            }
        );
        assert_eq!(replay.result().value(), Some(&json!(1)));
        assert_eq!(counter.count(), if lookup_before_acquire { 1 } else { 2 });
    }
}

/// Rejections are stored and replayed; another payload is a conflict; a technical failure
/// stores nothing.
pub async fn optimistic_rejection_conflict_and_failure<S: InsertCompleted + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let k = key("optimistic-reject");
    for round in 0..2 {
        let outcome: Outcome<Value> = service
            .execute_optimistic(
                Call::new("OP", k.clone(), &json!({"x": 1})),
                async |_conn| Ok::<_, SuiteError>(ExecutionResult::rejected("LIMIT")),
            )
            .await
            .expect("rejection");
        assert_eq!(outcome.is_replayed(), round == 1);
        assert_eq!(
            outcome.result().rejection().map(|r| r.code()),
            Some("LIMIT")
        );
    }
    let counter = CountingAction::default();
    let conflict = run(&service, &k, &json!({"x": 2}), &counter, json!(0))
        .await
        .expect_err("conflict");
    assert!(
        matches!(conflict.idempotency(), Some(Error::PayloadConflict)),
        "{conflict:?}"
    );

    let failing = key("optimistic-failure");
    let failed: Result<Outcome<Value>, SuiteError> = service
        .execute_optimistic(
            Call::new("OP", failing.clone(), &json!({})),
            async |_conn| Err(SuiteError::Boom),
        )
        .await;
    assert!(matches!(failed, Err(SuiteError::Boom)));
    let retry = run(&service, &failing, &json!({}), &counter, json!("ok"))
        .await
        .expect("retry");
    assert!(retry.is_executed(), "nothing was stored by the failure");
}

/// 20 simultaneous duplicates: exactly one commits; every caller gets the winner's value.
pub async fn optimistic_concurrent_duplicates_one_commits<S: InsertCompleted + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Wait {
            timeout: Some(Duration::from_secs(30)),
        },
        ..ServiceOptions::default()
    };
    let service = service_with(store, config);
    let (k, counter, request) = (
        key("optimistic-stampede"),
        CountingAction::default(),
        json!({"n": 1}),
    );
    let barrier = Arc::new(Barrier::new(20));
    let mut handles = Vec::new();
    for _ in 0..20 {
        let (service, k, request, counter, barrier) = (
            service.clone(),
            k.clone(),
            request.clone(),
            counter.clone(),
            Arc::clone(&barrier),
        );
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            service
                .execute_optimistic(Call::new("OP", k, &request), async |_conn| {
                    let n = counter.hit();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, SuiteError>(ExecutionResult::success(json!({"run": n})))
                })
                .await
        }));
    }
    let mut outcomes = Vec::new();
    for handle in handles {
        outcomes.push(
            handle
                .await
                .expect("join")
                .expect("every duplicate gets an outcome"),
        );
    }
    let winners: Vec<_> = outcomes.iter().filter(|o| o.is_executed()).collect();
    assert_eq!(winners.len(), 1, "exactly one transaction commits");
    let value = winners[0].result().value().cloned();
    assert!(
        outcomes
            .iter()
            .all(|o| o.result().value().cloned() == value),
        "everyone sees the winner"
    );
}

/// An action that fails because a duplicate committed first replays the duplicate's outcome.
pub async fn optimistic_failure_after_a_winner_replays_it<S: InsertCompleted + Clone>(
    store: S,
    caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, request) = (key("optimistic-loser"), json!({"l": 1}));
    // Set once the winner's `execute_optimistic` has returned: its record is committed.
    let (committed, winner_committed) = tokio::sync::watch::channel(false);
    let winner = {
        let (service, k, request) = (service.clone(), k.clone(), request.clone());
        tokio::spawn(async move {
            let outcome = service
                .execute_optimistic(Call::new("OP", k, &request), async |_conn| {
                    Ok::<_, SuiteError>(ExecutionResult::success(json!("winner")))
                })
                .await;
            committed.send_replace(true);
            outcome
        })
    };
    if caps.concurrent_writers {
        // The loser's action ends only once the winner has committed (it holds no lock the
        // winner waits for: an optimistic record is written after the action).
        let loser: Outcome<Value> = service
            .execute_optimistic(Call::new("OP", k.clone(), &request), async |_conn| {
                let mut winner_committed = winner_committed.clone();
                tokio::time::timeout(
                    Duration::from_secs(30),
                    winner_committed.wait_for(|done| *done),
                )
                .await
                .expect("the winner commits")
                .expect("the winner's task reports");
                Err(SuiteError::Boom) // e.g. the unique business key the winner just took
            })
            .await
            .expect("the loser replays");
        assert_eq!(loser.result().value(), Some(&json!("winner")));
    }
    assert!(winner.await.expect("join").expect("winner").is_executed());
}

/// A holder keeps the key for 2 s; a duplicate's insert with a 200 ms budget gets `InFlight`.
pub async fn optimistic_wait_budget_is_honoured<S: InsertCompleted + Clone>(
    store: S,
    caps: Capabilities,
) {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Wait {
            timeout: Some(Duration::from_millis(200)),
        },
        ..ServiceOptions::default()
    };
    let service = service_with(store, config);
    let (k, request) = (key("optimistic-budget"), json!({"b": 1}));
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let holder = {
        let (service, k, request) = (service.clone(), k.clone(), request.clone());
        tokio::spawn(async move {
            let mut tx = service.begin().await.expect("begin");
            let _: Outcome<Value> = service
                .execute_in(&mut tx, Call::new("OP", k, &request), async |_conn| {
                    Ok::<_, SuiteError>(ExecutionResult::success(json!("held")))
                })
                .await
                .expect("holder");
            let _ = started_tx.send(());
            tokio::time::sleep(HOLD).await;
            tx.commit().await.expect("commit");
        })
    };
    started.await.expect("holder started");
    let began = Instant::now();
    let counter = CountingAction::default();
    let result = run(&service, &k, &request, &counter, json!("late")).await;
    if caps.concurrent_writers {
        assert!(
            matches!(result, Err(SuiteError::Idempotency(Error::InFlight))),
            "{result:?}"
        );
        assert!(
            began.elapsed() < BUDGET_BOUND,
            "waited {:?} for a 200 ms budget",
            began.elapsed()
        );
    } else {
        assert_eq!(
            result.expect("replay").result().value(),
            Some(&json!("held"))
        );
    }
    holder.await.expect("join");
}

/// `insert_completed` keeps the span reference it is given, as `complete` does: returned, then
/// read back by `find` and `lookup`; none when none is given.
pub async fn optimistic_insert_keeps_the_execution_span<S: InsertCompleted>(
    store: S,
    _caps: Capabilities,
) {
    use crate::store::{Claim, LockWait};
    use crate::trace::SpanRef;
    use crate::{Fingerprint, RecordId, Scope, StoredOutcome};
    let span = SpanRef::from_hex("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
        .expect("valid ids");
    for (name, given) in [("TRACED", Some(span)), ("UNTRACED", None)] {
        let id = RecordId::new(super::support::op(name), Scope::default(), key("insert"));
        let fingerprint = Fingerprint::new("f".repeat(64));
        let claim = Claim {
            id: &id,
            fingerprint: &fingerprint,
            ttl: Some(Duration::from_secs(3600)),
            wait: LockWait::Timeout(Duration::from_secs(10)),
        };
        let outcome = StoredOutcome::Completed {
            payload: "7".into(),
        };
        let mut tx = store.begin().await.expect("begin");
        let record = store
            .insert_completed(&mut tx, &claim, &outcome, given)
            .await
            .expect("insert")
            .expect("a new key");
        assert_eq!(record.execution_span, given, "{name}: insert_completed");
        S::commit(tx).await.expect("commit");
        let mut tx = store.begin().await.expect("begin");
        let found = store
            .find(&mut tx, &id)
            .await
            .expect("find")
            .expect("found");
        S::rollback(tx).await.expect("rollback");
        assert_eq!(found.execution_span, given, "{name}: find");
        let looked_up = store.lookup(&id).await.expect("lookup").expect("found");
        assert_eq!(looked_up.execution_span, given, "{name}: lookup");
    }
}
