//! The deliverer: one task per gateway that, every `POLL` (or the
//! period its caller names: tests shorten it), asks the store for the
//! deliveries due (the store also ages `unknown` operations
//! and fans new alerts out to the endpoints, in the same transaction),
//! POSTs each in a task of its own, and settles each: delivered; failed
//! and due again after a full-jitter backoff; or given up once the alert
//! is older than the endpoint's `give_up_after` (or, on SQLite, its
//! endpoint is no longer configured: a PostgreSQL store hands a replica
//! only its own endpoints' deliveries, since a peer may have the others).
//!
//! It never runs on a request's path: a slow or failing endpoint costs
//! this task time, never a client. Nor does one endpoint cost another:
//! a poll does not wait for its posts, so the next poll takes what came
//! due meanwhile while a hung webhook's posts wait out their bound, and
//! the bounds on posts in flight ([`in_flight`](super::in_flight)) keep
//! a hung webhook from taking them all. A delivery is leased while it is
//! being posted ([`LEASE`], longer than a post may take), so no poll
//! takes it again meanwhile, and after a crash it is due again once the
//! lease ends: alerts arrive at least once.
//!
//! Each poll whose read of the outbox succeeded is counted
//! (`idemgate_background_passes_total{task="alerts"}`) once its posts,
//! and every earlier poll's, are settled, so a test can tell that a poll
//! ran, and what it took was settled, before asserting that nothing was
//! sent.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::alerts::in_flight::{InFlight, Ticket};
use crate::alerts::{Endpoint, Poster, payload};
use crate::background;
use crate::metrics::{Metrics, Task};
use idemgate_model::backoff::Backoff;
use idemgate_model::clock::{self, Clock};
use idemgate_store::Outbox;
use idemgate_store::{AlertDelivery, AlertOutcome, AlertPoll};

/// How often the outbox is polled while endpoints are configured.
pub(crate) const POLL: Duration = Duration::from_millis(500);
/// Without endpoints the outbox is only tidied (and, on a shared store,
/// fanned out for the replicas that have some), now and then.
pub(crate) const IDLE_POLL: Duration = Duration::from_secs(60);
/// A taken delivery is not taken again for this long unless settled: a
/// post takes at most its 10 s bound (`POST_TIMEOUT`), and the settle a
/// store write after it.
const LEASE: Duration = Duration::from_secs(30);
/// Deliveries taken per poll, at most.
const BATCH: u32 = 32;
/// Before a failed delivery is due again: full jitter under 1 s doubling
/// with its attempts, up to 10 minutes.
const BACKOFF: Backoff = Backoff::full_jitter(Duration::from_secs(1), Duration::from_secs(600));
/// How often operations are checked against `unknown-aged` thresholds:
/// rarer than the polls, since an alert a few seconds late is as good.
/// Each pass reads only what crossed a threshold since the last
/// (ARCHITECTURE.md §7).
pub const AGING: Duration = Duration::from_secs(30);
/// Finished alerts are kept this long past the longest `give_up_after`.
const KEEP: Duration = Duration::from_secs(3600);

/// Alerts a poll looks at to drop the finished ones: a store's kept
/// alerts are gone over a window a poll (every 1,000 in 0.5 s).
const FORGET_WINDOW: u32 = 1000;

/// What the deliverer posts with and where it reads and settles alerts.
pub(crate) struct Deliverer {
    pub(crate) store: Arc<dyn Outbox>,
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) poster: Poster,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    /// The console's base URL, for the alerts' links.
    pub(crate) console: String,
    /// What is being posted or settled: the server reads it when it stops
    /// waiting for this task.
    pub(crate) in_flight: Arc<InFlight>,
}

impl Deliverer {
    /// Polls every `every` ([`POLL`] unless a test says otherwise), or
    /// every `idle` ([`IDLE_POLL`]) without endpoints, until `stop`. Once
    /// stopped it polls once more, so that what became due up to the stop
    /// (an operation lost while the gateway drained) is sent before the
    /// store closes, and waits for every post in flight: the caller bounds
    /// that, and what it abandons is due again after its lease.
    pub async fn run(self: Arc<Self>, every: Duration, idle: Duration, stop: CancellationToken) {
        let period = if self.endpoints.is_empty() {
            idle
        } else {
            every
        };
        let mut polls = Polls::default();
        // When the last aging pass ran (ms, the gateway's clock).
        let mut aged_at = i64::MIN;
        while background::tick(period, &stop).await {
            let now = self.clock.now_millis();
            let aging = now.saturating_sub(aged_at) >= clock::millis(AGING);
            if aging {
                aged_at = now;
            }
            self.poll(now, aging, &mut polls).await;
        }
        let now = self.clock.now_millis();
        self.poll(now, false, &mut polls).await;
        polls.settled().await;
    }

