//! One test per `outbox.relay` / `outbox.retention` key whose effect was otherwise untested:
//! each sets the key and asserts on the behaviour the key controls (a deadline, a bound, a
//! refresh, a purge, a coalesced wake-up, a lease), mostly against a second value of the same
//! key that changes the outcome.

#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use common::nats::TestStream;
use common::*;
use idempotency_outbox::config::{BackoffConfig, Ordering, OutboxConfig};
use idempotency_outbox::{
    Ack, LoggingPublisher, OutboxMessage, PublishError, PublishErrorKind, Publisher, Relay,
    RelayHandle, metrics as names,
};
use idempotency_pg::PgOutbox;
use idempotency_testing::recorded::Recorded;
use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

// ---------------------------------------------------------------- helpers

/// Holds the publishes `hold` selects until `release` is set (never, if it is not: a broker
/// that does not answer), then publishes through the real publisher. Counts the holds.
struct Held<P> {
    inner: P,
    hold: Box<dyn Fn(&OutboxMessage) -> bool + Send + Sync>,
    held: Arc<AtomicU64>,
    release: watch::Receiver<bool>,
}

impl<P: Publisher> Held<P> {
    /// Holds every message; returns the publisher, its hold count and its release switch.
    fn all(inner: P) -> (Self, Arc<AtomicU64>, watch::Sender<bool>) {
        Self::selected(inner, |_| true)
    }

    fn selected(
        inner: P,
        hold: impl Fn(&OutboxMessage) -> bool + Send + Sync + 'static,
    ) -> (Self, Arc<AtomicU64>, watch::Sender<bool>) {
        let held = Arc::new(AtomicU64::new(0));
        let (release, released) = watch::channel(false);
        let publisher = Self {
            inner,
            hold: Box::new(hold),
            held: Arc::clone(&held),
            release: released,
        };
        (publisher, held, release)
    }
}

impl<P: Publisher> Publisher for Held<P> {
    fn destination(&self) -> &str {
        self.inner.destination()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        if (self.hold)(message) {
            self.held.fetch_add(1, AtomicOrdering::SeqCst);
            let mut release = self.release.clone();
            if release.wait_for(|released| *released).await.is_err() {
                // The switch was dropped without a release: hang for good.
                std::future::pending::<()>().await;
            }
        }
        self.inner.publish(message).await
    }
}

/// A broker that takes nothing: the aggregate `poison` cannot be expressed for it (dead-lettered
/// at once), every other message finds it unavailable (retried after the backoff).
struct Refuses;

