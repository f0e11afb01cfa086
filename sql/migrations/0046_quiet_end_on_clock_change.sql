-- Migration 0046: quiet hours end when the user's clock reads their end, also on the
-- nights the clocks change. gov.local_instant (which gov.quiet_until asks for the end)
-- took AT TIME ZONE's answer for a local time the clocks skip (02:30 on a spring night
-- in Berlin: read as 03:30, an hour late, where the first instant after the gap, 03:00,
-- is already past it) and tried the repeated hour's earlier instant only 30 and 60
-- minutes back (Antarctica/Troll shifts by two hours): an outside probe, comparing with a
-- minute-by-minute model in zoneinfo over 8 zones, found quiet hours ending 15 minutes to
-- 2 hours late on such nights. Never early: nothing was sent inside quiet hours, and
-- nothing is now. Signature unchanged. As in sql/schema/ at this revision.

-- The earliest instant after p_after at which the wall clock in p_tz reads p_local, or
-- jumps past it (NULL when none of the candidates does). AT TIME ZONE names one instant;
-- the answer is at most two hours before it (the largest shift a zone makes, that of
-- Antarctica/Troll), on a quarter-hour step (every shift is a multiple of 15 minutes):
-- * a local time in the hour repeated when the clocks go back names two instants, and
--   AT TIME ZONE gives the later one: the earlier one reads the same local time;
-- * a local time skipped when the clocks go forward (02:30 on a spring night in Berlin)
--   is read as if the clocks had not changed, an hour late (03:30): the first instant
--   after the gap (03:00) reads past it where the quarter before read short of it.
-- (An outside probe compared gov.quiet_until with a minute-by-minute model in zoneinfo:
-- quiet hours ended 15 minutes to 2 hours late on such nights.)
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
