-- Who paused a route, kept as a value of its own: 'operator' (the admin
-- API) or 'latch' (a route's pause_after_unknown). Before this, a latch's
-- pause was told apart by the prefix of its reason; pauses stored then
-- keep their meaning, and an operator's reason is only ever a reason.
ALTER TABLE route_pauses ADD COLUMN paused_by TEXT NOT NULL DEFAULT 'operator'
    CHECK (paused_by IN ('operator', 'latch'));

UPDATE route_pauses SET paused_by = 'latch'
    WHERE substr(reason, 1, 21) = 'pause_after_unknown: ';
