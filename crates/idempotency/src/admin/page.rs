//! The admin page: server-rendered HTML, plain forms, no script. Every value shown is escaped
//! ([`esc`]): a dead letter's last error is text a broker or a payload put there.

use std::fmt::Write as _;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{OriginalUri, Path, Query};
use axum::http::{StatusCode, Uri, header};
use axum::response::{Html, IntoResponse, Response};
use idempotency_core::RecordStatus;
use idempotency_outbox::admin::DeadLetterFilter;
use idempotency_outbox::uuid::Uuid;
use serde::Deserialize;

use super::api::{self, Change, EvictRequest};
use super::html::esc;
use super::problem::Problem;
use super::{Admin, Allowed, Principal, State};
use crate::ops::{AdminDatabase, OpsError, rfc3339};

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:80em}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}\
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}.error{white-space:pre-wrap;font-family:monospace;max-width:40em;overflow-wrap:anywhere}\
.flash{background:#e8f5e9;border:1px solid #a5d6a7;padding:.5em}.problem{background:#fdecea;border:1px solid #f5c6cb;padding:.5em}\
.muted{color:#666}form.inline{display:inline}button{margin-right:.3em}input{margin-right:.5em}";

/// Where the router is mounted: `(home, base)`, the page's own URL (`/admin`; `/` at the root)
/// and the prefix of its links, ending in `/` (`/admin/`). The original path less the router's
/// own part (`/admin/dead/…` less `/dead/…`), so that links work under any `nest` prefix.
/// `home` has no trailing slash: axum's `nest("/admin", …)` answers `/admin`, not `/admin/`.
fn base(original: &Uri, inner: &Uri) -> (String, String) {
    let original = original.path();
    let inner = inner.path();
    let prefix = if inner == "/" {
        original.trim_end_matches('/')
    } else {
        original.strip_suffix(inner).unwrap_or("")
    };
    let home = if prefix.is_empty() { "/" } else { prefix };
    (home.to_owned(), format!("{prefix}/"))
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <meta name=\"referrer\" content=\"same-origin\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n{body}</body></html>\n",
        esc(title)
    )
}

fn html(status: StatusCode, text: String) -> Response {
    (
        status,
        [
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                 frame-ancestors 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        Html(text),
    )
        .into_response()
}

/// A failed page action: the problem as HTML, with a link back.
fn error_page(problem: &Problem, home: &str) -> Response {
    let body = format!(
        "<h1>{}</h1><p class=\"problem\" id=\"problem\">{}</p><p><a href=\"{}\">Back to the admin \
         page</a></p>\n",
        esc(problem.title),
        esc(&problem.detail),
        esc(home)
    );
    html(problem.status(), page(problem.title, &body))
}

fn see_other(location: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, "no-store"),
        ],
    )
        .into_response()
}

/// The page's query: a key to look up, what the last action did.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PageQuery {
    operation: Option<String>,
    key: Option<String>,
    scope: Option<String>,
    done: Option<String>,
    id: Option<String>,
}

