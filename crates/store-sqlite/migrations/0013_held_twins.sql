-- The rotated-key guard (`rotated_keys = "hold"`, docs/requests.md "A
-- rotated key") asks, inside a claim, whether an identical operation
-- under another key of the route and scope is in flight or held. This
-- index holds only those operations, by what the question names, so the
-- answer is one seek in a small index. A first write enters it with its
-- claim and leaves it with its record; settled operations never do.
-- SQLite reads it only for a statement that states its condition
-- (`held_twin_sql` in `store/sqlite/statements.rs`).
CREATE INDEX operations_held_twins ON operations (route, scope, fingerprint)
    WHERE state IN ('in_progress', 'unknown');
