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
