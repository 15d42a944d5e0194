//! [`IdempotencyLayer`]: a tower middleware that makes an axum route idempotent, with the
//! record in the same transaction as the handler's writes.

mod leased;
mod numbers;
mod optimistic;
mod prepared;
mod replay;
mod request;
mod response;
mod service;
mod statuses;
mod target;
mod tx;
mod waiters;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use axum::http::{HeaderName, Method, request::Parts};
use idempotency_core::{IdempotencyService, JcsFingerprint, Scope};
use tower::Layer;

pub use leased::{LeasedIdempotencyLayer, LeasedMiddleware};
pub use optimistic::{ClaimFirst, Mode, Optimistic};
pub use service::IdempotencyMiddleware;
pub use statuses::StoredStatuses;
pub use tx::IdempotentTx;

use crate::error::Error;
use crate::scope::ScopeSource;
use crate::stored::HeaderFilter;

/// The largest request body the layer buffers by default: 64 KiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 64 * 1024;
/// How many duplicates of one key may wait at once (per process) by default, each with a
/// pooled connection, in transactional mode; see
/// [`max_waiters_per_key`](IdempotencyLayer::max_waiters_per_key).
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 4;
/// The largest response body the layer stores by default: 1 MiB.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 1024 * 1024;

/// The scope of a layer that has not chosen one: it is no [`ScopeSource`], so a layer without
/// [`IdempotencyLayer::scope`] does not compile. The scope must come from the authenticated
/// principal: a replay answers before the handler's own authorization checks run.
///
/// ```compile_fail,E0277
/// # use axum::{Router, routing::post};
/// # use idempotency_axum::IdempotencyLayer;
/// # use idempotency_core::IdempotencyService;
/// # use idempotency_sqlite::SqliteStore;
/// # fn app(store: SqliteStore) -> Router {
/// // error: `ScopeRequired` is not a ScopeSource: choose the scope with `.scope::<...>()`
/// Router::new()
///     .route("/orders", post(|| async { "ok" }))
///     .route_layer(IdempotencyLayer::new(IdempotencyService::new(store)))
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ScopeRequired;

/// Every key in the one shared, empty scope: any client that sends another's key (and body)
/// receives that client's stored response, and learns from a `422` that a key exists. Only
/// for a service with a single client, or whose keys are not a boundary between clients;
/// written out as `.scope::<SharedScope>()`, never the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SharedScope;

impl<St: Sync> ScopeSource<St> for SharedScope {
    type Rejection = Error;

    async fn scope(_parts: &mut Parts, _state: &St) -> Result<Scope, Error> {
        Ok(Scope::default())
    }
}

/// The methods the layer makes idempotent by default: the ones that change state. A request
/// with any other method (`GET`, `HEAD`, `OPTIONS`, a made-up one) passes through untouched: no
/// key needed, no record, no meter, no log line.
pub const DEFAULT_METHODS: &[Method] = &[Method::POST, Method::PUT, Method::PATCH, Method::DELETE];

/// Which keys the layer accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyFormat {
    /// Any key of the `Idempotency-Key` grammar.
    Any,
    /// UUID keys only, normalized to lower case.
    Uuid,
}

/// The layer's settings, shared by every request.
pub(crate) struct Settings {
    pub(crate) operation: Option<String>,
    /// The methods handled; others pass through (see [`DEFAULT_METHODS`]).
    pub(crate) methods: Vec<Method>,
    pub(crate) keys: KeyFormat,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) max_waiters: usize,
    pub(crate) statuses: StoredStatuses,
    pub(crate) headers: HeaderFilter,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    /// Whether the host is part of the fingerprint.
    pub(crate) fingerprint_host: bool,
    /// `None`: the service's strategy.
    pub(crate) fingerprint: Option<JcsFingerprint>,
}

