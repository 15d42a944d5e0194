//! [`HoldingProxy`]: a TCP proxy that can hold a server's answers, to drop a client's future
//! exactly while its request is on the wire.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    cut: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
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
        let (cut, _) = watch::channel(0u64);
        let cutter = cut.clone();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (accepting, opened) = (Arc::clone(&accepted), Arc::clone(&open));
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                accepting.fetch_add(1, Ordering::SeqCst);
                // Before the upstream connection: a cut while it is made ends it too.
                let mut cuts = cutter.subscribe();
                cuts.mark_unchanged();
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                opened.fetch_add(1, Ordering::SeqCst);
                let closed = Closed(Arc::clone(&opened));
                let (mut client_read, mut client_write) = inbound.into_split();
                let (mut server_read, mut server_write) = outbound.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let mut open = gate.subscribe();
                tokio::spawn(async move {
                    // The connection is over when its answers end (the server closed it,
                    // after the client did or by itself), cannot reach the client, or are
                    // cut: the client then reads the end of the stream.
                    let _closed = closed;
                    let forward = async {
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
                        () = forward => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self {
            port,
            held,
            cut,
            accepted,
            open,
        }
    }

    /// The local port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Ends the answers of every connection open now, those held in the proxy with them:
    /// their clients read the end of the stream, as when a connection is lost while the
    /// server's answer is on its way. What the clients send still reaches the server.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// How many of them are open now (forwarded, and their answers not ended: by the
    /// server, or by [`cut`](Self::cut)).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
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

/// Counts a forwarded connection as closed when dropped.
struct Closed(Arc<AtomicUsize>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
