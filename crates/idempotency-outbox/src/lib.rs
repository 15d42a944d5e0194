#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
pub mod config;
mod error;
mod inbox;
mod message;
pub mod metrics;
pub mod publisher;
pub mod relay;
pub mod store;
#[cfg(feature = "test-utils")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod testing;

pub use error::{Error, SchemaProblem};
pub use inbox::inbox_span;
pub use message::{DeadLetter, MAX_NAME_LEN, NewEvent, OutboxMessage};
pub use publisher::{
    Ack, BrokerHealth, LoggingPublisher, PublishError, PublishErrorKind, Publisher,
};
pub use relay::{Relay, RelayHandle, RelayMonitor, RelayShutdownReport, RelayTotals, RelayWorkers};
pub use store::{DeadLetters, Enqueue, Housekeeping, Inbox, RelayStore};

/// The uuid version message ids use (they are part of this crate's API).
pub use uuid;
