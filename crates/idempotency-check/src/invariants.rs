//! The invariants every history is held against. Each has a name (the one RELIABILITY.md and
//! the checker's README use) and is checked on what the clients saw and what the database (or
//! the leased runs' log) holds at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use crate::history::{Answer, CaughtRun, Effect, Entry, LeasedRun, TxEnd};
use crate::plan::Via;

/// Every invariant, by name, with what it says.
pub const INVARIANTS: &[(&str, &str)] = &[
    (
        ONE_EFFECT,
        "at most one committed effect per key (tenant and key)",
    ),
    (
        FOR_THIS_REQUEST,
        "an answer carrying a handler's (or action's) outcome is the outcome of a request with \
         the same identity (tenant, path and query, payload): never another resource's, \
         payload's or tenant's",
    ),
    (
        COMMITTED,
        "an outcome a client receives (first or replayed, from any cache) is one that committed",
    ),
    (
        IDENTICAL,
        "every answer for a key that carries its outcome is byte-identical (status, stored \
         headers, body), and names the same effect",
    ),
    (
        DOCUMENTED,
        "every answer is the outcome, a 409 with Retry-After, a 422 key reuse, a 503 with \
         Retry-After (cache-unavailable only from a fail-fast Redis), a handler's own unstored \
         500 for a failing request, or a dropped client: nothing else",
    ),
    (
        REFUSAL_RUNS_NOTHING,
        "a fail-fast refusal of a failing Redis (503 cache-unavailable, Error::Cache) ran no \
         handler or action for its request (execute_optimistic: committed nothing of it, its \
         action may have run and been rolled back before a refused replay)",
    ),
    (
        REUSE_CAUSE,
        "a 422 key reuse is answered only when the key committed a request of another identity",
    ),
    (
        NO_COMMIT_AFTER_ERROR,
        "a transaction in which a call failed (the action, or a store statement) commits \
         nothing, even when its caller commits",
    ),
    (
        COMMIT_MEANS_COMMITTED,
        "a commit that answered success made every outcome executed in it durable; a refused \
         commit or a rollback made none",
    ),
    (
        CAUGHT_STORED,
        "a transactional handler that caught a failed statement and answered (a stored 422) has \
         that answer given to its client and stored, so that retries replay it; on PostgreSQL \
         its statements are undone (the layer returns to its savepoint), elsewhere they commit \
         with the answer",
    ),
    (
        ONE_COMPLETION,
        "leased mode: one holder's completion per key is stored and replayed",
    ),
    (
        STALE_REFUSED,
        "leased mode: a holder whose lease was taken over while it ran never has its \
         completion accepted (fencing tokens only grow)",
    ),
    (
        ONE_HOLDER,
        "leased mode: no two holders of a key run at once within the first holder's lease",
    ),
    (
        EVERY_EVENT_PUBLISHED,
        "outbox: every committed change's event is published at least once, whatever workers \
         were aborted and however often the broker refused",
    ),
    (
        NO_LONE_EVENT,
        "outbox: no event is published for a change that did not commit",
    ),
    (
        AGGREGATE_ORDER,
        "outbox (ordered mode): each aggregate's events are first published in sequence order",
    ),
    (
        INBOX_ONCE,
        "inbox: every published message is applied exactly once, redeliveries and concurrent \
         consumers included",
    ),
    (
        POOL_CLEAN,
        "after the history, no pooled connection is inside a transaction or keeps a session \
         setting a store changed",
    ),
];

/// `one-effect-per-key`.
pub const ONE_EFFECT: &str = "one-effect-per-key";
/// `answer-is-for-this-request`.
pub const FOR_THIS_REQUEST: &str = "answer-is-for-this-request";
/// `answer-names-a-committed-effect`.
pub const COMMITTED: &str = "answer-names-a-committed-effect";
/// `replays-are-byte-identical`.
pub const IDENTICAL: &str = "replays-are-byte-identical";
/// `answers-are-documented`.
pub const DOCUMENTED: &str = "answers-are-documented";
/// `cache-refusal-runs-nothing`.
pub const REFUSAL_RUNS_NOTHING: &str = "cache-refusal-runs-nothing";
/// `key-reuse-has-a-cause`.
pub const REUSE_CAUSE: &str = "key-reuse-has-a-cause";
/// `no-commit-after-an-error`.
pub const NO_COMMIT_AFTER_ERROR: &str = "no-commit-after-an-error";
/// `commit-means-committed`.
pub const COMMIT_MEANS_COMMITTED: &str = "commit-means-committed";
/// `caught-failure-stored`.
pub const CAUGHT_STORED: &str = "caught-failure-stored";
/// `one-completion-per-key`.
pub const ONE_COMPLETION: &str = "one-completion-per-key";
/// `stale-completion-refused`.
pub const STALE_REFUSED: &str = "stale-completion-refused";
/// `one-holder-within-the-lease`.
pub const ONE_HOLDER: &str = "one-holder-within-the-lease";
/// `every-committed-event-published`.
pub const EVERY_EVENT_PUBLISHED: &str = "every-committed-event-published";
/// `no-event-without-its-change`.
pub const NO_LONE_EVENT: &str = "no-event-without-its-change";
/// `aggregate-order`.
pub const AGGREGATE_ORDER: &str = "aggregate-order";
/// `inbox-applies-once`.
pub const INBOX_ONCE: &str = "inbox-applies-once";
/// `pool-is-clean`.
pub const POOL_CLEAN: &str = "pool-is-clean";

