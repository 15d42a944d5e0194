//! The wire between the Redis L2 and its server: a proxy that can make Redis hang (every answer
//! held) or unreachable (every connection cut, new ones closed at once), and the task that does
//! so at random moments while a history runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::CheckError;
use crate::faults::{Faults, Injected};

/// A TCP proxy in front of Redis. What the client sends goes through at once; while
/// [`hang`](Self::hang) is in force, Redis's answers wait in the proxy; while
/// [`cut`](Self::cut) is, every connection is closed and new ones are closed as soon as they
/// are accepted. [`restore`](Self::restore) ends both.
#[derive(Debug)]
pub struct CacheWire {
    port: u16,
    held: watch::Sender<bool>,
    cut: watch::Sender<bool>,
}

impl CacheWire {
    /// Listens on a free local port and forwards each connection to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Result<Self, CheckError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| CheckError::Setup(format!("the Redis proxy: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| CheckError::Setup(format!("the Redis proxy: {e}")))?
            .port();
        let (held, _) = watch::channel(false);
        let (cut, _) = watch::channel(false);
        let (gate, cutter) = (held.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *cutter.borrow() {
                    continue; // dropped: closed at once
                }
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = inbound.into_split();
                let (mut server_read, mut server_write) = outbound.into_split();
                let mut cut = cutter.subscribe();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy(&mut client_read, &mut server_write) => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
                let mut open = gate.subscribe();
                let mut cut = cutter.subscribe();
                tokio::spawn(async move {
                    let answers = async {
                        let mut buffer = vec![0u8; 16 * 1024];
                        loop {
                            let n = match server_read.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if open.wait_for(|held| !held).await.is_err()
                                || client_write.write_all(&buffer[..n]).await.is_err()
                            {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        () = answers => {}
                        _ = cut.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Ok(Self { port, held, cut })
    }

    /// The local port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds Redis's answers from now on: calls wait, and time out.
    pub fn hang(&self) {
        self.held.send_replace(true);
    }

    /// Closes every connection and refuses new ones from now on: Redis is unreachable.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets the held answers through and accepts connections again.
    pub fn restore(&self) {
        self.cut.send_replace(false);
        self.held.send_replace(false);
    }
}

/// Makes Redis hang or unreachable for 50 to 250 ms stretches, 150 to 450 ms apart (the first
/// within 150 ms, while the keys' first requests read Redis), until
/// `done`; counts each stretch in `faults`.
pub(crate) async fn disturb(
    wire: Arc<CacheWire>,
    seed: u64,
    done: Arc<AtomicBool>,
    faults: Arc<Faults>,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00ca_c4e5);
    let mut gap = rng.random_range(0..150);
    while !done.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        gap = rng.random_range(150..450);
        if rng.random_bool(0.5) {
            wire.hang();
            faults.count(Injected::RedisHang);
        } else {
            wire.cut();
            faults.count(Injected::RedisCut);
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
        wire.restore();
    }
    wire.restore();
}

/// `url` with its host and port replaced by `127.0.0.1:port` (user, password and database kept).
pub(crate) fn through(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let (user, rest) = match rest.rsplit_once('@') {
        Some((user, rest)) => (format!("{user}@"), rest),
        None => (String::new(), rest),
    };
    let tail = rest.find(['/', '?']).map_or("", |at| &rest[at..]);
    format!("{scheme}://{user}127.0.0.1:{port}{tail}")
}

#[cfg(test)]
mod tests {
    use super::through;

    #[test]
    fn a_url_goes_through_the_proxy() {
        assert_eq!(
            through("redis://127.0.0.1:6379", 4000),
            "redis://127.0.0.1:4000"
        );
        assert_eq!(
            through("redis://:pw@cache.example:6380/2", 4000),
            "redis://:pw@127.0.0.1:4000/2"
        );
    }
}
