//! `idempotency-load`: an HTTP load generator for the idempotency demo.
//!
//! ```sh
//! idempotency-load --url http://127.0.0.1:8080 --clients 200 --keys 20 --duration 30s
//! idempotency-load --endpoint health --clients 50 --duration 10s        # baseline
//! idempotency-load --fresh --requests 5000 --key-log /tmp/keys.jsonl --json
//! idempotency-load --keys-from /tmp/keys.jsonl --clients 20            # replay every key once
//! idempotency-load --url http://127.0.0.1:8081,http://127.0.0.1:8082 --keys 20   # round-robin
//! ```

#![allow(clippy::print_stderr)] // a command-line tool: its errors go to standard error

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use idempotency_load::Error;
use idempotency_load::client::Endpoint;
use idempotency_load::keys::KeySource;
use idempotency_load::load::{LoadConfig, run};
use idempotency_load::report::Report;

/// Command-line options.
#[derive(Debug, Parser)]
#[command(
    name = "idempotency-load",
    about = "HTTP load generator for the idempotency demo: ops/s, latency quantiles, statuses, \
             replays and distinct paymentIds per key"
)]
struct Args {
    /// Base URL of the demo. Several instances: repeat the option or separate the URLs with
    /// commas; requests go to them in turn (round-robin per request, every key of a --keys
    /// pool to every instance).
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    url: Vec<String>,
    /// Endpoint: `payments` (POST /api/payments), `charges` (POST /charges, UUID keys derived
    /// from the keys), `unprotected` (POST /api/payments/unprotected, the same payment without
    /// idempotency), `validate` (POST /api/payments/validate, the payment's request checked
    /// without paying), `v2-payments` (POST /v2/payments, behind IdempotencyLayer),
    /// `v2-payments-optimistic` (POST /v2/payments/optimistic, behind
    /// IdempotencyLayer::optimistic) or `health` (GET /health).
    #[arg(long, value_enum, default_value_t = Endpoint::Payments)]
    endpoint: Endpoint,
    /// Concurrent clients.
    #[arg(long, short = 'c', default_value_t = 10)]
    clients: usize,
    /// Run for this long (`30s`, `500ms`); with neither --duration, --requests nor
    /// --keys-from, 10 s.
    #[arg(long, short = 'd', value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Stop after this many requests.
    #[arg(long, short = 'n')]
    requests: Option<u64>,
    /// Pick keys from a pool of K distinct keys, in turn (the default is a fresh key per
    /// request).
    #[arg(long, value_name = "K", group = "key-source")]
    keys: Option<u64>,
    /// A fresh key per request (the default).
    #[arg(long, group = "key-source")]
    fresh: bool,
    /// Send this one key with every request.
    #[arg(long, value_name = "KEY", group = "key-source")]
    replay: Option<String>,
    /// Send each key of this file once: one key per line, or a --key-log file.
    #[arg(long, value_name = "FILE", group = "key-source")]
    keys_from: Option<PathBuf>,
    /// Prefix of generated keys (default: `load-<unix ms>-<pid>`, unique per run).
    #[arg(long)]
    key_prefix: Option<String>,
    /// Send `X-Tenant-Id` with this value.
    #[arg(long)]
    tenant: Option<String>,
    /// Bound on one request; later answers count as `timeout`.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print the statuses per second of the run (always in the JSON report).
    #[arg(long)]
    timeline: bool,
    /// Write one JSON line per key: first status, first paymentId, requests, paymentIds seen.
    #[arg(long, value_name = "FILE")]
    key_log: Option<PathBuf>,
}

impl Args {
    fn key_source(&self) -> Result<KeySource, Error> {
        let prefix = self.key_prefix.clone().unwrap_or_else(|| {
            let millis = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            format!("load-{millis}-{}", std::process::id())
        });
        Ok(match (&self.keys, &self.replay, &self.keys_from) {
            (Some(size), _, _) => KeySource::Pool {
                prefix,
                size: *size,
            },
            (_, Some(key), _) => KeySource::One(key.clone()),
            (_, _, Some(path)) => KeySource::from_file(path)?,
            _ => KeySource::Fresh { prefix },
        })
    }
}

fn write_key_log(path: &PathBuf, report: &Report) -> Result<(), Error> {
    let file_error = |source| Error::File {
        path: path.clone(),
        source,
    };
    let file = std::fs::File::create(path).map_err(file_error)?;
    let mut out = std::io::BufWriter::new(file);
    for line in &report.key_log {
        serde_json::to_writer(&mut out, line)?;
        out.write_all(b"\n").map_err(file_error)?;
    }
    out.flush().map_err(file_error)
}

async fn main_inner(args: Args) -> Result<(), Error> {
    let config = LoadConfig {
        base_urls: args.url.clone(),
        endpoint: args.endpoint,
        clients: args.clients,
        duration: args.duration,
        requests: args.requests,
        keys: args.key_source()?,
        tenant: args.tenant.clone(),
        timeout: args.timeout,
    };
    let report = run(&config).await?;
    if let Some(path) = &args.key_log {
        write_key_log(path, &report)?;
    }
    let text = if args.json {
        let mut json = serde_json::to_string(&report)?;
        json.push('\n');
        json
    } else if args.timeline {
        format!("{report}{}", report.timeline_text())
    } else {
        report.to_string()
    };
    print_report(&text)
}

/// Writes the report to standard output. A reader that stopped reading (`| head -1`) ends the
/// run quietly, as it ends `cat`: Rust ignores `SIGPIPE`, so the write fails with
/// `BrokenPipe`, where `print!` would panic.
fn print_report(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => Ok(result?),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match main_inner(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let mut message = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            eprintln!("idempotency-load: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(args: &[&str]) -> Vec<String> {
        let mut argv = vec!["idempotency-load"];
        argv.extend_from_slice(args);
        Args::try_parse_from(argv).unwrap().url
    }

    #[test]
    fn urls_are_repeated_or_comma_separated_and_default_to_one() {
        assert_eq!(urls(&[]), ["http://127.0.0.1:8080"]);
        assert_eq!(
            urls(&["--url", "http://a:1", "--url", "http://b:2,http://c:3"]),
            ["http://a:1", "http://b:2", "http://c:3"]
        );
        assert_eq!(
            urls(&["--url", "http://a:1,http://b:2"]),
            ["http://a:1", "http://b:2"]
        );
    }
}