/// How much earlier than its handler a claim may have started (the claim's round trip): the
/// tolerance of `one-holder-within-the-lease`.
const CLAIM_SLACK: Duration = Duration::from_millis(75);

/// A key as the store sees it: the tenant (scope) and the key's number.
pub type Group = (String, usize);

/// The outcomes seen per key: the operation, the effect it names, its bytes, whether it was
/// marked as a replay.
type Outcomes = BTreeMap<Group, Vec<(u64, i64, Vec<u8>, bool)>>;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: &'static str,
    /// The key it concerns, if one.
    pub group: Option<Group>,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.group {
            Some((tenant, key)) => {
                write!(f, "{} ({tenant}, k{key}): {}", self.invariant, self.detail)
            }
            None => write!(f, "{}: {}", self.invariant, self.detail),
        }
    }
}

fn violation(invariant: &'static str, group: &Group, detail: impl Into<String>) -> Violation {
    Violation {
        invariant,
        group: Some(group.clone()),
        detail: detail.into(),
    }
}

fn group(entry: &Entry, key: usize) -> Group {
    (format!("t{}", entry.op.variant.tenant), key)
}

fn one_effect_per_key(effects: &[Effect], out: &mut Vec<Violation>) {
    let mut per_key: BTreeMap<Group, Vec<&Effect>> = BTreeMap::new();
    for effect in effects {
        per_key
            .entry((effect.tenant.clone(), effect.key))
            .or_default()
            .push(effect);
    }
    for (group, effects) in per_key {
        if effects.len() > 1 {
            let ops: Vec<u64> = effects.iter().map(|e| e.op).collect();
            out.push(violation(
                ONE_EFFECT,
                &group,
                format!("{} committed effects, by ops {ops:?}", effects.len()),
            ));
        }
    }
}

/// The layer's problems that the contract documents, with whether they need `Retry-After`
/// (`IdempotencyLayer`'s error table: 409 and 503 carry it).
fn documented_problem(status: u16, slug: &str) -> Option<bool> {
    match (status, slug) {
        (409, "request-in-flight" | "transaction-conflict") => Some(true),
        (422, "idempotency-key-reused") => Some(false),
        (503, "store-unavailable" | "cache-unavailable") => Some(true),
        _ => None,
    }
}

/// How a history's Redis L2 answers a failure, and what ran.
#[derive(Clone, Copy)]
struct Refusals<'a> {
    /// Whether the plan's Redis is `fail-fast` (without Redis, or `fail-open`, no cache
    /// failure may reach a client).
    pub fail_fast: bool,
    /// Whether the handler (or action) of an operation started, for a key.
    pub ran: &'a dyn Fn(u64, usize) -> bool,
}

/// `cache-refusal-runs-nothing` and the fail-open half of `answers-are-documented`, for one
/// refused call of `entry` for `key`; `committed` says whether the call committed an effect,
/// and stands for `ran` when the entry point may run an action before a refused replay.
fn refusal(
    entry: &Entry,
    key: usize,
    refusals: Refusals<'_>,
    committed: Option<bool>,
    out: &mut Vec<Violation>,
) {
    let group = group(entry, key);
    let op = entry.op.id;
    if !refusals.fail_fast {
        out.push(violation(
            DOCUMENTED,
            &group,
            format!("op {op} was refused for a cache failure, without a fail-fast Redis"),
        ));
    } else if committed.unwrap_or_else(|| (refusals.ran)(op, key)) {
        out.push(violation(
            REFUSAL_RUNS_NOTHING,
            &group,
            format!(
                "op {op} was refused for a cache failure, yet its {}",
                if committed.is_some() {
                    "effect committed"
                } else {
                    "handler ran"
                }
            ),
        ));
    }
}

