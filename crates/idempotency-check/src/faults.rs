//! The faults a history really had, counted where they are injected (not where a plan drew
//! them): a drop that fired before its request finished, a commit made after a call failed, a
//! kill sent on a live server session, a stall of the wire, a holder that outlived its lease, a
//! relay worker aborted, a publish refused, a message delivered again, a stretch of Redis hanging
//! or unreachable.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A kind of fault (its number is its place in [`KINDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// A request's future dropped before it finished (a client gone, a timeout).
    Drop,
    /// A caller's commit after one of its calls failed.
    CommitAfterError,
    /// A database session killed mid-transaction (`pg_terminate_backend`, MariaDB `KILL`).
    Kill,
    /// A stretch of the database wire holding the server's answers.
    WireHold,
    /// A leased handler still running when its lease ran out.
    LeaseOutlived,
    /// A relay worker aborted (no graceful shutdown).
    RelayAbort,
    /// A publish the broker refused.
    PublishRefused,
    /// A message delivered to the inbox once more.
    Redelivery,
    /// A stretch of Redis holding its answers.
    RedisHang,
    /// A stretch of Redis unreachable (connections cut).
    RedisCut,
}

/// Every kind, in the order the summary prints them.
pub const KINDS: [Injected; 10] = [
    Injected::Drop,
    Injected::CommitAfterError,
    Injected::Kill,
    Injected::WireHold,
    Injected::LeaseOutlived,
    Injected::RelayAbort,
    Injected::PublishRefused,
    Injected::Redelivery,
    Injected::RedisHang,
    Injected::RedisCut,
];

impl Injected {
    /// The kind's name in the summary.
    pub fn name(self) -> &'static str {
        match self {
            Self::Drop => "drop",
            Self::CommitAfterError => "commit-after-error",
            Self::Kill => "kill",
            Self::WireHold => "wire-hold",
            Self::LeaseOutlived => "lease-outlived",
            Self::RelayAbort => "relay-abort",
            Self::PublishRefused => "publish-refused",
            Self::Redelivery => "redelivery",
            Self::RedisHang => "redis-hang",
            Self::RedisCut => "redis-cut",
        }
    }
}

/// One history's counters, incremented at the injection points.
///
/// ```
/// use idempotency_check::faults::{Faults, Injected};
///
/// let faults = Faults::default();
/// faults.count(Injected::Kill);
/// assert_eq!(faults.total(), 1);
/// assert_eq!(faults.by_kind()[2], ("kill", 1));
/// ```
#[derive(Debug, Default)]
pub struct Faults {
    counts: [AtomicUsize; KINDS.len()],
}

impl Faults {
    /// Counts one fault of `kind`.
    pub fn count(&self, kind: Injected) {
        self.counts[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts, by kind, in [`KINDS`] order.
    pub fn by_kind(&self) -> [(&'static str, usize); KINDS.len()] {
        KINDS.map(|kind| {
            (
                kind.name(),
                self.counts[kind as usize].load(Ordering::Relaxed),
            )
        })
    }

    /// All faults counted.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_in_their_own_order() {
        for (i, kind) in KINDS.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }
}
