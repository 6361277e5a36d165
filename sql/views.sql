-- Views over functions that pgrx generates; created after them.

-- Per application, type and function: top-level calls, workflows committed,
-- aborts by reason, execution time. Counted in shared memory since the
-- server started (kept across aborted transactions); empty unless
-- lambdastore is in shared_preload_libraries.
CREATE VIEW lambdastore.stats AS SELECT * FROM lambdastore._stats();
