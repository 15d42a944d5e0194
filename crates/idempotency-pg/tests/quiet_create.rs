//! `schema.mode: create` is quiet when nothing changes: running the DDL again over existing tables
//! emits no PostgreSQL notice ("relation ... already exists, skipping"), which sqlx turns into
//! tracing events with target `sqlx::postgres::notice` at every start.

#![allow(clippy::unwrap_used)] // tests fail loudly on unexpected errors

use std::sync::{Arc, Mutex};

use idempotency_outbox::config::InboxConfig;
use idempotency_pg::{PgInbox, PgOutbox, PgStore, TableName};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const NOTICE_TARGET: &str = "sqlx::postgres::notice";

/// Collects the message of every `sqlx::postgres::notice` event.
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<Vec<String>>>);

impl Notices {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.push_str(&format!("{value:?}"));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }
}

impl<S: Subscriber> Layer<S> for Notices {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() == NOTICE_TARGET {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.0.lock().unwrap().push(message);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_create_emits_no_notice() {
    let notices = Notices::default();
    let dispatch = tracing::Dispatch::new(tracing_subscriber::registry().with(notices.clone()));
    let _guard = tracing::dispatcher::set_default(&dispatch);

    let pool = idempotency_testing::pg_pool().await;
    let store = PgStore::new(pool.clone());
    let outbox = PgOutbox::new(pool.clone());
    let inbox = PgInbox::with_table(
        pool.clone(),
        TableName::parse(&InboxConfig::default().table_name).unwrap(),
    );
    store.create_schema().await.unwrap();
    outbox.create_schema().await.unwrap();
    inbox.create_schema().await.unwrap();

    // The capture sees notices on this schema's connections at all.
    sqlx::raw_sql("DO $$ BEGIN RAISE NOTICE 'capture check'; END $$")
        .execute(&pool)
        .await
        .unwrap();
    let seen = notices.take();
    assert!(
        seen.iter().any(|m| m.contains("capture check")),
        "the layer did not capture a notice: {seen:?}"
    );

    store.create_schema().await.unwrap();
    outbox.create_schema().await.unwrap();
    inbox.create_schema().await.unwrap();
    let seen = notices.take();
    assert!(seen.is_empty(), "a second create logged notices: {seen:?}");

    // Everything is still there and canonical.
    store.validate_schema().await.unwrap();
    outbox.validate_schema().await.unwrap();
    inbox.validate_schema().await.unwrap();
}
