//! What happened: one entry per operation, with what its client saw.

use std::fmt;
use std::time::Duration;

use crate::plan::Op;

/// What a client saw for one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The handler's own response (201 or a stored 422), first or replayed: the effect it names
    /// and the request identity it echoes.
    Handler {
        /// The HTTP status.
        status: u16,
        /// Whether `Idempotent-Replayed: true` was on it.
        replayed: bool,
        /// The effect (or leased run) id in the body.
        effect: i64,
        /// The request identity the handler echoed.
        identity: String,
        /// Status, stored headers and body, to compare replays byte for byte.
        bytes: Vec<u8>,
    },
    /// The handler's own 500 for a failing operation.
    HandlerFailed {
        /// Whether it was marked as a replay (it must never be).
        replayed: bool,
    },
    /// A problem from the layer: `slug` is the problem type's last segment.
    Problem {
        /// The HTTP status.
        status: u16,
        /// The problem type's slug (`request-in-flight`, `idempotency-key-reused`, ...).
        slug: String,
        /// Whether a `Retry-After` header was on it.
        retry_after: bool,
    },
    /// The service subject: the action's value, executed or replayed, naming its effect.
    Value {
        /// Whether it was replayed.
        replayed: bool,
        /// The effect id in the value.
        effect: i64,
    },
    /// The service subject: a stored rejection, executed or replayed, naming its effect.
    Rejected {
        /// Whether it was replayed.
        replayed: bool,
        /// The effect id in the rejection's details.
        effect: i64,
    },
    /// The service subject: an error, by its kind.
    Error(String),
    /// The client gave up (the fault `Drop`): nothing is known.
    Dropped,
    /// The operation finished (the outbox subject: its transaction's end says how).
    Done,
    /// Anything else: always a violation.
    Unexpected(String),
}

impl Answer {
    /// Whether it is a fail-fast refusal of a failing Redis (`503 cache-unavailable`, the
    /// service's `Error::Cache`).
    pub fn is_cache_refusal(&self) -> bool {
        match self {
            Self::Problem { slug, .. } => slug == "cache-unavailable",
            Self::Error(kind) => kind.starts_with("cache"),
            _ => false,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replay = |r: &bool| if *r { " (replay)" } else { "" };
        match self {
            Self::Handler {
                status,
                replayed,
                effect,
                identity,
                ..
            } => write!(
                f,
                "{status} effect {effect} for `{identity}`{}",
                replay(replayed)
            ),
            Self::HandlerFailed { replayed } => write!(f, "500 boom{}", replay(replayed)),
            Self::Problem {
                status,
                slug,
                retry_after,
            } => write!(
                f,
                "{status} {slug}{}",
                if *retry_after { " +Retry-After" } else { "" }
            ),
            Self::Value { replayed, effect } => {
                write!(f, "value effect {effect}{}", replay(replayed))
            }
            Self::Rejected { replayed, effect } => {
                write!(f, "rejected effect {effect}{}", replay(replayed))
            }
            Self::Error(kind) => write!(f, "error {kind}"),
            Self::Dropped => write!(f, "dropped"),
            Self::Done => write!(f, "done"),
            Self::Unexpected(what) => write!(f, "unexpected {what}"),
        }
    }
}

/// What became of the service subject's transaction: the caller's (`execute_in`), or as the
/// service reports its own (`execute`, `execute_optimistic`: an executed outcome is
/// `Committed`, an error `RolledBack`, a replay `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxEnd {
    /// No transaction of the caller's (the layer subjects; a replay of the service's own).
    None,
    /// Committed.
    Committed,
    /// The commit answered an error (a refused commit of a poisoned or unfinished transaction).
    CommitFailed(String),
    /// Rolled back.
    RolledBack,
    /// Dropped mid-way (the fault `Drop`).
    Dropped,
}

/// One operation and what came of it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The operation.
    pub op: Op,
    /// The request identity the client sent (what a handler must echo).
    pub identity: String,
    /// What the client saw, per call (the service subject makes up to two calls).
    pub answers: Vec<(usize, Answer)>,
    /// What became of the transaction (service subject).
    pub tx: TxEnd,
    /// When it was sent and answered, from the run's start.
    pub span: (Duration, Duration),
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "op {:>4} client {:>2} [{:>6.1}..{:>6.1} ms] key {}{}{} {:?} {:?} `{}` ->",
            self.op.id,
            self.op.client,
            self.span.0.as_secs_f64() * 1e3,
            self.span.1.as_secs_f64() * 1e3,
            self.op.key,
            self.op
                .second_key
                .map(|k| format!("+{k}"))
                .unwrap_or_default(),
            self.op
                .via
                .map(|via| format!(" {}", via.name()))
                .unwrap_or_default(),
            self.op.kind,
            self.op.fault,
            self.identity,
        )?;
        for (key, answer) in &self.answers {
            write!(f, " [k{key}] {answer}")?;
        }
        if self.tx != TxEnd::None {
            write!(f, " tx {:?}", self.tx)?;
        }
        Ok(())
    }
}

/// A committed effect, read back from the database (or, in leased mode, the external log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    /// Its id (the one answers name).
    pub id: i64,
    /// The tenant (scope) it ran for.
    pub tenant: String,
    /// The key's number.
    pub key: usize,
    /// The identity of the request that ran it.
    pub identity: String,
    /// The operation that ran it.
    pub op: u64,
}

/// One run of a leased handler (an effect outside the database).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedRun {
    /// Its id (the one answers name).
    pub id: i64,
    /// The tenant it ran for.
    pub tenant: String,
    /// The key's number.
    pub key: usize,
    /// When the handler started and ended, from the run's start.
    pub start: Duration,
    /// `None` while it never ended (dropped).
    pub end: Option<Duration>,
    /// The operation that ran it.
    pub op: u64,
}

/// A transactional handler that caught a failed statement and answered a 422 naming its effect
/// (undone on PostgreSQL, where the layer returns to its savepoint to store the answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaughtRun {
    /// The operation.
    pub op: u64,
    /// The effect its answer names.
    pub effect: i64,
    /// The tenant it ran for.
    pub tenant: String,
    /// The key's number.
    pub key: usize,
    /// The identity it echoed.
    pub identity: String,
}
