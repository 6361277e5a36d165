-- Retwis in PL/pgSQL (bench/sql/plpgsql/retwis.sql).
-- A random user of first_user..last_user reads the 50 newest posts of their
-- timeline (90%) or posts (10%):
--   pgbench -n -f bench/pgbench/retwis-plpgsql.sql -D first_user=FIRST -D last_user=LAST ...
\set uid random(:first_user, :last_user)
\set r random(1, 100)
\if :r <= 90
SELECT bench_plpgsql.retwis_get_timeline(:uid, 50);
\else
SELECT bench_plpgsql.retwis_create_post(:uid, 'Just setting up my retwis: a benchmark post of about the length of a typical tweet, the same text every time.');
\endif
