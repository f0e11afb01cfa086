-- Migration 0050: gov.on_citus() as a lone expression the planner inlines. Its body was
-- SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus'): a SQL function with a
-- sub-select is not inlined, so each call planned its body again, about 80 µs (pgbench, a
-- PL/pgSQL caller: 0.147 ms against 0.057 ms for this form and 0.047 for SELECT 1), and
-- gov.distributed() calls it: twice in every batch gov.send_batch_v1 decides, once in
-- every single send. The same answer: pg_dist_partition is the extension's own catalog
-- table, there exactly when the extension is. Signature unchanged. As in sql/schema/ at
-- this revision.
CREATE OR REPLACE FUNCTION gov.on_citus() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
$$;
