-- Migration 0052: gov.local_instant in PL/pgSQL, its statement planned once per session. As
-- a SQL function with a FROM clause it could not be inlined, so each call planned it again:
-- 0.25 ms a call against 0.12 from a PL/pgSQL caller (pgbench), and gov.quiet_until calls it
-- once or twice for every user with a time zone inside their quiet hours. The same
-- statement, the same answers (tests/integration/test_quiet_clock_change.py). Signature
-- unchanged. As in sql/schema/ at this revision.
CREATE OR REPLACE FUNCTION gov.local_instant(p_local timestamp, p_tz text, p_after timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT min(c.at)
              FROM (SELECT (p_local AT TIME ZONE p_tz) - k * interval '15 minutes' AS at
                      FROM generate_series(0, 8) k) c
             WHERE c.at > p_after
               AND ((c.at AT TIME ZONE p_tz) = p_local
                    OR ((c.at AT TIME ZONE p_tz) > p_local
                        AND ((c.at - interval '15 minutes') AT TIME ZONE p_tz) < p_local)));
END;
$$;
