//! Tracing: the span names and attributes every crate of the workspace uses (OpenTelemetry's
//! semantic conventions where one exists), and the W3C trace context (`traceparent`,
//! `tracestate`) that requests and outbox events carry.
//!
//! The spans are plain [`tracing`] spans, always there: a service that exports them through
//! `tracing-opentelemetry` gets them as OpenTelemetry spans with these attributes. The context
//! functions ([`current_context`], [`set_remote_parent`], [`link`]) need the `otel` feature,
//! which reads and writes the OpenTelemetry context `tracing-opentelemetry` keeps on each span;
//! without it they do nothing (there is no OpenTelemetry context to read).
//!
//! A malformed `traceparent` (wrong length, upper-case or non-hex digits, version `ff`, an
//! all-zero trace or span id) is ignored: the span starts a new trace. It is never an error and
//! never copied anywhere.
//!
//! ```
//! use idempotency_core::trace;
//!
//! // Parsed by the W3C rules; a malformed value is `None`, never an error.
//! assert!(trace::TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_some());
//! assert!(trace::TraceParent::parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").is_none());
//! assert!(trace::TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
//! ```

use std::fmt;

/// The W3C header that carries the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

/// Span names.
pub mod names {
    /// One `execute`, `execute_in` or `execute_optimistic`.
    pub const EXECUTE: &str = "idempotency.execute";
    /// One request through `IdempotencyLayer`.
    pub const LAYER: &str = "idempotency";
    /// One statement of a records store (`db.operation.name` says which).
    pub const STORE: &str = "idempotency.store";
    /// One cache call (`idempotency.cache.tier`, `idempotency.cache.operation`).
    pub const CACHE: &str = "idempotency.cache";
    /// One batch a relay worker claimed.
    pub const RELAY_BATCH: &str = "outbox.relay.batch";
    /// One message a relay worker published.
    pub const PUBLISH: &str = "outbox.publish";
    /// One message a consumer applied through its inbox.
    pub const INBOX: &str = "outbox.inbox.process";
}

/// The span of one records-store statement: `db.system` (the store's
/// [`DB_SYSTEM`](crate::IdempotencyStore::DB_SYSTEM)), `db.operation` (the SQL verb) and
/// `db.statement.name` (which of the store's statements). Bound values (keys, payloads) are
/// never recorded.
pub fn store_span(
    db_system: &'static str,
    statement: &'static str,
    operation: &'static str,
) -> tracing::Span {
    tracing::info_span!(
        "idempotency.store",
        otel.kind = "client",
        db.system = db_system,
        db.operation = operation,
        db.statement.name = statement,
    )
}

/// The span of one cache call: `idempotency.cache.tier` (`local` or `distributed`),
/// `idempotency.cache.operation` (`get` or `put`) and, for a `get`, `idempotency.cache.hit`
/// (recorded by the caller).
pub fn cache_span(tier: &'static str, operation: &'static str) -> tracing::Span {
    tracing::info_span!(
        "idempotency.cache",
        idempotency.cache.tier = tier,
        idempotency.cache.operation = operation,
        idempotency.cache.hit = tracing::field::Empty,
    )
}

/// What an `execute` span's `idempotency.outcome` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanOutcome {
    /// The action ran and its outcome was stored.
    Executed,
    /// A stored outcome was replayed.
    Replayed,
    /// The action ran and answered a business rejection (stored).
    Rejected,
    /// The key was taken by a request with another payload.
    Conflict,
    /// A concurrent holder kept the key past the in-flight policy.
    InFlight,
    /// A technical failure: nothing was stored.
    Error,
}

impl SpanOutcome {
    /// The attribute value: `executed`, `replayed`, `rejected`, `conflict`, `in_flight`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::Rejected => "rejected",
            Self::Conflict => "conflict",
            Self::InFlight => "in_flight",
            Self::Error => "error",
        }
    }
}

