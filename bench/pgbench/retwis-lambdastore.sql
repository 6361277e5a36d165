-- Retwis through the lambdas (guest-sdk/examples/retwis).
-- A random user of first_user..last_user reads the 50 newest posts of their
-- timeline (90%) or posts (10%):
--   pgbench -n -f bench/pgbench/retwis-lambdastore.sql -D first_user=FIRST -D last_user=LAST \
--     --max-tries=100 ...
-- Conflicting workflows fail with SQLSTATE 40001 and are meant to be retried
-- (a post writes 21 timelines: some 15% of transactions conflicted at 4 clients
-- over 50 users with 20 followers each); pgbench retries them only when given
-- --max-tries.
\set uid random(:first_user, :last_user)
\set r random(1, 100)
\if :r <= 90
SELECT lambda_invoke(:uid, 'get_timeline', '{"limit": 50}');
\else
SELECT lambda_invoke(:uid, 'create_post', '{"text": "Just setting up my retwis: a benchmark post of about the length of a typical tweet, the same text every time."}');
\endif
