//! The admin router (feature `admin`): the reads and actions of the `idempotency` command line
//! as JSON endpoints, and a small server-rendered admin page, for one deployment's tables.
//!
//! Built on [`ops::Operations`](crate::ops::Operations): the same statements, the same audit
//! lines (target [`AUDIT_TARGET`](crate::ops::AUDIT_TARGET)). **It authenticates nobody**:
//! mount it behind the host's authentication, on a listener operators reach, never on the
//! public one. Changes (evict, requeue, discard, purge, partitions, cleanup) answer 403 unless
//! [`AdminRouter::allow_mutations`] turned them on; the page then shows no buttons.
//!
//! ![The admin page](https://raw.githubusercontent.com/idempotency-rs/idempotency/main/crates/idempotency/docs/admin.png)
//!
//! # Mounting it behind the host's authentication
//!
//! A bearer token checked by a middleware, the principal handed to the audit trail as an
//! [`Actor`] request extension (without one, changes are audited as
//! [`AdminRouter::actor`]):
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # async fn demo(idempotency: idempotency::Idempotency<sqlx::SqlitePool>) {
//! use axum::extract::Request;
//! use axum::http::{StatusCode, header};
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use idempotency::ops::Actor;
//!
//! async fn operators_only(mut request: Request, next: Next) -> Result<Response, StatusCode> {
//!     let token = request
//!         .headers()
//!         .get(header::AUTHORIZATION)
//!         .and_then(|v| v.to_str().ok())
//!         .and_then(|v| v.strip_prefix("Bearer "));
//!     // Look the token up in the host's own store of operators; compare in constant time.
//!     let operator = match token {
//!         Some("s3cr3t-token-of-alice") => "alice",
//!         _ => return Err(StatusCode::UNAUTHORIZED),
//!     };
//!     request.extensions_mut().insert(Actor::new(operator));
//!     Ok(next.run(request).await)
//! }
//!
//! let admin = idempotency
//!     .admin_router()
//!     .allow_mutations(true)
//!     .into_router()
//!     .layer(middleware::from_fn(operators_only));
//! let app: axum::Router = axum::Router::new()
//!     // .route("/orders", post(create_order))
//!     .nest("/admin", admin);
//! # }
//! ```
//!
//! tower-http's `ValidateRequestHeaderLayer::bearer(token)` does the same for one shared
//! token (the demo's way).
//!
//! # Endpoints
//!
//! Relative to where the router is mounted; JSON bodies, errors as RFC 9457
//! `application/problem+json` (400 for a malformed id, key or body, 404 for an unknown key or
//! dead letter or a missing outbox, 403 for a disabled change, 409 for a requeue that would
//! publish out of order). The fields are the command line's `--json` ones.
//!
//! | Method and path | What (CLI command) |
//! | --- | --- |
//! | `GET /` | the admin page (HTML) |
//! | `GET /api/outbox/status` | `outbox status` |
//! | `GET /api/outbox/dead?aggregate_type=&aggregate_id=&event_type=&limit=` | `outbox dead list` |
//! | `GET /api/outbox/dead/{id}` | `outbox dead show ID` |
//! | `POST /api/outbox/dead/requeue` `{"ids": [..]}` (at most 1,000) or `{"aggregate_type": .., "all": true}` | `outbox dead requeue` (change) |
//! | `POST /api/outbox/dead/discard` (the same bodies) | `outbox dead discard` (change) |
//! | `GET /api/outbox/purge?published=7d&dead_lettered=30d` | `outbox purge --dry-run` |
//! | `POST /api/outbox/purge` `{"published": "7d", "dead_lettered": "30d"}` | `outbox purge` (change) |
//! | `GET /api/outbox/partitions` | `outbox partitions list` |
//! | `POST /api/outbox/partitions/create` | `outbox partitions create` (change) |
//! | `POST /api/outbox/partitions/drop-expired` | `outbox partitions drop-expired` (change) |
//! | `GET /api/keys?operation=&key=&scope=` | `keys show` |
//! | `POST /api/keys/evict` `{"operation": .., "key": .., "scope": .., "force": false, "claim": ..}` | `keys evict` (change; a key without a record: its stale Redis entry, `"evicted": false`; `claim`, with `force` only: the lease token shown, `null` for none: 409 `admin-key-changed` when another claim holds the key or it settled since) |
//! | `GET /api/keys/stats` | `keys stats` |
//! | `GET /api/cleanup` | `cleanup run --dry-run` |
//! | `POST /api/cleanup` | `cleanup run` (change) |
//! | `GET /api/schema` | `schema print` |
//! | `GET /api/schema/problems` | `schema validate` |
//!
//! A change from a browser must come from the page's own origin, or 403 (a guard for hosts
//! that authenticate with cookies or Basic credentials the browser keeps; bearer tokens are
//! not sent by other sites anyway): `Sec-Fetch-Site` must be `same-origin` (or `none`) where
//! the browser sends it; where it does not (a page on plain HTTP), `Origin` must be the
//! request's own (`Host`) or one given to [`AdminRouter::trusted_origin`] (the public origin,
//! when a reverse proxy rewrites `Host`). Requests with neither (command-line clients,
//! scripts) pass. The page asks for `Referrer-Policy: same-origin` (a `meta` element), so that
//! its own forms carry their `Origin` even where the host sends `no-referrer`. JSON bodies
//! must be sent as `application/json` (415 otherwise).
//!
//! This is no authentication: a listener that trusts the network alone (no credentials) is
//! open to any page that makes its name resolve to the listener (DNS rebinding), whose
//! requests carry a `Host` and an `Origin` of the attacker's name, which agree. Put the
//! router behind the host's authentication, as above.

