-- CloudForum through the stored procedures of bench/sql/plpgsql/forum.sql:
-- 90% forum_get_thread of a random thread, 10% forum_add_comment by a
-- random account on a random thread. Concurrent comments on one thread
-- queue on a row lock: nothing to retry (the report should show 0 retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_thread=ID -D threads=N -D first_account=ID -D accounts=M \
--     -f bench/pgbench/cloudforum-plpgsql.sql "$URL"
--
-- The ids in each range must all be Threads (resp. Accounts) of the forum
-- application. Every run adds comments, so get_thread gets slower from run to run.

\set thread random(:first_thread, :first_thread + :threads - 1)
\if random(1, 100) <= 90
SELECT bench_plpgsql.forum_get_thread(:thread::bigint);
\else
\set account random(:first_account, :first_account + :accounts - 1)
SELECT bench_plpgsql.forum_add_comment(:account::bigint, :thread::bigint, 'A comment posted by pgbench, about sixty bytes.');
\endif
