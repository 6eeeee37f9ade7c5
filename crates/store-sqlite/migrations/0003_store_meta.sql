-- Facts about the store itself, beside its operations: the sealed canary
-- (`seal-canary`) that tells at start whether the configured key fits the
-- values already stored.
CREATE TABLE store_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) STRICT;
