-- CloudForum add-comment, the ceiling: bumps the thread's comment_count and
-- inserts the comment under the new count in one statement; yields the id.
-- The stored bytes are serde_json's for Comment, so the lambdas read it.
--   $1 bigint  the commenting account's id
--   $2 bigint  the thread id
--   $3 text    the comment
-- Concurrent calls on one thread queue on the count's row lock; READ
-- COMMITTED then re-reads the committed count, so ids never collide and
-- nobody retries. Unlike the lambda it checks nothing (object types, empty
-- text) and needs the count to be set (the Thread constructor sets it).
WITH counted AS (
    UPDATE lambdastore.entries e
       SET value = convert_to((convert_from(e.value, 'UTF8')::bigint + 1)::text, 'UTF8')
     WHERE e.object_id = $2::bigint AND e.field = 'comment_count' AND e.key = ''
 RETURNING convert_from(e.value, 'UTF8')::bigint AS id
), inserted AS (
    INSERT INTO lambdastore.entries (object_id, field, key, value)
    SELECT $2::bigint, 'comments', int8send(c.id),
           convert_to(format('{"author":%s,"text":%s,"at":%s}', $1::bigint, to_json($3::text),
                             (extract(epoch FROM clock_timestamp()) * 1000000)::bigint), 'UTF8')
      FROM counted c
)
SELECT id FROM counted;
