//! [`RedisCache::connect`]: a fred client from a URL, standalone or cluster.

use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::ClientLike;
use fred::prelude::{Builder, ReconnectPolicy};
use fred::types::ConnectHandle;
use fred::types::config::{Server, ServerConfig};

use crate::cache::RedisCache;
use crate::config::DistributedCacheConfig;
use crate::error::Error;
use crate::refresh::Refresh;
use crate::url::client_config;
use idempotency_core::redact_url;

/// Bound on each TCP probe of a cluster seed at start-up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Bound on fred's own commands (`CLUSTER SLOTS`, a new connection's set-up). fred's default
/// (10 s) is how long a slot map reload waits for a hung node that still accepts connections,
/// while fred's routing task, and so every call, waits with it.
const INTERNAL_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// The least time between two restarts of a connection task that ended on an error: the
/// first restart is immediate (calls made meanwhile would wait for their timeout on the
/// client whose task ended), a task that keeps ending does not spin.
const RESTART_DELAY: Duration = Duration::from_millis(500);

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
    ///   call `connect` at start-up, not on a request path. A call that times out makes the
    ///   client reload the slot map (at most every 2 s), so that a master that hangs rather
    ///   than dies is left once its replica is promoted.
    ///
    /// fred's connection task ends on some errors (a redirection loop that exhausts its
    /// attempts); nothing would then read the client's commands again, and every call would
    /// time out for good. The task is watched: when it ends other than by `quit`, that is
    /// logged at `warn` and a new client with the same configuration takes the old one's
    /// place. (Reconnecting the old client is not enough: fred 10 loses count of the commands
    /// that were queued when its task ended, and from then on leaves each command unflushed
    /// in the socket until the next one, or a timeout, pushes it out.)
    ///
    /// [`Error::NoSecret`] without [`secret`](DistributedCacheConfig::secret), before any
    /// connection (see [`new`](RedisCache::new)).
    ///
    /// Must be called inside a tokio runtime.
    pub fn connect(url: &str, config: &DistributedCacheConfig) -> Result<Self, Error> {
        if config.secret.is_none() {
            return Err(Error::NoSecret);
        }
        let fred_config = client_config(url).map_err(Error::Config)?;
        if let ServerConfig::Clustered { hosts, .. } = &fred_config.server
            && !hosts.iter().any(answers)
        {
            return Err(Error::Unreachable {
                url: redact_url(url),
            });
        }
        let client = Builder::from_config(fred_config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(2);
                c.internal_command_timeout = INTERNAL_COMMAND_TIMEOUT;
            })
            .set_policy(ReconnectPolicy::new_constant(0, 500))
            .build()
            .map_err(Error::Config)?;
        let task = client.connect();
        let clustered = client.is_clustered();
        let cache = Self::new(client, config)?;
        tokio::spawn(supervise(cache.client_slot(), task));
        Ok(if clustered {
            let refresh = Refresh::new(cache.client_slot());
            cache.with_refresh(refresh)
        } else {
            cache
        })
    }
}

/// At most one `warn` per this long about the connection task ending: a Redis that stays away
/// ends it again every [`RESTART_DELAY`] or so.
const RESTART_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Waits for the connection task of the client in `slot` to end; when it ended on an error
/// (or a panic), puts a new client of the same configuration in the slot and connects it;
/// returns when the task ended cleanly (`quit`). The restarts are logged at `warn` at most
/// once per [`RESTART_WARN_INTERVAL`] (with how many were not), at `debug` otherwise.
async fn supervise(slot: Arc<RwLock<Client>>, mut task: ConnectHandle) {
    let mut warned: Option<tokio::time::Instant> = None;
    let mut restarted: Option<tokio::time::Instant> = None;
    let mut unlogged = 0u64;
    loop {
        let error = match task.await {
            Ok(Ok(())) => return,
            Ok(Err(error)) if error.is_canceled() => return, // `quit` while connecting
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        let now = tokio::time::Instant::now();
        if warned.is_none_or(|at| now.duration_since(at) >= RESTART_WARN_INTERVAL) {
            tracing::warn!(
                %error,
                restarts_not_logged = unlogged,
                "the Redis connection task ended; connecting again (logged at most once a minute)"
            );
            warned = Some(now);
            unlogged = 0;
        } else {
            unlogged += 1;
            tracing::debug!(%error, "the Redis connection task ended; connecting again");
        }
        if let Some(at) = restarted {
            tokio::time::sleep_until(at + RESTART_DELAY).await;
        }
        restarted = Some(tokio::time::Instant::now());
        let fresh = slot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone_new();
        task = fresh.connect();
        // The old client's task is over; calls that still hold it time out on their own.
        *slot.write().unwrap_or_else(PoisonError::into_inner) = fresh;
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
