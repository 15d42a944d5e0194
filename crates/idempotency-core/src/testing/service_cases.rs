//! Conformance cases for `execute` on top of a store: the reference starter's own scenarios.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::Capabilities;
use super::store_cases::seed;
use super::support::{CountingAction, RecordingCache, SuiteError, VanishingStore, key};
use crate::cache::LocalCache;
use crate::cleanup::purge_expired;
use crate::store::{ExpiredCleanup, IdempotencyStore};
use crate::{
    Call, Error, ExecutionResult, Fingerprint, IdempotencyKey, IdempotencyService, Level, Origin,
    Outcome, RecordId, RecordStatus, Scope, ServiceOptions, Tx,
};

pub(crate) fn service_with<S: IdempotencyStore>(
    store: S,
    config: ServiceOptions,
) -> IdempotencyService<S> {
    IdempotencyService::builder(store).config(config).build()
}

/// Runs a counting action that returns `value`.
pub(crate) async fn run<S: IdempotencyStore, L: LocalCache>(
    service: &IdempotencyService<S, L>,
    operation: &str,
    key: &IdempotencyKey,
    request: &Value,
    counter: &CountingAction,
    value: Value,
) -> Result<Outcome<Value>, SuiteError> {
    service
        .execute(Call::new(operation, key.clone(), request), async |_conn| {
            counter.hit();
            Ok(ExecutionResult::success(value))
        })
        .await
}

/// Runs a counting action that returns `value`, inside the caller's transaction `tx`.
async fn run_in<S: IdempotencyStore, L: LocalCache, T: Serialize + DeserializeOwned>(
    service: &IdempotencyService<S, L>,
    tx: &mut Tx<S>,
    key: &IdempotencyKey,
    request: &Value,
    counter: &CountingAction,
    value: T,
) -> Result<Outcome<T>, SuiteError> {
    service
        .execute_in(tx, Call::new("OP", key.clone(), request), async |_conn| {
            counter.hit();
            Ok(ExecutionResult::success(value))
        })
        .await
}

fn replayed_from(outcome: &Outcome<Value>) -> Option<Level> {
    match outcome.origin() {
        Origin::Replayed { from } => Some(from),
        Origin::Executed => None,
    }
}

async fn record_of<S: IdempotencyStore>(
    store: &S,
    id: &RecordId,
) -> Option<crate::IdempotencyRecord> {
    let mut tx = store.begin().await.expect("begin");
    let found = store.find(&mut tx, id).await.expect("find");
    S::rollback(tx).await.expect("rollback");
    found
}

/// First run executes; the repeat replays the same value without running the action.
pub async fn first_run_executes_and_replay_does_not<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("first"), CountingAction::default());
    let request = json!({"orderId": "o-1", "amount": "100.00"});
    let first = run(
        &service,
        "CREATE_PAYMENT",
        &k,
        &request,
        &counter,
        json!({"paymentId": "p-1"}),
    )
    .await
    .expect("first");
    assert!(first.is_executed());
    let again = run(
        &service,
        "CREATE_PAYMENT",
        &k,
        &request,
        &counter,
        json!({"paymentId": "p-2"}),
    )
    .await
    .expect("replay");
    assert_eq!(replayed_from(&again), Some(Level::Persistence));
    assert_eq!(
        again.result(),
        first.result(),
        "the replay returns the first value"
    );
    assert_eq!(counter.count(), 1);
}

/// A business rejection is stored and replayed with its code and details.
pub async fn rejected_outcome_is_replayed<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("rejected"), CountingAction::default());
    let request = json!({"amount": "5000.00"});
    let details = json!({"requestedAmount": "5000.00", "availableBalance": "1000.00"});
    for round in 0..2 {
        let outcome: Outcome<Value> = service
            .execute(
                Call::new("CREATE_PAYMENT", k.clone(), &request),
                async |_conn| {
                    counter.hit();
                    Ok::<_, SuiteError>(
                        ExecutionResult::rejected_with("INSUFFICIENT_FUNDS", &details)
                            .expect("details"),
                    )
                },
            )
            .await
            .expect("execute");
        assert_eq!(outcome.is_replayed(), round == 1);
        let rejection = outcome.result().rejection().expect("rejection");
        assert_eq!(rejection.code(), "INSUFFICIENT_FUNDS");
        assert_eq!(rejection.details(), Some(&details));
    }
    assert_eq!(counter.count(), 1);
    let id = RecordId::new(
        crate::Operation::new("CREATE_PAYMENT").expect("op"),
        Scope::default(),
        k,
    );
    assert_eq!(
        record_of(service.store(), &id)
            .await
            .expect("record")
            .status(),
        RecordStatus::Rejected
    );
}