pub(crate) struct Shared<S, L, D, M, Z> {
    pub(crate) service: IdempotencyService<S, L, D, M, Z>,
    pub(crate) settings: Settings,
    /// The requests of each key under way here, bounded by `settings.max_waiters`.
    pub(crate) waiters: waiters::Waiters,
    /// Replays from L1, read once per cached record.
    pub(super) prepared: prepared::PreparedReplays,
}

/// A tower [`Layer`] that makes a route idempotent without idempotency code in its handler.
///
/// Per request it validates the `Idempotency-Key` (the rules of
/// [`IdempotencyKeyHeader`](crate::IdempotencyKeyHeader), or of
/// [`UuidKeyHeader`](crate::UuidKeyHeader) with [`uuid_keys`](Self::uuid_keys)), derives the
/// scope with `Src` (chosen with [`scope`](Self::scope): there is no default, see
/// [`ScopeRequired`]), buffers the body
/// (`413 payload-too-large` past [`max_request_body`](Self::max_request_body)), and fingerprints
/// the request: its method, route template and concrete target (the path with its parameters
/// and the normalised query; the host with [`fingerprint_host`](Self::fingerprint_host)), its
/// body (RFC 8785 for a JSON body, the bytes otherwise) and the headers named with
/// [`fingerprint_header`](Self::fingerprint_header). The same key on another target
/// (`/accounts/A/charges`, then `/accounts/B/charges`; `?to=alice`, then `?to=bob`) is
/// `422 idempotency-key-reused`, never a replay. A replay answers the stored response byte for
/// byte, plus `Idempotent-Replayed: true`.
///
/// The target is compared in a canonical spelling: path segments and query pairs
/// percent-decoded as axum's `Path` and `Query` decode them (`+` is a space in the query), the
/// query's pairs ordered by name (the values of a repeated name keep their order), empty pairs
/// dropped. So `?b=2&a=1` and `?a=1&b=%32` are one target; `/a%2Fb` and `/a/b` are two.
///
/// Otherwise it begins a transaction on the service's store, acquires the key in it and hands
/// it to the handler as [`IdempotentTx`]. After the handler, a status that
/// [`StoredStatuses`] stores is recorded in that transaction (status, the headers
/// [`HeaderFilter`] allows, the body) and committed; any other status is rolled back and stays
/// retryable. The record, the handler's writes and its outbox events commit together or not at
/// all. The operation is the route template (`POST:/v2/payments`), from axum's `MatchedPath`:
/// add the layer with `Router::route_layer` or on the method router, or name the operation with
/// [`operation`](Self::operation).
///
/// ```no_run
/// use axum::{Json, Router, http::StatusCode, routing::post};
/// use idempotency_axum::{IdempotencyLayer, IdempotentTx, TenantHeader};
/// use idempotency_core::IdempotencyService;
/// use idempotency_pg::PgStore;
///
/// async fn create(mut tx: IdempotentTx<PgStore>, Json(body): Json<serde_json::Value>) -> (StatusCode, Json<serde_json::Value>) {
///     // statements on `&mut *tx` commit with the stored response
///     # let _ = &mut *tx;
///     (StatusCode::CREATED, Json(body))
/// }
///
/// # fn app(pool: idempotency_pg::sqlx::PgPool) -> Router {
/// let service = IdempotencyService::new(PgStore::new(pool));
/// Router::new()
///     .route("/orders", post(create))
///     .route_layer(IdempotencyLayer::new(service).scope::<TenantHeader>())
/// # }
/// ```
pub struct IdempotencyLayer<S, L, D, M, Z, Src = ScopeRequired, Mo = ClaimFirst> {
    shared: Arc<Shared<S, L, D, M, Z>>,
    scope: PhantomData<fn() -> (Src, Mo)>,
}

