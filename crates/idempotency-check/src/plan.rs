//! A history's plan, generated from a seed: which client sends what, with which key, which
//! handler behaviour and which fault. The same seed gives the same plan; what the servers make
//! of it (timing, who wins a race) is the run's own.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// Which caches sit in front of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caches {
    /// The store alone.
    None,
    /// moka as L1.
    Moka,
    /// moka as L1 and Redis (`REDIS_URL`) as L2.
    MokaRedis,
}

impl Caches {
    /// The name printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Moka => "moka",
            Self::MokaRedis => "moka+redis",
        }
    }
}

/// The Redis L2's failure policy, and whether Redis fails while the history runs (moka + Redis
/// only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redis {
    /// `fail-fast`: a failing read refuses the request (`503 cache-unavailable`,
    /// `Error::Cache`) before anything runs; otherwise `fail-open`: a failing read is a miss.
    pub fail_fast: bool,
    /// Whether Redis is made to hang (its answers held) or unreachable (its connections cut)
    /// for stretches at random moments.
    pub faults: bool,
}

impl Redis {
    /// The name printed in reports.
    pub fn name(self) -> &'static str {
        match (self.fail_fast, self.faults) {
            (false, false) => "fail-open",
            (false, true) => "fail-open+outages",
            (true, false) => "fail-fast",
            (true, true) => "fail-fast+outages",
        }
    }
}

/// What the handler (or action) does for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Writes its effect and succeeds (201).
    Ok,
    /// Writes its effect and refuses for a business reason (a stored 422).
    Reject,
    /// Writes its effect, then fails (500, or the action's error): nothing may stay.
    Fail,
    /// Writes its effect, waits `ms`, then succeeds.
    Slow(u64),
    /// Writes its effect, then its database connection is killed mid-transaction (PostgreSQL
    /// `pg_terminate_backend`, MariaDB `KILL`; on SQLite it succeeds like `Ok`).
    Kill,
    /// The layer's transactional handler: writes its effect, runs a statement that fails (a
    /// unique violation), catches the error and answers a 422, which the layer must store and
    /// replay. On PostgreSQL the failure aborts the transaction: the layer returns to the
    /// savepoint it took before the handler, which undoes the effect.
    Caught,
}

impl Kind {
    /// The kind's name in request bodies and identities.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Reject => "reject",
            Self::Fail => "fail",
            Self::Slow(_) => "slow",
            Self::Kill => "kill",
            Self::Caught => "caught",
        }
    }
}

/// Which of the service's entry points runs an operation (the service subjects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `execute_in`, in the caller's transaction (one or two keys).
    ExecuteIn,
    /// `execute`: the key claimed, the action run and the outcome stored in a transaction of
    /// the service's own.
    Execute,
    /// `execute_optimistic`: the action first, the terminal record inserted at the end, in a
    /// transaction of the service's own.
    Optimistic,
}

impl Via {
    /// The entry point's name, as the service spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::ExecuteIn => "execute_in",
            Self::Execute => "execute",
            Self::Optimistic => "execute_optimistic",
        }
    }
}

/// A fault injected into one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// None.
    None,
    /// The client's future is dropped after `ms` (a client gone, a timeout): at whatever await
    /// point the request is then.
    Drop(u64),
    /// The caller commits its transaction even though a call in it returned an error.
    CommitAfterError,
}

/// Who sends the request and to which resource: everything but the key that makes up the
/// request's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The tenant (the scope of keys).
    pub tenant: u8,
    /// The account in the path.
    pub account: u8,
    /// The `?note=` in the query, if any.
    pub note: Option<u8>,
    /// The amount in the body.
    pub amount: i64,
    /// The values of the opted-in header `X-Currency` (the layer subjects): 0 none, 1 `eur`,
    /// 2 `usd`, 3 both, in two header lines.
    pub currency: u8,
}

impl Variant {
    /// The `X-Currency` values the request sends, in order.
    pub fn currencies(&self) -> &'static [&'static str] {
        match self.currency {
            0 => &[],
            1 => &["eur"],
            2 => &["usd"],
            _ => &["eur", "usd"],
        }
    }
}