/// A rejection code the store cannot keep (empty, or over 128 characters) is a typed error
/// before anything is written: nothing is stored and the key can run again. 128 characters
/// (multi-byte ones included) round-trip.
pub async fn rejection_codes_are_checked_before_writing<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let counter = CountingAction::default();
    let request = json!({"amount": "1.00"});
    for bad in [String::new(), "X".repeat(129)] {
        let k = key("bad-code");
        let failed: Result<Outcome<Value>, SuiteError> = service
            .execute(Call::new("OP", k.clone(), &request), async |_conn| {
                counter.hit();
                Ok(ExecutionResult::rejected(bad.clone()))
            })
            .await;
        assert!(
            matches!(
                failed.as_ref().map_err(SuiteError::idempotency),
                Err(Some(Error::Serialization(
                    crate::SerializationError::RejectionCode { len }
                ))) if *len == bad.chars().count()
            ),
            "{failed:?}"
        );
        let id = RecordId::new(
            crate::Operation::new("OP").expect("op"),
            Scope::default(),
            k,
        );
        assert!(
            record_of(service.store(), &id).await.is_none(),
            "nothing stored"
        );
    }
    let longest = "É".repeat(crate::MAX_REJECTION_CODE_LEN);
    let k = key("longest-code");
    for round in 0..2 {
        let outcome: Outcome<Value> = service
            .execute(Call::new("OP", k.clone(), &request), async |_conn| {
                counter.hit();
                Ok::<_, SuiteError>(ExecutionResult::rejected(longest.clone()))
            })
            .await
            .expect("a 128-character code is stored");
        assert_eq!(outcome.is_replayed(), round == 1);
        assert_eq!(
            outcome.result().rejection().expect("rejection").code(),
            longest
        );
    }
    assert_eq!(counter.count(), 3);
}

/// JSON `depth` levels deep: `depth` nested arrays around a string.
fn nested_json(depth: usize) -> Value {
    (0..depth).fold(json!("leaf"), |inner, _| Value::Array(vec![inner]))
}

/// An outcome nested deeper than [`MAX_JSON_DEPTH`](crate::MAX_JSON_DEPTH) (a value, or a
/// rejection's details) fails with `SerializationError::TooDeep` before anything is written, on
/// every backend alike: nothing is stored, a retry runs again and fails the same way, and in
/// `execute_in` the caller's commit refuses the unfinished claim. The deepest allowed outcome
/// is stored and replayed.
pub async fn outcomes_nested_deeper_than_the_limit_are_refused_before_writing<
    S: IdempotencyStore,
