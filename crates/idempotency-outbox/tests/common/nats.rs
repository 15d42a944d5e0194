//! NATS JetStream: a stream per test, read back with a pull consumer.

use super::*;
use async_nats::jetstream::{self, consumer, stream};
use futures_util::StreamExt;

pub async fn client() -> async_nats::Client {
    let url = idempotency_testing::nats_url();
    tokio::time::timeout(Duration::from_secs(10), async_nats::connect(&url))
        .await
        .unwrap_or_else(|_| panic!("NATS at {url} did not answer; start it or set NATS_URL"))
        .unwrap_or_else(|e| panic!("cannot connect to NATS at {url}: {e}"))
}

/// A stream of its own capturing `<prefix>.>`, deleted on drop (best effort).
pub struct TestStream {
    pub js: jetstream::Context,
    pub name: String,
    pub prefix: String,
}

impl TestStream {
    /// Names a stream without creating it.
    pub async fn named() -> Self {
        let name = idempotency_testing::unique_name("OUTBOX");
        Self {
            js: jetstream::new(client().await),
            prefix: name.to_lowercase(),
            name,
        }
    }

    /// A stream that takes `max_messages` and then refuses publishes (`discard: new`): a full
    /// destination once that many are in.
    pub async fn full_at(max_messages: i64) -> Self {
        let s = Self::named().await;
        s.js.create_stream(stream::Config {
            name: s.name.clone(),
            subjects: vec![format!("{}.>", s.prefix)],
            duplicate_window: Duration::from_secs(120),
            max_messages,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();
        s
    }

    pub async fn new() -> Self {
        let s = Self::named().await;
        s.create().await;
        s
    }

    pub async fn create(&self) {
        self.js
            .create_stream(stream::Config {
                name: self.name.clone(),
                subjects: vec![format!("{}.>", self.prefix)],
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .unwrap();
    }

    pub fn subject_template(&self) -> String {
        format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix)
    }

    pub async fn publisher(&self) -> idempotency_outbox::publisher::nats::NatsPublisher {
        idempotency_outbox::publisher::nats::NatsPublisher::from_context(self.js.clone())
            .with_subject(&self.subject_template())
            .unwrap()
    }

    pub async fn count(&self) -> u64 {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        stream.get_info().await.unwrap().state.messages
    }

    /// Every message in the stream, in stream order (waits until `expected` are there).
    pub async fn read(&self, expected: usize) -> Vec<jetstream::Message> {
        let stream = self.js.get_stream(&self.name).await.unwrap();
        let consumer: consumer::PullConsumer = stream
            .create_consumer(consumer::pull::Config {
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let mut out = Vec::with_capacity(expected);
        while out.len() < expected {
            match tokio::time::timeout(WAIT, messages.next()).await {
                Ok(Some(Ok(message))) => out.push(message),
                other => panic!(
                    "stream {} gave {} of {expected} messages, then {other:?}",
                    self.name,
                    out.len()
                ),
            }
        }
        out
    }

    pub async fn delete(&self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

pub fn header<'a>(message: &'a jetstream::Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}
