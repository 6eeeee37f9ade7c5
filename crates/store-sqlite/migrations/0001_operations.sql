-- Operations: one row per (route, scope, key). The unique index is what makes a
-- claim atomic; state changes are compare-and-sets on (id, state, attempt, owner).
CREATE TABLE operations (
    id                   TEXT PRIMARY KEY NOT NULL,
    route                TEXT NOT NULL,
    scope                TEXT NOT NULL,      -- SHA-256 of the scope headers, never the credentials
    idem_key             TEXT NOT NULL,      -- bare key
    fingerprint          TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('in_progress', 'completed', 'unknown', 'not_attempted')),
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

-- The identity is unique among operations that are not superseded.
CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key) WHERE superseded_at IS NULL;
CREATE INDEX operations_state_updated ON operations (state, updated_at);

-- Each operation's timeline: short evidence, never credentials or payloads.
CREATE TABLE events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    at           INTEGER NOT NULL,
    kind         TEXT NOT NULL,
    detail       TEXT NOT NULL               -- JSON object
) STRICT;

CREATE INDEX events_operation ON events (operation_id, id);

-- Routes paused by an operator or by the pause_after_unknown latch; stored so
-- a pause survives restarts. Only an explicit resume clears it.
CREATE TABLE route_pauses (
    route      TEXT PRIMARY KEY NOT NULL,
    reason     TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