impl fmt::Display for SpanOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A valid W3C `traceparent` (version `00` layout; a later version is read by its first four
/// fields, as the recommendation asks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id, 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The parent span id, 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` when it is malformed.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55.
        if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&bytes[0..2])?[0];
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&bytes[3..35])?;
        let span_id = hex::<8>(&bytes[36..52])?;
        let flags = hex::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id in lower-case hex (32 digits).
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The span id in lower-case hex (16 digits).
    pub fn span_id_hex(&self) -> String {
        to_hex(&self.span_id)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id_hex(),
            self.span_id_hex(),
            self.flags
        )
    }
}

/// The trace id and span id of one span, kept on an idempotency record: the span of the
/// execution that committed it (an `idempotency.execute` span, or the layer's `idempotency`
/// span), so that a replay's span carries an OpenTelemetry span link to it
/// ([`link_to_execution`]) and a trace viewer jumps from the replay to the request that did the
/// work.
///
/// Only a sampled span is kept ([`SpanRef::current`]): a link to a span that was never
/// exported would lead nowhere. Stores keep it in two nullable columns, `trace_id` (32
/// lower-case hex digits) and `span_id` (16); a record written without the `otel` feature, or
/// outside a sampled span, has none.
///
/// ```
/// use idempotency_core::trace::SpanRef;
///
/// let span = SpanRef::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7").unwrap();
/// assert_eq!(span.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(span.span_id_hex(), "00f067aa0ba902b7");
/// // Malformed or all-zero ids are no span at all, never an error.
/// assert!(SpanRef::from_hex("4BF92F3577B34DA6A3CE929D0E0E4736", "00f067aa0ba902b7").is_none());
/// assert!(SpanRef::from_hex("4bf92f3577b34da6a3ce929d0e0e4736", "0000000000000000").is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanRef {
    /// The trace id, 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The span id, 8 bytes, not all zero.
    pub span_id: [u8; 8],
}

impl SpanRef {
    /// The current span, when it has a valid and sampled OpenTelemetry context; always `None`
    /// without the `otel` feature (nothing is read, nothing stored).
    pub fn current() -> Option<Self> {
        #[cfg(feature = "otel")]
        {
            let (parent, _) = current_context()?;
            (parent.flags & 1 == 1).then_some(Self {
                trace_id: parent.trace_id,
                span_id: parent.span_id,
            })
        }
        #[cfg(not(feature = "otel"))]
        {
            None
        }
    }

    /// From the two stored columns (lower-case hex); `None` when either is absent, malformed
    /// or all zero: a damaged column costs the link, never the replay.
    pub fn from_columns(trace_id: Option<&str>, span_id: Option<&str>) -> Option<Self> {
        Self::from_hex(trace_id?, span_id?)
    }

    /// From 32 and 16 lower-case hex digits; `None` when malformed or all zero.
    pub fn from_hex(trace_id: &str, span_id: &str) -> Option<Self> {
        let trace_id = hex::<16>(trace_id.as_bytes())?;
        let span_id = hex::<8>(span_id.as_bytes())?;
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self { trace_id, span_id })
    }

    /// The trace id in lower-case hex (32 digits).
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The span id in lower-case hex (16 digits).
    pub fn span_id_hex(&self) -> String {
        to_hex(&self.span_id)
    }
}

/// Serialized as `{"trace_id": "<32 hex>", "span_id": "<16 hex>"}`.
impl serde::Serialize for SpanRef {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("SpanRef", 2)?;
        s.serialize_field("trace_id", &self.trace_id_hex())?;
        s.serialize_field("span_id", &self.span_id_hex())?;
        s.end()
    }
}

impl<'de> serde::Deserialize<'de> for SpanRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Wire<'a> {
            #[serde(borrow)]
            trace_id: std::borrow::Cow<'a, str>,
            #[serde(borrow)]
            span_id: std::borrow::Cow<'a, str>,
        }
        let wire = Wire::deserialize(deserializer)?;
        Self::from_hex(&wire.trace_id, &wire.span_id)
            .ok_or_else(|| serde::de::Error::custom("malformed trace_id or span_id"))
    }
}

