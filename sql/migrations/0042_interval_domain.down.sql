-- Migration 0042, undone.

-- The 95 % Wilson score interval of a proportion: p_successes out of p_trials (NULLs
-- when p_trials is 0; counts may be fractional, for projections). Good near 0 and with
-- few trials, where the normal interval is not. Another p_z, another confidence.
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
      FROM (SELECT p_successes / p_trials AS p, p_trials AS n, p_z * p_z AS z2
             WHERE p_trials > 0) x
$$;

-- The lower confidence bound of (p_unsubscribes - p_clicks) / p_sends, the unsubscribe rate
-- minus the click rate of the same sends: Newcombe's hybrid score interval, from the Wilson
-- bounds of the two rates at p_z. Above 0: the unsubscribe rate is the higher one.
CREATE OR REPLACE FUNCTION gov.difference_low_v1(
    p_unsubscribes double precision,
    p_clicks       double precision,
    p_sends        double precision,
    p_z            double precision DEFAULT 1.959963984540054
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT (p_unsubscribes - p_clicks) / p_sends
           - sqrt((p_unsubscribes / p_sends - u.low) ^ 2 + (c.high - p_clicks / p_sends) ^ 2)
      FROM gov.wilson_interval_v1(p_unsubscribes, p_sends, p_z) u,
           gov.wilson_interval_v1(p_clicks, p_sends, p_z) c
$$;