/// One operation of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Its number in the history (unique in a run).
    pub id: u64,
    /// The client sending it.
    pub client: usize,
    /// The key's number (small key space: collisions are common).
    pub key: usize,
    /// A second key, for the service subject's two-call transactions.
    pub second_key: Option<usize>,
    /// The service subjects: the entry point that runs it (`None` elsewhere).
    pub via: Option<Via>,
    /// Who and what.
    pub variant: Variant,
    /// What the handler does.
    pub kind: Kind,
    /// The fault injected.
    pub fault: Fault,
    /// A pause before sending it, in milliseconds.
    pub pause_ms: u64,
}

/// A generated history's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The seed it came from.
    pub seed: u64,
    /// The caches in front of the store.
    pub caches: Caches,
    /// With moka + Redis: Redis's failure policy and faults.
    pub redis: Option<Redis>,
    /// The in-flight policy: wait for the holder (a bounded budget), or answer at once.
    pub wait: bool,
    /// Whether the service looks the key up before acquiring it (`lookup_before_acquire`).
    pub lookup: bool,
    /// The service subjects: every operation runs through `execute_optimistic` (its duplicates
    /// may run the action concurrently, so it is not mixed with the claiming entry points).
    /// The layer in transactional mode: the layer runs in its optimistic mode.
    pub optimistic: bool,
    /// Each client's operations, in order.
    pub clients: Vec<Vec<Op>>,
}

/// The sizes of a plan.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Concurrent clients.
    pub clients: usize,
    /// Operations per client.
    pub ops_per_client: usize,
    /// Distinct keys.
    pub keys: usize,
    /// The longest a slow handler runs, in milliseconds.
    pub slow_ms: u64,
    /// Whether `CommitAfterError` faults are drawn (the service subject).
    pub commit_after_error: bool,
    /// Whether operations carry a second key (the service subject).
    pub second_keys: bool,
    /// Whether operations choose among the service's entry points (`execute_in`, `execute`,
    /// `execute_optimistic`; the service subject).
    pub entry_points: bool,
    /// Whether requests send values of the opted-in header `X-Currency`, which the layer
    /// fingerprints (the layer subjects).
    pub opt_in_header: bool,
    /// Whether handlers catch a failed statement (`Kind::Caught`; the layer in transactional
    /// mode).
    pub caught: bool,
    /// Whether handler kinds are drawn for takeovers (leased mode): more slow and failing
    /// handlers (a failure releases the key while a holder it took over from still runs), no
    /// kills (a leased handler has no connection to kill). With the general draw, a fencing
    /// token that comes back after a release was seen in 1 of 315 leased histories; with
    /// this one in about 1 of 20 (`scripts/check-mutations.sh fencing-token-goes-back`).
    pub takeovers: bool,
    /// Whether a seed in three runs the layer in its optimistic mode (the layer in
    /// transactional mode).
    pub optimistic_layer: bool,
}

