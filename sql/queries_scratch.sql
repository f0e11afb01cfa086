-- Scratch databases for the lab (simulate, bench, soak) and for tests
-- (gov.testing.postgres): created on a server, migrated, dropped after.
-- The {} placeholders are identifiers, composed with psycopg.sql.

-- name: scratch_create_database
CREATE DATABASE {}

-- name: scratch_create_from_template
CREATE DATABASE {} TEMPLATE {}

-- name: scratch_no_sync_commit
-- A scratch database needs no durability: not waiting for the WAL flush at every commit
-- (each send, each attempt, each event is one) is most of a round trip.
ALTER DATABASE {} SET synchronous_commit = off

-- name: scratch_drop_database
DROP DATABASE IF EXISTS {} WITH (FORCE)

-- name: citus_workers
-- The workers of a Citus coordinator (none without Citus): a scratch database on a
-- cluster must exist, with the extension, on each of them too.
SELECT n.nodename, n.nodeport
  FROM pg_dist_node n
 WHERE n.groupid <> 0 AND n.noderole = 'primary' AND n.isactive
 ORDER BY n.nodeid

-- name: citus_installed
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')

-- name: citus_propagate_databases
-- CREATE and DROP DATABASE on the coordinator then happen on every node
SET citus.enable_create_database_propagation = on

-- name: citus_create_extension
CREATE EXTENSION IF NOT EXISTS citus

-- name: citus_coordinator_host
SELECT citus_set_coordinator_host(%(host)s, %(port)s)

-- name: citus_add_node
SELECT citus_add_node(%(host)s, %(port)s)