/// What the layer subjects check in common; `outcome` resolves the id an answer names to the
/// group and identity of what ran it (an effect, or a leased run), or `None` when nothing ran it.
fn answers(
    entries: &[Entry],
    outcome: &dyn Fn(i64) -> Option<(Group, Option<String>)>,
    refusals: Refusals<'_>,
    out: &mut Vec<Violation>,
) -> Outcomes {
    let mut outcomes: Outcomes = BTreeMap::new();
    for entry in entries {
        for (key, answer) in &entry.answers {
            let group = group(entry, *key);
            let op = entry.op.id;
            match answer {
                Answer::Handler {
                    status,
                    effect,
                    identity,
                    bytes,
                    replayed,
                } => {
                    if *identity != entry.identity {
                        out.push(violation(
                            FOR_THIS_REQUEST,
                            &group,
                            format!(
                                "op {op} sent `{}` and got the outcome of `{identity}` \
                                 (replayed: {replayed})",
                                entry.identity
                            ),
                        ));
                    }
                    if *status != 201 && *status != 422 {
                        out.push(violation(DOCUMENTED, &group, format!("op {op}: {status}")));
                    }
                    match outcome(*effect) {
                        None => out.push(violation(
                            COMMITTED,
                            &group,
                            format!("op {op} got effect {effect}, which never committed"),
                        )),
                        Some((owner, ran_for)) => {
                            if owner != group || ran_for.is_some_and(|i| i != *identity) {
                                out.push(violation(
                                    COMMITTED,
                                    &group,
                                    format!("op {op} got effect {effect} of {owner:?}"),
                                ));
                            }
                        }
                    }
                    outcomes.entry(group).or_default().push((
                        op,
                        *effect,
                        bytes.clone(),
                        *replayed,
                    ));
                }
                Answer::HandlerFailed { replayed } => {
                    if *replayed || entry.op.kind != crate::plan::Kind::Fail {
                        out.push(violation(
                            DOCUMENTED,
                            &group,
                            format!(
                                "op {op} ({:?}) got a 500, replayed: {replayed}",
                                entry.op.kind
                            ),
                        ));
                    }
                }
                Answer::Problem {
                    status,
                    slug,
                    retry_after,
                } => match documented_problem(*status, slug) {
                    Some(_) if slug == "cache-unavailable" => {
                        refusal(entry, *key, refusals, None, out);
                        if !retry_after {
                            out.push(violation(
                                DOCUMENTED,
                                &group,
                                format!("op {op}: {status} {slug} without Retry-After"),
                            ));
                        }
                    }
                    Some(needs_retry_after) if needs_retry_after && !retry_after => {
                        out.push(violation(
                            DOCUMENTED,
                            &group,
                            format!("op {op}: {status} {slug} without Retry-After"),
                        ));
                    }
                    Some(_) => {}
                    None => out.push(violation(
                        DOCUMENTED,
                        &group,
                        format!("op {op}: {status} {slug}"),
                    )),
                },
                Answer::Dropped => {}
                other => out.push(violation(DOCUMENTED, &group, format!("op {op}: {other}"))),
            }
        }
    }
    outcomes
}

fn identical(outcomes: &Outcomes, invariant: &'static str, out: &mut Vec<Violation>) {
    for (group, seen) in outcomes {
        let Some((first_op, first_effect, first, _)) = seen.first() else {
            continue;
        };
        for (op, effect, bytes, _) in &seen[1..] {
            if effect != first_effect {
                out.push(violation(
                    invariant,
                    group,
                    format!("op {first_op} got effect {first_effect}, op {op} got effect {effect}"),
                ));
            } else if bytes != first {
                out.push(violation(
                    IDENTICAL,
                    group,
                    format!(
                        "op {first_op} got `{}`, op {op} got `{}`",
                        String::from_utf8_lossy(first),
                        String::from_utf8_lossy(bytes)
                    ),
                ));
            }
        }
    }
}

fn reuse_has_a_cause(
    entries: &[Entry],
    committed: &dyn Fn(&Group) -> Vec<String>,
    out: &mut Vec<Violation>,
) {
    for entry in entries {
        for (key, answer) in &entry.answers {
            let reused = matches!(answer, Answer::Problem { slug, .. } if slug == "idempotency-key-reused")
                || matches!(answer, Answer::Error(kind) if kind == "payload-conflict");
            if !reused {
                continue;
            }
            let group = group(entry, *key);
            let identities = committed(&group);
            if !identities.iter().any(|i| *i != entry.identity) {
                out.push(violation(
                    REUSE_CAUSE,
                    &group,
                    format!(
                        "op {} (`{}`) was told the key was reused; committed: {identities:?}",
                        entry.op.id, entry.identity
                    ),
                ));
            }
        }
    }
}

/// What the transactional layer's history left, besides what the clients saw.
#[derive(Debug, Clone, Copy)]
pub struct Transactional<'a> {
    /// The committed effects.
    pub effects: &'a [Effect],
    /// The effect each key's committed record names (its stored response's `effect`).
    pub stored: &'a BTreeMap<Group, i64>,
    /// The handlers that caught a failed statement and answered.
    pub caught: &'a [CaughtRun],
    /// Whether a caught failure undoes the handler's statements (PostgreSQL: the layer
    /// returns to the savepoint it took before the handler); elsewhere they commit.
    pub undoes_caught: bool,
    /// Whether the layer ran in its optimistic mode: a handler that caught a failed statement
    /// may then answer the key's committed record instead of its own answer (its own insert
    /// found the key taken), as every other loser does.
    pub optimistic: bool,
    /// The operations whose handler started.
    pub ran: &'a HashSet<u64>,
    /// Whether the plan's Redis is `fail-fast`.
    pub fail_fast: bool,
}

