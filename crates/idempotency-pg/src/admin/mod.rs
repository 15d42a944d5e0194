//! The operator operations of PostgreSQL: evicting a key and counting the records table
//! ([`KeyAdmin`](idempotency_core::admin::KeyAdmin)), the outbox's status and its dead letters
//! by filter ([`OutboxAdmin`](idempotency_outbox::admin::OutboxAdmin), feature `outbox`).
//!
//! Statements are built per call from the validated table name: they run once per operator
//! command, never on the request path. Behind a transaction pooler they run as the stores'
//! own statements do (see `pooler`): unnamed, each in a transaction of its own.

#[cfg(feature = "outbox")]
mod outbox;
mod records;
