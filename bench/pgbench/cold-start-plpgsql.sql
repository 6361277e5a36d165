-- Cold start through PL/pgSQL: the baseline for cold-start-lambdastore.sql
-- (see its header). bench_plpgsql_get is in bench/sql/plpgsql/counter.sql:
--
--   psql "$URL" -f bench/sql/plpgsql/counter.sql
--   pgbench -n -C -c 1 -T 10 -D object=ID -f bench/pgbench/cold-start-plpgsql.sql "$URL"

SELECT bench_plpgsql_get(:object);
