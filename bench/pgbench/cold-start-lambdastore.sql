-- Cold start through LambdaStore: with -C every transaction opens a new
-- connection, so every call is a new backend's first (the wasmtime engine
-- and its epoch thread, the compiled module mapped from the artifact
-- cache, the object looked up). Counter.get on one Counter object of the
-- counter application.
--
--   pgbench -n -C -c 1 -T 10 -D object=ID -f bench/pgbench/cold-start-lambdastore.sql "$URL"
--   pgbench -n -C -c 1 -T 10 -D object=ID -f bench/pgbench/cold-start-plpgsql.sql "$URL"
--
-- Both latency averages include PostgreSQL's own backend start and the
-- connection; their difference is what the sandbox adds to a connection's
-- first call. The suite's cold-start workload measures the same call by
-- call, with a redeploy every 10 connections.

SELECT lambda_invoke(:object, 'get');