impl Plan {
    /// The plan of `seed` with `shape`.
    pub fn generate(seed: u64, shape: Shape) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        // The choices added after the first plans come from a stream of their own, so that the
        // draws above (keys, variants, kinds, faults) of a seed stay what they were.
        let mut extra = StdRng::seed_from_u64(seed ^ 0x6578_7472_6173);
        let optimistic = if shape.entry_points {
            extra.random_bool(0.3)
        } else {
            // A stream of its own: the layer's plans of a seed stay what they were.
            shape.optimistic_layer
                && StdRng::seed_from_u64(seed ^ 0x6f70_7469_6d69).random_bool(0.3)
        };
        let caches = match rng.random_range(0..3) {
            0 => Caches::None,
            1 => Caches::Moka,
            _ => Caches::MokaRedis,
        };
        let redis = (caches == Caches::MokaRedis).then(|| Redis {
            fail_fast: extra.random_bool(0.5),
            faults: extra.random_bool(0.6),
        });
        let wait = rng.random_bool(0.5);
        let lookup = rng.random_bool(0.3);
        // Each key's usual request; operations mostly repeat it (retries), sometimes change one
        // part of it (another resource, tenant, payload).
        let mut base: Vec<Variant> = (0..shape.keys)
            .map(|_| Variant {
                tenant: rng.random_range(0..2),
                account: rng.random_range(0..2),
                note: None,
                amount: rng.random_range(1..4) * 100,
                currency: 0,
            })
            .collect();
        if shape.opt_in_header {
            for variant in &mut base {
                variant.currency = extra.random_range(0..4);
            }
        }
        let mut next = 0;
        let clients = (0..shape.clients)
            .map(|client| {
                (0..shape.ops_per_client)
                    .map(|_| {
                        let key = rng.random_range(0..shape.keys);
                        let mut variant = base[key];
                        if rng.random_bool(0.3) {
                            match rng.random_range(0..4) {
                                0 => variant.account ^= 1,
                                1 => variant.note = Some(rng.random_range(0..2)),
                                2 => variant.tenant ^= 1,
                                _ => variant.amount += 1,
                            }
                        }
                        if shape.opt_in_header && extra.random_bool(0.1) {
                            variant.currency = (variant.currency + extra.random_range(1..4)) % 4;
                        }
                        let slow = |rng: &mut StdRng| {
                            Kind::Slow(rng.random_range(shape.slow_ms / 4..=shape.slow_ms))
                        };
                        let mut kind = if shape.takeovers {
                            match rng.random_range(0..20) {
                                0..=5 => Kind::Ok,
                                6 | 7 => Kind::Reject,
                                8..=12 => Kind::Fail,
                                _ => slow(&mut rng),
                            }
                        } else {
                            match rng.random_range(0..20) {
                                0..=9 => Kind::Ok,
                                10..=12 => Kind::Reject,
                                13 | 14 => Kind::Fail,
                                15 => Kind::Kill,
                                _ => slow(&mut rng),
                            }
                        };
                        let mut fault = match rng.random_range(0..10) {
                            0 | 1 => Fault::Drop(rng.random_range(0..60)),
                            2 | 3 if shape.commit_after_error => Fault::CommitAfterError,
                            _ => Fault::None,
                        };
                        let mut second_key = (shape.second_keys && rng.random_bool(0.5))
                            .then(|| rng.random_range(0..shape.keys));
                        if shape.caught
                            && matches!(kind, Kind::Ok | Kind::Reject)
                            && extra.random_bool(0.2)
                        {
                            kind = Kind::Caught;
                        }
                        let via = shape.entry_points.then(|| {
                            if optimistic {
                                Via::Optimistic
                            } else if extra.random_bool(0.3) {
                                Via::Execute
                            } else {
                                Via::ExecuteIn
                            }
                        });
                        if via.is_some_and(|via| via != Via::ExecuteIn) {
                            // One call in the service's own transaction: no second key, and no
                            // caller to commit after an error.
                            second_key = None;
                            if fault == Fault::CommitAfterError {
                                fault = Fault::None;
                            }
                        }
                        next += 1;
                        Op {
                            id: next,
                            client,
                            key,
                            second_key,
                            via,
                            variant,
                            kind,
                            fault,
                            pause_ms: rng.random_range(0..15),
                        }
                    })
                    .collect()
            })
            .collect();
        Self {
            seed,
            caches,
            redis,
            wait,
            lookup,
            optimistic,
            clients,
        }
    }

    /// Every operation, in id order.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops: Vec<Op> = self.clients.iter().flatten().copied().collect();
        ops.sort_by_key(|op| op.id);
        ops
    }

    /// How many operations the plan drew a fault for: not how many were injected (a drop may
    /// fire after its request finished; a commit after an error needs an error), which
    /// [`Faults`](crate::faults::Faults) counts where they happen.
    pub fn faults(&self) -> usize {
        self.clients
            .iter()
            .flatten()
            .filter(|op| op.fault != Fault::None)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        clients: 4,
        ops_per_client: 10,
        keys: 3,
        slow_ms: 40,
        commit_after_error: true,
        second_keys: true,
        entry_points: true,
        opt_in_header: true,
        caught: true,
        takeovers: false,
        optimistic_layer: false,
    };

    #[test]
    fn a_seed_gives_the_same_plan() {
        let a = Plan::generate(7, SHAPE);
        let b = Plan::generate(7, SHAPE);
        assert_eq!(a.ops(), b.ops());
        assert_eq!(a.caches, b.caches);
        assert_ne!(a.ops(), Plan::generate(8, SHAPE).ops());
    }

    #[test]
    fn keys_collide_and_faults_are_drawn() {
        let plan = Plan::generate(1, SHAPE);
        let ops = plan.ops();
        assert_eq!(ops.len(), 40);
        assert!(ops.iter().filter(|op| op.key == 0).count() > 3);
        assert!(plan.faults() > 0);
    }
}
