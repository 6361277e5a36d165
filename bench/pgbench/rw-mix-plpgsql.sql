-- rw-mix through the stored procedure bench_plpgsql.touch
-- (bench/sql/plpgsql/micro.sql): 5 distinct random keys of a random Bench
-- object, writing in write_percent% of the transactions. Row locks taken
-- in key order: no deadlocks, nothing to retry (--max-tries only keeps the
-- command line like the lambda's; the report should show 0 retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_object=ID -D objects=N -D write_percent=P \
--     -f bench/pgbench/rw-mix-plpgsql.sql "$URL"
--
-- first_object .. first_object+objects-1 must all be Bench objects.

\set object random(:first_object, :first_object + :objects - 1)
-- Floyd's sampling: a uniformly random set of 5 distinct keys of 0..99.
\set k1 random(0, 95)
\set t random(0, 96)
\set k2 case when :t = :k1 then 96 else :t end
\set t random(0, 97)
\set k3 case when :t = :k1 or :t = :k2 then 97 else :t end
\set t random(0, 98)
\set k4 case when :t = :k1 or :t = :k2 or :t = :k3 then 98 else :t end
\set t random(0, 99)
\set k5 case when :t = :k1 or :t = :k2 or :t = :k3 or :t = :k4 then 99 else :t end
\set write random(1, 100) <= :write_percent
SELECT bench_plpgsql.touch(:object::bigint, ARRAY[:k1::int, :k2::int, :k3::int, :k4::int, :k5::int], :write::boolean);
