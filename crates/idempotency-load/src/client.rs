//! One HTTP request to the demo and what its answer says: status, `Idempotent-Replayed`, the
//! payment (or charge) id, a digest of the body, the problem type, which instance answered.
//!
//! The client is hyper's HTTP/1.1 connection, one per concurrent client and instance, driven by
//! the client's own task: the demo listens on loopback without TLS, hyper is already in the
//! workspace's dependency graph (through axum), and a load generator wants the thinnest client
//! (no pool, redirects, cookies or decompression layers), because on one machine the CPU it
//! spends is taken from the servers it measures.

use std::borrow::Cow;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::header::{CONTENT_TYPE, HOST, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

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
    /// `POST /api/payments/validate`: the payment's request (headers and body, its
    /// `Idempotency-Key` included) checked and answered without paying or touching the
    /// database: the HTTP bench's floor, what any payment request costs the server.
    Validate,
    /// `POST /v2/payments`: the payment of [`Payments`](Self::Payments) behind
    /// `IdempotencyLayer` (claim-first), the same headers and body.
    V2Payments,
    /// `POST /v2/payments/optimistic`: the same payment behind `IdempotencyLayer::optimistic`
    /// (the handler first, then the record in one insert), the same headers and body.
    V2PaymentsOptimistic,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Payments => "/api/payments",
            Self::Health => "/health",
            Self::Unprotected => "/api/payments/unprotected",
            Self::Charges => "/charges",
            Self::Validate => "/api/payments/validate",
            Self::V2Payments => "/v2/payments",
            Self::V2PaymentsOptimistic => "/v2/payments/optimistic",
        }
    }

    /// Whether answers create a resource per key (payments, charges): tracked per key.
    pub fn keyed(self) -> bool {
        matches!(
            self,
            Self::Payments | Self::Charges | Self::V2Payments | Self::V2PaymentsOptimistic
        )
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

/// The fields of an answer's JSON body that a reply keeps; the rest is skipped unparsed.
#[derive(Deserialize)]
struct PaymentFields<'a> {
    #[serde(rename = "paymentId", borrow)]
    payment_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChargeFields<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ProblemFields<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
}

/// What every request of a run shares: the instances, the endpoint, the tenant and the bound on
/// one request. Each concurrent client sends through a [`Session`] of its own.
#[derive(Debug, Clone)]
pub struct HttpClient {
    targets: Arc<[Target]>,
    endpoint: Endpoint,
    tenant: Option<HeaderValue>,
    timeout: Duration,
}

/// One instance: where to connect and the request line and `Host` header sent to it.
#[derive(Debug)]
struct Target {
    address: String,
    path: Uri,
    host: HeaderValue,
}

impl Target {
    fn parse(base_url: &str, path: &str) -> Result<Self, Error> {
        let url = format!("{}{path}", base_url.trim_end_matches('/'));
        let invalid = |source: http::Error| Error::Request {
            url: url.clone(),
            source,
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.into()))?;
        let authority = match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(authority)) => authority,
            _ => return Err(Error::Invalid(format!("{url}: not an http:// URL"))),
        };
        let address = format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        );
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| invalid(e.into()))?;
        let path = uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.into()))?;
        Ok(Self {
            address,
            path,
            host,
        })
    }
}

impl HttpClient {
    /// A client of `endpoint` under each of `base_urls` (`http://127.0.0.1:8080`; instances
    /// of one service), each request bounded by `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotency_load::client::{Endpoint, HttpClient};
    ///
    /// let urls = ["http://127.0.0.1:8081".to_owned(), "http://127.0.0.1:8082".to_owned()];
    /// let client = HttpClient::new(&urls, Endpoint::Payments, None, Duration::from_secs(5))?;
    /// assert_eq!(client.instances(), 2);
    /// assert!(HttpClient::new(&[], Endpoint::Payments, None, Duration::from_secs(5)).is_err());
    /// let https = ["https://127.0.0.1:8443".to_owned()];
    /// assert!(HttpClient::new(&https, Endpoint::Payments, None, Duration::from_secs(5)).is_err());
    /// # Ok::<(), idempotency_load::Error>(())
    /// ```
    pub fn new(
        base_urls: &[String],
        endpoint: Endpoint,
        tenant: Option<String>,
        timeout: Duration,
    ) -> Result<Self, Error> {
        if base_urls.is_empty() {
            return Err(Error::Invalid("no base URL".to_owned()));
        }
        let targets = base_urls
            .iter()
            .map(|base_url| Target::parse(base_url, endpoint.path()))
            .collect::<Result<Arc<[Target]>, _>>()?;
        let tenant = tenant
            .map(|t| HeaderValue::from_str(&t))
            .transpose()
            .map_err(|e| Error::Invalid(format!("tenant: {e}")))?;
        Ok(Self {
            targets,
            endpoint,
            tenant,
            timeout,
        })
    }

