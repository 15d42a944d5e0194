//! Router-level tests of the extractors: every accepted form and every rejection, through
//! `oneshot`. No database is involved: the handlers echo what they extracted.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

mod support;

use axum::Router;
use axum::extract::Request;
use axum::routing::post;
use idempotency_axum::{
    IdempotencyKeyHeader, Principal, PrincipalScope, ScopedKey, TenantHeader, TenantHeaderName,
    UuidKeyHeader,
};
use idempotency_core::{KeyError, Scope};
use support::{Reply, send_post};
use tower::util::MapRequestLayer;

/// An authenticated user, put in the extensions by a fake authentication layer.
#[derive(Clone)]
struct User {
    org: String,
}

impl Principal for User {
    fn idempotency_scope(&self) -> Result<Scope, KeyError> {
        Scope::new(format!("org:{}", self.org))
    }
}

struct OrgHeader;

impl TenantHeaderName for OrgHeader {
    const NAME: &'static str = "x-org";
}

/// Copies `x-test-user` into a `User` extension, as an authentication layer would.
fn fake_auth(mut request: Request) -> Request {
    if let Some(org) = request.headers().get("x-test-user") {
        let org = org.to_str().unwrap().to_owned();
        request.extensions_mut().insert(User { org });
    }
    request
}

fn app() -> Router {
    Router::new()
        .route(
            "/any",
            post(|IdempotencyKeyHeader(key): IdempotencyKeyHeader| async move { key.into_inner() }),
        )
        .route(
            "/uuid",
            post(|key: UuidKeyHeader| async move { format!("{}|{}", key.key, key.uuid) }),
        )
        .route(
            "/optional",
            post(|key: Option<IdempotencyKeyHeader>| async move {
                key.map_or_else(|| "none".to_owned(), |k| format!("some:{}", k.0))
            }),
        )
        .route(
            "/optional-uuid",
            post(|key: Option<UuidKeyHeader>| async move {
                key.map_or_else(|| "none".to_owned(), |k| format!("some:{}", k.key))
            }),
        )
        .route(
            "/tenant",
            post(|scoped: ScopedKey<TenantHeader>| async move {
                let (key, scope) = scoped.into_parts();
                format!("{scope}|{key}")
            }),
        )
        .route(
            "/org",
            post(
                |scoped: ScopedKey<TenantHeader<OrgHeader>, UuidKeyHeader>| async move {
                    format!("{}|{}", scoped.scope, scoped.key.key)
                },
            ),
        )
        .route(
            "/principal",
            post(|scoped: ScopedKey<PrincipalScope<User>>| async move {
                format!("{}|{}", scoped.scope, scoped.key.0)
            }),
        )
        .layer(MapRequestLayer::new(fake_auth))
}

const KEY: &str = "idempotency-key";
const UUID: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

async fn any(value: &[u8]) -> Reply {
    send_post(&app(), "/any", &[(KEY, value)]).await
}

