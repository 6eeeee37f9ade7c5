-- One random index page per new key instead of two (ARCHITECTURE.md §4,
-- "Bytes per operation"). A new key lands at a random place in every
-- index that leads with something random: `operations_identity` (route,
-- scope, idem_key) and `operations_key_id` (idem_key, id), so each new key
-- in a batch dirtied a page of each, a WAL frame apiece. The identity
-- index with the key first serves what `operations_key_id` did for the
-- operations that are not superseded (a key names one per route and
-- scope), and a partial index holds the superseded ones, which only derive
-- mode makes and no first write touches.
--
-- Rebuilding the indexes reads every operation once, at the first start of
-- this release (seconds a million operations); the migration's one
-- transaction keeps any other connection from seeing the store without
-- its identity index. (`IF EXISTS`: a store whose indexes were rebuilt by
-- hand may lack the one being replaced.)
DROP INDEX operations_identity;
DROP INDEX IF EXISTS operations_key_id;
CREATE UNIQUE INDEX operations_identity ON operations (idem_key, route, scope)
    WHERE superseded_at IS NULL;
CREATE INDEX operations_superseded ON operations (idem_key, id)
    WHERE superseded_at IS NOT NULL;
