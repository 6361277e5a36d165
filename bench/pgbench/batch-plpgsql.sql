-- Many calls in one transaction through the stored procedure
-- bench_plpgsql.touch (bench/sql/plpgsql/micro.sql): the baseline for
-- batch-lambdastore.sql (see its header).
--
--   pgbench -n -t 5 -D first_object=ID -D n=8000 -f bench/pgbench/batch-plpgsql.sql "$URL"

SELECT count(bench_plpgsql.touch(g, ARRAY[g % 96, g % 96 + 1, g % 96 + 2, g % 96 + 3, g % 96 + 4], false))
  FROM generate_series(:first_object, :first_object + :n - 1) g;
