-- Undo 0001: gov owned nothing before it.
DROP SCHEMA gov CASCADE;
