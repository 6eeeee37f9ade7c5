-- Operations: one row per (route, scope, key), shared by every replica. The
-- partial unique index is what makes a claim atomic across replicas; state
-- changes are compare-and-sets on (id, state, attempt, owner).
CREATE TABLE operations (
    id                   TEXT PRIMARY KEY NOT NULL,
    route                TEXT NOT NULL,
    scope                TEXT NOT NULL,      -- SHA-256 of the scope headers, never the credentials
    idem_key             TEXT NOT NULL,      -- bare key
    fingerprint          TEXT NOT NULL,
    state                TEXT NOT NULL CHECK (state IN ('in_progress', 'completed', 'unknown', 'not_attempted')),
    attempt              INTEGER NOT NULL,
    owner                TEXT,               -- instance id of the replica that claimed the attempt
    evidence             TEXT NOT NULL,      -- what proves the state
    request_method       TEXT NOT NULL,
    request_path         TEXT NOT NULL,
    request_content_type TEXT,
    request_body_size    BIGINT NOT NULL,
    request_body_sha256  TEXT NOT NULL,
    request_body         BYTEA,              -- only when the route sets store_request_body
    response_status      INTEGER,
    response_headers     TEXT,               -- JSON [[name, latin-1 value]]
    response_body        BYTEA,              -- NULL with a status: too large to store
    created_at           BIGINT NOT NULL,    -- ms since the Unix epoch (the gateways' clock)
    updated_at           BIGINT NOT NULL,
    -- derive mode without derive_from: an identical request after derive_window
    -- is a new operation; the old one is kept for operators, marked superseded.
    superseded_at        BIGINT
);

-- The identity is unique among operations that are not superseded.
CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key) WHERE superseded_at IS NULL;
CREATE INDEX operations_state_updated ON operations (state, updated_at);
-- What a lost replica left in flight, found without a scan.
CREATE INDEX operations_in_progress_owner ON operations (owner) WHERE state = 'in_progress';

-- Each operation's timeline: short evidence, never credentials or payloads.
CREATE TABLE events (
    id           BIGSERIAL PRIMARY KEY,
    operation_id TEXT NOT NULL REFERENCES operations (id) ON DELETE CASCADE,
    at           BIGINT NOT NULL,
    kind         TEXT NOT NULL,
    detail       TEXT NOT NULL               -- JSON object
);

CREATE INDEX events_operation ON events (operation_id, id);

-- Routes paused by an operator or by the pause_after_unknown latch, for
-- every replica. Only an explicit resume clears it.
CREATE TABLE route_pauses (
    route      TEXT PRIMARY KEY NOT NULL,
    reason     TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- The replicas and their leases, in the database's clock: an owner whose
-- lease ran out is dead, and its in_progress operations become unknown.
CREATE TABLE replicas (
    id          TEXT PRIMARY KEY NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    lease_until TIMESTAMPTZ NOT NULL
);

-- The claim, as one statement a batch can run per row: supersede what the
-- derive window outdates, insert (the unique index decides between racing
-- replicas), or take a not_attempted operation's next attempt; otherwise
-- return the operation that holds the identity. Each statement inside sees
-- what committed before it (READ COMMITTED, a volatile function), so the
-- loser of an insert race reads the winner's row. Refused (an error) when
-- the claiming replica's lease has run out by the database's clock.
CREATE FUNCTION idemgate_claim(
    p_owner TEXT, p_now BIGINT, p_fresh_after BIGINT, p_id TEXT,
    p_route TEXT, p_scope TEXT, p_key TEXT, p_fingerprint TEXT,
    p_method TEXT, p_path TEXT, p_content_type TEXT, p_body_size BIGINT,
    p_body_sha256 TEXT, p_body BYTEA
) RETURNS TABLE (
    claimed BOOLEAN, id TEXT, route TEXT, idem_key TEXT, state TEXT, attempt INTEGER,
    created_at BIGINT, updated_at BIGINT, owner TEXT, fingerprint TEXT, evidence TEXT,
    response_status INTEGER, response_headers TEXT, response_body BYTEA,
    request_method TEXT, request_path TEXT, request_content_type TEXT,
    request_body_size BIGINT, request_body_sha256 TEXT, request_body BYTEA,
    superseded_at BIGINT
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    v_id TEXT;
    v_attempt INTEGER;
    v_claimed BOOLEAN;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM replicas r
                   WHERE r.id = p_owner AND r.lease_until > clock_timestamp()) THEN
        RAISE EXCEPTION 'the lease of replica % has run out', p_owner USING ERRCODE = 'IG001';
    END IF;
    IF p_fresh_after IS NOT NULL THEN
        WITH outdated AS (
            UPDATE operations o SET superseded_at = p_now
            WHERE o.route = p_route AND o.scope = p_scope AND o.idem_key = p_key
              AND o.superseded_at IS NULL AND o.state IN ('completed', 'not_attempted')
              AND o.updated_at < p_fresh_after
            RETURNING o.id
        )
        INSERT INTO events (operation_id, at, kind, detail)
        SELECT outdated.id, p_now, 'superseded', '{"reason":"derive-window"}' FROM outdated;
    END IF;
    -- Bounded: a row swept between the insert and the look-up is looked
    -- for once more.
    FOR i IN 1..3 LOOP
        v_claimed := true;
        INSERT INTO operations AS o (id, route, scope, idem_key, fingerprint, state, attempt,
            owner, evidence, request_method, request_path, request_content_type,
            request_body_size, request_body_sha256, request_body, created_at, updated_at)
        VALUES (p_id, p_route, p_scope, p_key, p_fingerprint, 'in_progress', 1, p_owner,
            'claimed', p_method, p_path, p_content_type, p_body_size, p_body_sha256, p_body,
            p_now, p_now)
        ON CONFLICT (route, scope, idem_key) WHERE superseded_at IS NULL DO NOTHING
        RETURNING o.id INTO v_id;
        -- The row's creation is the first attempt's claim: no event.
        IF v_id IS NULL THEN
            UPDATE operations o SET state = 'in_progress', attempt = o.attempt + 1,
                owner = p_owner, evidence = 'claimed', updated_at = p_now
            WHERE o.route = p_route AND o.scope = p_scope AND o.idem_key = p_key
              AND o.superseded_at IS NULL AND o.state = 'not_attempted'
              AND o.fingerprint = p_fingerprint
            RETURNING o.id, o.attempt INTO v_id, v_attempt;
            IF v_id IS NOT NULL THEN
                INSERT INTO events (operation_id, at, kind, detail)
                VALUES (v_id, p_now, 'claimed',
                    json_build_object('attempt', v_attempt, 'owner', p_owner)::text);
            END IF;
        END IF;
        IF v_id IS NULL THEN
            v_claimed := false;
            SELECT o.id INTO v_id FROM operations o
            WHERE o.route = p_route AND o.scope = p_scope AND o.idem_key = p_key
              AND o.superseded_at IS NULL;
        END IF;
        IF v_id IS NOT NULL THEN
            RETURN QUERY SELECT v_claimed, o.id, o.route, o.idem_key, o.state, o.attempt,
                o.created_at, o.updated_at, o.owner, o.fingerprint, o.evidence,
                o.response_status, o.response_headers, o.response_body, o.request_method,
                o.request_path, o.request_content_type, o.request_body_size,
                o.request_body_sha256, o.request_body, o.superseded_at
            FROM operations o WHERE o.id = v_id;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the operation % changed under three claims in a row', p_key
        USING ERRCODE = 'IG002';
END;
$$;
