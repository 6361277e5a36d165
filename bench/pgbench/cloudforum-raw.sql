-- CloudForum as raw SQL, one statement per transaction: bench/sql/raw/
-- forum_get_thread.sql ($1 = :thread) for 90%, forum_add_comment.sql
-- ($1 = :account, $2 = :thread, $3 = the text) for 10% (keep them in sync).
-- Concurrent comments on one thread queue on a row lock: nothing to retry
-- (the report should show 0 retries).
--
--   pgbench -n -M prepared -c 4 -j 4 -T 5 --max-tries=0 \
--     -D first_thread=ID -D threads=N -D first_account=ID -D accounts=M \
--     -f bench/pgbench/cloudforum-raw.sql "$URL"
--
-- The ids in each range must all be Threads (resp. Accounts) of the forum
-- application. Every run adds comments, so get_thread gets slower from run to run.

\set thread random(:first_thread, :first_thread + :threads - 1)
\if random(1, 100) <= 90
SELECT field, key, value
  FROM lambdastore.entries
 WHERE object_id = :thread::bigint
 ORDER BY field, key;
\else
\set account random(:first_account, :first_account + :accounts - 1)
WITH counted AS (
    UPDATE lambdastore.entries e
       SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
     WHERE e.object_id = :thread::bigint AND e.field = 'comment_count' AND e.key = ''
 RETURNING convert_from(e.value, 'UTF8')::bigint AS id
), inserted AS (
    INSERT INTO lambdastore.entries (object_id, field, key, value)
    SELECT :thread::bigint, 'comments', int8send(c.id),
           convert_to(format('{"author":%s,"text":%s,"at":%s}', :account::bigint,
                             to_json('A comment posted by pgbench, about sixty bytes.'::text),
                             (extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 'UTF8')
      FROM counted c
)
SELECT id FROM counted;
\endif
