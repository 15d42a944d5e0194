//! One HTTP request to the demo and what its answer says: status, `Idempotent-Replayed`, the
//! payment (or charge) id, a digest of the body, the problem type, which instance answered.
//!
//! The client is hyper-util's pooled client over plain HTTP/1.1: the demo listens on loopback
//! without TLS, hyper is already in the workspace's dependency graph (through axum), and a load
//! generator wants the thinnest client (no redirects, cookies or decompression layers).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;

use crate::Error;
use crate::keys::{charge_body, charge_key, payment_body};

/// The header a replayed answer carries.
pub const REPLAYED: &str = "idempotent-replayed";
/// The media type of RFC 9457 problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// What the requests call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `POST /api/payments` with an `Idempotency-Key` and a body derived from the key.
    Payments,
    /// `GET /health`: the same server and client without idempotency, as a baseline.
    Health,
    /// `POST /api/payments/unprotected`: the same payment and body without an `Idempotency-Key`
    /// (every request is a new payment), the baseline of the HTTP bench.
    Unprotected,
    /// `POST /charges`: UUID keys only, so each key is sent as [`charge_key`]`(key)`, with
    /// [`charge_body`]`(key)`; the charge and its `ChargeCreated` outbox event commit together.
    /// The answer's `id` is tracked as the payments' `paymentId` is.
    Charges,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Payments => "/api/payments",
            Self::Health => "/health",
            Self::Unprotected => "/api/payments/unprotected",
            Self::Charges => "/charges",
        }
    }

    /// Whether answers create a resource per key (payments, charges): tracked per key.
    pub fn keyed(self) -> bool {
        matches!(self, Self::Payments | Self::Charges)
    }
}

/// The status of an answer, or why there was none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    /// An HTTP status code.
    Http(u16),
    /// No complete answer within the request timeout.
    Timeout,
    /// The connection failed (refused, reset, closed early).
    Failed,
}

impl Status {
    /// A 5xx answer.
    pub fn is_server_error(self) -> bool {
        matches!(self, Self::Http(code) if code >= 500)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(code) => write!(f, "{code}"),
            Self::Timeout => f.write_str("timeout"),
            Self::Failed => f.write_str("connection-error"),
        }
    }
}

/// What one request got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The status.
    pub status: Status,
    /// `Idempotent-Replayed: true` was present.
    pub replayed: bool,
    /// The `paymentId` of a 201 from `/api/payments`, the `id` of a 201 from `/charges`.
    pub payment_id: Option<String>,
    /// FNV-1a digest of the body of a 201 from a keyed endpoint: a replay must return the
    /// same bytes, whichever instance answers.
    pub body_digest: Option<u64>,
    /// Which base URL the request went to (its index in the client's list).
    pub instance: usize,
    /// The answer is `application/problem+json`.
    pub problem_json: bool,
    /// The last segment of the problem's `type` URI (`store-unavailable`...).
    pub problem_type: Option<String>,
}

impl Reply {
    #[cfg(test)]
    pub(crate) fn without_answer_for_tests(status: Status) -> Self {
        Self::without_answer(status, 0)
    }

    fn without_answer(status: Status, instance: usize) -> Self {
        Self {
            status,
            replayed: false,
            payment_id: None,
            body_digest: None,
            instance,
            problem_json: false,
            problem_type: None,
        }
    }
}

/// Sends requests to one endpoint of one or more instances of the demo, over a shared
/// connection pool.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    uris: Vec<Uri>,
    endpoint: Endpoint,
    tenant: Option<String>,
    timeout: Duration,
}