impl Publisher for Refuses {
    fn destination(&self) -> &str {
        "refusing"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<Ack, PublishError> {
        let kind = if message.aggregate_id == "poison" {
            PublishErrorKind::InvalidMessage
        } else {
            PublishErrorKind::Unavailable
        };
        Err(PublishError::kind_only(kind))
    }
}

/// A relay of one worker that polls once an hour, on `config`'s outbox, publishing through
/// `publisher` and counting its claims; returned once the claims at start have finished: the
/// worker's first, and the one the listener wakes it for once its LISTEN is in place (not
/// counted by the callers). The worker then waits with no wake-up pending, so each later
/// notification is one claim.
async fn one_worker_counting_claims(
    mut config: OutboxConfig,
    publisher: impl Publisher,
) -> (PgPool, PgOutbox, Arc<AtomicU64>, RelayHandle) {
    config.relay.workers = 1;
    config.relay.poll_interval = Duration::from_secs(3600);
    let (pool, outbox) = outbox(&config).await;
    let store = Observed::new(outbox.clone());
    let claims = Arc::clone(&store.claims);
    let handle = Relay::new(store, publisher, &config).unwrap().spawn();
    until("the claims at start", Instant::now(), WAIT, || async {
        claims.load(AtomicOrdering::SeqCst) >= 2
    })
    .await;
    (pool, outbox, claims, handle)
}

async fn rows(pool: &PgPool) -> i64 {
    scalar_i64(pool, "SELECT count(*) FROM outbox").await
}

async fn row_exists(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1)")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn is_published(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM outbox WHERE id = $1 AND published_at IS NOT NULL)",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Polls every 10 ms until `check` holds; returns the time since `since`. Panics after `limit`.
async fn until<F, Fut>(what: &str, since: Instant, limit: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    loop {
        if check().await {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "{what}: not within {limit:?} ({:?})",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------- relay.shutdown-timeout

/// `RelayHandle::shutdown` waits `shutdown-timeout` for the batch in flight: 300 ms is too
/// short for a publish that never returns (the worker is aborted at the deadline, its row
/// stays pending); 3 s lets a publish that returns after 500 ms finish and be marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_timeout_is_the_deadline_of_shutdown() {
    async fn arm(shutdown_timeout: Duration, release_after: Option<Duration>) -> ShutdownArm {
        let mut config = config(Ordering::Ordered);
        config.relay.workers = 1;
        config.relay.publish_timeout = Duration::from_secs(60);
        config.relay.shutdown_timeout = shutdown_timeout;
        let (pool, outbox) = outbox(&config).await;
        let (publisher, held, release) = Held::all(LoggingPublisher::new());
        let handle = Relay::new(outbox.clone(), publisher, &config)
            .unwrap()
            .spawn();
        commit(&pool, &outbox, &[event("in-flight", 1)]).await;
        eventually("the publish in flight", || async {
            held.load(AtomicOrdering::SeqCst) == 1
        })
        .await;
        let started = Instant::now();
        let releaser = tokio::spawn(async move {
            match release_after {
                Some(after) => {
                    tokio::time::sleep(after).await;
                    release.send(true).unwrap();
                }
                None => std::future::pending::<()>().await,
            }
        });
        let report = handle.shutdown().await;
        let elapsed = started.elapsed();
        releaser.abort();
        ShutdownArm {
            elapsed,
            graceful: report.graceful,
            aborted: report.aborted,
            published: published(&pool).await,
            pending: pending(&pool).await,
        }
    }

    let (short, long) = tokio::join!(
        arm(Duration::from_millis(300), None),
        arm(Duration::from_secs(3), Some(Duration::from_millis(500))),
    );
    assert!(
        short.elapsed >= Duration::from_millis(300) && short.elapsed < Duration::from_secs(1),
        "300 ms deadline: {short:?}"
    );
    assert!(!short.graceful && short.aborted == 1, "{short:?}");
    assert_eq!((short.published, short.pending), (0, 1), "{short:?}");

    assert!(
        long.elapsed >= Duration::from_millis(500) && long.elapsed < Duration::from_secs(3),
        "3 s deadline, publish done after 500 ms: {long:?}"
    );
    assert!(long.graceful && long.aborted == 0, "{long:?}");
    assert_eq!((long.published, long.pending), (1, 0), "{long:?}");
}

#[derive(Debug)]
#[allow(dead_code)] // read through Debug in assertion messages
struct ShutdownArm {
    elapsed: Duration,
    graceful: bool,
    aborted: usize,
    published: i64,
    pending: i64,
}

// ---------------------------------------------------------------- relay.stats-interval

/// The housekeeping task refreshes the pending / oldest-age / dead-letter gauges every
/// `stats-interval` without anyone calling `refresh_gauges`: with 100 ms, rows committed after
/// the start show up in the gauges, again and again (each snapshot resets them to 0); with 1 h
/// only the refresh at start happens and the gauges never show them. Each arm takes 30
/// snapshots 100 ms apart: a slow machine sees fewer refreshes of the 100 ms arm, not none.
#[test]
fn stats_interval_is_how_often_the_gauges_are_refreshed() {
    fn arm(stats_interval: Duration) -> StatsArm {
        with_recorder(async move |snapshotter| {
            let mut config = config(Ordering::Ordered);
            config.relay.workers = 1;
            config.relay.stats_interval = stats_interval;
            config.relay.backoff = BackoffConfig {
                base: Duration::from_secs(3600),
                max: Duration::from_secs(3600),
            };
            let (pool, outbox) = outbox(&config).await;
            let handle = Relay::new(outbox.clone(), Refuses, &config)
                .unwrap()
                .spawn();
            // The refresh at start (nothing pending), then a clean slate.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Recorded::take(&snapshotter);
            let mut events = vec![event("poison", 0)];
            events.extend((1..=3).map(|n| event(&format!("refused-{n}"), n)));
            commit(&pool, &outbox, &events).await;
            eventually("3 refused and pending, 1 dead letter", || async {
                pending(&pool).await == 3
                    && scalar_i64(
                        &pool,
                        "SELECT count(*) FROM outbox WHERE dead_lettered_at IS NOT NULL",
                    )
                    .await
                        == 1
            })
            .await;
            let mut arm = StatsArm::default();
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let snap = Recorded::take(&snapshotter);
                if snap.number(names::PENDING, &[]) == Some(3.0)
                    && snap.number(names::DEAD_LETTERED, &[]) == Some(1.0)
                {
                    arm.refreshes_seen += 1;
                    arm.ages
                        .push(snap.number(names::OLDEST_PENDING_AGE, &[]).unwrap());
                }
            }
            handle.shutdown().await;
            arm
        })
    }

    let often = std::thread::spawn(|| arm(Duration::from_millis(100)));
    let rarely = std::thread::spawn(|| arm(Duration::from_secs(3600)));
    let (often, rarely) = (often.join().unwrap(), rarely.join().unwrap());
    assert!(
        often.refreshes_seen >= 4,
        "100 ms: snapshots 100 ms apart see fresh refreshes again and again: {often:?}"
    );
    assert!(
        often.ages.windows(2).all(|w| w[1] >= w[0]) && often.ages.last() > often.ages.first(),
        "the oldest pending age grows between refreshes: {often:?}"
    );
    assert_eq!(
        rarely.refreshes_seen, 0,
        "1 h: no refresh after the one at start: {rarely:?}"
    );
}

#[derive(Debug, Default)]
struct StatsArm {
    refreshes_seen: u32,
    ages: Vec<f64>,
}

// ---------------------------------------------------------------- retention.enabled

/// A retention config that deletes every published row at each purge, run every `interval`.
fn purging(enabled: bool, interval: Duration) -> OutboxConfig {
    let mut config = config(Ordering::Unordered);
    config.relay.workers = 1;
    config.relay.stats_interval = Duration::from_millis(20); // the housekeeping tick
    config.retention.enabled = enabled;
    config.retention.published = Duration::from_millis(1);
    config.retention.interval = interval;
    config
}

/// With `retention.enabled: true` the housekeeping task of a spawned relay deletes published
/// rows on its own (no `purge` call); with `false` they stay, through a second of intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_enabled_lets_the_relay_purge_published_rows_on_its_own() {
    async fn arm(enabled: bool) -> (i64, i64, u64) {
        let config = purging(enabled, Duration::from_millis(100));
        let (pool, outbox) = outbox(&config).await;
        let handle = Relay::new(outbox.clone(), LoggingPublisher::new(), &config)
            .unwrap()
            .spawn();
        let events: Vec<_> = (0..5).map(|n| event(&format!("kept-{n}"), n)).collect();
        commit(&pool, &outbox, &events).await;
        let start = Instant::now();
        let relay_totals = || handle.totals().published;
        until("the relay published the 5 rows", start, WAIT, || async {
            relay_totals() == 5
        })
        .await;
        if enabled {
            // A purge comes every 100 ms; however slow this machine, the rows go.
            until("the published rows purged", start, WAIT, || async {
                rows(&pool).await == 0
            })
            .await;
        } else {
            // Ten intervals, and the rows stay.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let result = (rows(&pool).await, published(&pool).await, relay_totals());
        handle.shutdown().await;
        result
    }

    let (on, off) = tokio::join!(arm(true), arm(false));
    assert_eq!(on, (0, 0, 5), "enabled: published, then deleted");
    assert_eq!(off, (5, 5, 5), "disabled: published and kept");
}

// ---------------------------------------------------------------- retention.interval

/// The housekeeping task purges at start and then every `retention.interval` (1.5 s): the
/// first `delete_published` comes before one interval has passed, each next one no sooner than
/// an interval after the one before (and not seconds later); a published row is gone after a
/// purge. The calls are timed where they are made, so a slow commit cannot move them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_interval_is_the_time_between_purges() {
    let interval = Duration::from_millis(1500);
    let config = purging(true, interval);
    let (pool, outbox) = outbox(&config).await;
    let store = Observed::new(outbox.clone());
    let purges = Arc::clone(&store.purges);
    let relay = Relay::new(store, LoggingPublisher::new(), &config).unwrap();
    let before = event("published-before-the-start", 0);
    commit(&pool, &outbox, std::slice::from_ref(&before)).await;
    assert_eq!(relay.run_batch().await.unwrap().published, 1);

    let start = Instant::now();
    let handle = relay.spawn();
    until("three purges", start, WAIT, || async {
        purges.lock().unwrap().len() >= 3
    })
    .await;
    handle.shutdown().await;
    assert!(
        !row_exists(&pool, before.id()).await,
        "the purge deleted it"
    );
    let purges = purges.lock().unwrap().clone();
    let first = purges[0] - start;
    assert!(first < interval, "the first purge runs at start: {first:?}");
    for pair in purges.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            // (the next purge is scheduled just before a purge's first call: a few ms of play)
            gap + Duration::from_millis(50) >= interval && gap < interval + Duration::from_secs(3),
            "purges {interval:?} apart: {gap:?}"
        );
    }
}

