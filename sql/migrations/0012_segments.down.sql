-- Migration 0012 down: no segments.

ALTER TABLE gov.users DROP COLUMN segment;
