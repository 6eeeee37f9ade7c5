-- Alerts on held work. The outbox is filled by the database itself, in the
-- transaction of the state change that warrants an alert (the triggers
-- below), so no path and no replica that makes an operation `unknown` or
-- pauses a route can skip one. A deliverer fans each alert out to the
-- configured endpoints (one delivery row each) and retries those; replicas
-- take due deliveries with SKIP LOCKED and a lease, so one delivers each.
CREATE TABLE alert_outbox (
    id           BIGSERIAL PRIMARY KEY,
    event        TEXT NOT NULL,      -- operation-unknown | route-paused | unknown-aged
    at           BIGINT NOT NULL,    -- ms since the Unix epoch: when it happened
    route        TEXT NOT NULL,
    operation_id TEXT,
    idem_key     TEXT,
    state        TEXT,
    evidence     TEXT NOT NULL,      -- the operation's evidence, or the pause's reason
    aged_after   BIGINT NOT NULL DEFAULT 0,   -- unknown-aged: the threshold crossed (ms)
    fanned_out   BOOLEAN NOT NULL DEFAULT false  -- true once its deliveries exist
);

-- Each operation is reported aged once per threshold.
CREATE UNIQUE INDEX alert_outbox_aged ON alert_outbox (operation_id, aged_after)
    WHERE event = 'unknown-aged';
CREATE INDEX alert_outbox_fresh ON alert_outbox (id) WHERE NOT fanned_out;

-- One row per alert and endpoint (a hash of its URL, never the URL).
CREATE TABLE alert_deliveries (
    alert_id   BIGINT NOT NULL REFERENCES alert_outbox (id) ON DELETE CASCADE,
    endpoint   TEXT NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_at    BIGINT NOT NULL,      -- due then (or leased to a deliverer until then)
    done_at    BIGINT,               -- delivered or given up
    outcome    TEXT,                 -- delivered | gave-up
    last_error TEXT,
    PRIMARY KEY (alert_id, endpoint)
);

CREATE INDEX alert_deliveries_due ON alert_deliveries (next_at) WHERE done_at IS NULL;

CREATE FUNCTION alert_operation_unknown() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence)
    VALUES ('operation-unknown', NEW.updated_at, NEW.route, NEW.id, NEW.idem_key, NEW.state,
            NEW.evidence);
    RETURN NULL;
END $$;

CREATE TRIGGER alert_operation_unknown AFTER UPDATE OF state ON operations
    FOR EACH ROW WHEN (NEW.state = 'unknown' AND OLD.state <> 'unknown')
    EXECUTE FUNCTION alert_operation_unknown();

CREATE FUNCTION alert_route_paused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_outbox (event, at, route, evidence)
    VALUES ('route-paused', NEW.updated_at, NEW.route, NEW.reason);
    RETURN NULL;
END $$;

CREATE TRIGGER alert_route_paused AFTER INSERT ON route_pauses
    FOR EACH ROW EXECUTE FUNCTION alert_route_paused();
