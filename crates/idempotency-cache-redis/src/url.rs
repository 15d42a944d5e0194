//! Redis URLs: fred's forms, plus a comma-separated node list for a cluster.

use fred::prelude::Config;
use fred::types::config::{ClusterDiscoveryPolicy, ServerConfig};

/// The fred configuration [`RedisCache::connect`](crate::RedisCache::connect) builds its client
/// from: for an application that builds its own client or pool (then
/// [`RedisCache::new`](crate::RedisCache::new)) from the same URL.
///
/// Every form of fred's [`Config::from_url`] is accepted (`redis://`, `rediss://`,
/// `redis-cluster://host:port?node=host:port&...`, `redis-sentinel://...`), and, for a cluster,
/// the seed nodes may also be listed in the authority, separated by commas:
/// `redis-cluster://[user:password@]host1:port1,host2:port2,...` (rewritten to fred's `?node=`
/// form before parsing).
///
/// A cluster configuration rediscovers the cluster through the nodes it learned from
/// `CLUSTER SLOTS` as well as the URL's ([`ClusterDiscoveryPolicy::UseCache`]): fred's default
/// asks the URL's nodes only, so with `redis-cluster://a:7000` and `a:7000` dead after a
/// failover the client would never find the promoted replica.
///
/// ```
/// use idempotency_cache_redis::client_config;
/// let config = client_config("redis-cluster://127.0.0.1:7000,127.0.0.1:7001")?;
/// assert_eq!(config.server.hosts().len(), 2);
/// # Ok::<(), idempotency_cache_redis::fred::error::Error>(())
/// ```
pub fn client_config(url: &str) -> Result<Config, fred::error::Error> {
    let mut config = Config::from_url(&node_list_to_query(url))?;
    if let ServerConfig::Clustered { policy, .. } = &mut config.server {
        *policy = ClusterDiscoveryPolicy::UseCache;
    }
    Ok(config)
}

/// `scheme://[auth@]h1:p1,h2:p2[/path][?query]` to `scheme://[auth@]h1:p1[/path]?node=h2:p2[&query]`.
/// A URL without a comma in its authority is returned unchanged.
fn node_list_to_query(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (auth, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let mut nodes = hosts.split(',').map(str::trim).filter(|h| !h.is_empty());
    let Some(first) = nodes.next() else {
        return url.to_owned();
    };
    let others: Vec<&str> = nodes.collect();
    if others.is_empty() {
        return url.to_owned();
    }
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let mut out = format!("{scheme}://{auth}{first}{path}?");
    let added: Vec<String> = others.iter().map(|node| format!("node={node}")).collect();
    out.push_str(&added.join("&"));
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        out.push('&');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_separated_node_list_becomes_node_parameters() {
        assert_eq!(
            node_list_to_query("redis-cluster://127.0.0.1:7000,127.0.0.1:7001, 127.0.0.1:7002"),
            "redis-cluster://127.0.0.1:7000?node=127.0.0.1:7001&node=127.0.0.1:7002"
        );
        assert_eq!(
            node_list_to_query("redis-cluster://u:p@a:1,b:2?node=c:3"),
            "redis-cluster://u:p@a:1?node=b:2&node=c:3"
        );
    }

    #[test]
    fn other_urls_are_unchanged() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1:6379/2",
            "redis-cluster://a:1?node=b:2",
            "not a url",
        ] {
            assert_eq!(node_list_to_query(url), url);
        }
    }

    #[test]
    fn every_listed_node_is_a_seed_of_the_cluster() {
        let config = client_config("redis-cluster://u:secret@a:7000,b:7001,c:7002").unwrap();
        let ServerConfig::Clustered { hosts, policy } = &config.server else {
            panic!("not a cluster: {:?}", config.server);
        };
        let mut seeds: Vec<String> = hosts
            .iter()
            .map(|h| format!("{}:{}", h.host, h.port))
            .collect();
        seeds.sort();
        assert_eq!(seeds, ["a:7000", "b:7001", "c:7002"]);
        assert_eq!(*policy, ClusterDiscoveryPolicy::UseCache);
        assert_eq!(config.username.as_deref(), Some("u"));
        assert_eq!(config.password.as_deref(), Some("secret"));
    }

    #[test]
    fn a_standalone_url_is_centralized() {
        let config = client_config("redis://127.0.0.1:6379").unwrap();
        assert!(matches!(config.server, ServerConfig::Centralized { .. }));
    }
}
