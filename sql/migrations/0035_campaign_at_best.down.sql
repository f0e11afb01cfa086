-- Undo migration 0035: gov.best_slot as migration 0030 made it; gov.send_many_best_v1
-- goes; the column is dropped by the revision itself.

DROP FUNCTION gov.send_many_best_v1(text, text[], text, text, text, text, jsonb, text, integer, interval, timestamptz);
DROP FUNCTION gov.best_slot(text, text, text, timestamptz, timestamptz, timestamptz, boolean);

-- The slot a held message is planned for (docs/analysts.md, "Timing"). p_first: the first
-- moment that passes every cap and quiet hours (a window freed then stays free until
-- another send takes it, and the release decides again in any case). [timing] off, or no
-- curve yet: p_first itself (o_timing NULL). On: the candidates are p_first and every
-- whole local hour after it that is not quiet, up to the deadline (p_deadline less the
-- jitter and a minute, so the jittered release still comes before it; for P1 also at most
-- the policy's timing_p1_max_delay past p_first); the slot is the candidate whose local
-- hour has the highest estimate of the user (their own displays and clicks of 56 days,
-- shrunk toward their segment's curve, else all users', gov.timing_curves, as
-- gov.best_hours_v1 does), the earliest on a tie (o_timing 'best'). A share
-- timing_explore of the messages, drawn from p_seed (the message id: a retry draws the
-- same), goes at a candidate drawn from it instead (o_timing 'explore'), so the estimate
-- sees hours the timing would not choose.
CREATE FUNCTION gov.best_slot(
    p_user_id  text,
    p_tier     text,
    p_seed     text,
    p_first    timestamptz,
    p_deadline timestamptz,
    p_now      timestamptz,
    OUT o_slot   timestamptz,
    OUT o_timing text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_set     record;
    v_zone    text;
    v_segment text;
    v_last    timestamptz;
    v_slots   timestamptz[];
    v_draw    bigint;
BEGIN
    o_slot := p_first;
    EXECUTE format('SELECT s.timing_enabled, s.timing_p1_max_delay_ms, s.timing_explore, s.jitter_ms FROM %s s',
                   gov.shard_relation('gov.settings', NULL)) INTO v_set;
    IF v_set.timing_enabled IS NOT TRUE OR p_tier = 'P0' THEN
        RETURN;
    END IF;
    v_last := p_deadline - (v_set.jitter_ms + 60000) * interval '1 millisecond';
    IF p_tier = 'P1' THEN
        v_last := least(v_last, p_first + v_set.timing_p1_max_delay_ms * interval '1 millisecond');
    END IF;
    IF v_last <= p_first THEN
        RETURN;
    END IF;
    SELECT u.time_zone, u.segment INTO v_zone, v_segment FROM gov.users u WHERE u.user_id = p_user_id;
    v_zone := coalesce(v_zone, 'UTC');
    -- the candidates, in time order: p_first, then each local hour's start, not quiet
    v_slots := ARRAY(
        SELECT c.t FROM (
            SELECT p_first AS t
            UNION
            SELECT ((date_trunc('hour', p_first AT TIME ZONE v_zone) + k * interval '1 hour') AT TIME ZONE v_zone)
              FROM generate_series(1, (extract(epoch FROM v_last - p_first) / 3600)::integer + 2) k
        ) c
         WHERE c.t >= p_first AND c.t <= v_last AND gov.quiet_until(p_user_id, c.t) = c.t
         ORDER BY c.t);
    IF cardinality(v_slots) <= 1 THEN
        RETURN;
    END IF;
    v_draw := abs(hashtextextended(p_seed, 30));
    IF (v_draw % 1000000) < v_set.timing_explore * 1000000 THEN
        o_slot := v_slots[1 + (v_draw / 1000000) % cardinality(v_slots)];
        o_timing := 'explore';
        RETURN;
    END IF;
    SELECT s.t INTO o_slot
      FROM unnest(v_slots) s(t)
      JOIN (SELECT p.hour,
                   (coalesce(o.clicks, 0) + 20 * coalesce(g.estimate, p.estimate)) / (coalesce(o.displays, 0) + 20) AS est
              FROM gov.timing_curves p
              LEFT JOIN gov.timing_curves g ON g.segment = v_segment AND g.hour = p.hour
              LEFT JOIN gov.display_hours('56 days', p_now, p_user_id) o ON o.hour = p.hour
             WHERE p.segment = '') e ON e.hour = date_part('hour', s.t AT TIME ZONE v_zone)
     ORDER BY e.est DESC, s.t
     LIMIT 1;
    IF o_slot IS NULL THEN  -- no curve yet: the first slot
        o_slot := p_first;
        RETURN;
    END IF;
    o_timing := 'best';
END;
$$;