>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let counter = CountingAction::default();
    let request = json!({"amount": "1.00"});
    let too_deep = nested_json(crate::MAX_JSON_DEPTH + 1);
    let is_too_deep = |failed: &Result<Outcome<Value>, SuiteError>| {
        matches!(
            failed.as_ref().map_err(SuiteError::idempotency),
            Err(Some(Error::Serialization(crate::SerializationError::TooDeep(
                crate::JsonTooDeep { depth }
            )))) if *depth == crate::MAX_JSON_DEPTH + 1
        )
    };
    let outcomes = [
        ExecutionResult::success(too_deep.clone()),
        ExecutionResult::rejected_with("DEEP", &too_deep).expect("details"),
    ];
    for (n, outcome) in outcomes.iter().enumerate() {
        let k = key("too-deep");
        let id = RecordId::new(
            crate::Operation::new("OP").expect("op"),
            Scope::default(),
            k.clone(),
        );
        for attempt in 0..2 {
            let failed: Result<Outcome<Value>, SuiteError> = service
                .execute(Call::new("OP", k.clone(), &request), async |_conn| {
                    counter.hit();
                    Ok(outcome.clone())
                })
                .await;
            assert!(
                is_too_deep(&failed),
                "outcome {n}, attempt {attempt}: {failed:?}"
            );
            assert!(
                record_of(service.store(), &id).await.is_none(),
                "outcome {n}, attempt {attempt}: nothing stored"
            );
        }
        let mut tx: Tx<S> = service.begin().await.expect("begin");
        let failed: Result<Outcome<Value>, SuiteError> = service
            .execute_in(
                &mut tx,
                Call::new("OP", k.clone(), &request),
                async |_conn| {
                    counter.hit();
                    Ok(outcome.clone())
                },
            )
            .await;
        assert!(is_too_deep(&failed), "execute_in, outcome {n}: {failed:?}");
        let committed = tx.commit().await;
        assert!(
            matches!(
                committed,
                Err(crate::StoreError::UnfinishedClaim { count: 1 })
            ),
            "the caller's commit is refused: {committed:?}"
        );
        assert!(
            record_of(service.store(), &id).await.is_none(),
            "execute_in, outcome {n}: nothing stored"
        );
    }
    assert_eq!(counter.count(), 6, "every attempt ran the action");
    let deepest = nested_json(crate::MAX_JSON_DEPTH);
    let k = key("deepest");
    for round in 0..2 {
        let outcome = run(&service, "OP", &k, &request, &counter, deepest.clone())
            .await
            .expect("the deepest outcome allowed is stored");
        assert_eq!(outcome.is_replayed(), round == 1);
        assert_eq!(outcome.result().value(), Some(&deepest));
    }
    assert_eq!(counter.count(), 7);
}

/// The same key with another payload is a `PayloadConflict`, and the action does not run.
pub async fn payload_conflict_is_an_error<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("conflict"), CountingAction::default());
    run(
        &service,
        "CREATE_PAYMENT",
        &k,
        &json!({"amount": "100.00"}),
        &counter,
        json!(1),
    )
    .await
    .expect("first");
    let error = run(
        &service,
        "CREATE_PAYMENT",
        &k,
        &json!({"amount": "200.00"}),
        &counter,
        json!(2),
    )
    .await
    .expect_err("conflict");
    assert!(
        matches!(error.idempotency(), Some(Error::PayloadConflict)),
        "{error:?}"
    );
    assert_eq!(counter.count(), 1);
}

/// Key order, whitespace and number spelling do not make a different payload.
pub async fn equivalent_payloads_replay<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("equivalent"), CountingAction::default());
    let a: Value =
        serde_json::from_str(r#"{"amountCents":4900,"meta":{"x":1,"y":[1,2]}}"#).expect("json");
    let b: Value =
        serde_json::from_str("{ \"meta\": {\"y\": [1.0, 2e0], \"x\": 1}, \"amountCents\": 49e2 }")
            .expect("json");
    run(&service, "CHARGE", &k, &a, &counter, json!("c-1"))
        .await
        .expect("first");
    let replay = run(&service, "CHARGE", &k, &b, &counter, json!("c-2"))
        .await
        .expect("replay");
    assert!(replay.is_replayed());
    assert_eq!(counter.count(), 1);
}

/// The same key under two operations runs twice.
pub async fn operations_are_independent<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("ops"), CountingAction::default());
    let request = json!({"amount": "10.00"});
    assert!(
        run(&service, "CREATE_PAYMENT", &k, &request, &counter, json!(1))
            .await
            .expect("a")
            .is_executed()
    );
    assert!(
        run(&service, "REFUND", &k, &request, &counter, json!(2))
            .await
            .expect("b")
            .is_executed()
    );
    assert_eq!(counter.count(), 2);
}

/// The same key under two scopes runs twice, and neither sees the other's value.
pub async fn scopes_are_independent<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let k = key("scopes");
    let request = json!({"amount": "10.00"});
    let counter = CountingAction::default();
    for (tenant, value) in [("tenant-a", "A-secret"), ("tenant-b", "B-secret")] {
        let outcome: Outcome<String> = service
            .execute(
                Call::new("CREATE_PAYMENT", k.clone(), &request)
                    .scoped(Scope::new(tenant).expect("scope")),
                async |_conn| {
                    counter.hit();
                    Ok::<_, SuiteError>(ExecutionResult::success(value.to_owned()))
                },
            )
            .await
            .expect("execute");
        assert!(outcome.is_executed(), "{tenant} must run its own action");
        assert_eq!(outcome.result().value().map(String::as_str), Some(value));
    }
    assert_eq!(counter.count(), 2);
}

