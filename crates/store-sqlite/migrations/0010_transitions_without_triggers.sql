-- The counts by route and state (0005) and the `operation-unknown` alert
-- (0004) are written by the store's own statements from here on
-- (src/store/sqlite/transitions.rs), in the same transaction as the change:
-- a trigger on `operations` made SQLite keep a statement journal for every
-- claim and record, a copy of each page they touched, which cost a first
-- write more than its two statements' own B-tree work. The counts stay
-- exact across this migration, so the `operation-counts` mark stays.
DROP TRIGGER operation_counts_insert;
DROP TRIGGER operation_counts_update;
DROP TRIGGER operation_counts_delete;
DROP TRIGGER alert_operation_unknown;