/// The layer in transactional mode.
pub fn transactional(entries: &[Entry], seen: &Transactional<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    let effects = seen.effects;
    one_effect_per_key(effects, &mut out);
    let by_id: HashMap<i64, &Effect> = effects.iter().map(|e| (e.id, e)).collect();
    // A caught failure's effect, undone, is still the key's outcome when its record names it.
    let undone: HashMap<i64, &CaughtRun> = seen
        .caught
        .iter()
        .filter(|c| seen.undoes_caught && !by_id.contains_key(&c.effect))
        .filter(|c| seen.stored.get(&(c.tenant.clone(), c.key)) == Some(&c.effect))
        .map(|c| (c.effect, c))
        .collect();
    let outcome = |id: i64| {
        by_id
            .get(&id)
            .map(|e| ((e.tenant.clone(), e.key), Some(e.identity.clone())))
            .or_else(|| {
                undone
                    .get(&id)
                    .map(|c| ((c.tenant.clone(), c.key), Some(c.identity.clone())))
            })
    };
    let ran = |op: u64, _key: usize| seen.ran.contains(&op);
    let refusals = Refusals {
        fail_fast: seen.fail_fast,
        ran: &ran,
    };
    let outcomes = answers(entries, &outcome, refusals, &mut out);
    identical(&outcomes, ONE_EFFECT, &mut out);
    records(seen, &by_id, &undone, &mut out);
    caught(entries, seen, &by_id, &mut out);
    let committed = |group: &Group| {
        let mut identities: Vec<String> = effects
            .iter()
            .filter(|e| e.tenant == group.0 && e.key == group.1)
            .map(|e| e.identity.clone())
            .collect();
        if let Some(c) = seen.stored.get(group).and_then(|id| undone.get(id)) {
            identities.push(c.identity.clone());
        }
        identities
    };
    reuse_has_a_cause(entries, &committed, &mut out);
    out
}

/// Each key's committed record against the committed effects: the record names an effect
/// that committed with it (or a caught failure's, undone), and no other effect of the key
/// committed.
fn records(
    seen: &Transactional<'_>,
    by_id: &HashMap<i64, &Effect>,
    undone: &HashMap<i64, &CaughtRun>,
    out: &mut Vec<Violation>,
) {
    for (group, stored) in seen.stored {
        if !by_id.contains_key(stored) && !undone.contains_key(stored) {
            out.push(violation(
                COMMITTED,
                group,
                format!("the key's record names effect {stored}, which never committed"),
            ));
        }
        for effect in seen.effects {
            if (&effect.tenant, effect.key) == (&group.0, group.1) && effect.id != *stored {
                out.push(violation(
                    ONE_EFFECT,
                    group,
                    format!(
                        "the key's record names effect {stored}, yet effect {} (op {}) \
                         committed too",
                        effect.id, effect.op
                    ),
                ));
            }
        }
    }
}

/// `caught-failure-stored`: a handler that caught a failed statement and answered has that
/// answer given to its client (unless the client left) and stored; on PostgreSQL its
/// statements are undone.
fn caught(
    entries: &[Entry],
    seen: &Transactional<'_>,
    by_id: &HashMap<i64, &Effect>,
    out: &mut Vec<Violation>,
) {
    for run in seen.caught {
        let group = (run.tenant.clone(), run.key);
        let answered = entries
            .iter()
            .find(|e| e.op.id == run.op)
            .and_then(|e| e.answers.first())
            .map(|(_, answer)| answer);
        match answered {
            None | Some(Answer::Dropped) => {}
            Some(Answer::Handler {
                effect,
                replayed: false,
                ..
            }) if *effect == run.effect => {}
            // Optimistic: the handler ran before the key was looked at, and its insert found
            // the key taken (a replay of the committed record, or `422
            // idempotency-key-reused` for another payload, held by the other invariants) or
            // held past the in-flight budget.
            Some(Answer::Handler { replayed: true, .. }) if seen.optimistic => {}
            Some(Answer::Problem { slug, .. })
                if seen.optimistic
                    && matches!(
                        slug.as_str(),
                        "idempotency-key-reused" | "request-in-flight"
                    ) => {}
            Some(other) => out.push(violation(
                CAUGHT_STORED,
                &group,
                format!(
                    "op {}'s handler caught a failed statement and answered 422 (effect {}), \
                     but its client got {other}",
                    run.op, run.effect
                ),
            )),
        }
        if seen.undoes_caught && by_id.contains_key(&run.effect) {
            out.push(violation(
                CAUGHT_STORED,
                &group,
                format!(
                    "op {}'s effect {} committed, though its statements were to be undone \
                     with the failed one",
                    run.op, run.effect
                ),
            ));
        }
    }
}

