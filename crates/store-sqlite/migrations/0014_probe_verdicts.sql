-- Probe verdicts (docs/requests.md, "Probe verdicts"). A probe that finds
-- a write more than once at the destination pauses its route: 'probe'
-- beside 'operator' and 'latch'. SQLite cannot change a CHECK in place, so
-- route_pauses (a row per paused route) is rebuilt, and its alert trigger
-- (0004) with it.
CREATE TABLE route_pauses_0014 (
    route      TEXT PRIMARY KEY NOT NULL,
    reason     TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    paused_by  TEXT NOT NULL DEFAULT 'operator'
        CHECK (paused_by IN ('operator', 'latch', 'probe'))
) STRICT;
INSERT INTO route_pauses_0014 (route, reason, updated_at, paused_by)
    SELECT route, reason, updated_at, paused_by FROM route_pauses;
DROP TABLE route_pauses;
ALTER TABLE route_pauses_0014 RENAME TO route_pauses;

CREATE TRIGGER alert_route_paused AFTER INSERT ON route_pauses
BEGIN
    INSERT INTO alert_outbox (event, at, route, evidence)
    VALUES ('route-paused', NEW.updated_at, NEW.route, NEW.reason);
END;

-- The held operations a probe found more than once, which operators see
-- first: few, so a small index of their own.
CREATE INDEX operations_duplicated ON operations (id)
    WHERE state = 'unknown' AND evidence = 'duplicated-at-destination';
