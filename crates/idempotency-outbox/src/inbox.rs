//! The consumer's span: one per message applied through an inbox, in the producer's trace.

use idempotency_core::trace;

/// The span of one message a consumer applies (`outbox.inbox.process`): a consumer span with
/// OpenTelemetry's messaging attributes (`messaging.operation.type = process`,
/// `messaging.consumer.group.name` = the inbox consumer, `messaging.message.id`), whose parent
/// is the context the message carries (`traceparent`, `tracestate`: the request that enqueued
/// it, see [`NewEvent`](crate::NewEvent)).
///
/// **A child, not a link.** The message is applied one at a time, for exactly one producing
/// request: as a child, the consumer's work shows in the request's trace, from the HTTP request
/// to the consumer's statements, which is what a reader of that trace wants to see. (The relay's
/// publish span, which works for many requests in one batch, links to each instead.) A malformed
/// `traceparent` is ignored: the span starts a new trace, and nothing of the bad value is kept.
///
/// Without the `otel` feature the span has no remote parent (it is a child of the current span).
/// Enter it around the inbox record and the message's effects, so that events those effects
/// enqueue carry its context in turn:
///
/// ```
/// use tracing::Instrument;
///
/// # async fn demo() {
/// let span = idempotency_outbox::inbox_span(
///     "billing-projector",
///     "0190d1f5-6c4e-7b1a-9f7e-3c2b1a0d9e8f",
///     Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
///     None,
/// );
/// async {
///     // inbox.record_id(&mut tx, consumer, message_id), the effects, tx.commit()
/// }
/// .instrument(span)
/// .await;
/// # }
/// ```
pub fn inbox_span(
    consumer: &str,
    message_id: &str,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "outbox.inbox.process",
        otel.kind = "consumer",
        messaging.operation.type = "process",
        messaging.consumer.group.name = consumer,
        messaging.message.id = message_id,
    );
    trace::set_remote_parent(&span, traceparent, tracestate);
    span
}
