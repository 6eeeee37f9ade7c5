-- The rotated-key guard of migration 0015, applied to keys the gateway
-- derives too: a keyless write's own operation that the derive window
-- outdates would be superseded and sent again, so it answers for the
-- write no more than a `not_attempted` one does: an identical operation
-- under another key in flight or held holds it back (idemgate_claim's
-- supersede never runs). Before, only a client's key was guarded, and a
-- derived key's operation past the window was sent beside its twin.
CREATE OR REPLACE FUNCTION idemgate_claim_unless_twin(
    p_refuse_twin BOOLEAN,
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
    v_twin TEXT;
BEGIN
    IF p_refuse_twin THEN
        SELECT o.id INTO v_twin FROM operations o
        WHERE o.route = p_route AND o.scope = p_scope AND o.fingerprint = p_fingerprint
          AND o.state IN ('in_progress', 'unknown') AND o.idem_key <> p_key
        LIMIT 1;
        IF v_twin IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM operations o
            WHERE o.route = p_route AND o.scope = p_scope AND o.idem_key = p_key
              AND o.superseded_at IS NULL
              AND NOT (o.state = 'not_attempted' AND o.fingerprint = p_fingerprint)
              AND NOT (p_fresh_after IS NOT NULL AND o.updated_at < p_fresh_after
                       AND o.state IN ('completed', 'not_attempted'))
        ) THEN
            RETURN QUERY SELECT false, o.id, o.route, o.idem_key, o.state, o.attempt,
                o.created_at, o.updated_at, o.owner, o.fingerprint, o.evidence,
                o.response_status, o.response_headers, o.response_body, o.request_method,
                o.request_path, o.request_content_type, o.request_body_size,
                o.request_body_sha256, o.request_body, o.superseded_at
            FROM operations o WHERE o.id = v_twin;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM idemgate_claim(p_owner, p_now, p_fresh_after, p_id, p_route,
        p_scope, p_key, p_fingerprint, p_method, p_path, p_content_type, p_body_size,
        p_body_sha256, p_body);
END;
$$;
