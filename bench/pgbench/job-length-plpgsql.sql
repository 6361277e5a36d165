-- job-length through the stored procedure bench_plpgsql.hash(n)
-- (bench/sql/plpgsql/micro.sql, pgcrypto's digest): the same n chained
-- SHA-512 rounds over 1 KiB, the same result. `object` is unused (hash
-- reads no object) but accepted, so both scripts take the same -D flags.
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 -D object=ID -D n=N \
--     -f bench/pgbench/job-length-plpgsql.sql "$URL"

SELECT bench_plpgsql.hash(:n::int);
