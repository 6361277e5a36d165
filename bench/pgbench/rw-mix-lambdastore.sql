-- rw-mix through LambdaStore: Bench.touch on 5 distinct random keys of a
-- random Bench object (micro app), writing in write_percent% of the
-- transactions. Conflicting writers fail with 40001, which pgbench retries
-- (--max-tries=0: until the run ends; the report counts the retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_object=ID -D objects=N -D write_percent=P \
--     -f bench/pgbench/rw-mix-lambdastore.sql "$URL"
--
-- first_object .. first_object+objects-1 must all be Bench objects, e.g.
-- from SELECT lambdastore.create_object('micro', 'Bench', '{}') FROM generate_series(1, N).

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
SELECT lambda_invoke(:object, 'touch',
       jsonb_build_object('keys', jsonb_build_array(:k1::int, :k2::int, :k3::int, :k4::int, :k5::int),
                          'write', :write::boolean));
