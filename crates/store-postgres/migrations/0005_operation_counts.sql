-- Operations by (route, state), kept by the database in the transaction of
-- every change, so a scrape of `idemgate_operations` reads a few rows
-- instead of counting the whole table (ARCHITECTURE.md §4, "Counts").
-- Triggers, not the statements: every statement that inserts, deletes or
-- changes a state or route is covered, on every replica, including
-- statements written later. Superseded operations are counted, as
-- `count(*)` counts them.
--
-- Sharded by `slot`, the writing backend's pid. One row per (route, state)
-- would be updated by every replica's batches, and an updated row stays
-- locked until its transaction commits: each batch would wait for every
-- other batch of the same route to commit (the replicas' commits
-- serialized one behind another), and two batches taking (in_progress,
-- completed) and (completed, unknown) in opposite orders would deadlock.
-- A pid belongs to one live backend at a time, and a backend runs one
-- transaction at a time, so no two transactions ever write the same row:
-- counting adds no lock wait. The stats read sums the slots; it first
-- folds the rows no transaction holds into slot 0 (SKIP LOCKED, so it
-- never waits either), which keeps the rows about one per (route, state)
-- and backend that wrote since the last read. Slot 0 is the fold's alone:
-- no backend has pid 0.
CREATE TABLE operation_counts (
    route TEXT NOT NULL,
    state TEXT NOT NULL,
    slot  INTEGER NOT NULL,
    n     BIGINT NOT NULL,
    PRIMARY KEY (route, state, slot)
);

CREATE FUNCTION operation_counts_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO operation_counts AS c (route, state, slot, n)
        VALUES (OLD.route, OLD.state, pg_backend_pid(), -1)
        ON CONFLICT (route, state, slot) DO UPDATE SET n = c.n - 1;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO operation_counts AS c (route, state, slot, n)
        VALUES (NEW.route, NEW.state, pg_backend_pid(), 1)
        ON CONFLICT (route, state, slot) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER operation_counts_insert AFTER INSERT ON operations
    FOR EACH ROW EXECUTE FUNCTION operation_counts_change();

-- `UPDATE OF` fires whenever the columns are assigned (a record sets state
-- every time); WHEN skips the updates that change neither.
CREATE TRIGGER operation_counts_update AFTER UPDATE OF state, route ON operations
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.route IS DISTINCT FROM NEW.route)
    EXECUTE FUNCTION operation_counts_change();

CREATE TRIGGER operation_counts_delete AFTER DELETE ON operations
    FOR EACH ROW EXECUTE FUNCTION operation_counts_change();

-- Filled once from the rows there are. Creating the triggers locked
-- `operations` against writes until this migration commits, so no write
-- falls between the count and the triggers.
INSERT INTO operation_counts (route, state, slot, n)
SELECT route, state, 0, count(*) FROM operations GROUP BY route, state;

-- The counts are exact from here on. A later migration that writes
-- `operations` around the triggers deletes this row; the store then
-- recounts at its next open.
INSERT INTO store_meta (name, value) VALUES ('operation-counts', 'exact')
ON CONFLICT (name) DO UPDATE SET value = excluded.value;