pub(super) async fn index<D: AdminDatabase>(
    state: State<D>,
    OriginalUri(original): OriginalUri,
    inner: Uri,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Response {
    let (home, base) = base(&original, &inner);
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let mut body = String::from("<h1>Idempotency admin</h1>\n");
    flash(&mut body, &q);
    status_section(&mut body, &state).await;
    dead_section(&mut body, &state, &base).await;
    key_section(&mut body, &state, &home, &base, &q).await;
    let _ = writeln!(
        body,
        "<p class=\"muted\" id=\"mode\">{}</p>",
        if state.mutations {
            "Changes are enabled; each is written to the audit log (target idempotency::audit)."
                .to_owned()
        } else {
            format!("Read only: changes are enabled by {}.", esc(&state.setting))
        }
    );
    html(StatusCode::OK, page("Idempotency admin", &body))
}

fn flash(body: &mut String, q: &PageQuery) {
    let id =
        q.id.as_deref()
            .and_then(|id| Uuid::parse_str(id).ok())
            .map(|id| format!(" {id}"))
            .unwrap_or_default();
    let text = match q.done.as_deref() {
        Some("requeued") => format!("Requeued dead letter{id}: the relay publishes it again."),
        Some("discarded") => format!("Discarded dead letter{id}."),
        Some("evicted") => format!(
            "Evicted the key: its next request runs again. Note: {}.",
            api::L1_NOTE
        ),
        Some("cache-entry-evicted") => format!(
            "The key had no record; its stale Redis (L2) entry was deleted: its next request \
             runs again. Note: {}.",
            api::L1_NOTE
        ),
        _ => return,
    };
    let _ = writeln!(body, "<p class=\"flash\" id=\"flash\">{}</p>", esc(text));
}

async fn status_section<D: AdminDatabase>(body: &mut String, state: &Admin<D>) {
    body.push_str("<h2>Outbox</h2>\n");
    match state.ops.outbox_status().await {
        Ok(s) => {
            let rows = [
                ("pending", s.pending.to_string()),
                (
                    "oldest pending age",
                    humantime::format_duration(std::time::Duration::from_secs(
                        s.oldest_pending_age as u64,
                    ))
                    .to_string(),
                ),
                ("leased (in flight)", s.leased.to_string()),
                ("dead letters", s.dead_lettered.to_string()),
                (
                    "aggregates with a dead letter",
                    s.dead_letter_aggregates.to_string(),
                ),
                (
                    "aggregates blocked behind a failing head",
                    s.blocked_aggregates.to_string(),
                ),
            ];
            body.push_str("<table id=\"status\">\n");
            for (name, value) in rows {
                let _ = writeln!(
                    body,
                    "<tr><th>{}</th><td>{}</td></tr>",
                    esc(name),
                    esc(value)
                );
            }
            body.push_str("</table>\n");
        }
        Err(OpsError::NoOutbox) => {
            body.push_str("<p class=\"muted\">No outbox is configured.</p>\n");
        }
        Err(e) => {
            let _ = writeln!(body, "<p class=\"problem\">{}</p>", esc(e));
        }
    }
}

async fn dead_section<D: AdminDatabase>(body: &mut String, state: &Admin<D>, base: &str) {
    if state.ops.outbox().is_err() {
        return;
    }
    let letters = match state
        .ops
        .dead_letters(&DeadLetterFilter::default(), state.list_limit)
        .await
    {
        Ok(letters) => letters,
        Err(e) => {
            let _ = writeln!(
                body,
                "<h2>Dead letters</h2><p class=\"problem\">{}</p>",
                esc(e)
            );
            return;
        }
    };
    let _ = writeln!(
        body,
        "<h2>Dead letters</h2>\n<p class=\"muted\">The oldest first, at most {}. Requeue puts one back to \
         pending (refused when its aggregate already published a later event); discard deletes \
         it.</p>",
        state.list_limit
    );
    if letters.is_empty() {
        body.push_str("<p id=\"no-dead-letters\">None.</p>\n");
        return;
    }
    body.push_str(
        "<table id=\"dead-letters\">\n<tr><th>id</th><th>aggregate</th><th>event</th>\
         <th>attempts</th><th>dead since</th><th>last error</th>",
    );
    if state.mutations {
        body.push_str("<th></th>");
    }
    body.push_str("</tr>\n");
    for d in &letters {
        let m = &d.message;
        let _ = write!(
            body,
            "<tr id=\"dead-{id}\"><td><code>{id}</code></td><td>{}/{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td class=\"error\">{}</td>",
            esc(&m.aggregate_type),
            esc(&m.aggregate_id),
            esc(&m.event_type),
            m.attempts,
            esc(d.dead_lettered_at.format("%Y-%m-%d %H:%M:%SZ")),
            esc(d.last_error.as_deref().unwrap_or("-")),
            id = esc(m.id),
        );
        if state.mutations {
            for (action, label) in [("requeue", "Requeue"), ("discard", "Discard")] {
                let _ = write!(
                    body,
                    "{}<form class=\"inline\" method=\"post\" action=\"{}dead/{}/{action}\">\
                     <button type=\"submit\" id=\"{action}-{}\">{label}</button></form>",
                    if action == "requeue" { "<td>" } else { "" },
                    esc(base),
                    esc(m.id),
                    esc(m.id),
                );
            }
            body.push_str("</td>");
        }
        body.push_str("</tr>\n");
    }
    body.push_str("</table>\n");
}

async fn key_section<D: AdminDatabase>(
    body: &mut String,
    state: &Admin<D>,
    home: &str,
    base: &str,
    q: &PageQuery,
) {
    let operation = q.operation.clone().unwrap_or_default();
    let key = q.key.clone().unwrap_or_default();
    let scope = q.scope.clone().unwrap_or_default();
    let _ = writeln!(
        body,
        "<h2>Key lookup</h2>\n<form method=\"get\" action=\"{}\" id=\"key-lookup\">\
         <label>operation <input name=\"operation\" value=\"{}\" required></label>\
         <label>scope <input name=\"scope\" value=\"{}\" placeholder=\"(none)\"></label>\
         <label>key <input name=\"key\" value=\"{}\" required></label>\
         <button type=\"submit\">Look up</button></form>",
        esc(home),
        esc(&operation),
        esc(&scope),
        esc(&key)
    );
    if operation.is_empty() || key.is_empty() {
        return;
    }
    let found = match api::record_id(&operation, &scope, &key) {
        Ok(id) => state.ops.key_show(&id).await.map_err(Problem::from),
        Err(problem) => Err(problem),
    };
    match found {
        Ok(Some(view)) => {
            let or_dash = |t: Option<std::time::SystemTime>| t.map_or("-".to_owned(), rfc3339);
            let rows = [
                ("status", view.status.to_string()),
                ("created", rfc3339(view.created_at)),
                ("completed", or_dash(view.completed_at)),
                ("expires", or_dash(view.expires_at)),
                ("fingerprint", view.fingerprint.clone()),
                (
                    "rejection code",
                    view.rejection_code
                        .clone()
                        .unwrap_or_else(|| "-".to_owned()),
                ),
                ("outcome size", format!("{} bytes", view.outcome_size)),
                (
                    "lease token",
                    view.lease_token
                        .map_or_else(|| "-".to_owned(), |token| token.0.to_string()),
                ),
                (
                    "preview",
                    view.preview.clone().unwrap_or_else(|| "-".to_owned()),
                ),
            ];
            body.push_str("<table id=\"key\">\n");
            for (name, value) in rows {
                let _ = writeln!(
                    body,
                    "<tr><th>{}</th><td class=\"error\">{}</td></tr>",
                    esc(name),
                    esc(value)
                );
            }
            body.push_str("</table>\n");
            if state.mutations && state.ops.evictions_refused() {
                shut_down_notice(body);
            } else if state.mutations {
                // A `PROCESSING` record is forced, and only the claim shown here: its token
                // (empty for none) goes with the form. A settled one is evicted without force,
                // so that a claim written since is never ended from here.
                let force = if view.status == RecordStatus::Processing {
                    format!(
                        "<input type=\"hidden\" name=\"claim\" value=\"{}\"><label>\
                         <input type=\"checkbox\" name=\"force\" value=\"true\"> even though \
                         PROCESSING (its holder may still be running)</label>",
                        view.lease_token
                            .map_or_else(String::new, |token| token.0.to_string())
                    )
                } else {
                    String::new()
                };
                let controls = format!(
                    "{force}<button type=\"submit\">Evict (the next request runs again)</button>"
                );
                evict_form(body, base, [&operation, &scope, &key], &controls);
            }
        }
        Ok(None) => {
            let _ = writeln!(
                body,
                "<p id=\"key-missing\">No record for {}.</p>",
                esc(api::key_name(&operation, &scope, &key))
            );
            // An entry an earlier eviction could not delete (Redis down) is deleted from here.
            if state.mutations && state.ops.evictions_refused() {
                shut_down_notice(body);
            } else if state.mutations && state.ops.has_l2() {
                let controls = "<button type=\"submit\">Delete its Redis (L2) entry, if one \
                     is left</button>";
                evict_form(body, base, [&operation, &scope, &key], controls);
            }
        }
        Err(problem) => {
            let _ = writeln!(body, "<p class=\"problem\">{}</p>", esc(&problem.detail));
        }
    }
}

/// What the page shows instead of an evict form once the service has shut down: the form
/// would only be answered `503 admin-shutting-down`.
fn shut_down_notice(body: &mut String) {
    body.push_str(
        "<p id=\"evict-refused\" class=\"problem\">The service has shut down: evictions \
         are refused here (nothing would be deleted). Evict from a running instance, or with \
         the command line.</p>\n",
    );
}

/// The evict form of a key (`operation`, `scope`, `key`, escaped here), its `controls`
/// (trusted markup) last.
fn evict_form(body: &mut String, base: &str, [operation, scope, key]: [&str; 3], controls: &str) {
    let _ = writeln!(
        body,
        "<form method=\"post\" action=\"{}keys/evict\" id=\"evict\">\
         <input type=\"hidden\" name=\"operation\" value=\"{}\">\
         <input type=\"hidden\" name=\"scope\" value=\"{}\">\
         <input type=\"hidden\" name=\"key\" value=\"{}\">{controls}</form>",
        esc(base),
        esc(operation),
        esc(scope),
        esc(key)
    );
}

/// `POST /dead/{id}/{requeue|discard}` from the page's buttons: 303 back to the page.
pub(super) async fn dead_action<D: AdminDatabase>(
    allowed: Result<Allowed, Problem>,
    state: State<D>,
    principal: Principal,
    OriginalUri(original): OriginalUri,
    inner: Uri,
    Path((id, action)): Path<(String, String)>,
) -> Response {
    let (home, _) = base(&original, &inner);
    let result = async {
        let change = match action.as_str() {
            "requeue" => Change::Requeue,
            "discard" => Change::Discard,
            other => {
                return Err(Problem::not_found(format!(
                    "no action {other:?} on dead letters (requeue or discard)"
                )));
            }
        };
        allowed?;
        let id = api::parse_id(&id)?;
        let ops = state.ops(principal);
        if ops.dead_letter(id).await?.is_none() {
            return Err(Problem::not_found(format!(
                "no dead letter with id {id} (nothing changed)"
            )));
        }
        change.run(&ops, &[id]).await?;
        Ok((change, id))
    }
    .await;
    match result {
        Ok((change, id)) => see_other(&format!("{home}?done={}&id={id}", change.done())),
        Err(problem) => error_page(&problem, &home),
    }
}

/// The evict form's fields (`force` is a checkbox; `claim` the lease token of the
/// `PROCESSING` claim the page showed, empty for a claim without one).
#[derive(Debug, Deserialize)]
pub(super) struct EvictForm {
    operation: String,
    key: String,
    #[serde(default)]
    scope: String,
    force: Option<String>,
    claim: Option<String>,
}

/// `POST /keys/evict` from the page: 303 back to the page.
pub(super) async fn evict<D: AdminDatabase>(
    allowed: Result<Allowed, Problem>,
    state: State<D>,
    principal: Principal,
    OriginalUri(original): OriginalUri,
    inner: Uri,
    form: Result<Form<EvictForm>, FormRejection>,
) -> Response {
    let (home, _) = base(&original, &inner);
    let result = async {
        allowed?;
        let Form(form) = form.map_err(|e| Problem::bad_request(e.body_text()))?;
        // The form carries the claim shown whether or not force is ticked; unticked, there
        // is nothing to name (the API refuses a claim without force).
        let claim = match form.claim.as_deref().filter(|_| form.force.is_some()) {
            None => None,
            Some("") => Some(None),
            Some(token) => Some(Some(token.parse::<i64>().map_err(|_| {
                Problem::bad_request(format!("claim {token:?} is not a lease token"))
            })?)),
        };
        let request = EvictRequest {
            operation: form.operation,
            key: form.key,
            scope: form.scope,
            force: form.force.is_some(),
            claim,
        };
        api::evict_key(&state.ops(principal), &request).await
    }
    .await;
    match result {
        Ok((Some(_), _)) => see_other(&format!("{home}?done=evicted")),
        Ok((None, _)) => see_other(&format!("{home}?done=cache-entry-evicted")),
        Err(problem) => error_page(&problem, &home),
    }
}

#[cfg(test)]
mod tests {
    use super::base;

    #[test]
    fn base_is_the_mount_point() {
        let uri = |s: &str| s.parse::<axum::http::Uri>().unwrap_or_default();
        let pair = |home: &str, base: &str| (home.to_owned(), base.to_owned());
        assert_eq!(base(&uri("/admin"), &uri("/")), pair("/admin", "/admin/"));
        assert_eq!(base(&uri("/admin/"), &uri("/")), pair("/admin", "/admin/"));
        assert_eq!(base(&uri("/"), &uri("/")), pair("/", "/"));
        assert_eq!(
            base(&uri("/ops/admin/dead/x/requeue"), &uri("/dead/x/requeue")),
            pair("/ops/admin", "/ops/admin/")
        );
        assert_eq!(
            base(&uri("/dead/x/requeue"), &uri("/dead/x/requeue")),
            pair("/", "/")
        );
    }
}
