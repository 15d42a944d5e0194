//! Each meter's key, in one place: the handle of a meter for its labels, registered with the
//! recorder in effect. [`FacadeMetrics`](crate::FacadeMetrics) asks for a handle on every
//! call; [`CachedMetrics`](crate::CachedMetrics) asks once and keeps it.

use idempotency_core::{CacheError, Level, RecordStatus};
use metrics::{Counter, Histogram, counter, histogram};

use crate::names;

pub(crate) fn lookup_hits(operation: &str, level: Level) -> Counter {
    counter!(names::LOOKUP_HITS, "operation" => operation.to_owned(), "level" => level.as_str())
}

pub(crate) fn replays(operation: &str, status: RecordStatus) -> Counter {
    counter!(names::REPLAYS, "operation" => operation.to_owned(), "status" => status.as_str())
}

pub(crate) fn conflicts(operation: &str) -> Counter {
    counter!(names::CONFLICTS, "operation" => operation.to_owned())
}

pub(crate) fn acquired(operation: &str) -> Counter {
    counter!(names::ACQUIRED, "operation" => operation.to_owned())
}

pub(crate) fn acquire_conflicts(operation: &str) -> Counter {
    counter!(names::ACQUIRE_CONFLICTS, "operation" => operation.to_owned())
}

pub(crate) fn acquire_wait(operation: &str) -> Histogram {
    histogram!(names::ACQUIRE_WAIT, "operation" => operation.to_owned())
}

pub(crate) fn persisted(operation: &str, status: RecordStatus) -> Counter {
    counter!(names::PERSISTED, "operation" => operation.to_owned(), "status" => status.as_str())
}

pub(crate) fn cache_errors(operation: &str, level: Level, error: &CacheError) -> Counter {
    counter!(
        names::CACHE_ERRORS,
        "operation" => operation.to_owned(),
        "level" => level.as_str(),
        "kind" => error.kind()
    )
}

pub(crate) fn in_flight(operation: &str) -> Counter {
    counter!(names::IN_FLIGHT, "operation" => operation.to_owned())
}

pub(crate) fn cleanup_deleted() -> Counter {
    counter!(names::CLEANUP_DELETED)
}