#[tokio::test]
async fn bare_and_quoted_keys_are_the_same_key() {
    for (value, key) in [
        (&b"abc-123"[..], "abc-123"),
        (b"\"abc-123\"", "abc-123"),
        (b"  \"abc-123\"  ", "abc-123"),
        (br#""a\"b\\c""#, r#"a"b\c"#),
        (br#""a,b;c""#, "a,b;c"),
        (
            b"!#$%&'()*+-./:<=>?@[\\]^_`{|}~",
            "!#$%&'()*+-./:<=>?@[\\]^_`{|}~",
        ),
    ] {
        let reply = any(value).await;
        assert_eq!(reply.status, 200, "{value:?}: {}", reply.text());
        assert_eq!(reply.text(), key);
    }
    let longest = "k".repeat(255);
    assert_eq!(any(longest.as_bytes()).await.text(), longest);
    assert_eq!(
        any(format!("\"{longest}\"").as_bytes()).await.text(),
        longest
    );
}

#[tokio::test]
async fn missing_key_is_400_key_missing() {
    let app = app();
    for uri in ["/any", "/uuid", "/tenant", "/principal"] {
        let headers: &[(&str, &[u8])] = &[("x-tenant-id", b"t1"), ("x-test-user", b"u")];
        let body = send_post(&app, uri, headers)
            .await
            .assert_problem(400, "idempotency-key-missing");
        assert!(body["detail"].as_str().unwrap().contains("Idempotency-Key"));
    }
}

#[tokio::test]
async fn empty_key_is_refused() {
    any(b"").await.assert_invalid_key("empty");
    any(b"\"\"").await.assert_invalid_key("empty");
}

#[tokio::test]
async fn key_longer_than_255_is_refused() {
    let long = "k".repeat(256);
    any(long.as_bytes()).await.assert_invalid_key("too-long");
    any(format!("\"{long}\"").as_bytes())
        .await
        .assert_invalid_key("too-long");
}

#[tokio::test]
async fn invisible_and_non_ascii_characters_are_refused() {
    for value in [
        &b"a b"[..],
        b"a\tb",
        "clé".as_bytes(),
        b"\xff\xfe",
        b"\"a b\"",
        b"\"a\tb\"",
        "\"ключ\"".as_bytes(),
    ] {
        any(value).await.assert_invalid_key("invalid-character");
    }
}

#[tokio::test]
async fn lists_and_parameters_are_refused() {
    for value in [&br#""a", "b""#[..], br#""a","b""#, b"a,b", b"a, b"] {
        any(value).await.assert_invalid_key("list");
    }
    for value in [&br#""a";x=1"#[..], b"a;x=1", br#""a"; x"#] {
        any(value).await.assert_invalid_key("parameters");
    }
}

#[tokio::test]
async fn malformed_strings_are_refused() {
    for value in [
        &b"\"abc"[..],
        br#""a\nb""#,
        br#""abc\""#,
        br#""a"b"#,
        br#"a"b"#,
    ] {
        any(value).await.assert_invalid_key("malformed");
    }
}

#[tokio::test]
async fn header_given_twice_is_refused() {
    let app = app();
    send_post(&app, "/any", &[(KEY, b"k-1"), (KEY, b"k-2")])
        .await
        .assert_invalid_key("repeated");
    send_post(&app, "/any", &[(KEY, b"k-1"), ("Idempotency-Key", b"k-1")])
        .await
        .assert_invalid_key("repeated");
    send_post(&app, "/optional", &[(KEY, b"k-1"), (KEY, b"k-1")])
        .await
        .assert_invalid_key("repeated");
}

#[tokio::test]
async fn uuid_endpoint_normalizes_and_refuses_other_keys() {
    let app = app();
    for value in [
        UUID.to_owned(),
        UUID.to_uppercase(),
        format!("\"{}\"", UUID.to_uppercase()),
    ] {
        let reply = send_post(&app, "/uuid", &[(KEY, value.as_bytes())]).await;
        assert_eq!(reply.status, 200, "{value}: {}", reply.text());
        assert_eq!(reply.text(), format!("{UUID}|{UUID}"));
    }
    for value in [
        "not-a-uuid",
        "8e03978e40d543e8bc936894a57f9324",
        "{8e03978e-40d5-43e8-bc93-6894a57f9324}",
        "urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
        "8e03978e-40d5-43e8-bc93-6894a57f93zz",
        "00000000-0000-0000-0000-000000000000",
        "\"ffffffff-ffff-ffff-ffff-ffffffffffff\"",
    ] {
        send_post(&app, "/uuid", &[(KEY, value.as_bytes())])
            .await
            .assert_invalid_key("not-uuid");
    }
    // The generic grammar applies first.
    send_post(&app, "/uuid", &[(KEY, b"")])
        .await
        .assert_invalid_key("empty");
}

#[tokio::test]
async fn optional_key_absent_is_none_invalid_is_400() {
    let app = app();
    assert_eq!(send_post(&app, "/optional", &[]).await.text(), "none");
    assert_eq!(
        send_post(&app, "/optional", &[(KEY, b"\"k-9\"")])
            .await
            .text(),
        "some:k-9"
    );
    send_post(&app, "/optional", &[(KEY, b"a b")])
        .await
        .assert_invalid_key("invalid-character");
    send_post(&app, "/optional", &[(KEY, b"")])
        .await
        .assert_invalid_key("empty");

    assert_eq!(send_post(&app, "/optional-uuid", &[]).await.text(), "none");
    assert_eq!(
        send_post(
            &app,
            "/optional-uuid",
            &[(KEY, UUID.to_uppercase().as_bytes())]
        )
        .await
        .text(),
        format!("some:{UUID}")
    );
    send_post(&app, "/optional-uuid", &[(KEY, b"k-9")])
        .await
        .assert_invalid_key("not-uuid");
}

#[tokio::test]
async fn tenant_header_scopes_the_key() {
    let app = app();
    let ok = send_post(&app, "/tenant", &[(KEY, b"k-1"), ("x-tenant-id", b"acme")]).await;
    assert_eq!(ok.text(), "acme|k-1");

    let custom = send_post(&app, "/org", &[(KEY, UUID.as_bytes()), ("x-org", b"o-7")]).await;
    assert_eq!(custom.text(), format!("o-7|{UUID}"));
    // The default header does not count for a custom name.
    send_post(
        &app,
        "/org",
        &[(KEY, UUID.as_bytes()), ("x-tenant-id", b"o-7")],
    )
    .await
    .assert_problem(403, "scope-missing");
}

#[tokio::test]
async fn tenant_header_rejections() {
    let app = app();
    // Missing, and empty (never the shared default scope).
    send_post(&app, "/tenant", &[(KEY, b"k-1")])
        .await
        .assert_problem(403, "scope-missing");
    send_post(&app, "/tenant", &[(KEY, b"k-1"), ("x-tenant-id", b"")])
        .await
        .assert_problem(403, "scope-missing");
    // Invalid: space, non-ASCII, too long, repeated.
    let long = "t".repeat(256);
    for value in [&b"a b"[..], "tenánt".as_bytes(), long.as_bytes()] {
        send_post(&app, "/tenant", &[(KEY, b"k-1"), ("x-tenant-id", value)])
            .await
            .assert_problem(400, "scope-invalid");
    }
    let twice: &[(&str, &[u8])] = &[(KEY, b"k-1"), ("x-tenant-id", b"a"), ("x-tenant-id", b"b")];
    send_post(&app, "/tenant", twice)
        .await
        .assert_problem(400, "scope-invalid");
    // The key is checked before the scope.
    send_post(&app, "/tenant", &[(KEY, b"a b")])
        .await
        .assert_invalid_key("invalid-character");
    // A UUID key with a custom tenant header: the key's rules still apply.
    send_post(&app, "/org", &[(KEY, b"k-1"), ("x-org", b"o-7")])
        .await
        .assert_invalid_key("not-uuid");
}

#[tokio::test]
async fn principal_scopes_the_key() {
    let app = app();
    let ok = send_post(
        &app,
        "/principal",
        &[(KEY, b"k-1"), ("x-test-user", b"acme")],
    )
    .await;
    assert_eq!(ok.text(), "org:acme|k-1");
    send_post(&app, "/principal", &[(KEY, b"k-1")])
        .await
        .assert_problem(403, "scope-missing");
    send_post(
        &app,
        "/principal",
        &[(KEY, b"k-1"), ("x-test-user", b"a b")],
    )
    .await
    .assert_problem(400, "scope-invalid");
}