mod api;
mod html;
mod page;
mod problem;

use std::borrow::Cow;
use std::sync::Arc;

use axum::Extension;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::routing::{get, post};

use crate::ops::{Actor, AdminDatabase, Operations};

/// The setting a disabled change's 403 answer names by default.
pub const DEFAULT_MUTATIONS_SETTING: &str = "AdminRouter::allow_mutations(true)";

/// Dead letters listed on the page and, by default, by `GET /api/outbox/dead`.
pub const DEFAULT_LIST_LIMIT: u32 = 50;

/// The most `GET /api/outbox/dead` lists at once (`limit`).
pub const MAX_LIST_LIMIT: u32 = 1000;

/// Builds the admin router over [`Operations`]: see the [module](self) for the endpoints and
/// how to mount it.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotency::admin::AdminRouter;
/// use idempotency::ops::{Actor, Operations};
///
/// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
/// let ops = Operations::new(pool, &idempotency::Settings::default(), Actor::new("admin")).await?;
/// let admin: axum::Router = AdminRouter::new(ops).into_router(); // reads only
/// # Ok(()) }
/// ```
pub struct AdminRouter<D: AdminDatabase> {
    ops: Operations<D>,
    mutations: bool,
    setting: Cow<'static, str>,
    list_limit: u32,
    trusted_origins: Vec<String>,
}

impl<D: AdminDatabase> std::fmt::Debug for AdminRouter<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminRouter")
            .field("actor", self.ops.actor())
            .field("mutations", &self.mutations)
            .field("setting", &self.setting)
            .field("list_limit", &self.list_limit)
            .field("trusted_origins", &self.trusted_origins)
            .finish_non_exhaustive()
    }
}

impl<D: AdminDatabase> AdminRouter<D> {
    /// The router over `ops`, reads only; changes without an [`Actor`] extension on the
    /// request are audited as `ops`' actor.
    pub fn new(ops: Operations<D>) -> Self {
        Self {
            ops,
            mutations: false,
            setting: Cow::Borrowed(DEFAULT_MUTATIONS_SETTING),
            list_limit: DEFAULT_LIST_LIMIT,
            trusted_origins: Vec::new(),
        }
    }

    /// Turns the changes on (evict, requeue, discard, purge, partitions create and
    /// drop-expired, cleanup run) or off. Default off: they answer 403 and the page shows no
    /// buttons.
    pub fn allow_mutations(mut self, allow: bool) -> Self {
        self.mutations = allow;
        self
    }

    /// The name of the host's setting that turns the changes on, named in the 403 answer
    /// (e.g. `admin.allow-mutations` of the host's configuration). Default
    /// [`DEFAULT_MUTATIONS_SETTING`].
    pub fn mutations_setting(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.setting = name.into();
        self
    }

    /// Who changes are audited as made by when the request carries no [`Actor`] extension.
    pub fn actor(mut self, actor: Actor) -> Self {
        self.ops = self.ops.with_actor(actor);
        self
    }

    /// How many dead letters the page lists (oldest first). Default [`DEFAULT_LIST_LIMIT`].
    pub fn list_limit(mut self, limit: u32) -> Self {
        self.list_limit = limit.clamp(1, MAX_LIST_LIMIT);
        self
    }

    /// An origin (`scheme://host[:port]`, as a browser's `Origin` header writes it) whose
    /// pages may send changes besides the request's own: the admin page's public origin when
    /// a reverse proxy in front of the router rewrites `Host`. Only read when the browser
    /// sends no `Sec-Fetch-Site` (see the [module](self)).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use idempotency::admin::AdminRouter;
    /// use idempotency::ops::{Actor, Operations};
    ///
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// let ops = Operations::new(pool, &idempotency::Settings::default(), Actor::new("admin")).await?;
    /// let admin: axum::Router = AdminRouter::new(ops)
    ///     .allow_mutations(true)
    ///     .trusted_origin("http://ops.internal.example")
    ///     .into_router();
    /// # Ok(()) }
    /// ```
    pub fn trusted_origin(mut self, origin: impl Into<String>) -> Self {
        // As a browser writes it: no trailing slash.
        let origin: String = origin.into();
        self.trusted_origins
            .push(origin.trim_end_matches('/').to_owned());
        self
    }

