//! The operator operations of SQLite: evicting a key and counting the records table
//! ([`KeyAdmin`](idempotency_core::admin::KeyAdmin)), the outbox's status and its dead letters
//! by filter ([`OutboxAdmin`](idempotency_outbox::admin::OutboxAdmin), feature `outbox`).
//!
//! Statements are built per call from the validated table name: they run once per operator
//! command, never on the request path.

#[cfg(feature = "outbox")]
mod outbox;
mod records;
