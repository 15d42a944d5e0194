//! Why setting up the cache failed.

/// Setting up the cache failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Redis URL or client configuration is invalid.
    #[error("invalid Redis configuration")]
    Config(#[source] fred::error::Error),
    /// No node of a Redis Cluster URL accepted a connection at start-up.
    #[error("no node of the Redis Cluster {url} accepts a connection")]
    Unreachable {
        /// The URL, its password replaced by `***`.
        url: String,
    },
    /// The configuration has no [`secret`](crate::DistributedCacheConfig::secret): without one,
    /// whoever can write to the Redis could make the service replay a response of their
    /// choosing.
    #[error(
        "the distributed cache has no secret: set idempotency.distributed-cache.secret \
         (at least 32 bytes, the same in every instance sharing the Redis)"
    )]
    NoSecret,
    /// A write-behind size over its bound
    /// ([`MAX_WRITE_BEHIND_CAPACITY`](crate::MAX_WRITE_BEHIND_CAPACITY),
    /// [`MAX_WRITE_BEHIND_BATCH`](crate::MAX_WRITE_BEHIND_BATCH)): the queue and the batch
    /// are allocated up front (a `capacity` meant as "unbounded" made every `put` panic).
    #[error(
        "idempotency.distributed-cache.write-behind.{property} is {value}, more than the {max} \
         it may be"
    )]
    WriteBehindTooLarge {
        /// `capacity` or `max-batch`.
        property: &'static str,
        /// The size given.
        value: usize,
        /// Its bound.
        max: usize,
    },
}
