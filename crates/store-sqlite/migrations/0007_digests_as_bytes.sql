-- The three SHA-256 digests a row keeps (`scope`, `fingerprint`,
-- `request_body_sha256`) as their 32 bytes instead of 64 hex characters:
-- 96 bytes less per row, 32 less per entry of the identity index, the one
-- every claim looks up (ARCHITECTURE.md §4, "Bytes per operation"). The
-- store reads them back as the lower-case hex the rest of the gateway
-- compares and binds (`lower(hex(...))`), and binds them with `unhex(?)`.
--
-- Columns, not a table rebuild: the triggers of 0004 and 0005 and the
-- indexes that do not hold a digest stay as they are (no trigger reads a
-- digest, and this update changes neither `state` nor `route`, so the
-- counts stay exact). A value that is not hex fails the migration (NOT
-- NULL), rolling it back, rather than storing a digest that no longer
-- matches its operation.
DROP INDEX operations_identity;

ALTER TABLE operations ADD COLUMN scope_bytes BLOB NOT NULL DEFAULT x'';
ALTER TABLE operations ADD COLUMN fingerprint_bytes BLOB NOT NULL DEFAULT x'';
ALTER TABLE operations ADD COLUMN request_body_sha256_bytes BLOB NOT NULL DEFAULT x'';

UPDATE operations SET scope_bytes = unhex(scope), fingerprint_bytes = unhex(fingerprint),
    request_body_sha256_bytes = unhex(request_body_sha256);

ALTER TABLE operations DROP COLUMN scope;
ALTER TABLE operations DROP COLUMN fingerprint;
ALTER TABLE operations DROP COLUMN request_body_sha256;
ALTER TABLE operations RENAME COLUMN scope_bytes TO scope;
ALTER TABLE operations RENAME COLUMN fingerprint_bytes TO fingerprint;
ALTER TABLE operations RENAME COLUMN request_body_sha256_bytes TO request_body_sha256;

-- The identity is unique among operations that are not superseded.
CREATE UNIQUE INDEX operations_identity ON operations (route, scope, idem_key)
    WHERE superseded_at IS NULL;