// ---------------------------------------------------------------- relay.notify-debounce

/// Notifications within `notify-debounce` of a wake-up are coalesced into one more wake-up at
/// the end of the window. One worker, no polling (1 h), 20 commits 25 ms apart: with a 2 s
/// window the worker claims twice (the leading wake-up, then one for the other 19 rows, not
/// before the window ends; twice per window if the burst outlasts one); with `0s` it claims
/// about once per commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_debounce_coalesces_wake_ups_within_its_window() {
    async fn arm(debounce: Duration) -> DebounceArm {
        let mut config = config(Ordering::Unordered);
        config.relay.notify_debounce = debounce;
        // Only the notifications wake the worker: no look-again after a claim that found rows.
        config.relay.linger = Duration::ZERO;
        let (pool, outbox, claims, handle) =
            one_worker_counting_claims(config, LoggingPublisher::new()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let idle = claims.load(AtomicOrdering::SeqCst);
        let start = Instant::now();
        for n in 0..20 {
            commit(&pool, &outbox, &[event(&format!("burst-{n}"), n)]).await;
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let burst = start.elapsed();
        let all_published = until("the 20 rows published", start, WAIT, || async {
            published(&pool).await == 20
        })
        .await;
        let claims = claims.load(AtomicOrdering::SeqCst) - idle;
        handle.shutdown().await;
        DebounceArm {
            claims,
            burst,
            all_published,
        }
    }

    let window = Duration::from_secs(2);
    let (debounced, immediate) = tokio::join!(arm(window), arm(Duration::ZERO));
    // Each window opens at a notification and lasts 2 s: a burst slower than that (a loaded
    // machine) spans more than one, each worth a leading and a coalesced wake-up.
    let windows = u64::try_from(debounced.burst.as_millis() / window.as_millis()).unwrap() + 1;
    assert!(
        debounced.claims <= 2 * windows,
        "2 s: the leading wake-up and one coalesced per window ({windows}): {debounced:?}"
    );
    assert!(
        debounced.all_published >= window,
        "the coalesced wake-up comes at the end of the window: {debounced:?}"
    );
    // (a worker slower than the 25 ms between commits merges some wake-ups: no exact count)
    assert!(
        immediate.claims > 2 * windows && immediate.claims > debounced.claims,
        "0s: a wake-up per commit the worker is idle for: {immediate:?}"
    );
}

#[derive(Debug)]
#[allow(dead_code)] // read through Debug in assertion messages
struct DebounceArm {
    claims: u64,
    burst: Duration,
    all_published: Duration,
}

// ---------------------------------------------------------------- relay.linger, outbox.notify-interval

/// `linger`: a worker whose claim found rows looks again after `linger`, so a row whose
/// enqueue did not notify (`notify-interval` let only the first enqueue notify) and that
/// committed just after the notified claim is still published long before the poll (1 h).
/// With `0s` the worker waits for the next notification or the poll, and the row stays
/// pending.
///
/// No step depends on timing: `b` commits while the publish of `a` is held, so after the claim
/// that found `a` (its snapshot cannot hold `b`) and before the worker chooses how long to
/// wait; the one notification (`a`'s) is the only wake-up pending after the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linger_picks_up_a_row_committed_without_a_notification_after_the_claim() {
    async fn arm(linger: Duration) -> (i64, u64, Duration) {
        let mut config = config(Ordering::Unordered);
        config.relay.linger = linger;
        config.notify_interval = Duration::from_secs(3600);
        let (publisher, held, release) =
            Held::selected(LoggingPublisher::new(), |m| m.aggregate_id == "a");
        let (pool, outbox, claims, handle) = one_worker_counting_claims(config, publisher).await;
        let idle = claims.load(AtomicOrdering::SeqCst);
        // `a` notifies (the first enqueue of the window), `b` does not.
        let mut a = pool.begin().await.unwrap();
        outbox.enqueue(&mut a, &event("a", 0)).await.unwrap();
        let mut b = pool.begin().await.unwrap();
        outbox.enqueue(&mut b, &event("b", 0)).await.unwrap();
        a.commit().await.unwrap();
        until(
            "a claimed and its publish held",
            Instant::now(),
            WAIT,
            || async { held.load(AtomicOrdering::SeqCst) == 1 },
        )
        .await;
        b.commit().await.unwrap();
        let committed = Instant::now();
        release.send(true).unwrap();
        until("a published", committed, WAIT, || async {
            published(&pool).await >= 1
        })
        .await;
        let deadline = if linger.is_zero() {
            Duration::from_secs(1)
        } else {
            WAIT
        };
        while published(&pool).await < 2 && committed.elapsed() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let result = (
            published(&pool).await,
            claims.load(AtomicOrdering::SeqCst) - idle,
            committed.elapsed(),
        );
        handle.shutdown().await;
        result
    }

    let linger = Duration::from_millis(500);
    let ((lingering, looked, after), (waiting, claimed, _)) =
        tokio::join!(arm(linger), arm(Duration::ZERO));
    assert_eq!(lingering, 2, "500ms: b published by the look-again");
    assert!(
        looked >= 2,
        "500ms: the notified claim and a look-again: {looked}"
    );
    assert!(after <= linger + Duration::from_secs(5), "{after:?}");
    assert_eq!(waiting, 1, "0s: b waits for a notification or the poll");
    assert_eq!(claimed, 1, "0s: only the notified claim");
}

