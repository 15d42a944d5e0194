//! [`Template`]: subjects and routing keys derived from a message.

use crate::error::Error;
use crate::message::OutboxMessage;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    AggregateType,
    AggregateId,
    EventType,
}

/// A subject or routing key with placeholders: `{aggregate_type}`, `{aggregate_id}`,
/// `{event_type}`.
///
/// ```
/// use idempotency_outbox::publisher::Template;
///
/// let template = Template::parse("events.{aggregate_type}.{event_type}")?;
/// assert!(Template::parse("events.{tenant}").is_err());
/// assert!(Template::parse("events.{aggregate_type").is_err());
/// # Ok::<(), idempotency_outbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    source: String,
}

impl Template {
    /// Parses `source`; unknown or unclosed placeholders are errors.
    pub fn parse(source: &str) -> Result<Self, Error> {
        let invalid =
            |reason: &str| Error::invalid_config(format!("template {source:?}: {reason}"));
        let mut parts = Vec::new();
        let mut rest = source;
        while let Some(start) = rest.find('{') {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_owned()));
            }
            let after = &rest[start + 1..];
            let end = after.find('}').ok_or_else(|| invalid("unclosed '{'"))?;
            parts.push(match &after[..end] {
                "aggregate_type" => Part::AggregateType,
                "aggregate_id" => Part::AggregateId,
                "event_type" => Part::EventType,
                _ => {
                    return Err(invalid(
                        "placeholders are {aggregate_type}, {aggregate_id} and {event_type}",
                    ));
                }
            });
            rest = &after[end + 1..];
        }
        if rest.contains('}') {
            return Err(invalid("unmatched '}'"));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        if parts.is_empty() {
            return Err(invalid("it is empty"));
        }
        Ok(Self {
            parts,
            source: source.to_owned(),
        })
    }

    /// The template `<prefix>{aggregate_type}.{event_type}` (the publishers' default shape).
    pub fn aggregate_and_event(prefix: &str) -> Self {
        let mut parts = Vec::new();
        if !prefix.is_empty() {
            parts.push(Part::Text(prefix.to_owned()));
        }
        parts.extend([
            Part::AggregateType,
            Part::Text(".".to_owned()),
            Part::EventType,
        ]);
        Self {
            parts,
            source: format!("{prefix}{{aggregate_type}}.{{event_type}}"),
        }
    }

    /// The template `<prefix>{aggregate_type}` (the Kafka publisher's default shape: one topic
    /// per aggregate type).
    ///
    /// ```
    /// use idempotency_outbox::publisher::Template;
    /// assert_eq!(Template::aggregate("outbox.").as_str(), "outbox.{aggregate_type}");
    /// ```
    pub fn aggregate(prefix: &str) -> Self {
        let mut parts = Vec::new();
        if !prefix.is_empty() {
            parts.push(Part::Text(prefix.to_owned()));
        }
        parts.push(Part::AggregateType);
        Self {
            parts,
            source: format!("{prefix}{{aggregate_type}}"),
        }
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The subject or routing key for `message`.
    pub fn render(&self, message: &OutboxMessage) -> String {
        let mut out = String::with_capacity(self.source.len() + 32);
        for part in &self.parts {
            out.push_str(match part {
                Part::Text(text) => text,
                Part::AggregateType => &message.aggregate_type,
                Part::AggregateId => &message.aggregate_id,
                Part::EventType => &message.event_type,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders() {
        let message = OutboxMessage::new(
            uuid::Uuid::now_v7(),
            "order",
            "o-1",
            Some(1),
            "OrderPlaced",
            "{}",
            Default::default(),
            chrono::Utc::now(),
            1,
        );
        let t = Template::parse("x.{aggregate_type}.{aggregate_id}.{event_type}").unwrap();
        assert_eq!(t.render(&message), "x.order.o-1.OrderPlaced");
        assert_eq!(Template::parse("fixed").unwrap().render(&message), "fixed");
        assert!(Template::parse("").is_err());
        assert!(Template::parse("a}").is_err());
        assert_eq!(
            Template::aggregate_and_event("outbox."),
            Template::parse("outbox.{aggregate_type}.{event_type}").unwrap()
        );
    }
}
