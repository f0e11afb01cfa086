-- Migration 0014 down: no marginal fatigue measure.

DROP FUNCTION gov.fatigue_marginal_v1(interval, timestamptz, integer);
DROP FUNCTION gov.wilson_interval_v1(bigint, bigint, double precision);
DROP VIEW gov.user_segments;
