-- Migration 0009 down.
SELECT 1;