/// The layer in leased mode: `runs` is the log of the handler's runs, `lease` the lease.
pub fn leased(
    entries: &[Entry],
    runs: &[LeasedRun],
    lease: Duration,
    fail_fast: bool,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let by_id: HashMap<i64, &LeasedRun> = runs.iter().map(|r| (r.id, r)).collect();
    let outcome = |id: i64| by_id.get(&id).map(|r| ((r.tenant.clone(), r.key), None));
    let ran = |op: u64, _key: usize| runs.iter().any(|r| r.op == op);
    let refusals = Refusals {
        fail_fast,
        ran: &ran,
    };
    let seen = answers(entries, &outcome, refusals, &mut out);
    // What the store holds: the runs replays name, with the first answer of such a run. A holder
    // that outlived its lease still answers its own client with its own response (its effect
    // ran; only storing it is refused): that answer is not a completion.
    let mut outcomes: Outcomes = BTreeMap::new();
    for (group, answers) in &seen {
        let replayed: BTreeSet<i64> = answers.iter().filter(|a| a.3).map(|a| a.1).collect();
        for (op, run, _, was_replayed) in answers {
            let own = by_id.get(run).is_some_and(|r| r.op == *op);
            if !was_replayed && !own {
                out.push(violation(
                    ONE_COMPLETION,
                    group,
                    format!("op {op} got run {run} of another request, not marked as a replay"),
                ));
            }
        }
        outcomes.insert(
            group.clone(),
            answers
                .iter()
                .filter(|a| a.3 || replayed.contains(&a.1))
                .cloned()
                .collect(),
        );
    }
    identical(&outcomes, ONE_COMPLETION, &mut out);
    let mut per_key: BTreeMap<Group, Vec<&LeasedRun>> = BTreeMap::new();
    for run in runs {
        per_key
            .entry((run.tenant.clone(), run.key))
            .or_default()
            .push(run);
    }
    for (group, runs) in &per_key {
        // The run whose completion was accepted (the one the answers name).
        let accepted: BTreeSet<i64> = outcomes
            .get(group)
            .map(|seen| seen.iter().map(|(_, id, _, _)| *id).collect())
            .unwrap_or_default();
        for id in &accepted {
            let Some(held) = by_id.get(id) else { continue };
            let end = held.end.unwrap_or(Duration::MAX);
            for other in runs {
                if other.id != held.id && other.start > held.start && other.start < end {
                    out.push(violation(
                        STALE_REFUSED,
                        &group.clone(),
                        format!(
                            "run {} (op {}) was accepted, though run {} (op {}) took the key \
                             over at {:?} while it ran ({:?}..{:?})",
                            held.id, held.op, other.id, other.op, other.start, held.start, end
                        ),
                    ));
                }
            }
        }
        for first in runs {
            let end = first.end.unwrap_or(Duration::MAX);
            for second in runs {
                let overlaps = second.start > first.start && second.start < end;
                if overlaps && second.start + CLAIM_SLACK < first.start + lease {
                    out.push(violation(
                        ONE_HOLDER,
                        group,
                        format!(
                            "run {} (op {}) started at {:?}, while run {} (op {}) had held the \
                             key since {:?}, within its lease",
                            second.id, second.op, second.start, first.id, first.op, first.start
                        ),
                    ));
                }
            }
        }
    }
    out
}

/// The service: `execute_in` in a caller's transaction, `execute` and `execute_optimistic` in
/// the service's own. The same invariants hold for all three: `execute_optimistic` documents
/// that two concurrent duplicates may both run the action, the later one rolling back all it
/// did and replaying the winner's outcome, so what is held against it is what committed and
/// what was answered, never how many actions ran.
///
/// `ran` are the calls (operation, key) whose action started; `fail_fast` whether the plan's
/// Redis refuses requests when it fails.
pub fn service(
    entries: &[Entry],
    effects: &[Effect],
    ran: &HashSet<(u64, usize)>,
    fail_fast: bool,
) -> Vec<Violation> {
    let mut out = Vec::new();
    let started = |op: u64, key: usize| ran.contains(&(op, key));
    let refusals = Refusals {
        fail_fast,
        ran: &started,
    };
    one_effect_per_key(effects, &mut out);
    let by_id: HashMap<i64, &Effect> = effects.iter().map(|e| (e.id, e)).collect();
    let mut outcomes: Outcomes = BTreeMap::new();
    for entry in entries {
        let op = entry.op.id;
        let failed = entry.answers.iter().any(|(_, a)| {
            matches!(a, Answer::Error(kind)
                if kind == "action-failed" || kind.starts_with("statement") || kind.starts_with("store"))
        });
        let own: Vec<&Effect> = effects.iter().filter(|e| e.op == op).collect();
        if failed && !own.is_empty() {
            out.push(Violation {
                invariant: NO_COMMIT_AFTER_ERROR,
                group: Some(group(entry, entry.op.key)),
                detail: format!(
                    "op {op} failed ({:?}), yet effects {:?} committed (tx {:?})",
                    entry.answers,
                    own.iter().map(|e| e.id).collect::<Vec<_>>(),
                    entry.tx
                ),
            });
        }
        if matches!(entry.tx, TxEnd::RolledBack | TxEnd::CommitFailed(_)) && !own.is_empty() {
            out.push(Violation {
                invariant: COMMIT_MEANS_COMMITTED,
                group: Some(group(entry, entry.op.key)),
                detail: format!("op {op} ended {:?}, yet its effects committed", entry.tx),
            });
        }
        for (key, answer) in &entry.answers {
            let group = group(entry, *key);
            let (replayed, effect, rejected) = match answer {
                Answer::Value { replayed, effect } => (*replayed, *effect, false),
                Answer::Rejected { replayed, effect } => (*replayed, *effect, true),
                Answer::Error(kind) if kind.starts_with("cache") => {
                    // `execute_optimistic` may run its action (rolled back) before a replay
                    // that the cache refuses: there, what must hold is that nothing committed.
                    let committed = (entry.op.via == Some(Via::Optimistic))
                        .then(|| effects.iter().any(|e| e.op == op && e.key == *key));
                    refusal(entry, *key, refusals, committed, &mut out);
                    continue;
                }
                Answer::Unexpected(what) => {
                    let invariant = if what.starts_with("another request") {
                        FOR_THIS_REQUEST
                    } else {
                        DOCUMENTED
                    };
                    out.push(violation(invariant, &group, format!("op {op}: {what}")));
                    continue;
                }
                _ => continue,
            };
            let durable = replayed || entry.tx == TxEnd::Committed;
            if !durable {
                continue;
            }
            match by_id.get(&effect) {
                Some(e) if (e.tenant.clone(), e.key) == group => {}
                Some(e) => out.push(violation(
                    COMMITTED,
                    &group,
                    format!("op {op} got effect {effect} of ({}, k{})", e.tenant, e.key),
                )),
                None => out.push(violation(
                    if replayed {
                        COMMITTED
                    } else {
                        COMMIT_MEANS_COMMITTED
                    },
                    &group,
                    format!(
                        "op {op} got effect {effect} (replayed: {replayed}), which never \
                         committed (tx {:?})",
                        entry.tx
                    ),
                )),
            }
            outcomes.entry(group).or_default().push((
                op,
                effect,
                vec![u8::from(rejected)],
                replayed,
            ));
        }
    }
    identical(&outcomes, ONE_EFFECT, &mut out);
    let committed = |group: &Group| {
        effects
            .iter()
            .filter(|e| e.tenant == group.0 && e.key == group.1)
            .map(|e| e.identity.clone())
            .collect()
    };
    reuse_has_a_cause(entries, &committed, &mut out);
    out
}

