//! The store conformance suite (feature `test-utils`).
//!
//! Every case is an `async fn` generic over the store, checking a behaviour of the SPI or of the
//! service on top of it, never SQL text. A backend runs them all with one macro call, giving it
//! an async factory that returns a fresh, isolated store per test:
//!
//! ```ignore
//! async fn fresh_store() -> MyStore { /* a new schema or database per call */ }
//! idempotency_core::store_conformance_tests!(fresh_store, idempotency_core::testing::Capabilities::FULL);
//! ```
//!
//! A behaviour a backend cannot offer is declared in [`Capabilities`]; the case then checks the
//! documented alternative instead of being skipped.

mod concurrency;
mod leased;
mod optimistic;
mod service_cases;
mod store_cases;
mod support;

pub use concurrency::*;
pub use leased::*;
pub use optimistic::*;
pub use service_cases::*;
pub use store_cases::*;
pub use support::{
    CountingAction, FailingAcquireStore, RecordingCache, SuiteError, VanishingStore, key, op,
};

/// What a backend can do, where backends legitimately differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Two transactions can both be open and writing; a second `acquire` of a held key waits in
    /// `acquire` itself (PostgreSQL). When `false`, writers are serialized at `begin` (SQLite's
    /// `BEGIN IMMEDIATE`): a duplicate waits there, so the in-flight `reject` policy and the
    /// acquire wait budget never trigger, and the duplicate replays instead.
    pub concurrent_writers: bool,
}

impl Capabilities {
    /// Everything the suite checks (PostgreSQL).
    pub const FULL: Self = Self {
        concurrent_writers: true,
    };
    /// One writer at a time (SQLite).
    pub const SINGLE_WRITER: Self = Self {
        concurrent_writers: false,
    };
}

/// Generates one `#[tokio::test]` per conformance case, calling `$factory().await` for a fresh
/// store each time. `$caps` is a [`Capabilities`] value.
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:path, $caps:expr) => {
        $crate::store_conformance_tests!(@cases $factory, $caps;
            store_acquire_inserts_processing,
            store_complete_then_find_after_commit,
            store_acquire_existing_reports_exists,
            store_rejected_round_trip,
            store_rollback_removes_record,
            store_complete_without_claim_fails,
            store_complete_twice_fails,
            store_identity_is_operation_scope_key,
            store_ttl_sets_expires_at,
            store_find_unknown_is_none,
            store_payload_round_trip,
            store_long_keys_round_trip,
            store_expired_record_is_still_found,
            store_cleanup_deletes_only_expired_in_batches,
            store_keeps_the_execution_span,
            first_run_executes_and_replay_does_not,
            rejected_outcome_is_replayed,
            rejection_codes_are_checked_before_writing,
            outcomes_nested_deeper_than_the_limit_are_refused_before_writing,
            payload_conflict_is_an_error,
            equivalent_payloads_replay,
            operations_are_independent,
            scopes_are_independent,
            technical_failure_rolls_back_and_retry_runs,
            void_results_round_trip,
            ttl_per_call_per_operation_default_and_absent,
            expired_records_replay_until_cleanup_then_run_again,
            disabled_service_runs_every_time,
            lookup_before_acquire_replays_from_the_store,
            execute_in_follows_the_callers_transaction,
            commit_after_a_failed_action_commits_nothing,
            commit_after_a_store_error_commits_nothing,
            outcomes_replay_byte_for_byte,
            caches_are_written_only_after_commit,
            invalid_operation_is_rejected_before_io,
            acquire_loop_exhaustion_is_an_error,
            lost_race_replays_the_winner,
            retry_after_concurrent_rollback_runs,
            concurrent_duplicates_wait_policy_run_once,
            concurrent_duplicates_reject_policy_run_once,
            wait_budget_is_honoured,
            store_concurrent_acquire_waits_for_commit,
            store_concurrent_acquire_after_rollback_acquires,
            store_lock_wait_is_bounded,
        );
    };
    (@cases $factory:path, $caps:expr; $($case:ident),* $(,)?) => {
        $crate::__conformance_cases!($factory, $caps; $($case),*);
    };
}

/// Generates the `execute_optimistic` conformance cases, for stores that implement
/// [`InsertCompleted`](crate::store::InsertCompleted).
#[macro_export]
macro_rules! optimistic_conformance_tests {
    ($factory:path, $caps:expr) => {
        $crate::__conformance_cases!($factory, $caps;
            optimistic_first_run_then_replay,
            optimistic_rejection_conflict_and_failure,
            optimistic_concurrent_duplicates_one_commits,
            optimistic_failure_after_a_winner_replays_it,
            optimistic_wait_budget_is_honoured,
            optimistic_insert_keeps_the_execution_span,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($factory:path, $caps:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                // A hang (a wait that never ends) is a failure, not a stuck CI job.
                let case = $crate::testing::$case($factory().await, $caps);
                if ::tokio::time::timeout(::std::time::Duration::from_secs(120), case).await.is_err() {
                    panic!("conformance case {} did not finish within 120 s", stringify!($case));
                }
            }
        )*
    };
}