// ---------------------------------------------------------------- relay.publish-timeout

/// `publish-timeout` bounds one publish: with 300 ms a publish that never returns is cut after
/// 300 ms, counted as a `timeout` failure and recorded on its row (error "publish timed out",
/// retried later; attempts 0: a timeout is the broker's failure, its attempt is given back),
/// while the other message of the batch reaches NATS.
#[test]
fn publish_timeout_cuts_a_hanging_publish_and_records_a_timeout() {
    with_recorder(async |snapshotter| {
        let timeout = Duration::from_millis(300);
        let mut config = config(Ordering::Ordered);
        config.relay.publish_timeout = timeout;
        config.relay.backoff = BackoffConfig {
            base: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
        let (pool, outbox) = outbox(&config).await;
        let stream = TestStream::new().await;
        let hanging = event("hanging", 1);
        let fine = event("fine", 1);
        commit(&pool, &outbox, &[hanging.clone(), fine.clone()]).await;
        let hanging_id = hanging.id();
        let (publisher, held, _never) =
            Held::selected(stream.publisher().await, move |m| m.id == hanging_id);
        let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();

        let started = Instant::now();
        let batch = relay.run_batch().await.unwrap();
        let elapsed = started.elapsed();
        assert!(
            // A publish left hanging would never end: 5 s tells it from a cut one, however
            // slow the claim's and the marks' commits.
            elapsed >= timeout && elapsed < Duration::from_secs(5),
            "the batch waited for the timeout and no longer: {elapsed:?}"
        );
        assert_eq!(held.load(AtomicOrdering::SeqCst), 1);
        assert_eq!((batch.claimed, batch.published, batch.failed), (2, 1, 1));
        let (attempts, published, dead, error, retry_later): (
            i32,
            bool,
            bool,
            Option<String>,
            bool,
        ) = sqlx::query_as(
            "SELECT attempts, published_at IS NOT NULL, dead_lettered_at IS NOT NULL, \
                 last_error, next_attempt_at > now() FROM outbox WHERE id = $1",
        )
        .bind(hanging_id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(attempts, 0, "a timeout does not count towards max-attempts");
        assert!(!published && !dead && retry_later);
        assert_eq!(error.as_deref(), Some("publish timed out"));
        assert!(is_published(&pool, fine.id()).await);
        assert_eq!(
            stream.count().await,
            1,
            "only the other message reached NATS"
        );

        let snap = Recorded::take(&snapshotter);
        let timeouts = [("destination", "nats"), ("kind", "timeout")];
        assert_eq!(snap.counter(names::FAILED, &timeouts), 1);
        stream.delete().await;
    });
}

// ---------------------------------------------------------------- relay.lease-margin

/// The claim leases a row for `publish-timeout + lease-margin`: while its publish is in
/// flight, the row's `next_attempt_at` is about 2 s + 3 s after now (not 2 s, nor 2 s + the
/// default 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_margin_extends_the_claim_lease_beyond_the_publish_timeout() {
    let mut config = config(Ordering::Ordered);
    config.relay.publish_timeout = Duration::from_secs(2);
    config.relay.lease_margin = Duration::from_secs(3);
    let (pool, outbox) = outbox(&config).await;
    let stream = TestStream::new().await;
    let leased = event("leased", 1);
    commit(&pool, &outbox, std::slice::from_ref(&leased)).await;
    let (publisher, held, release) = Held::all(stream.publisher().await);
    let relay = Relay::new(outbox.clone(), publisher, &config).unwrap();
    // The claim's clock lies between these two readings of the database's clock, so the
    // lease lies between `next_attempt_at` less each of them, however slow the steps between.
    let before: f64 = sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(&pool)
        .await
        .unwrap();
    let batch = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run_batch().await }
    });
    eventually("the publish in flight", || async {
        held.load(AtomicOrdering::SeqCst) == 1
    })
    .await;
    let (ends, after): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM next_attempt_at)::float8, \
                extract(epoch FROM clock_timestamp())::float8 FROM outbox WHERE id = $1",
    )
    .bind(leased.id())
    .fetch_one(&pool)
    .await
    .unwrap();
    release.send(true).unwrap();
    let (shortest, longest) = (ends - after, ends - before);
    assert!(
        shortest <= 5.001 && longest >= 4.999,
        "the lease is 2 s + 3 s: between {shortest} s and {longest} s"
    );
    let batch = batch.await.unwrap().unwrap();
    assert_eq!((batch.claimed, batch.published), (1, 1));
    assert_eq!(stream.count().await, 1);
    stream.delete().await;
}
