-- Every read of the admin API, the console, the alerts and retention is
-- served by an index (ARCHITECTURE.md §4, "Access paths"). Each index here
-- is one more b-tree written by every claim, and the two that hold `state`
-- once more by every record: three, and no more, because each serves a
-- filter no existing index can.

-- `list` by state, newest first (the console's held work: state=unknown).
CREATE INDEX operations_state_id ON operations (state, id);
-- `list` by route and state, and by route alone (once per state, merged);
-- the pause latch's count of a route's unknown operations.
CREATE INDEX operations_route_state_id ON operations (route, state, id);
-- `list` by key (a key names few operations: any other filter is applied
-- to those), and `find_newest`'s superseded operations.
CREATE INDEX operations_key_id ON operations (idem_key, id);

-- Where the unknown-aged scan for each threshold stands: every `unknown`
-- operation at or before (updated_at, id) has been looked at for it, so a
-- poll reads only the operations that crossed the threshold since the last.
CREATE TABLE alert_aged_scans (
    aged_after BIGINT PRIMARY KEY NOT NULL,   -- ms
    updated_at BIGINT NOT NULL,
    id         TEXT NOT NULL
);
