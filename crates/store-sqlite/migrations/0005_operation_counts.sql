-- Operations by (route, state), kept by the database in the transaction of
-- every change, so a scrape of `idemgate_operations` reads a few rows
-- instead of counting the whole table (ARCHITECTURE.md §4, "Counts").
-- Triggers, not the statements: every statement that inserts, deletes or
-- changes a state or route is covered, including ones written later.
-- Superseded operations are counted, as `count(*)` counts them.
--
-- One row per (route, state): SQLite has one writer, so a counter row is
-- never contended. A row that falls to 0 stays (a handful per route).
CREATE TABLE operation_counts (
    route TEXT NOT NULL,
    state TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (route, state)
) STRICT, WITHOUT ROWID;

CREATE TRIGGER operation_counts_insert AFTER INSERT ON operations
BEGIN
    INSERT INTO operation_counts (route, state, n) VALUES (NEW.route, NEW.state, 1)
    ON CONFLICT (route, state) DO UPDATE SET n = n + 1;
END;

-- `UPDATE OF` fires whenever the columns are assigned (the record sets
-- state every time); WHEN skips the updates that change neither.
CREATE TRIGGER operation_counts_update AFTER UPDATE OF state, route ON operations
WHEN OLD.state IS NOT NEW.state OR OLD.route IS NOT NEW.route
BEGIN
    UPDATE operation_counts SET n = n - 1 WHERE route = OLD.route AND state = OLD.state;
    INSERT INTO operation_counts (route, state, n) VALUES (NEW.route, NEW.state, 1)
    ON CONFLICT (route, state) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER operation_counts_delete AFTER DELETE ON operations
BEGIN
    UPDATE operation_counts SET n = n - 1 WHERE route = OLD.route AND state = OLD.state;
END;

-- Filled once from the rows there are, in the migration's transaction.
INSERT INTO operation_counts (route, state, n)
SELECT route, state, count(*) FROM operations GROUP BY route, state;

-- The counts are exact from here on. A later migration that rewrites
-- `operations` around the triggers (a table rebuild drops them) deletes
-- this row; the store then recounts at its next open.
INSERT INTO store_meta (name, value) VALUES ('operation-counts', 'exact')
ON CONFLICT (name) DO UPDATE SET value = excluded.value;
