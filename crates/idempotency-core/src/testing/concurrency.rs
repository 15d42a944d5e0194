//! Conformance cases with concurrent transactions on the same key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{Barrier, oneshot};

use super::Capabilities;
use super::service_cases::service_with;
use super::support::{CountingAction, SuiteError, key, op};
use crate::store::{Acquire, Claim, IdempotencyStore, LockWait, StoreError};
use crate::{
    Call, Error, ExecutionResult, Fingerprint, IdempotencyService, InFlightPolicy, Outcome,
    RecordId, Scope, ServiceOptions, StoredOutcome,
};

/// Starts a request that holds `key` for `hold`, then succeeds (or fails, if `fail`).
/// Resolves the returned receiver once the key is acquired and the action is running.
fn hold_key<S: IdempotencyStore + Clone>(
    service: &IdempotencyService<S>,
    key: &crate::IdempotencyKey,
    request: &Value,
    counter: &CountingAction,
    hold: Duration,
    fail: bool,
) -> (
    oneshot::Receiver<()>,
    tokio::task::JoinHandle<Result<Outcome<Value>, SuiteError>>,
) {
    let (started_tx, started) = oneshot::channel();
    let (service, key, request, counter) = (
        service.clone(),
        key.clone(),
        request.clone(),
        counter.clone(),
    );
    let handle = tokio::spawn(async move {
        let mut started_tx = Some(started_tx);
        service
            .execute(Call::new("OP", key, &request), async |_conn| {
                counter.hit();
                if let Some(tx) = started_tx.take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(hold).await;
                if fail {
                    Err(SuiteError::Boom)
                } else {
                    Ok(ExecutionResult::success(json!("winner")))
                }
            })
            .await
    });
    (started, handle)
}

/// A duplicate that arrives while the first request runs waits, then replays its value.
pub async fn lost_race_replays_the_winner<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, counter, request) = (key("race"), CountingAction::default(), json!({"r": 1}));
    let (started, holder) = hold_key(
        &service,
        &k,
        &request,
        &counter,
        Duration::from_millis(300),
        false,
    );
    started.await.expect("holder started");
    let late: Outcome<Value> = service
        .execute(Call::new("OP", k.clone(), &request), async |_conn| {
            counter.hit();
            Ok::<_, SuiteError>(ExecutionResult::success(json!("loser")))
        })
        .await
        .expect("late duplicate");
    assert!(late.is_replayed());
    assert_eq!(late.result().value(), Some(&json!("winner")));
    assert!(holder.await.expect("join").expect("holder").is_executed());
    assert_eq!(counter.count(), 1);
}

/// A duplicate waiting on a request that then fails acquires the key and runs.
pub async fn retry_after_concurrent_rollback_runs<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, counter, request) = (
        key("rollback-race"),
        CountingAction::default(),
        json!({"r": 2}),
    );
    let (started, holder) = hold_key(
        &service,
        &k,
        &request,
        &counter,
        Duration::from_millis(300),
        true,
    );
    started.await.expect("holder started");
    let late: Outcome<Value> = service
        .execute(Call::new("OP", k.clone(), &request), async |_conn| {
            counter.hit();
            Ok::<_, SuiteError>(ExecutionResult::success(json!("second")))
        })
        .await
        .expect("late duplicate");
    assert!(matches!(holder.await.expect("join"), Err(SuiteError::Boom)));
    assert!(
        late.is_executed(),
        "the first one rolled back, so the duplicate runs"
    );
    assert_eq!(late.result().value(), Some(&json!("second")));
    assert_eq!(counter.count(), 2);
}

async fn stampede<S: IdempotencyStore + Clone>(
    service: &IdempotencyService<S>,
    tasks: usize,
) -> (CountingAction, Vec<Result<Outcome<Value>, SuiteError>>) {
    let (k, counter, request) = (
        key("stampede"),
        CountingAction::default(),
        json!({"amount": "1.00"}),
    );
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::new();
    for _ in 0..tasks {
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
                .execute(Call::new("OP", k, &request), async |_conn| {
                    let n = counter.hit();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Ok::<_, SuiteError>(ExecutionResult::success(json!({"run": n})))
                })
                .await
        }));
    }
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await.expect("join"));
    }
    (counter, results)
}

