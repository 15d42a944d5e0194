//! Where each server for the tests comes from: its URL variable, else the local default, else
//! (feature `testcontainers`) a container started for this test process.
//!
//! The choice is made once per process and kept. Without the feature it is what it always was:
//! the variable, else the local default URL, with no probing.

use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

/// A server the tests talk to.
#[derive(Debug)]
pub(crate) struct Server {
    /// Its name in messages.
    pub(crate) name: &'static str,
    /// The environment variable holding its URL.
    pub(crate) env: &'static str,
    /// The URL of the local default server.
    pub(crate) local_url: &'static str,
    /// The port of the local default server on 127.0.0.1.
    pub(crate) local_port: u16,
    /// Which container stands in for it.
    pub(crate) kind: Kind,
    /// The URL chosen for this process, or why there is none.
    chosen: OnceLock<Result<String, String>>,
}

/// The servers that can run in a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Postgres,
    Redis,
}

/// PostgreSQL: `DATABASE_URL`, else the local server.
pub(crate) static POSTGRES: Server = Server {
    name: "PostgreSQL",
    env: "DATABASE_URL",
    local_url: "postgres://postgres@127.0.0.1:5432/test",
    local_port: 5432,
    kind: Kind::Postgres,
    chosen: OnceLock::new(),
};

/// Redis: `REDIS_URL`, else the local server.
pub(crate) static REDIS: Server = Server {
    name: "Redis",
    env: "REDIS_URL",
    local_url: "redis://127.0.0.1:6379",
    local_port: 6379,
    kind: Kind::Redis,
    chosen: OnceLock::new(),
};

/// Where a server's URL comes from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The URL variable is set.
    Env(String),
    /// The local default URL.
    Local,
    /// A container started for this process.
    Container,
    /// Nothing answers: the tests fail with what to set.
    Missing,
}

/// The decision, with the probes injected. Nothing is probed when the variable is set or when
/// containers are off (the default behaviour); Docker is probed only when the local port is silent.
pub(crate) fn decide(
    env: Option<String>,
    containers: bool,
    local_answers: impl FnOnce() -> bool,
    docker_answers: impl FnOnce() -> bool,
) -> Source {
    match env {
        Some(url) => Source::Env(url),
        None if !containers || local_answers() => Source::Local,
        None if docker_answers() => Source::Container,
        None => Source::Missing,
    }
}

/// The URL for `server` from a decision; `start` runs the container when one is chosen.
pub(crate) fn url_for(
    server: &Server,
    source: Source,
    start: impl FnOnce() -> Result<String, String>,
) -> Result<String, String> {
    match source {
        Source::Env(url) => Ok(url),
        Source::Local => Ok(server.local_url.to_owned()),
        Source::Container => start(),
        Source::Missing => Err(missing_message(server)),
    }
}

/// The one message for "no server anywhere": what to set or start.
pub(crate) fn missing_message(server: &Server) -> String {
    format!(
        "no {name} for the tests: {env} is not set, nothing answers on 127.0.0.1:{port} and no \
         Docker engine answers. Set {env} (for example {env}={url}), start a local {name} \
         (scripts/test.sh starts one), or start a Docker engine so that the `testcontainers` \
         feature runs {name} in a container.",
        name = server.name,
        env = server.env,
        port = server.local_port,
        url = server.local_url,
    )
}

/// Whether something accepts TCP connections on 127.0.0.1:`port` (within one second).
pub(crate) fn local_answers(port: u16) -> bool {
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// The URL of `server` for this process (chosen on the first call); panics with what to set when
/// there is none.
pub(crate) fn resolve(server: &'static Server) -> String {
    let chosen = server.chosen.get_or_init(|| {
        let containers = cfg!(feature = "testcontainers");
        let source = decide(
            std::env::var(server.env).ok(),
            containers,
            || local_answers(server.local_port),
            docker_answers,
        );
        url_for(server, source, || start(server.kind))
    });
    match chosen {
        Ok(url) => url.clone(),
        Err(message) => panic!("{message}"),
    }
}

#[cfg(feature = "testcontainers")]
fn docker_answers() -> bool {
    crate::containers::docker_answers()
}

#[cfg(not(feature = "testcontainers"))]
fn docker_answers() -> bool {
    false
}

#[cfg(feature = "testcontainers")]
fn start(kind: Kind) -> Result<String, String> {
    crate::containers::start(kind)
}

#[cfg(not(feature = "testcontainers"))]
fn start(_kind: Kind) -> Result<String, String> {
    Err("containers need the `testcontainers` feature of idempotency-testing".to_owned())
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    fn never() -> bool {
        panic!("this probe must not run")
    }

    #[test]
    fn the_variable_wins_and_nothing_is_probed() {
        let url = "postgres://elsewhere/db".to_owned();
        assert_eq!(
            decide(Some(url.clone()), true, never, never),
            Source::Env(url.clone())
        );
        assert_eq!(
            decide(Some(url.clone()), false, never, never),
            Source::Env(url)
        );
    }

    #[test]
    fn without_the_feature_the_local_default_is_used_unprobed() {
        assert_eq!(decide(None, false, never, never), Source::Local);
    }

    #[test]
    fn a_local_server_that_answers_is_preferred_to_docker() {
        assert_eq!(decide(None, true, || true, never), Source::Local);
    }

    #[test]
    fn docker_stands_in_when_the_local_port_is_silent() {
        assert_eq!(decide(None, true, || false, || true), Source::Container);
    }

    #[test]
    fn neither_server_nor_docker_is_missing_with_one_message() {
        assert_eq!(decide(None, true, || false, || false), Source::Missing);
        for server in [&POSTGRES, &REDIS] {
            let err = url_for(server, Source::Missing, || panic!("no start")).unwrap_err();
            assert!(err.contains(server.env), "{err}");
            assert!(err.contains(server.local_url), "{err}");
            assert!(err.contains("Docker"), "{err}");
            assert!(err.contains("scripts/test.sh"), "{err}");
        }
    }

    #[test]
    fn each_source_gives_its_url() {
        let env = url_for(&REDIS, Source::Env("redis://x:1".to_owned()), || {
            panic!("no start")
        });
        assert_eq!(env.as_deref(), Ok("redis://x:1"));
        let local = url_for(&REDIS, Source::Local, || panic!("no start"));
        assert_eq!(local.as_deref(), Ok(REDIS.local_url));
        let started = url_for(&POSTGRES, Source::Container, || {
            Ok("postgres://c:2/test".into())
        });
        assert_eq!(started.as_deref(), Ok("postgres://c:2/test"));
        let failed = url_for(&POSTGRES, Source::Container, || Err("pull failed".into()));
        assert_eq!(failed, Err("pull failed".to_owned()));
    }

    #[test]
    fn the_local_probe_sees_a_listener_and_its_absence() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(local_answers(port));
        drop(listener);
        assert!(!local_answers(port));
    }

    /// The real probes, called from inside a runtime as a `#[tokio::test]` does: the Docker
    /// probe runs on its own thread, answers within its timeout, and a silent local port then
    /// means a container (Docker) or the "missing" message (no Docker).
    #[cfg(feature = "testcontainers")]
    #[test]
    fn the_real_probes_work_inside_a_runtime() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let silent = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let started = std::time::Instant::now();
        let (docker, source) = runtime.block_on(async {
            let docker = crate::containers::docker_answers();
            let source = decide(None, true, || local_answers(silent), || docker);
            (docker, source)
        });
        assert!(started.elapsed() < Duration::from_secs(30));
        let expected = if docker {
            Source::Container
        } else {
            Source::Missing
        };
        assert_eq!(source, expected);
    }
}
