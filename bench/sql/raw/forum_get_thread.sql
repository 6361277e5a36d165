-- CloudForum get-thread, the ceiling: every entry of the Thread object $1
-- in one index range scan, as stored, in (field, key) order. The same data
-- as Thread.get_thread (cells author, community, title, text,
-- comment_count; map comments keyed by 8-byte big-endian id, in id order),
-- left as JSON bytes instead of being assembled into one jsonb.
--   $1 bigint  the thread id
SELECT field, key, value
  FROM lambdastore.entries
 WHERE object_id = $1::bigint
 ORDER BY field, key;
