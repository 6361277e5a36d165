-- CloudForum through LambdaStore: 90% Thread.get_thread of a random
-- thread, 10% Account.add_comment (a nested call to Thread.add_comment) by
-- a random account on a random thread. Concurrent comments on one thread
-- conflict (40001); pgbench retries them (--max-tries=0: until the run
-- ends; the report counts the retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_thread=ID -D threads=N -D first_account=ID -D accounts=M \
--     -f bench/pgbench/cloudforum-lambdastore.sql "$URL"
--
-- The ids in each range must all be Threads (resp. Accounts) of the forum
-- application: create each kind in one batch (see scripts/demo.sh), e.g.
-- threads with lambda_invoke(account, 'create_thread', ...) FROM generate_series.
-- Every run adds comments, so get_thread gets slower from run to run.

\set thread random(:first_thread, :first_thread + :threads - 1)
\if random(1, 100) <= 90
SELECT lambda_invoke(:thread, 'get_thread');
\else
\set account random(:first_account, :first_account + :accounts - 1)
SELECT lambda_invoke(:account, 'add_comment',
       jsonb_build_object('thread', :thread::bigint, 'text', 'A comment posted by pgbench, about sixty bytes.'));
\endif