/// Adds a span link from `span` (a replay's) to the span of the execution that committed the
/// record it replays. Returns whether the link was added (never without the `otel` feature).
pub fn link_to_execution(span: &tracing::Span, execution: &SpanRef) -> bool {
    link(
        span,
        &TraceParent {
            trace_id: execution.trace_id,
            span_id: execution.span_id,
            // Only sampled spans are kept (`SpanRef::current`).
            flags: 1,
        },
    )
}

/// `N` bytes from `2 * N` lower-case hex digits (W3C forbids upper case).
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let value = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = value(digits[2 * i])? << 4 | value(digits[2 * i + 1])?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    use fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(2 * bytes.len()), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The W3C context of `span`: its `traceparent` and `tracestate` (`None` when empty), or `None`
/// when the span has no valid OpenTelemetry context (no `otel` feature, no
/// `tracing-opentelemetry` layer, or a disabled span).
pub fn context_of(span: &tracing::Span) -> Option<(TraceParent, Option<String>)> {
    #[cfg(feature = "otel")]
    {
        otel::context_of(span)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = span;
        None
    }
}

/// [`context_of`] the current span.
pub fn current_context() -> Option<(TraceParent, Option<String>)> {
    context_of(&tracing::Span::current())
}

/// Makes the remote context `traceparent` (and `tracestate`) the parent of `span`, which must
/// not have been entered yet. A malformed `traceparent` is ignored (the span keeps the parent it
/// has, or starts a new trace). Returns whether the parent was set.
pub fn set_remote_parent(
    span: &tracing::Span,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> bool {
    let Some(parent) = traceparent.and_then(TraceParent::parse) else {
        return false;
    };
    #[cfg(feature = "otel")]
    {
        otel::set_remote_parent(span, parent, tracestate)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (span, parent, tracestate);
        false
    }
}

/// Adds a span link from `span` to the span `to` (a remote one: another request, another
/// process). Returns whether the link was added.
pub fn link(span: &tracing::Span, to: &TraceParent) -> bool {
    #[cfg(feature = "otel")]
    {
        otel::link(span, to)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = (span, to);
        false
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceParent;

    pub(super) fn context_of(span: &tracing::Span) -> Option<(TraceParent, Option<String>)> {
        if span.is_disabled() {
            return None;
        }
        let context = span.context();
        let otel = context.span();
        let sc = otel.span_context();
        if !sc.is_valid() {
            return None;
        }
        let parent = TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            span_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        };
        let state = sc.trace_state().header();
        Some((parent, (!state.is_empty()).then_some(state)))
    }

    fn span_context(parent: &TraceParent, tracestate: Option<&str>) -> SpanContext {
        let state = tracestate
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(
            TraceId::from_bytes(parent.trace_id),
            SpanId::from_bytes(parent.span_id),
            TraceFlags::new(parent.flags & TraceFlags::SAMPLED.to_u8()),
            true,
            state,
        )
    }

    pub(super) fn set_remote_parent(
        span: &tracing::Span,
        parent: TraceParent,
        tracestate: Option<&str>,
    ) -> bool {
        if span.is_disabled() {
            return false;
        }
        let context = opentelemetry::Context::new()
            .with_remote_span_context(span_context(&parent, tracestate));
        span.set_parent(context).is_ok()
    }

    pub(super) fn link(span: &tracing::Span, to: &TraceParent) -> bool {
        if span.is_disabled() {
            return false;
        }
        span.add_link(span_context(to, None));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_parses_by_the_w3c_rules() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(ok).unwrap();
        assert_eq!(parsed.to_string(), ok);
        assert_eq!(parsed.flags, 1);
        // A later version may append fields after a dash.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-ff")
                .is_some()
        );
        for bad in [
            "",
            "garbage",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{e9}",
            "\u{e9}\u{e9}-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0\u{e9}4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
