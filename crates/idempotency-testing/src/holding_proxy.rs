//! [`HoldingProxy`]: a TCP proxy that can hold a server's answers, to drop a client's future
//! exactly while its request is on the wire.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards `127.0.0.1:port` to a server. What the client sends goes through at once; while
/// [`hold`](Self::hold) is in force, what the server answers waits in the proxy until
/// [`release`](Self::release).
///
/// ```no_run
/// # async fn demo() {
/// let proxy = idempotency_testing::HoldingProxy::start("127.0.0.1:5432".to_owned()).await;
/// proxy.hold(); // the server still runs what it gets; its answers wait
/// proxy.release();
/// # let _ = proxy.port();
/// # }
/// ```
#[derive(Debug)]
pub struct HoldingProxy {
    port: u16,
    held: watch::Sender<bool>,
}

impl HoldingProxy {
    /// Listens on a free local port and forwards each connection to `upstream` (`host:port`).
    ///
    /// # Panics
    ///
    /// When no local port can be bound.
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("cannot bind the proxy: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the proxy's address: {e}"))
            .port();
        let (held, _) = watch::channel(false);
        let gate = held.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = inbound.into_split();
                let (mut server_read, mut server_write) = outbound.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let mut open = gate.subscribe();
                tokio::spawn(async move {
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
                });
            }
        });
        Self { port, held }
    }

    /// The local port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds the server's answers from now on.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Lets the held answers, and the ones after them, through.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Holds the answers, polls `call` for 300 ms, drops it, then releases the answers: the
    /// drop lands while `call` waits for an answer the server already sent.
    ///
    /// # Panics
    ///
    /// When `call` finished inside those 300 ms: it was not waiting for an answer, so the test
    /// would not exercise a drop on the wire.
    pub async fn drop_while_held<F: Future>(&self, call: F) {
        const WINDOW: std::time::Duration = std::time::Duration::from_millis(300);
        self.hold();
        let finished = tokio::time::timeout(WINDOW, call).await.is_ok();
        self.release();
        assert!(
            !finished,
            "the call finished while the server's answers were held"
        );
    }
}

/// Waits until every connection of `pool` is back in it. A connection returns only after its
/// release ping is answered: a test that is about to [`hold`](HoldingProxy::hold) the answers
/// waits here first, so that the ping's answer is not the one held.
pub async fn until_idle<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    while pool.num_idle() < pool.size() as usize {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
