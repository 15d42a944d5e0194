//! [`RedisCache::connect`]: a fred client from a URL, standalone or cluster.

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::{Builder, ReconnectPolicy};
use fred::types::config::{ClusterDiscoveryPolicy, ServerConfig};

use crate::cache::{Error, RedisCache};
use crate::config::DistributedCacheConfig;
use crate::url::config_from_url;

impl RedisCache<Client> {
    /// Builds a client for `url` and starts connecting in the background, reconnecting forever
    /// with a short constant delay.
    ///
    /// - `redis://host:port[/db]` (standalone): returns at once. A Redis that is down at start-up
    ///   does not stop the application (requests see a miss, or an error under `fail-fast`).
    /// - `redis-cluster://host:port,host:port,...` (or fred's `?node=host:port` form): fred's
    ///   cluster client. It discovers the other nodes with `CLUSTER SLOTS`, and when it has to
    ///   rediscover them (a master died, slots moved) it asks the nodes it learned as well as the
    ///   ones in the URL, so a failover of the only node the URL names is survived.
    pub fn connect(url: &str, config: &DistributedCacheConfig) -> Result<Self, Error> {
        let mut fred_config = config_from_url(url).map_err(Error::Config)?;
        if let ServerConfig::Clustered { policy, .. } = &mut fred_config.server {
            // The default, `ConfigEndpoint`, rediscovers the cluster through the URL's nodes
            // only: with `redis-cluster://a:7000` and `a:7000` dead, never again.
            *policy = ClusterDiscoveryPolicy::UseCache;
        }
        let client = Builder::from_config(fred_config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(2);
            })
            .set_policy(ReconnectPolicy::new_constant(0, 500))
            .build()
            .map_err(Error::Config)?;
        let _connection = client.connect();
        Ok(Self::new(client, config))
    }
}
