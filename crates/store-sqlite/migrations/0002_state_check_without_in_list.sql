-- The state CHECK of 0001 is an IN list of four strings, and SQLite evaluates
-- an IN list longer than two by building a temporary index for every row it
-- writes: two temporary b-trees per write (the claim's INSERT and the
-- record's UPDATE), a measurable share of a first write's cost. The same
-- check as a chain of equalities needs none. SQLite cannot change a CHECK in
-- place, so the table is rebuilt with the same columns and indexes.
--
-- The migration connection runs with foreign keys off (the store turns them
-- on for its own connection): dropping the old table must not cascade into
-- the events that reference it. The foreign key check at the end fails the
-- migration, rolling it back, if any event was left without its operation.
CREATE TABLE operations_rebuilt (
    id                   TEXT PRIMARY KEY NOT NULL,
    route                TEXT NOT NULL,
    scope                TEXT NOT NULL,      -- SHA-256 of the scope headers, never the credentials
    idem_key             TEXT NOT NULL,      -- bare key
    fingerprint          TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state = 'in_progress' OR state = 'completed'
                                              OR state = 'unknown' OR state = 'not_attempted'),
    attempt              INTEGER NOT NULL,
    owner                TEXT,               -- instance id of the process that claimed the attempt
    evidence             TEXT NOT NULL,      -- what proves the state
    request_method       TEXT NOT NULL,
    request_path         TEXT NOT NULL,
    request_content_type TEXT,
    request_body_size    INTEGER NOT NULL,
    request_body_sha256  TEXT NOT NULL,
    request_body         BLOB,               -- only when the route sets store_request_body
    response_status      INTEGER,
    response_headers     TEXT,               -- JSON [[name, latin-1 value]]
    response_body        BLOB,               -- NULL with a status: too large to store
    created_at           INTEGER NOT NULL,   -- ms since the Unix epoch
    updated_at           INTEGER NOT NULL,
    -- derive mode without derive_from: an identical request after derive_window
    -- is a new operation; the old one is kept for operators, marked superseded.
    superseded_at        INTEGER
) STRICT;

INSERT INTO operations_rebuilt (id, route, scope, idem_key, fingerprint, state, attempt, owner,
    evidence, request_method, request_path, request_content_type, request_body_size,
    request_body_sha256, request_body, response_status, response_headers, response_body,
    created_at, updated_at, superseded_at)
SELECT id, route, scope, idem_key, fingerprint, state, attempt, owner,
    evidence, request_method, request_path, request_content_type, request_body_size,
    request_body_sha256, request_body, response_status, response_headers, response_body,
    created_at, updated_at, superseded_at
FROM operations ORDER BY rowid;

DROP TABLE operations;
ALTER TABLE operations_rebuilt RENAME TO operations;

-- The identity is unique among operations that are not superseded.
CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key) WHERE superseded_at IS NULL;
CREATE INDEX operations_state_updated ON operations (state, updated_at);

-- Fails (and so rolls the migration back) if any event lost its operation.
CREATE TEMP TABLE migration_0002_orphans (n INTEGER NOT NULL CHECK (n = 0));
INSERT INTO migration_0002_orphans SELECT count(*) FROM pragma_foreign_key_check('events');
DROP TABLE migration_0002_orphans;
