-- Migration 0046, undone.

-- The earliest instant after p_after at which the wall clock in p_tz reads p_local, or
-- NULL. A local time in the hour repeated when the clocks go back names two instants,
-- and AT TIME ZONE gives the later one: the earlier one (30 or 60 minutes before, the
-- shifts zones use) is taken when it reads the same local time. A local time skipped
-- when the clocks go forward keeps AT TIME ZONE's answer.
CREATE OR REPLACE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT min(c.at)
      FROM (SELECT (p_local AT TIME ZONE p_tz) - shift AS at, shift
              FROM unnest(ARRAY[interval '0', interval '30 minutes', interval '1 hour']) shift) c
     WHERE c.at > p_after
       AND (c.shift = interval '0' OR (c.at AT TIME ZONE p_tz) = p_local)
$$;