/// A technical failure stores nothing: the retry with the same key runs from scratch.
pub async fn technical_failure_rolls_back_and_retry_runs<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("tech"), CountingAction::default());
    let request = json!({"recipient": "FAIL_ONCE"});
    let failed: Result<Outcome<Value>, SuiteError> = service
        .execute(
            Call::new("CREATE_PAYMENT", k.clone(), &request),
            async |_conn| {
                counter.hit();
                Err(SuiteError::Boom)
            },
        )
        .await;
    assert!(matches!(failed, Err(SuiteError::Boom)));
    let id = RecordId::new(
        crate::Operation::new("CREATE_PAYMENT").expect("op"),
        Scope::default(),
        k.clone(),
    );
    assert!(
        record_of(service.store(), &id).await.is_none(),
        "nothing stored"
    );
    let retry = run(
        &service,
        "CREATE_PAYMENT",
        &k,
        &request,
        &counter,
        json!("ok"),
    )
    .await
    .expect("retry");
    assert!(retry.is_executed());
    assert_eq!(counter.count(), 2);
}

/// Result-less operations store and replay `()`.
pub async fn void_results_round_trip<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("void"), CountingAction::default());
    for round in 0..2 {
        let outcome: Outcome<()> = service
            .execute(Call::new("NOTIFY", k.clone(), &json!({})), async |_conn| {
                counter.hit();
                Ok::<_, SuiteError>(ExecutionResult::success(()))
            })
            .await
            .expect("execute");
        assert_eq!(outcome.is_replayed(), round == 1);
        assert_eq!(outcome.into_result(), ExecutionResult::Success(()));
    }
    assert_eq!(counter.count(), 1);
}

/// `expires_at` comes from the call's TTL, else the operation's, else the default; or is absent.
pub async fn ttl_per_call_per_operation_default_and_absent<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let day = Duration::from_secs(24 * 3600);
    let mut config = ServiceOptions {
        default_ttl: Some(10 * day),
        ..ServiceOptions::default()
    };
    config.operation_ttls.insert("SHORT".to_owned(), Some(day));
    let service = service_with(store.clone(), config.clone());
    let request = json!({});
    let cases: [(&str, Option<Duration>, Option<Duration>); 4] = [
        ("DEFAULT", None, Some(10 * day)),
        ("SHORT", None, Some(day)),
        ("SHORT", Some(3 * day), Some(3 * day)),
        ("DEFAULT", Some(Duration::ZERO), None),
    ];
    for (operation, per_call, expected) in cases {
        let k = key("ttl");
        let mut call = Call::new(operation, k.clone(), &request);
        call = match per_call {
            Some(Duration::ZERO) => call.no_expiry(),
            Some(ttl) => call.ttl(ttl),
            None => call,
        };
        let _: Outcome<()> = service
            .execute(call, async |_conn| {
                Ok::<_, SuiteError>(ExecutionResult::success(()))
            })
            .await
            .expect("execute");
        let id = RecordId::new(
            crate::Operation::new(operation).expect("op"),
            Scope::default(),
            k,
        );
        let record = record_of(&store, &id).await.expect("record");
        let lived = record
            .expires_at
            .map(|at| at.duration_since(record.created_at).expect("after"));
        match (lived, expected) {
            (Some(lived), Some(expected)) => assert!(
                lived.abs_diff(expected) < Duration::from_secs(2),
                "{operation}: {lived:?}"
            ),
            (None, None) => {}
            other => panic!("{operation} {per_call:?}: {other:?}"),
        }
    }
    let absent = service_with(
        store.clone(),
        ServiceOptions {
            default_ttl: None,
            ..config
        },
    );
    let k = key("ttl");
    let _: Outcome<()> = absent
        .execute(Call::new("DEFAULT", k.clone(), &request), async |_conn| {
            Ok::<_, SuiteError>(ExecutionResult::success(()))
        })
        .await
        .expect("execute");
    let id = RecordId::new(
        crate::Operation::new("DEFAULT").expect("op"),
        Scope::default(),
        k,
    );
    assert_eq!(
        record_of(&store, &id).await.expect("record").expires_at,
        None
    );
}

/// Expired records replay until cleanup deletes them; then the key runs again.
pub async fn expired_records_replay_until_cleanup_then_run_again<
    S: IdempotencyStore + ExpiredCleanup + Clone,
