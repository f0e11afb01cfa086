-- Migration 0052, down: gov.local_instant as a SQL function, as migration 0046 made it.
CREATE OR REPLACE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c.at)
      FROM (SELECT (p_local AT TIME ZONE p_tz) - k * interval '15 minutes' AS at
              FROM generate_series(0, 8) k) c
     WHERE c.at > p_after
       AND ((c.at AT TIME ZONE p_tz) = p_local
            OR ((c.at AT TIME ZONE p_tz) > p_local
                AND ((c.at - interval '15 minutes') AT TIME ZONE p_tz) < p_local))
$$;
