-- Migration 0050, down: gov.on_citus() as migration 0016 made it.
CREATE OR REPLACE FUNCTION gov.on_citus() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')
$$;