>(
    store: S,
    _caps: Capabilities,
) {
    let service = service_with(
        store.clone(),
        ServiceOptions {
            default_ttl: Some(Duration::from_millis(1)),
            ..ServiceOptions::default()
        },
    );
    let (k, counter) = (key("expired"), CountingAction::default());
    let request = json!({"n": 1});
    run(&service, "OP", &k, &request, &counter, json!(1))
        .await
        .expect("first");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        run(&service, "OP", &k, &request, &counter, json!(2))
            .await
            .expect("replay")
            .is_replayed()
    );
    assert!(purge_expired(&store, 100).await.expect("purge").deleted >= 1);
    let again = run(&service, "OP", &k, &request, &counter, json!(3))
        .await
        .expect("re-acquire");
    assert!(again.is_executed());
    assert_eq!(again.result().value(), Some(&json!(3)));
    assert_eq!(counter.count(), 2);
}

/// With `enabled: false` the action runs every time and nothing is stored.
pub async fn disabled_service_runs_every_time<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let service = service_with(
        store.clone(),
        ServiceOptions {
            enabled: false,
            ..ServiceOptions::default()
        },
    );
    let (k, counter) = (key("disabled"), CountingAction::default());
    for _ in 0..2 {
        assert!(
            run(&service, "OP", &k, &json!({}), &counter, json!(1))
                .await
                .expect("run")
                .is_executed()
        );
    }
    assert_eq!(counter.count(), 2);
    let id = RecordId::new(
        crate::Operation::new("OP").expect("op"),
        Scope::default(),
        k,
    );
    assert!(record_of(&store, &id).await.is_none());
}

/// With `lookup_before_acquire`, a committed key replays from the store.
pub async fn lookup_before_acquire_replays_from_the_store<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = service_with(
        store,
        ServiceOptions {
            lookup_before_acquire: true,
            ..ServiceOptions::default()
        },
    );
    let (k, counter) = (key("lookup"), CountingAction::default());
    let request = json!({"a": 1});
    assert!(
        run(&service, "OP", &k, &request, &counter, json!(1))
            .await
            .expect("first")
            .is_executed()
    );
    let replay = run(&service, "OP", &k, &request, &counter, json!(2))
        .await
        .expect("replay");
    assert_eq!(replayed_from(&replay), Some(Level::Persistence));
    let conflict = run(&service, "OP", &k, &json!({"a": 2}), &counter, json!(3))
        .await
        .expect_err("conflict");
    assert!(matches!(
        conflict.idempotency(),
        Some(Error::PayloadConflict)
    ));
    // The same lookup inside a caller's transaction.
    let mut tx = service.begin().await.expect("begin");
    let inside: Outcome<Value> = run_in(&service, &mut tx, &k, &request, &counter, json!(4))
        .await
        .expect("replay in a transaction");
    tx.commit().await.expect("commit");
    assert_eq!(replayed_from(&inside), Some(Level::Persistence));
    assert_eq!(inside.result().value(), Some(&json!(1)));
    assert_eq!(counter.count(), 1);
}

/// `execute_in` writes in the caller's transaction: its rollback removes the record, its commit
/// keeps it.
pub async fn execute_in_follows_the_callers_transaction<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let (k, counter) = (key("caller-tx"), CountingAction::default());
    let request = json!({"x": 1});
    let id = RecordId::new(
        crate::Operation::new("OP").expect("op"),
        Scope::default(),
        k.clone(),
    );
    for commit in [false, true] {
        let mut tx = service.begin().await.expect("begin");
        let outcome: Outcome<i32> = run_in(&service, &mut tx, &k, &request, &counter, 7)
            .await
            .expect("execute_in");
        assert!(outcome.is_executed());
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        assert_eq!(record_of(service.store(), &id).await.is_some(), commit);
    }
    assert_eq!(
        counter.count(),
        2,
        "the rolled-back run left nothing behind, so the key ran again"
    );
}

