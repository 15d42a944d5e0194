//! The request side of the middleware: key, operation, bounded body, fingerprint.

use axum::body::{Body, Bytes};
use axum::extract::MatchedPath;
use axum::http::{HeaderMap, request::Parts};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idempotency_core::{Fingerprint, FingerprintStrategy, IdempotencyKey, Operation};
use serde_json::{Map, Value};

use super::{KeyFormat, Settings, numbers, target};
use crate::error::Error;
use crate::header::{parse_key, parse_uuid_key, single_value};
use crate::json::declares_json;
use crate::problem::{Problem, ProblemKind};

/// The operation name could not be derived.
#[derive(Debug, thiserror::Error)]
#[error(
    "IdempotencyLayer found no route template: add it with Router::route_layer or on the method router, or name the operation"
)]
struct NoRouteTemplate;

impl Settings {
    /// Whether the layer handles `request` at all: its method is one of the layer's. Any
    /// other passes through, so a client cannot make a record, an operation name or a meter
    /// label out of a method of its choosing.
    pub(super) fn handles<B>(&self, request: &axum::http::Request<B>) -> bool {
        self.methods.contains(request.method())
    }

    /// The validated key, with the rules of the key extractors.
    pub(super) fn key(&self, headers: &HeaderMap) -> Result<IdempotencyKey, Error> {
        let value = single_value(headers)?.ok_or(Error::KeyMissing)?;
        Ok(match self.keys {
            KeyFormat::Any => parse_key(value)?,
            KeyFormat::Uuid => parse_uuid_key(value)?.0,
        })
    }

    /// The route template and the operation: `METHOD:/template`, unless named.
    pub(super) fn operation(&self, parts: &Parts) -> Result<(String, Operation), Error> {
        let route = match parts.extensions.get::<MatchedPath>() {
            Some(path) => path.as_str().to_owned(),
            None if self.operation.is_some() => parts.uri.path().to_owned(),
            None => return Err(Error::internal(NoRouteTemplate)),
        };
        let name = match &self.operation {
            Some(name) => name.clone(),
            None => format!("{}:{route}", parts.method),
        };
        let operation = Operation::new(name).map_err(Error::internal)?;
        Ok((route, operation))
    }

    /// The whole body, at most `max_request_body` bytes.
    pub(super) async fn buffer(&self, body: Body) -> Result<Bytes, Response> {
        match Limited::new(body, self.max_request_body).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                Err(Problem::new(ProblemKind::PayloadTooLarge)
                    .with_detail(format!(
                        "The request body is larger than {} bytes.",
                        self.max_request_body
                    ))
                    .into_response())
            }
            Err(error) => {
                tracing::debug!(%error, "request body could not be read");
                Err(Problem::new(ProblemKind::BodyUnreadable).into_response())
            }
        }
    }

    /// Refuses a body declared JSON that nests deeper than
    /// [`MAX_JSON_DEPTH`](idempotency_core::MAX_JSON_DEPTH): `422 invalid-request-body`, before
    /// the key is acquired or the handler runs, so nothing is stored and a retry is refused the
    /// same way. Nothing deeper could be stored on every backend (an outcome or an outbox event
    /// built from it would fail after the handler ran).
    pub(super) fn refuse_too_deep(
        &self,
        parts: &Parts,
        body: &Bytes,
    ) -> Result<(), idempotency_core::JsonTooDeep> {
        if !declares_json(&parts.headers) {
            return Ok(());
        }
        idempotency_core::check_json_depth(body)
    }

    /// The fingerprint of method, route template, concrete target (path, query, host when
    /// configured), body and the opted-in headers, the previous algorithm's while a
    /// transition accepts it, and whether the body is declared JSON and does not parse.
    ///
    /// A JSON body (`application/json` or `application/*+json`) that parses is its RFC 8785
    /// canonical form, so key order, whitespace and number spelling do not matter, unless one
    /// of its numbers is not exactly what the canonical form writes for it (a number a double
    /// cannot hold: more digits than a double keeps, an integer beyond 64 bits); that body and
    /// any other body are taken as their exact bytes. Header values are taken as their
    /// bytes: a UTF-8 value as its text, any other as base64. The path enters in its canonical spelling when it is not the
    /// route template itself (a route with parameters or a wildcard), the query when it has
    /// any pair: so a route without parameters, called without a query, keeps the fingerprint
    /// it had before the target was part of it.
    pub(super) fn fingerprint(
        &self,
        service_strategy: &dyn FingerprintStrategy,
        parts: &Parts,
        route: &str,
        body: &Bytes,
    ) -> Result<(Fingerprint, Option<Fingerprint>, bool), Error> {
        let strategy: &dyn FingerprintStrategy = match &self.fingerprint {
            Some(strategy) => strategy,
            None => service_strategy,
        };
        let mut request = Map::new();
        request.insert("method".into(), parts.method.as_str().into());
        request.insert("route".into(), route.into());
        let path = target::path(parts);
        if path != route {
            request.insert("path".into(), path.into());
        }
        if let Some(query) = target::query(parts) {
            request.insert("query".into(), query.into());
        }
        if self.fingerprint_host {
            request.insert("host".into(), target::host(parts).into());
        }
        let declared_json = declares_json(&parts.headers);
        let json = declared_json
            .then(|| serde_json::from_slice::<Value>(body).ok())
            .flatten();
        let malformed_json = declared_json && json.is_none();
        // A number that a double cannot hold exactly would make two payloads one: the bytes.
        let json = json.filter(|_| numbers::all_exact(body));
        match json {
            Some(value) => request.insert("json".into(), value),
            None => request.insert("bytes".into(), STANDARD.encode(body).into()),
        };
        if !self.fingerprint_headers.is_empty() {
            let headers = self
                .fingerprint_headers
                .iter()
                .map(|name| {
                    let values = parts
                        .headers
                        .get_all(name)
                        .iter()
                        .map(|v| header_value(v.as_bytes()))
                        .collect();
                    (name.as_str().to_owned(), Value::Array(values))
                })
                .collect();
            request.insert("headers".into(), Value::Object(headers));
        }
        let request = Value::Object(request);
        let failed = |e: idempotency_core::FingerprintError| Error::Idempotency(e.into());
        Ok((
            strategy.fingerprint(&request).map_err(failed)?,
            strategy.previous_fingerprint(&request).map_err(failed)?,
            malformed_json,
        ))
    }
}

/// A header value in the fingerprint, byte for byte: its text when it is UTF-8 (the form every
/// earlier fingerprint used), else `{"bytes": base64}`, which no text can equal.
fn header_value(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::from(text),
        Err(_) => serde_json::json!({ "bytes": STANDARD.encode(bytes) }),
    }
}
