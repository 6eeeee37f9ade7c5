-- The three indexes that hold `state` no longer hold `in_progress`
-- operations (ARCHITECTURE.md §4, "Bytes per operation"). A claim entered
-- each at its `in_progress` end and its record moved it: three inserts,
-- three deletes and three inserts a first write, and three more pages
-- every batch dirtied. Now a claim enters one small index of the
-- operations in flight, its record leaves it and enters the three once.
-- SQLite reads a partial index only for a statement that states its
-- condition, so the store's statements served by these repeat
-- `state <> 'in_progress'` (`store/sqlite/mod.rs`, `not_in_progress!`).
--
-- Rebuilding them reads every operation once, at the first start of this
-- release, in the migration's one transaction.
DROP INDEX operations_state_id;
DROP INDEX operations_route_state_id;
DROP INDEX operations_state_updated;
CREATE INDEX operations_state_id ON operations (state, id)
    WHERE state <> 'in_progress';
CREATE INDEX operations_route_state_id ON operations (route, state, id)
    WHERE state <> 'in_progress';
CREATE INDEX operations_state_updated ON operations (state, updated_at)
    WHERE state <> 'in_progress';
CREATE INDEX operations_in_progress ON operations (id)
    WHERE state = 'in_progress';
