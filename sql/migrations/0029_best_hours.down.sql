-- Undo migration 0029: the best hours.

DROP VIEW gov.hour_curve;
DROP FUNCTION gov.best_hours_v1(text, interval, timestamptz, double precision);
DROP FUNCTION gov.user_hour_estimates(interval, timestamptz, double precision, text);
DROP FUNCTION gov.hour_curves_v1(interval, timestamptz, double precision);
DROP FUNCTION gov.display_hours(interval, timestamptz, text);
