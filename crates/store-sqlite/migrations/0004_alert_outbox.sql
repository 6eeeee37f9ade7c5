-- Alerts on held work. The outbox is filled by the database itself, in the
-- transaction of the state change that warrants an alert (the triggers
-- below), so no path that makes an operation `unknown` or pauses a route
-- can skip one. The gateway's deliverer fans each alert out to the
-- configured endpoints (one delivery row each) and retries those.
CREATE TABLE alert_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    event        TEXT NOT NULL,      -- operation-unknown | route-paused | unknown-aged
    at           INTEGER NOT NULL,   -- ms since the Unix epoch: when it happened
    route        TEXT NOT NULL,
    operation_id TEXT,
    idem_key     TEXT,
    state        TEXT,
    evidence     TEXT NOT NULL,      -- the operation's evidence, or the pause's reason
    aged_after   INTEGER NOT NULL DEFAULT 0,  -- unknown-aged: the threshold crossed (ms)
    fanned_out   INTEGER NOT NULL DEFAULT 0   -- 1 once its deliveries exist
);

-- Each operation is reported aged once per threshold.
CREATE UNIQUE INDEX alert_outbox_aged ON alert_outbox (operation_id, aged_after)
    WHERE event = 'unknown-aged';
CREATE INDEX alert_outbox_fresh ON alert_outbox (id) WHERE fanned_out = 0;

-- One row per alert and endpoint (a hash of its URL, never the URL).
CREATE TABLE alert_deliveries (
    alert_id   INTEGER NOT NULL REFERENCES alert_outbox (id) ON DELETE CASCADE,
    endpoint   TEXT NOT NULL,
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_at    INTEGER NOT NULL,     -- due then (or leased to a deliverer until then)
    done_at    INTEGER,              -- delivered or given up
    outcome    TEXT,                 -- delivered | gave-up
    last_error TEXT,
    PRIMARY KEY (alert_id, endpoint)
);

CREATE INDEX alert_deliveries_due ON alert_deliveries (next_at) WHERE done_at IS NULL;

CREATE TRIGGER alert_operation_unknown AFTER UPDATE OF state ON operations
WHEN NEW.state = 'unknown' AND OLD.state <> 'unknown'
BEGIN
    INSERT INTO alert_outbox (event, at, route, operation_id, idem_key, state, evidence)
    VALUES ('operation-unknown', NEW.updated_at, NEW.route, NEW.id, NEW.idem_key, NEW.state,
            NEW.evidence);
END;

CREATE TRIGGER alert_route_paused AFTER INSERT ON route_pauses
BEGIN
    INSERT INTO alert_outbox (event, at, route, evidence)
    VALUES ('route-paused', NEW.updated_at, NEW.route, NEW.reason);
END;