    /// How many instances (base URLs) the client sends to.
    pub fn instances(&self) -> usize {
        self.targets.len()
    }

    /// A session: the connections of one concurrent client, one per instance, opened on its
    /// first request to that instance.
    pub fn session(&self) -> Session {
        Session {
            client: self.clone(),
            connections: (0..self.targets.len()).map(|_| None).collect(),
        }
    }

    fn request(&self, key: &str, target: &Target) -> Result<Request<Full<Bytes>>, http::Error> {
        let mut builder = Request::builder()
            .uri(target.path.clone())
            .header(HOST, target.host.clone());
        if let Some(tenant) = &self.tenant {
            builder = builder.header("x-tenant-id", tenant.clone());
        }
        match self.endpoint {
            Endpoint::Health => builder.method(Method::GET).body(Full::default()),
            Endpoint::Payments
            | Endpoint::Validate
            | Endpoint::V2Payments
            | Endpoint::V2PaymentsOptimistic => builder
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

    /// What an answer from instance `instance` says.
    fn reply(&self, instance: usize, parts: &http::response::Parts, body: &Bytes) -> Reply {
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
        if problem_json {
            reply.problem_type = serde_json::from_slice::<ProblemFields<'_>>(body)
                .ok()
                .and_then(|p| p.kind)
                .map(|t| t.rsplit('/').next().unwrap_or_default().to_owned());
        } else if self.endpoint.keyed() && parts.status.as_u16() == 201 {
            reply.payment_id = match self.endpoint {
                Endpoint::Charges => serde_json::from_slice::<ChargeFields<'_>>(body)
                    .ok()
                    .and_then(|b| b.id),
                _ => serde_json::from_slice::<PaymentFields<'_>>(body)
                    .ok()
                    .and_then(|b| b.payment_id),
            }
            .map(Cow::into_owned);
            reply.body_digest = Some(crate::keys::fnv1a_bytes(body));
        }
        reply
    }
}

/// The connections of one concurrent client: HTTP/1.1 with keep-alive, one per instance, each
/// driven by the task that sends on it (no connection pool, no task per connection, so a
/// request costs the load generator the least CPU it can: on a machine whose cores the
/// servers under test share, that CPU is taken from them).
///
/// A connection that failed, timed out or was closed by the server is dropped, and the next
/// request to that instance opens a new one.
pub struct Session {
    client: HttpClient,
    connections: Vec<Option<Connection>>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let open = self.connections.iter().filter(|c| c.is_some()).count();
        f.debug_struct("Session")
            .field("client", &self.client)
            .field("open_connections", &open)
            .finish()
    }
}

type Driver = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One open connection: the handle requests are sent on, and the future that reads and
/// writes its socket (polled only while a request of this session is in flight).
struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: Pin<Box<Driver>>,
    /// The driver has completed: the connection is closed and must not be polled again.
    ended: bool,
}

impl Connection {
    async fn open(address: &str) -> Result<Self, BoxError> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (sender, driver) = http1::handshake(TokioIo::new(stream)).await?;
        Ok(Self {
            sender,
            driver: Box::pin(driver),
            ended: false,
        })
    }

    /// Whether the server closed the connection while it was idle (a restart, a keep-alive
    /// timeout): noticed before a request is handed to it, so that the request goes on a new
    /// connection instead of failing.
    fn closed_while_idle(&mut self) -> bool {
        self.ended || self.driver.as_mut().now_or_never().is_some() || self.sender.is_closed()
    }

    /// Sends `request` and reads the whole answer, driving the connection meanwhile.
    async fn exchange(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<(http::response::Parts, Bytes), BoxError> {
        let Self {
            sender,
            driver,
            ended,
        } = self;
        let answer = async {
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, BoxError>((parts, body))
        };
        tokio::pin!(answer);
        tokio::select! {
            biased;
            answer = &mut answer => answer,
            _ = driver.as_mut() => {
                // The connection ended (the server closed it after its answer, or failed):
                // the answer was handed over before, or its channel now fails; it cannot hang.
                *ended = true;
                answer.await
            }
        }
    }
}