impl HttpClient {
    /// A client of `endpoint` under each of `base_urls` (`http://127.0.0.1:8080`; instances
    /// of one service), keeping up to `connections` idle connections per instance, each
    /// request bounded by `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_load::client::{Endpoint, HttpClient};
    ///
    /// let urls = ["http://127.0.0.1:8081".to_owned(), "http://127.0.0.1:8082".to_owned()];
    /// let client = HttpClient::new(&urls, Endpoint::Payments, None, Duration::from_secs(5), 10)?;
    /// assert_eq!(client.instances(), 2);
    /// assert!(HttpClient::new(&[], Endpoint::Payments, None, Duration::from_secs(5), 1).is_err());
    /// # Ok::<(), idempotency_load::Error>(())
    /// ```
    pub fn new(
        base_urls: &[String],
        endpoint: Endpoint,
        tenant: Option<String>,
        timeout: Duration,
        connections: usize,
    ) -> Result<Self, Error> {
        if base_urls.is_empty() {
            return Err(Error::Invalid("no base URL".to_owned()));
        }
        let uris = base_urls
            .iter()
            .map(|base_url| {
                let url = format!("{}{}", base_url.trim_end_matches('/'), endpoint.path());
                url.parse()
                    .map_err(|e: http::uri::InvalidUri| Error::Request {
                        url: url.clone(),
                        source: e.into(),
                    })
            })
            .collect::<Result<Vec<Uri>, _>>()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .build(connector);
        Ok(Self {
            client,
            uris,
            endpoint,
            tenant,
            timeout,
        })
    }

    /// How many instances (base URLs) the client sends to.
    pub fn instances(&self) -> usize {
        self.uris.len()
    }

    /// Sends one request to instance `instance` (modulo [`instances`](Self::instances); with
    /// `key` as `Idempotency-Key` for payments and charges) and reads the answer.
    pub async fn send(&self, key: &str, instance: usize) -> Reply {
        let instance = instance % self.uris.len();
        let request = match self.request(key, &self.uris[instance]) {
            Ok(request) => request,
            Err(_) => return Reply::without_answer(Status::Failed, instance),
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body))
        };
        let (parts, body) = match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Reply::without_answer(Status::Failed, instance),
            Err(_) => return Reply::without_answer(Status::Timeout, instance),
        };
        let header = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let problem_json =
            header(CONTENT_TYPE.as_str()).is_some_and(|v| v.starts_with(PROBLEM_JSON));
        let mut reply = Reply {
            status: Status::Http(parts.status.as_u16()),
            replayed: header(REPLAYED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")),
            payment_id: None,
            body_digest: None,
            instance,
            problem_json,
            problem_type: None,
        };
        let json = || serde_json::from_slice::<serde_json::Value>(&body).ok();
        if problem_json {
            reply.problem_type = json()
                .and_then(|b| b.get("type")?.as_str().map(str::to_owned))
                .map(|t| t.rsplit('/').next().unwrap_or_default().to_owned());
        } else if self.endpoint.keyed() && parts.status.as_u16() == 201 {
            let field = match self.endpoint {
                Endpoint::Charges => "id",
                _ => "paymentId",
            };
            reply.payment_id = json().and_then(|b| b.get(field)?.as_str().map(str::to_owned));
            reply.body_digest = Some(crate::keys::fnv1a_bytes(&body));
        }
        reply
    }

    fn request(&self, key: &str, uri: &Uri) -> Result<Request<Full<Bytes>>, http::Error> {
        let mut builder = Request::builder().uri(uri.clone());
        if let Some(tenant) = &self.tenant {
            builder = builder.header("x-tenant-id", HeaderValue::from_str(tenant)?);
        }
        match self.endpoint {
            Endpoint::Health => builder.method(Method::GET).body(Full::default()),
            Endpoint::Payments => builder
                .method(Method::POST)
                .header(CONTENT_TYPE, "application/json")
                .header("idempotency-key", HeaderValue::from_str(key)?)
                .body(Full::new(Bytes::from(payment_body(key)))),
            Endpoint::Charges => builder
                .method(Method::POST)
                .header(CONTENT_TYPE, "application/json")
                .header("idempotency-key", HeaderValue::from_str(&charge_key(key))?)
                .body(Full::new(Bytes::from(charge_body(key)))),
            Endpoint::Unprotected => builder
                .method(Method::POST)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(payment_body(key)))),
        }
    }
}