/// A caller that commits its transaction after `execute_in` failed in the action does not
/// commit a `PROCESSING` record: the commit rolls back with `UnfinishedClaim`, the caller's own
/// statements go with it, and a retry with the key runs.
pub async fn commit_after_a_failed_action_commits_nothing<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let cache = RecordingCache::default();
    let service = IdempotencyService::builder(store)
        .local_cache(cache.clone())
        .build();
    let (k, counter) = (key("unfinished"), CountingAction::default());
    let request = json!({"x": 1});
    let id = RecordId::new(
        crate::Operation::new("OP").expect("op"),
        Scope::default(),
        k.clone(),
    );

    let mut tx: Tx<S> = service.begin().await.expect("begin");
    let failed: Result<Outcome<i32>, SuiteError> = service
        .execute_in(
            &mut tx,
            Call::new("OP", k.clone(), &request),
            async |_conn| {
                counter.hit();
                Err(SuiteError::Boom)
            },
        )
        .await;
    assert!(matches!(failed, Err(SuiteError::Boom)));
    assert_eq!(tx.unfinished_claims(), 1);
    let committed = tx.commit().await;
    assert!(
        matches!(
            committed,
            Err(crate::StoreError::UnfinishedClaim { count: 1 })
        ),
        "commit refused: {committed:?}"
    );
    assert!(
        record_of(service.store(), &id).await.is_none(),
        "no PROCESSING record committed"
    );
    assert!(cache.is_empty(), "nothing cached");

    let mut tx: Tx<S> = service.begin().await.expect("begin");
    let retry: Outcome<i32> = run_in(&service, &mut tx, &k, &request, &counter, 5)
        .await
        .expect("retry");
    assert_eq!(tx.unfinished_claims(), 0, "the outcome is stored");
    tx.commit().await.expect("commit");
    assert!(retry.is_executed());
    assert!(matches!(retry.result(), ExecutionResult::Success(5)));
    assert_eq!(counter.count(), 2, "the retry ran the action");
    assert!(record_of(service.store(), &id).await.is_some());
}

/// Caches are written after the commit only, and never on rollback.
pub async fn caches_are_written_only_after_commit<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let cache = RecordingCache::default();
    let service = IdempotencyService::builder(store)
        .local_cache(cache.clone())
        .build();
    let (k, counter) = (key("cache"), CountingAction::default());
    let request = json!({"x": 1});

    let mut tx: Tx<S> = service.begin().await.expect("begin");
    let _: Outcome<i32> = run_in(&service, &mut tx, &k, &request, &counter, 1)
        .await
        .expect("execute_in");
    assert!(cache.is_empty(), "written before the commit");
    tx.rollback().await.expect("rollback");
    assert!(cache.is_empty(), "written although rolled back");

    run(&service, "OP", &k, &request, &counter, json!(2))
        .await
        .expect("commit path");
    assert_eq!(cache.len(), 1, "filled after the commit");
    let replay = run(&service, "OP", &k, &request, &counter, json!(3))
        .await
        .expect("replay");
    assert_eq!(replayed_from(&replay), Some(Level::Local));
    assert_eq!(counter.count(), 2);
}

/// An invalid operation name is a typed error before any I/O.
pub async fn invalid_operation_is_rejected_before_io<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let service = IdempotencyService::new(store);
    let counter = CountingAction::default();
    for bad in ["", "has space", "ünïcode"] {
        let error = run(&service, bad, &key("badop"), &json!({}), &counter, json!(1))
            .await
            .expect_err("invalid");
        assert!(
            matches!(error.idempotency(), Some(Error::InvalidInput(_))),
            "{bad:?}: {error:?}"
        );
    }
    assert_eq!(counter.count(), 0);
}

/// When the existing record keeps vanishing before it can be read, the loop gives up after the
/// configured attempts with `AcquireExhausted`.
pub async fn acquire_loop_exhaustion_is_an_error<S: IdempotencyStore + Clone>(
    store: S,
    _caps: Capabilities,
) {
    let k = key("exhaust");
    let id = RecordId::new(
        crate::Operation::new("OP").expect("op"),
        Scope::default(),
        k.clone(),
    );
    seed(&store, &id, &Fingerprint::new("0".repeat(64)), None).await;
    let config = ServiceOptions {
        max_acquire_attempts: 4,
        ..ServiceOptions::default()
    };
    let service = IdempotencyService::builder(VanishingStore(store))
        .config(config)
        .build();
    let counter = CountingAction::default();
    let error = run(&service, "OP", &k, &json!({}), &counter, json!(1))
        .await
        .expect_err("exhausted");
    assert!(
        matches!(
            error.idempotency(),
            Some(Error::AcquireExhausted { attempts: 4 })
        ),
        "{error:?}"
    );
    assert_eq!(counter.count(), 0);
}