impl Session {
    /// Sends one request to instance `instance` (modulo
    /// [`instances`](HttpClient::instances); with `key` as `Idempotency-Key` for payments and
    /// charges) and reads the answer.
    pub async fn send(&mut self, key: &str, instance: usize) -> Reply {
        let client = &self.client;
        let instance = instance % client.targets.len();
        let target = &client.targets[instance];
        let request = match client.request(key, target) {
            Ok(request) => request,
            Err(_) => return Reply::without_answer(Status::Failed, instance),
        };
        let slot = &mut self.connections[instance];
        if slot.as_mut().is_some_and(Connection::closed_while_idle) {
            *slot = None;
        }
        let exchange = async {
            let connection = match slot {
                Some(connection) => connection,
                None => slot.insert(Connection::open(&target.address).await?),
            };
            connection.exchange(request).await
        };
        let answer = tokio::time::timeout(client.timeout, exchange).await;
        let (parts, body) = match answer {
            Ok(Ok(answer)) => answer,
            failed => {
                // Failed, or timed out with its answer perhaps still to come: either way the
                // connection cannot carry another request.
                self.connections[instance] = None;
                let status = if failed.is_err() {
                    Status::Timeout
                } else {
                    Status::Failed
                };
                return Reply::without_answer(status, instance);
            }
        };
        client.reply(instance, &parts, &body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// How the test server treats a connection after its first answer.
    #[derive(Clone, Copy)]
    enum After {
        /// Keep it open for more requests.
        KeepAlive,
        /// Close it once idle, as a server does after a keep-alive timeout or on restart.
        Close,
        /// Never answer (the first request hangs).
        Hang,
    }

    /// Appends what the peer sent next to `buffer`; `false` once it closed or failed.
    async fn read_more(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 1024];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buffer.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// A one-route HTTP/1.1 server on loopback: every request gets a 201 replay of a payment.
    /// Returns its base URL and the number of connections it accepted so far.
    async fn server(after: After) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    loop {
                        // One request: the head, then Content-Length bytes of body.
                        let head_end = loop {
                            if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            if !read_more(&mut socket, &mut buffer).await {
                                return;
                            }
                        };
                        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buffer.len() < head_end + length {
                            if !read_more(&mut socket, &mut buffer).await {
                                return;
                            }
                        }
                        assert!(head.contains("\r\nhost: 127.0.0.1:"), "{head}");
                        assert!(head.starts_with("post /api/payments http/1.1"), "{head}");
                        buffer.drain(..head_end + length);
                        if let After::Hang = after {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        let body = r#"{"paymentId":"p-1","amount":"1.00"}"#;
                        let answer = format!(
                            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                             idempotent-replayed: true\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        socket.write_all(answer.as_bytes()).await.unwrap();
                        if let After::Close = after {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    fn client(url: &str, timeout: Duration) -> HttpClient {
        HttpClient::new(&[url.to_owned()], Endpoint::Payments, None, timeout).unwrap()
    }

    #[tokio::test]
    async fn a_session_keeps_its_connection_and_reads_the_answer() {
        let (url, accepted) = server(After::KeepAlive).await;
        let mut session = client(&url, Duration::from_secs(5)).session();
        for _ in 0..3 {
            let reply = session.send("k-1", 0).await;
            assert_eq!(reply.status, Status::Http(201));
            assert!(reply.replayed);
            assert_eq!(reply.payment_id.as_deref(), Some("p-1"));
            assert_eq!(
                reply.body_digest,
                Some(crate::keys::fnv1a_bytes(
                    br#"{"paymentId":"p-1","amount":"1.00"}"#
                ))
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one keep-alive connection"
        );
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced_without_a_failure() {
        let (url, accepted) = server(After::Close).await;
        let mut session = client(&url, Duration::from_secs(5)).session();
        for round in 1..=3 {
            let reply = session.send("k-1", 0).await;
            assert_eq!(reply.status, Status::Http(201), "round {round}");
            // The server's close reaches the client before its next request.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_unanswered_request_times_out_and_the_next_one_opens_a_new_connection() {
        let (url, accepted) = server(After::Hang).await;
        let mut session = client(&url, Duration::from_millis(200)).session();
        assert_eq!(session.send("k-1", 0).await.status, Status::Timeout);
        assert_eq!(session.send("k-1", 0).await.status, Status::Timeout);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "a timed-out connection is not reused"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connection_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let mut session = client(&url, Duration::from_secs(5)).session();
        assert_eq!(session.send("k-1", 0).await.status, Status::Failed);
    }
}
