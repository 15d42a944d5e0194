//! A TCP proxy we can cut, to take a broker away and bring it back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};

use tokio::net::{TcpListener, TcpStream};

/// Forwards 127.0.0.1:`port` to `upstream` while enabled; refuses (accepts and drops) while
/// disabled, and `disable` also cuts the connections it forwards.
pub struct Proxy {
    pub port: u16,
    enabled: Arc<AtomicBool>,
    generation: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Proxy {
    pub async fn start(upstream: String, enabled: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let flag = Arc::new(AtomicBool::new(enabled));
        let (tx, _) = tokio::sync::watch::channel(0u64);
        let generation = Arc::new(tx);
        let (on, gen_tx) = (Arc::clone(&flag), Arc::clone(&generation));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !on.load(AtomicOrdering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let mut cut = gen_tx.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Self {
            port,
            enabled: flag,
            generation,
        }
    }

    pub fn enable(&self) {
        self.enabled.store(true, AtomicOrdering::SeqCst);
    }

    pub fn disable(&self) {
        self.enabled.store(false, AtomicOrdering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
}

/// host:port of a URL like `scheme://user:pass@host:port/path`.
pub fn host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap();
    let rest = rest.rsplit('@').next().unwrap();
    rest.split('/').next().unwrap().to_owned()
}

/// `url` with its host:port replaced by 127.0.0.1:`port`.
pub fn via_port(url: &str, port: u16) -> String {
    url.replacen(&host_port(url), &format!("127.0.0.1:{port}"), 1)
}