/// 50 simultaneous requests with one key under the wait policy: the action runs exactly once and
/// every other request replays its value.
pub async fn concurrent_duplicates_wait_policy_run_once<S: IdempotencyStore + Clone>(
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
    let (counter, results) = stampede(&service, 50).await;
    assert_eq!(counter.count(), 1, "the action ran more than once");
    let outcomes: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("wait policy: every request succeeds"))
        .collect();
    assert_eq!(outcomes.iter().filter(|o| o.is_executed()).count(), 1);
    for outcome in &outcomes {
        assert_eq!(outcome.result().value(), Some(&json!({"run": 1})));
    }
}

/// 50 simultaneous requests with one key under the reject policy: the action runs exactly once;
/// every other request replays or gets `InFlight`, and nothing else.
pub async fn concurrent_duplicates_reject_policy_run_once<S: IdempotencyStore + Clone>(
    store: S,
    caps: Capabilities,
) {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Reject,
        ..ServiceOptions::default()
    };
    let service = service_with(store, config);
    let (counter, results) = stampede(&service, 50).await;
    assert_eq!(counter.count(), 1, "the action ran more than once");
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    for result in results {
        match result {
            Ok(outcome) if outcome.is_executed() => executed += 1,
            Ok(outcome) => {
                assert_eq!(outcome.result().value(), Some(&json!({"run": 1})));
                replayed += 1;
            }
            Err(SuiteError::Idempotency(Error::InFlight)) => in_flight += 1,
            Err(other) => panic!("unexpected result: {other:?}"),
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_flight, 50);
    if caps.concurrent_writers {
        assert!(
            in_flight > 0,
            "no duplicate was rejected while the first one ran"
        );
    } else {
        assert_eq!(
            in_flight, 0,
            "a single-writer store serializes duplicates, which then replay"
        );
    }
}

/// How long a holder keeps a key in the wait-budget cases: longer than [`BUDGET_BOUND`], so a
/// duplicate that ends before the bound did not wait for the holder.
pub(crate) const HOLD: Duration = Duration::from_secs(6);

/// The longest a 200 ms wait budget may take, round trips included: MySQL rounds a lock wait up
/// to whole seconds, and a loaded machine adds seconds more to the statements around it.
pub(crate) const BUDGET_BOUND: Duration = Duration::from_secs(4);

/// A holder keeps the key for 6 s; a duplicate with a 200 ms budget gets `InFlight` within 4 s,
/// MySQL's rounding of the budget to whole seconds included (or, on a single-writer store,
/// waits at `begin` and replays).
pub async fn wait_budget_is_honoured<S: IdempotencyStore + Clone>(store: S, caps: Capabilities) {
    let config = ServiceOptions {
        in_flight: InFlightPolicy::Wait {
            timeout: Some(Duration::from_millis(200)),
        },
        ..ServiceOptions::default()
    };
    let service = service_with(store, config);
    let (k, counter, request) = (key("budget"), CountingAction::default(), json!({"b": 1}));
    let (started, holder) = hold_key(&service, &k, &request, &counter, HOLD, false);
    started.await.expect("holder started");
    let began = Instant::now();
    let result: Result<Outcome<Value>, SuiteError> = service
        .execute(Call::new("OP", k.clone(), &request), async |_conn| {
            counter.hit();
            Ok(ExecutionResult::success(json!("late")))
        })
        .await;
    // (the holder releases after `HOLD`, so even an ignored budget ends; the timing says which)
    let waited = began.elapsed();
    if caps.concurrent_writers {
        assert!(
            matches!(result, Err(SuiteError::Idempotency(Error::InFlight))),
            "{result:?}"
        );
        assert!(
            waited < BUDGET_BOUND,
            "waited {waited:?} for a 200 ms budget"
        );
        assert!(
            waited >= Duration::from_millis(150),
            "gave up after {waited:?}, before the budget"
        );
    } else {
        assert!(result.expect("replay").is_replayed());
    }
    holder.await.expect("join").expect("holder");
    assert_eq!(counter.count(), 1);
}

fn claim<'a>(id: &'a RecordId, fingerprint: &'a Fingerprint, wait: LockWait) -> Claim<'a> {
    Claim {
        id,
        fingerprint,
        ttl: None,
        wait,
    }
}

