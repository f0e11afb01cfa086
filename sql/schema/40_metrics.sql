-- Metrics (issue 12, item 7): what `gov serve` exposes at /metrics from the database.

-- Recent-window counts for the Prometheus collector of `gov serve` (/metrics): BRIN
-- indexes on the time columns. The tables are appended in time order (the database's
-- clock stamps each row), so a block-range index finds the last day's pages while
-- costing the write path almost nothing (a btree would add a page to every decision).
-- Ranges not yet summarized (the newest pages) are always read, which is exactly the
-- recent data a window count wants.
CREATE INDEX messages_decided_brin ON gov.messages USING brin (decided_at);
CREATE INDEX push_suppressions_created_brin ON gov.push_suppressions USING brin (created_at);
CREATE INDEX delivery_attempts_attempted_brin ON gov.delivery_attempts USING brin (attempted_at);

-- Everything `gov serve` exposes from the database, in one call per scrape: one row per
-- (metric, label set). Windowed counts (decisions, suppressions, delivery attempts) cover
-- the last p_window_ms by the database's clock, so a scrape stays bounded however long
-- the history grows; depths (outbox still to do, held messages waiting) are current and
-- read through the partial indexes on what is still to do.
--   decisions     gov.messages by their latest verdict: verdict (allow|drop|defer|collapse), reason
--   suppressions  gov.push_suppressions: tier, blocked_by, action
--   attempts      gov.delivery_attempts: status_class (2xx|4xx|5xx|…|none), outcome
--   outbox        gov.outbox rows still to do: state (pending|sending)
--   outbox_oldest_due_seconds  how long the oldest due pending row has waited (0: none)
--   held          gov.deferred rows waiting: tier, kind (defer|quiet|collapse)
CREATE FUNCTION gov.metrics_v1(p_window_ms bigint DEFAULT 86400000)
RETURNS TABLE (metric text, labels jsonb, value double precision)
LANGUAGE sql STABLE AS $$
    WITH since AS (SELECT now() - p_window_ms * interval '1 millisecond' AS t)
    SELECT 'decisions',
           jsonb_build_object('verdict', CASE WHEN m.allowed THEN 'allow' ELSE m.action END,
                              'reason', coalesce(m.reason, '')),
           count(*)::double precision
      FROM gov.messages m, since
     WHERE m.decided_at >= since.t
     GROUP BY 2
    UNION ALL
    SELECT 'suppressions',
           jsonb_build_object('tier', s.tier, 'blocked_by', s.blocked_by, 'action', s.action),
           count(*)::double precision
      FROM gov.push_suppressions s, since
     WHERE s.created_at >= since.t
     GROUP BY 2
    UNION ALL
    SELECT 'attempts',
           jsonb_build_object('status_class', CASE WHEN a.status IS NULL THEN 'none'
                                                   ELSE (a.status / 100)::text || 'xx' END,
                              'outcome', a.outcome),
           count(*)::double precision
      FROM gov.delivery_attempts a, since
     WHERE a.attempted_at >= since.t
     GROUP BY 2
    UNION ALL
    SELECT 'outbox', jsonb_build_object('state', o.state), count(*)::double precision
      FROM gov.outbox o
     WHERE o.state IN ('pending', 'sending')
     GROUP BY o.state
    UNION ALL
    SELECT 'outbox_oldest_due_seconds', '{}'::jsonb,
           coalesce(extract(epoch FROM now() - min(o.next_attempt_at)), 0)::double precision
      FROM gov.outbox o
     WHERE o.state IN ('pending', 'sending') AND o.state = 'pending' AND o.next_attempt_at <= now()
    UNION ALL
    SELECT 'held', jsonb_build_object('tier', d.tier, 'kind', d.kind), count(*)::double precision
      FROM gov.deferred d
     WHERE d.state = 'waiting'
     GROUP BY 2;
$$;
