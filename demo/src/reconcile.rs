//! The outbox article's production check as a meter: charges committed without their
//! `ChargeCreated` event. Charge and event commit in one transaction, so the count stays zero;
//! anything else is a defect worth an alert (`deploy/prometheus/idempotency-alerts.yaml`).

use std::time::Duration;

use crate::db::Database;

/// Gauge: charges of the last hour (at most the outbox retention) without a `ChargeCreated`
/// event.
pub const CHARGES_WITHOUT_EVENT: &str = "demo_charges_without_event";

/// The window the check looks back: one hour, or the outbox retention of published events if
/// shorter (older events are deleted, their charges are not).
pub fn window(retention: Duration) -> Duration {
    retention.min(Duration::from_secs(3600))
}

/// Registers the gauge's help text with the installed recorder.
pub fn describe() {
    metrics::describe_gauge!(
        CHARGES_WITHOUT_EVENT,
        metrics::Unit::Count,
        "Charges of the last hour without their ChargeCreated outbox event (should be 0)"
    );
}

/// Runs the check once and sets the gauge; returns the count.
pub async fn check_once<DB: Database>(db: &DB, window: Duration) -> Result<i64, sqlx::Error> {
    let secs = i64::try_from(window.as_secs()).unwrap_or(i64::MAX);
    let count = db.charges_without_event(secs).await?;
    metrics::gauge!(CHARGES_WITHOUT_EVENT).set(count as f64);
    if count > 0 {
        tracing::error!(count, "charges without their ChargeCreated event");
    }
    Ok(count)
}

/// Runs the check every `interval` until the task is dropped; a failed check is logged.
pub async fn run<DB: Database>(db: DB, interval: Duration, window: Duration) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        if let Err(error) = check_once(&db, window).await {
            tracing::warn!(error = %error, "reconciliation query failed");
        }
    }
}
