-- Migration 0014 down: no marginal fatigue measure.

DROP FUNCTION gov.fatigue_marginal_v1(interval, timestamptz, integer);
DROP FUNCTION gov.sends_to_decide_v1(bigint, bigint, bigint, double precision);
DROP FUNCTION gov.difference_low_v1(double precision, double precision, double precision, double precision);
DROP FUNCTION gov.wilson_interval_v1(double precision, double precision, double precision);
DROP VIEW gov.user_segments;
