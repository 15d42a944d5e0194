#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod breaker;
mod cache;
mod codec;
mod config;
mod connect;
mod error;
mod key;
mod refresh;
mod sign;
mod url;
mod write_behind;

pub use breaker::BreakerState;
pub use cache::{
    BREAKER_METRIC, CONNECTION_METRIC, RedisCache, RedisCacheStats, WRITE_BEHIND_METRIC,
    is_connected,
};
pub use config::{
    CircuitBreakerConfig, DistributedCacheConfig, MAX_WRITE_BEHIND_BATCH,
    MAX_WRITE_BEHIND_CAPACITY, WriteBehindConfig,
};
pub use error::Error;
pub use key::redis_key;
pub use sign::{CacheSecret, MIN_SECRET_LEN, SecretTooShort};
pub use url::client_config;

/// The fred version this crate is built on.
pub use fred;
