-- A key's status lookup (`find_newest`) and the derive window look for the
-- newest superseded operation of an identity when none is current. That
-- look-up was served by `operations_key_id` (idem_key, id) with route and
-- scope filtered from the rows, and PostgreSQL, planning it before the
-- table's statistics exist (a store that has just been filled, or one
-- autovacuum has not analysed yet), intersected it with a scan of
-- `operations_route_state_id` by route: every operation of the route, 160
-- ms a lookup at a million operations (ARCHITECTURE.md §4, "Access paths").
-- An index of the superseded operations alone, by identity and id, serves
-- it whole: it holds only what derive mode superseded, so it costs a first
-- write nothing, and no statistics can make another index look better.
CREATE INDEX operations_superseded ON operations (route, scope, idem_key, id)
    WHERE superseded_at IS NOT NULL;