/// A store error inside `execute_in` poisons the caller's transaction (PostgreSQL aborts it,
/// and answers a later `COMMIT` with a silent rollback): a caller that commits anyway gets
/// [`StoreError::Poisoned`](crate::StoreError::Poisoned) after a rollback, the key completed
/// earlier in the same transaction is not stored, and no after-commit hook caches it.
pub async fn commit_after_a_store_error_commits_nothing<S: IdempotencyStore>(
    store: S,
    _caps: Capabilities,
) {
    let cache = RecordingCache::default();
    let service = IdempotencyService::builder(super::FailingAcquireStore(store))
        .local_cache(cache.clone())
        .build();
    let counter = CountingAction::default();
    let (good, bad) = (key("poison-ok"), key("fail-poison"));
    let request = json!({"x": 1});
    let id = RecordId::new(
        crate::Operation::new("OP").expect("op"),
        Scope::default(),
        good.clone(),
    );

    let mut tx = service.begin().await.expect("begin");
    let first: Outcome<i32> = run_in(&service, &mut tx, &good, &request, &counter, 1)
        .await
        .expect("first key");
    assert!(first.is_executed());
    let failed: Result<Outcome<i32>, SuiteError> =
        run_in(&service, &mut tx, &bad, &request, &counter, 2).await;
    assert!(
        matches!(
            failed.as_ref().map_err(SuiteError::idempotency),
            Err(Some(Error::Store(_)))
        ),
        "{failed:?}"
    );
    assert!(tx.is_poisoned());
    let committed = tx.commit().await;
    assert!(
        matches!(committed, Err(crate::StoreError::Poisoned)),
        "commit after a store error: {committed:?}"
    );
    assert!(
        record_of(service.store(), &id).await.is_none(),
        "the first key was rolled back with the transaction"
    );
    assert!(cache.is_empty(), "no after-commit hook ran");
    assert_eq!(counter.count(), 1, "the failing key never ran its action");

    // The retry of the first key runs again: nothing of the poisoned transaction survived.
    let retry = run(&service, "OP", &good, &request, &counter, json!(3))
        .await
        .expect("retry");
    assert!(retry.is_executed());
    assert_eq!(counter.count(), 2);
}

/// Whatever JSON the serializer produces replays byte for byte from the store: object keys in
/// their order, numbers as spelled (`1e2`, `1.50`), `\u0000` escapes; rejection details with a
/// NUL replay equal.
pub async fn outcomes_replay_byte_for_byte<S: IdempotencyStore>(store: S, _caps: Capabilities) {
    use serde_json::value::RawValue;

    let service = IdempotencyService::new(store);
    let text = r#"{"b":1,"a":"x\u0000y","n":1e2,"nested":{"z":[1.50,-0.0],"y":null}}"#;
    let counter = CountingAction::default();
    let request = json!({"x": 1});
    let k = key("bytes");
    for round in 0..2 {
        let outcome: Outcome<Box<RawValue>> = service
            .execute(Call::new("OP", k.clone(), &request), async |_conn| {
                counter.hit();
                let raw = RawValue::from_string(text.to_owned()).map_err(|_| SuiteError::Boom)?;
                Ok::<_, SuiteError>(ExecutionResult::success(raw))
            })
            .await
            .expect("execute");
        assert_eq!(outcome.is_replayed(), round == 1);
        assert_eq!(
            outcome.result().value().map(|raw| raw.get()),
            Some(text),
            "round {round}"
        );
    }
    assert_eq!(counter.count(), 1);

    let details = json!({"reason": "nul \u{0} inside", "limit": 100});
    let k = key("bytes-rejected");
    for round in 0..2 {
        let outcome: Outcome<()> = service
            .execute(Call::new("OP", k.clone(), &request), async |_conn| {
                counter.hit();
                ExecutionResult::rejected_with("NUL_DETAILS", &details)
                    .map_err(|_| SuiteError::Boom)
            })
            .await
            .expect("execute rejected");
        assert_eq!(outcome.is_replayed(), round == 1);
        let rejection = outcome.result().rejection().expect("rejected");
        assert_eq!(rejection.details(), Some(&details), "round {round}");
    }
    assert_eq!(counter.count(), 2);
}
