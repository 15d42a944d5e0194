//! fred's connection task ends on some errors while it processes a command (here: an `ASK`
//! redirection to a node it cannot reach, "Max attempts reached"); after that nothing reads the
//! client's commands. `RedisCache::connect` watches the task and connects again, so the cache
//! serves again instead of timing out for good.
//!
//! A call made while fred handles the `ASK` (its routing task sleeps between attempts) is
//! still queued when the task ends. fred 10 cancels it without counting it out, and a client
//! connected again after that leaves every command unflushed in its socket until the next
//! one pushes it out: the calls time out one by one. So the cache replaces the client rather
//! than reconnect it, and the test queues such a call on purpose.
//!
//! The cluster is a one-node fake that speaks just enough RESP: it owns every slot, and answers
//! the first `GET` with an `ASK` to a node that does not exist, every later one with nil.

#![allow(clippy::unwrap_used, clippy::print_stderr)] // tests fail loudly

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idempotency_cache_redis::{DistributedCacheConfig, RedisCache};
use idempotency_core::DistributedCache;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::id;

/// One RESP array of bulk strings from the start of `buffer`, and its length; `None` until
/// the whole command is there.
fn parse(buffer: &[u8]) -> Option<(Vec<String>, usize)> {
    fn line(buffer: &[u8], at: usize) -> Option<(&str, usize)> {
        let end = buffer[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((std::str::from_utf8(&buffer[at..end]).ok()?, end + 2))
    }
    let (head, mut at) = line(buffer, 0)?;
    let count: usize = head.strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, next) = line(buffer, at)?;
        let len: usize = len.strip_prefix('$')?.parse().ok()?;
        if buffer.len() < next + len + 2 {
            return None;
        }
        args.push(String::from_utf8_lossy(&buffer[next..next + len]).into_owned());
        at = next + len + 2;
    }
    Some((args, at))
}

fn bulk(text: &str) -> String {
    format!("${}\r\n{text}\r\n", text.len())
}

fn reply(args: &[String], port: u16, asked: &AtomicBool) -> String {
    let words: Vec<String> = args.iter().map(|a| a.to_ascii_uppercase()).collect();
    match words
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["PING", ..] => "+PONG\r\n".to_owned(),
        ["CLUSTER", "SLOTS"] => format!(
            "*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n{}:{port}\r\n{}",
            bulk("127.0.0.1"),
            bulk(&"a".repeat(40))
        ),
        ["CLUSTER", "INFO"] => bulk("cluster_state:ok\r\n"),
        ["CLIENT", "ID"] => ":1\r\n".to_owned(),
        ["INFO", ..] => bulk("# Server\r\nredis_version:7.0.15\r\n"),
        ["GET", ..] if !asked.swap(true, Ordering::SeqCst) => "-ASK 866 127.0.0.1:1\r\n".to_owned(),
        ["GET", ..] => "$-1\r\n".to_owned(),
        _ => "+OK\r\n".to_owned(),
    }
}

async fn serve(mut socket: TcpStream, port: u16, asked: Arc<AtomicBool>) {
    let mut buffer = Vec::new();
    let mut chunk = [0; 4096];
    loop {
        while let Some((args, used)) = parse(&buffer) {
            buffer.drain(..used);
            let answer = reply(&args, port, &asked);
            if socket.write_all(answer.as_bytes()).await.is_err() {
                return;
            }
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Starts the fake node; its `redis-cluster://` URL.
async fn fake_cluster() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, port, asked.clone()));
        }
    });
    format!("redis-cluster://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_connection_task_ends_on_an_error_the_client_connects_again() {
    let url = fake_cluster().await;
    let config = DistributedCacheConfig {
        key_prefix: "task:".to_owned(),
        timeout: Duration::from_secs(5),
        secret: Some(support::secret()),
        ..Default::default()
    };
    let cache = RedisCache::connect(&url, &config).unwrap();
    let id = id("PAY", "", "asked");
    let first = {
        let cache = cache.clone();
        let id = id.clone();
        tokio::spawn(async move { cache.get(&id).await })
    };
    // fred retries the ASK after about 500 ms; this call waits in its queue meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = cache.get(&id).await;
    let first = first.await.unwrap();
    assert!(first.is_err(), "the ASK to a missing node fails: {first:?}");
    assert!(
        queued.is_err(),
        "the queued call ends with the task: {queued:?}"
    );
    let started = Instant::now();
    let mut last = cache.get(&id).await;
    while last.is_err() && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = cache.get(&id).await;
    }
    assert!(
        matches!(last, Ok(None)),
        "the client never served again: {last:?}; stats {:?}",
        cache.stats()
    );
    eprintln!("served again {:?} after the failed call", started.elapsed());
}
