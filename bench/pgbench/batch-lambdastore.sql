-- Many calls in one transaction: one statement calls Bench.touch (5
-- entries read, no write) on each of n Bench objects from first_object,
-- the keys chosen from the object id. Each call validates again what the
-- calls before it read, unless no other transaction has locked an entry
-- set for writing since: the time per call should not grow with n.
--
--   pgbench -n -t 5 -D first_object=ID -D n=8000 -f bench/pgbench/batch-lambdastore.sql "$URL"
--   pgbench -n -t 5 -D first_object=ID -D n=8000 -f bench/pgbench/batch-plpgsql.sql "$URL"
--
-- first_object .. first_object+n-1 must all be Bench objects. Compare the
-- latency averages for n = 1000 and n = 8000.

SELECT count(lambda_invoke(g, 'touch',
         jsonb_build_object('keys', jsonb_build_array(g % 96, g % 96 + 1, g % 96 + 2, g % 96 + 3, g % 96 + 4),
                            'write', false)))
  FROM generate_series(:first_object, :first_object + :n - 1) g;
