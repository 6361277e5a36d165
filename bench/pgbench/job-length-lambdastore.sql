-- job-length through LambdaStore: Bench.hash(n), n chained SHA-512 rounds
-- over 1 KiB, on one Bench object (readonly: it touches no entries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 -D object=ID -D n=N \
--     -f bench/pgbench/job-length-lambdastore.sql "$URL"
--
-- Mind lambdastore.timeout (default 1s) for large n.

SELECT lambda_invoke(:object, 'hash', jsonb_build_object('n', :n::int));
