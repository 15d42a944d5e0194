//! [`RedisCache::connect`]: a fred client from a URL, standalone or cluster.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::{Builder, ReconnectPolicy};
use fred::types::config::{Server, ServerConfig};

use crate::cache::{Error, RedisCache};
use crate::config::DistributedCacheConfig;
use crate::url::{client_config, redacted};

/// Bound on each TCP probe of a cluster seed at start-up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

impl RedisCache<Client> {
    /// Builds a client for `url` and starts connecting in the background, reconnecting forever
    /// with a short constant delay.
    ///
    /// - `redis://host:port[/db]` (standalone): returns at once. A Redis that is down at start-up
    ///   does not stop the application (requests see a miss, or an error under `fail-fast`).
    /// - `redis-cluster://host:port,host:port,...` (or fred's `?node=host:port` form): fred's
    ///   cluster client. It discovers the other nodes with `CLUSTER SLOTS`, and when it has to
    ///   rediscover them (a master died, slots moved) it asks the nodes it learned as well as the
    ///   ones in the URL, so a failover of the only node the URL names is survived (see
    ///   [`client_config`](crate::client_config)). Before it returns, it checks that at least
    ///   one named node accepts a TCP connection: a URL that names no reachable node is
    ///   [`Error::Unreachable`], not a client that waits for ever. The probe blocks the calling
    ///   thread, at most one second per seed address (a refused connection fails at once):
    ///   call `connect` at start-up, not on a request path.
    pub fn connect(url: &str, config: &DistributedCacheConfig) -> Result<Self, Error> {
        let fred_config = client_config(url).map_err(Error::Config)?;
        if let ServerConfig::Clustered { hosts, .. } = &fred_config.server
            && !hosts.iter().any(answers)
        {
            return Err(Error::Unreachable { url: redacted(url) });
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

/// Whether `server` accepts a TCP connection within [`PROBE_TIMEOUT`].
fn answers(server: &Server) -> bool {
    let Ok(addresses) = (&*server.host, server.port).to_socket_addrs() else {
        return false;
    };
    addresses
        .into_iter()
        .any(|address| TcpStream::connect_timeout(&address, PROBE_TIMEOUT).is_ok())
}
