-- Probe verdicts (docs/requests.md, "Probe verdicts"). A probe that finds
-- a write more than once at the destination pauses its route: 'probe'
-- beside 'operator' and 'latch'.
ALTER TABLE route_pauses DROP CONSTRAINT route_pauses_paused_by_check;
ALTER TABLE route_pauses ADD CONSTRAINT route_pauses_paused_by_check
    CHECK (paused_by IN ('operator', 'latch', 'probe'));

-- The held operations a probe found more than once, which operators see
-- first: few, so a small index of their own.
CREATE INDEX operations_duplicated ON operations (id)
    WHERE state = 'unknown' AND evidence = 'duplicated-at-destination';
