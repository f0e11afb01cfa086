-- Migration 0050: gov.on_citus() as a lone expression. Its body was SELECT EXISTS (SELECT 1
-- FROM pg_extension WHERE extname = 'citus'): inlined into a PL/pgSQL caller's IF, the
-- sub-select made the check a statement run through the executor on every call, about
-- 75 µs (pgbench, SELECT gov.distributed(): 0.135 ms against 0.056 for this form and 0.047
-- for SELECT 1), and gov.distributed() runs in every batch gov.send_batch_v1 decides
-- (twice) and every single send. The same answer: pg_dist_partition is the extension's own catalog
-- table, there exactly when the extension is. Signature unchanged. As in sql/schema/ at
-- this revision.
CREATE OR REPLACE FUNCTION gov.on_citus() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
$$;
