//! The outbox conformance suite (feature `test-utils`): the contract of the storage SPI
//! ([`Enqueue`](crate::Enqueue), [`RelayStore`](crate::RelayStore),
//! [`Housekeeping`](crate::Housekeeping), [`DeadLetters`](crate::DeadLetters),
//! [`Inbox`](crate::Inbox)) and of the relay on top of it, as cases every backend runs.
//!
//! A backend implements [`OutboxBackend`] (fresh, isolated tables per value; how to begin,
//! commit and roll back a transaction) and runs every case with one macro call:
//!
//! ```ignore
//! async fn backend() -> MyBackend { /* a new schema or database per call */ }
//! idempotency_outbox::outbox_conformance_tests!(backend, idempotency_outbox::testing::Capabilities::FULL);
//! ```
//!
//! A behaviour a backend cannot offer is declared in [`Capabilities`]; the case then checks the
//! documented alternative instead of being skipped.

mod backend;
mod claim_cases;
mod enqueue_cases;
mod inbox_cases;
mod relay_cases;
mod support;

pub use backend::{Capabilities, OutboxBackend};
pub use claim_cases::*;
pub use enqueue_cases::*;
pub use inbox_cases::*;
pub use relay_cases::*;
pub use support::{CollectingPublisher, event, suite_config};

/// Generates one `#[tokio::test]` per outbox conformance case, calling `$factory().await` for
/// a fresh [`OutboxBackend`] each time. `$caps` is a [`Capabilities`] value.
#[macro_export]
macro_rules! outbox_conformance_tests {
    ($factory:path, $caps:expr) => {
        $crate::__outbox_conformance_cases!($factory, $caps;
            enqueue_commits_and_rolls_back_with_the_callers_transaction,
            payloads_and_headers_round_trip_byte_for_byte,
            ordered_events_are_numbered_per_aggregate_in_commit_order,
            unordered_events_have_no_sequence,
            invalid_events_are_refused_before_writing,
            payloads_nested_deeper_than_the_limit_are_invalid_events,
            enqueue_of_nothing_is_a_no_op,
            writes_outside_a_transaction_are_refused,
            a_second_writer_of_an_aggregate_numbers_after_the_first,
            ordered_claims_take_the_first_pending_row_of_each_aggregate,
            unordered_claims_take_every_due_row,
            a_claim_is_a_lease_and_an_expired_lease_returns_the_row,
            a_stale_token_cannot_mark_rows_another_claim_took_over,
            failures_back_off_and_dead_letters_can_be_requeued,
            a_row_claimed_max_attempts_times_without_completing_is_dead_lettered,
            transient_failures_give_back_their_attempt,
            an_error_text_with_a_nul_character_is_recorded,
            a_requeue_that_would_publish_out_of_order_is_refused,
            rows_a_dead_relay_left_unmarked_come_back_one_per_claim,
            stats_count_pending_and_dead_rows_and_age_the_oldest,
            retention_deletes_in_bounded_batches,
            notifications_wake_a_listener_after_commit,
            the_relay_publishes_committed_events_once_in_aggregate_order,
            a_poison_message_is_dead_lettered_without_holding_other_aggregates,
            a_relay_that_dies_before_marking_republishes_after_the_lease,
            full_batches_overlap_their_marks_and_keep_aggregate_order,
            the_inbox_records_a_message_once_per_consumer,
            a_nul_in_a_message_id_is_an_invalid_event,
            concurrent_deliveries_of_one_message_are_processed_once,
            the_inbox_purges_old_entries_in_batches,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __outbox_conformance_cases {
    ($factory:path, $caps:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                // A hang (a wait that never ends) is a failure, not a stuck CI job.
                let case = $crate::testing::$case($factory().await, $caps);
                if ::tokio::time::timeout(::std::time::Duration::from_secs(120), case).await.is_err() {
                    panic!("outbox conformance case {} did not finish within 120 s", stringify!($case));
                }
            }
        )*
    };
}
