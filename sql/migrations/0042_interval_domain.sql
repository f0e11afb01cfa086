-- Migration 0042: the interval functions answer NULL outside their domain instead of an
-- error or a wrong interval (an outside probe): gov.difference_low_v1 with no sends
-- divided by zero, gov.wilson_interval_v1 with fewer successes than none took the root of
-- a negative number, and with more successes than trials returned low > high. Signatures
-- and every answer inside the domain unchanged. As in sql/schema/ at this revision.

-- The 95 % Wilson score interval of a proportion: p_successes out of p_trials (NULLs
-- when p_trials is 0, and when the counts are no proportion's or p_z is negative: more
-- successes than trials, fewer than none; counts may be fractional, for projections).
-- Good near 0 and with few trials, where the normal interval is not. Another p_z,
-- another confidence.
CREATE OR REPLACE FUNCTION gov.wilson_interval_v1(
    p_successes double precision,
    p_trials    double precision,
    p_z         double precision DEFAULT 1.959963984540054,
    OUT low     double precision,
    OUT high    double precision
)
LANGUAGE sql IMMUTABLE AS $$
    SELECT (x.p + x.z2 / (2 * x.n) - p_z * sqrt(x.p * (1 - x.p) / x.n + x.z2 / (4 * x.n * x.n))) / (1 + x.z2 / x.n),
           (x.p + x.z2 / (2 * x.n) + p_z * sqrt(x.p * (1 - x.p) / x.n + x.z2 / (4 * x.n * x.n))) / (1 + x.z2 / x.n)
      FROM (SELECT p_successes / d.n AS p, d.n, p_z * p_z AS z2
              -- n is NULL outside the domain, so is every bound (no error at planning either,
              -- where constant arguments are folded before any WHERE could rule them out)
              FROM (SELECT CASE WHEN p_trials > 0 AND p_successes BETWEEN 0 AND p_trials AND p_z >= 0
                                THEN p_trials END AS n) d) x
$$;

-- The lower confidence bound of (p_unsubscribes - p_clicks) / p_sends, the unsubscribe rate
-- minus the click rate of the same sends: Newcombe's hybrid score interval, from the Wilson
-- bounds of the two rates at p_z. Above 0: the unsubscribe rate is the higher one. NULL
-- where either interval is (no sends, counts that are no proportion's).
CREATE OR REPLACE FUNCTION gov.difference_low_v1(
    p_unsubscribes double precision,
    p_clicks       double precision,
    p_sends        double precision,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_unsubscribes - p_clicks) / nullif(p_sends, 0)
           - sqrt((p_unsubscribes / nullif(p_sends, 0) - u.low) ^ 2 + (c.high - p_clicks / nullif(p_sends, 0)) ^ 2)
      FROM gov.wilson_interval_v1(p_unsubscribes, p_sends, p_z) u,
           gov.wilson_interval_v1(p_clicks, p_sends, p_z) c
     WHERE u.low IS NOT NULL AND c.high IS NOT NULL
$$;