/// Store level: a second `acquire` of a held key finishes only after the holder commits, and then
/// reports `Exists`.
pub async fn store_concurrent_acquire_waits_for_commit<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    concurrent_acquire(store, true).await;
}

/// Store level: a second `acquire` of a held key acquires it once the holder rolls back.
pub async fn store_concurrent_acquire_after_rollback_acquires<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    concurrent_acquire(store, false).await;
}

async fn concurrent_acquire<S: IdempotencyStore + Clone>(store: S, commit: bool) {
    let id = RecordId::new(op("CONCURRENT"), Scope::default(), key("concurrent"));
    let fingerprint = Fingerprint::new("1".repeat(64));
    let mut holder = store.begin().await.expect("begin");
    let wait = LockWait::Timeout(Duration::from_secs(20));
    assert_eq!(
        store
            .acquire(&mut holder, &claim(&id, &fingerprint, wait))
            .await
            .expect("acquire"),
        Acquire::Acquired
    );

    let contender = {
        let (store, id, fingerprint) = (store.clone(), id.clone(), fingerprint.clone());
        tokio::spawn(async move {
            let mut tx = store.begin().await.expect("begin");
            let result = store
                .acquire(&mut tx, &claim(&id, &fingerprint, wait))
                .await
                .expect("acquire");
            S::rollback(tx).await.expect("rollback");
            result
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !contender.is_finished(),
        "the contender did not wait for the holder"
    );
    if commit {
        store
            .complete(
                &mut holder,
                &id,
                &StoredOutcome::Completed {
                    payload: "1".into(),
                },
                None,
            )
            .await
            .expect("complete");
        S::commit(holder).await.expect("commit");
    } else {
        S::rollback(holder).await.expect("rollback");
    }
    let expected = if commit {
        Acquire::Exists
    } else {
        Acquire::Acquired
    };
    assert_eq!(contender.await.expect("join"), expected);
}

/// Store level: `acquire` with a wait budget fails with `LockTimeout` within the budget, and
/// `NoWait` fails at once. A single-writer store instead serializes at `begin`: the contender's
/// `begin` waits until the holder ends.
pub async fn store_lock_wait_is_bounded<S: IdempotencyStore + Clone>(store: S, caps: Capabilities) {
    let id = RecordId::new(op("BOUNDED"), Scope::default(), key("bounded"));
    let fingerprint = Fingerprint::new("2".repeat(64));
    let mut holder = store.begin().await.expect("begin");
    store
        .acquire(&mut holder, &claim(&id, &fingerprint, LockWait::NoWait))
        .await
        .expect("acquire");
    if caps.concurrent_writers {
        for (wait, min, max) in [
            // The holder never lets go here: an ignored budget hits the 5 s timeout below.
            (
                LockWait::Timeout(Duration::from_millis(200)),
                Duration::from_millis(150),
                BUDGET_BOUND,
            ),
            // Below MySQL's smallest lock wait (1 s): `NoWait` did not become a 1 s wait.
            (LockWait::NoWait, Duration::ZERO, Duration::from_millis(900)),
        ] {
            let mut tx = store.begin().await.expect("begin");
            let began = Instant::now();
            let claim = claim(&id, &fingerprint, wait);
            let attempt = store.acquire(&mut tx, &claim);
            let error = tokio::time::timeout(Duration::from_secs(5), attempt)
                .await
                .expect("the wait budget was not applied: acquire still waiting after 5 s")
                .expect_err("must time out");
            let waited = began.elapsed();
            assert!(matches!(error, StoreError::LockTimeout(_)), "{error:?}");
            assert!(waited >= min && waited < max, "{wait:?} took {waited:?}");
            S::rollback(tx).await.expect("rollback");
        }
        S::rollback(holder).await.expect("rollback");
    } else {
        let contender = {
            let store = store.clone();
            tokio::spawn(async move {
                let tx = store.begin().await.expect("begin");
                S::rollback(tx).await.expect("rollback");
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !contender.is_finished(),
            "begin did not wait for the open writer"
        );
        S::rollback(holder).await.expect("rollback");
        contender.await.expect("join");
    }
}