impl<S, L, D, M, Z> IdempotencyLayer<S, L, D, M, Z> {
    /// A layer over `service`: its store, caches, metrics, TTLs and in-flight policy.
    pub fn new(service: IdempotencyService<S, L, D, M, Z>) -> Self {
        let settings = Settings {
            operation: None,
            methods: DEFAULT_METHODS.to_vec(),
            keys: KeyFormat::Any,
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            max_waiters: DEFAULT_MAX_WAITERS_PER_KEY,
            statuses: StoredStatuses::default(),
            headers: HeaderFilter::default(),
            fingerprint_headers: Vec::new(),
            fingerprint_host: false,
            fingerprint: None,
        };
        Self {
            shared: Arc::new(Shared {
                service,
                settings,
                waiters: waiters::Waiters::default(),
                prepared: prepared::PreparedReplays::default(),
            }),
            scope: PhantomData,
        }
    }
}

impl<S, L, D, M, Z, Src, Mo> IdempotencyLayer<S, L, D, M, Z, Src, Mo> {
    fn settings(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => change(&mut shared.settings),
            None => {
                // A clone exists: copy-on-write.
                let mut settings = self.shared.settings.clone();
                change(&mut settings);
                self.shared = Arc::new(Shared {
                    service: self.shared.service.clone(),
                    settings,
                    waiters: waiters::Waiters::default(),
                    prepared: prepared::PreparedReplays::default(),
                });
            }
        }
        self
    }

    /// Derives each key's scope with `Src2` ([`PrincipalScope`](crate::PrincipalScope),
    /// [`TenantHeader`](crate::TenantHeader) or your own [`ScopeSource<()>`]). Required: the
    /// scope must come from the authenticated principal, at least as fine-grained as the
    /// boundary of who may read a response, because a replay answers before the handler's own
    /// checks run. [`SharedScope`] puts every client's keys together.
    pub fn scope<Src2>(self) -> IdempotencyLayer<S, L, D, M, Z, Src2, Mo> {
        IdempotencyLayer {
            shared: self.shared,
            scope: PhantomData,
        }
    }

    /// Names the operation instead of deriving it from the route template. 1 to 128 visible
    /// ASCII characters; checked per request (an invalid name answers 500).
    pub fn operation(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.settings(|s| s.operation = Some(name))
    }

    /// The methods the layer makes idempotent ([`DEFAULT_METHODS`] unless set). A request with
    /// another method passes through to the route untouched.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.settings(|s| s.methods = methods)
    }

    /// Accepts UUID keys only, as [`UuidKeyHeader`](crate::UuidKeyHeader) does.
    pub fn uuid_keys(self) -> Self {
        self.settings(|s| s.keys = KeyFormat::Uuid)
    }

    /// The largest request body buffered; a larger one answers `413 payload-too-large` before
    /// any I/O. [`DEFAULT_MAX_REQUEST_BODY`] by default.
    pub fn max_request_body(self, bytes: usize) -> Self {
        self.settings(|s| s.max_request_body = bytes)
    }

    /// The largest response body stored. A larger one, or a streaming body (one without an
    /// exact length), cannot be stored: see the crate docs. [`DEFAULT_MAX_RESPONSE_BODY`] by
    /// default.
    pub fn max_response_body(self, bytes: usize) -> Self {
        self.settings(|s| s.max_response_body = bytes)
    }

    /// How many duplicates of a key in flight may wait for it at once in this process
    /// ([`DEFAULT_MAX_WAITERS_PER_KEY`] unless set). In transactional mode each waits on the
    /// holder's row lock with a pooled connection; in leased mode each polls the store until
    /// the holder's outcome (a statement per poll). A duplicate beyond them answers `409
    /// request-in-flight` with `Retry-After` at once, without a connection, so copies of one
    /// slow request cannot take the pool. `0`: no duplicate waits.
    pub fn max_waiters_per_key(self, waiters: usize) -> Self {
        self.settings(|s| s.max_waiters = waiters)
    }

    /// Which statuses are stored ([`StoredStatuses::default`] unless set).
    pub fn stored_statuses(self, statuses: StoredStatuses) -> Self {
        self.settings(|s| s.statuses = statuses)
    }

    /// Which response headers are stored and replayed ([`HeaderFilter::default`] unless set;
    /// credentials never are).
    pub fn stored_headers(self, headers: HeaderFilter) -> Self {
        self.settings(|s| s.headers = headers)
    }

    /// Also fingerprints the values of request header `name`: the same key with another value
    /// is `422 idempotency-key-reused`. Sensitive headers are refused, because the
    /// fingerprint is stored.
    pub fn fingerprint_header(self, name: HeaderName) -> Result<Self, crate::SensitiveHeader> {
        if crate::is_sensitive(&name) {
            return Err(crate::SensitiveHeader(name));
        }
        Ok(self.settings(|s| {
            if !s.fingerprint_headers.contains(&name) {
                s.fingerprint_headers.push(name);
            }
        }))
    }

    /// Also fingerprints the host the request was sent to (the URI's authority, else the
    /// `Host` header, in lower case): the same key sent to another host is
    /// `422 idempotency-key-reused`. For services that serve several hosts (a tenant per
    /// subdomain) from one records table.
    ///
    /// It reads the host the service received, not `Forwarded` or `X-Forwarded-Host`: behind a
    /// proxy that rewrites `Host` (nginx's default `proxy_set_header Host $proxy_host`), every
    /// tenant's requests carry the same host, and a key sent to `b.example` replays `a.example`'s
    /// response. There, pass the original host through (`proxy_set_header Host $host`), or
    /// fingerprint the header the proxy sets
    /// ([`fingerprint_header`](Self::fingerprint_header)`("x-forwarded-host")`) after making
    /// sure the proxy overwrites any value a client sent. A scope per tenant
    /// ([`scope`](Self::scope)) keeps tenants apart whatever the host.
    pub fn fingerprint_host(self) -> Self {
        self.settings(|s| s.fingerprint_host = true)
    }

    /// The fingerprint strategy, instead of the service's (the one `fingerprint.*` configured,
    /// with its previous algorithm during a transition).
    pub fn fingerprint(self, strategy: JcsFingerprint) -> Self {
        self.settings(|s| s.fingerprint = Some(strategy))
    }
}

