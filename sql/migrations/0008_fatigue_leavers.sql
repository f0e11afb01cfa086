-- Migration 0008, frozen: the fatigue report buckets a user who unsubscribed by the sends
-- received before leaving. Never edit; add a new migration.

-- ---------------------------------------------------------------- the fatigue report

-- The four signals by trailing-window send volume, as the seed's weekly report, for the
-- window (p_now - p_since, p_now]. Definitions (docs/analysts.md):
--   sends        per user: the messages a push service accepted for them in the window
--                (one message on two of a user's browsers is one send)
--   bucket       least(sends, 8); users with no accepted send are not in any bucket; a
--                user who unsubscribed is bucketed by the sends of the p_since before it
--   subscribers  users in the bucket (with p_segment: who got a segment message)
--   accepted     their accepted messages (with p_segment: the segment's only)
--   displays, clicks, closes
--                of those messages, how many drew at least one such event by p_now
--   unsubscribes subscribers of the bucket with an unsubscribe event in the window
--   ctr = clicks / accepted, display_rate = displays / accepted,
--   unsubscribe_rate = unsubscribes / subscribers, close_to_click = closes / clicks
--   crossover    true on the first bucket b where, stepping up from the nearest lower
--                bucket present, unsubscribes per subscriber rise (Δ > 0) and rise by more
--                than clicks per subscriber do: Δ(unsubscribes/subscribers) >
--                Δ(clicks/subscribers). Both Δ are over the same step, so dividing them
--                by the sends it adds (per extra send) would not change the comparison.
-- p_segment is a campaign id prefix ('digest-' matches digest-2026-07-26): buckets still
-- count every send, since fatigue comes from the total, but the engagement columns
-- count only the segment's messages ("CTR within the same campaign type").
CREATE OR REPLACE FUNCTION gov.fatigue_report_v1(
    p_since   interval    DEFAULT '7 days',
    p_now     timestamptz DEFAULT NULL,
    p_segment text        DEFAULT NULL
) RETURNS TABLE (
    bucket           integer,
    subscribers      bigint,
    accepted         bigint,
    displays         bigint,
    clicks           bigint,
    closes           bigint,
    unsubscribes     bigint,
    ctr              numeric,
    unsubscribe_rate numeric,
    display_rate     numeric,
    close_to_click   numeric,
    crossover        boolean
)
LANGUAGE sql AS $$
    WITH bounds AS (
        SELECT b.t_end - p_since AS t_start, b.t_end
          FROM (SELECT coalesce(p_now, clock_timestamp()) AS t_end) b
    ),
    delivered AS (
        SELECT e.user_id, e.message_id
          FROM gov.push_events e CROSS JOIN bounds w
         WHERE e.event = 'accepted' AND e.created_at > w.t_start AND e.created_at <= w.t_end
         GROUP BY e.user_id, e.message_id
    ),
    left_at AS (
        -- when a user unsubscribed in the window: their volume is what they had received
        -- in the p_since before that moment, not what the window holds (an early leaver's
        -- few sends before leaving would put them in a low bucket and fake a crossover)
        SELECT e.user_id, min(e.created_at) AS at
          FROM gov.push_events e CROSS JOIN bounds w
         WHERE e.event = 'unsubscribe' AND e.created_at > w.t_start AND e.created_at <= w.t_end
         GROUP BY e.user_id
    ),
    volume AS (
        SELECT d.user_id, least(count(DISTINCT e.message_id), 8)::integer AS bucket
          FROM (SELECT DISTINCT d0.user_id FROM delivered d0) d
          LEFT JOIN left_at l ON l.user_id = d.user_id
          JOIN gov.push_events e
            ON e.user_id = d.user_id AND e.event = 'accepted'
           AND e.created_at > coalesce(l.at, (SELECT w.t_end FROM bounds w)) - p_since
           AND e.created_at <= coalesce(l.at, (SELECT w.t_end FROM bounds w))
         GROUP BY d.user_id
    ),
    reactions AS (
        SELECT d.user_id, d.message_id,
               coalesce(bool_or(e.event = 'display'), false) AS displayed,
               coalesce(bool_or(e.event = 'click'), false) AS clicked,
               coalesce(bool_or(e.event = 'close'), false) AS closed
          FROM delivered d
         CROSS JOIN bounds w
          LEFT JOIN gov.push_events e
                 ON e.user_id = d.user_id AND e.message_id = d.message_id
                AND e.event IN ('display', 'click', 'close') AND e.created_at <= w.t_end
         WHERE p_segment IS NULL
            OR EXISTS (SELECT 1 FROM gov.messages m
                        WHERE m.user_id = d.user_id AND m.message_id = d.message_id
                          AND starts_with(m.campaign_id, p_segment))
         GROUP BY d.user_id, d.message_id
    ),
    unsubscribed AS (
        SELECT DISTINCT e.user_id
          FROM gov.push_events e CROSS JOIN bounds w
         WHERE e.event = 'unsubscribe' AND e.created_at > w.t_start AND e.created_at <= w.t_end
    ),
    per_user AS (
        SELECT r.user_id, v.bucket,
               count(*) AS accepted,
               count(*) FILTER (WHERE r.displayed) AS displays,
               count(*) FILTER (WHERE r.clicked) AS clicks,
               count(*) FILTER (WHERE r.closed) AS closes
          FROM reactions r JOIN volume v ON v.user_id = r.user_id
         GROUP BY r.user_id, v.bucket
    ),
    per_bucket AS (
        SELECT p.bucket,
               count(*) AS subscribers,
               sum(p.accepted)::bigint AS accepted,
               sum(p.displays)::bigint AS displays,
               sum(p.clicks)::bigint AS clicks,
               sum(p.closes)::bigint AS closes,
               count(u.user_id) AS unsubscribes
          FROM per_user p LEFT JOIN unsubscribed u ON u.user_id = p.user_id
         GROUP BY p.bucket
    ),
    steps AS (
        SELECT b.*,
               b.clicks::numeric / b.subscribers
                   - lag(b.clicks::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_clicks,
               b.unsubscribes::numeric / b.subscribers
                   - lag(b.unsubscribes::numeric / b.subscribers) OVER (ORDER BY b.bucket) AS d_unsubscribes
          FROM per_bucket b
    ),
    marked AS (
        SELECT s.*, coalesce(s.d_unsubscribes > 0 AND s.d_unsubscribes > s.d_clicks, false) AS crosses
          FROM steps s
    )
    SELECT m.bucket, m.subscribers, m.accepted, m.displays, m.clicks, m.closes, m.unsubscribes,
           round(m.clicks::numeric / nullif(m.accepted, 0), 6),
           round(m.unsubscribes::numeric / m.subscribers, 6),
           round(m.displays::numeric / nullif(m.accepted, 0), 6),
           round(m.closes::numeric / nullif(m.clicks, 0), 6),
           m.crosses AND NOT coalesce(bool_or(m.crosses) OVER (ORDER BY m.bucket
                                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                      false)
      FROM marked m
     ORDER BY m.bucket;
$$;
