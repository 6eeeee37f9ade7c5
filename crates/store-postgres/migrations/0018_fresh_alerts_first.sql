-- Fresh alerts (an operation just held, a route just paused) are handed
-- out before the reminders of aged ones: after a mass incident, or an
-- `aged_after` set over a store full of held work, a new loss's alert no
-- longer waits behind the backlog of aged ones. `aged` is true for an
-- `unknown-aged` alert's deliveries (docs/operating.md, "Alerts").
-- Each endpoint's due deliveries are read in that order from the index,
-- no further than its room, so a poll costs the same over any backlog.
ALTER TABLE alert_deliveries ADD COLUMN aged BOOLEAN NOT NULL DEFAULT false;
UPDATE alert_deliveries SET aged = true
 WHERE alert_id IN (SELECT id FROM alert_outbox WHERE event = 'unknown-aged');
DROP INDEX alert_deliveries_due;
CREATE INDEX alert_deliveries_due ON alert_deliveries (endpoint, aged, next_at)
    WHERE done_at IS NULL;