/// `pool-is-clean`, from the backend's list of unclean connections.
pub fn pool(unclean: Vec<String>) -> Vec<Violation> {
    unclean
        .into_iter()
        .map(|detail| Violation {
            invariant: POOL_CLEAN,
            group: None,
            detail,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Fault, Kind, Op, Variant};

    fn op(id: u64, key: usize, kind: Kind) -> Op {
        Op {
            id,
            client: 0,
            key,
            second_key: None,
            via: None,
            variant: Variant {
                tenant: 0,
                account: 0,
                note: None,
                amount: 100,
                currency: 0,
            },
            kind,
            fault: Fault::None,
            pause_ms: 0,
        }
    }

    fn entry(op: Op, identity: &str, answer: Answer) -> Entry {
        Entry {
            op,
            identity: identity.to_owned(),
            answers: vec![(op.key, answer)],
            tx: TxEnd::None,
            span: (Duration::ZERO, Duration::ZERO),
        }
    }

    fn handler(effect: i64, identity: &str, replayed: bool) -> Answer {
        Answer::Handler {
            status: 201,
            replayed,
            effect,
            identity: identity.to_owned(),
            bytes: format!("201 {effect} {identity}").into_bytes(),
        }
    }

    fn effect(id: i64, key: usize, identity: &str, op: u64) -> Effect {
        Effect {
            id,
            tenant: "t0".to_owned(),
            key,
            identity: identity.to_owned(),
            op,
        }
    }

    /// The transactional layer's invariants, without records read back or caught failures.
    fn layer(
        entries: &[Entry],
        effects: &[Effect],
        ran: &HashSet<u64>,
        fail_fast: bool,
    ) -> Vec<Violation> {
        let seen = Transactional {
            effects,
            stored: &BTreeMap::new(),
            caught: &[],
            undoes_caught: false,
            optimistic: false,
            ran,
            fail_fast,
        };
        transactional(entries, &seen)
    }

    fn names(violations: &[Violation]) -> Vec<&'static str> {
        violations.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_history_holds() {
        let a = "t0 /acct/0/charges 100";
        let entries = [
            entry(op(1, 0, Kind::Ok), a, handler(1, a, false)),
            entry(op(2, 0, Kind::Ok), a, handler(1, a, true)),
            entry(
                op(3, 0, Kind::Ok),
                "t0 /acct/1/charges 100",
                Answer::Problem {
                    status: 422,
                    slug: "idempotency-key-reused".to_owned(),
                    retry_after: false,
                },
            ),
            entry(
                op(4, 0, Kind::Fail),
                a,
                Answer::HandlerFailed { replayed: false },
            ),
        ];
        assert_eq!(
            layer(&entries, &[effect(1, 0, a, 1)], &HashSet::new(), false),
            []
        );
    }

    #[test]
    fn another_resources_response_is_caught() {
        let a = "t0 /acct/0/charges 100";
        let b = "t0 /acct/1/charges 100";
        let entries = [
            entry(op(1, 0, Kind::Ok), a, handler(1, a, false)),
            entry(op(2, 0, Kind::Ok), b, handler(1, a, true)),
        ];
        let found = layer(&entries, &[effect(1, 0, a, 1)], &HashSet::new(), false);
        assert_eq!(names(&found), [FOR_THIS_REQUEST]);
    }

    #[test]
    fn an_outcome_that_never_committed_is_caught() {
        let a = "t0 /acct/0/charges 100";
        let entries = [entry(op(1, 0, Kind::Ok), a, handler(7, a, true))];
        assert_eq!(
            names(&layer(&entries, &[], &HashSet::new(), false)),
            [COMMITTED]
        );
    }

    #[test]
    fn two_effects_for_one_key_and_a_reuse_without_cause_are_caught() {
        let a = "t0 /acct/0/charges 100";
        let reused = Answer::Problem {
            status: 422,
            slug: "idempotency-key-reused".to_owned(),
            retry_after: false,
        };
        let entries = [entry(op(1, 0, Kind::Ok), a, reused)];
        let found = layer(
            &entries,
            &[effect(1, 0, a, 1), effect(2, 0, a, 2)],
            &HashSet::new(),
            false,
        );
        assert_eq!(names(&found), [ONE_EFFECT, REUSE_CAUSE]);
    }

    #[test]
    fn a_replayed_500_and_a_409_without_retry_after_are_undocumented() {
        let a = "t0 /acct/0/charges 100";
        let entries = [
            entry(
                op(1, 0, Kind::Fail),
                a,
                Answer::HandlerFailed { replayed: true },
            ),
            entry(
                op(2, 0, Kind::Ok),
                a,
                Answer::Problem {
                    status: 409,
                    slug: "request-in-flight".to_owned(),
                    retry_after: false,
                },
            ),
        ];
        assert_eq!(
            names(&layer(&entries, &[], &HashSet::new(), false)),
            [DOCUMENTED, DOCUMENTED]
        );
    }

    #[test]
    fn a_stale_holders_completion_and_overlapping_holders_are_caught() {
        let a = "t0 /acct/0/charges 100";
        let ms = Duration::from_millis;
        let run = |id: i64, start: u64, end: Option<u64>| LeasedRun {
            id,
            tenant: "t0".to_owned(),
            key: 0,
            start: ms(start),
            end: end.map(ms),
            op: u64::try_from(id).unwrap_or_default(),
        };
        // Run 1 held the key from 0 to 500 ms; run 2 took it over at 350 ms (after the 300 ms
        // lease), yet run 1's completion is the one replayed.
        let entries = [
            entry(op(1, 0, Kind::Slow(500)), a, handler(1, a, false)),
            entry(op(5, 0, Kind::Ok), a, handler(1, a, true)),
        ];
        let runs = [run(1, 0, Some(500)), run(2, 350, Some(400))];
        assert_eq!(
            names(&leased(&entries, &runs, ms(300), false)),
            [STALE_REFUSED]
        );
        // The same, with run 2's completion replayed: run 1's client got its own response
        // (its effect ran; its completion was refused), which is no violation.
        let entries = [
            entry(op(1, 0, Kind::Slow(500)), a, handler(1, a, false)),
            entry(op(2, 0, Kind::Ok), a, handler(2, a, false)),
            entry(op(5, 0, Kind::Ok), a, handler(2, a, true)),
        ];
        assert_eq!(leased(&entries, &runs, ms(300), false), []);
        // A first answer naming another request's run is a completion passed off as its own.
        let entries = [entry(op(7, 0, Kind::Ok), a, handler(2, a, false))];
        assert_eq!(
            names(&leased(&entries, &runs, ms(300), false)),
            [ONE_COMPLETION]
        );
        let entries = [
            entry(op(1, 0, Kind::Slow(500)), a, handler(1, a, false)),
            entry(op(5, 0, Kind::Ok), a, handler(1, a, true)),
        ];
        // Run 3 started 100 ms into run 1's lease.
        let runs = [run(1, 0, Some(500)), run(3, 100, Some(150))];
        let found = leased(&entries, &runs, ms(300), false);
        assert_eq!(names(&found), [STALE_REFUSED, ONE_HOLDER]);
    }

    #[test]
    fn a_cache_refusal_that_ran_or_came_from_a_fail_open_cache_is_caught() {
        let a = "t0 /acct/0/charges 100";
        let refused = Answer::Problem {
            status: 503,
            slug: "cache-unavailable".to_owned(),
            retry_after: true,
        };
        let entries = [entry(op(1, 0, Kind::Ok), a, refused)];
        let none = HashSet::new();
        assert_eq!(layer(&entries, &[], &none, true), []);
        assert_eq!(names(&layer(&entries, &[], &none, false)), [DOCUMENTED]);
        let ran = HashSet::from([1]);
        assert_eq!(
            names(&layer(&entries, &[], &ran, true)),
            [REFUSAL_RUNS_NOTHING]
        );
        // The service: an action that started before a refusal; under execute_optimistic only
        // a committed effect counts.
        let refused = entry(
            op(2, 0, Kind::Ok),
            a,
            Answer::Error("cache: timed out".to_owned()),
        );
        let ran = HashSet::from([(2, 0)]);
        assert_eq!(
            names(&service(std::slice::from_ref(&refused), &[], &ran, true)),
            [REFUSAL_RUNS_NOTHING]
        );
        let mut optimistic = refused;
        optimistic.op.via = Some(Via::Optimistic);
        assert_eq!(service(&[optimistic.clone()], &[], &ran, true), []);
        let found = service(&[optimistic], &[effect(5, 0, a, 2)], &ran, true);
        assert!(names(&found).contains(&REFUSAL_RUNS_NOTHING), "{found:?}");
    }

    /// The transactional layer's invariants with records read back (`stored`: key and the
    /// effect its record names, tenant `t0`) and caught failures.
    fn with_records(
        entries: &[Entry],
        effects: &[Effect],
        stored: &[(usize, i64)],
        caught: &[CaughtRun],
        undoes_caught: bool,
    ) -> Vec<Violation> {
        with_mode(entries, effects, stored, caught, undoes_caught, false)
    }

    /// [`with_records`], with the layer claim-first or optimistic.
    fn with_mode(
        entries: &[Entry],
        effects: &[Effect],
        stored: &[(usize, i64)],
        caught: &[CaughtRun],
        undoes_caught: bool,
        optimistic: bool,
    ) -> Vec<Violation> {
        let stored: BTreeMap<Group, i64> = stored
            .iter()
            .map(|(key, effect)| (("t0".to_owned(), *key), *effect))
            .collect();
        let seen = Transactional {
            effects,
            stored: &stored,
            caught,
            undoes_caught,
            optimistic,
            ran: &HashSet::new(),
            fail_fast: false,
        };
        transactional(entries, &seen)
    }

    #[test]
    fn a_caught_failure_is_stored_and_undone_on_postgres() {
        let a = "t0 /acct/0/charges 100 []";
        let caught = [CaughtRun {
            op: 1,
            effect: 7,
            tenant: "t0".to_owned(),
            key: 0,
            identity: a.to_owned(),
        }];
        let rejected = |replayed| Answer::Handler {
            status: 422,
            replayed,
            effect: 7,
            identity: a.to_owned(),
            bytes: b"422 7".to_vec(),
        };
        let entries = [
            entry(op(1, 0, Kind::Caught), a, rejected(false)),
            entry(op(2, 0, Kind::Ok), a, rejected(true)),
        ];
        // PostgreSQL: the effect was undone, the record names it.
        assert_eq!(with_records(&entries, &[], &[(0, 7)], &caught, true), []);
        // Its statements committed after all.
        let committed = [effect(7, 0, a, 1)];
        let found = with_records(&entries, &committed, &[(0, 7)], &caught, true);
        assert_eq!(names(&found), [CAUGHT_STORED]);
        // Elsewhere they commit with the answer.
        assert_eq!(
            with_records(&entries, &committed, &[(0, 7)], &caught, false),
            []
        );
        // Nothing stored: the answers name an outcome that never committed.
        let found = with_records(&entries, &[], &[], &caught, true);
        assert_eq!(names(&found), [COMMITTED, COMMITTED]);
        // The layer answered 503 instead of the handler's answer.
        let refused = Answer::Problem {
            status: 503,
            slug: "store-unavailable".to_owned(),
            retry_after: true,
        };
        let entries = [entry(op(1, 0, Kind::Caught), a, refused)];
        let found = with_records(&entries, &[], &[], &caught, true);
        assert_eq!(names(&found), [CAUGHT_STORED]);
        // So in optimistic mode too.
        let found = with_mode(&entries, &[], &[], &caught, true, true);
        assert_eq!(names(&found), [CAUGHT_STORED]);
    }

    #[test]
    fn an_optimistic_caught_failure_may_answer_the_committed_record() {
        let a = "t0 /acct/0/charges 100 []";
        let b = "t0 /acct/0/charges 200 []";
        // Op 2 (another payload) caught a failed statement after op 1's record committed.
        let caught = [CaughtRun {
            op: 2,
            effect: 8,
            tenant: "t0".to_owned(),
            key: 0,
            identity: b.to_owned(),
        }];
        let reused = Answer::Problem {
            status: 422,
            slug: "idempotency-key-reused".to_owned(),
            retry_after: false,
        };
        let entries = [
            entry(op(1, 0, Kind::Ok), a, handler(1, a, false)),
            entry(op(2, 0, Kind::Caught), b, reused),
        ];
        let committed = [effect(1, 0, a, 1)];
        assert_eq!(
            with_mode(&entries, &committed, &[(0, 1)], &caught, true, true),
            []
        );
        // Claim-first, the caught handler held the key: its own answer was due.
        let found = with_mode(&entries, &committed, &[(0, 1)], &caught, true, false);
        assert_eq!(names(&found), [CAUGHT_STORED]);
        // A replay of the winner, for the same payload.
        let same = [CaughtRun {
            identity: a.to_owned(),
            ..caught[0].clone()
        }];
        let entries = [
            entry(op(1, 0, Kind::Ok), a, handler(1, a, false)),
            entry(op(2, 0, Kind::Caught), a, handler(1, a, true)),
        ];
        assert_eq!(
            with_mode(&entries, &committed, &[(0, 1)], &same, true, true),
            []
        );
    }

    #[test]
    fn a_record_without_its_effect_or_beside_another_is_caught() {
        let a = "t0 /acct/0/charges 100 []";
        let found = with_records(&[], &[], &[(0, 9)], &[], false);
        assert_eq!(names(&found), [COMMITTED]);
        let one = [effect(1, 0, a, 1)];
        assert_eq!(with_records(&[], &one, &[(0, 1)], &[], false), []);
        let two = [effect(1, 0, a, 1), effect(2, 0, a, 2)];
        let found = with_records(&[], &two, &[(0, 1)], &[], false);
        assert_eq!(names(&found), [ONE_EFFECT, ONE_EFFECT]);
    }

    #[test]
    fn a_commit_after_an_error_is_caught() {
        let a = "t0 {}";
        let mut failed = entry(
            op(1, 0, Kind::Fail),
            a,
            Answer::Error("action-failed".to_owned()),
        );
        failed.tx = TxEnd::Committed;
        let found = service(&[failed], &[effect(1, 0, a, 1)], &HashSet::new(), false);
        assert_eq!(names(&found), [NO_COMMIT_AFTER_ERROR]);
        let mut refused = entry(
            op(2, 1, Kind::Ok),
            a,
            Answer::Value {
                replayed: false,
                effect: 2,
            },
        );
        refused.tx = TxEnd::CommitFailed("poisoned".to_owned());
        let found = service(&[refused], &[effect(2, 1, a, 2)], &HashSet::new(), false);
        assert_eq!(names(&found), [COMMIT_MEANS_COMMITTED]);
    }
}
