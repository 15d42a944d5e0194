//! The laptop path (feature `testcontainers`): PostgreSQL and Redis in Docker, started at most
//! once per test process and removed when the process exits.
//!
//! Each `#[tokio::test]` has its own runtime, so nothing here runs on the caller's runtime: the
//! Docker probe and each container start run on a thread of their own (testcontainers' blocking
//! runner). The thread that started a container keeps it for the life of the process. Statics
//! are never dropped, so the removal cannot be a destructor: a small reaper process
//! (`sh`, `docker rm`) waits for the end of a pipe held by this process and removes the container
//! once the process is gone, however it ended. Without a `docker` command the containers stay:
//! `docker rm -f -v $(docker ps -aq --filter label=org.idempotency-rs.testing)` removes them.

use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

use testcontainers::core::client::docker_client_instance;
use testcontainers::runners::SyncRunner;
use testcontainers::{ContainerRequest, Image, ImageExt};
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::redis::{REDIS_PORT, Redis};

use crate::servers::Kind;

/// The label on every container started here.
const LABEL: &str = "org.idempotency-rs.testing";
const POSTGRES_PORT: u16 = 5432;

/// Whether a Docker engine answers a ping within five seconds (asked once per process).
pub(crate) fn docker_answers() -> bool {
    static ANSWER: OnceLock<bool> = OnceLock::new();
    *ANSWER.get_or_init(|| {
        std::thread::Builder::new()
            .name("idempotency-testing-docker-probe".into())
            .spawn(ping)
            .ok()
            .and_then(|probe| probe.join().ok())
            .unwrap_or(false)
    })
}

fn ping() -> bool {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    runtime.block_on(async {
        let ping = async { docker_client_instance().await.ok()?.ping().await.ok() };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ping).await,
            Ok(Some(_))
        )
    })
}

/// Starts the container for `kind` and returns its URL. The container lives until the process
/// exits.
pub(crate) fn start(kind: Kind) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    let name = match kind {
        Kind::Postgres => "postgres",
        Kind::Redis => "redis",
    };
    std::thread::Builder::new()
        .name(format!("idempotency-testing-{name}"))
        .spawn(move || match kind {
            Kind::Postgres => keep(postgres(), POSTGRES_PORT, &tx, |host, port| {
                format!("postgres://postgres@{host}:{port}/test")
            }),
            Kind::Redis => keep(redis(), REDIS_PORT, &tx, |host, port| {
                format!("redis://{host}:{port}")
            }),
        })
        .map_err(|e| format!("cannot start a thread for the {name} container: {e}"))?;
    rx.recv()
        .map_err(|_| format!("the {name} container thread ended without an answer"))?
}

/// PostgreSQL as the local one: user `postgres` without a password, database `test`.
fn postgres() -> ContainerRequest<Postgres> {
    Postgres::default()
        .with_host_auth()
        .with_db_name("test")
        .with_tag("16-alpine")
        // Every test opens a pool of its own: room for many at once; durability is not needed.
        .with_cmd(["-c", "fsync=off", "-c", "max_connections=200"])
        .with_label(LABEL, "postgres")
}

fn redis() -> ContainerRequest<Redis> {
    Redis::default()
        .with_tag("7-alpine")
        .with_label(LABEL, "redis")
}

/// Runs on the container's own thread: starts it, sends its URL, then keeps it (and its reaper)
/// for the life of the process.
fn keep<I: Image>(
    request: ContainerRequest<I>,
    port: u16,
    tx: &Sender<Result<String, String>>,
    url: impl FnOnce(&str, u16) -> String,
) {
    let image = format!("{}:{}", request.image().name(), request.image().tag());
    let started = request.start().and_then(|container| {
        let host = container.get_host()?.to_string();
        let host_port = container.get_host_port_ipv4(port)?;
        Ok((container, url(&host, host_port)))
    });
    let (container, url) = match started {
        Ok(started) => started,
        Err(e) => {
            let _ = tx.send(Err(format!(
                "a Docker engine answers, but the {image} container did not start: {e}"
            )));
            return;
        }
    };
    let _reaper = reaper(container.id());
    let _ = tx.send(Ok(url));
    loop {
        std::thread::park();
    }
}

/// A process that removes container `id` (and its volumes) once the write end of its stdin, held
/// here, closes: when this process exits. It ignores the terminal's signals so that Ctrl-C on the
/// tests still cleans up.
fn reaper(id: &str) -> Option<ChildStdin> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(r#"trap '' INT TERM HUP; cat >/dev/null; docker rm -f -v "$1" >/dev/null 2>&1"#)
        .arg("idempotency-testing-reaper")
        .arg(id)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()
}
