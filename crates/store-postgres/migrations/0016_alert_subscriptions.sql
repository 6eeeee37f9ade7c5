-- The endpoints the replicas deliver alerts to. Replicas sharing the store
-- may list different `[[alerts]]` (a rollout that adds a webhook reaches
-- them one at a time), so an alert is fanned out to the subscriptions
-- recorded here, whichever replica fans it out, not to that replica's
-- own: each replica records its subscriptions as it polls, and one counts
-- for alerts raised up to a while after it was last recorded
-- (crates/store-postgres/src/outbox.rs). One row per endpoint, event and
-- threshold any replica has polled with: a handful.
CREATE TABLE alert_subscriptions (
    endpoint   TEXT NOT NULL,      -- a hash of its URL, as in alert_deliveries
    event      TEXT NOT NULL,
    aged_after BIGINT NOT NULL,    -- unknown-aged: the threshold (ms); 0 for the others
    seen_at    BIGINT NOT NULL,    -- ms since the Unix epoch: when a replica last polled with it
    PRIMARY KEY (endpoint, event, aged_after)
);
