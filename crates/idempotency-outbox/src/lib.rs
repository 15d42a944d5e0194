#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
// The README links the PostgreSQL items, which only exist with the `postgres` feature.
#![cfg_attr(not(feature = "postgres"), allow(rustdoc::broken_intra_doc_links))]

pub mod config;
mod error;
mod message;
pub mod metrics;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod pg;
pub mod publisher;
pub mod relay;
pub mod store;
#[cfg(feature = "test-utils")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod testing;

pub use error::{BoxError, Error, SchemaProblem};
pub use message::{DeadLetter, MAX_NAME_LEN, NewEvent, OutboxMessage};
#[cfg(feature = "postgres")]
pub use pg::{PgInbox, PgOutbox};
pub use publisher::{Ack, LoggingPublisher, PublishError, PublishErrorKind, Publisher};
pub use relay::{Relay, RelayHandle, RelayHealth, RelayMonitor, RelayTotals, ShutdownReport};
pub use store::{DeadLetters, Enqueue, Housekeeping, Inbox, RelayStore};

/// The core crate (configuration types such as `SchemaMode`), re-exported.
pub use idempotency_core as core;
/// The sqlx version this crate is built on.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sqlx;
/// The uuid version message ids use.
pub use uuid;

/// A relay on the PostgreSQL outbox.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub type PgRelay<P> = Relay<PgOutbox, P>;
