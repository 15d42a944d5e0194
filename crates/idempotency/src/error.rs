//! [`Error`]: why assembling the service failed.

use idempotency_core::BoxError;

/// Assembling the service from its configuration failed. Every refusal of a property names it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A property cannot take effect as set (a feature that is off, a value the backend cannot
    /// honour, a missing companion property).
    #[error("{property}: {reason}")]
    Property {
        /// The property, as written in the configuration (`idempotency.distributed-cache.url`).
        property: &'static str,
        /// Why it cannot take effect, and what to do.
        reason: String,
    },
    /// The configuration could not be read.
    #[error(transparent)]
    Load(#[from] crate::load::LoadError),
    /// The idempotency store could not be set up (schema validation, connection).
    #[error("idempotency.persistence: the store could not be set up: {0}")]
    Store(#[source] BoxError),
    /// The cleanup schedule is invalid (the message names `cron` or `zone`).
    #[error(transparent)]
    Cleanup(#[from] idempotency_core::cleanup::InvalidCron),
    /// The Redis cache could not be set up.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    #[error("idempotency.distributed-cache.url {url:?}: {source}")]
    Redis {
        /// The URL as configured (without its password).
        url: String,
        /// What failed.
        #[source]
        source: idempotency_cache_redis::Error,
    },
    /// The outbox could not be set up (schema validation, an invalid relay setting).
    #[cfg(feature = "outbox")]
    #[cfg_attr(docsrs, doc(cfg(feature = "outbox")))]
    #[error("outbox: {0}")]
    Outbox(#[source] BoxError),
}

impl Error {
    pub(crate) fn property(property: &'static str, reason: impl Into<String>) -> Self {
        Self::Property {
            property,
            reason: reason.into(),
        }
    }
}
