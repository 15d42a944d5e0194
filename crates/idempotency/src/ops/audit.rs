//! The audit trail: one structured log line per change, target [`AUDIT_TARGET`].
//!
//! A log line rather than an audit table: it needs no schema of its own on three databases,
//! it reaches wherever the service's logs already go (and their retention and access rules
//! apply), and a change made while the database is being repaired is still recorded. A
//! deployment that wants the trail apart from the rest routes the target
//! (`RUST_LOG=idempotency::audit=info`, or a `tracing_subscriber` filter on it).

use std::time::SystemTime;

use idempotency_core::RecordId;

/// The `tracing` target of every audit line.
pub const AUDIT_TARGET: &str = "idempotency::audit";

/// Who made a change, for the audit line: the operator's name as the caller knows it (the
/// CLI's `--actor`, else the login name; an admin router's authenticated principal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(String);

impl Actor {
    /// An actor by name.
    ///
    /// ```
    /// let actor = idempotency::ops::Actor::new("alice");
    /// assert_eq!(actor.as_str(), "alice");
    /// ```
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Logs one change of a key's record or cache entries: [`record`]'s line, whose `target` is
/// `operation/scope/key`, with the three also as fields of their own (`operation`, `scope`,
/// `key`): operations and scopes may contain `/`, so only the fields tell `POST:/a` + `b/c`
/// from `POST:/a/b` + `c`. A forced eviction names the lease token of the claim it ended
/// (`lease_token`, absent for a claim without one).
pub(crate) fn record_key(
    actor: &Actor,
    action: &'static str,
    id: &RecordId,
    count: u64,
    lease_token: Option<i64>,
) {
    let target = format!("{}/{}/{}", id.operation, id.scope, id.key);
    tracing::info!(
        target: AUDIT_TARGET,
        actor = actor.as_str(),
        action,
        target = target.as_str(),
        operation = id.operation.as_str(),
        scope = id.scope.as_str(),
        key = id.key.as_str(),
        lease_token,
        count,
        at = %humantime::format_rfc3339_millis(SystemTime::now()),
        "operator change"
    );
}

/// Logs one change: who (`actor`), what (`action` on `target`, `count` rows or objects) and
/// when (`at`, RFC 3339 UTC, besides the subscriber's own timestamp).
pub(crate) fn record(actor: &Actor, action: &'static str, target: &str, count: u64) {
    tracing::info!(
        target: AUDIT_TARGET,
        actor = actor.as_str(),
        action,
        target = target,
        count,
        at = %humantime::format_rfc3339_millis(SystemTime::now()),
        "operator change"
    );
}