impl Clone for Settings {
    fn clone(&self) -> Self {
        Self {
            operation: self.operation.clone(),
            methods: self.methods.clone(),
            keys: self.keys,
            max_request_body: self.max_request_body,
            max_response_body: self.max_response_body,
            max_waiters: self.max_waiters,
            statuses: self.statuses.clone(),
            headers: self.headers.clone(),
            fingerprint_headers: self.fingerprint_headers.clone(),
            fingerprint_host: self.fingerprint_host,
            fingerprint: self.fingerprint,
        }
    }
}

impl<S, L, D, M, Z, Src, Mo> Clone for IdempotencyLayer<S, L, D, M, Z, Src, Mo> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            scope: PhantomData,
        }
    }
}

impl<S, L, D, M, Z, Src, Mo> fmt::Debug for IdempotencyLayer<S, L, D, M, Z, Src, Mo> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared.settings;
        f.debug_struct("IdempotencyLayer")
            .field("operation", &s.operation)
            .field("methods", &s.methods)
            .field("keys", &s.keys)
            .field("scope", &std::any::type_name::<Src>())
            .field("mode", &std::any::type_name::<Mo>())
            .field("max_request_body", &s.max_request_body)
            .field("max_response_body", &s.max_response_body)
            .field("max_waiters_per_key", &s.max_waiters)
            .field("stored_statuses", &s.statuses)
            .field("fingerprint_headers", &s.fingerprint_headers)
            .field("fingerprint_host", &s.fingerprint_host)
            .finish_non_exhaustive()
    }
}

impl<I, S, L, D, M, Z, Src, Mo> Layer<I> for IdempotencyLayer<S, L, D, M, Z, Src, Mo> {
    type Service = IdempotencyMiddleware<I, S, L, D, M, Z, Src, Mo>;

    fn layer(&self, inner: I) -> Self::Service {
        IdempotencyMiddleware::new(inner, Arc::clone(&self.shared))
    }
}