    /// The axum router: `nest` it under a prefix of the host's router, behind the host's
    /// authentication.
    pub fn into_router<T: Clone + Send + Sync + 'static>(self) -> axum::Router<T> {
        let state = Arc::new(Admin {
            ops: self.ops,
            mutations: self.mutations,
            setting: self.setting,
            list_limit: self.list_limit,
            trusted_origins: self.trusted_origins,
        });
        axum::Router::new()
            .route("/", get(page::index::<D>))
            .route("/dead/{id}/{action}", post(page::dead_action::<D>))
            .route("/keys/evict", post(page::evict::<D>))
            .route("/api/outbox/status", get(api::status::<D>))
            .route("/api/outbox/dead", get(api::dead_list::<D>))
            .route("/api/outbox/dead/requeue", post(api::requeue::<D>))
            .route("/api/outbox/dead/discard", post(api::discard::<D>))
            .route("/api/outbox/dead/{id}", get(api::dead_show::<D>))
            .route(
                "/api/outbox/purge",
                get(api::purge_preview::<D>).post(api::purge::<D>),
            )
            .route("/api/outbox/partitions", get(api::partitions::<D>))
            .route(
                "/api/outbox/partitions/create",
                post(api::partitions_create::<D>),
            )
            .route(
                "/api/outbox/partitions/drop-expired",
                post(api::partitions_drop::<D>),
            )
            .route("/api/keys", get(api::key_show::<D>))
            .route("/api/keys/evict", post(api::key_evict::<D>))
            .route("/api/keys/stats", get(api::key_stats::<D>))
            .route(
                "/api/cleanup",
                get(api::cleanup_preview::<D>).post(api::cleanup::<D>),
            )
            .route("/api/schema", get(api::schema::<D>))
            .route("/api/schema/problems", get(api::schema_problems::<D>))
            .with_state(state)
    }
}

/// The router's state.
struct Admin<D: AdminDatabase> {
    ops: Operations<D>,
    mutations: bool,
    setting: Cow<'static, str>,
    list_limit: u32,
    trusted_origins: Vec<String>,
}

type State<D> = axum::extract::State<Arc<Admin<D>>>;

/// The request's [`Actor`] extension, set by the host's authentication.
type Principal = Option<Extension<Actor>>;

impl<D: AdminDatabase> Admin<D> {
    /// The operations as the request's principal, or the router's actor.
    fn ops(&self, principal: Principal) -> Cow<'_, Operations<D>> {
        match principal {
            Some(Extension(actor)) => Cow::Owned(self.ops.clone().with_actor(actor)),
            None => Cow::Borrowed(&self.ops),
        }
    }
}

/// A change may run: changes are on ([`AdminRouter::allow_mutations`]), else 403, and no other
/// site's page sent it ([`problem::same_origin`]), else 403. Every changing handler takes it
/// first: the JSON endpoints answer 403 before their body is read; the page's forms (which
/// take `Result<Allowed, _>` to answer with the error page) before anything is changed.
struct Allowed;

impl<D: AdminDatabase> FromRequestParts<Arc<Admin<D>>> for Allowed {
    type Rejection = problem::Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<Admin<D>>,
    ) -> Result<Self, Self::Rejection> {
        if !state.mutations {
            return Err(problem::Problem::mutations_disabled(&state.setting));
        }
        let authority = parts.uri.authority().map(|a| a.as_str());
        problem::same_origin(&parts.headers, authority, &state.trusted_origins)?;
        Ok(Self)
    }
}

impl<D: AdminDatabase> crate::Idempotency<D> {
    /// The admin router over this service's store and outbox (reads only until
    /// [`AdminRouter::allow_mutations`]); changes are audited as `admin` unless the request
    /// carries an [`Actor`] extension. See [`admin`](crate::admin) for mounting it behind
    /// the host's authentication.
    ///
    /// ```no_run
    /// # #[cfg(feature = "sqlite")]
    /// # async fn demo(idempotency: idempotency::Idempotency<sqlx::SqlitePool>) {
    /// let app: axum::Router = axum::Router::new()
    ///     .nest("/admin", idempotency.admin_router().into_router()); // behind auth!
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "admin")))]
    pub fn admin_router(&self) -> AdminRouter<D> {
        AdminRouter::new(Operations::from_parts(
            self.pool().clone(),
            self.settings(),
            self.store().clone(),
            self.outbox().ok().cloned(),
            Actor::new("admin"),
            #[cfg(feature = "redis")]
            (
                self.cache_prefix().map(str::to_owned),
                crate::DistributedTier::clone(self.service().distributed_cache()),
                self.cache_closed(),
            ),
            #[cfg(feature = "moka")]
            self.service().local_cache().clone(),
        ))
    }
}