    /// One poll at `now`, an aging pass with it if `aging`: take what is
    /// due and post each in a task of its own, added to `polls`; the
    /// poll does not wait for them.
    async fn poll(self: &Arc<Self>, now: i64, aging: bool, polls: &mut Polls) {
        let due = match self.store.take_alerts(&self.alert_poll(now, aging)).await {
            Ok(due) => due,
            Err(error) => {
                tracing::warn!(%error, "cannot read the alert outbox; trying again later");
                return;
            }
        };
        let mut posts = JoinSet::new();
        for delivery in due {
            // `None`: still in flight from an earlier poll, whose post
            // settles it.
            if let Some(ticket) = self.in_flight.start(&delivery) {
                posts.spawn(self.clone().deliver(delivery, ticket));
            }
        }
        polls.add(posts, self.metrics.clone());
    }

    /// What a poll at `now` asks of the store: the deliveries due that
    /// the bounds on posts in flight leave room for.
    fn alert_poll(&self, now: i64, aging: bool) -> AlertPoll {
        let keep = self
            .endpoints
            .iter()
            .map(|e| e.config.give_up_after)
            .max()
            .unwrap_or_default()
            + KEEP;
        let room = u32::try_from(self.in_flight.room()).unwrap_or(BATCH);
        let ids = self.endpoints.iter().map(|e| e.id.as_str());
        AlertPoll {
            subscriptions: self
                .endpoints
                .iter()
                .flat_map(Endpoint::subscriptions)
                .collect(),
            aging,
            now,
            lease_until: now + clock::millis(LEASE),
            limit: room.min(BATCH),
            room: self.in_flight.room_per_endpoint(ids),
            forget_before: now - clock::millis(keep),
            forget_window: FORGET_WINDOW,
        }
    }

    /// Posts `delivery` and settles it; it is in flight until `ticket`
    /// is dropped, at the end.
    async fn deliver(self: Arc<Self>, delivery: AlertDelivery, ticket: Ticket) {
        let outcome = match self.endpoints.iter().find(|e| e.id == delivery.endpoint) {
            // Only a single-process store hands one out: configured before
            // a restart, and gone since.
            None => AlertOutcome::GaveUp {
                error: "the endpoint is no longer configured".into(),
            },
            Some(endpoint) => self.post(endpoint, &delivery).await,
        };
        let label = match &outcome {
            AlertOutcome::Delivered => "delivered",
            AlertOutcome::Retry { .. } => "failed",
            AlertOutcome::GaveUp { .. } => "gave_up",
        };
        self.metrics.alert_delivery(label);
        match &outcome {
            AlertOutcome::Delivered => {}
            AlertOutcome::Retry { error, .. } | AlertOutcome::GaveUp { error } => {
                tracing::warn!(
                    event = %delivery.alert.event,
                    endpoint = %delivery.endpoint,
                    attempts = delivery.attempts + 1,
                    %error,
                    gave_up = label == "gave_up",
                    "an alert was not delivered"
                );
            }
        }
        let now = self.clock.now_millis();
        if let Err(error) = self.store.settle_alert(&delivery, &outcome, now).await {
            tracing::warn!(%error, "cannot record an alert delivery; it is due again after its lease");
        }
        // Settled (or left to its lease): a poll may take it again once due.
        drop(ticket);
    }

    async fn post(&self, endpoint: &Endpoint, delivery: &AlertDelivery) -> AlertOutcome {
        let body = payload(&delivery.alert, &self.console);
        let now = self.clock.now_millis();
        let unix = u64::try_from(now / 1000).unwrap_or(0);
        match self.poster.post(endpoint, body, unix).await {
            Ok(_) => AlertOutcome::Delivered,
            Err(error) => {
                let now = self.clock.now_millis();
                if now - delivery.alert.at >= clock::millis(endpoint.config.give_up_after) {
                    AlertOutcome::GaveUp { error }
                } else {
                    AlertOutcome::Retry {
                        next_at: now + clock::millis(BACKOFF.delay(delivery.attempts)),
                        error,
                    }
                }
            }
        }
    }
}

/// The polls whose posts are not all settled, each a task that waits for
/// its own posts and then for the poll before it, and then counts it: a
/// count says that poll's posts and every earlier poll's are settled.
/// Dropped (the deliverer's task aborted), it aborts them all.
#[derive(Default)]
struct Polls {
    tasks: JoinSet<()>,
    /// Fires once the latest poll is counted.
    latest: Option<oneshot::Receiver<()>>,
}

impl Polls {
    /// A poll whose posts are `posts`.
    fn add(&mut self, mut posts: JoinSet<()>, metrics: Arc<Metrics>) {
        // Finished polls are only forgotten here: a poll a period keeps
        // the set small.
        while self.tasks.try_join_next().is_some() {}
        let (counted, next) = oneshot::channel();
        let before = self.latest.replace(next);
        self.tasks.spawn(async move {
            while posts.join_next().await.is_some() {}
            if let Some(before) = before {
                // Err: the poll before ended uncounted (aborted, or it
                // panicked); this one is counted all the same.
                let _ = before.await;
            }
            metrics.background_pass(Task::alerts);
            let _ = counted.send(());
        });
    }

    /// Once every poll's posts are settled.
    async fn settled(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}
